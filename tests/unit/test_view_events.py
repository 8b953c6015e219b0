"""Parsing Kafka records with the schema derived from the event model (Spark, no services)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from views.event import Event, avro_schema, ts_millis
from views.event_frames import EVENT_COLUMNS, EXCLUDE_LITERALS, parse_events, valid_events, without_users

pytestmark = pytest.mark.spark


def test_normalized_events_parse_and_garbage_is_flagged(spark: Any) -> None:
    good = Event(id="e1", ts="2026-05-01T10:00:01.250Z", item="#a", user="u", value=2.5, dims={"origin": "JFK"})
    minimal = Event(ts=1777629600, item="#b")
    records = [
        (good.to_json(), 0, 0),
        (minimal.to_json(), 0, 1),
        (b"{broken", 1, 0),
        (b'{"v":1,"ts":"2026-05-01T10:00:00.000Z"}', 1, 1),  # no id, no item
    ]
    frame = spark.createDataFrame(records, "value binary, partition int, offset long")
    parsed = parse_events(frame)
    rows = {(r.partition, r.offset): r for r in parsed.collect()}
    assert [rows[k].parsed_ok for k in sorted(rows)] == [True, True, False, False]
    r = rows[(0, 0)]
    assert (r.id, r.item, r.user, r.value, r.dims) == ("e1", "#a", "u", 2.5, {"origin": "JFK"})
    assert r.ts.replace(tzinfo=UTC) == datetime(2026, 5, 1, 10, 0, 1, 250000, tzinfo=UTC)
    m = rows[(0, 1)]
    assert (m.id, m.user, m.value, m.dims) == (minimal.id, None, None, None)
    assert m.ts.replace(tzinfo=UTC) == datetime.fromtimestamp(1777629600, UTC)
    assert tuple(valid_events(parsed).columns) == EVENT_COLUMNS
    assert valid_events(parsed).count() == 2


def _from_json_calls(frame: Any) -> int:
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return int(plan.count("from_json("))


def test_each_record_is_parsed_once_whatever_the_filters(spark: Any) -> None:
    """Filters on the event's fields must not be pushed below the parse (each would re-parse the record)."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(b"{}", 0, 0)], "value binary, partition int, offset long")
    parsed = parse_events(frame)
    in_hour = F.col("parsed_ok") & (F.col("ts") >= F.lit(datetime(2026, 5, 1, tzinfo=UTC)))
    assert _from_json_calls(valid_events(parsed)) == 1
    assert _from_json_calls(parsed.where(in_hour).where(F.col("item") != "x").select(*EVENT_COLUMNS)) == 1


def _reference_parse(records: Any, keep: tuple[str, ...] = ("partition", "offset")) -> Any:
    """Return the decode as it was before the guard: from_json under explode(array(...)) (the reference).

    One change: ``try_cast`` of the time, as in the decode under test. With ``cast`` a record whose ``ts`` is text
    but not a time failed the whole query under ANSI mode (Spark 4's default) instead of counting as unparseable.
    """
    from pyspark.sql import functions as F

    from views.event_frames import _wire_schema

    parsed = F.from_json(F.col("value").cast("string"), _wire_schema())
    decoded = records.select(F.explode(F.array(parsed)).alias("e"), *keep)
    ts = F.col("e.ts").try_cast("timestamp")
    ok = F.col("e").isNotNull() & F.col("e.id").isNotNull() & ts.isNotNull() & F.col("e.item").isNotNull()
    return decoded.select(
        *(ts.alias(n) if n == "ts" else F.col(f"e.{n}").alias(n) for n in EVENT_COLUMNS),
        F.coalesce(ok, F.lit(False)).alias("parsed_ok"),
        *keep,
    )


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_JSON_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), _TEXT
)
_JSON = st.recursive(
    _JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
_TS = st.one_of(
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)).map(  # noqa: DTZ001 - hypothesis bounds are naive
        lambda t: t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    ),
    st.sampled_from(["garbage", "", "2026-05-01 10:00:01", "2026-05-01T10:00:01+02:00", "12345", "2026-13-01T00:00Z"]),
    st.integers(0, 2**40),
)


@st.composite
def _records(draw: st.DrawFn) -> bytes:
    """Return a Kafka record's value: a normalized event, the same with fields swapped, dropped or spoiled, or junk."""
    event = draw(
        st.builds(
            Event,
            id=st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=8),
            ts=st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),  # noqa: DTZ001
            item=st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=8),
            user=st.none() | st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1, max_size=5),
            value=st.none() | st.floats(allow_nan=False, allow_infinity=False),
            dims=st.dictionaries(
                st.from_regex(r"[a-z][a-z0-9_]{0,4}", fullmatch=True),
                st.text(min_size=1, max_size=4).filter(
                    lambda v: not any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in v)
                ),
                max_size=3,
            ),
        )
    )
    fields: dict[str, Any] = event.to_dict()
    kind = draw(st.sampled_from(["valid", "valid", "field", "drop", "ts", "raw", "text"]))
    if kind == "field":
        fields[draw(st.sampled_from(["id", "ts", "item", "user", "value", "dims", "v", "extra"]))] = draw(_JSON)
    elif kind == "drop":
        fields.pop(draw(st.sampled_from(sorted(fields))))
    elif kind == "ts":
        fields["ts"] = draw(_TS)
    text = json.dumps(
        fields, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    )
    if kind == "raw":  # tokens only a lenient parser takes, cut records, trailing junk
        text = draw(
            st.sampled_from(
                [
                    text.replace('"value": ', '"value": NaN, "x": ').replace('"value":', '"value":NaN,"x":'),
                    text[: draw(st.integers(0, len(text)))],
                    text + draw(st.sampled_from(["x", "}", " ", "\n", "{}"])),
                    "[" + text + "]",
                ]
            )
        )
    if kind == "text":
        return draw(st.binary(max_size=30) | _JSON.map(lambda j: json.dumps(j).encode()))
    return text.encode()


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    from pyspark.sql import functions as F

    out = frame.select(*EVENT_COLUMNS, "parsed_ok", "offset").withColumn("ts", F.unix_micros("ts")).collect()
    # repr: NaN equals itself, -0.0 differs from 0.0, and map order does not matter
    return sorted(
        (
            r.offset,
            r.parsed_ok,
            r.id,
            r.ts,
            r.item,
            r.user,
            repr(r.value),
            sorted((r.dims or {}).items()),
            r.dims is None,
        )
        for r in out
    )


# Few examples of many records: each example costs four Spark jobs, and a record's kind is drawn per record.
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records=st.lists(_records(), min_size=1, max_size=120))
def test_the_decode_agrees_with_the_reference_on_valid_and_invalid_records(spark: Any, records: list[bytes]) -> None:
    """The same values, the same rejects, the same dims maps as the previous decode, also under filters."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(
        [(r, 0, i) for i, r in enumerate(records)], "value binary, partition int, offset long"
    )
    new, old = parse_events(frame), _reference_parse(frame)
    assert _rows(new) == _rows(old)
    in_range = F.col("parsed_ok") & (F.col("ts") >= F.lit(datetime(2000, 1, 1, tzinfo=UTC))) & (F.col("item") != "x")
    assert _rows(new.where(in_range)) == _rows(old.where(in_range))
    assert len(_rows(new)) == len(records)


def test_a_time_that_is_not_a_time_is_unparseable_not_a_failed_query(spark: Any) -> None:
    frame = spark.createDataFrame(
        [(b'{"v":1,"id":"a","ts":"garbage","item":"#a"}', 0, 0)], "value binary, partition int, offset long"
    )
    rows = parse_events(frame).collect()
    assert [(r.id, r.ts, r.parsed_ok) for r in rows] == [("a", None, False)]


@pytest.mark.parametrize("erased_extra", [0, EXCLUDE_LITERALS + 1], ids=["literal set", "broadcast anti-join"])
def test_erased_users_are_left_out_and_every_other_event_kept(spark: Any, erased_extra: int) -> None:
    events = [
        Event(id=f"e{i}", ts=1777629600 + i, item="#a", user=u) for i, u in enumerate(["p_x", "p_y", None, "p_x"])
    ]
    frame = spark.createDataFrame(
        [(e.to_json(), 0, i) for i, e in enumerate(events)], "value binary, partition int, offset long"
    )
    parsed = valid_events(parse_events(frame))
    erased = {"p_x", *(f"p_other{i}" for i in range(erased_extra))}
    kept = without_users(parsed, erased)
    assert tuple(kept.columns) == EVENT_COLUMNS
    assert sorted(r.id for r in kept.collect()) == ["e1", "e2"]  # p_y and the event without a user
    assert without_users(parsed, set()) is parsed


def _avro_long(n: int) -> bytes:
    """Encode an Avro int/long: zigzag, then base-128 varint (the Avro specification's binary encoding)."""
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    return bytes([*out, z])


def test_avro_of_the_contract_decodes_to_the_events_the_json_gives(spark: Any) -> None:
    """Events encoded as plain Avro of avro_schema() decode with from_avro to what parse_events reads from their JSON.

    Optional fields absent, no dims, the extreme times, text beyond ASCII; and one record's bytes spelled out, so
    the wire form (field order, unions, ``ts`` in milliseconds, no framing) is pinned apart from Spark.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    events = [
        Event(id="e1", ts="2026-05-01T10:00:01.250Z", item="#a"),
        Event(ts="1970-01-01T00:00:00Z", item="#b", user="u", value=2.5, dims={"origin": "JFK"}),
        Event(ts="9999-12-31T23:59:59.999Z", item="ünï €", user="😀", value=-1e300, dims={"a": "x", "b.c": "ÿ"}),
    ]
    avsc = json.dumps(avro_schema())
    names = [f["name"] for f in avro_schema()["fields"]]
    rows = [tuple(getattr(e, n) for n in names) for e in events]
    typed = "v int, id string, ts timestamp, item string, user string, value double, dims map<string,string>"
    encoded = spark.createDataFrame(rows, typed).select(to_avro(F.struct(*names), avsc).alias("value"))
    first = encoded.first().value
    assert bytes(first) == b"\x02\x04e1" + _avro_long(ts_millis(events[0].ts)) + b"\x04#a\x00\x00\x00"

    from_binary = encoded.select(from_avro("value", avsc, {"mode": "PERMISSIVE"}).alias("e")).select("e.*")
    json_frame = spark.createDataFrame(
        [(e.to_json(), 0, i) for i, e in enumerate(events)], "value binary, partition int, offset long"
    )
    from_text = valid_events(parse_events(json_frame))

    def seen(frame: Any) -> list[tuple[Any, ...]]:
        # JSON leaves empty dims out (null); Avro always has the map: both mean "no dims"
        return sorted(
            (r.id, r.ts, r.item, r.user, r.value, sorted((r.dims or {}).items()))
            for r in frame.select(*EVENT_COLUMNS).collect()
        )

    assert seen(from_binary) == seen(from_text)
    assert len(seen(from_binary)) == len(events)


# An older version of the contract in the registry: no `value` yet (read as null), a field dropped since.
_OLDER = {
    **avro_schema(),
    "fields": [*(f for f in avro_schema()["fields"] if f["name"] != "value"), {"name": "host", "type": "string"}],
}


def _older_avro(schema_id: int, event: Event) -> bytes:
    """Return an event as a writer of :data:`_OLDER` framed it."""
    import io

    import fastavro

    from views.event_avro import avro_record, header

    record = {**avro_record(event.to_json()), "host": "h1"}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(_OLDER), record)
    return header(schema_id) + out.getvalue()


def test_a_topic_of_json_and_avro_records_parses_to_the_events_its_json_gives(spark: Any) -> None:
    """JSON, Avro of the current contract and Avro of an older version, interleaved: the JSON path's columns and
    parsed_ok; an unknown id, a cut payload and a short frame are unparseable, never a wrong event."""
    from views.event_avro import EventAvro, header, reader_schema_text

    current, older = 3, 1
    writer = EventAvro(current)
    events = [
        Event(id="e0", ts="2026-05-01T10:00:01.250Z", item="#a"),
        Event(ts="1970-01-01T00:00:00Z", item="#b", user="u", value=2.5, dims={"origin": "JFK"}),
        Event(ts="9999-12-31T23:59:59.999Z", item="ünï €", user="😀", value=-1e300, dims={"a": "x", "b.c": "ÿ"}),
        Event(id="e3", ts="2026-05-01T10:00:02Z", item="#c", user="p_1", value=0.0),
        Event(id="e4", ts="2026-05-01T10:00:03Z", item="#d", dims={"origin": "LAX"}),
        Event(id="e5", ts="2026-05-01T10:00:04Z", item="#e", user="p_2", value=7.0),
    ]
    forms = ["json", "avro", "older"] * 2
    values: list[bytes | None] = []
    expected: list[Event] = []
    for event, form in zip(events, forms, strict=True):
        if form == "json":
            values.append(event.to_json())
        elif form == "avro":
            values.append(writer(event.to_json()))
        else:
            values.append(_older_avro(older, event))
            event = event.model_copy(update={"value": None})  # the older writer had no value  # noqa: PLW2901
        expected.append(event)
    good = len(values)
    bad: list[bytes | None] = [
        header(99) + writer(events[0].to_json())[5:],  # an id the registry does not know
        writer(events[1].to_json())[:-4],  # a payload cut short
        b"\x00\x00\x00",  # a frame without a whole id
        b"{broken",
        b'{"v":1,"ts":"2026-05-01T10:00:00.000Z"}',  # JSON without id and item
        None,
    ]
    schema = "value binary, partition int, offset long"
    mixed = spark.createDataFrame([(v, 0, i) for i, v in enumerate(values + bad)], schema)
    avro = {current: reader_schema_text(), older: json.dumps(_OLDER)}
    parsed = parse_events(mixed, avro=avro)
    as_json = parse_events(spark.createDataFrame([(e.to_json(), 0, i) for i, e in enumerate(expected)], schema))

    assert parsed.columns == as_json.columns
    assert parsed.schema["ts"].dataType == as_json.schema["ts"].dataType
    rows = _rows(parsed)
    assert rows[:good] == _rows(as_json)
    assert all(r[1] is True for r in rows[:good])
    assert [r[1] for r in rows[good:]] == [False] * len(bad)
    assert all(r[2:8] == (None, None, None, None, repr(None), []) for r in rows[good : good + 3])

    # Without writer schemas the Avro records are unparseable, the JSON ones read as before
    json_only = _rows(parse_events(mixed))
    assert [r[1] for r in json_only[:good]] == [form == "json" for form in forms]


def test_each_mixed_record_runs_one_decode_whatever_the_filters(spark: Any) -> None:
    """The guard keeps the optimizer from copying from_json or from_avro into the filters above the parse."""
    from pyspark.sql import functions as F

    from views.event_avro import reader_schema_text

    frame = spark.createDataFrame([(b"{}", 0, 0)], "value binary, partition int, offset long")
    parsed = parse_events(frame, avro={1: json.dumps(_OLDER), 2: reader_schema_text()})
    in_hour = F.col("parsed_ok") & (F.col("ts") >= F.lit(datetime(2026, 5, 1, tzinfo=UTC)))
    for query in (valid_events(parsed), parsed.where(in_hour).where(F.col("item") != "x").select(*EVENT_COLUMNS)):
        plan = query._jdf.queryExecution().executedPlan().toString()
        assert plan.count("from_json(") == 1
        assert plan.count("from_avro(") == 2  # one branch per known id
