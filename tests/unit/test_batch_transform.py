"""The batch transform on a small frame of Kafka records: counts, exact dedupe, lateness (Spark, no services)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from batch_layer.job import transform
from batch_layer.offsets import OffsetPlan, PartitionRange
from infra.settings import Settings
from ingestion.model import Event
from views.aggregation import GLOBAL_SLICE
from views.sketches import top_items

pytestmark = pytest.mark.spark

START, END = datetime(2026, 5, 1, 10, tzinfo=UTC), datetime(2026, 5, 1, 11, tzinfo=UTC)


def record(
    partition: int, offset: int, event_id: str, minute: int, item: str, hour: int = 10
) -> tuple[bytes, int, int]:
    ts = datetime(2026, 5, 1, hour, minute, tzinfo=UTC)
    return Event(id=event_id, ts=ts, item=item, user="u", value=1.0).to_json(), partition, offset


def test_duplicates_keep_the_earliest_record_and_every_row_is_counted(spark: Any) -> None:
    records = [
        record(0, 0, "a", 1, "#a"),
        record(0, 1, "dup", 2, "#first"),  # the earliest record of "dup": kept
        record(1, 0, "b", 3, "#b"),
        record(1, 1, "dup", 2, "#other-partition"),
        record(0, 2, "c", 59, "#late"),  # arrived after the interval's end offset of partition 0: late, kept
        record(0, 3, "dup", 2, "#again"),
        record(1, 2, "out", 5, "#out", hour=11),  # outside the interval
        (b"{broken", 1, 3),
    ]
    frame = spark.createDataFrame(records, "value binary, partition int, offset long")
    plan = OffsetPlan("events", (PartitionRange(0, 0, 4, 2, 0, 4), PartitionRange(1, 0, 4, 4, 0, 4)))
    settings = Settings(views={"slice_dims": []})

    minutes, observed = transform(frame, settings, START, END, plan)
    rows = {r.bucket_start.replace(tzinfo=UTC).minute: r for r in minutes.collect() if r.slice == GLOBAL_SLICE}

    assert {m: r.events for m, r in rows.items()} == {1: 1, 2: 1, 3: 1, 59: 1}
    items, _error = top_items([rows[2].items_fi], 5)
    assert [i.item for i in items] == ["#first"]
    assert observed["read"].get == {"read": 8, "unparseable": 1, "in_interval": 6}
    assert observed["kept"].get == {"kept": 4, "late": 1}
