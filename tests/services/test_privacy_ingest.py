"""No raw user id reaches Kafka: `trends ingest generate` and `trends ingest file` into private topics.

Two producer processes start at once on the same users (a race on creating their pseudonyms); then the topic is
read back — keys and values hold pseudonyms only, one per user, as many as the input had users — and the
broker's segment files of the topic are searched for the raw ids as text. A control run with
``privacy.pseudonymise=false`` shows the same search finding them. Marked ``privacy`` (``make test-privacy``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from infra import migrations
from infra.privacy.subjects import SubjectStore, hour_of
from infra.settings import Settings
from ingestion.generator import SyntheticStream
from ingestion.generator_config import GeneratorConfig
from tests.helpers import iso

pytestmark = [pytest.mark.privacy]

VENV = Path(sys.executable).parent.parent
PSEUDONYM = re.compile(r"^p_[A-Za-z0-9_-]{16}$")


@pytest.fixture
def private(keyspace_settings: Settings, new_topic: Callable[..., str], tmp_path: Path) -> Iterator[Settings]:
    """Settings on a fresh keyspace (migrated), a private events and dead-letter topic, and a fresh subject key."""
    migrations.migrate(keyspace_settings)
    key = tmp_path / "subject.key"
    key.write_text(secrets.token_hex(32))
    kafka = keyspace_settings.kafka.model_copy(update={"events_topic": new_topic(2), "dlq_topic": new_topic(1)})
    privacy = keyspace_settings.privacy.model_copy(update={"subject_key_file": key})
    yield keyspace_settings.model_copy(update={"kafka": kafka, "privacy": privacy})


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_PRIVACY__SUBJECT_KEY_FILE": str(settings.subject_key_path),
        # uncompressed batches: the segment files then hold the records' text, so the search below can find an id
        "TRENDS_INGEST__COMPRESSION_TYPE": "none",
        **extra,
    }


def _run_at_once(settings: Settings, commands: list[list[str]], **env: str) -> list[str]:
    """Start the commands at the same time and wait for all; return their outputs; fail if any failed."""
    procs = [
        subprocess.Popen(
            [str(VENV / "bin" / "trends"), *cmd],
            env=_env(settings, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for cmd in commands
    ]
    outputs = []
    for proc, cmd in zip(procs, commands, strict=True):
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"trends {' '.join(cmd)}:\n{out.decode()[-4000:]}"
        outputs.append(out.decode())
    return outputs


def _counts(output: str) -> dict[str, int]:
    """Return the pseudonym counts a run printed (created, found, raced)."""
    match = re.search(r"pseudonyms ([\d,]+) created, ([\d,]+) found, ([\d,]+) taken from a racing producer", output)
    assert match, output[-2000:]
    created, found, raced = (int(g.replace(",", "")) for g in match.groups())
    return {"created": created, "found": found, "raced": raced}


def _read_topic(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes]]:
    """Return every record (key, value) of a topic, up to its end offsets."""
    consumer = Consumer({**settings.kafka.client_config(), "group.id": uuid.uuid4().hex, "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[tuple[bytes | None, bytes]] = []
        seen = dict.fromkeys(parts, 0)
        while any(seen[p] < ends[p] for p in parts):
            msg = consumer.poll(5)
            assert msg is not None, f"the topic ended early: {seen} of {ends}"
            assert msg.error() is None, msg.error()
            seen[msg.partition()] = msg.offset() + 1
            out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def _segments_text(settings: Settings, topic: str) -> bytes:
    """Return the bytes of the topic's log segment files in the local stack's Kafka data dir."""
    folders = list((settings.data_dir / "kafka" / "data").glob(f"{topic}-*"))
    assert folders, f"no partition folders of {topic} under {settings.data_dir / 'kafka' / 'data'}"
    return b"".join(f.read_bytes() for folder in folders for f in sorted(folder.glob("*.log")))


def _generated(config: GeneratorConfig) -> dict[str, tuple[str, int]]:
    """Return event id -> (raw user, event time ms) of a generator run."""
    out = {}
    for chunk in SyntheticStream(config).chunks():
        for value, ts in zip(chunk.values, chunk.ts_ms, strict=True):
            event = json.loads(value)
            out[event["id"]] = (event["user"], ts)
    return out


def test_generator_processes_racing_on_the_same_users_put_only_pseudonyms_on_the_topic(private: Settings) -> None:
    topic = private.kafka.events_topic
    start = (datetime.now(UTC) - timedelta(hours=8)).replace(minute=0, second=0, microsecond=0)
    # 40,000 events of 20,000 users each: both processes keep meeting new users for seconds, at the same time
    n, users = 40_000, 20_000
    common = ["-n", str(n), "--users", str(users), "--start", iso(start), "--event-rate", "2", "--key-field", "user"]
    runs = [["ingest", "generate", *common, "--seed", str(seed), "--topic", topic] for seed in (1, 2)]
    runs = [[*r, "--dlq-topic", private.kafka.dlq_topic] for r in runs]
    counts = [_counts(out) for out in _run_at_once(private, runs)]

    raw: dict[str, tuple[str, int]] = {}
    for seed in (1, 2):
        config = GeneratorConfig(seed=seed, count=n, users=users, start=start, event_rate=2, rate=None)
        raw.update(_generated(config))
    records = _read_topic(private, topic)
    assert len(records) == len(raw) == 2 * n
    pseudonym_of: dict[str, set[str]] = {}
    for key, value in records:
        event = json.loads(value)
        assert PSEUDONYM.match(event["user"]), event["user"]
        assert key == event["user"].encode()
        user, _ts = raw[event["id"]]
        pseudonym_of.setdefault(user, set()).add(event["user"])
    assert all(len(p) == 1 for p in pseudonym_of.values()), "a user got two pseudonyms"
    distinct = {next(iter(p)) for p in pseudonym_of.values()}
    assert len(distinct) == len({u for u, _ in raw.values()})  # distinct users unchanged
    # the two really raced: some pseudonyms were created by one and taken by the other from its lost LWT
    assert sum(c["created"] for c in counts) == len(distinct)
    assert sum(c["raced"] for c in counts) > 0, counts

    # the store knows every hour of every user's events, without reading the log
    with SubjectStore(private) as store:
        for user in list(pseudonym_of)[:40]:
            hours = {hour_of(datetime.fromtimestamp(ts / 1000, UTC)) for u, ts in raw.values() if u == user}
            assert set(store.hours(user)) == hours
            assert store.lookup(user) == next(iter(pseudonym_of[user]))

    segments = _segments_text(private, topic)
    assert b'"user":"p_' in segments  # the search sees the records' text
    assert not re.search(rb'"user":"u\d+"', segments)


def _people_file(path: Path) -> tuple[int, set[str]]:
    """Write a JSONL file of 4,500 events by 250 people (some names in both Unicode forms); return its users."""
    lines, users = [], set()
    for i in range(4500):
        person = f"person-{i % 250}@example.org"
        if i % 250 < 10:  # the same person, written composed or decomposed
            person = unicodedata.normalize("NFD" if i % 2 else "NFC", f"zo\u00eb-{i % 250}@example.org")
        users.add(unicodedata.normalize("NFC", person))
        ts = datetime(2025, 6, 1, tzinfo=UTC) + timedelta(seconds=7 * i)
        record: dict[str, Any] = {"ts": iso(ts), "item": f"#i{i % 17}", "user": person, "value": i % 100}
        if i % 2:
            record["id"] = f"file-{i}"
        lines.append(json.dumps(record, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines), users


def test_file_replays_racing_with_parallel_workers_put_only_pseudonyms_on_the_topic(
    private: Settings, tmp_path: Path
) -> None:
    topic = private.kafka.events_topic
    source = tmp_path / "people.jsonl"
    count, users = _people_file(source)
    replay = ["ingest", "file", str(source), "--workers", "2", "--key-field", "user", "--no-progress"]
    replay += ["--topic", topic, "--dlq-topic", private.kafka.dlq_topic]
    outputs = _run_at_once(private, [replay, replay], TRENDS_LOG_LEVEL="DEBUG")
    assert not any("example.org" in out for out in outputs), "a raw id in the output or the log of a replay"

    records = _read_topic(private, topic)
    assert len(records) == 2 * count
    ids, pseudonyms = set(), set()
    for key, value in records:
        assert b"example.org" not in value and (key is None or b"example.org" not in key)
        event = json.loads(value)
        assert PSEUDONYM.match(event["user"]) and key == event["user"].encode()
        ids.add(event["id"])
        pseudonyms.add(event["user"])
    # both processes gave each record the same pseudonym, so the same content-derived id: one id per record
    assert len(ids) == count
    assert len(pseudonyms) == len(users)  # 250 people, composed and decomposed names counted once
    assert b"example.org" not in _segments_text(private, topic)
    assert _read_topic(private, private.kafka.dlq_topic) == []


def test_the_search_finds_raw_ids_when_pseudonymisation_is_off(private: Settings, tmp_path: Path) -> None:
    """The control: the same replay with the setting off leaves the raw ids in the topic and its segments."""
    source = tmp_path / "people.jsonl"
    count, _users = _people_file(source)
    topic = private.kafka.events_topic
    replay = ["ingest", "file", str(source), "--workers", "2", "--no-progress", "--topic", topic]
    _run_at_once(private, [[*replay, "--dlq-topic", private.kafka.dlq_topic]], TRENDS_PRIVACY__PSEUDONYMISE="false")
    records = _read_topic(private, topic)
    assert len(records) == count
    assert all(b"example.org" in value for _key, value in records)
    assert b"example.org" in _segments_text(private, topic)


def test_init_applies_the_dead_letters_retention_bound_to_an_existing_topic(
    stack_up: Settings, new_topic: Callable[..., str]
) -> None:
    """A dead-letter topic made before the bound keeps raw records 90 days: `--apply-topic-config` bounds it."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from infra.topics import topic_specs

    events_spec, dlq_spec = topic_specs(stack_up.kafka, stack_up.privacy)
    events = new_topic(stack_up.kafka.partitions, events_spec.config)
    dlq = new_topic(stack_up.kafka.partitions, {"retention.ms": str(90 * 86_400_000)})
    env = {**os.environ, "TRENDS_KAFKA__EVENTS_TOPIC": events, "TRENDS_KAFKA__DLQ_TOPIC": dlq}
    proc = subprocess.run(
        [str(VENV / "bin" / "trends"), "admin", "init", "--only", "kafka", "--apply-topic-config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"changed {dlq} retention.ms: {90 * 86_400_000} -> {dlq_spec.config['retention.ms']}" in proc.stdout
    admin = AdminClient({**stack_up.kafka.client_config(), "log_level": 3})
    resource = ConfigResource(ResourceType.TOPIC, dlq)
    configs = next(iter(admin.describe_configs([resource]).values())).result(timeout=30)
    assert configs["retention.ms"].value == dlq_spec.config["retention.ms"]
    assert configs["segment.ms"].value == dlq_spec.config["segment.ms"]
    assert int(configs["retention.ms"].value) + int(configs["segment.ms"].value) < 30 * 86_400_000
