"""One record from the far future, written straight to Kafka around ingestion, must not silence the speed layer
(its watermark would jump to 2030 and drop every real event as late) nor close hours early for the batch layer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from batch_layer import horizon, job, offsets
from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from tests.helpers import speed_drain
from views.event import Event
from views.indexing import indexer

pytestmark = [pytest.mark.spark, pytest.mark.faults]  # make test-faults (slow: TTLs, restarts, a browser)

HOUR = timedelta(hours=1)


def produce(settings: Settings, records: list[tuple[bytes, int | None]], partitions: int = 2) -> None:
    """Produce (value, record timestamp) pairs; ``None``: the producer's clock, as any plain producer's."""
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    for i, (value, ts) in enumerate(records):
        extra = {"timestamp": ts} if ts is not None else {}
        producer.produce(settings.kafka.events_topic, value=value, partition=i % partitions, **extra)
    assert producer.flush(30) == 0


def events(tag: str, n: int) -> list[tuple[bytes, int | None]]:
    """Events of the last minute, as ingestion writes them (record timestamp = event time)."""
    now = datetime.now(UTC)
    out: list[tuple[bytes, int | None]] = []
    for i in range(n):
        e = Event(id=f"{tag}-{i}", ts=now - timedelta(seconds=i % 60), item=f"#{tag}", user=f"u{i}")
        out.append((e.to_json(), e.ts_ms))
    return out


def speed_events(settings: Settings) -> tuple[int, Any]:
    now = datetime.now(UTC)
    with session(settings) as sess:
        rows = [
            r
            for d in {(now - HOUR).date(), now.date(), (now + HOUR).date()}
            for r in sess.execute(
                f"SELECT events FROM {table(settings, 'speed_minutes')} WHERE query = %s AND slice = '*' AND day = %s",
                (settings.speed.query_name, d),
            )
        ]
        progress = sess.execute(
            f"SELECT newest_event_ts FROM {table(settings, 'speed_progress')} WHERE query = %s",
            (settings.speed.query_name,),
        ).one()
    return sum(r.events for r in rows), progress.newest_event_ts


def test_a_far_future_record_neither_stalls_the_speed_layer_nor_closes_hours(
    keyspace_settings: Settings, new_topic: Callable[..., str], tmp_path: Path, spark: Any
) -> None:
    migrations.migrate(keyspace_settings)
    settings = keyspace_settings.model_copy(
        update={"kafka": keyspace_settings.kafka.model_copy(update={"events_topic": new_topic(partitions=2)})}
    )
    rogue = json.dumps({"v": 1, "id": "rogue", "ts": "2030-01-01T00:00:00Z", "item": "#rogue", "user": "x"}).encode()
    produce(settings, [*events("a", 200), (rogue, None)])
    out = speed_drain(settings, tmp_path)
    assert "1 beyond now + skew" in out, out[-2000:]
    produce(settings, events("b", 300))  # the next micro-batch: behind a 2030 watermark every one would be late
    out = speed_drain(settings, tmp_path)
    assert "0 dropped as too late" in out, out[-2000:]
    counted, newest = speed_events(settings)
    assert counted == 500
    assert newest.replace(tzinfo=UTC) <= datetime.now(UTC)  # freshness never runs ahead of the wall clock

    # The batch layer: the record's timestamp is now, its JSON says 2030 — reported as outside its hour, never
    # aggregated, and no hour closes before its time.
    indexer.run_index(settings)
    hz = horizon.horizon(settings)
    assert hz.closed_at is not None and hz.closed_at <= datetime.now(UTC)
    this_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    assert not offsets.is_closed(hz, this_hour + HOUR, settings)
    results = job.run(settings, hours=[this_hour - HOUR, this_hour], force=True, spark=spark)
    assert sum(r.counts["kept"] for r in results) == 500
    assert sum(r.counts["outside"] for r in results) == 1
