"""Validation never raises: every kind of bad input becomes a Reject with its reason, source and raw bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingestion.mapping import ColumnMapping
from ingestion.validate import (
    MAX_RECORD_BYTES,
    Context,
    Reason,
    Reject,
    split,
    validate_csv,
    validate_fields,
    validate_json,
)
from views.event import Event

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CTX = Context(source="events.jsonl", now=NOW, max_future_skew=timedelta(minutes=5))
GOOD = b'{"id": "e1", "ts": "2026-11-22T11:00:00Z", "item": "#kafka", "user": "u1", "value": 3.5}'

# One line per kind of bad JSON input, with the reason it must get.
BAD_JSON: list[tuple[bytes, Reason]] = [
    (b'{"id": "e2", "ts": "2026-11-22T11:00:00Z", "item": "#x"', Reason.MALFORMED_JSON),
    (b"[1, 2, 3]", Reason.MALFORMED_JSON),
    (b'"just a string"', Reason.MALFORMED_JSON),
    (b'{"ts": "2026-11-22T11:00:00Z"}', Reason.MISSING_FIELD),
    (b'{"item": "#x"}', Reason.MISSING_FIELD),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "value": "fast"}', Reason.INVALID_FIELD),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "user": {"id": 1}}', Reason.INVALID_FIELD),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "dims": "DE"}', Reason.INVALID_FIELD),
    (b'{"ts": "last tuesday", "item": "#x"}', Reason.BAD_TIME),
    (b'{"ts": "2026-11-22T11:00:00", "item": "#x"}', Reason.BAD_TIME),  # no offset
    (b'{"ts": "2026-11-22T12:06:00Z", "item": "#x"}', Reason.FUTURE_TIME),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "value": NaN}', Reason.NON_FINITE),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "value": Infinity}', Reason.NON_FINITE),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "value": -Infinity}', Reason.NON_FINITE),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "' + b"x" * 300 + b'"}', Reason.OVERSIZE_FIELD),
    (
        b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "pad": "' + b"p" * MAX_RECORD_BYTES + b'"}',
        Reason.OVERSIZE_RECORD,
    ),
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "caf\xe9"}', Reason.NOT_UTF8),
    (b"\xff\xfe{}", Reason.NOT_UTF8),
    (b'{"v": 2, "ts": "2026-11-22T11:00:00Z", "item": "#x"}', Reason.UNSUPPORTED_VERSION),  # never read as v1
    (b'{"v": "1", "ts": "2026-11-22T11:00:00Z", "item": "#x"}', Reason.UNSUPPORTED_VERSION),
    (b'{"v": true, "ts": "2026-11-22T11:00:00Z", "item": "#x"}', Reason.UNSUPPORTED_VERSION),
    # Control characters (C0, DEL, C1) in any text field: their own reason.
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x\\u001b[31m"}', Reason.CONTROL_CHARACTER),  # ESC
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "user": "u\\u0000"}', Reason.CONTROL_CHARACTER),  # NUL
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "dims": {"c": "D\xc2\x9bE"}}', Reason.CONTROL_CHARACTER),  # CSI
    (b'{"id": "a\\nb", "ts": "2026-11-22T11:00:00Z", "item": "#x"}', Reason.CONTROL_CHARACTER),  # newline
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x\\tx"}', Reason.CONTROL_CHARACTER),  # tab
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x\x7f"}', Reason.CONTROL_CHARACTER),  # DEL, raw
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x\x1b[2J"}', Reason.MALFORMED_JSON),  # raw ESC: not JSON
    # An empty dimension value makes a slice no query can name.
    (b'{"ts": "2026-11-22T11:00:00Z", "item": "#x", "dims": {"origin": ""}}', Reason.INVALID_FIELD),
]


def test_a_good_record_is_an_event() -> None:
    event = validate_json(GOOD, CTX, 1)
    assert isinstance(event, Event)
    assert (event.id, event.item, event.user, event.value) == ("e1", "#kafka", "u1", 3.5)


@pytest.mark.parametrize(("raw", "reason"), BAD_JSON, ids=[f"{r.value}-{i}" for i, (_, r) in enumerate(BAD_JSON)])
def test_each_kind_of_bad_json_is_rejected_with_its_reason(raw: bytes, reason: Reason) -> None:
    outcome = validate_json(raw, CTX, 17)
    assert isinstance(outcome, Reject), outcome
    assert outcome.reason == reason, outcome.detail
    assert (outcome.source, outcome.line, outcome.rejected_at) == ("events.jsonl", 17, NOW)
    assert outcome.detail
    if reason is Reason.OVERSIZE_RECORD:
        assert outcome.raw == raw[:MAX_RECORD_BYTES] and outcome.raw_size == len(raw)
    else:
        assert outcome.raw == raw  # the original bytes, untouched


def test_a_cut_overlong_line_is_oversize_with_its_full_size() -> None:
    outcome = validate_json(b'{"item": "x"', CTX, 3, size=10 * MAX_RECORD_BYTES)
    assert isinstance(outcome, Reject)
    assert (outcome.reason, outcome.raw_size) == (Reason.OVERSIZE_RECORD, 10 * MAX_RECORD_BYTES)


def test_the_future_skew_is_a_boundary_not_a_guess() -> None:
    at_limit = json.dumps({"ts": "2026-11-22T12:05:00Z", "item": "x"}).encode()
    past_limit = json.dumps({"ts": "2026-11-22T12:05:00.001Z", "item": "x"}).encode()
    assert isinstance(validate_json(at_limit, CTX), Event)
    assert isinstance(validate_json(past_limit, CTX), Reject)
    year_old = json.dumps({"ts": "2025-11-22T12:00:00Z", "item": "x"}).encode()
    assert isinstance(validate_json(year_old, CTX), Event)  # historical events are welcome


HEADER = ["event_id", "when", "page", "uid", "latency", "country"]
CSV_CTX = Context(
    source="clicks.csv",
    now=NOW,
    mapping=ColumnMapping.parse(
        ["id=event_id", "ts=when", "item=page", "user=uid", "value=latency"], ["country"], time_format="epoch_ms"
    ),
)


def test_csv_rows_map_onto_events_and_empty_cells_are_absent() -> None:
    event = validate_csv(b"e1,1795345200000,/home,u1,12.5,DE", HEADER, CSV_CTX, 2)
    assert isinstance(event, Event)
    assert (event.id, event.item, event.user, event.value, event.dims) == ("e1", "/home", "u1", 12.5, {"country": "DE"})
    sparse = validate_csv(b',1795345200000,"/a,b",,,', HEADER, CSV_CTX, 3)
    assert isinstance(sparse, Event)
    assert (sparse.item, sparse.user, sparse.value, sparse.dims) == ("/a,b", None, None, {})
    assert sparse.id.startswith("c-")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"e1,1795345200000,/home,u1,12.5", Reason.MALFORMED_CSV),  # a column short
        (b"e1,1795345200000,/home,u1,12.5,DE,extra", Reason.MALFORMED_CSV),
        (b'e1,1795345200000,"/home,u1,12.5,DE', Reason.MALFORMED_CSV),  # unterminated quote
        (b"e1,1795345200000,,u1,12.5,DE", Reason.MISSING_FIELD),
        (b"e1,yesterday,/home,u1,12.5,DE", Reason.BAD_TIME),
        (b"e1,1795345200000,/home,u1,NaN,DE", Reason.NON_FINITE),
        (b"e1,1795345200000,/home,u1,inf,DE", Reason.NON_FINITE),
        (b"e1,1795345200000,/home,u1,slow,DE", Reason.INVALID_FIELD),
        (b"e1,1795345200000,/h\xf6me,u1,1,DE", Reason.NOT_UTF8),
        (b"e1,1795345200000,/home,u1,1," + b"D" * 300, Reason.OVERSIZE_FIELD),
    ],
)
def test_each_kind_of_bad_csv_row_is_rejected_with_its_reason(raw: bytes, reason: Reason) -> None:
    outcome = validate_csv(raw, HEADER, CSV_CTX, 9)
    assert isinstance(outcome, Reject), outcome
    assert (outcome.reason, outcome.raw, outcome.source, outcome.line) == (reason, raw, "clicks.csv", 9)


def test_validation_never_raises_even_on_absurd_input() -> None:
    class Weird(dict[str, object]):
        def get(self, *_args: object, **_kwargs: object) -> object:
            msg = "boom"
            raise RuntimeError(msg)

    outcome = validate_fields(Weird(), b"?", CTX, 1)
    assert isinstance(outcome, Reject)
    assert outcome.reason is Reason.INTERNAL_ERROR
    deep = b"[" * 100_000 + b"]" * 100_000
    assert isinstance(validate_json(deep[:MAX_RECORD_BYTES], CTX), Reject)


def test_split_gives_oks_and_errs() -> None:
    outcomes = [validate_json(GOOD, CTX), validate_json(b"nope", CTX)]
    oks, errs = split(outcomes)
    assert len(oks) == 1 and len(errs) == 1 and errs[0].reason is Reason.MALFORMED_JSON


def test_control_character_details_name_the_code_point_not_the_character() -> None:
    outcome = validate_json(b'{"ts": "2026-11-22T11:00:00Z", "item": "ab\\u001b[31m"}', CTX, 1)
    assert isinstance(outcome, Reject) and outcome.reason is Reason.CONTROL_CHARACTER
    assert "U+001B at position 2" in outcome.detail and "item" in outcome.detail
    assert "\x1b" not in outcome.detail


def test_a_control_character_in_a_csv_cell_is_rejected() -> None:
    outcome = validate_csv(b"e1,2026-11-22T11:00:00Z,/a\x1b]0;pwned\x07", ["id", "ts", "item"], CTX, 2)
    assert isinstance(outcome, Reject) and outcome.reason is Reason.CONTROL_CHARACTER


def test_text_is_normalised_to_nfc() -> None:
    composed = json.dumps({"ts": "2026-11-22T11:00:00Z", "item": "caf\u00e9", "dims": {"c": "K\u00f6ln"}})
    decomposed = json.dumps({"ts": "2026-11-22T11:00:00Z", "item": "cafe\u0301", "dims": {"c": "Ko\u0308ln"}})
    a, b = validate_json(composed.encode(), CTX), validate_json(decomposed.encode(), CTX)
    assert isinstance(a, Event) and isinstance(b, Event)
    assert (b.item, b.dims) == ("caf\u00e9", {"c": "K\u00f6ln"}) == (a.item, a.dims)
    assert a.id == b.id  # one content id for one event, whatever the input's normal form
    assert b.to_json() == a.to_json()
    # The limits count normalised characters: 256 decomposed "é" (512 code points) are 256 characters.
    long_item = json.dumps({"ts": "2026-11-22T11:00:00Z", "item": "e\u0301" * 256}).encode()
    assert isinstance(validate_json(long_item, CTX), Event)


_JSON_TEXT = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=8,
    ).map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.text(max_size=30),
    st.sampled_from(['{"a":1e400}', '{"a":"\\ud800"}', '{"a":NaN}', "{} x", '{"a":1,"a":2}', "[" * 2000, '"\\u00e9"']),
)


@settings(max_examples=500, deadline=None)
@given(text=_JSON_TEXT)
def test_the_fast_json_parse_gives_what_json_gives_values_and_errors(text: str) -> None:
    from ingestion.validate import loads

    try:
        expected: Any = ("ok", json.loads(text))
    except (ValueError, RecursionError) as exc:
        expected = ("error", type(exc).__name__, str(exc))
    try:
        got: Any = ("ok", loads(text))
    except (ValueError, RecursionError) as exc:
        got = ("error", type(exc).__name__, str(exc))
    assert repr(got) == repr(expected)  # repr: NaN equals itself, -0.0 differs from 0.0, int differs from float


_LINES = st.one_of(
    _JSON_TEXT,
    st.fixed_dictionaries(
        {
            "ts": st.sampled_from(["2026-01-01T00:00:00.000Z", "2026-01-01T00:03:00Z", "2099-01-01T00:00:00Z", "x"]),
            "item": st.text(min_size=1, max_size=3) | st.sampled_from(["", None]),
        },
        optional={
            "v": st.sampled_from([1, 2, True]),
            "id": st.text(max_size=3) | st.integers(),
            "user": st.text(max_size=3) | st.none() | st.integers(),
            "value": st.floats() | st.integers() | st.text(max_size=3),
            "dims": st.dictionaries(st.sampled_from(["country", "a b"]), st.text(max_size=3) | st.integers()),
            "other": st.integers(),
            "country": st.text(max_size=2),
        },
    ).map(lambda d: json.dumps(d, ensure_ascii=False)),
)


@settings(max_examples=800, deadline=None)
@given(
    text=_LINES,
    key_field=st.sampled_from(["item", "user", "none"]),
    mapping=st.sampled_from([ColumnMapping(), ColumnMapping(dims={"site": "country"})]),  # read as is; mapped
)
def test_the_replay_encoding_is_the_validated_event_on_the_wire(
    text: str, key_field: str, mapping: ColumnMapping
) -> None:
    from ingestion.validate import encode_json

    ctx = Context(source="f.jsonl", now=datetime(2026, 1, 1, 0, 1, tzinfo=UTC), mapping=mapping)
    raw = text.encode("utf-8", "surrogatepass")
    outcome = validate_json(raw, ctx, 7)
    expected = outcome if isinstance(outcome, Reject) else (outcome.to_json(), outcome.key(key_field), outcome.ts_ms)
    assert encode_json(raw, ctx, key_field, 7) == expected


def _near(rest: str) -> str:
    """Return a record in the event's own layout, its time canonical: ``rest`` holds its other fields."""
    return '{"ts":"2026-11-22T11:00:00.000Z",' + rest + "}"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (_near('"item":"a\x7f"'), Reason.CONTROL_CHARACTER),  # ASCII, but DEL
        (_near('"item":"a\\u0000"'), Reason.CONTROL_CHARACTER),  # an escape
        (_near('"item":"a\u009b"'), Reason.CONTROL_CHARACTER),  # not ASCII
        (_near('"item":""'), Reason.INVALID_FIELD),
        (_near('"item":"' + "a" * 257 + '"'), Reason.OVERSIZE_FIELD),
        (_near('"item":"a","user":""'), Reason.INVALID_FIELD),
        (_near('"item":"a","dims":{"a b":"x"}'), Reason.INVALID_FIELD),
        (_near('"item":"a","dims":{"k":""}'), Reason.INVALID_FIELD),
        (_near('"item":"a","value":1e400'), Reason.NON_FINITE),
        (_near('"item":"a","v":2'), Reason.UNSUPPORTED_VERSION),
        ('{"ts":"2026-11-22T12:30:00.000Z","item":"a"}', Reason.FUTURE_TIME),  # canonical, after now + skew
        ('{"ts":"1969-12-31T23:59:59.999Z","item":"a"}', Reason.BAD_TIME),
        ('{"ts":"2026-02-30T11:00:00.000Z","item":"a"}', Reason.BAD_TIME),
        (_near('"item":"' + "a" * 17_000 + '"'), Reason.OVERSIZE_RECORD),
    ],
)
def test_records_near_the_raw_fast_path_are_rejected_as_the_model_rejects_them(raw: str, reason: Reason) -> None:
    """A record that looks like the event's own form but is not valid gets the model's reason and detail."""
    from ingestion.validate import encode_json

    data = raw.encode()
    model = validate_json(data, CTX, 3)
    assert isinstance(model, Reject) and model.reason == reason, model
    assert encode_json(data, CTX, "item", 3) == model


def test_a_record_in_the_events_own_form_is_written_as_it_came() -> None:
    from ingestion.validate import encode_json

    event = Event(id="e1", ts=NOW - timedelta(hours=1), item="#a", user="u1", value=2.5, dims={"country": "DE"})
    wire = event.to_json()
    assert encode_json(wire, CTX, "user") == (wire, b"u1", event.ts_ms)
