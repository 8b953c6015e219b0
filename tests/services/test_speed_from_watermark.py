"""A new speed checkpoint started from the batch watermark: no gap above it, exact, and no recount of history.

Hours of history are produced into a private topic (two partitions), with a block of a later hour's records
produced in the middle of the log (the log is not in time order); the batch layer computes the first hours and
sets the watermark; more records arrive after its index pass (the index is behind). Then ``trends speed run
--from-watermark`` starts on a fresh checkpoint. The start offsets are checked against the topic itself (a
consumer finds, per partition, the first offset of a record at or above the watermark's hour), the records the
job read against the topic's size, and every minute from the first hour to the last event against the events
produced, through the serving layer's merge: the batch view below the watermark, the speed view above it, no gap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from batch_layer import job
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from serving import console, queries, window
from serving.reader import ViewReader
from tests.helpers import Truth, history_config, produce_events, produce_history
from views.aggregation import GLOBAL_SLICE
from views.buckets import HOUR, MINUTE, floor
from views.event import Event
from views.store.speed import SpeedRows

pytestmark = [pytest.mark.spark, pytest.mark.faults]  # make test-faults: a lost checkpoint's recovery

H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)
W = H0 + 3 * HOUR  # the batch watermark the test sets
TRENDS = str(Path(sys.executable).parent / "trends")


def minute_events(start: datetime, end: datetime, per_minute: int, prefix: str) -> list[Event]:
    out = []
    t = start
    while t < end:
        m = int((t - H0) / MINUTE)
        out += [
            Event(id=f"{prefix}{m}-{i}", ts=t + timedelta(seconds=(i * 7 + m) % 60), item=f"#{prefix}{i % 5}",
                  user=f"u{(i + m) % 50}", value=float(i))
            for i in range(per_minute + m % 3)
        ]  # fmt: skip
        t += MINUTE
    return out


def first_offsets_at_or_after(settings: Settings, since: datetime) -> tuple[dict[int, int], dict[int, int], int]:
    """Read the whole topic: per partition, the first offset of a record at or after ``since``, and the end; and
    the records before ``since`` after those offsets (what a start from them meets and skips)."""
    topic = settings.kafka.events_topic
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": uuid.uuid4().hex, "enable.partition.eof": True,
         "enable.auto.commit": False}
    )  # fmt: skip
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in (0, 1)}
    first: dict[int, int] = {}
    below_after_first = 0
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    pending, deadline = {0, 1}, time.monotonic() + 60
    try:
        while pending and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=1.0):
                if m.error() is not None:
                    pending.discard(m.partition())
                    continue
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                if m.timestamp()[1] >= since.timestamp() * 1000:
                    first.setdefault(part, offset)
                elif part in first:
                    below_after_first += 1
    finally:
        consumer.close()
    assert not pending
    return {p: first.get(p, ends[p]) for p in (0, 1)}, ends, below_after_first


def test_a_new_checkpoint_from_the_watermark_answers_every_minute_above_it_exactly_without_reading_history(
    stack_up: Settings, new_topic: Callable[..., str], keyspace_settings: Settings, tmp_path: Path, spark: Any
) -> None:
    topic = new_topic(partitions=2)
    query = f"wm_{uuid.uuid4().hex[:8]}"
    settings = keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "speed": keyspace_settings.speed.model_copy(update={"query_name": query}),
            "batch": keyspace_settings.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "serving": keyspace_settings.serving.model_copy(update={"state_max_age_ms": 0}),
            "spark": keyspace_settings.spark.model_copy(update={"checkpoint_root": str(tmp_path / "checkpoints")}),
        }
    )
    migrations.migrate(settings)
    # The log, in offset order: two hours, a block of hour W+1 (out of time order), then W-1 .. W+2 in order.
    block = minute_events(W + HOUR + 10 * MINUTE, W + HOUR + 25 * MINUTE, 12, "late")
    log = minute_events(H0, H0 + 2 * HOUR, 10, "a") + block + minute_events(H0 + 2 * HOUR, W + 2 * HOUR, 10, "b")
    produce_events(settings, log, partitions=2)
    job.run(settings, H0, W, spark=spark)  # indexes the topic, computes [H0, W), the watermark moves to W
    with session(settings) as sess:
        from views.store.pointers import PointerStore

        assert PointerStore(settings, sess).watermark().mark == W
    after_index = minute_events(W + 2 * HOUR, W + 2 * HOUR + 5 * MINUTE, 10, "c")  # not indexed yet
    produce_events(settings, after_index, partitions=2)
    events = log + after_index
    truth = Counter(floor(e.ts, MINUTE) for e in events)
    expected_start, ends, below = first_offsets_at_or_after(settings, W)
    topic_size = sum(ends.values())
    assert min(expected_start.values()) > 0  # the history before the block is not read
    assert below > 0  # hour W-1's records after the block: met, and skipped

    checkpoints = tmp_path / "checkpoints"
    env = {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": query,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "3600",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(checkpoints),
        "TRENDS_DATA_DIR": str(tmp_path / "data"),  # the metrics textfile, beside nothing else's
    }
    assert console_checkpoint(settings)["exists"] is False  # the console says so before the start
    t0 = time.monotonic()
    proc = subprocess.run(
        [TRENDS, "speed", "run", "--available-now", "--from-watermark"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    caught_up_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = console_checkpoint(settings)
    assert (seen["exists"], seen["from_watermark"]) == (True, True), seen
    assert "began not written" not in proc.stderr  # skipped before the aggregation, not only by the sink
    recorded = json.loads((checkpoints / query / "trends_start.json").read_text())
    assert recorded["since"] == W.isoformat()
    assert {int(p): o for p, o in recorded["offsets"].items()} == expected_start
    read = int(re.search(r"batches, (\d+) rows read", proc.stderr).group(1))  # type: ignore[union-attr]
    assert read == sum(ends[p] - expected_start[p] for p in ends) < topic_size
    skipped = skipped_metric(tmp_path / "data", query)
    assert skipped == below, proc.stderr[-3000:]  # every record below the boundary it met, counted as skipped
    assert f"this run skipped {below} events below it" in proc.stderr
    print(
        f"\nfrom the watermark: caught up in {caught_up_s:.1f} s (JVM start included), read {read} of the topic's "
        f"{topic_size} records ({read / topic_size:.1%}); skipped {skipped} below the watermark "
        "(trends_speed_skipped_below_batch_watermark_rows_total)"
    )

    assert_exact_above_watermark(settings, events, truth, [W])

    # The checkpoint is lost: the console says so, and a start configured to (the setting the stack's speed
    # service gets) begins a new epoch from the watermark by itself. Still no gap, still exact.
    shutil.rmtree(checkpoints / query)
    seen = console_checkpoint(settings)
    assert seen["exists"] is False and "NO CHECKPOINT" in seen["why"], seen
    more = minute_events(W + 2 * HOUR + 5 * MINUTE, W + 2 * HOUR + 9 * MINUTE, 10, "d")
    produce_events(settings, more, partitions=2)
    events += more
    truth.update(floor(e.ts, MINUTE) for e in more)
    proc = subprocess.run(
        [TRENDS, "speed", "run", "--available-now"], env={**env, "TRENDS_SPEED__FROM_WATERMARK": "true"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = int(re.search(r"batches, (\d+) rows read", proc.stderr).group(1))  # type: ignore[union-attr]
    assert read == sum(ends[p] - expected_start[p] for p in ends) + len(more)
    assert skipped_metric(tmp_path / "data", query) == below  # the same records met again, none of `more`
    assert_exact_above_watermark(settings, events, truth, [W, W])


def skipped_metric(data_dir: Path, query: str) -> int:
    """Return the run's skipped-below-the-watermark counter from its metrics textfile (Prometheus exposition)."""
    text = (data_dir / "metrics" / "speed_layer.prom").read_text()
    found = re.search(
        rf'^trends_speed_skipped_below_batch_watermark_rows_total\{{query="{query}"\}} ([0-9.e+]+)$', text, re.M
    )
    assert found, text
    return int(float(found.group(1)))


def console_checkpoint(settings: Settings) -> dict[str, Any]:
    with session(settings) as sess:
        answer = console.build(ViewReader(settings, sess), H0, H0 + 6 * HOUR)
    return answer.speed.checkpoint.model_dump()


def assert_exact_above_watermark(
    settings: Settings, events: list[Event], truth: Counter[datetime], covered_from: list[datetime]
) -> None:
    """No speed row below the watermark; every minute from H0 to the last event answered exactly, no gap."""
    query = settings.speed.query_name
    end = floor(max(e.ts for e in events), MINUTE) + MINUTE
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        speed = SpeedRows(settings, sess)
        # records below the watermark were skipped: the speed view holds no row of those hours
        assert all(not speed.hour_minutes(query, GLOBAL_SLICE, H0 + i * HOUR) for i in range(3))
        epochs = speed.epochs(query)
        assert [e.covered_from for e in epochs] == covered_from
        assert all(e.starting_offsets.startswith(f"watermark {W.isoformat()}") for e in epochs)
        w = window.load(reader, H0, end, GLOBAL_SLICE, coarsest="minute")
        assert w.provenance.gaps == [], w.provenance.gaps
        layers = {(s["start"], s["end"], s["layer"]) for s in w.provenance.spans}
        assert {layer for *_, layer in layers} == {"batch", "speed"}
        series = queries.series(w, "minute")
    counts = {p["start"]: p["count"] for p in series.points}
    wrong = {m: (counts.get(m), truth[m]) for m in counts if counts[m] != truth[m]}
    assert not wrong, sorted(wrong.items())[:10]
    assert len(counts) == int((end - H0) / MINUTE)
    assert w.merged.events == len(events)


def test_a_restart_from_the_watermark_behind_a_year_of_history_reads_under_one_percent_of_the_topic(
    stack_up: Settings, new_topic: Callable[..., str], keyspace_settings: Settings, tmp_path: Path, spark: Any
) -> None:
    """The cost of a lost checkpoint: a year of (sparse) history before live events, the watermark at the live hour."""
    topic = new_topic(partitions=2)
    query = f"wm_{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    live_from = floor(now - 20 * MINUTE, HOUR)  # the batch watermark: every hour before it is computed
    settings = keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "speed": keyspace_settings.speed.model_copy(update={"query_name": query}),
            "batch": keyspace_settings.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "serving": keyspace_settings.serving.model_copy(update={"state_max_age_ms": 0}),
        }
    )
    migrations.migrate(settings)
    history = Truth()
    produced = produce_history(settings, history_config(live_from - timedelta(days=365), 365, rate=0.01), history)
    live = minute_events(live_from, floor(now, MINUTE), 6, "live")
    produce_events(settings, live, partitions=2)
    t0 = time.monotonic()
    job.run(settings, live_from - timedelta(days=365), live_from, spark=spark)
    batch_s = time.monotonic() - t0
    with session(settings) as sess:
        from views.store.pointers import PointerStore

        assert PointerStore(settings, sess).watermark().mark == live_from
    topic_size = produced + sum(history.dups.values()) + len(live)

    env = {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": query,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "3600",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRENDS_SPEED__FROM_WATERMARK": "true",
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [TRENDS, "speed", "run", "--available-now"], env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    caught_up_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = int(re.search(r"batches, (\d+) rows read", proc.stderr).group(1))  # type: ignore[union-attr]
    print(
        f"\na year of history ({produced + sum(history.dups.values())} records) + {len(live)} live: batch layer "
        f"{batch_s:.0f} s; from the watermark {live_from:%H:%M}: caught up in {caught_up_s:.1f} s (JVM start "
        f"included), read {read} of the topic's {topic_size} records ({read / topic_size:.2%})"
    )
    assert read == len(live)
    assert read < topic_size / 100
    assert caught_up_s < 60
    truth = Counter(floor(e.ts, MINUTE) for e in live)
    end = floor(now, MINUTE)
    with session(settings) as sess:
        w = window.load(ViewReader(settings, sess), live_from, end, GLOBAL_SLICE, coarsest="minute")
        assert w.provenance.gaps == [], w.provenance.gaps
        counts = {p["start"]: p["count"] for p in queries.series(w, "minute").points}
    assert counts == {m: truth[m] for m in counts}
    assert len(counts) == int((end - live_from) / MINUTE)
