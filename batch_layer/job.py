"""The batch layer: recompute closed hours from exactly the Kafka offsets that hold them, many hours per Spark pass.

index (bring the event-time index up to date) -> plan (the hours' indexed spans, in chunks bounded by events and
hours) -> per chunk: extract (Kafka batch source over the chunk's ranges, ``failOnDataLoss``) -> transform (keep
each record in the hour its timestamp names, parse, dedupe ids exactly per hour, the shared
:func:`views.aggregation.aggregate`, hourly and daily rollups by merging the minute sketches) -> load (a new
version per hour, pointer swaps, daily rollups, lineage per hour). An hour with no records completes with an empty
version. The same code serves ``trends batch run``, the hourly DAG and the backfill DAG; running it again for an
hour replaces the hour's version and gives the same numbers, whatever the chunking.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch_layer import index, offsets
from batch_layer.index import IndexStore
from batch_layer.store import BatchStore, new_run_id
from infra.cassandra import session
from infra.errors import TrendsError
from infra.settings import Settings
from infra.spark import kafka_options
from views.buckets import HOUR
from views.store.losses import Loss, LossStore, losses_json
from views.store.pointers import PointerStore
from views.store.rows import ViewRow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What one hour's run did (also written to the lineage table)."""

    hour: datetime
    run_id: str
    offsets: str
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    watermark: datetime | None = None

    def line(self) -> str:
        """Return a one-line summary."""
        c = self.counts
        return (
            f"{self.hour:%Y-%m-%dT%H:%MZ} run {self.run_id[:8]}: read {c.get('read', 0)}, kept {c.get('kept', 0)} "
            f"(deduped {c.get('deduped', 0)}, late {c.get('late', 0)}, outside {c.get('outside', 0)}, "
            f"unparseable {c.get('unparseable', 0)}), {c.get('slices', 0)} slices in {self.seconds:.1f} s"
        )


@dataclass
class Progress:
    """Where a multi-hour recompute is, after each chunk."""

    chunk: int
    chunks: int
    hours_done: int
    hours: int
    events: int
    seconds: float

    def line(self) -> str:
        """Return the progress line: hours done of total, events, rate, ETA."""
        rate = self.events / self.seconds if self.seconds > 0 else 0.0
        left = self.hours - self.hours_done
        eta = self.seconds / self.hours_done * left if self.hours_done else 0.0
        return (
            f"chunk {self.chunk}/{self.chunks}: {self.hours_done}/{self.hours} hours, {self.events:,} events "
            f"in {self.seconds:.1f} s ({rate:,.0f} events/s), ETA {eta:.0f} s"
        )


def hours_between(start: datetime, end: datetime) -> Iterator[datetime]:
    """Yield the UTC hours of ``[start, end)``.

    :raises TrendsError: when the bounds are not whole hours or are reversed.
    """
    for name, ts in (("start", start), ("end", end)):
        if ts.tzinfo is None:
            msg = f"--{name} needs a time zone (e.g. 2026-05-01T10:00Z)"
            raise TrendsError(msg)
        if ts.minute or ts.second or ts.microsecond:
            msg = f"--{name} {ts.isoformat()} is not a whole hour: intervals are UTC hours"
            raise TrendsError(msg)
    if end <= start:
        msg = f"the interval is empty or reversed: {start.isoformat()} .. {end.isoformat()}"
        raise TrendsError(msg)
    hour = start.astimezone(UTC)
    while hour < end:
        yield hour
        hour += HOUR


def code_version(settings: Settings) -> str:
    """Return the code version recorded in the lineage: the setting, else package version + git commit."""
    if settings.batch.code_version:
        return settings.batch.code_version
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        ver = version("trends")
    except PackageNotFoundError:
        ver = "unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH, optional
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{ver}+{sha}" if sha else ver


def chunks(
    hours: Sequence[datetime], records: dict[datetime, int], max_events: int, max_hours: int
) -> list[list[datetime]]:
    """Split hours (in order) into passes of at most ``max_hours`` hours and about ``max_events`` records.

    Whole days stay in one pass where they fit (a pass then writes their daily rollups itself, and passes running
    side by side never re-merge the same day); a day too big for one pass is split by hours. An hour is never
    split: an hour holding more than ``max_events`` records is a pass of its own.
    """
    days: dict[date, list[datetime]] = {}
    for hour in hours:
        days.setdefault(hour.date(), []).append(hour)
    out: list[list[datetime]] = []
    current: list[datetime] = []
    events = 0

    def fits(n_hours: int, n_events: int) -> bool:
        return not current or (len(current) + n_hours <= max_hours and events + n_events <= max_events)

    for day_hours in days.values():
        day_events = sum(records.get(h, 0) for h in day_hours)
        if len(day_hours) <= max_hours and day_events <= max_events:
            if not fits(len(day_hours), day_events):
                out.append(current)
                current, events = [], 0
            current += day_hours
            events += day_events
            continue
        for hour in day_hours:  # a day bigger than a pass: by hours
            n = records.get(hour, 0)
            if not fits(1, n):
                out.append(current)
                current, events = [], 0
            current.append(hour)
            events += n
    if current:
        out.append(current)
    return out


def taper(passes: list[list[datetime]], fraction: float = 0.25) -> list[list[datetime]]:
    """Split a short first pass off the first one and a short last pass off the last one (whole days).

    A pass's writes run beside the next pass's Spark, except for the first pass's Spark and the last pass's writes,
    which nothing overlaps: short ones there shorten the whole run. A pass of one day stays as it is.
    """

    def split(hours: list[datetime], head: bool) -> list[list[datetime]]:
        days = sorted({h.date() for h in hours})
        if len(days) < 2:
            return [hours]
        n = max(1, round(len(days) * fraction))
        cut = set(days[:n] if head else days[-n:])
        part, rest = [h for h in hours if h.date() in cut], [h for h in hours if h.date() not in cut]
        return [part, rest] if head else [rest, part]

    if not passes:
        return []
    out = [*split(passes[0], head=True), *passes[1:]]
    return [*out[:-1], *split(out[-1], head=False)]


def extract(spark: SparkSession, settings: Settings, plan: offsets.Plan) -> DataFrame:
    """Read exactly the plan's offset ranges (one Kafka read per range of a partition, unioned); fail if any is gone."""
    frames = [
        spark.read.format("kafka")
        .options(**kafka_options(settings.kafka))
        .option("assign", assign)
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .option("failOnDataLoss", "true")
        .load()
        for assign, starting, ending in plan.reads()
    ]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def dedupe(events: DataFrame, by: Sequence[str] = ("id",)) -> DataFrame:
    """Keep one record per event id (within ``by``), exactly: the earliest by (partition, offset).

    Deterministic, so a rerun keeps the same records even when duplicates differ. A window needs one shuffle and
    one sort by id; ``dropDuplicates``' ``first()`` over string columns planned a sort aggregate on both sides of
    the shuffle (slower, see docs/benchmarks.md).
    """
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    first = Window.partitionBy(*by).orderBy("partition", "offset")
    return events.withColumn("_nth", F.row_number().over(first)).where(F.col("_nth") == 1).drop("_nth")


def transform(records: DataFrame, settings: Settings, hours: Sequence[datetime]) -> tuple[DataFrame, Observation]:
    """Return the minute view of the hours' events, deduplicated by id per hour, and the observation of the read.

    A record belongs to the hour its Kafka timestamp names (the index's hour; ingestion sets it to the event time),
    so every hour's result is the same whichever hours share its pass. A record of one of the hours whose event
    time lies in another hour is *outside* (counted in the lineage of its record's hour, not aggregated); one that
    does not parse is *unparseable*. Both are observed as the list of their hours (they are rare), during the one
    action that computes the minutes, so Kafka is read, parsed and deduplicated once.
    """
    from pyspark.sql import Observation  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import aggregate  # noqa: PLC0415
    from views.events import EVENT_COLUMNS, parse_events  # noqa: PLC0415

    rec_hour = F.date_trunc("hour", F.col("timestamp"))
    wanted = records.select("value", "partition", "offset", rec_hour.alias("rec_hour")).where(
        _in_hours(F.col("rec_hour"), hours)
    )
    parsed = parse_events(wanted, keep=("partition", "offset", "rec_hour"))
    in_hour = F.col("parsed_ok") & (F.date_trunc("hour", F.col("ts")) == F.col("rec_hour"))
    epoch = F.unix_seconds(F.col("rec_hour"))
    observed = Observation("batch_read")
    parsed = parsed.observe(
        observed,
        F.count(F.lit(1)).alias("read"),
        F.collect_list(F.when(~F.col("parsed_ok"), epoch)).alias("unparseable"),
        F.collect_list(F.when(F.col("parsed_ok") & ~in_hour, epoch)).alias("outside"),
    )
    kept = dedupe(parsed.where(in_hour).select(*EVENT_COLUMNS, "partition", "offset", "rec_hour"), ("rec_hour", "id"))
    minutes = aggregate(kept.select(*EVENT_COLUMNS), settings.views.slice_dims, settings.views.top_k_items)
    return minutes, observed


def _in_hours(column: Any, hours: Sequence[datetime]) -> Any:
    """Return ``column`` (an hour) in ``hours``, as a few ranges: a year of hours as literals is thousands of calls."""
    from functools import reduce  # noqa: PLC0415

    from pyspark.sql import functions as F  # noqa: PLC0415

    runs: list[list[datetime]] = []
    for h in sorted(hours):
        if runs and h == runs[-1][1]:
            runs[-1][1] = h + HOUR
        else:
            runs.append([h, h + HOUR])
    if len(runs) > 64:
        return column.isin([h for h in sorted(hours)])
    return reduce(lambda a, b: a | b, ((column >= F.lit(lo)) & (column < F.lit(hi)) for lo, hi in runs))


@dataclass
class Computed:
    """The small results of one pass, on the driver."""

    minutes: dict[datetime, list[ViewRow]]
    hours: dict[datetime, list[ViewRow]]
    days: dict[date, list[ViewRow]]  # rollups of the days whose 24 hours are all in the pass
    read: int
    unparseable: Counter[datetime]
    outside: Counter[datetime]


def compute(spark: SparkSession, settings: Settings, plan: offsets.Plan) -> Computed:
    """Run the Spark side of a pass (one read of the records) and bring its small results to the driver.

    Minutes and hours are cached while their coarser rollups are computed from them, and come to the driver as
    Arrow batches: a year's pass is ~160k minute rows, whose pickled ``Row`` objects cost several times more
    than the columns (docs/benchmarks.md).
    """
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import rollup  # noqa: PLC0415

    hours = [h.hour for h in plan.hours]
    records = extract(spark, settings, plan)
    minutes, observed = transform(records, settings, hours)
    minutes = minutes.persist()
    hourly = None
    try:
        minute_rows = _view_rows(minutes.toArrow())
        got = observed.get
        hourly = rollup(minutes, "hour", settings.views.top_k_items).persist()
        hour_rows = _view_rows(hourly.toArrow())
        wanted = set(hours)
        full = sorted({h.date() for h in hours if all(h.replace(hour=i) in wanted for i in range(24))})
        day_rows = []
        if full:
            in_full = F.to_date(F.col("bucket_start")).isin(full)
            day_rows = _view_rows(rollup(hourly.where(in_full), "day", settings.views.top_k_items).toArrow())
    finally:
        if hourly is not None:
            hourly.unpersist()
        minutes.unpersist()
    out = Computed({}, {}, {}, int(got["read"] or 0), Counter(), Counter())
    for row in minute_rows:
        out.minutes.setdefault(row.bucket_start.replace(minute=0, second=0, microsecond=0), []).append(row)
    for row in hour_rows:
        out.hours.setdefault(row.bucket_start, []).append(row)
    for row in day_rows:
        out.days.setdefault(row.bucket_start.date(), []).append(row)
    for name in ("unparseable", "outside"):
        getattr(out, name).update(datetime.fromtimestamp(s, UTC) for s in got[name] or [])
    if out.read != plan.records:
        msg = (
            f"the pass read {out.read} records of its hours where the index holds {plan.records}: the index is "
            "inconsistent with the topic (was the topic recreated? then the index must be dropped with it)"
        )
        raise TrendsError(msg)
    return out


def _view_rows(table: Any) -> list[ViewRow]:
    """Turn an Arrow table of :data:`views.aggregation.VIEW_COLUMNS` into view rows, column by column."""
    from views.aggregation import VIEW_COLUMNS  # noqa: PLC0415

    columns = [table.column(name).to_pylist() for name in VIEW_COLUMNS]
    return [ViewRow.from_spark(row) for row in zip(*columns, strict=True)]


def _counts(hp: offsets.HourPlan, done: Computed | None) -> dict[str, int]:
    from views.aggregation import GLOBAL_SLICE  # noqa: PLC0415

    hour_rows = done.hours.get(hp.hour, []) if done else []
    c = {
        "read": hp.records,
        "indexed": hp.records,
        "unparseable": done.unparseable[hp.hour] if done else 0,
        "outside": done.outside[hp.hour] if done else 0,
        "kept": sum(r.events for r in hour_rows if r.slice == GLOBAL_SLICE),
        "late": hp.late,
        "slices": len({r.slice for r in hour_rows}),
    }
    c["in_interval"] = c["read"] - c["unparseable"] - c["outside"]
    c["deduped"] = c["in_interval"] - c["kept"]
    return c


def load(
    store: BatchStore,
    plan: offsets.Plan,
    done: Computed | None,
    *,
    force: bool,
    code: str,
    accepted: dict[datetime, list[Loss]] | None = None,
) -> list[RunResult]:
    """Write a pass's versions, swap every hour's pointer, roll the days up and write each hour's lineage.

    :arg accepted: per hour, the losses the operator accepted for it: recorded in its lineage and, once the hour
        completed, marked accepted (the hour is no longer incomplete).
    """
    accepted = accepted or {}
    hours = [h.hour for h in plan.hours]
    days = sorted({h.date() for h in hours})
    before = {d: store.pointers.runs(d) for d in days}
    runs = {h: new_run_id() for h in hours}
    store.runs_started(
        [(hp.hour, runs[hp.hour], hp.hour + HOUR, plan.topic, hp.to_json(), force, code) for hp in plan.hours],
        {h: losses_json(ls) for h, ls in accepted.items() if h in runs},
    )
    try:
        if done is not None:
            store.rows.write_versions(runs, done.minutes, done.hours)
        store.pointers.swap([(hp.hour, runs[hp.hour], hp.records) for hp in plan.hours])
        # Days whose 24 hours are all in the pass have their rollups computed: written together, in one go.
        computed = {d for d in days if done is not None and d in done.days}
        if done is not None and computed:
            current = {d: dict(before[d]) for d in computed}
            slices: dict[date, Counter[str]] = {d: Counter() for d in computed}
            for h in hours:
                if h.date() in computed:
                    current[h.date()][h] = runs[h]
                    slices[h.date()].update(r.slice for r in done.hours.get(h, ()))
            store.write_days([(d, current[d], done.days[d], slices[d]) for d in sorted(computed)])
        for day in days:
            if day not in computed:
                store.remerge_day(day)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        store.runs_finished([(h, runs[h], "failed", {}, error) for h in hours])
        raise
    results = [RunResult(hp.hour, str(runs[hp.hour]), hp.to_json(), _counts(hp, done)) for hp in plan.hours]
    store.runs_finished([(r.hour, runs[r.hour], "completed", r.counts, None) for r in results])
    if accepted:
        store.losses.accept([(loss, h, runs[h]) for h in hours for loss in accepted.get(h, ())])
    for hour in hours:
        if hour in before[hour.date()]:
            store.delete_superseded(hour, store.settings.batch.keep_versions)
    return results


def recheck_stale(settings: Settings, idx: IndexStore, plan: offsets.Plan) -> int:
    """After the swaps: mark hours whose index grew while they were computed (the indexer may have checked first)."""
    totals = idx.hour_totals(plan.topic, {h.hour.date() for h in plan.hours})
    grown = {h.hour: totals[h.hour] for h in plan.hours if totals.get(h.hour, (0, 0))[0] > h.records}
    return idx.mark_stale(plan.topic, grown) if grown else 0


def _hours_of(start: datetime | None, end: datetime | None, hours: Sequence[datetime] | None) -> list[datetime]:
    if hours is None:
        if start is None or end is None:
            msg = "give start and end, or hours"
            raise TrendsError(msg)
        hours = list(hours_between(start, end))
    return sorted(set(hours))


def run(
    settings: Settings,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    hours: Sequence[datetime] | None = None,
    force: bool = False,
    spark: SparkSession | None = None,
    progress: Callable[[Progress], None] | None = None,
    index_first: bool = True,
    accept_loss: bool = False,
) -> list[RunResult]:
    """Recompute hours (``[start, end)`` or the given ones) in chunked Spark passes, then advance the watermark.

    :arg accept_loss: compute hours that records lost before indexing may belong to, recording the accepted loss
        in their lineage (which makes them whole again).
    :raises offsets.IntervalNotClosedError: when the last hour may still receive events (unless ``force``).
    :raises offsets.LossNotAcceptedError: when some hour is incomplete (unless ``accept_loss``); nothing is run.
    :raises offsets.DataLossError: when Kafka no longer holds a chunk's offsets (earlier chunks stay done).
    """
    hours = _hours_of(start, end, hours)
    if not hours:
        return []
    topic = settings.kafka.events_topic
    if index_first:
        index.run_index(settings)
    if not force:
        offsets.check_closed(index.horizon(settings), hours[-1] + HOUR, settings)
    t0 = time.monotonic()
    results: list[RunResult] = []
    with session(settings) as sess:
        idx, store = IndexStore(settings, sess), BatchStore(settings, sess)
        incomplete = _accepted_or_refused(store.losses, topic, hours, accept_loss)
        totals = idx.hour_totals(topic, {h.date() for h in hours})
        records = {h: totals.get(h, (0, 0))[0] for h in hours}
        passes = taper(chunks(hours, records, settings.batch.chunk_events, settings.batch.chunk_hours))
        runner = _Passes(settings, idx, store, force=force, spark=spark, accepted=incomplete)
        # Pass i's Cassandra writes run while Spark computes pass i + 1 (the driver and the JVM take turns).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-load") as loader:
            pending: Future[list[RunResult]] | None = None
            try:
                for i, chunk in enumerate(passes, 1):
                    plan, done = runner.compute(chunk)
                    if pending is not None:
                        results += pending.result()
                    pending = loader.submit(runner.load, plan, done)
                    if progress is not None and results:
                        progress(
                            Progress(i - 1, len(passes), len(results), len(hours), runner.events, time.monotonic() - t0)
                        )
                if pending is not None:
                    results += pending.result()
                    pending = None
                if progress is not None:
                    progress(
                        Progress(
                            len(passes), len(passes), len(results), len(hours), runner.events, time.monotonic() - t0
                        )
                    )
            finally:
                if pending is not None:
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        pending.result()
                runner.close()
        _low, mark = store.pointers.advance(hours[0])
    for r in results:
        r.watermark = mark
    return results


def incomplete_of(losses: LossStore, topic: str, hours: Sequence[datetime]) -> dict[datetime, list[Loss]]:
    """Return the hours (of ``hours``) that a loss not accepted for them may touch, with the losses."""
    if not hours:
        return {}
    wanted = set(hours)
    found = losses.incomplete(topic, min(hours), max(hours) + HOUR)
    return {h: ls for h, ls in found.items() if h in wanted}


def _accepted_or_refused(
    losses: LossStore, topic: str, hours: Sequence[datetime], accept_loss: bool
) -> dict[datetime, list[Loss]]:
    """Return the incomplete hours the run accepts the loss of; refuse them when it does not."""
    incomplete = incomplete_of(losses, topic, hours)
    if not accept_loss:
        offsets.refuse_loss(topic, incomplete)
    elif incomplete:
        logger.warning("accepting the loss for %s incomplete hour(s): %s", len(incomplete), _named(incomplete))
    return incomplete


def _named(incomplete: dict[datetime, list[Loss]]) -> str:
    return "; ".join(x.describe() for x in {x.key: x for ls in incomplete.values() for x in ls}.values())


class _Passes:
    """The passes of one :func:`run`: Spark's side (in the caller's thread) and Cassandra's (in the loader's)."""

    def __init__(
        self,
        settings: Settings,
        idx: IndexStore,
        store: BatchStore,
        *,
        force: bool,
        spark: SparkSession | None,
        accepted: dict[datetime, list[Loss]] | None = None,
    ) -> None:
        self.accepted = accepted or {}
        self.settings = settings
        self.idx = idx
        self.store = store
        self.force = force
        self.spark = spark
        self.own = False
        self.code = code_version(settings)
        self.events = 0

    def compute(self, chunk: list[datetime]) -> tuple[offsets.Plan, Computed | None]:
        """Plan a pass from the index and run its Spark side (nothing to run for hours without records)."""
        c0 = time.monotonic()
        plan = offsets.plan(self.settings, self.idx, chunk)
        done = None
        if plan.records:
            if self.spark is None:
                from infra.spark import get_spark  # noqa: PLC0415

                self.spark, self.own = get_spark(self.settings, "batch"), True
            done = compute(self.spark, self.settings, plan)
        logger.info(
            "pass of %s hours from %s: %s records in %s ranges, Spark %.1f s",
            len(chunk), chunk[0].isoformat(), plan.records, len(plan.ranges), time.monotonic() - c0,
        )  # fmt: skip
        return plan, done

    def load(self, plan: offsets.Plan, done: Computed | None) -> list[RunResult]:
        """Write a pass (versions, swaps, rollups, lineage) and notice hours that grew meanwhile."""
        c0 = time.monotonic()
        out = load(self.store, plan, done, force=self.force, code=self.code, accepted=self.accepted)
        recheck_stale(self.settings, self.idx, plan)
        seconds = time.monotonic() - c0
        for r in out:
            r.seconds = seconds / len(out)
            logger.debug("%s", r.line())
        self.events += plan.records
        logger.info("pass of %s hours from %s written in %.1f s", len(out), plan.hours[0].hour.isoformat(), seconds)
        return out

    def close(self) -> None:
        """Stop the Spark session if this run started it."""
        if self.own and self.spark is not None:
            self.spark.stop()


def advance(settings: Settings, hint: datetime) -> tuple[datetime | None, datetime | None]:
    """Advance the batch watermark over contiguous completed hours (``hint``: an hour just completed)."""
    with session(settings) as sess:
        return PointerStore(settings, sess).advance(hint)


def stale_hours(settings: Settings) -> dict[datetime, tuple[int, int]]:
    """Return hour -> (records indexed now, records its current run read) for every stale hour."""
    with session(settings) as sess:
        return IndexStore(settings, sess).stale(settings.kafka.events_topic)


def missing_hours(settings: Settings, below: datetime, limit: int) -> list[datetime]:
    """Return up to ``limit`` closed hours from the watermark up to ``below`` without a current run, oldest first."""
    if limit <= 0:
        return []
    with session(settings) as sess:
        pointers = PointerStore(settings, sess)
        _low, mark, _pinned = pointers.watermark()
        if mark is None or mark >= below:
            return []
        out: list[datetime] = []
        hour = mark
        cache: dict[date, dict[datetime, uuid.UUID]] = {}
        while hour < below and len(out) < limit:
            if not pointers.completed(hour, cache):
                out.append(hour)
            hour += HOUR
        return out


def plan_hourly(settings: Settings, hour: datetime, *, heal: bool = True) -> list[datetime]:
    """Return the hours an hourly DAG run computes: its own, missing closed hours below it, and stale ones.

    :arg heal: also the missing and stale hours below it (not in a backfill's runs: each hour has its own there).

    Missing and stale hours that are incomplete (records lost before indexing may belong to them) are left out and
    logged: healing them would complete them as if whole; they wait for an operator's ``--accept-loss``.

    :raises offsets.LossNotAcceptedError: when the run's own hour is incomplete (the run turns red).
    """
    limit = settings.batch.heal_max_hours if heal else 0
    topic = settings.kafka.events_topic
    missing = missing_hours(settings, hour, limit)
    stale = [h for h in stale_hours(settings) if h < hour][:limit] if limit else []
    healed = sorted({*missing, *stale} - {hour})
    with session(settings) as sess:
        incomplete = incomplete_of(LossStore(settings, sess), topic, [*healed, hour])
    if hour in incomplete:
        offsets.refuse_loss(topic, {hour: incomplete[hour]}, "`trends batch run --accept-loss`")
    if incomplete:
        logger.warning(
            "not healing %s incomplete hour(s) (%s .. %s): %s; `trends batch run --accept-loss` computes them",
            len(incomplete), min(incomplete).isoformat(), max(incomplete).isoformat(), _named(incomplete),
        )  # fmt: skip
    return sorted({hour, *(h for h in healed if h not in incomplete)})


def backfill_chunks(
    settings: Settings, start: datetime, end: datetime, *, only_missing: bool = False, accept_loss: bool = False
) -> list[str]:
    """Index the topic, refuse an open range, and return the chunks of ``[start, end)`` (JSON lists of hours).

    :raises offsets.IntervalNotClosedError: when the range's end is not closed yet.
    :raises offsets.LossNotAcceptedError: when some hour is incomplete and ``accept_loss`` is not given.
    """
    import json  # noqa: PLC0415

    hours = list(hours_between(start, end))
    index.run_index(settings)
    offsets.check_closed(index.horizon(settings), hours[-1] + HOUR, settings)
    topic = settings.kafka.events_topic
    with session(settings) as sess:
        idx, pointers = IndexStore(settings, sess), PointerStore(settings, sess)
        days = sorted({h.date() for h in hours})
        if only_missing:
            done = {h for d in days for h in pointers.runs(d)}
            hours = [h for h in hours if h not in done]
        if not accept_loss:
            offsets.refuse_loss(topic, incomplete_of(LossStore(settings, sess), topic, hours), "accept_loss")
        totals = idx.hour_totals(topic, days)
    records = {h: totals.get(h, (0, 0))[0] for h in hours}
    passes = chunks(hours, records, settings.batch.chunk_events, settings.batch.chunk_hours)
    logger.info("backfill of %s hours (%s records) in %s chunks", len(hours), sum(records.values()), len(passes))
    return [json.dumps([h.isoformat() for h in p]) for p in passes]
