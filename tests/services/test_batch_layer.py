"""The batch layer against real Kafka, Spark and Cassandra: exact recompute of closed hours from offsets."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from batch_layer import job, offsets
from batch_layer.hours import hours_between
from batch_layer.publish import BatchStore
from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from tests.helpers import produce_events, speed_drain
from views import sketches
from views.event import Event
from views.indexing import indexer

pytestmark = pytest.mark.spark

H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)  # a year ago: historical events
HOUR = timedelta(hours=1)


@dataclass
class BatchEnv:
    settings: Settings

    def produce(self, events: list[Event], partition: int | None = None) -> None:
        produce_events(self.settings, events, partition=partition)

    def hour_rows(self, hour: datetime, slice_: str = "*") -> Any:
        with session(self.settings) as sess:
            current = BatchStore(self.settings, sess).pointers.runs(hour.date()).get(hour)
            rows = sess.execute(
                f"SELECT run_id, events, users_hll FROM {table(self.settings, 'batch_hours')} "
                "WHERE slice = %s AND day = %s AND hour = %s",
                (slice_, hour.date(), hour),
            )
            return current, list(rows)

    def runs(self, hour: datetime) -> list[Any]:
        with session(self.settings) as sess:
            return list(sess.execute(f"SELECT * FROM {table(self.settings, 'batch_runs')} WHERE hour = %s", (hour,)))


@pytest.fixture
def batch_env(keyspace_settings: Settings, new_topic: Callable[..., str]) -> Iterator[BatchEnv]:
    migrations.migrate(keyspace_settings)
    topic = new_topic(partitions=3)
    settings = keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "batch": keyspace_settings.batch.model_copy(update={"lateness_s": 600, "grace_s": 600}),
            "views": keyspace_settings.views.model_copy(update={"slice_dims": ["origin"]}),
        }
    )
    yield BatchEnv(settings)


def events_for(hour: datetime, n: int, tag: str) -> list[Event]:
    return [
        Event(
            id=f"{tag}-{hour:%H}-{i}",
            ts=hour + timedelta(seconds=(i * 37) % 3600),
            item=f"#i{i % 5}",
            user=f"u{i % 40}",
            value=float(i % 17),
            dims={"origin": "JFK" if i % 3 else "LAX"},
        )
        for i in range(n)
    ]


def test_recompute_hours_with_lineage_watermark_and_idempotent_rerun(batch_env: BatchEnv, spark: Any) -> None:
    env = batch_env
    sizes = {H0: 500, H0 + HOUR: 300, H0 + 2 * HOUR: 400}
    all_events = []
    for hour, n in sizes.items():
        batch = events_for(hour, n, "e")
        env.produce(batch)
        env.produce(batch[::50])  # 2% re-sent shortly after: duplicates to drop
        all_events += batch
    env.produce(events_for(H0 + 4 * HOUR, 3, "closer"))  # moves every partition's time past the end + grace

    results = job.run(env.settings, H0, H0 + 3 * HOUR, spark=spark)
    assert [r.hour for r in results] == list(sizes)
    for r in results:
        assert r.counts["kept"] == sizes[r.hour], r.line()
    assert sum(r.counts["deduped"] for r in results) == sum(len(range(0, n, 50)) for n in sizes.values())
    assert results[-1].watermark == H0 + 3 * HOUR

    for hour, n in sizes.items():
        current, rows = env.hour_rows(hour)
        (row,) = [r for r in rows if r.run_id == current]
        assert row.events == n
        users = sketches.users([row.users_hll], num_std_dev=3)
        assert users.lower <= 40 <= users.upper
        jfk = [r for r in env.hour_rows(hour, "origin=JFK")[1] if r.run_id == current]
        assert jfk[0].events == sum(1 for i in range(n) if i % 3)
        (run,) = env.runs(hour)
        assert run.status == "completed" and run.rows_kept == n
        spans = json.loads(run.offsets)  # per partition, the [start, end) spans holding the hour's records
        assert sum(end - start for ranges in spans.values() for start, end in ranges) == run.rows_read
        assert run.rows_indexed == run.rows_read == n + len(range(0, n, 50))

    with session(env.settings) as sess:
        low, mark, pinned = BatchStore(env.settings, sess).pointers.watermark()
        day = sess.execute(
            f"SELECT events, hours FROM {table(env.settings, 'batch_days')} "
            "WHERE slice = '*' AND month = %s AND day = %s",
            (H0.strftime("%Y-%m"), H0.date()),
        ).one()
    assert (low, mark, pinned) == (H0, H0 + 3 * HOUR, None)
    assert (day.events, day.hours) == (1200, 3)

    # A rerun replaces the hour as one new version: same numbers, new pointer, nothing counted twice.
    before, _ = env.hour_rows(H0 + HOUR)
    (again,) = job.run(env.settings, H0 + HOUR, H0 + 2 * HOUR, spark=spark)
    assert again.counts == results[1].counts
    after, rows = env.hour_rows(H0 + HOUR)
    assert after != before and after == uuid.UUID(again.run_id)
    assert [r.events for r in rows if r.run_id == after] == [300]
    assert len({r.run_id for r in rows}) <= env.settings.batch.keep_versions
    assert [r.status for r in env.runs(H0 + HOUR)] == ["completed", "completed"]


def speed_events(env: BatchEnv, hour: datetime) -> int:
    with session(env.settings) as sess:
        rows = sess.execute(
            f"SELECT bucket_start, events FROM {table(env.settings, 'speed_minutes')} "
            "WHERE query = %s AND slice = '*' AND day = %s",
            (env.settings.speed.query_name, hour.date()),
        )
        return sum(r.events for r in rows if hour <= r.bucket_start.replace(tzinfo=UTC) < hour + HOUR)


def test_batch_corrects_a_late_event_and_a_duplicate_the_speed_layer_dropped(
    batch_env: BatchEnv, spark: Any, tmp_path: Path
) -> None:
    env = batch_env
    env.produce(events_for(H0, 100, "a"), partition=0)
    env.produce(events_for(H0 + 2 * HOUR, 5, "later"), partition=0)  # the stream moves on by two hours
    speed_drain(env.settings, tmp_path)  # speed watermark: H0 + 2h - 10 min
    late = Event(id="late-1", ts=H0 + timedelta(minutes=30), item="#late", user="u-late")
    env.produce([late, late], partition=1)  # 90 minutes behind the stream, and re-sent: the speed layer drops both
    out = speed_drain(env.settings, tmp_path)
    assert "2 dropped as too late" in out, out[-2000:]
    assert speed_events(env, H0) == 100

    # Partition 2: a record just past the interval's end, then an event of the interval: counted, flagged late.
    env.produce([Event(id="after", ts=H0 + HOUR + timedelta(minutes=1), item="#x")], partition=2)
    env.produce([Event(id="slightly-late", ts=H0 + timedelta(minutes=50), item="#x")], partition=2)
    for p in (1, 2):
        env.produce(events_for(H0 + 3 * HOUR, 2, f"closer{p}"), partition=p)

    (result,) = job.run(env.settings, H0, H0 + HOUR, spark=spark)
    assert result.counts["kept"] == 102, result.line()  # 100 + the late event once + the slightly late one
    assert result.counts["deduped"] == 1  # the re-sent copy
    assert result.counts["late"] == 1
    current, rows = env.hour_rows(H0)
    assert [r.events for r in rows if r.run_id == current] == [102]


def test_refuses_an_open_interval_unless_forced(batch_env: BatchEnv, spark: Any) -> None:
    env = batch_env
    env.produce(events_for(H0, 50, "open"))
    env.produce([Event(id="edge", ts=H0 + HOUR + timedelta(minutes=5), item="#x")])  # < end + 10 min grace
    with pytest.raises(offsets.IntervalNotClosedError, match="not closed"):
        job.run(env.settings, H0, H0 + HOUR, spark=spark)
    assert env.runs(H0) == []
    (forced,) = job.run(env.settings, H0, H0 + HOUR, force=True, spark=spark)
    assert forced.counts["kept"] == 50
    assert env.runs(H0)[0].forced is True


def test_refuses_offsets_that_retention_removed(batch_env: BatchEnv, spark: Any) -> None:
    env = batch_env
    env.produce(events_for(H0, 60, "gone"), partition=0)
    env.produce(events_for(H0 + 3 * HOUR, 3, "closer"), partition=0)
    indexer.run_index(env.settings)  # the hour's records are indexed, then retention removes some of them
    admin = AdminClient(env.settings.kafka.client_config())
    topic = env.settings.kafka.events_topic
    # What retention does to old segments: the partition's first offsets are gone.
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result(timeout=30)
    with pytest.raises(offsets.DataLossError, match="retention removed"):
        job.run(env.settings, H0, H0 + HOUR, spark=spark)
    assert env.runs(H0) == []


def test_rejects_intervals_that_are_not_whole_hours() -> None:
    with pytest.raises(Exception, match="not a whole hour"):
        list(hours_between(H0 + timedelta(minutes=5), H0 + HOUR))
    with pytest.raises(Exception, match="reversed"):
        list(hours_between(H0 + HOUR, H0))
    assert Counter(hours_between(H0, H0 + 3 * HOUR)) == Counter([H0, H0 + HOUR, H0 + 2 * HOUR])
