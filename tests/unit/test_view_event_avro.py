"""The events topic in Avro without services: wire JSON -> framed Avro -> the same event, the writer schemas readers
get, the Python readers' decode, and the writers (producer, bridge) that transcode at their last step.

The registry is a stand-in answering as confluent-kafka's client does, the Kafka clients are stand-ins that keep
what they are given (the real registry and broker are in tests/services/test_events_avro.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest
from confluent_kafka import KafkaError
from confluent_kafka.schema_registry import RegisteredSchema, Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from hypothesis import given
from hypothesis import strategies as st

from infra.settings import Settings
from views import event_avro
from views.event import Event, avro_schema, ts_millis
from views.event_avro import (
    EventAvro,
    EventValues,
    UnreadableEventError,
    avro_record,
    events_writer,
    header,
    reader_schema_text,
    writer_schemas,
)

TOPIC = "ev"
SUBJECT = "ev-value"
# An older version of the contract: no `value` yet (the current one's default fills it), a field dropped since.
OLDER = {
    **avro_schema(),
    "fields": [
        *(f for f in avro_schema()["fields"] if f["name"] != "value"),
        {"name": "origin_host", "type": "string"},
    ],
}


class Registry:
    """Answers what :mod:`infra.registry` asks, as confluent-kafka's ``SchemaRegistryClient`` does."""

    def __init__(self) -> None:
        self.schemas: dict[int, tuple[str, str]] = {}
        self.subjects: dict[str, list[int]] = {}
        self.registered: list[str] = []
        self.asked: list[int] = []

    def register_schema(self, subject: str, schema: Schema) -> int:
        self.registered.append(subject)
        entry = (schema.schema_str, schema.schema_type)
        found = [i for i, known in self.schemas.items() if known == entry]
        schema_id = found[0] if found else max(self.schemas, default=0) + 1
        self.schemas[schema_id] = entry
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def get_versions(self, subject: str) -> list[int]:
        if subject not in self.subjects:
            raise SchemaRegistryError(404, 40401, f"Subject '{subject}' not found.")
        return list(range(1, len(self.subjects[subject]) + 1))

    def get_version(self, subject: str, version: int) -> RegisteredSchema:
        schema_id = self.subjects[subject][version - 1]
        text, kind = self.schemas[schema_id]
        return RegisteredSchema(
            subject=subject, version=version, schema_id=schema_id, guid=None, schema=Schema(text, kind)
        )

    def get_schema(self, schema_id: int) -> Schema:
        self.asked.append(schema_id)
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, f"Schema {schema_id} not found.")
        text, kind = self.schemas[schema_id]
        return Schema(text, kind)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """Give views.event_avro the stand-in registry, and a process with no transcoder registered yet."""
    stand_in = Registry()
    monkeypatch.setattr(event_avro, "registry_client", lambda _settings: stand_in)
    monkeypatch.setattr(event_avro, "_WRITERS", {})
    yield stand_in


def no_registry(_settings: Any) -> Any:
    msg = "the registry must not be asked"
    raise AssertionError(msg)


def settings_of(fmt: str, **kafka: Any) -> Settings:
    base = Settings()
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": TOPIC, "events_format": fmt, **kafka}),
            "privacy": base.privacy.model_copy(update={"pseudonymise": False}),
        }
    )


def framed(schema: dict[str, Any], schema_id: int, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return header(schema_id) + out.getvalue()


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=12)
EVENTS = st.builds(
    Event,
    id=st.just("") | _TEXT,
    ts=st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)),  # noqa: DTZ001 - hypothesis bounds are naive
    item=_TEXT,
    user=st.none() | _TEXT,
    value=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    dims=st.dictionaries(st.from_regex(r"[a-z][a-z0-9_.\-]{0,6}", fullmatch=True), _TEXT, max_size=4),
)


@given(EVENTS)
def test_wire_json_round_trips_through_framed_avro_to_the_same_event(event: Event) -> None:
    avro = EventAvro(7)
    wire = event.to_json()
    value = avro(wire)
    assert value[:5] == b"\x00\x00\x00\x00\x07"
    assert avro.wire(value) == wire  # the same bytes as the JSON writer's
    assert Event.model_validate_json(avro.wire(value)) == event
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(avro_schema()), None)
    assert record["ts"] == event.ts and record["dims"] == event.dims and record["value"] == event.value


def test_the_payload_is_plain_avro_of_the_contract_after_the_frame() -> None:
    event = Event(id="e1", ts="2026-05-01T10:00:01.250Z", item="#a")
    ms = ts_millis(event.ts)
    zigzag, varint = ms << 1, bytearray()
    while zigzag > 0x7F:
        varint.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    varint.append(zigzag)
    # v=1, id, ts (long), item, user null (branch 0), value null (branch 0), dims: an empty map
    assert EventAvro(300)(event.to_json()) == b"\x00\x00\x00\x01\x2c" + b"\x02\x04e1" + varint + b"\x04#a\x00\x00\x00"


def test_what_is_not_wire_json_is_refused_with_a_reason() -> None:
    for bad in (b"{broken", b'{"v":1,"id":"a","item":"#a"}', b'{"ts":"yesterday","item":"#a"}', b"[1]"):
        with pytest.raises(UnreadableEventError, match="not an event's wire JSON"):
            avro_record(bad)
    avro = EventAvro(7)
    with pytest.raises(UnreadableEventError, match="not framed with schema id 7"):
        avro.wire(header(8) + b"\x02")
    with pytest.raises(UnreadableEventError, match="does not match schema id 7"):
        avro.wire(header(7) + b"\x02\x04e1")


def test_writers_register_the_contract_once_per_process_under_the_topic_subject(registry: Registry) -> None:
    first = events_writer(settings_of("avro"))
    assert first is not None and first is events_writer(settings_of("avro"))
    assert registry.registered == [SUBJECT]
    assert registry.schemas[first.schema_id] == (reader_schema_text(), "AVRO")
    other_topic = events_writer(settings_of("avro", events_topic="other"))
    assert other_topic is not None and other_topic is not first
    assert registry.registered == [SUBJECT, "other-value"]


def test_json_writers_and_readers_need_no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_avro, "registry_client", no_registry)
    assert events_writer(settings_of("json")) is None
    assert writer_schemas(settings_of("json")) == {}
    values = EventValues(settings_of("json").registry)
    event = Event(ts="2026-05-01T10:00:00Z", item="#a", user="p_1")
    assert values.decode(event.to_json()) == (event.to_dict(), event.to_json())


def test_readers_get_every_version_of_the_subject_by_id(registry: Registry) -> None:
    older = registry.register_schema(SUBJECT, Schema(json.dumps(OLDER), "AVRO"))
    registry.register_schema(SUBJECT, Schema('syntax = "proto3"; message E {}', "PROTOBUF"))  # not Avro: left out
    schemas = writer_schemas(settings_of("avro"))
    assert registry.registered == [SUBJECT, SUBJECT, SUBJECT]  # the contract registered by the reader too
    current = registry.subjects[SUBJECT][-1]
    assert schemas == {older: json.dumps(OLDER), current: reader_schema_text()}


def test_python_readers_decode_json_and_every_avro_version_into_the_same_events(registry: Registry) -> None:
    older = registry.register_schema(SUBJECT, Schema(json.dumps(OLDER), "AVRO"))
    writer = events_writer(settings_of("avro"))
    assert writer is not None
    values = EventValues(settings_of("avro").registry)
    event = Event(id="e1", ts="2026-05-01T10:00:01.250Z", item="#a", user="p_1", value=2.5, dims={"origin": "JFK"})
    as_avro = writer(event.to_json())
    old_record = {**avro_record(event.to_json()), "origin_host": "h1"}
    del old_record["value"]
    as_older = framed(OLDER, older, old_record)
    without_value = event.model_copy(update={"value": None})
    for _ in range(2):
        assert values.decode(event.to_json()) == (event.to_dict(), event.to_json())
        assert values.decode(as_avro) == (event.to_dict(), event.to_json())
        assert values.decode(as_older) == (without_value.to_dict(), without_value.to_json())
    assert registry.asked == [writer.schema_id, older]  # each id fetched once

    with pytest.raises(UnreadableEventError, match="schema id 99 is not in the registry"):
        values.decode(header(99) + as_avro[5:])
    with pytest.raises(UnreadableEventError, match="does not decode with schema id"):
        values.decode(as_avro[:-4])
    with pytest.raises(UnreadableEventError, match="no schema id"):
        values.decode(b"\x00\x00\x01")
    for not_events in (b"{broken", b"[1, 2]"):
        with pytest.raises(UnreadableEventError):
            values.decode(not_events)


class FakeProducer:
    """Keeps what librdkafka's producer is given; acknowledges nothing by itself."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.records: list[tuple[str, bytes, bytes | None, int]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **kw: Any) -> None:
        self.records.append((topic, value, key, kw["timestamp"]))

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0


class FakeMessage:
    def __init__(self, topic: str, value: bytes) -> None:
        self._topic, self._value = topic, value

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes:
        return self._value


def produce_on_every_path(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[bytes]]:
    """Produce one event through each path of EventProducer; return the producer and the wire JSON given."""
    import confluent_kafka

    from ingestion.producer import EventProducer

    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    events = [Event(id=f"e{i}", ts=1777629600 + i, item=f"#{i}", user="p_1" if i % 2 else None) for i in range(5)]
    wire = [e.to_json() for e in events]
    producer = EventProducer(settings)
    producer.produce(events[0])
    producer.produce_encoded(wire[1], b"#1", events[1].ts_ms)
    producer.produce_many(wire[2:4], [b"#2", b"#3"], [events[2].ts_ms, events[3].ts_ms])
    producer.produce_acked([(wire[4], b"#4", events[4].ts_ms, lambda _delivery: None)])
    return producer, wire


def test_the_producer_transcodes_on_every_path_and_dead_letters_keep_the_json(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, wire = produce_on_every_path(settings_of("avro"), monkeypatch)
    writer = events_writer(settings_of("avro"))
    assert writer is not None
    records = producer._producer.records
    assert [(topic, value[:5]) for topic, value, _k, _t in records] == [(TOPIC, header(writer.schema_id))] * 5
    assert [writer.wire(value) for _topic, value, _k, _t in records] == wire
    assert [ts for *_rest, ts in records] == [ts_millis(Event.model_validate_json(w).ts) for w in wire]

    # the broker refuses one for its content: its dead letter holds the wire JSON, not the Avro bytes
    producer._on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), FakeMessage(TOPIC, records[1][1]))
    producer.poll(0)
    topic, dead, _key, _ts = producer._producer.records[-1]
    assert topic == settings_of("avro").kafka.dlq_topic
    assert json.loads(dead)["raw"] == wire[1].decode()
    assert producer.summary.refused == 1


def test_with_json_the_producer_queues_the_values_as_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_avro, "registry_client", no_registry)
    producer, wire = produce_on_every_path(settings_of("json"), monkeypatch)
    assert [value for _topic, value, _k, _t in producer._producer.records] == wire


def test_the_bridge_transcodes_the_events_of_its_transactions(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    import confluent_kafka

    from ingestion.bridge import Bridge
    from ingestion.validate import Reason, Reject

    class FakeTransactional(FakeProducer):
        def begin_transaction(self) -> None: ...

        def send_offsets_to_transaction(self, *_args: Any) -> None: ...

        def commit_transaction(self, *_args: Any) -> None: ...

    class FakeConsumer:
        def __init__(self, conf: dict[str, Any]) -> None:
            self.conf = conf

        def consumer_group_metadata(self) -> object:
            return object()

    class Source:
        def __init__(self, offset: int) -> None:
            self._offset = offset

        def topic(self) -> str:
            return "clicks"

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return self._offset

    monkeypatch.setattr(confluent_kafka, "Producer", FakeTransactional)
    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    bridge = Bridge(settings_of("avro"), ["clicks"], "json")
    event = Event(id="e1", ts="2026-05-01T10:00:00Z", item="#a")
    reject = Reject(b"junk", Reason.UNDECODABLE, "junk", "clicks", None, datetime.now(UTC), None, 0, 1)
    assert bridge._transact([(Source(0), (event.to_json(), b"#a", event.ts_ms)), (Source(1), reject)], object())
    (ev_topic, ev_value, _k, _t), (dlq_topic, dlq_value, _k2, _t2) = bridge._producer.records
    writer = events_writer(settings_of("avro"))
    assert writer is not None
    assert (ev_topic, writer.wire(ev_value)) == (TOPIC, event.to_json())
    assert dlq_topic == settings_of("avro").kafka.dlq_topic and json.loads(dlq_value)["raw"] == "junk"
