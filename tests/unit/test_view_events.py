"""Parsing Kafka records with the schema derived from the event model (Spark, no services)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from views.event import Event
from views.events import EVENT_COLUMNS, parse_events, valid_events

pytestmark = pytest.mark.spark


def test_normalized_events_parse_and_garbage_is_flagged(spark: Any) -> None:
    good = Event(id="e1", ts="2026-05-01T10:00:01.250Z", item="#a", user="u", value=2.5, dims={"origin": "JFK"})
    minimal = Event(ts=1777629600, item="#b")
    records = [
        (good.to_json(), 0, 0),
        (minimal.to_json(), 0, 1),
        (b"{broken", 1, 0),
        (b'{"v":1,"ts":"2026-05-01T10:00:00.000Z"}', 1, 1),  # no id, no item
    ]
    frame = spark.createDataFrame(records, "value binary, partition int, offset long")
    parsed = parse_events(frame)
    rows = {(r.partition, r.offset): r for r in parsed.collect()}
    assert [rows[k].parsed_ok for k in sorted(rows)] == [True, True, False, False]
    r = rows[(0, 0)]
    assert (r.id, r.item, r.user, r.value, r.dims) == ("e1", "#a", "u", 2.5, {"origin": "JFK"})
    assert r.ts.replace(tzinfo=UTC) == datetime(2026, 5, 1, 10, 0, 1, 250000, tzinfo=UTC)
    m = rows[(0, 1)]
    assert (m.id, m.user, m.value, m.dims) == (minimal.id, None, None, None)
    assert m.ts.replace(tzinfo=UTC) == datetime.fromtimestamp(1777629600, UTC)
    assert tuple(valid_events(parsed).columns) == EVENT_COLUMNS
    assert valid_events(parsed).count() == 2


def _from_json_calls(frame: Any) -> int:
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return int(plan.count("from_json("))


def test_each_record_is_parsed_once_whatever_the_filters(spark: Any) -> None:
    """Filters on the event's fields must not be pushed below the parse (each would re-parse the record)."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(b"{}", 0, 0)], "value binary, partition int, offset long")
    parsed = parse_events(frame)
    in_hour = F.col("parsed_ok") & (F.col("ts") >= F.lit(datetime(2026, 5, 1, tzinfo=UTC)))
    assert _from_json_calls(valid_events(parsed)) == 1
    assert _from_json_calls(parsed.where(in_hour).where(F.col("item") != "x").select(*EVENT_COLUMNS)) == 1
