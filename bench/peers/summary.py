"""One output row of any system in the peers bench, as the checker reads it.

Imported by the harness (the project's venv) and by the peers (their own venv): it needs only the Python
``datasketches`` package, so a peer that writes no blobs (the null sink) summarizes its own sketches with the same
code the harness uses on the blobs read back from Cassandra.

A summary is a plain dict: ``bucket`` (epoch seconds of the minute), ``slice``, ``events``, ``users`` (an exact
count, or an HLL estimate with its bounds), ``quantiles`` (q -> value, with the rank error the value may carry)
and ``top`` (the heaviest items with lower/upper bounds on their counts, and the bound on any unlisted item).
"""

from __future__ import annotations

import math
from typing import Any

import datasketches as ds

HLL_LG_K = 12  # views.aggregation.HLL_LG_K
KLL_K = 200  # views.sketches.KLL_K: Spark's kll_sketch_agg_double default
TOP_K_ITEMS = 1024  # views.aggregation.DEFAULT_TOP_K_ITEMS
# Spark's approx_top_k_accumulate(item, 1024) sizes its ItemsSketch at the power of two above 1024 / 0.75.
FI_LG_MAX_MAP_SIZE = 11
QUANTILES = (0.5, 0.99)
TOP_LISTED = 20
GLOBAL_SLICE = "*"


def slices(origin: str | None) -> list[str]:
    """Return the slices one event counts in: the global one and its origin's (views.aggregation.with_slices)."""
    return [GLOBAL_SLICE, f"origin={origin}"] if origin is not None else [GLOBAL_SLICE]


def of_sketches(
    bucket: int,
    slice_name: str,
    events: int,
    hll: ds.hll_sketch,
    kll: ds.kll_doubles_sketch,
    fi: ds.frequent_strings_sketch,
) -> dict[str, Any]:
    """Summarize one row made of the view's four parts."""
    users = {
        "estimate": hll.get_estimate(),
        "lower2": hll.get_lower_bound(2),
        "upper2": hll.get_upper_bound(2),
        "rse": 1.04 / math.sqrt(2**HLL_LG_K),
    }
    if kll.is_empty():
        quantiles: dict[str, Any] = {}
    else:
        eps = kll.normalized_rank_error(False)
        quantiles = {str(q): {"value": float(kll.get_quantile(q)), "rank_error": eps} for q in QUANTILES}
    rows = fi.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)[:TOP_LISTED]
    top = {
        "items": [{"item": r[0], "lower": int(r[2]), "upper": int(r[3])} for r in rows],
        "max_error": math.ceil(float(fi.epsilon) * float(fi.total_weight)) if not fi.is_empty() else 0,
    }
    return {"bucket": bucket, "slice": slice_name, "events": events, "users": users, "quantiles": quantiles, "top": top}


def of_blobs(bucket: int, slice_name: str, events: int, hll: bytes, kll: bytes, fi: bytes) -> dict[str, Any]:
    """Summarize a row whose sketches were stored as DataSketches binaries (Spark's, or a peer's)."""
    return of_sketches(
        bucket,
        slice_name,
        events,
        ds.hll_sketch.deserialize(bytes(hll)),
        ds.kll_doubles_sketch.deserialize(bytes(kll)),
        ds.frequent_strings_sketch.deserialize(bytes(fi)),
    )


def of_exact(
    bucket: int, slice_name: str, events: int, users: int, quantiles: dict[float, float], top: list[tuple[str, int]]
) -> dict[str, Any]:
    """Summarize a row of exact results (Flink SQL's built-ins: COUNT DISTINCT, PERCENTILE, a top-N)."""
    return {
        "bucket": bucket,
        "slice": slice_name,
        "events": events,
        "users": {"exact": users},
        "quantiles": {str(q): {"value": v, "rank_error": 0.0} for q, v in quantiles.items()},
        "top": {"items": [{"item": i, "lower": c, "upper": c} for i, c in top[:TOP_LISTED]], "max_error": 0},
    }


def new_sketches() -> tuple[ds.hll_sketch, ds.kll_doubles_sketch, ds.frequent_strings_sketch]:
    """Return empty sketches with the view's parameters."""
    return (
        ds.hll_sketch(HLL_LG_K, ds.tgt_hll_type.HLL_8),
        ds.kll_doubles_sketch(KLL_K),
        ds.frequent_strings_sketch(FI_LG_MAX_MAP_SIZE),
    )
