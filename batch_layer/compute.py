"""The Spark side of a pass: read the plan's offsets from Kafka, transform, roll up, bring the rows to the driver."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from batch_layer.offsets import Plan
from batch_layer.transform import transform
from infra.errors import TrendsError
from infra.settings import Settings
from infra.spark import kafka_options
from views.event_avro import writer_schemas
from views.store.rows import ViewRow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def extract(spark: SparkSession, settings: Settings, plan: Plan) -> DataFrame:
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


@dataclass
class Computed:
    """The small results of one pass, on the driver."""

    minutes: dict[datetime, list[ViewRow]]
    hours: dict[datetime, list[ViewRow]]
    days: dict[date, list[ViewRow]]  # rollups of the days whose 24 hours are all in the pass
    read: int
    unparseable: Counter[datetime]
    outside: Counter[datetime]
    tens: dict[datetime, list[ViewRow]] = field(default_factory=dict)  # ten-minute rollups, by hour


def compute(spark: SparkSession, settings: Settings, plan: Plan, excluded: Collection[str] = ()) -> Computed:
    """Run the Spark side of a pass (one read of the records) and bring its small results to the driver.

    Minutes and hours are cached while their coarser rollups are computed from them, and come to the driver as
    Arrow batches: a year's pass is ~160k minute rows, whose pickled ``Row`` objects cost several times more
    than the columns (docs/benchmarks.md). With ``kafka.events_format`` ``avro`` the events topic's writer schemas
    are read from the registry at each pass, so a pass knows every version registered before it.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import rollup  # noqa: PLC0415

    hours = [h.hour for h in plan.hours]
    records = extract(spark, settings, plan)
    minutes, observed = transform(records, settings, hours, excluded, writer_schemas(settings))
    minutes = minutes.persist()
    hourly = None
    try:
        minute_rows = _view_rows(minutes.toArrow())
        ten_rows = _view_rows(rollup(minutes, "ten", settings.views.top_k_items).toArrow())
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
    for row in ten_rows:
        out.tens.setdefault(row.bucket_start.replace(minute=0, second=0, microsecond=0), []).append(row)
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
