"""The batch transform on a small frame of Kafka records: counts, exact dedupe per hour, hours of a pass (Spark)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from batch_layer.transform import transform
from infra.settings import Settings
from views.aggregation import GLOBAL_SLICE
from views.event import Event
from views.sketches import top_items

pytestmark = pytest.mark.spark

H10, H11 = datetime(2026, 5, 1, 10, tzinfo=UTC), datetime(2026, 5, 1, 11, tzinfo=UTC)


def record(
    partition: int, offset: int, event_id: str, minute: int, item: str, hour: int = 10, stamp_hour: int | None = None
) -> tuple[bytes, int, int, datetime]:
    """A Kafka record whose timestamp is the event time (or, for a rogue producer, another hour)."""
    ts = datetime(2026, 5, 1, hour, minute, tzinfo=UTC)
    stamp = ts if stamp_hour is None else ts.replace(hour=stamp_hour)
    value = Event(id=event_id, ts=ts, item=item, user="u", value=1.0).to_json()
    return value, partition, offset, stamp.replace(tzinfo=None)


def test_duplicates_keep_the_earliest_record_per_hour_and_every_row_is_counted(spark: Any) -> None:
    records = [
        record(0, 0, "a", 1, "#a"),
        record(0, 1, "dup", 2, "#first"),  # the earliest record of "dup" in hour 10: kept
        record(1, 0, "b", 3, "#b"),
        record(1, 1, "dup", 2, "#other-partition"),
        record(0, 3, "dup", 2, "#again"),
        record(1, 2, "dup", 7, "#next-hour", hour=11),  # the same id in another hour: deduped per hour, kept
        record(1, 3, "rogue", 5, "#rogue", hour=12, stamp_hour=11),  # stamped 11:05, says 12:05: outside
        record(1, 4, "later", 5, "#not-this-pass", hour=12),  # an hour the pass does not compute: ignored
        (b"{broken", 1, 5, datetime(2026, 5, 1, 10, 30, tzinfo=UTC).replace(tzinfo=None)),
    ]
    frame = spark.createDataFrame(records, "value binary, partition int, offset long, timestamp timestamp")
    settings = Settings(views={"slice_dims": []})

    minutes, observed = transform(frame, settings, [H10, H11])
    rows = {r.bucket_start.replace(tzinfo=UTC): r for r in minutes.collect() if r.slice == GLOBAL_SLICE}

    assert {(t.hour, t.minute): r.events for t, r in rows.items()} == {(10, 1): 1, (10, 2): 1, (10, 3): 1, (11, 7): 1}
    items, _error = top_items([rows[H10.replace(minute=2)].items_fi], 5)
    assert [i.item for i in items] == ["#first"]
    got = observed.get
    assert got["read"] == 8
    h = {int(H10.timestamp()): "10", int(H11.timestamp()): "11"}
    assert Counter(h[s] for s in got["unparseable"]) == {"10": 1}
    assert Counter(h[s] for s in got["outside"]) == {"11": 1}
