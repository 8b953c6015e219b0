"""The one definition of the views, imported by the speed layer (streaming) and the batch layer (batch).

Input is the parsed event frame (``id, ts, item, user, value, dims``); output is one row per event-time bucket and
slice with an exact count and three mergeable sketches computed natively in the JVM (Apache DataSketches binary
format, readable by the Python ``datasketches`` package):

====================  ==========================================  =========================================
column                Spark function                              Python reader
====================  ==========================================  =========================================
``events``            ``count(*)``                                exact
``users_hll``         ``hll_sketch_agg(user, 12)``                ``datasketches.hll_sketch.deserialize``
``values_kll``        ``kll_sketch_agg_double(value)``            ``datasketches.kll_doubles_sketch.deserialize``
``items_fi``          ``approx_top_k_accumulate(item, n).sketch`` ``datasketches.frequent_strings_sketch.deserialize``
====================  ==========================================  =========================================

Every function here is a pure DataFrame -> DataFrame transform that works on both batch and streaming frames
(``window()`` is the bucket in both), so the two layers cannot drift apart (Summingbird's principle). The
definition's parameters and its fingerprint live in :mod:`views.definition`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from views.buckets import SPEED_ROLLUP
from views.definition import (
    BUCKET,
    DEFAULT_TOP_K_ITEMS,
    GLOBAL_SLICE,
    HLL_LG_K,
    VIEW_COLUMNS,
)

__all__ = ["BUCKET", "DEFAULT_TOP_K_ITEMS", "GLOBAL_SLICE", "HLL_LG_K", "VIEW_COLUMNS", "aggregate", "rollup"]

# approx_top_k_accumulate's state is a struct; only its binary sketch is stored. These are the other fields,
# needed to rebuild the state for approx_top_k_combine when minute sketches are merged into rollups.
_TOPK_ITEM_DDL = "item string not null"


def as_view(frame: DataFrame, **computed: Column) -> DataFrame:
    """Select :data:`VIEW_COLUMNS`, in their order: ``computed`` gives those not found under their name in ``frame``."""
    return frame.select(*[computed[c].alias(c) if c in computed else F.col(c) for c in VIEW_COLUMNS])


def slice_of(dim: str, value: Column) -> Column:
    """Return the slice name of one dimension value (``origin=JFK``)."""
    return F.concat(F.lit(f"{dim}="), value)


def with_slices(events: DataFrame, slice_dims: Sequence[str]) -> DataFrame:
    """Add a ``slice`` column: every event once in the global slice and once per configured dimension it carries.

    An event without a configured dimension (or with it null) only counts in the global slice.
    """
    names = [F.lit(GLOBAL_SLICE)]
    names += [
        F.when(F.col("dims").getItem(dim).isNotNull(), slice_of(dim, F.col("dims").getItem(dim))) for dim in slice_dims
    ]
    sliced = events.withColumn("slice", F.explode(F.array(*names)))
    return sliced.where(F.col("slice").isNotNull())


def aggregate(events: DataFrame, slice_dims: Sequence[str], top_k_items: int = DEFAULT_TOP_K_ITEMS) -> DataFrame:
    """Aggregate events into the view: one row per (1-minute event-time bucket, slice).

    Works unchanged on a streaming frame with a watermark on ``ts`` (the window is the state key, so Spark can
    drop finished buckets from state).

    :arg slice_dims: dimension names that get a slice of their own besides the global one.
    :arg top_k_items: items tracked by the frequent-items sketch (its error is about 3.5/that x N).
    :returns: a frame with :data:`VIEW_COLUMNS`.
    """
    sliced = with_slices(events, slice_dims)
    grouped = sliced.groupBy(F.window("ts", BUCKET).alias("bucket"), "slice")
    aggregated = grouped.agg(
        F.count(F.lit(1)).alias("events"),
        F.hll_sketch_agg("user", HLL_LG_K).alias("users_hll"),
        F.kll_sketch_agg_double("value").alias("values_kll"),
        F.expr(f"approx_top_k_accumulate(item, {int(top_k_items)})").alias("items_state"),
        F.min("ts").alias("min_ts"),
        F.max("ts").alias("max_ts"),
    )
    return as_view(aggregated, bucket_start=F.col("bucket.start"), items_fi=F.col("items_state.sketch"))


def items_state(sketch: Column, top_k_items: int) -> Column:
    """Rebuild the approx_top_k state struct around a stored frequent-items sketch."""
    return F.struct(
        sketch.alias("sketch"),
        F.lit(int(top_k_items)).alias("maxItemsTracked"),
        F.lit(None).cast("string").alias("itemDataType"),
        F.lit(_TOPK_ITEM_DDL).alias("itemDataTypeDDL"),
    )


def rollup(
    buckets: DataFrame, unit: Literal["ten", "hour", "day"], top_k_items: int = DEFAULT_TOP_K_ITEMS
) -> DataFrame:
    """Merge view rows into coarser buckets (ten minutes, hours or days) by merging their sketches, not the events.

    :returns: a frame with :data:`VIEW_COLUMNS`, ``bucket_start`` truncated to the unit.
    """
    prepared = buckets.withColumn("_items_state", items_state(F.col("items_fi"), top_k_items))
    if unit == "ten":  # views.buckets.SPEED_ROLLUP: the ten minutes both views roll up by
        start = F.window("bucket_start", f"{int(SPEED_ROLLUP.total_seconds() // 60)} minutes").start
    else:
        start = F.date_trunc(unit, "bucket_start")
    grouped = prepared.groupBy(start.alias("bucket_start"), "slice")
    merged = grouped.agg(
        F.sum("events").alias("events"),
        F.hll_union_agg("users_hll").alias("users_hll"),
        F.kll_merge_agg_double("values_kll").alias("values_kll"),
        F.expr(f"approx_top_k_combine(_items_state, {int(top_k_items)})").alias("items_state"),
        F.min("min_ts").alias("min_ts"),
        F.max("max_ts").alias("max_ts"),
    )
    return as_view(merged, items_fi=F.col("items_state.sketch"))
