"""The batch layer on real history (real Kafka, Spark, Cassandra): a sparse year-old stream with empty nights and
empty days replayed into a topic that already holds this week's events, late data, and a killed indexer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from batch_layer import job, tasks
from batch_layer.publish import BatchStore
from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from infra.settings_env import to_env
from serving.api import create_app
from tests.helpers import Truth, drop_keyspace, history_config, produce_events, produce_history
from views import sketches
from views.buckets import as_date, month_key
from views.event import Event
from views.indexing import indexer
from views.store.index import IndexStore
from views.store.pointers import fingerprint_of

pytestmark = pytest.mark.spark

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
START = datetime(2025, 11, 3, tzinfo=UTC)  # a year ago, a Monday
DAYS = 14


@pytest.fixture
def history_settings(keyspace_settings: Settings, new_topic: Callable[..., str]) -> Iterator[Settings]:
    migrations.migrate(keyspace_settings)
    topic = new_topic(partitions=3)
    yield keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "batch": keyspace_settings.batch.model_copy(
                update={"lateness_s": 600, "grace_s": 600, "chunk_hours": 24 * 4, "index_span_gap": 500}
            ),
            "views": keyspace_settings.views.model_copy(update={"slice_dims": ["country"]}),
        }
    )


def day_rows(settings: Settings, slice_: str = "*") -> dict[date, Any]:
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        out = {}
        for month in sorted({month_key((START + i * DAY).date()) for i in range(DAYS)}):
            for r in sess.execute(
                f"SELECT * FROM {table(settings, 'batch_days')} WHERE slice = %s AND month = %s", (slice_, month)
            ):
                day = as_date(r.day)
                if r.hour_runs == fingerprint_of(store.pointers.runs(day)):
                    out[day] = r
        return out


@pytest.mark.faults  # slow (make test-faults): kept out of make test to hold it under 25 minutes
def test_history_replayed_behind_live_events_is_computed_exactly_hour_by_hour(
    history_settings: Settings, spark: Any
) -> None:
    settings = history_settings
    now = datetime.now(UTC)
    # This week's live events are in the topic first: offset-by-timestamp would plan every old hour as empty.
    live = [Event(id=f"live-{i}", ts=now - timedelta(minutes=90) + timedelta(seconds=20 * i), item=f"#l{i % 7}",
                  user=f"lu{i % 11}") for i in range(240)]  # fmt: skip
    produce_events(settings, live, partitions=3)
    truth = Truth()
    produced = produce_history(settings, history_config(START, DAYS), truth)
    hours = [START + i * HOUR for i in range(DAYS * 24)]
    empty_hours = [h for h in hours if not truth.count[h]]
    gap_days = {d for d in (START.date() + timedelta(days=i) for i in range(DAYS)) if not truth.day_count(d)}
    assert produced > 3000 and len(gap_days) >= 2 and len(empty_hours) > len(hours) / 3  # sparse, as asked

    results = job.run(settings, START, START + DAYS * HOUR * 24, spark=spark)

    assert [r.hour for r in results] == hours  # every hour completed, the empty ones included
    assert {r.hour for r in results if r.counts["read"] == 0} == set(empty_hours)
    for r in results:
        assert r.counts["kept"] == truth.count[r.hour], r.line()
        assert r.counts["deduped"] == truth.dups[r.hour], r.line()
        assert r.counts["read"] == truth.count[r.hour] + truth.dups[r.hour], r.line()
    assert sum(truth.dups.values()) > 20
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        low, mark, _ = store.pointers.watermark()
        assert (low, mark) == (START, START + DAYS * DAY)  # the watermark passed every empty night and day
        for d in range(DAYS):
            assert len(store.pointers.runs(START.date() + timedelta(days=d))) == 24

    # Per day: counts exact; users, quantiles and top items within their bounds.
    rows = day_rows(settings)
    assert set(rows) == {START.date() + timedelta(days=i) for i in range(DAYS)} - gap_days
    for day, row in rows.items():
        assert row.events == truth.day_count(day), day
        users = sketches.users([row.users_hll], num_std_dev=3)
        assert users.lower <= len(truth.users[day]) <= users.upper, (day, users, len(truth.users[day]))
        values = truth.values[day]
        for rank, q in zip((0.5, 0.9), sketches.quantiles([row.values_kll], [0.5, 0.9]), strict=True):
            assert q is not None
            true_rank = sum(1 for v in values if v <= q) / len(values)
            assert abs(true_rank - rank) <= 2 * sketches.kll_rank_error() + 1 / len(values), (day, rank, true_rank)
        top, _max_error = sketches.top_items([row.items_fi], 5)
        assert top
        for t in top:
            assert t.lower <= truth.items[day][t.item] <= t.upper, (day, t)

    # The API answers the same, every hour of the range served by the batch layer, no gap.
    client = TestClient(create_app(settings))
    with client:
        week = (START + 2 * DAY, START + 9 * DAY)
        got = client.get("/api/v1/count", params={"start": week[0].isoformat(), "end": week[1].isoformat()}).json()
        assert got["events"] == sum(n for h, n in truth.count.items() if week[0] <= h < week[1])
        assert got["provenance"]["gaps"] == []
        assert {s["layer"] for s in got["provenance"]["spans"]} == {"batch"}
        night = START + 3 * DAY + 2 * HOUR
        got = client.get("/api/v1/count", params={"start": night.isoformat(), "end": (night + HOUR).isoformat()}).json()
        assert (got["events"], got["provenance"]["gaps"]) == (0, [])  # an empty night: 0 events, not a gap

        # Late data: events of a completed hour arrive now; the hour turns stale until it is recomputed.
        late_hour = START + 9 * HOUR + 1 * DAY
        assert truth.count[late_hour] > 0
        late = [Event(id=f"late-{i}", ts=late_hour + timedelta(minutes=7 * i), item="#late", user=f"late{i}")
                for i in range(7)]  # fmt: skip
        produce_events(settings, late)
        indexer.run_index(settings)
        before = truth.count[late_hour] + truth.dups[late_hour]
        assert tasks.stale_hours(settings) == {late_hour: (before + len(late), before)}
        window = {"start": late_hour.isoformat(), "end": (late_hour + HOUR).isoformat()}
        got = client.get("/api/v1/count", params=window).json()
        assert got["events"] == truth.count[late_hour]  # served as computed, and said to be stale
        assert [(datetime.fromisoformat(x["hour"]), x["records_since"]) for x in got["provenance"]["stale"]] == [
            (late_hour, len(late))
        ]
        status = client.get("/api/v1/status").json()
        assert [(datetime.fromisoformat(x["hour"]), x["records_since"]) for x in status["stale_hours"]] == [
            (late_hour, len(late))
        ]
        (again,) = job.run(settings, hours=[late_hour], force=True, spark=spark)
        assert again.counts["kept"] == truth.count[late_hour] + len(late)
        assert tasks.stale_hours(settings) == {}
        got = client.get("/api/v1/count", params=window).json()
        assert (got["events"], got["provenance"]["stale"]) == (truth.count[late_hour] + len(late), [])


def index_rows(settings: Settings) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """Return the index's spans and hour totals of the settings' topic."""
    topic = settings.kafka.events_topic
    with session(settings) as sess:
        spans = {
            (r.hour, r.partition, r.first_offset, r.last_offset, r.records, r.late)
            for r in sess.execute(f"SELECT * FROM {table(settings, 'batch_index_spans')}")
            if r.topic == topic
        }
        totals = {
            (r.hour, r.records, r.late)
            for r in sess.execute(f"SELECT * FROM {table(settings, 'batch_index_hours')}")
            if r.topic == topic
        }
    return spans, totals


@pytest.mark.faults  # slow (make test-faults): kept out of make test to hold it under 25 minutes
def test_indexer_killed_mid_run_resumes_to_the_same_index(
    history_settings: Settings, stack_up: Settings, tmp_path: Path
) -> None:
    settings = history_settings.model_copy(
        update={"batch": history_settings.batch.model_copy(update={"index_flush_records": 1500})}
    )
    truth = Truth()
    # interleaved: live events, then history, then more live and late events of old hours
    produce_events(settings, [Event(id=f"a{i}", ts=datetime.now(UTC) - timedelta(minutes=i % 50), item="#a")
                              for i in range(2000)], partitions=3)  # fmt: skip
    produce_history(settings, history_config(START, 10, rate=0.03), truth)
    produce_events(settings, [Event(id=f"b{i}", ts=START + timedelta(hours=10 + (i % 5) * 24, seconds=i), item="#b")
                              for i in range(500)])  # fmt: skip

    env = {**os.environ, **to_env(settings), "TRENDS_LOG_LEVEL": "INFO"}
    trends = str(Path(sys.executable).parent / "trends")
    proc = subprocess.Popen([trends, "batch", "index"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    killed_at = None
    with session(settings) as sess:
        idx = IndexStore(settings, sess)
        while time.monotonic() < deadline and proc.poll() is None:
            states = idx.states(settings.kafka.events_topic)
            if any(s.next_offset for s in states.values()):  # at least one checkpoint written: mid-run
                proc.send_signal(signal.SIGKILL)
                killed_at = {p: s.next_offset for p, s in states.items()}
                break
            time.sleep(0.02)
    proc.wait(timeout=30)
    assert killed_at is not None, "the indexer finished before it could be killed: make the topic bigger"
    assert proc.returncode == -signal.SIGKILL
    rerun = subprocess.run(
        [trends, "batch", "index"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr

    # The reference: the same topic indexed in one uninterrupted pass into a keyspace of its own.
    reference = settings.model_copy(
        update={"cassandra": settings.cassandra.model_copy(update={"keyspace": f"test_{uuid.uuid4().hex[:10]}"})}
    )
    migrations.migrate(reference)
    try:
        indexer.run_index(reference)
        assert index_rows(settings) == index_rows(reference)
    finally:
        drop_keyspace(stack_up, reference.cassandra.keyspace)
    # and the index counts every record produced, hour by hour
    _spans, totals = index_rows(settings)
    per_hour = Counter({h.replace(tzinfo=UTC): n for h, n, _late in totals})
    for hour, n in truth.count.items():
        assert per_hour[hour] >= n + truth.dups[hour]  # the late "b" events come on top in some hours
    assert sum(per_hour.values()) == 2000 + 500 + sum(truth.count.values()) + sum(truth.dups.values())
