"""Serving benchmark: trending answers over 1 h, 24 h and 7 d windows, in process and over HTTP, with realistic rows.

Run: ``.venv/bin/python bench/serving_bench.py`` with the stack up (``--smoke``: tiny sizes, a few seconds, every
check kept). It fills a throw-away keyspace with ``--days`` of per-minute rows in both views, of the size Spark writes
for a busy minute (frequent items of 1024 tracked: 30-36 KB a row; hourly and daily rollups merged from them), written
the way the layers write them, so that serving accepts every minute:

* the view definition is registered (``view_definitions``) and recorded on the speed epoch and every batch pointer;
* the speed view through the speed layer's sink (``SpeedViewSink.write_rows``: the epoch, the hours it writes, the
  rows, the minutes counted), then ``read_all`` — the epoch has read the whole topic — as the speed job records it;
* the batch view up to a watermark two hours ago through the batch layer's load (``batch_layer.load.load``: lineage,
  versioned minute and hour rows, pointer swaps, daily rollups), a day per pass, then the watermark advanced over the
  completed hours (``PointerStore.advance``) as ``trends batch run`` does.

Writes run at a bounded concurrency (``--write-concurrency``) and are retried when the node is busy: the fill goes at
the rate the node takes. Every answer measured is checked first: each window must be answered with no gap, from the
number of rows its plan should read (daily rollups of whole days below the watermark, hourly rollups of whole hours,
minutes elsewhere) and with every event planted; a bench that would measure an empty answer fails (exit 1).

Every ratio compares the same work in the same state, said in the output:

* **uncached answers** — a reader with every cache off (``serving.cache_mb``, ``serving.answer_cache_mb`` and
  ``serving.state_max_age_ms`` 0: no row, speed-row or answer cache, the state read for every answer), as a new
  question finds it: coverage read, plan, rows read, merge, trending (goal p99 <= 20 / 50 / 100 ms). Beside it, on
  the same line: the same reads alone through the driver (the coverage reads and the rows of the same plan), without
  planning or merging; the same rows merged alone, in memory; and the two added. All warm (``--warmup`` runs first).
* **cached answers** — a reader whose answer cache holds the question (nothing moved): the coverage read and a
  lookup. Baseline: the coverage read alone.
* **speed moved** — before each run the speed layer's sink rewrites the newest minute of the window with one more
  event and records that it read the whole topic (not timed): the batch part is kept (every run must count as such),
  only the changed minute is read again. Beside the uncached answer.

Then ``trends serve --workers N`` runs over the same keyspace and 8 and 64 concurrent clients (threads, one HTTP
connection each) send trending requests for ``--http-seconds``: requests/s, p50/p99 and errors (any status but
200; the run fails after printing them), beside the same clients against ``/health`` of the same server and the
ratio. Before the clients, ``/count`` of each window must count every event with no gap. The answers are cached (the
same few questions, as a dashboard's viewers ask them); ``serving.max_concurrent_requests`` is raised to the clients.
Each HTTP run is repeated per ``--state-max-age-ms``: 0 (the layers' state is read for every request) and 250 (the
default: the state reused for 250 ms by a process's requests, answers at most that much behind the layers).

Last, the cost of the most expensive request the API allows (``--rss``): a second keyspace holds only speed-view
minutes (the batch view lagging: the costly case) with realistic sketches, about ``serving.max_read_mb`` of them in
one window; ``trends serve`` (one worker, answer cache off, so every request does the whole work) answers
``/summary`` over that window to 8 clients at a time while its RSS is sampled (``/count`` over it must count every
event with no gap first). It passes only when every answer is a 200 and the peak RSS is under 300 MiB; a window
reading more than ``serving.max_read_mb`` must be refused (400). The run exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from typing import Any

import datasketches as ds
import httpx

from batch_layer import load
from batch_layer.compute import Computed
from batch_layer.offsets import HourPlan, Plan
from batch_layer.publish import BatchStore
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from infra.settings_env import to_env
from serving import queries
from serving.merge import Merged
from serving.reader import ViewReader
from serving.window import Window, load_many
from speed_layer.sink import SpeedViewSink
from views.buckets import DAY, HOUR, MINUTE, SPEED_ROLLUP, days_between, floor, is_day_part
from views.definition import view_definition
from views.sketches import merge_all
from views.store.definitions import DefinitionStore
from views.store.index import OffsetSpan
from views.store.rollups import MIN_EDGE
from views.store.rows import ViewRow

VARIANTS = 24  # distinct realistic minute sketches, cycled (building one costs ~0.1 s of Python)
LAST_MS = MINUTE - timedelta(milliseconds=1)
GOALS = {"1h": 20.0, "24h": 50.0, "7d": 100.0}  # uncached trending p99 (ms), issue 46
WINDOWS = {"1h": HOUR, "24h": DAY, "7d": 7 * DAY}


class BenchError(SystemExit):
    """A check of the bench failed: it would measure something else than the answer it names (exit 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"serving bench: {message}")


@dataclass
class Filled:
    """What the fill planted: every minute of ``[start, end)`` in both views with ``events`` each.

    :arg watermark: the batch watermark (hours below it have a completed batch run; the speed view serves from it).
    :arg epoch: the speed epoch that wrote the speed rows (a speed move continues it, as the job does).
    :arg definition: the fingerprint of the view definition both layers computed with.
    :arg moved: events the speed moves have added to the newest minute since.
    """

    start: datetime
    end: datetime
    watermark: datetime
    events: int
    row_kb: float
    epoch: str
    definition: str
    rolled: datetime | None = None  # speed intervals ending by then are merged into rollups
    live: bool = False  # and the open ones after them (speed.live_rollups)
    parts: bool = False  # the batch view's parts of days are written and read (batch.day_parts)
    edges: bool = False  # the speed view's closed intervals' edges are (speed.edge_ttl_s)
    moved: int = 0

    def events_in(self, start: datetime, end: datetime) -> int:
        """Return the events planted in ``[start, end)`` (the speed moves' included)."""
        newest = self.end - MINUTE
        return self.events * int((end - start) / MINUTE) + (self.moved if start <= newest < end else 0)


def speed_sink(settings: Settings, epoch: str, definition: str) -> SpeedViewSink:
    """Return the speed layer's sink of one epoch (Spark's query id in the job) with the definition it computes."""
    return SpeedViewSink(
        settings, settings.speed.query_name, settings.speed.view_ttl_s, epoch_id=epoch, definition=definition
    )


def big_sketches(rng: random.Random, events: int, items: int) -> tuple[bytes, bytes, bytes]:
    """Return a minute's sketches as Spark writes them for a busy minute (frequent items of 1024 tracked: ~30 KB)."""
    hll = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    kll = ds.kll_doubles_sketch(200)
    fi = ds.frequent_strings_sketch(11)  # approx_top_k_accumulate(item, 1024) keeps a map of 2048
    for _ in range(events):
        hll.update(f"u{rng.randrange(200_000)}")
        kll.update(rng.lognormvariate(3, 1))
        fi.update(f"#item-{rng.randrange(items):06d}")
    return bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize())


def retried(what: str, write: Callable[[], Any], tries: int = 8) -> Any:
    """Run an idempotent write, waiting and retrying while the node is busy (ConnectionBusy, timeouts)."""
    for attempt in range(tries):
        try:
            return write()
        except Exception as exc:  # the driver's busy/timeout errors; the write is an upsert, so retry it whole
            if attempt == tries - 1:
                raise
            pause = 0.5 * 2**attempt
            print(f"  {what}: {type(exc).__name__} ({str(exc)[:80]}); retrying in {pause:.1f} s", file=sys.stderr)
            time.sleep(pause)
    return None


def bench_settings(base: Settings, keyspace: str, write_concurrency: int) -> Settings:
    """Return the settings of a throw-away keyspace whose bulk writes go at most ``write_concurrency`` at once."""
    cassandra = base.cassandra.model_copy(update={"keyspace": keyspace, "write_concurrency": write_concurrency})
    speed = base.speed.model_copy(update={"starting_offsets": "earliest"})
    return base.model_copy(update={"cassandra": cassandra, "speed": speed})


def write_speed(
    settings: Settings,
    minutes: Sequence[tuple[datetime, tuple[bytes, bytes, bytes]]],
    events: int,
    definition: str,
    roll_up: bool = True,
) -> str:
    """Write the minutes through the speed layer's sink as one epoch from the topic's beginning; return its id.

    Then record that the epoch has read the whole topic (``speed_epochs.read_all_at``), as the speed job does after
    a micro-batch that read to the latest offsets: serving answers a speed minute only once its epoch has.
    """
    epoch = str(uuid.uuid4())  # the job's epoch is its checkpoint's query id
    sink = speed_sink(settings, epoch, definition)
    try:
        chunk = 240
        for i in range(0, len(minutes), chunk):
            rows = [ViewRow("*", m, events, *sk, m, m + LAST_MS) for m, sk in minutes[i : i + chunk]]
            retried("speed rows", lambda rows=rows, i=i: sink.write_rows(rows, i // chunk))
        if not sink.read_all(datetime.now(UTC)):
            raise BenchError("the speed epoch was not registered by its first batch")
        # the intervals the Spark watermark (the newest event less the lateness) has passed, merged as the job does
        if roll_up:
            watermark = minutes[-1][0] + LAST_MS - timedelta(seconds=settings.speed.allowed_lateness_s)
            rolled = retried("speed rollups", lambda: sink.roll_up(watermark))
            live = retried("open speed rollups", sink.roll_up_live)  # as after every micro-batch
            print(
                f"  {rolled:,} speed rollups of {SPEED_ROLLUP.total_seconds() / 60:.0f} minutes merged, "
                f"{live} of open intervals"
            )
    finally:
        sink.close()
    return epoch


def write_batch(
    settings: Settings, minutes: Sequence[tuple[datetime, tuple[bytes, bytes, bytes]]], events: int, below: datetime
) -> tuple[datetime | None, str]:
    """Write the minutes' hours below ``below`` through the batch layer's load, a UTC day per pass, then advance.

    Each pass is what ``batch_layer.job`` hands ``load.load`` after Spark: the hours' minute rows, ten-minute rows
    and hourly rollup (merged from the minutes, as ``views.aggregation.rollup`` does), under the serving definition,
    registered first as the job does; the days are re-merged from their hours (``BatchStore.remerge_day``). The
    lineage's offset spans are made up (one span of the hour's events per hour: nothing is read from Kafka here).
    Return the watermark after ``PointerStore.advance`` and the definition's fingerprint.
    """
    by_hour: dict[datetime, list[tuple[datetime, tuple[bytes, bytes, bytes]]]] = {}
    for m in minutes:
        if m[0] < below:
            by_hour.setdefault(floor(m[0], HOUR), []).append(m)
    by_day: dict[datetime, list[datetime]] = {}
    for hour in sorted(by_hour):
        by_day.setdefault(floor(hour, DAY), []).append(hour)
    with session(settings) as sess:
        definitions = DefinitionStore(settings, sess)
        definition = definitions.register(definitions.serving_definition(), "batch")
        store = BatchStore(settings, sess)
        offset = 0
        for hours in by_day.values():
            plans, minute_rows, hour_rows = [], {}, {}
            ten_rows: dict[datetime, list[ViewRow]] = {}
            for hour in hours:
                ms = by_hour[hour]
                n = events * len(ms)
                plans.append(HourPlan(hour, (OffsetSpan(0, offset, offset + n - 1, n),)))
                offset += n
                minute_rows[hour] = [ViewRow("*", m, events, *sk, m, m + LAST_MS) for m, sk in ms]
                merged = merge_all(sk for _m, sk in ms)
                hour_rows[hour] = [ViewRow("*", hour, n, *merged, ms[0][0], ms[-1][0] + LAST_MS)]
                tens: dict[datetime, list[tuple[datetime, tuple[bytes, bytes, bytes]]]] = {}
                for m in ms:
                    tens.setdefault(floor(m[0], SPEED_ROLLUP), []).append(m)
                ten_rows[hour] = [
                    ViewRow("*", t, events * len(tm), *merge_all(sk for _m, sk in tm), tm[0][0], tm[-1][0] + LAST_MS)
                    for t, tm in tens.items()
                ]
            plan = Plan(settings.kafka.events_topic, tuple(plans), ())
            done = Computed(minute_rows, hour_rows, {}, offset, Counter(), Counter(), ten_rows)

            def write(plan: Plan = plan, done: Computed = done) -> Any:
                return load.load(store, plan, done, force=True, code="bench", definition=definition)

            retried("batch pass", write)
        _low, mark = store.pointers.advance(min(by_hour))
    return mark, definition


def fill(settings: Settings, end: datetime, days: int, events: int, items: int) -> Filled:
    """Write ``days`` (and the rest of the first hour) of realistic minute rows ending at ``end`` in both views."""
    rng = random.Random(5)
    variants = [big_sketches(rng, events, items) for _ in range(VARIANTS)]
    row_kb = statistics.mean(sum(map(len, v)) for v in variants) / 1024
    start = floor(end - days * DAY, HOUR)  # whole hours: the batch layer computes hours
    watermark = floor(end, HOUR) - 2 * HOUR
    minutes = [(start + i * MINUTE, variants[i % VARIANTS]) for i in range(int((end - start) / MINUTE))]
    print(
        f"filling {len(minutes):,} minutes of {row_kb:.1f} KB rows per view, {events:,} events each "
        f"(writes {settings.cassandra.write_concurrency} at once)"
    )
    with session(settings) as sess:  # the speed job registers its definition before its query starts
        definition = DefinitionStore(settings, sess).register(view_definition(settings), settings.speed.query_name)
    t0 = time.monotonic()
    epoch = write_speed(settings, minutes, events, definition)
    t1 = time.monotonic()
    mark, batch_definition = write_batch(settings, minutes, events, watermark)
    print(f"  speed view written in {t1 - t0:.1f} s, batch view in {time.monotonic() - t1:.1f} s")
    if mark != watermark or batch_definition != definition:
        raise BenchError(f"the batch watermark is {mark} (expected {watermark}), definitions {batch_definition}")
    live = settings.speed.write_rollups and settings.speed.live_rollups
    rolled = rollups_until(settings, end)
    edges = settings.speed.write_rollups and settings.speed.edge_ttl_s > 0
    parts = settings.batch.day_parts
    return Filled(start, end, watermark, events, row_kb, epoch, definition, rolled, live, parts, edges)


def rollups_until(settings: Settings, fresh: datetime) -> datetime:
    """Return the end of the speed intervals surely merged when the newest minute read ends at ``fresh``.

    The newest event is at least a minute before ``fresh`` and the job's watermark is the lateness behind it: the
    intervals ending a minute before ``fresh`` less the lateness are closed (the one ending at it may not be yet).
    """
    return floor(fresh - timedelta(seconds=settings.speed.allowed_lateness_s), MINUTE) - MINUTE


def expected_rows(
    start: datetime,
    end: datetime,
    watermark: datetime,
    rolled: datetime | None,
    planted: datetime | None = None,
    parts: bool = False,
    edges: bool = False,
) -> int:
    """Return the rows an answer over ``[start, end)`` must read when both views hold every minute planted.

    Below the watermark: a daily rollup per whole UTC day, an hourly rollup per whole hour, a ten-minute row per
    other whole ten minutes and minute rows elsewhere; from it, a speed rollup per whole interval ending by ``rolled``
    and a speed row per other minute (``rolled`` None: ten-minute rows off, minutes only). With live rollups
    (``planted``: the end of the minutes planted), every interval has its rollup, and the one a span ends inside is
    read from it when nothing was planted after the span's end. With ``parts`` (``batch.day_parts``), the whole hours
    of a day from or to its midnight are one row when they are a part of the day (``views.buckets.is_day_part``).
    With ``edges``, see :func:`_edge_rows`. The merge rule of ``serving.plan`` and the reads of
    ``serving.read_schedule``, stated here on their own.
    """
    split = min(max(watermark, start), end)
    rows = 0
    for day in days_between(start, split) if start < split else ():
        first = max(start, datetime.combine(day, dtime(), UTC))
        last = min(split, datetime.combine(day, dtime(), UTC) + DAY)
        if last - first == DAY:
            rows += 1  # the daily rollup
            continue
        a, b = floor(first + HOUR - MINUTE, HOUR), floor(last, HOUR)  # the whole hours of the day piece
        if b <= a:
            rows += _edge_rows(first, last, last if rolled is not None else None)
            continue
        rows += 1 if parts and is_day_part(a, b) else int((b - a) / HOUR)
        for lo, hi in ((first, a), (b, last)):  # partial hours at its edges: ten-minute rows and minutes
            if lo < hi:
                rows += _edge_rows(lo, hi, hi if rolled is not None else None)
    if rolled is None:
        return rows + int((end - split) / MINUTE)
    for day in days_between(split, end):  # a speed span is read a UTC day at a time
        first = max(split, datetime.combine(day, dtime(), UTC))
        last = min(end, datetime.combine(day, dtime(), UTC) + DAY)
        rows += _edge_rows(first, last, rolled, planted, edges)
    return rows


def _edge_rows(
    first: datetime, last: datetime, rolled: datetime | None, planted: datetime | None = None, edges: bool = False
) -> int:
    """Return the rows of ``[first, last)`` read as whole ten minutes ending by ``rolled`` and minutes elsewhere.

    ``planted`` (live rollups): every interval is read whole, and so is the one ``last`` falls inside when nothing
    was planted after ``last``. ``edges`` (``speed.edge_ttl_s``): a piece of two minutes or more before the first
    whole interval or after the last one is one row when its interval ends by ``rolled``.
    """
    lo = floor(first + SPEED_ROLLUP - MINUTE, SPEED_ROLLUP)
    if rolled is None:
        hi = lo
    elif planted is not None:
        top = floor(last - MINUTE, SPEED_ROLLUP) + SPEED_ROLLUP
        hi = top if last >= planted else floor(last, SPEED_ROLLUP)
    else:
        hi = floor(min(last, rolled), SPEED_ROLLUP)
    if hi <= lo:
        return int((last - first) / MINUTE)
    left, right = int((lo - first) / MINUTE), max(0, int((last - hi) / MINUTE))
    if edges and rolled is not None and left >= MIN_EDGE and lo <= rolled:
        left = 1
    if edges and rolled is not None and right >= MIN_EDGE and hi + SPEED_ROLLUP <= rolled:
        right = 1
    return left + int((hi - lo) / SPEED_ROLLUP) + right


def check_answer(
    what: str, windows: Sequence[Window], filled: Filled, rollups: bool = True, live: bool = True
) -> tuple[int, int]:
    """Fail unless every window is answered with no gap, from the expected rows, with every event planted.

    ``live``: the rollups of open intervals are read (if the speed layer writes them); an answer from the answer cache
    reads its newest minutes (those the speed layer may still change) as minutes.

    :returns: the rows and events of all windows.
    """
    for w in windows:
        gaps = w.provenance.gaps
        planted = filled.end if rollups and live and filled.live else None
        rolled = filled.rolled if rollups else None
        edges = filled.edges and rollups
        want_rows = expected_rows(w.start, w.end, filled.watermark, rolled, planted, filled.parts, edges)
        want_events = filled.events_in(w.start, w.end)
        if gaps or w.merged.rows != want_rows or w.merged.events != want_events:
            raise BenchError(
                f"{what}: the window {w.start:%Y-%m-%d %H:%M}..{w.end:%Y-%m-%d %H:%M} was answered from "
                f"{w.merged.rows} rows with {w.merged.events} events and {len(gaps)} gap(s) "
                f"({gaps[:1]}); expected {want_rows} rows, {want_events} events, no gap"
            )
    return sum(w.merged.rows for w in windows), sum(w.merged.events for w in windows)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def no_caches(settings: Settings, rollups: bool = True) -> Settings:
    """Return the settings with every serving cache off: rows, speed rows, answers, and the layers' state reuse.

    :arg rollups: read the ten-minute rows of both views (``serving.ten_minute_rows``); off, minutes (the baseline).
    """
    off = {"cache_mb": 0, "answer_cache_mb": 0, "state_max_age_ms": 0, "ten_minute_rows": rollups}
    return settings.model_copy(update={"serving": settings.serving.model_copy(update=off)})


def state_per_answer(settings: Settings) -> Settings:
    return settings.model_copy(update={"serving": settings.serving.model_copy(update={"state_max_age_ms": 0})})


def trending_once(reader: ViewReader, end: datetime, window: timedelta) -> list[Window]:
    """Answer trending over [end - window, end) against the window before it, as the API does; return both."""
    windows = [(end - window, end), (end - 2 * window, end - window)]
    recent, base = load_many(reader, windows, "*", fields=queries.NEEDS["trending"], keep_rows=False)
    queries.trending(recent, base, limit=10, min_support=5)
    return [recent, base]


def bare_reads(reader: ViewReader, end: datetime, window: timedelta) -> int:
    """The same reads as an uncached answer (the coverage, the rows of its plan), without planning or merging."""
    cov = reader.coverage(end - 2 * window, end, "*")
    spans = [s for a, b in ((end - window, end), (end - 2 * window, end - window)) for s in cov.plan(a, b)]
    return sum(
        1 for _ in reader.stream(spans, "*", queries.NEEDS["trending"], runs=cov.runs, rollups=cov, day_parts=True)
    )


def merge_alone(reader: ViewReader, end: datetime, window: timedelta) -> tuple[Callable[[], None], int]:
    """Return a call that merges the rows of an uncached answer already in memory, as the answer does (no reads)."""
    cov = reader.coverage(end - 2 * window, end, "*")
    windows = [(end - window, end), (end - 2 * window, end - window)]
    needs = queries.NEEDS["trending"]
    rows = [reader.read(cov.plan(a, b), "*", needs, runs=cov.runs, rollups=cov, day_parts=True) for a, b in windows]

    def merge() -> None:
        merged = [Merged(MINUTE) for _ in windows]
        for m, buckets in zip(merged, rows, strict=True):
            for b in buckets:
                m.add(b)  # SketchUnion merges as rows are added

    return merge, sum(map(len, rows))


def keep_last(holder: list[list[Window]], windows: list[Window]) -> None:
    """Keep only the last answer timed, to check it after the timing."""
    holder[:] = [windows]


def timed(fn: Callable[[], Any], runs: int, warmup: int, before: Callable[[], Any] | None = None) -> list[float]:
    """Return the times (ms) of ``runs`` calls after ``warmup`` untimed ones; ``before`` runs untimed before each."""
    out = []
    for i in range(runs + warmup):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
    return out


def in_process(settings: Settings, filled: Filled, label: str, runs: int, warmup: int) -> None:
    """Print uncached, cached and speed-moved trending answers beside their baselines (all warm), each checked."""
    end, window, goal = filled.end, WINDOWS[label], GOALS[label]
    with session(settings) as sess:
        cold = ViewReader(no_caches(settings), sess)  # statements prepared once, nothing kept between answers
        if cold.answers is not None or cold.cache is not None or cold.speed_cache is not None:
            raise BenchError("the uncached reader keeps a cache")
        rows, events = check_answer(f"{label} uncached", trending_once(cold, end, window), filled)
        last: list[list[Window]] = []  # the last answer timed (only: holding them all would feed the GC)
        subject = timed(lambda: keep_last(last, trending_once(cold, end, window)), runs, warmup)
        check_answer(f"{label} uncached, the last timed answer", last[-1], filled)
        read = bare_reads(cold, end, window)
        merge, in_memory = merge_alone(cold, end, window)
        if read != rows or in_memory != rows:
            raise BenchError(f"{label}: the reads alone gave {read} rows and {in_memory} to merge, the answer {rows}")
        bare = timed(lambda: bare_reads(cold, end, window), runs, warmup)
        alone = timed(merge, runs, warmup)
        p50, p99, b50, b99 = (pct(subject, 0.5), pct(subject, 0.99), pct(bare, 0.5), pct(bare, 0.99))
        m50, m99 = pct(alone, 0.5), pct(alone, 0.99)
        verdict = "✔" if p99 <= goal else "✘"
        print(
            f"trending {label:>3} uncached (every cache off): p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  | reads alone "
            f"(state + rows) p50 {b50:6.1f} p99 {b99:6.1f}  merge alone (in memory) p50 {m50:6.1f} p99 {m99:6.1f}  "
            f"reads + merge p50 {b50 + m50:6.1f} ms  | {rows:,} rows, {events:,} events of both windows, no gap; "
            f"goal p99 <= {goal:.0f} ms {verdict}"
        )
        minutes = ViewReader(no_caches(settings, rollups=False), sess)  # the same, the speed part from minutes
        m_rows, _ = check_answer(f"{label} uncached, minutes", trending_once(minutes, end, window), filled, False)
        before = timed(lambda: keep_last(last, trending_once(minutes, end, window)), runs, warmup)
        check_answer(f"{label} uncached, minutes, the last timed answer", last[-1], filled, False)
        print(
            f"trending {label:>3} uncached, minutes only (serving.ten_minute_rows off): p50 "
            f"{pct(before, 0.5):6.1f} ms  p99 {pct(before, 0.99):6.1f} ms  | {m_rows:,} rows  | rollups: "
            f"p50 {pct(before, 0.5) / p50:4.2f}x, p99 {pct(before, 0.99) / p99:4.2f}x faster"
        )
        # the state read for every answer, so that a move is seen by the very next one (the reuse is below)
        warm = ViewReader(state_per_answer(settings), sess)
        answers = warm.answers
        if answers is None:
            raise BenchError("the cached reader has no answer cache (serving.answer_cache_mb 0?)")
        trending_once(warm, end, window)
        hits = answers.hits
        cached = timed(lambda: keep_last(last, trending_once(warm, end, window)), runs, warmup)
        check_answer(f"{label} cached", last[-1], filled, live=False)
        if answers.hits != hits + runs + warmup:
            raise BenchError(f"{label}: {answers.hits - hits} of {runs + warmup} cached runs were lookups")
        state = timed(lambda: warm.coverage(end - 2 * window, end, "*"), runs, warmup)
        print(
            f"trending {label:>3} cached:   p50 {pct(cached, 0.5):6.1f} ms  p99 {pct(cached, 0.99):6.1f} ms  | "
            f"the state read alone: p50 {pct(state, 0.5):6.1f} ms  ratio p50 {pct(state, 0.5) / pct(cached, 0.5):4.2f}"
        )
        reusing = ViewReader(settings, sess)
        trending_once(reusing, end, window)
        reused = timed(lambda: keep_last(last, trending_once(reusing, end, window)), runs, warmup)
        check_answer(f"{label} cached, the state reused", last[-1], filled, live=False)
        print(
            f"trending {label:>3} cached, the state reused (serving.state_max_age_ms "
            f"{settings.serving.state_max_age_ms}): p50 {pct(reused, 0.5):6.2f} ms  p99 {pct(reused, 0.99):6.2f} ms"
        )
        sink = speed_sink(settings, filled.epoch, filled.definition)  # the same epoch continues
        newest = end - MINUTE
        variant = big_sketches(random.Random(9), filled.events, 5000)

        def move() -> None:  # the speed layer rewrites its newest minute with one more event
            filled.moved += 1
            row = ViewRow("*", newest, filled.events + filled.moved, *variant, newest, newest + LAST_MS)
            sink.write_rows([row], 1_000_000 + filled.moved)
            sink.roll_up_live()
            sink.read_all(datetime.now(UTC))  # the micro-batch read to the latest offsets

        try:
            partial = answers.partial
            moves = max(runs // 4, 10)
            moved = timed(lambda: keep_last(last, trending_once(warm, end, window)), moves, warmup, before=move)
            check_answer(f"{label} speed moved", last[-1], filled, live=False)
            if answers.partial != partial + moves + warmup:
                raise BenchError(
                    f"{label}: {answers.partial - partial} of {moves + warmup} speed moves kept the batch part"
                )
        finally:
            sink.close()
        print(
            f"trending {label:>3} speed moved one minute: p50 {pct(moved, 0.5):6.1f} ms  p99 {pct(moved, 0.99):6.1f} "
            f"ms  | uncached p50 {p50:6.1f} ms  ratio {p50 / pct(moved, 0.5):4.2f}x faster"
        )


def hammer(url: str, clients: int, seconds: float) -> tuple[int, list[float], int]:
    """Send GETs of ``url`` from ``clients`` threads for ``seconds``; return requests, latencies (ms), errors."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    ok = http.get(url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies[i].append((time.perf_counter() - t0) * 1000)
                errors[i] += not ok

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return len(flat), flat, sum(errors)


def start_server(settings: Settings, workers: int = 1, **extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``trends serve`` on the settings' keyspace; return the process and its URL once ready."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **to_env(settings), "TRENDS_SERVING__PORT": str(port), "TRENDS_LOG_LEVEL": "WARNING", **extra}
    trends = str(Path(sys.executable).parent / "trends")
    proc = subprocess.Popen([trends, "serve", "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise BenchError("trends serve did not become ready")
        time.sleep(0.3)


def check_http(base: str, filled: Filled, window: timedelta, label: str) -> str:
    """Fail unless the server counts every event of the window and the one before it with no gap; return the URL
    of the trending question over them (its first answer checked too)."""
    fmt = "%Y-%m-%dT%H:%MZ"
    end = filled.end
    for a, b in ((end - window, end), (end - 2 * window, end - window)):
        got = httpx.get(f"{base}/api/v1/count?start={a:{fmt}}&end={b:{fmt}}", timeout=120)
        body = got.json() if got.status_code == 200 else {}
        gaps = body.get("provenance", {}).get("gaps")
        if got.status_code != 200 or gaps or body.get("events") != filled.events_in(a, b):
            raise BenchError(
                f"http {label}: /count {a:{fmt}}..{b:{fmt}} answered {got.status_code} with {body.get('events')} "
                f"events and gaps {gaps} (expected {filled.events_in(a, b)} events, no gap)"
            )
    url = f"{base}/api/v1/trending?start={end - window:{fmt}}&end={end:{fmt}}&baseline={label}&limit=10"
    first = httpx.get(url, timeout=120)  # the first asker of a question pays for it; the others read it
    provenance = first.json().get("provenance", {}) if first.status_code == 200 else {}
    gaps = [g for part in provenance.values() for g in part.get("gaps", [])]
    if first.status_code != 200 or gaps or set(provenance) != {"recent", "baseline"}:
        raise BenchError(f"http trending {label}: {first.status_code}, gaps {gaps[:1]} ({first.text[:200]})")
    return url


def http_bench(
    settings: Settings, filled: Filled, clients: Sequence[int], seconds: float, workers: int, state_age_ms: int
) -> list[str]:
    """Run ``trends serve --workers N`` on the bench keyspace and load it with concurrent clients; return problems."""
    most = max(clients)
    proc, base = start_server(
        settings,
        workers,
        TRENDS_SERVING__MAX_CONCURRENT_REQUESTS=str(most),
        TRENDS_SERVING__STATE_MAX_AGE_MS=str(state_age_ms),
    )
    print(
        f"http: trends serve --workers {workers}, serving.max_concurrent_requests {most}, answers cached, "
        f"serving.state_max_age_ms {state_age_ms} ({'state read per request' if not state_age_ms else 'state reused'})"
    )
    problems = []
    try:
        urls = {label: check_http(base, filled, WINDOWS[label], label) for label in ("1h", "24h")}
        for n in clients:
            bare_n, bare_lat, bare_errors = hammer(f"{base}/health", n, seconds)
            print(
                f"http /health     {n:2d} clients: {bare_n / seconds:7.0f} req/s  p50 {pct(bare_lat, 0.5):6.1f} ms  "
                f"p99 {pct(bare_lat, 0.99):6.1f} ms  errors {bare_errors}"
            )
            for label, url in urls.items():
                count, lat, errors = hammer(url, n, seconds)
                print(
                    f"http trending {label:>3} {n:2d} clients: {count / seconds:7.0f} req/s  p50 {pct(lat, 0.5):6.1f} "
                    f"ms  p99 {pct(lat, 0.99):6.1f} ms  errors {errors}  | ratio to /health {count / bare_n:4.2f}"
                )
                if errors or bare_errors:
                    problems.append(f"http {label}, {n} clients: {errors} errors (/health: {bare_errors})")
    finally:
        proc.terminate()
        proc.wait(30)
    return problems


def rss_bench(
    base: Settings,
    clients: int,
    rounds: int,
    write_concurrency: int,
    events: int = 3000,
    keyspace: Settings | None = None,
) -> bool:
    """Peak RSS of ``trends serve`` under the most expensive request it allows, ``clients`` at a time.

    :arg keyspace: the settings of a migrated keyspace with no speed rows yet, its minutes written under a speed query
        of their own (None: a keyspace of its own, dropped afterwards). Run first, then, no batch watermark is there.
    """
    import psutil

    if keyspace is None:
        settings = bench_settings(base, f"bench_rss_{uuid.uuid4().hex[:6]}", write_concurrency)
        migrations.migrate(settings)
    else:
        settings = keyspace.model_copy(update={"speed": keyspace.speed.model_copy(update={"query_name": "bench_rss"})})
    try:
        rng = random.Random(7)
        variants = [big_sketches(rng, events, 5000) for _ in range(16)]
        row_bytes = statistics.mean(sum(map(len, v)) for v in variants)
        budget = settings.serving.max_read_mb * 1024 * 1024
        rows = int(budget * 0.9 / row_bytes)  # the longest window still under serving.max_read_mb
        extra = rows // 5  # minutes before it: a window over them too reads 108% of the budget
        end = floor(datetime.now(UTC), MINUTE)
        start = end - rows * MINUTE
        minutes = [(start + i * MINUTE, variants[i % len(variants)]) for i in range(-extra, rows)]
        began = time.perf_counter()
        with session(settings) as sess:
            definition = DefinitionStore(settings, sess).register(view_definition(settings), settings.speed.query_name)
        write_speed(settings, minutes, events, definition, roll_up=False)  # minutes: the costliest reads
        took = time.perf_counter() - began
        print(
            f"rss: {rows:,} speed minutes ({rows / 1440:.1f} days) of {row_bytes / 1024:.1f} KB sketches each = "
            f"{rows * row_bytes / 2**20:.0f} MiB, under serving.max_read_mb {settings.serving.max_read_mb:g}; "
            f"written in {took:.0f} s ({len(minutes) * row_bytes / 2**20 / took:.1f} MiB/s, "
            f"{write_concurrency} at once)"
        )
        proc, url = start_server(settings, 1, TRENDS_SERVING__ANSWER_CACHE_MB="0")
        try:
            ps = psutil.Process(proc.pid)
            fmt = "%Y-%m-%dT%H:%MZ"
            ok = httpx.get(f"{url}/api/v1/count?start={start:{fmt}}&end={end:{fmt}}", timeout=120)
            counted = ok.json() if ok.status_code == 200 else {}
            if counted.get("events") != rows * events or counted.get("provenance", {}).get("gaps"):
                raise BenchError(
                    f"rss: /count over the window answered {ok.status_code} with {counted.get('events')} events "
                    f"(expected {rows * events:,}, no gap): {ok.text[:200]}"
                )
            at_rest = ps.memory_info().rss
            query = f"{url}/api/v1/summary?start={start:{fmt}}&end={end:{fmt}}"
            over = httpx.get(f"{url}/api/v1/summary?start={start - extra * MINUTE:{fmt}}&end={end:{fmt}}", timeout=600)
            peak, stop = [at_rest], threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], ps.memory_info().rss)
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            times: list[float] = []
            codes: list[int] = []

            def client() -> None:
                with httpx.Client(timeout=1200) as http:
                    for _ in range(rounds):
                        t0 = time.perf_counter()
                        r = http.get(query)
                        times.append(time.perf_counter() - t0)
                        codes.append(r.status_code)

            began = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - began
            stop.set()
            sampler.join()
            mib = 2**20
            passed = peak[0] < 300 * mib and set(codes) == {200} and over.status_code == 400
            statuses = {c: codes.count(c) for c in sorted(set(codes))}
            print(
                f"rss of trends serve (answer cache off): at rest {at_rest / mib:.0f} MiB, peak "
                f"{peak[0] / mib:.0f} MiB under {clients} x {rounds} /summary over {rows:,} speed minutes at once; "
                f"statuses {statuses}, request p50 {statistics.median(times):.1f} s, "
                f"max {max(times):.1f} s, wall {wall:.1f} s; a window 20% longer: {over.status_code} "
                f"({over.json().get('detail', '')[:60]}...) -> goal < 300 MiB with every answer 200 "
                f"{'✔' if passed else '✘'}"
            )
            return passed
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        if keyspace is None:
            with session(base) as sess:
                sess.execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra.keyspace}")


SMOKE = {  # --smoke: every step and check of the bench on tiny sizes (a few seconds of measuring)
    "days": 2,
    "events": 40,
    "items": 200,
    "runs": 5,
    "warmup": 1,
    "clients": [2],
    "workers": 1,
    "http_seconds": 1.0,
    "state_max_age_ms": [250],
    "rss_rounds": 1,
    "write_concurrency": 64,  # small rows: the fill waits on the commit log's group window, not on Cassandra's CPU
}
SMOKE_RSS_MB = 2.0  # serving.max_read_mb of the smoke's RSS check: ~60 rows of 3000-event sketches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=14, help="days filled (trending over W needs 2 W)")
    parser.add_argument("--events", type=int, default=3000, help="events per minute of the sketches")
    parser.add_argument("--items", type=int, default=5000, help="distinct items the events draw from")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs before each timed series")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--workers", type=int, default=2, help="worker processes of trends serve")
    parser.add_argument("--http-seconds", type=float, default=20.0)
    parser.add_argument(
        "--state-max-age-ms", type=int, nargs="+", default=[0, 250], help="serving.state_max_age_ms of HTTP runs"
    )
    parser.add_argument("--write-concurrency", type=int, default=8, help="concurrent writes of the fill")
    parser.add_argument("--rss", action=argparse.BooleanOptionalAction, default=True, help="the RSS measurement")
    parser.add_argument("--rss-only", action="store_true", help="only the RSS measurement")
    parser.add_argument("--rss-rounds", type=int, default=2, help="expensive requests per client")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny sizes, every check kept (CI): {SMOKE}, the RSS check under serving.max_read_mb {SMOKE_RSS_MB:g}",
    )
    args = parser.parse_args()
    base = Settings()
    if args.smoke:
        vars(args).update(SMOKE)
        base = base.model_copy(update={"serving": base.serving.model_copy(update={"max_read_mb": SMOKE_RSS_MB})})
    print(
        f"serving bench at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {os.cpu_count()} cores, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}{' (smoke: tiny sizes, figures not comparable)' * args.smoke}"
    )
    if args.rss_only:
        sys.exit(0 if rss_bench(base, 8, args.rss_rounds, args.write_concurrency) else 1)
    settings = bench_settings(base, f"bench_serving_{uuid.uuid4().hex[:6]}", args.write_concurrency)
    migrations.migrate(settings)
    problems: list[str] = []
    try:
        # first, the RSS under its own speed query in the same keyspace (one migration and one drop, not two)
        if args.rss and not rss_bench(base, 8, args.rss_rounds, args.write_concurrency, keyspace=settings):
            problems.append("rss: the most expensive request's check failed")
        end = floor(datetime.now(UTC), MINUTE)
        t0 = time.monotonic()
        filled = fill(settings, end, args.days, args.events, args.items)
        print(f"filled {args.days} days in {time.monotonic() - t0:.0f} s; batch watermark {filled.watermark:%H:%M}")
        measured = 0
        for label, window in WINDOWS.items():
            if 2 * window > args.days * DAY:
                print(f"trending {label:>3}: skipped (needs --days >= {2 * window / DAY:g})")
                continue
            in_process(settings, filled, label, args.runs, args.warmup)
            measured += 1
        if not measured:
            raise BenchError(f"no window measured: --days {args.days} is too short for trending over 1 h")
        if args.days >= 2:
            for age in args.state_max_age_ms:
                problems += http_bench(settings, filled, args.clients, args.http_seconds, args.workers, age)
        else:
            print("http: skipped (needs --days >= 2: trending over 24 h)")
    finally:
        with session(base) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra.keyspace}")
    if problems:
        raise BenchError("; ".join(problems))


if __name__ == "__main__":
    main()
