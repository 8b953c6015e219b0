"""The Kafka bridge against the real broker and a real schema registry (Apicurio Registry 3.3.3): exact events out.

- Avro with two writer schema versions interleaved (a field added with a default, a field removed), Protobuf with
  a nested message type, JSON with a mapping: exactly the expected events, and the bad records (unknown schema
  id, a payload that does not match, a value that is not framed) in the dead letters with their source topic,
  partition and offset.
- Three SIGKILLs of `trends ingest kafka` at random points while records arrive, restarts, then the events topic
  read committed holds every source record once: no loss, no duplicate (Kafka's own transactions_test checks the
  same way).
- The registry stopped (SIGSTOP) for 30 s mid-run: a bridge with a short registry wait stops with an error and
  commits nothing past the record; one started meanwhile waits, and resumes when the registry is back; in the end
  every event is there once.

Each test has its own topics and consumer group; the stack's registry is started on demand (`trends stack up
registry`), the outage test runs a private one on a port of its own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from infra.settings import Settings
from ingestion.bridge import Bridge
from ingestion.dlq import DeadLetter
from ingestion.mapping import ColumnMapping
from ingestion.wire import AvroEncoder, compile_proto, frame
from stack.services.registry import Registry
from tests.helpers import free_port
from views.event import Event

pytestmark = pytest.mark.sources

TRENDS = Path(sys.executable).parent / "trends"
NOW = datetime.now(UTC).replace(microsecond=0)

CLICK_V1 = {
    "type": "record",
    "name": "Click",
    "namespace": "shop",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "page", "type": "string"},
        {"name": "uid", "type": "string"},
        {"name": "referrer", "type": "string"},
    ],
}
# v2: `latency` added with a default, `referrer` removed
CLICK_V2 = {
    **CLICK_V1,
    "fields": [*CLICK_V1["fields"][:4], {"name": "latency", "type": ["null", "double"], "default": None}],
}
AVRO_MAPPING = ["id=event_id", "item=page", "user=uid", "value=latency"]

CLICK_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Heartbeat { string host = 1; }
message Click {
  message Actor { string id = 1; string country = 2; }
  string event_id = 1;
  google.protobuf.Timestamp at = 2;
  string page = 3;
  Actor actor = 4;
  double latency = 5;
}
"""


def scoped(settings: Settings, events: str, dlq: str, group: str, **registry: Any) -> Settings:
    """Return settings that write to the test's own topics, as its own consumer group."""
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"events_topic": events, "dlq_topic": dlq}),
            "bridge": settings.bridge.model_copy(update={"group_id": group}),
            "registry": settings.registry.model_copy(update=registry),
        }
    )


def env_of(settings: Settings, events: str, dlq: str, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": events,
        "TRENDS_KAFKA__DLQ_TOPIC": dlq,
        "TRENDS_REGISTRY__URL": settings.registry.url,
        **more,
    }


def produce(settings: Settings, topic: str, values: list[bytes | None]) -> list[tuple[int, int]]:
    """Produce values in order (keyed by their index); return each one's (partition, offset)."""
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "linger.ms": 5})
    where: list[tuple[int, int]] = [(-1, -1)] * len(values)

    def report(i: int) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            where[i] = (msg.partition(), msg.offset())

        return done

    for i, value in enumerate(values):
        producer.produce(topic, value, key=str(i).encode(), on_delivery=report(i))
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return where


def read_committed(settings: Settings, topic: str, *, isolation: str = "read_committed") -> list[Any]:
    """Return every record of a topic up to its end, as a ``read_committed`` reader sees it (no bridge running)."""
    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": f"bridge-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        todo = set(meta.partitions)
        out: list[Any] = []
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                continue
            out.append(msg)
        assert not todo, f"partitions {sorted(todo)} of {topic} not read to their end"
        return out
    finally:
        consumer.close()


def ids_of(records: list[Any]) -> list[str]:
    return [json.loads(r.value())["id"] for r in records]


def event_json(**fields: Any) -> dict[str, Any]:
    return json.loads(Event(**fields).to_json())


def assert_same_events(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Assert the events are the expected ones, users replaced by pseudonyms: one per user, never the raw id."""
    by_id = {e["id"]: e for e in got}
    assert len(got) == len(by_id) == len(expected)
    assert sorted(by_id) == sorted(e["id"] for e in expected)
    pseudonyms: dict[str, str] = {}
    for want in expected:
        have = by_id[want["id"]]
        assert {k: v for k, v in have.items() if k != "user"} == {k: v for k, v in want.items() if k != "user"}
        assert ("user" in have) == ("user" in want)
        if "user" in want:
            assert have["user"] != want["user"]
            assert pseudonyms.setdefault(want["user"], have["user"]) == have["user"]
    assert len(set(pseudonyms.values())) == len(pseudonyms)


def run_bridge(settings: Settings, sources: list[str], fmt: str, mapping: list[str]) -> Any:
    bridge = Bridge(settings, sources, fmt, ColumnMapping.parse(mapping))  # type: ignore[arg-type]
    try:
        return bridge.run(idle_exit_s=4)
    finally:
        bridge.close()


def test_avro_versions_protobuf_and_json_become_exact_events(registry: Settings, new_topic: Any) -> None:
    events, dlq = new_topic(), new_topic()
    client = SchemaRegistryClient(registry.registry.client_config())
    expected: list[dict[str, Any]] = []

    # -- Avro: v1 and v2 of one subject, interleaved; then an unknown id, a truncated payload, a plain value
    avro_topic = new_topic(3)
    v1, v2 = AvroEncoder(client, avro_topic, CLICK_V1), AvroEncoder(client, avro_topic, CLICK_V2)
    assert v1.schema_id != v2.schema_id
    values: list[bytes | None] = []
    for i in range(300):
        ts = NOW - timedelta(seconds=i)
        rec: dict[str, Any] = {"event_id": f"a{i}", "ts": ts, "page": f"/p{i % 7}", "uid": f"u{i % 11}"}
        if i % 2:
            values.append(v1({**rec, "referrer": "r"}))
            expected.append(event_json(id=f"a{i}", ts=ts, item=f"/p{i % 7}", user=f"u{i % 11}"))
        else:
            values.append(v2({**rec, "latency": i / 4}))
            expected.append(event_json(id=f"a{i}", ts=ts, item=f"/p{i % 7}", user=f"u{i % 11}", value=i / 4))
    good = v1.payload({"event_id": "x", "ts": NOW, "page": "/x", "uid": "u", "referrer": "r"})
    bad = [frame(987_654, good), frame(v1.schema_id, good[:-4]), b'{"event_id": "plain json"}']
    where = produce(registry, avro_topic, [*values, *bad])
    stats = run_bridge(scoped(registry, events, dlq, f"g-{avro_topic}"), [avro_topic], "avro", AVRO_MAPPING)
    assert stats.records == 303

    # -- Protobuf: the second message type of the file (message indexes [1]), a nested message, a Timestamp
    proto_topic = new_topic(2)
    pid = client.register_schema(f"{proto_topic}-value", Schema(CLICK_PROTO, "PROTOBUF"))
    from google.protobuf.message_factory import GetMessageClass

    click_class = GetMessageClass(compile_proto(CLICK_PROTO, pid).message_types_by_name["Click"])
    proto_values: list[bytes | None] = []
    for i in range(200):
        ts = NOW - timedelta(milliseconds=1500 * i)
        click = click_class(event_id=f"p{i}", page=f"/q{i % 5}", latency=float(i))
        click.at.FromDatetime(ts)
        click.actor.id = f"v{i % 9}"
        click.actor.country = "FR" if i % 2 else "DE"
        proto_values.append(frame(pid, click.SerializeToString(), (1,)))
        user, country = f"v{i % 9}", "FR" if i % 2 else "DE"
        fields = {"id": f"p{i}", "ts": ts, "item": f"/q{i % 5}", "user": user, "dims": {"country": country}}
        expected.append(event_json(**fields, value=float(i)) if i else event_json(**fields))  # 0.0 is proto3's unset
    produce(registry, proto_topic, proto_values)
    proto_mapping = ["id=event_id", "ts=at", "item=page", "user=actor.id", "value=latency"]
    proto_settings = scoped(registry, events, dlq, f"g-{proto_topic}")
    bridge = Bridge(
        proto_settings, [proto_topic], "protobuf", ColumnMapping.parse(proto_mapping, ["country=actor.country"])
    )
    try:
        assert bridge.run(idle_exit_s=4).records == 200
    finally:
        bridge.close()

    # -- JSON with a mapping (epoch milliseconds), from two topics at once
    json_topics = [new_topic(2), new_topic(1)]
    for n, topic in enumerate(json_topics):
        rows = []
        for i in range(100):
            ts = NOW - timedelta(minutes=i)
            rows.append(
                json.dumps(
                    {"eid": f"j{n}-{i}", "when": int(ts.timestamp() * 1000), "sku": f"s{i % 3}", "who": f"w{i}"}
                ).encode()
            )
            expected.append(event_json(id=f"j{n}-{i}", ts=ts, item=f"s{i % 3}", user=f"w{i}"))
        produce(registry, topic, rows)
    json_mapping = ["id=eid", "ts=when", "item=sku", "user=who"]
    stats = run_bridge(scoped(registry, events, dlq, f"g-{json_topics[0]}"), json_topics, "json", json_mapping)
    assert stats.records == 200

    assert_same_events([json.loads(r.value()) for r in read_committed(registry, events)], expected)

    letters = [DeadLetter.decode(r.value()) for r in read_committed(registry, dlq)]
    by_offset = {(d.source_partition, d.source_offset): d for d in letters}
    assert len(letters) == 3
    unknown, short, plain = (by_offset[where[300 + k]] for k in range(3))
    assert (unknown.reason, unknown.source, unknown.raw) == ("unknown_schema", avro_topic, bad[0])
    assert "987654" in unknown.detail
    assert (short.reason, plain.reason) == ("undecodable", "undecodable")
    assert "does not match schema id" in short.detail
    assert "not in the Confluent wire format" in plain.detail


def avro_source(registry: Settings, topic: str) -> Callable[[int, int], list[bytes | None]]:
    """Return a maker of Avro records ``a{start}`` … ``a{stop-1}`` of the topic's subject (v1 and v2 alternating)."""
    client = SchemaRegistryClient(registry.registry.client_config())
    v1, v2 = AvroEncoder(client, topic, CLICK_V1), AvroEncoder(client, topic, CLICK_V2)

    def make(start: int, stop: int) -> list[bytes | None]:
        out: list[bytes | None] = []
        for i in range(start, stop):
            rec = {"event_id": f"a{i}", "ts": NOW - timedelta(milliseconds=i), "page": f"/p{i % 50}", "uid": f"u{i}"}
            if i % 2:
                out.append(v1({**rec, "referrer": "r"}))
            else:
                out.append(v2({**rec, "latency": 1.0}))
        return out

    return make


def start_cli(env: dict[str, str], log: Path, source: str, group: str, *extra: str) -> subprocess.Popen[bytes]:
    args = [str(TRENDS), "ingest", "kafka", "--from", source, "--format", "avro", "--group", group, "--no-progress"]
    args += [*(f"--map={m}" for m in AVRO_MAPPING), *extra]
    with log.open("ab") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def log_ends(admin: AdminClient, topic: str, partitions: int) -> tuple[int, int]:
    """Return the topic's end and its last stable offset, summed over partitions (apart: a transaction is open)."""
    ends = []
    for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        asked = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
        futures = admin.list_offsets(asked, isolation_level=level, request_timeout=10)
        ends.append(sum(f.result().offset for f in futures.values()))
    return ends[0], ends[1]


def open_transaction(admin: AdminClient, topic: str, partitions: int) -> bool:
    """Tell whether records of a transaction not yet committed are in the topic."""
    end, stable = log_ends(admin, topic, partitions)
    return end > stable


def test_three_sigkills_neither_lose_nor_duplicate_an_event(registry: Settings, new_topic: Any, tmp_path: Path) -> None:
    """Kill the bridge three times while it writes, each time inside a transaction, then compare the topics."""
    source, events, dlq = new_topic(4), new_topic(4), new_topic()
    make = avro_source(registry, source)
    admin = AdminClient(registry.kafka.client_config())
    env = env_of(registry, events, dlq)
    group, log = f"g-{source}", tmp_path / "bridge.log"
    rng = random.Random(7)
    round_records, rounds = 30_000, 3
    kills: list[int] = []  # events committed when each kill came
    for k in range(rounds):
        produce(registry, source, make(k * round_records, (k + 1) * round_records))  # a backlog to work on
        before = log_ends(admin, events, 4)[1]
        proc = start_cli(env, log, source, group)
        deadline = time.monotonic() + 120
        while log_ends(admin, events, 4)[1] == before:  # it committed something since its start
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(rng.uniform(0.0, 0.2))
        while not open_transaction(admin, events, 4):  # kill it while one of its transactions is open
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        kills.append(len(read_committed(registry, events)))
    total = rounds * round_records
    proc = start_cli(env, log, source, group, "--idle-exit", "8")
    assert proc.wait(600) == 0, log.read_text()[-3000:]

    committed = ids_of(read_committed(registry, events))
    assert len(committed) == total, f"{len(committed)} events for {total} records (kills: {kills})"
    assert set(committed) == {f"a{i}" for i in range(total)}
    assert read_committed(registry, dlq) == []
    # the killed transactions' records are in the log, aborted: a read_uncommitted reader would count them twice
    written = len(read_committed(registry, events, isolation="read_uncommitted"))
    print(f"events committed {len(committed)}; written, aborted ones included: {written}; kills: {kills}")
    assert written > total


def test_a_registry_outage_stops_or_waits_and_loses_nothing(stack_up: Settings, new_topic: Any, tmp_path: Path) -> None:
    port = free_port()
    own = stack_up.model_copy(
        update={
            "data_dir": tmp_path / "stack",
            "registry": stack_up.registry.model_copy(update={"url": f"http://127.0.0.1:{port}/apis/ccompat/v7"}),
        }
    )
    reg = Registry(own)
    pid = reg.start("")
    try:
        reg.wait_ready(pid)
        source, events, dlq = new_topic(2), new_topic(2), new_topic()
        make = avro_source(own, source)
        first = make(0, 3000)
        unknown = [frame(424_242, b"\x02x"), frame(424_243, b"\x02y")]
        produce(own, source, first[::2])  # v2 records only: the bridge has not needed v1 (id1) yet
        env = env_of(own, events, dlq, TRENDS_REGISTRY__TIMEOUT_S="2")
        log = tmp_path / "bridge.log"
        proc = start_cli(env, log, source, f"g-{source}", "--idle-exit", "600")
        deadline = time.monotonic() + 120
        while len(read_committed(own, events)) < 1500:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]

        # the registry stops answering for 30 s; records of a schema id not fetched yet arrive
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            where = produce(own, source, [*first[1::2], *unknown])
            short = start_cli(env | {"TRENDS_REGISTRY__MAX_WAIT_S": "6"}, log, source, f"g-{source}")
            assert short.wait(120) == 1, log.read_text()[-3000:]
            assert "did not answer" in log.read_text()
            assert len(read_committed(own, events)) == 1500  # it stopped without committing past the record
            patient = start_cli(
                env | {"TRENDS_REGISTRY__MAX_WAIT_S": "300"}, log, source, f"g-{source}", "--idle-exit", "10"
            )
            time.sleep(max(0.0, 30 - (time.monotonic() - stopped_at)))
            assert patient.poll() is None, log.read_text()[-3000:]
        finally:
            os.kill(pid, signal.SIGCONT)
        assert patient.wait(300) == 0, log.read_text()[-3000:]
    finally:
        reg.stop()

    committed = ids_of(read_committed(own, events))
    assert sorted(committed) == sorted(f"a{i}" for i in range(3000))
    letters = [DeadLetter.decode(r.value()) for r in read_committed(own, dlq)]
    assert sorted((d.reason, d.source, d.source_partition, d.source_offset) for d in letters) == sorted(
        ("unknown_schema", source, p, o) for p, o in where[-2:]
    )


def test_spark_reads_committed_records_across_aborted_ones_and_markers(
    stack_up: Settings, new_topic: Any, spark: Any
) -> None:
    """The batch layer's read of an offset range (failOnDataLoss) over a log the bridge wrote in transactions.

    Markers and aborted records take offsets: a range holds fewer records than its width, and may end inside an
    aborted transaction. Spark's Kafka source, reading committed (infra.spark.kafka_options), must return exactly
    the committed records and not call the holes a loss.
    """
    from infra.spark import kafka_options

    topic = new_topic(1)
    producer = Producer({**stack_up.kafka.client_config(), "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    committed: list[str] = []
    for txn in range(6):
        producer.begin_transaction()
        ids = [f"t{txn}-{i}" for i in range(5)]
        for id_ in ids:
            producer.produce(topic, Event(id=id_, ts=NOW, item="x").to_json())
        producer.flush(30)  # in the log before the abort (else the abort drops them unsent)
        if txn % 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += ids
    end = Consumer({**stack_up.kafka.client_config(), "group.id": "x"}).get_watermark_offsets(TopicPartition(topic, 0))[
        1
    ]
    assert end == 6 * 6  # 5 records and a marker per transaction

    def read(start: int, stop: int) -> list[str]:
        frame_ = (
            spark.read.format("kafka")
            .options(**kafka_options(stack_up.kafka))
            .option("assign", json.dumps({topic: [0]}))
            .option("startingOffsets", json.dumps({topic: {"0": start}}))
            .option("endingOffsets", json.dumps({topic: {"0": stop}}))
            .option("failOnDataLoss", "true")
            .load()
        )
        return sorted(json.loads(r.value)["id"] for r in frame_.select("value").collect())

    assert read(0, end) == sorted(committed)
    assert read(0, 8) == committed[:5]  # ends inside the aborted second transaction
    assert read(8, 20) == committed[5:10]  # starts inside it


def test_the_bridge_service_runs_supervised_and_comes_back_after_a_kill(
    registry: Settings, new_topic: Any, tmp_path: Path
) -> None:
    """`trends stack up bridge`: the bridge under the supervisor, restarted after a SIGKILL, exact at the end."""
    import psutil

    from stack.services.pipeline import BridgeService

    source, events, dlq = new_topic(2), new_topic(2), new_topic()
    own = registry.model_copy(
        update={
            "data_dir": tmp_path / "stack",
            "kafka": registry.kafka.model_copy(update={"events_topic": events, "dlq_topic": dlq}),
            "bridge": registry.bridge.model_copy(
                update={"sources": [source], "format": "avro", "mapping": AVRO_MAPPING, "group_id": f"g-{source}"}
            ),
            "stack": registry.stack.model_copy(update={"speed_restart_backoff_s": 1.0}),
            # the stack's key: pseudonyms must be those of every other producer of the stack
            "privacy": registry.privacy.model_copy(update={"subject_key_file": registry.subject_key_path}),
        }
    )
    make = avro_source(own, source)
    service = BridgeService(own)
    service.wait_ready(service.start(""))
    try:

        def committed_after(expected: int) -> list[str]:
            deadline = time.monotonic() + 180
            while True:
                ids = ids_of(read_committed(own, events))
                if len(ids) >= expected or time.monotonic() > deadline:
                    return ids
                time.sleep(1)

        produce(own, source, make(0, 2000))
        assert len(committed_after(2000)) == 2000, service.stdout_file.read_text()[-3000:]
        supervisor = psutil.Process(service.pid())
        (child,) = supervisor.children()
        child.kill()
        produce(own, source, make(2000, 4000))
        ids = committed_after(4000)
        assert sorted(ids) == sorted(f"a{i}" for i in range(4000)), service.stdout_file.read_text()[-3000:]
        state = service.supervisor_state()
        assert state is not None
        assert state.restarts >= 1
    finally:
        service.stop()
