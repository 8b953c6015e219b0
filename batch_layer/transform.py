"""The batch transform: a pass's Kafka records in, the minute view of its hours out (pure Spark, no I/O).

A record belongs to the hour its Kafka timestamp names; records are deduplicated by event id exactly, per hour,
and aggregated with the views' one definition (:func:`views.aggregation.aggregate`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from infra.settings import Settings
from views.buckets import HOUR

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation


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


def transform(
    records: DataFrame,
    settings: Settings,
    hours: Sequence[datetime],
    excluded: Collection[str] = (),
    avro: Mapping[int, str] | None = None,
) -> tuple[DataFrame, Observation]:
    """Return the minute view of the hours' events, deduplicated by id per hour, and the observation of the read.

    A record belongs to the hour its Kafka timestamp names (the index's hour; ingestion sets it to the event time),
    so every hour's result is the same whichever hours share its pass. A record of one of the hours whose event
    time lies in another hour is *outside* (counted in the lineage of its record's hour, not aggregated); one that
    does not parse is *unparseable*. Both are observed as the list of their hours (they are rare), during the one
    action that computes the minutes, so Kafka is read, parsed and deduplicated once.

    :arg excluded: the erased subjects' pseudonyms (:mod:`infra.privacy.exclusions`): their events are read and
        observed like the others (the read still matches the index) but never aggregated.
    :arg avro: the events topic's Avro writer schemas by id (:func:`views.event_avro.writer_schemas`); none: JSON.
    """
    from pyspark.sql import Observation  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import aggregate  # noqa: PLC0415
    from views.event_frames import EVENT_COLUMNS, parse_events, without_users  # noqa: PLC0415

    rec_hour = F.date_trunc("hour", F.col("timestamp"))
    wanted = records.select("value", "partition", "offset", rec_hour.alias("rec_hour")).where(
        _in_hours(F.col("rec_hour"), hours)
    )
    parsed = parse_events(wanted, keep=("partition", "offset", "rec_hour"), avro=avro)
    in_hour = F.col("parsed_ok") & (F.date_trunc("hour", F.col("ts")) == F.col("rec_hour"))
    epoch = F.unix_seconds(F.col("rec_hour"))
    observed = Observation("batch_read")
    parsed = parsed.observe(
        observed,
        F.count(F.lit(1)).alias("read"),
        F.collect_list(F.when(~F.col("parsed_ok"), epoch)).alias("unparseable"),
        F.collect_list(F.when(F.col("parsed_ok") & ~in_hour, epoch)).alias("outside"),
    )
    in_view = without_users(parsed.where(in_hour).select(*EVENT_COLUMNS, "partition", "offset", "rec_hour"), excluded)
    kept = dedupe(in_view, ("rec_hour", "id"))
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
