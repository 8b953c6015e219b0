"""Ingestion against the real broker: dead letters with reasons, exactly-once arrival, history, mappings, restarts."""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition

from app.cli import cli
from infra import topics
from infra.security import CONTROL_CHARS
from infra.settings import Settings
from ingestion import files
from ingestion import generator as gen
from ingestion.dlq import DeadLetter, read_dead_letters
from ingestion.generator_config import GeneratorConfig
from ingestion.mapping import ColumnMapping
from ingestion.producer import EventProducer
from ingestion.validate import MAX_RECORD_BYTES
from stack import control
from views.event import Event, ts_millis

READ_TIMEOUT_S = 120


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes
    timestamp: int
    partition: int
    offset: int
    headers: dict[str, bytes]


def read_topic(settings: Settings, topic: str, timeout_s: float = READ_TIMEOUT_S) -> list[Record]:
    """Read every record present in a topic now (up to each partition's high watermark), bounded in time."""
    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        starts = []
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(topic, p, low))
        consumer.assign(starts)
        out: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is not None:
                    continue
                p, o = msg.partition(), msg.offset()
                if p in ends and o < ends[p]:
                    out.append(Record(msg.key(), msg.value(), msg.timestamp()[1], p, o, dict(msg.headers() or [])))
                    if o + 1 >= ends[p]:
                        del ends[p]
        assert not ends, f"timed out reading {topic}: partitions {sorted(ends)} unfinished"
        return out
    finally:
        consumer.close()


@pytest.fixture
def ingest_settings(stack_up: Settings, new_topic: Callable[..., str]) -> Settings:
    """Settings whose events and dead-letter topics are fresh ones, configured like the real pair."""
    events_spec, dlq_spec = topics.topic_specs(stack_up.kafka)
    events = new_topic(partitions=stack_up.kafka.partitions, config=events_spec.config)
    dlq = new_topic(partitions=stack_up.kafka.partitions, config=dlq_spec.config)
    return stack_up.model_copy(
        update={"kafka": stack_up.kafka.model_copy(update={"events_topic": events, "dlq_topic": dlq})}
    )


def event_ids(records: list[Record]) -> list[str]:
    return [json.loads(r.value)["id"] for r in records]


# -- every kind of bad input, between good records -------------------------------------------------------------

FUTURE = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
BAD_LINES: list[tuple[bytes, str]] = [
    (b'{"id": "bad-json", "ts": "2025-11-22T10:00:00Z", "item": "#x"', "malformed_json"),
    (b"[1, 2]", "malformed_json"),
    (b'{"id": "no-item", "ts": "2025-11-22T10:00:00Z"}', "missing_field"),
    (b'{"id": "no-ts", "item": "#x"}', "missing_field"),
    (b'{"id": "typed", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": "fast"}', "invalid_field"),
    (b'{"id": "when", "ts": "around noon", "item": "#x"}', "bad_time"),
    (json.dumps({"id": "future", "ts": FUTURE, "item": "#x"}).encode(), "future_time"),
    (b'{"id": "nan", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": NaN}', "non_finite"),
    (b'{"id": "inf", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": Infinity}', "non_finite"),
    (b'{"id": "long-item", "ts": "2025-11-22T10:00:00Z", "item": "' + b"i" * 1000 + b'"}', "oversize_field"),
    (
        b'{"id": "huge", "ts": "2025-11-22T10:00:00Z", "item": "#x", "p": "' + b"p" * (3 * MAX_RECORD_BYTES) + b'"}',
        "oversize_record",
    ),
    (b'{"id": "latin1", "ts": "2025-11-22T10:00:00Z", "item": "caf\xe9"}', "not_utf8"),
    (b'{"id": "esc", "ts": "2025-11-22T10:00:00Z", "item": "#x\\u001b[2J"}', "control_character"),
    (b'{"id": "csi", "ts": "2025-11-22T10:00:00Z", "item": "#x", "dims": {"c": "\xc2\x9b31m"}}', "control_character"),
    (b'{"id": "raw-esc", "ts": "2025-11-22T10:00:00Z", "item": "#x\x1b]0;pwned\x07"}', "malformed_json"),
    (b'{"id": "empty-dim", "ts": "2025-11-22T10:00:00Z", "item": "#x", "dims": {"origin": ""}}', "invalid_field"),
]


def good_line(i: int) -> bytes:
    return json.dumps({"id": f"good-{i}", "ts": f"2025-11-22T10:{i % 60:02d}:00Z", "item": f"#i{i % 3}"}).encode()


def test_each_kind_of_bad_input_lands_in_the_dlq_and_the_good_records_around_it_arrive(
    ingest_settings: Settings, tmp_path: Path
) -> None:
    lines: list[bytes] = []
    expected_bad: dict[int, tuple[bytes, str]] = {}
    good_ids = []
    for i, (raw, reason) in enumerate(BAD_LINES):
        lines.append(good_line(i))
        good_ids.append(f"good-{i}")
        lines.append(raw)
        expected_bad[len(lines)] = (raw, reason)
    lines.append(good_line(999))
    good_ids.append("good-999")
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    kafka = ingest_settings.kafka

    result = CliRunner().invoke(
        cli, ["ingest", "file", str(path), "--topic", kafka.events_topic, "--dlq-topic", kafka.dlq_topic]
    )
    assert result.exit_code == 0, result.output
    assert f"sent      {len(good_ids):>12,} events" in result.output
    assert f"invalid   {len(BAD_LINES):>12,}" in result.output

    assert sorted(event_ids(read_topic(ingest_settings, kafka.events_topic))) == sorted(good_ids)
    dead = [DeadLetter.decode(r.value) for r in read_topic(ingest_settings, kafka.dlq_topic)]
    assert len(dead) == len(BAD_LINES)
    for letter in dead:
        assert letter.line is not None and letter.line in expected_bad, letter
        raw, reason = expected_bad[letter.line]
        assert (letter.reason, letter.source) == (reason, str(path)), letter.detail
        if reason == "oversize_record":
            assert raw.startswith(letter.raw) and letter.raw_size == len(raw)
        else:
            assert letter.raw == raw
        assert abs((datetime.now(UTC) - letter.rejected_at).total_seconds()) < 300

    shown = CliRunner().invoke(
        cli, ["ingest", "dlq", "--topic", kafka.dlq_topic, "--raw-out", str(tmp_path / "raw.jsonl")]
    )
    assert shown.exit_code == 0, shown.output
    assert f"{len(BAD_LINES)} dead-letter record(s)" in shown.output
    for reason, count in Counter(r for _, r in BAD_LINES).items():
        assert f"  {reason:<20} {count:>10,}" in shown.output
    assert len((tmp_path / "raw.jsonl").read_bytes().splitlines()) == len(BAD_LINES)

    # The records hold ESC, BEL and a C1 CSI: every way of showing them escapes them for the terminal.
    for args in ([], ["--json"]):
        # color=True: click would otherwise strip ANSI sequences itself, and the test could not fail.
        shown = CliRunner().invoke(
            cli, ["ingest", "dlq", "--topic", kafka.dlq_topic, "--samples", "20", *args], color=True
        )
        assert shown.exit_code == 0, shown.output
        assert CONTROL_CHARS.search(shown.output.replace("\n", "")) is None, shown.output
        assert "pwned" in shown.output and "csi" in shown.output  # the records are shown, escaped
    assert (
        "\\x1b]0;pwned\\x07"
        in CliRunner()
        .invoke(
            cli,
            ["ingest", "dlq", "--topic", kafka.dlq_topic, "--samples", "20", "--reason", "malformed_json"],
            color=True,
        )
        .output
    )


def test_bad_csv_rows_are_dead_lettered_with_their_lines(ingest_settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "clicks.csv"
    path.write_bytes(
        b"event_id,when,page,uid\n"
        b"c1,1763805600000,/a,u1\n"
        b"c2,1763805600000,/b\n"  # a column short
        b'c3,1763805601000,"/multi\nline",u3\n'
        b"c4,someday,/c,u4\n"
        b"c5,1763805602000,/d\xff,u5\n"
        b"c6,1763805603000,/e,u6\n"
    )
    with EventProducer(ingest_settings) as producer:
        stats = files.replay(
            ingest_settings,
            producer,
            str(path),
            mapping=ColumnMapping.parse(["id=event_id", "ts=when", "item=page", "user=uid"]),
        )
    assert stats.records == 6
    events = read_topic(ingest_settings, ingest_settings.kafka.events_topic)
    assert sorted(event_ids(events)) == ["c1", "c6"]
    assert {json.loads(r.value)["item"] for r in events} == {"/a", "/e"}
    letters = sorted(read_dead_letters(ingest_settings), key=lambda x: x.line or 0)
    assert [(x.line, x.reason) for x in letters] == [
        (3, "malformed_csv"),
        (4, "control_character"),  # a quoted line break inside an item: no event text holds control characters
        (6, "bad_time"),
        (7, "not_utf8"),
    ]
    assert letters[3].raw == b"c5,1763805602000,/d\xff,u5"


# -- the producer's guarantees -------------------------------------------------------------------------------


def test_records_are_keyed_and_stamped_with_event_time(ingest_settings: Settings) -> None:
    when = datetime(2025, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)
    events = [Event(id=f"k{i}", ts=when + timedelta(seconds=i), item=f"#k{i % 2}", user="u") for i in range(10)]
    with EventProducer(ingest_settings) as producer:
        for event in events:
            producer.produce(event)
    assert producer.summary.sent == 10 and producer.summary.ok
    got = read_topic(ingest_settings, ingest_settings.kafka.events_topic)
    by_id = {json.loads(r.value)["id"]: r for r in got}
    pseudonym = json.loads(got[0].value)["user"]  # privacy.pseudonymise: one user, one pseudonym
    assert pseudonym.startswith("p_")
    for event in events:
        record = by_id[event.id]
        assert record.timestamp == event.ts_ms
        assert record.key == event.item.encode()
        assert record.value == event.model_copy(update={"user": pseudonym}).to_json()
    partitions = {by_id[e.id].partition for e in events if e.item == "#k0"}
    assert len(partitions) == 1  # one item, one partition


@pytest.mark.parametrize("success_reports", [True, False])  # without them, the counts come from what was queued
def test_events_the_broker_refuses_are_rerouted_to_the_dlq(
    ingest_settings: Settings, new_topic: Callable[..., str], success_reports: bool
) -> None:
    import random

    small = new_topic(partitions=1, config={"max.message.bytes": "2048"})
    scoped = ingest_settings.model_copy(
        update={"kafka": ingest_settings.kafka.model_copy(update={"events_topic": small})}
    )
    rnd = random.Random(5)
    noise = {
        f"d{i}": "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(200)) for i in range(16)
    }
    when = datetime(2025, 11, 22, tzinfo=UTC)
    big = Event(id="big", ts=when, item="#big", dims=noise)  # ~3.5 KB of incompressible text
    with EventProducer(scoped, config={"linger.ms": 0}, success_reports=success_reports) as producer:
        producer.produce(Event(id="before", ts=when, item="#a"))
        producer.poll(0)
        assert producer._producer.flush(30) == 0
        producer.produce(big)
        assert producer._producer.flush(30) == 0
        producer.produce(Event(id="after", ts=when, item="#a"))
        if not success_reports:  # an ack per record needs a report per record: refused before anything is queued
            with pytest.raises(ValueError, match="success_reports"):
                producer.produce_encoded(b"{}", None, 0, ack=lambda _delivery: None)
    summary = producer.summary
    assert (summary.sent, summary.refused, summary.failed) == (2, 1, 0), summary.errors
    assert (summary.invalid, summary.dlq_sent) == ({"broker_rejected": 1}, 1)
    assert sorted(event_ids(read_topic(scoped, small))) == ["after", "before"]
    (letter,) = read_dead_letters(scoped)
    assert letter.reason == "broker_rejected" and letter.raw == big.to_json()


def test_a_missing_topic_fails_fast_with_a_clear_error(ingest_settings: Settings) -> None:
    from infra.errors import TrendsError

    scoped = ingest_settings.model_copy(
        update={"kafka": ingest_settings.kafka.model_copy(update={"events_topic": f"missing.{uuid.uuid4().hex}"})}
    )
    producer = EventProducer(scoped)
    with pytest.raises(TrendsError, match="do not exist"):
        producer.check_topics()
    producer.close()


@pytest.mark.faults  # slow (make test-faults): kept out of make test to hold it under 25 minutes
def test_a_broker_restart_mid_run_loses_and_duplicates_nothing(ingest_settings: Settings) -> None:
    count = 200_000
    settings = ingest_settings.model_copy(
        update={
            "ingest": ingest_settings.ingest.model_copy(
                update={"queue_max_messages": 20_000, "message_timeout_ms": 240_000}
            )
        }
    )
    config = GeneratorConfig(
        seed=11, count=count, rate=None, start=datetime.now(UTC) - timedelta(days=1), event_rate=1000.0
    )
    stream = gen.SyntheticStream(config)
    producer = EventProducer(settings)
    failure: list[BaseException] = []

    def produce_all() -> None:
        try:
            gen.run(
                stream,
                lambda c: producer.produce_many(c.values, c.keys, c.ts_ms),
                rate=8_000,  # ~25 s, so the restart falls in the middle
                wait=producer.poll,
            )
            producer.close(timeout_s=300)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread by the assertion below
            failure.append(exc)

    worker = threading.Thread(target=produce_all, name="producer", daemon=True)
    worker.start()
    restarted_at_sent = -1
    try:
        deadline = time.monotonic() + 60
        while producer.summary.sent < 30_000 and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.1)
        restarted_at_sent = producer.summary.sent
        assert 0 < restarted_at_sent < count, "the run should be under way when the broker stops"
        assert control.down(settings, ["kafka"]) == ["kafka"]
        time.sleep(3)  # the producer keeps queueing (and then waits for room) while the broker is away
    finally:
        control.up(settings, ["kafka"])  # always leave the shared broker running and ready
    worker.join(timeout=400)
    assert not worker.is_alive(), "the producer did not finish"
    assert not failure, failure
    summary = producer.summary
    assert (summary.sent, summary.failed, summary.undelivered) == (count, 0, 0), summary.lines()
    assert summary.queue_full_waits > 0  # back-pressure was applied instead of a BufferError crash

    ids = event_ids(read_topic(settings, settings.kafka.events_topic))
    duplicates = [i for i, n in Counter(ids).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} duplicated ids, e.g. {duplicates[:5]}"
    expected = {f"g11-{stream.start_ms}-{i}" for i in range(count)}
    assert set(ids) == expected, f"{len(expected - set(ids))} lost"


def test_year_old_events_stay_in_the_topic_and_are_found_by_time(ingest_settings: Settings) -> None:
    start = (datetime.now(UTC) - timedelta(days=365)).replace(microsecond=0)
    config = GeneratorConfig(
        seed=3, rate=None, start=start, end=start + timedelta(hours=1), event_rate=2.0, key_field="item"
    )
    config.check(datetime.now(UTC), timedelta(minutes=5))
    stream = gen.SyntheticStream(config)
    with EventProducer(ingest_settings) as producer:
        gen.run(stream, lambda c: producer.produce_many(c.values, c.keys, c.ts_ms), rate=None, wait=producer.poll)
    assert producer.summary.sent == 7200

    topic = ingest_settings.kafka.events_topic
    records = read_topic(ingest_settings, topic)
    assert len(records) == 7200
    for record in records:
        assert record.timestamp == ts_millis(datetime.fromisoformat(json.loads(record.value)["ts"]))
    middle = start + timedelta(minutes=30)
    expected_after = {json.loads(r.value)["id"] for r in records if r.timestamp >= ts_millis(middle)}
    assert len(expected_after) == 3600

    consumer = Consumer({**ingest_settings.kafka.client_config(), "group.id": f"t-{uuid.uuid4().hex[:8]}"})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        asked = [TopicPartition(topic, p, ts_millis(middle)) for p in partitions]
        found = {tp.partition: tp.offset for tp in consumer.offsets_for_times(asked, timeout=30)}
    finally:
        consumer.close()
    from_offsets = {
        json.loads(r.value)["id"] for r in records if found[r.partition] >= 0 and r.offset >= found[r.partition]
    }
    assert from_offsets == expected_after
    for r in records:  # the offset found is the first one at or after the time, per partition
        if found[r.partition] >= 0 and r.offset == found[r.partition]:
            assert r.timestamp >= ts_millis(middle)


def test_csv_and_jsonl_replays_with_a_mapping_give_the_same_events(
    ingest_settings: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    rows = []
    for i in range(500):
        ms = 1763805600000 + i * 997
        rows.append(
            {
                "event_id": f"r{i}" if i % 5 else "",  # every fifth row has no id: derived from the content
                "epoch_ms": ms,
                "page": f"/p{i % 17}",
                "uid": f"u{i % 23}" if i % 7 else "",
                "latency": round(i * 1.25, 2) if i % 3 else "",
                "cc": ["DE", "FR", "US"][i % 3],
            }
        )
    csv_path = tmp_path / "rows.csv.gz"
    with gzip.open(csv_path, "wt", newline="") as fh:
        fh.write("event_id,epoch_ms,page,uid,latency,cc\n")
        for row in rows:
            fh.write(",".join(str(v) for v in row.values()) + "\n")
    jsonl_path = tmp_path / "rows.jsonl"
    with jsonl_path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps({k: v for k, v in row.items() if v != ""}) + "\n")
    mapping = ColumnMapping.parse(
        ["id=event_id", "ts=epoch_ms", "item=page", "user=uid", "value=latency"],
        ["country=cc"],
        time_format="epoch_ms",
    )
    second_topic = new_topic(
        partitions=ingest_settings.kafka.partitions, config=topics.topic_specs(ingest_settings.kafka)[0].config
    )
    values = {}
    for path, topic in ((csv_path, ingest_settings.kafka.events_topic), (jsonl_path, second_topic)):
        scoped = ingest_settings.model_copy(
            update={"kafka": ingest_settings.kafka.model_copy(update={"events_topic": topic})}
        )
        with EventProducer(scoped) as producer:
            files.replay(scoped, producer, str(path), mapping=mapping)
        assert producer.summary.sent == 500 and producer.summary.invalid_total == 0
        values[path.name] = sorted(r.value for r in read_topic(scoped, topic))
    assert values["rows.csv.gz"] == values["rows.jsonl"]
    assert len(set(values["rows.jsonl"])) == 500


def test_stdin_and_the_speed_up_factor(ingest_settings: Settings) -> None:
    kafka = ingest_settings.kafka
    lines = b"".join(
        json.dumps({"id": f"s{i}", "ts": 1763805600000 + i * 100, "item": "#s"}).encode() + b"\n" for i in range(21)
    )  # 2 s of event time
    t0 = time.monotonic()
    result = CliRunner().invoke(
        cli,
        ["ingest", "file", "-", "--speed", "2", "--topic", kafka.events_topic, "--dlq-topic", kafka.dlq_topic],
        input=lines,
    )
    paced = time.monotonic() - t0
    assert result.exit_code == 0, result.output
    assert paced >= 0.9, paced  # 2 s of events at 2x: 1 s
    assert sorted(event_ids(read_topic(ingest_settings, kafka.events_topic))) == sorted(f"s{i}" for i in range(21))


def test_generate_to_kafka_from_the_cli_with_ground_truth(ingest_settings: Settings, tmp_path: Path) -> None:
    kafka = ingest_settings.kafka
    truth = tmp_path / "truth.json"
    result = CliRunner().invoke(
        cli,
        [
            "ingest", "generate", "--fast", "-n", "5000", "--burst", "@20:5:0:1", "--truth", str(truth),
            "--topic", kafka.events_topic, "--dlq-topic", kafka.dlq_topic,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "sent             5,000 events" in result.output
    records = read_topic(ingest_settings, kafka.events_topic)
    assert len(records) == 5000
    planted = json.loads(truth.read_text())["bursts"][0]
    hits = sum(1 for r in records if json.loads(r.value)["item"] == "#t20")
    assert hits == planted["events_in_window"]


def test_ctrl_c_stops_reading_flushes_and_summarizes(ingest_settings: Settings) -> None:
    import os
    import signal
    import subprocess
    import sys

    kafka = ingest_settings.kafka
    trends = Path(sys.executable).parent / "trends"
    env = {**os.environ, "TRENDS_KAFKA__EVENTS_TOPIC": kafka.events_topic, "TRENDS_KAFKA__DLQ_TOPIC": kafka.dlq_topic}
    proc = subprocess.Popen(
        # unbounded: only Ctrl-C ends it; few users, so that creating their pseudonyms (LWTs) is done quickly
        [str(trends), "ingest", "generate", "--rate", "3000", "--users", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        # interrupt once it is well under way: over 1,000 events acknowledged (a loaded machine takes longer)
        probe = Consumer({**kafka.client_config(), "group.id": uuid.uuid4().hex})
        try:
            parts = [TopicPartition(kafka.events_topic, p) for p in range(kafka.partitions)]
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and proc.poll() is None:
                if sum(probe.get_watermark_offsets(tp, timeout=10)[1] for tp in parts) > 1000:
                    break
                time.sleep(0.5)
        finally:
            probe.close()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    match = re.search(r"sent\s+([\d,]+) events", out)
    assert match, out
    sent = int(match[1].replace(",", ""))
    assert sent > 1000
    assert len(read_topic(ingest_settings, kafka.events_topic)) == sent  # everything queued was flushed


def test_a_replay_in_worker_processes_keeps_every_record_its_order_per_key_and_every_dead_letter(
    ingest_settings: Settings, tmp_path: Path
) -> None:
    """``--workers 2`` over several batches: good records arrive once, in file order per key; bad ones dead-letter."""
    lines: list[bytes] = []
    expected_bad: dict[int, str] = {}
    good = 3 * files.BATCH_RECORDS
    for i in range(good):
        lines.append(good_line(i))
        if i % 150 == 0:
            raw, reason = BAD_LINES[(i // 150) % len(BAD_LINES)]
            lines.append(raw)
            expected_bad[len(lines)] = reason
    path = tmp_path / "many.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    kafka = ingest_settings.kafka

    result = CliRunner().invoke(
        cli,
        [
            "ingest",
            "file",
            str(path),
            "--workers",
            "2",
            "--no-progress",
            "--topic",
            kafka.events_topic,
            "--dlq-topic",
            kafka.dlq_topic,
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"sent      {good:>12,} events" in result.output

    records = read_topic(ingest_settings, kafka.events_topic)
    ids = event_ids(records)
    assert sorted(ids) == sorted(f"good-{i}" for i in range(good))
    by_key: dict[tuple[int, bytes | None], list[int]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key.setdefault((r.partition, r.key), []).append(int(json.loads(r.value)["id"].split("-")[1]))
    assert len(by_key) == 3  # keyed by item: #i0, #i1, #i2
    assert all(seq == sorted(seq) for seq in by_key.values())
    dead = [DeadLetter.decode(r.value) for r in read_topic(ingest_settings, kafka.dlq_topic)]
    assert sorted((d.line, d.reason) for d in dead) == sorted(expected_bad.items())
