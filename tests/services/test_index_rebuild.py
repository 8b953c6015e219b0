"""`trends batch index --rebuild`: drop the event-time index and build it again from Kafka.

Real Kafka and Cassandra: history of three hours is produced out of time order into a fresh topic and indexed.
Then the index is damaged the way a lost write or a buggy old version would (an hour's spans gone, a total wrong):
the incremental pass cannot see it (its checkpoint says done), the rebuild restores exactly the first index. With
the first offsets of a partition removed by Kafka, a rebuild is refused unless --force.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from ingestion.producer import EventProducer
from views.event import Event
from views.indexing import indexer
from views.store.index import IndexStore, OffsetSpan

pytestmark = pytest.mark.install  # make test-install (installs and upgrades)

H0 = datetime(2025, 7, 6, 3, tzinfo=UTC)
HOURS = [H0 + timedelta(hours=i) for i in range(3)]


def _snapshot(settings: Settings) -> tuple[dict[datetime, list[OffsetSpan]], dict[datetime, tuple[int, int]]]:
    topic = settings.kafka.events_topic
    with session(settings) as sess:
        store = IndexStore(settings, sess)
        spans = {h: sorted(ss, key=lambda s: (s.partition, s.first)) for h, ss in store.spans(topic, HOURS).items()}
        return spans, store.hour_totals(topic, {H0.date()})


def _rebuild(settings: Settings, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": settings.kafka.events_topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "trends"), "batch", "index", "--rebuild", *flags],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_rebuild_restores_a_damaged_index_and_refuses_removed_offsets(
    keyspace_settings: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    settings = keyspace_settings.model_copy(
        update={"kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic})}
    )
    migrations.migrate(settings)
    with EventProducer(settings) as producer:
        for i in range(600):  # the hours interleaved: 2, 0, 1, 2, 0, 1, ...
            hour = HOURS[(i + 2) % 3]
            producer.produce(Event(id=f"r{i}", ts=hour + timedelta(seconds=6 * (i // 3)), item=f"#x{i % 7}"))
    assert producer.summary.ok
    assert indexer.run_index(settings).records == 600
    spans, totals = _snapshot(settings)
    assert {h: r for h, (r, _late) in totals.items()} == dict.fromkeys(HOURS, 200)

    with session(settings) as sess:  # damage: the middle hour's spans vanish, the first hour's total is wrong
        sess.execute(f"DELETE FROM {table(settings, 'batch_index_spans')} WHERE topic = %s AND day = %s "
                     "AND hour = %s", (topic, H0.date(), HOURS[1]))  # fmt: skip
        sess.execute(f"UPDATE {table(settings, 'batch_index_hours')} SET records = 5 WHERE topic = %s AND day = %s "
                     "AND hour = %s", (topic, H0.date(), HOURS[0]))  # fmt: skip
    assert indexer.run_index(settings).records == 0  # the incremental pass sees nothing to do
    damaged_spans, damaged_totals = _snapshot(settings)
    assert damaged_spans[HOURS[1]] == [] and damaged_totals[HOURS[0]][0] == 5

    done = _rebuild(settings)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"dropped the index of {topic}: 1 day(s) of spans; rebuilt from Kafka" in done.stdout
    assert "indexed 600 new records of 2 partitions" in done.stdout
    assert _snapshot(settings) == (spans, totals)

    admin = AdminClient({**settings.kafka.client_config(), "log_level": 3})
    for future in admin.delete_records([TopicPartition(topic, 0, 10)]).values():
        future.result(timeout=30)
    refused = _rebuild(settings)
    assert refused.returncode == 1
    assert "no longer holds the first offsets" in refused.stderr and "--force" in refused.stderr
    assert _snapshot(settings) == (spans, totals)  # refused before anything was dropped
    forced = _rebuild(settings, "--force")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "indexed 590 new records" in forced.stdout and "10 records LOST before indexing" in forced.stdout
