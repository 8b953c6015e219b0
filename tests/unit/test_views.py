"""The views definition on small frames with exact expected answers (Spark, no services)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import datasketches as ds
import pytest

from views.aggregation import GLOBAL_SLICE, VIEW_COLUMNS, aggregate, rollup

pytestmark = pytest.mark.spark

SCHEMA = "id string, ts timestamp, item string, user string, value double, dims map<string,string>"


def t(minute: int, second: int = 0, hour: int = 10) -> datetime:
    return datetime(2026, 5, 1, hour, minute, second, tzinfo=UTC)


EVENTS = [
    ("e1", t(0, 5), "#a", "u1", 1.0, {"origin": "JFK"}),
    ("e2", t(0, 15), "#a", "u2", 2.0, {"origin": "JFK"}),
    ("e3", t(0, 59), "#b", "u1", 3.0, {"origin": "LAX"}),
    ("e4", t(1, 0), "#a", "u3", None, {}),
    ("e5", t(1, 30), "#c", None, 10.0, {"origin": "JFK", "carrier": "AA"}),
    ("e6", t(0, 0, hour=11), "#c", "u9", 5.0, {}),
]


def fi_items(blob: bytes) -> dict[str, int]:
    sketch = ds.frequent_strings_sketch.deserialize(bytes(blob))
    return {
        item: est for item, est, _lo, _hi in sketch.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
    }


def rows_by_key(df: Any) -> dict[tuple[datetime, str], Any]:
    return {(r.bucket_start.replace(tzinfo=UTC), r.slice): r for r in df.collect()}


def test_minute_buckets_per_slice(spark: Any) -> None:
    events = spark.createDataFrame(EVENTS, SCHEMA)
    view = aggregate(events, slice_dims=["origin"])
    assert tuple(view.columns) == VIEW_COLUMNS
    rows = rows_by_key(view)
    assert set(rows) == {
        (t(0), GLOBAL_SLICE), (t(0), "origin=JFK"), (t(0), "origin=LAX"),
        (t(1), GLOBAL_SLICE), (t(1), "origin=JFK"),
        (t(0, hour=11), GLOBAL_SLICE),
    }  # fmt: skip
    g0 = rows[(t(0), GLOBAL_SLICE)]
    assert g0.events == 3
    assert round(ds.hll_sketch.deserialize(bytes(g0.users_hll)).get_estimate()) == 2
    kll = ds.kll_doubles_sketch.deserialize(bytes(g0.values_kll))
    assert (kll.n, kll.get_min_value(), kll.get_max_value(), kll.get_quantile(0.5)) == (3, 1.0, 3.0, 2.0)
    assert fi_items(g0.items_fi) == {"#a": 2, "#b": 1}
    assert (g0.min_ts.replace(tzinfo=UTC), g0.max_ts.replace(tzinfo=UTC)) == (t(0, 5), t(0, 59))

    jfk1 = rows[(t(1), "origin=JFK")]
    assert jfk1.events == 1
    assert ds.hll_sketch.deserialize(bytes(jfk1.users_hll)).get_estimate() == 0  # the only event has no user
    assert fi_items(jfk1.items_fi) == {"#c": 1}
    g1 = rows[(t(1), GLOBAL_SLICE)]
    assert ds.kll_doubles_sketch.deserialize(bytes(g1.values_kll)).n == 1  # null values are not counted


def test_rollup_merges_minute_sketches(spark: Any) -> None:
    view = aggregate(spark.createDataFrame(EVENTS, SCHEMA), slice_dims=["origin"])
    hourly = rows_by_key(rollup(view, "hour"))
    assert set(hourly) == {
        (t(0), GLOBAL_SLICE), (t(0), "origin=JFK"), (t(0), "origin=LAX"), (t(0, hour=11), GLOBAL_SLICE),
    }  # fmt: skip
    h10 = hourly[(t(0), GLOBAL_SLICE)]
    assert h10.events == 5
    assert round(ds.hll_sketch.deserialize(bytes(h10.users_hll)).get_estimate()) == 3
    assert ds.kll_doubles_sketch.deserialize(bytes(h10.values_kll)).n == 4
    assert fi_items(h10.items_fi) == {"#a": 3, "#b": 1, "#c": 1}
    daily = rows_by_key(rollup(view, "day"))
    day = daily[(datetime(2026, 5, 1, tzinfo=UTC), GLOBAL_SLICE)]
    assert day.events == 6
    assert fi_items(day.items_fi) == {"#a": 3, "#b": 1, "#c": 2}
    assert (day.min_ts.replace(tzinfo=UTC), day.max_ts.replace(tzinfo=UTC)) == (t(0, 5), t(0, hour=11))


def test_ten_minute_rollup_splits_an_hour_by_ten(spark: Any) -> None:
    events = [
        ("a", t(9, 59), "#a", "u1", 1.0, {}),
        ("b", t(10, 0), "#a", "u2", 2.0, {}),
        ("c", t(19, 30), "#b", "u2", 3.0, {}),
        ("d", t(55), "#b", "u3", 4.0, {}),
    ]
    tens = rows_by_key(rollup(aggregate(spark.createDataFrame(events, SCHEMA), slice_dims=[]), "ten"))
    assert {k: r.events for k, r in tens.items()} == {
        (t(0), GLOBAL_SLICE): 1, (t(10), GLOBAL_SLICE): 2, (t(50), GLOBAL_SLICE): 1,
    }  # fmt: skip
    assert round(ds.hll_sketch.deserialize(bytes(tens[(t(10), GLOBAL_SLICE)].users_hll)).get_estimate()) == 1
    assert fi_items(tens[(t(10), GLOBAL_SLICE)].items_fi) == {"#a": 1, "#b": 1}
