"""The event contract: time parsing, limits, normalized JSON, content ids, the derived Spark schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from views.event import (
    EVENT_SCHEMA_VERSION,
    MAX_DIMS,
    MAX_ITEM_CHARS,
    Event,
    format_ts,
    parse_time,
    spark_schema,
    ts_millis,
)

T0 = datetime(2025, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)
T0_MS = 1763805600123


@pytest.mark.parametrize(
    "value",
    [
        "2025-11-22T10:00:00.123Z",
        "2025-11-22T10:00:00.123+00:00",
        "2025-11-22T11:00:00.123+01:00",
        "2025-11-22T05:00:00.123456-05:00",  # microseconds are truncated to milliseconds
        T0_MS,
        str(T0_MS),
        1763805600.123,
        "1763805600.123",
        T0,
    ],
)
def test_times_of_every_accepted_shape_become_the_same_utc_instant(value: object) -> None:
    assert parse_time(value) == T0


def test_epoch_seconds_and_milliseconds_are_told_apart_by_magnitude() -> None:
    assert parse_time(1763805600) == T0.replace(microsecond=0)
    assert parse_time(1763805600000) == T0.replace(microsecond=0)
    assert parse_time(10) == datetime(1970, 1, 1, 0, 0, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    ["2025-11-22T10:00:00", "yesterday", "", "2025-13-01T00:00:00Z", True, None, [1], float("nan"), -5, 10**30],
)
def test_unparseable_naive_or_out_of_range_times_are_bad_time(value: object) -> None:
    with pytest.raises(ValueError, match="unparseable event time") as info:
        parse_time(value)
    assert getattr(info.value, "type", None) == "bad_time"


def test_naive_times_need_a_zone_and_explicit_formats_work() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    assert parse_time("2025-11-22 11:00:00.123", "%Y-%m-%d %H:%M:%S.%f", berlin) == T0
    assert parse_time("1763805600123000", "epoch_us") == T0
    assert parse_time("1763805600", "epoch_s") == T0.replace(microsecond=0)
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_time("2025-11-22 11:00:00", "%Y-%m-%d %H:%M:%S")


def test_normalized_json_has_version_utc_millis_and_no_absent_fields() -> None:
    event = Event.model_validate({"id": "e1", "ts": "2025-11-22T11:00:00.123456+01:00", "item": "#kafka"})
    assert json.loads(event.to_json()) == {
        "v": EVENT_SCHEMA_VERSION,
        "id": "e1",
        "ts": "2025-11-22T10:00:00.123Z",
        "item": "#kafka",
    }
    assert event.ts_ms == T0_MS
    full = Event.model_validate(
        {"id": 7, "ts": T0_MS, "item": 42, "user": "u1", "value": "12.5", "dims": {"country": "DE", "n": 3}}
    )
    assert (full.id, full.item, full.value, full.dims) == ("7", "42", 12.5, {"country": "DE", "n": "3"})
    assert Event.model_validate_json(full.to_json()) == full  # the normalized form round-trips


def test_content_ids_are_deterministic_and_ignore_the_time_format() -> None:
    a = Event.model_validate({"ts": "2025-11-22T10:00:00.123Z", "item": "x", "user": "u", "dims": {"a": "1"}})
    b = Event.model_validate({"ts": T0_MS, "item": "x", "user": "u", "dims": {"a": "1"}})
    c = Event.model_validate({"ts": T0_MS, "item": "x", "user": "u2", "dims": {"a": "1"}})
    assert a.id == b.id != c.id
    assert a.id.startswith("c-")


@pytest.mark.parametrize(
    ("data", "error_type"),
    [
        ({"ts": T0_MS}, "missing"),
        ({"item": "x"}, "missing"),
        ({"ts": T0_MS, "item": ""}, "string_too_short"),
        ({"ts": T0_MS, "item": "x" * (MAX_ITEM_CHARS + 1)}, "string_too_long"),
        ({"ts": T0_MS, "item": "x", "id": "i" * 129}, "string_too_long"),
        ({"ts": T0_MS, "item": "x", "value": float("nan")}, "finite_number"),
        ({"ts": T0_MS, "item": "x", "value": "inf"}, "finite_number"),
        ({"ts": T0_MS, "item": "x", "value": True}, "float_type"),
        ({"ts": T0_MS, "item": "x", "value": "fast"}, "float_parsing"),
        ({"ts": T0_MS, "item": "x", "dims": {f"d{i}": "v" for i in range(MAX_DIMS + 1)}}, "too_long"),
        ({"ts": T0_MS, "item": "x", "dims": {"bad name": "v"}}, "string_pattern_mismatch"),
        ({"ts": T0_MS, "item": "x", "dims": {"d": "v" * 257}}, "string_too_long"),
        ({"ts": T0_MS, "item": "x", "dims": "DE"}, "dict_type"),
        ({"ts": T0_MS, "item": "x", "extra": 1}, "extra_forbidden"),
        ({"ts": "soon", "item": "x"}, "bad_time"),
    ],
)
def test_invalid_fields_raise_typed_errors(data: dict[str, object], error_type: str) -> None:
    with pytest.raises(ValidationError) as info:
        Event.model_validate(data)
    assert info.value.errors()[0]["type"] == error_type


def test_format_and_millis_helpers() -> None:
    plus_one = timezone(timedelta(hours=1))
    assert format_ts(datetime(2025, 1, 2, 4, 5, 6, 7000, tzinfo=plus_one)) == "2025-01-02T03:05:06.007Z"
    assert format_ts(datetime(2025, 1, 2, tzinfo=UTC)) == "2025-01-02T00:00:00.000Z"
    assert ts_millis(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1000


def test_record_keys_follow_the_configured_field() -> None:
    event = Event.model_validate({"id": "e", "ts": T0_MS, "item": "#x", "user": "u"})
    assert event.key("item") == b"#x"
    assert event.key("user") == b"u"
    assert event.key("id") == b"e"
    assert event.key("none") is None
    assert Event.model_validate({"ts": T0_MS, "item": "#x"}).key("user") is None


def test_spark_schema_is_derived_from_every_model_field() -> None:
    from pyspark.sql import types as T

    schema = spark_schema()
    assert schema.fieldNames() == list(Event.model_fields)
    by_name = {f.name: f for f in schema.fields}
    assert by_name["ts"].dataType == T.TimestampType()
    assert by_name["value"].dataType == T.DoubleType()
    assert by_name["dims"].dataType == T.MapType(T.StringType(), T.StringType(), valueContainsNull=False)
    assert by_name["item"].nullable is False
    assert by_name["user"].nullable is True
