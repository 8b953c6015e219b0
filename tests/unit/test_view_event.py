"""The event contract: time parsing, limits, normalized JSON, content ids, the derived Spark and Avro schemas."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from views.event import (
    EVENT_SCHEMA_VERSION,
    MAX_DIMS,
    MAX_ITEM_CHARS,
    Event,
    avro_schema,
    encode_fast,
    encode_raw_fast,
    format_ts,
    parse_time,
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

    from views.event_frames import spark_schema

    schema = spark_schema()
    assert schema.fieldNames() == list(Event.model_fields)
    by_name = {f.name: f for f in schema.fields}
    assert by_name["ts"].dataType == T.TimestampType()
    assert by_name["value"].dataType == T.DoubleType()
    assert by_name["dims"].dataType == T.MapType(T.StringType(), T.StringType(), valueContainsNull=False)
    assert by_name["item"].nullable is False
    assert by_name["user"].nullable is True


def test_avro_schema_is_derived_from_every_model_field() -> None:
    schema = avro_schema()
    assert [f["name"] for f in schema["fields"]] == list(Event.model_fields)
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["v"] == "int"
    assert types["id"] == "string"  # always filled (from the content when the source has none)
    assert types["ts"] == {"type": "long", "logicalType": "timestamp-millis"}
    assert types["item"] == "string"
    assert types["dims"] == {"type": "map", "values": "string"}  # always a map, empty when there are none
    optional = {f["name"]: f.get("default", "required") for f in schema["fields"] if isinstance(f["type"], list)}
    assert optional == {"user": None, "value": None}  # null first in the union, so the default may be null
    assert types["user"] == ["null", "string"]
    assert types["value"] == ["null", "double"]


# Values as sources send them: the normalized form, near misses of every limit, and the coercions pydantic makes.
_TEXTS = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=250, max_size=260),
    st.sampled_from(
        ["", " ", "e\u0301", "\u00e9", "a\nb", "\x9b", "x\ud800", "A" * 128, "A" * 129, "A" * 256, "A" * 257]
    ),
)
_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXTS,
)
_TIMES = st.one_of(
    st.datetimes(min_value=datetime(1969, 12, 31), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)).map(  # noqa: DTZ001
        lambda t: t.isoformat(timespec="microseconds").replace("+00:00", "Z")
    ),
    st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5+02:00", "1700000000", "2026-01-01", "٢٠٢٦"]),
    _ANY,
)
_DIMS = st.one_of(
    st.dictionaries(
        st.sampled_from(["country", "a.b", "x-y", "_1", "1a", "a b", "a\n", "A" * 64, "A" * 65, "é"]),
        st.text(min_size=1, max_size=4),
        max_size=3,
    ),
    st.dictionaries(st.sampled_from(["country", "a.b"]), _ANY, max_size=2),
    st.dictionaries(st.from_regex(r"[a-z]{3}", fullmatch=True), st.just("v"), min_size=15, max_size=18),
    _ANY,
)


def _mostly(valid: st.SearchStrategy[object], other: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Draw a valid value 4 times in 5, so most records differ from a valid one in one or two fields."""
    return st.integers(0, 4).flatmap(lambda n: valid if n else other)


_RECORDS = st.fixed_dictionaries(  # mostly valid: each field is wrong in 1 record of 5
    {
        "ts": _mostly(st.just("2026-03-01T12:00:00.250Z"), _TIMES),
        "item": _mostly(st.text(min_size=1, max_size=8), _TEXTS),
    },
    optional={
        "v": _mostly(st.just(1), st.sampled_from([2, True, 1.0, "1"])),
        "id": _mostly(st.text(max_size=8), _ANY),
        "user": _mostly(st.text(min_size=1, max_size=8), _ANY),
        "value": _mostly(st.floats(allow_nan=False, allow_infinity=False), _ANY),
        "dims": _mostly(st.dictionaries(st.sampled_from(["country", "a.b"]), st.text(min_size=1, max_size=4)), _DIMS),
        "extra": _ANY,
    },
)


def _wire(fields: dict[str, object], key_field: str) -> tuple[bytes, bytes | None, int] | None:
    try:
        event = Event.model_validate(fields)
    except ValidationError:
        return None
    return event.to_json(), event.key(key_field), event.ts_ms


_KEYS = st.sampled_from(["item", "user", "id", "none"])


@settings(max_examples=1500, deadline=None)
@given(_RECORDS, _KEYS)
def test_the_fast_path_writes_the_models_event_or_defers_to_it(fields: dict[str, object], key_field: str) -> None:
    fast = encode_fast(fields, key_field)
    if fast is not None:  # never an event the model would refuse or write otherwise
        assert fast == _wire(fields, key_field)


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70))
def test_the_fast_path_writes_every_value_as_the_model_does(value: float) -> None:
    """Every finite float, and every int a float holds exactly, takes the fast path; larger ints go to the model."""
    fields = {"ts": "2026-05-01T10:00:00.123Z", "item": "x", "value": value}
    fast = encode_fast(fields, "item")
    if type(value) is int and abs(value) > 2**53:
        assert fast is None
    else:
        assert fast is not None
        assert fast == _wire(fields, "item")


def test_the_fast_path_takes_every_normalized_event() -> None:
    """Events in the wire form (what a replay of exported history reads) take the fast path."""
    for data in (
        {"ts": "2026-05-01T10:00:00.123Z", "item": "checkout"},
        {
            "v": 1,
            "id": "e-1",
            "ts": "2026-05-01T10:00:00Z",
            "item": "ä",
            "user": "u",
            "value": 2.5e-7,
            "dims": {"country": "DE", "origin": "live"},
        },
        {"ts": "2026-05-01T10:00:00.123+02:00", "item": "x", "value": 3, "user": "u"},
    ):
        for key_field in ("item", "user", "none"):
            wire = _wire(data, key_field)
            assert wire is not None
            assert encode_fast(json.loads(wire[0]), key_field) == wire
            assert encode_fast(data, key_field) == wire


_BASE = {"ts": "2026-05-01T10:00:00.123Z", "item": "x"}


# Each limit, with whether the fast path takes it: a plainly valid record (at the limit, normalized text, another
# ISO form of the time) is written by the fast path; anything the model refuses, or accepts only by coercing it
# (a number where text is wanted, an int a float cannot hold), is left to the model.
@pytest.mark.parametrize(
    ("change", "fast_path"),
    [
        ({"dims": {"a b": "v"}}, False),
        ({"dims": {"a\n": "v"}}, False),
        ({"dims": {"A" * 64: "v"}}, True),
        ({"dims": {"A" * 65: "v"}}, False),
        ({"dims": {f"k{i}": "v" for i in range(16)}}, True),
        ({"dims": {f"k{i}": "v" for i in range(17)}}, False),
        ({"dims": {"k": ""}}, False),
        ({"dims": {"k": 1}}, False),  # the model coerces it
        ({"dims": {}}, True),
        ({"value": True}, False),
        ({"value": 2**53}, True),
        ({"value": 2**53 + 1}, False),  # the model coerces it
        ({"value": 10**400}, False),
        ({"value": "1.5"}, False),  # the model coerces it
        ({"id": "A" * 128}, True),
        ({"id": "A" * 129}, False),
        ({"id": 7}, False),  # the model coerces it
        ({"user": ""}, False),
        ({"item": "e\u0301"}, True),  # normalized to NFC on both paths
        ({"item": "a\x9b"}, False),
        ({"item": "x\ud800"}, False),
        ({"ts": "2026-05-01T10:00:00.123456Z"}, True),
        ({"ts": "2026-05-01T10:00:00.123+02:00"}, True),
        ({"ts": "1969-12-31T23:59:59Z"}, False),
        ({"v": 2}, False),
    ],
)
def test_the_fast_path_agrees_with_the_model_at_every_limit(change: dict[str, object], fast_path: bool) -> None:
    fields = {**_BASE, **change}
    fast = encode_fast(fields, "item")
    if fast_path:
        assert fast is not None
        assert fast == _wire(fields, "item")
    else:
        assert fast is None


@settings(max_examples=1500, deadline=None)
@given(_RECORDS, _KEYS, st.booleans())
def test_the_raw_fast_path_writes_the_models_event_or_defers_to_it(
    fields: dict[str, object], key_field: str, ascii_only: bool
) -> None:
    """encode_raw_fast reads JSON bytes in C: whatever it takes, it writes as the model does."""
    try:
        raw = json.dumps(fields, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    except ValueError:  # NaN and infinities are not JSON
        return
    fast = encode_raw_fast(raw, key_field)
    if fast is not None:
        assert fast == _wire(json.loads(raw), key_field)


@pytest.mark.parametrize(
    ("change", "fast_path"),
    [
        ({}, True),
        ({"v": 1, "id": "e-1", "user": "u", "value": 2.5, "dims": {"country": "DE"}}, True),
        ({"dims": {"A" * 64: "v", **{f"k{i}": "v" for i in range(15)}}}, True),
        ({"dims": {"A" * 65: "v"}}, False),
        ({"dims": {f"k{i}": "v" for i in range(17)}}, False),
        ({"dims": {"a b": "v"}}, False),
        ({"dims": {"a\n": "v"}}, False),
        ({"dims": {"k": ""}}, False),
        ({"dims": {"k": 1}}, False),
        ({"dims": {}}, True),
        ({"value": 2**53}, True),
        ({"value": 2**53 + 1}, False),
        ({"value": True}, False),
        ({"value": "1.5"}, False),
        ({"value": 1e20}, True),
        ({"id": "A" * 128}, True),
        ({"id": "A" * 129}, False),
        ({"id": 7}, False),
        ({"id": None}, False),
        ({"user": ""}, False),
        ({"user": None}, True),
        ({"item": "A" * 256}, True),
        ({"item": "A" * 257}, False),
        ({"item": "e\u0301"}, False),  # an escape: the other paths normalise it
        ({"item": "caf\u00e9"}, False),
        ({"item": "a\u007f"}, False),
        ({"item": "a\u009b"}, False),
        ({"ts": "2026-05-01T10:00:00Z"}, False),  # valid, but not the canonical layout
        ({"ts": "2026-02-30T10:00:00.000Z"}, False),
        ({"ts": "1969-12-31T23:59:59.999Z"}, False),
        ({"ts": "1970-01-01T00:00:00.000Z"}, True),
        ({"v": 2}, False),
        ({"v": True}, False),
        ({"extra": 1}, False),
    ],
)
def test_the_raw_fast_path_agrees_with_the_model_at_every_limit(change: dict[str, object], fast_path: bool) -> None:
    fields = {**_BASE, **change}
    raw = json.dumps(fields, ensure_ascii=True).encode()
    fast = encode_raw_fast(raw, "item")
    if fast_path:
        assert fast is not None
        assert fast == _wire(fields, "item")
    else:
        assert fast is None


def test_the_raw_fast_path_refuses_bytes_it_cannot_read_as_they_are() -> None:
    good = json.dumps(_BASE).encode()
    assert encode_raw_fast(good, "item") is not None
    assert encode_raw_fast(good.replace(b'"x"', b'"x\x7f"'), "item") is None  # DEL
    assert encode_raw_fast(good.replace(b'"x"', '"x\u00e9"'.encode()), "item") is None  # not ASCII
    assert encode_raw_fast(good.replace(b'"x"', b'"x\t"'), "item") is None  # a raw tab: not JSON
    assert encode_raw_fast(b"[" + good + b"]", "item") is None
    assert encode_raw_fast(good, "value") is None
