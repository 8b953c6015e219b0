"""Pseudonymisation without services: the keyed hashes, the key file, the cache's TTL, the rewrite of events.

The store's Cassandra side (LWT agreement, hours, unlink) is tested against the real Cassandra in
tests/services/test_privacy_subjects.py; here an in-memory table stands in only for what these tests check: what
ingestion does with the pseudonyms it is given.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import stat
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.privacy import subjects
from infra.privacy.subjects import SubjectKeyError, SubjectStore, ensure_key_file, new_pseudonym, read_key
from infra.settings import Settings
from ingestion.pseudonyms import Pseudonymiser
from ingestion.validate import Context, Reject, encode_json
from views.event import Event, content_id

KEY = b"k" * 32


def test_subject_key_is_a_stable_keyed_hash_of_the_nfc_id() -> None:
    keys = subjects.SubjectKeys(KEY)
    expected = hmac.new(KEY, b"trends/subject-key/v1" + "Am\u00e9lie".encode(), hashlib.sha256).digest()
    assert keys.subject_key("Am\u00e9lie") == expected
    assert keys.subject_key("Ame\u0301lie") == expected  # decomposed: the same person
    assert subjects.subject_key("Ame\u0301lie", KEY) == expected
    assert keys.subject_key("amelie") != expected
    assert subjects.SubjectKeys(b"x" * 32).subject_key("Am\u00e9lie") != expected  # another key, another row
    # pinned: a change of the function would orphan every stored subject
    assert keys.subject_key("u1").hex()[:16] == hmac.new(KEY, b"trends/subject-key/v1u1", "sha256").hexdigest()[:16]


def test_the_shown_hash_is_not_the_row_key() -> None:
    keys = subjects.SubjectKeys(KEY)
    shown = keys.subject_hash("alice")
    assert shown == subjects.subject_hash("alice", KEY)
    assert re.fullmatch(r"[0-9a-f]{64}", shown)
    assert bytes.fromhex(shown) != keys.subject_key("alice")
    assert "alice" not in repr(keys) and KEY.decode() not in repr(keys)


def test_pseudonyms_are_random_and_short() -> None:
    made = {new_pseudonym() for _ in range(1000)}
    assert len(made) == 1000
    assert all(re.fullmatch(r"p_[A-Za-z0-9_-]{16}", p) for p in made)


def test_the_key_file_is_created_once_private_and_never_quoted(tmp_path: Path) -> None:
    path = tmp_path / "privacy" / "subject.key"
    assert ensure_key_file(path)
    first = path.read_bytes()
    assert not ensure_key_file(path)
    assert path.read_bytes() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(read_key(path)) >= 32
    path.write_text("short-secret\n")
    with pytest.raises(SubjectKeyError) as short:
        read_key(path)
    assert "short-secret" not in str(short.value)
    with pytest.raises(SubjectKeyError, match="does not exist"):
        read_key(tmp_path / "missing.key")


def _settings(**privacy: Any) -> Settings:
    return Settings(privacy=privacy)


def test_the_cache_answers_until_its_ttl_then_asks_the_store_again() -> None:
    now = [0.0]
    store = SubjectStore(_settings(pseudonym_cache_ttl_s=60), key=KEY, timer=lambda: now[0])
    asked: list[list[str]] = []

    def fetch(users: dict[str, bytes], hours: list[tuple[bytes, int]]) -> dict[str, str]:
        asked.append(sorted(users))
        return {u: f"p_{len(asked)}{u}" for u in users}

    store._read_then_write = fetch  # type: ignore[method-assign]
    assert store.pseudonyms(["a", "b", "a"]) == {"a": "p_1a", "b": "p_1b"}
    now[0] = 59.0
    assert store.pseudonyms(["a", "c"]) == {"a": "p_1a", "c": "p_2c"}
    assert asked == [["a", "b"], ["c"]]
    assert store.stats.cache_hits == 1
    now[0] = 61.0  # a's entry has expired: a forget done meanwhile takes effect now
    assert store.pseudonyms(["a"]) == {"a": "p_3a"}
    assert asked[-1] == ["a"]


def test_with_the_setting_off_nothing_is_pseudonymised() -> None:
    from ingestion.producer import EventProducer

    off = _settings(pseudonymise=False, subject_key_file="/nonexistent/key")
    assert Pseudonymiser.from_settings(off) is None
    producer = EventProducer(off)  # no key file needed, no Cassandra asked
    assert producer.pseudonymiser is None
    # on, the key is read at the first user: events without users need neither the key nor Cassandra
    on = EventProducer(_settings(subject_key_file="/nonexistent/key"))
    assert on.pseudonymiser is not None
    event = Event(ts=datetime(2025, 5, 1, tzinfo=UTC), item="#a")
    assert on.pseudonymiser.event(event) is event
    assert on.pseudonymiser.stats.created == 0
    with pytest.raises(SubjectKeyError, match="/nonexistent/key"):
        on.pseudonymiser.event(event.model_copy(update={"user": "alice"}))


class _Table:
    """An in-memory subject table with the store's interface for what Pseudonymiser calls."""

    def __init__(self) -> None:
        self.table: dict[str, str] = {}
        self.hours: set[tuple[str, datetime]] = set()
        self.asked: list[tuple[str, int]] = []  # every (user, hour) asked for, repeats included
        self.turns: int | None = 0

    def resolve(self, users: Iterable[str], hours: Iterable[tuple[str, int]] = ()) -> dict[str, str]:
        pairs = list(hours)
        self.asked += pairs
        self.hours.update((u, datetime.fromtimestamp(ms // 1000, UTC)) for u, ms in pairs)
        return {u: self.table.setdefault(u, new_pseudonym()) for u in users}

    def memory_turns(self) -> int | None:
        return self.turns

    def close(self) -> None:
        pass


def _pseudonymiser() -> tuple[Pseudonymiser, _Table]:
    table = _Table()
    return Pseudonymiser(cast("SubjectStore", table)), table


def test_encoded_events_carry_the_pseudonym_in_json_key_and_content_id() -> None:
    pseudonymiser, table = _pseudonymiser()
    ctx = Context(source="t", now=datetime(2026, 1, 1, tzinfo=UTC))
    records = [
        b'{"ts":"2025-05-01T10:00:00.000Z","item":"#a","user":"alice","value":3}',  # content id
        b'{"id":"e2","ts":"2025-05-01T11:30:00Z","item":"#a","user":"Ame\\u0301lie","dims":{"c":"x"}}',  # model path
        b'{"id":"e3","ts":"2025-05-01T10:00:00.000Z","item":"#b"}',  # no user
    ]
    raw = [cast("tuple[bytes, bytes | None, int]", encode_json(r, ctx, "user")) for r in records]
    out = pseudonymiser.encoded(raw, "user")
    alice, amelie = table.table["alice"], table.table["Am\u00e9lie"]
    for value, key, _ts in out:
        assert b"alice" not in value and b"lie" not in value
        assert key is None or key.decode() in (alice, amelie)
    first = json.loads(out[0][0])
    ts = datetime(2025, 5, 1, 10, tzinfo=UTC)
    assert first["user"] == alice
    assert first["id"] == content_id(ts, "#a", alice, 3.0, {}) != content_id(ts, "#a", "alice", 3.0, {})
    # the bytes are what the model path writes for the pseudonymised event
    assert out[0][0] == Event(ts=ts, item="#a", user=alice, value=3).to_json()
    assert json.loads(out[1][0])["id"] == "e2" and out[1][1] == amelie.encode()
    assert out[2] == raw[2]
    hours = sorted(h for _u, h in table.hours)
    assert hours == [datetime(2025, 5, 1, 10, tzinfo=UTC), datetime(2025, 5, 1, 11, tzinfo=UTC)]


@pytest.mark.parametrize(
    "record",
    [
        {"ts": "2025-05-01T10:00:00.123Z", "item": "#a", "user": "alice", "value": 1e20},  # json writes this float
        {"ts": "2025-05-01T10:00:00Z", "item": "#a", "user": "alice", "value": 1.5e-7, "dims": {"b": "y", "a": "x"}},
        {"id": "c-not-derived", "ts": "2025-05-01T10:00:00Z", "item": "#a", "user": "alice"},  # kept as it is
        {"ts": 1746093600, "item": "caf\u00e9", "user": "Ame\u0301lie", "value": -0.0},
    ],
)
@pytest.mark.parametrize("key_field", ["item", "user", "id", "none"])
def test_pseudonymised_bytes_are_the_model_paths(record: dict[str, Any], key_field: str) -> None:
    """The rewrite skips validating the other fields again: it must still write what the model writes."""
    pseudonymiser, table = _pseudonymiser()
    ctx = Context(source="t", now=datetime(2026, 1, 1, tzinfo=UTC))
    raw = json.dumps(record).encode()
    encoded = cast("tuple[bytes, bytes | None, int]", encode_json(raw, ctx, key_field))
    [(value, key, ts_ms)] = pseudonymiser.encoded([encoded], key_field)
    original = Event.model_validate(record)
    pseudonym = next(iter(table.table.values()))
    update: dict[str, Any] = {"user": pseudonym}
    if original.id == content_id(original.ts, original.item, original.user, original.value, original.dims):
        update["id"] = content_id(original.ts, original.item, pseudonym, original.value, original.dims)
    expected = original.model_copy(update=update)
    assert (value, key, ts_ms) == (expected.to_json(), expected.key(key_field), expected.ts_ms)


_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)
_TRICKY = st.sampled_from(['a","user":"x', "b\\", '"', "caf\u00e9", ',"user":"', "u1"])


@settings(max_examples=300, deadline=None)
@given(
    event_id=st.one_of(st.none(), _TEXT, _TRICKY),
    item=st.one_of(_TEXT, _TRICKY),
    user=st.one_of(st.none(), _TEXT, _TRICKY),
    value=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32)),
    dims=st.dictionaries(st.sampled_from(["a", "user", "b_2"]), st.one_of(_TEXT, _TRICKY), max_size=2),
    key_field=st.sampled_from(["item", "user", "id", "none"]),
)
def test_the_pseudonym_in_place_of_the_users_bytes_is_the_model_paths(
    event_id: str | None, item: str, user: str | None, value: float | None, dims: dict[str, str], key_field: str
) -> None:
    """Events whose user needs no escape get the pseudonym spliced in: the bytes must be the model path's anyway."""
    pseudonymiser, table = _pseudonymiser()
    ctx = Context(source="t", now=datetime(2026, 1, 1, tzinfo=UTC))
    record: dict[str, Any] = {"ts": "2025-05-01T10:00:00.123Z", "item": item, "user": user, "value": value}
    if event_id is not None:
        record["id"] = event_id
    if dims:
        record["dims"] = dims
    encoded = encode_json(json.dumps(record).encode(), ctx, key_field)
    if not isinstance(encoded, tuple):
        return  # a reject (text the event refuses): nothing to pseudonymise
    [(out, key, ts_ms)] = pseudonymiser.encoded([encoded], key_field)
    original = Event.model_validate(record)
    if original.user is None:
        assert (out, key, ts_ms) == encoded
        return
    pseudonym = table.table[original.user]
    update: dict[str, Any] = {"user": pseudonym}
    if original.id == content_id(original.ts, original.item, original.user, original.value, original.dims):
        update["id"] = content_id(original.ts, original.item, pseudonym, original.value, original.dims)
    expected = original.model_copy(update=update)
    assert (out, key, ts_ms) == (expected.to_json(), expected.key(key_field), expected.ts_ms)


def test_the_model_path_pseudonymises_the_event() -> None:
    pseudonymiser, table = _pseudonymiser()
    ts = datetime(2025, 5, 1, 10, tzinfo=UTC)
    derived = pseudonymiser.event(Event(ts=ts, item="#a", user="bob"))
    assert derived.user == table.table["bob"]
    assert derived.id == content_id(ts, "#a", derived.user, None, {})
    named = pseudonymiser.event(Event(id="x1", ts=ts, item="#a", user="bob"))
    assert (named.id, named.user) == ("x1", derived.user)
    assert pseudonymiser.event(Event(ts=ts, item="#a")).user is None


def test_the_generator_emits_one_pseudonym_per_user() -> None:
    from ingestion.generator import SyntheticStream
    from ingestion.generator_config import GeneratorConfig

    config = GeneratorConfig(seed=7, count=5000, rate=None, users=300, key_field="user")
    raw = list(SyntheticStream(config).chunks())
    pseudonymiser, table = _pseudonymiser()
    done = list(SyntheticStream(config, pseudonymiser=pseudonymiser).chunks())
    raw_users = [json.loads(v)["user"] for c in raw for v in c.values]
    users = [json.loads(v)["user"] for c in done for v in c.values]
    assert users == [table.table[u] for u in raw_users]
    assert len(set(users)) == len(set(raw_users))
    assert [k for c in done for k in c.keys] == [u.encode() for u in users]
    assert not any(re.search(rb'"u\d+"', v) for c in done for v in c.values)


def test_the_generator_asks_again_only_for_new_hours_and_after_the_store_forgot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ingestion import generator
    from ingestion.generator import CHUNK, SyntheticStream
    from ingestion.generator_config import GeneratorConfig

    monkeypatch.setattr(generator, "RESOLVE_CHUNKS", 1)
    monkeypatch.setattr(generator, "GROUPS_AHEAD", 0)
    start = datetime(2025, 5, 1, 9, 58, tzinfo=UTC)  # two hours: 10:00 starts at the 2nd minute's events
    config = GeneratorConfig(seed=7, count=6 * CHUNK, rate=None, users=50, start=start, event_rate=100.0)
    raw = [json.loads(v) for c in SyntheticStream(config).chunks() for v in c.values]
    pseudonymiser, table = _pseudonymiser()
    done = SyntheticStream(config, pseudonymiser=pseudonymiser).chunks()
    users = [json.loads(v)["user"] for v in next(done).values]
    expected = {(e["user"], e["ts"][:13]) for e in raw[:CHUNK]}
    assert len(table.asked) == len(expected)  # each (user, hour) of the first chunk once
    for _ in range(2):
        users += [json.loads(v)["user"] for v in next(done).values]
    expected = {(e["user"], e["ts"][:13]) for e in raw[: 3 * CHUNK]}
    assert len(table.asked) == len(expected) and len(set(table.asked)) == len(expected)  # no pair twice
    table.turns = 1  # the store's memory dropped entries: whatever the generator copied of it goes too
    users += [json.loads(v)["user"] for v in next(done).values]
    assert len(table.asked) == len(expected) + len({(e["user"], e["ts"][:13]) for e in raw[3 * CHUNK : 4 * CHUNK]})
    table.turns = None  # a store that keeps no memory: every chunk asks for all of its pairs
    before = len(table.asked)
    for chunk in done:
        users += [json.loads(v)["user"] for v in chunk.values]
    per_chunk = [{(e["user"], e["ts"][:13]) for e in raw[i * CHUNK : (i + 1) * CHUNK]} for i in (4, 5)]
    assert len(table.asked) - before == sum(map(len, per_chunk))
    assert users == [table.table[e["user"]] for e in raw]
    assert {(u, f"{h:%Y-%m-%dT%H}") for u, h in table.hours} == {(e["user"], e["ts"][:13]) for e in raw}


@pytest.mark.parametrize(("days", "configured"), [(30, 30 * 86_400_000), (30, -1), (2, -1), (90, 7 * 86_400_000)])
def test_the_dead_letters_are_deleted_before_the_erasure_deadline(days: int, configured: int) -> None:
    from infra.pipeline_settings import PrivacySettings
    from infra.service_settings import KafkaSettings
    from infra.topics import topic_specs

    kafka = KafkaSettings(dlq_retention_ms=configured)
    _events, dlq = topic_specs(kafka, PrivacySettings(erasure_deadline_days=days))
    retention, segment = int(dlq.config["retention.ms"]), int(dlq.config["segment.ms"])
    # a record lives at most its retention plus its segment's span, plus Kafka's check interval and delete delay
    assert 0 < retention + segment + 6 * 60_000 < days * 86_400_000
    if 0 <= configured < days * 86_400_000 // 2:
        assert retention == configured  # a shorter configured retention is kept
    assert int(topic_specs(kafka)[1].config["retention.ms"]) < 30 * 86_400_000  # the default deadline applies


def test_an_unexpected_validation_error_logs_no_record_text(caplog: pytest.LogCaptureFixture) -> None:
    from ingestion.validate import Reason, Reject, validate_fields

    class Weird(dict[str, object]):
        def get(self, *_args: object, **_kwargs: object) -> object:
            msg = "no user alice@example.org"
            raise RuntimeError(msg)

    outcome = validate_fields(Weird(), b"?", Context(source="t"), 1)
    assert isinstance(outcome, Reject) and outcome.reason is Reason.INTERNAL_ERROR
    assert "alice@example.org" in outcome.detail  # the dead letter keeps it, beside the raw record
    assert "RuntimeError" in caplog.text and "validate.py" in caplog.text
    assert "alice@example.org" not in caplog.text


def test_a_recent_map_keeps_an_entry_between_half_its_ttl_and_its_ttl() -> None:
    from infra.privacy.recent import RecentMap

    now = [0.0]
    recent: RecentMap[str, int] = RecentMap(100, 60, lambda: now[0])
    recent["a"] = 1
    now[0] = 45.0
    recent.tick()  # turned at 30: a is old, still answered
    recent["b"] = 2
    assert recent.get("a") == 1 and recent.get("b") == 2 and len(recent) == 2
    now[0] = 60.0
    recent.tick()  # turned at 60: a (set at 0) is gone, b (set at 45) is old
    assert recent.get("a") is None and "b" in recent
    now[0] = 200.0
    recent.tick()  # long idle: both generations dropped
    assert recent.get("b") is None and len(recent) == 0
    assert recent.pop("b", 7) == 7
    turns = recent.turns
    recent["c"] = 3
    assert recent.pop("c") == 3 and recent.turns == turns + 1  # a pop drops an entry: a copy must follow it


def test_a_full_recent_map_drops_its_oldest_half() -> None:
    from infra.privacy.recent import RecentMap

    recent: RecentMap[int, int] = RecentMap(4, 60, lambda: 0.0)
    for i in range(5):
        recent[i] = i
    assert len(recent) <= 4 and recent.get(4) == 4
    assert recent.get(0) is None
    assert recent.turns == 2  # turned early at the 3rd and the 5th entry


def test_requests_take_several_partitions_and_split_a_large_one() -> None:
    from infra.privacy.pseudonym_rows import packed

    groups = {1: ["a", "b"], 2: ["c"], 3: list("defgh"), 4: ["i"]}
    requests = packed(groups, rows=4, span=2)
    assert [[p for p, _ in r] for r in requests] == [[1, 1, 2], [3, 3, 3, 3], [3, 4]]
    assert [v for r in requests for _, v in r] == list("abcdefghi")
    assert all(len({p for p, _ in r}) <= 2 and len(r) <= 4 for r in requests)


@pytest.mark.parametrize(
    "record",
    [
        {"ts": "2025-05-01T10:00:00.123Z", "item": "#a", "user": "alice", "value": 1e20},  # a content id
        {
            "ts": "2025-05-01T10:00:00.000Z",
            "item": "#a",
            "user": "alice",
            "value": 1.5e-7,
            "dims": {"b": "y", "a": "x"},
        },
        {"id": "e1", "ts": "2025-05-01T10:59:59.999Z", "item": "#b", "user": "bob", "value": 3},
        {"id": "e2", "ts": "2025-05-01T10:00:00.000Z", "item": "#b"},  # no user: nothing to replace
    ],
)
@pytest.mark.parametrize("key_field", ["item", "user", "id", "none"])
def test_an_event_encoded_with_its_pseudonym_at_once_is_the_pseudonymised_events_bytes(
    record: dict[str, Any], key_field: str
) -> None:
    """The bridge encodes a record of a (user, hour) it has recorded with the pseudonym in place: the same bytes."""
    from views.event import encode_raw_fast

    pseudonymiser, table = _pseudonymiser()
    ctx = Context(source="t", now=datetime(2026, 1, 1, tzinfo=UTC))
    raw = json.dumps(record, separators=(",", ":")).encode()
    encoded = cast("tuple[bytes, bytes | None, int]", encode_json(raw, ctx, key_field))
    learned: dict[tuple[str, int], str] = {}
    [after] = pseudonymiser.encoded([encoded], key_field, learned)
    if "user" in record:
        assert list(learned) == [(record["user"], encoded[2] // 3_600_000 * 3_600_000)]
    asked: list[tuple[str, int]] = []

    def known(user: str, ts_ms: int) -> str | None:
        asked.append((user, ts_ms))
        return learned.get((user, ts_ms - ts_ms % 3_600_000))

    assert encode_raw_fast(raw, key_field, known) == after
    assert asked == ([(record["user"], encoded[2])] if "user" in record else [])
    if "user" in record:
        assert table.table[record["user"]].encode() in after[0] and record["user"].encode() not in after[0]


def test_an_unknown_user_or_a_derived_looking_id_is_left_to_the_pseudonymiser() -> None:
    from views.event import CONTENT_ID_PREFIX, encode_raw_fast

    raw = b'{"ts":"2025-05-01T10:00:00.000Z","item":"#a","user":"alice"}'
    assert encode_raw_fast(raw, "item", lambda _u, _t: None) is None
    assert encode_raw_fast(raw, "item", lambda _u, _t: "p1") is not None
    given_id = b'{"id":"%s00","ts":"2025-05-01T10:00:00.000Z","item":"#a","user":"alice"}' % CONTENT_ID_PREFIX.encode()
    assert encode_raw_fast(given_id, "item", lambda _u, _t: "p1") is None  # was it derived from alice? not said here


class _Record:
    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "clicks"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


class _Transactional:
    def __init__(self, _conf: dict[str, Any]) -> None:
        self.records: list[tuple[str, bytes, bytes | None]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **_kw: Any) -> None:
        self.records.append((topic, value, key))

    def begin_transaction(self) -> None: ...

    def send_offsets_to_transaction(self, *_args: Any) -> None: ...

    def commit_transaction(self, *_args: Any) -> None: ...


class _Consumer:
    def __init__(self, _conf: dict[str, Any]) -> None: ...


def test_the_bridge_encodes_recorded_pairs_at_once_and_forgets_them_when_the_store_memory_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import confluent_kafka

    from ingestion.bridge import Bridge

    monkeypatch.setattr(confluent_kafka, "Producer", _Transactional)
    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    bridge = Bridge(_settings(), ["clicks"], "json")
    pseudonymiser, table = _pseudonymiser()
    bridge._pseudonymiser = pseudonymiser
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:00:00.000Z")

    def batch(*users: str) -> tuple[frozenset[int], list[bytes]]:
        records = [
            _Record(json.dumps({"ts": now, "item": "#a", "user": u}, separators=(",", ":")).encode(), i)
            for i, u in enumerate(users)
        ]
        outcomes, fused = bridge._outcomes(cast("Any", records), lambda: False)
        assert outcomes is not None
        produced = bridge._producer.records  # type: ignore[attr-defined]
        produced.clear()
        assert bridge._transact(outcomes, object(), fused)
        return fused, [value for _topic, value, _key in produced]

    fused, first = batch("alice", "alice")
    assert fused == frozenset() and len(table.asked) == 1  # one pair asked for both
    fused, second = batch("alice", "bob")
    assert fused == {0} and [u for u, _h in table.asked[1:]] == ["bob"]  # alice's hour is not asked again
    assert second[0] == first[0]  # the same bytes as pseudonymised after
    assert table.table["alice"].encode() in second[0] and b"alice" not in second[0]
    table.turns = 1  # the store's memory turned (its TTL, or a forget): the copy goes with it
    fused, _ = batch("bob")
    assert fused == {0}  # read with the copy before the turn was seen: the store's own bound holds it
    fused, third = batch("alice")
    assert fused == frozenset() and [u for u, _h in table.asked[2:]] == ["alice"]
    assert third[0] == first[0]


def test_the_collector_encodes_recorded_pairs_at_once_and_forgets_them_when_the_store_memory_turns() -> None:
    from types import SimpleNamespace

    from ingestion.collector import Collector

    collector = Collector(_settings())
    pseudonymiser, table = _pseudonymiser()
    collector.loop = cast("Any", SimpleNamespace(producer=SimpleNamespace(pseudonymiser=pseudonymiser)))
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:00:00.000Z")

    def request(*users: str) -> tuple[frozenset[int], list[bytes]]:
        body = b"\n".join(
            json.dumps({"ts": now, "item": "#a", "user": u}, separators=(",", ":")).encode() for u in users
        )
        outcomes, fused = collector.validate(body + b"\n{not json\n", "ndjson")
        done = collector.pseudonymise(outcomes, fused)
        assert isinstance(done[-1][1], Reject)  # a reject stays one, whatever the copy holds
        return fused, [cast("tuple[bytes, bytes | None, int]", e)[0] for _i, e in done[:-1]]

    fused, first = request("alice", "alice")
    assert fused == frozenset() and len(table.asked) == 1  # one pair asked for both
    fused, second = request("alice", "bob")
    assert fused == {0} and [u for u, _h in table.asked[1:]] == ["bob"]  # alice's hour is not asked again
    assert second[0] == first[0]  # the same bytes as pseudonymised after
    assert table.table["alice"].encode() in second[0] and b"alice" not in second[0]
    table.turns = 1  # the store's memory turned (its TTL, or a forget): the next request reads without the copy
    fused, third = request("alice")
    assert fused == frozenset() and [u for u, _h in table.asked[2:]] == ["alice"]
    assert third[0] == first[0]
