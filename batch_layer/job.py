"""The batch layer: recompute one closed hour from exactly the Kafka offsets that hold it.

extract (Kafka batch source over the planned offset ranges, ``failOnDataLoss``) -> transform (parse, keep the
interval, dedupe ids exactly, the shared :func:`views.aggregation.aggregate`, hourly rollup by merging the
minute sketches) -> load (a new version of the interval, pointer swap, daily re-merge, lineage). The same
function serves ``trends batch run`` and the Airflow DAG; running it again for an interval replaces the
interval's version and gives the same numbers.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch_layer import offsets
from batch_layer.store import HOUR, BatchStore, ViewRow, new_run_id
from infra.cassandra import session
from infra.errors import TrendsError
from infra.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What one interval's run did (also written to the lineage table)."""

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


def extract(spark: SparkSession, settings: Settings, plan: offsets.OffsetPlan) -> DataFrame:
    """Read exactly the planned offsets (end exclusive); fail if any of them is gone."""
    starting, ending = plan.spark_offsets()
    return (
        spark.read.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", plan.topic)
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .option("failOnDataLoss", "true")
        .load()
    )


def dedupe(events: DataFrame) -> DataFrame:
    """Keep one record per event id, exactly: the earliest by (partition, offset).

    Deterministic, so a rerun keeps the same records even when duplicates differ. A window needs one shuffle and
    one sort by id; ``dropDuplicates``' ``first()`` over string columns planned a sort aggregate on both sides of
    the shuffle (~1 s more per 1M events).
    """
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    first = Window.partitionBy("id").orderBy("partition", "offset")
    return events.withColumn("_nth", F.row_number().over(first)).where(F.col("_nth") == 1).drop("_nth")


def transform(
    records: DataFrame, settings: Settings, start: datetime, end: datetime, plan: offsets.OffsetPlan
) -> tuple[DataFrame, dict[str, Observation]]:
    """Return the minute view of the interval's events, deduplicated by id, and the observations that count rows.

    The counts (read, unparseable, in the interval, kept, late) are observed while the one action that computes
    the minutes runs, so Kafka is read, parsed and deduplicated once without caching a million rows.
    """
    from pyspark.sql import Observation  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import aggregate  # noqa: PLC0415
    from views.events import EVENT_COLUMNS, parse_events  # noqa: PLC0415

    observed = {"read": Observation("batch_read"), "kept": Observation("batch_kept")}
    in_interval = F.col("parsed_ok") & (F.col("ts") >= F.lit(start)) & (F.col("ts") < F.lit(end))
    parsed = parse_events(records).observe(
        observed["read"],
        F.count(F.lit(1)).alias("read"),
        F.sum(F.when(F.col("parsed_ok"), 0).otherwise(1)).alias("unparseable"),
        F.sum(F.when(in_interval, 1).otherwise(0)).alias("in_interval"),
    )
    kept = dedupe(parsed.where(in_interval).select(*EVENT_COLUMNS, "partition", "offset"))
    interval_end = F.create_map(*(x for r in plan.ranges for x in (F.lit(r.partition), F.lit(r.interval_end))))
    late = F.col("offset") >= F.element_at(interval_end, F.col("partition"))
    kept = kept.observe(observed["kept"], F.count(F.lit(1)).alias("kept"), F.sum(late.cast("int")).alias("late"))
    minutes = aggregate(kept.select(*EVENT_COLUMNS), settings.views.slice_dims, settings.views.top_k_items)
    return minutes, observed


def hourly(spark: SparkSession, settings: Settings, minutes: list[Any], schema: Any) -> list[ViewRow]:
    """Roll the collected minute rows (a few thousand at most) up into hours with the shared merge."""
    from views.aggregation import rollup  # noqa: PLC0415

    if not minutes:
        return []
    frame = spark.createDataFrame(minutes, schema)
    return [ViewRow.from_spark(r) for r in rollup(frame, "hour", settings.views.top_k_items).collect()]


def compute(
    spark: SparkSession, settings: Settings, plan: offsets.OffsetPlan, start: datetime, end: datetime
) -> tuple[list[ViewRow], list[ViewRow], dict[str, int]]:
    """Run the Spark side of an interval (one pass over the records) and bring its small results to the driver."""
    records = extract(spark, settings, plan)
    minutes, observed = transform(records, settings, start, end, plan)
    collected = minutes.collect()
    read, kept = observed["read"].get, observed["kept"].get
    minute_rows = [ViewRow.from_spark(r) for r in collected]
    hour_rows = hourly(spark, settings, collected, minutes.schema)
    counts = {
        "read": int(read["read"] or 0),
        "unparseable": int(read["unparseable"] or 0),
        "in_interval": int(read["in_interval"] or 0),
        "kept": int(kept["kept"] or 0),
        "late": int(kept["late"] or 0),
        "slices": len({r.slice for r in hour_rows}),
    }
    counts["outside"] = counts["read"] - counts["unparseable"] - counts["in_interval"]
    counts["deduped"] = counts["in_interval"] - counts["kept"]
    return minute_rows, hour_rows, counts


def run_hour(spark: SparkSession, settings: Settings, hour: datetime, *, force: bool = False) -> RunResult:
    """Recompute one hour and make it the interval's current version.

    :raises offsets.IntervalNotClosedError: when the hour may still receive events (unless ``force``).
    :raises offsets.DataLossError: when Kafka no longer holds the hour's offsets.
    """
    t0 = time.monotonic()
    end = hour + HOUR
    topic = settings.kafka.events_topic
    lateness = timedelta(seconds=settings.batch.lateness_s)
    grace = max(timedelta(seconds=settings.batch.grace_s), lateness)
    if not force:
        offsets.check_closed(settings.kafka, topic, end, grace)
    plan = offsets.plan(settings.kafka, topic, hour, end, lateness)
    run_id = new_run_id()
    result = RunResult(hour, str(run_id), plan.to_json())
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        store.run_started(hour, run_id, end, topic, plan.to_json(), force, code_version(settings))
        try:
            minute_rows, hour_rows, counts = compute(spark, settings, plan, hour, end)
            store.write_version(hour, run_id, minute_rows, hour_rows)
            store.swap(hour, run_id)
            store.remerge_day(hour.date())
        except BaseException as exc:
            store.run_finished(hour, run_id, "failed", {}, f"{type(exc).__name__}: {exc}"[:2000])
            raise
        store.run_finished(hour, run_id, "completed", counts, None)
        store.delete_superseded(hour, settings.batch.keep_versions)
    result.counts = counts
    result.seconds = time.monotonic() - t0
    logger.info("%s", result.line())
    return result


def advance(settings: Settings, hint: datetime) -> tuple[datetime | None, datetime | None]:
    """Advance the batch watermark over contiguous completed hours (``hint``: an hour just completed)."""
    with session(settings) as sess:
        return BatchStore(settings, sess).advance_watermark(hint)


def run(
    settings: Settings, start: datetime, end: datetime, *, force: bool = False, spark: SparkSession | None = None
) -> list[RunResult]:
    """Recompute every hour of ``[start, end)`` in order, then advance the watermark; stop at the first refusal."""
    from infra.spark import get_spark  # noqa: PLC0415

    hours = list(hours_between(start, end))
    own = spark is None
    spark = spark or get_spark(settings, "batch")
    results = []
    try:
        for hour in hours:
            results.append(run_hour(spark, settings, hour, force=force))
            _low, mark = advance(settings, hour)
            results[-1].watermark = mark
    finally:
        if own:
            spark.stop()
    return results
