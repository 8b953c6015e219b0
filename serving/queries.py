"""Answers over a loaded window (:func:`serving.window.load`): counts, users, quantiles, top-N, trending, series.

Every answer carries its provenance (which spans came from which layer, the boundary, the speed layer's
freshness), its gaps, and its error bounds, so a reader can tell a fresh approximate figure from an exact one.

Trending score: ``lift = (recent + 1) / (baseline_upper * len(recent)/len(baseline) + 1)`` — the item's count in the
recent window against the upper bound of its count in the baseline window (so an item the baseline's sketch stopped
tracking cannot fake a rise) scaled to the same length, with one pseudo-event on both
sides so an item with no baseline gets a finite lift that grows with its recent count, and noise on tiny counts
cannot dominate. Items need ``min_support`` recent events; they rank by lift, then recent count.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NotRequired

import datasketches as ds
from typing_extensions import TypedDict

from serving.plan import RESOLUTIONS
from serving.provenance import Provenance
from serving.reader import SKETCH_FIELDS
from serving.window import Window
from views import sketches
from views.buckets import floor
from views.sketches import ItemCount

# The sketches each answer reads (the count is always read).
NEEDS: dict[str, tuple[str, ...]] = {
    "count": (),
    "users": ("users_hll",),
    "quantiles": ("values_kll",),
    "top": ("items_fi",),
    "trending": ("items_fi",),
    "series": (),
    "series_item": ("items_fi",),
    "summary": SKETCH_FIELDS,
}


@dataclass
class Summary:
    """Count, distinct users, value quantiles and top items of a window, with bounds and provenance."""

    start: datetime
    end: datetime
    slice: str
    events: int
    users: float
    users_lower: float
    users_upper: float
    users_rse: float
    quantiles: dict[str, float | None]
    quantile_rank_error: float
    top_items: list[ItemCount]
    items_max_error: int
    provenance: Provenance


def summary(w: Window, ranks: Sequence[float] = (0.5, 0.9, 0.99), top_n: int = 10) -> Summary:
    """Answer the window's count (exact), users (HLL), quantiles (KLL) and top-N items (frequent items)."""
    merged = w.merged.sketches
    users = merged.users(num_std_dev=2)
    return Summary(
        start=w.start,
        end=w.end,
        slice=w.slice,
        events=w.merged.events,
        users=users.value,
        users_lower=users.lower,
        users_upper=users.upper,
        users_rse=sketches.HLL_RSE,
        quantiles={str(r): q for r, q in zip(ranks, merged.quantiles(ranks), strict=True)},
        quantile_rank_error=merged.rank_error(),
        top_items=sketches.frequent(merged.items, top_n),
        items_max_error=sketches.items_max_error(merged.items),
        provenance=w.provenance,
    )


@dataclass
class Count:
    """The exact number of events in a window."""

    start: datetime
    end: datetime
    slice: str
    events: int
    provenance: Provenance


def count(w: Window) -> Count:
    """Answer the window's event count (exact: both views count every event once)."""
    return Count(w.start, w.end, w.slice, w.merged.events, w.provenance)


@dataclass
class Users:
    """Distinct users of a window: the HLL estimate and its 95% bounds."""

    start: datetime
    end: datetime
    slice: str
    users: float
    users_lower: float
    users_upper: float
    users_rse: float
    provenance: Provenance


def users(w: Window) -> Users:
    """Answer the window's distinct users from the union of its HLL sketches."""
    u = w.merged.sketches.users(num_std_dev=2)
    return Users(w.start, w.end, w.slice, u.value, u.lower, u.upper, sketches.HLL_RSE, w.provenance)


@dataclass
class Quantiles:
    """Value quantiles of a window at the asked ranks, with the KLL rank error."""

    start: datetime
    end: datetime
    slice: str
    quantiles: dict[str, float | None]
    quantile_rank_error: float
    provenance: Provenance


def quantiles(w: Window, ranks: Sequence[float] = (0.5, 0.9, 0.99)) -> Quantiles:
    """Answer value quantiles from the merged KLL sketches of the window."""
    merged = w.merged.sketches
    qs = {str(r): q for r, q in zip(ranks, merged.quantiles(ranks), strict=True)}
    return Quantiles(w.start, w.end, w.slice, qs, merged.rank_error(), w.provenance)


@dataclass
class Top:
    """The most frequent items of a window with their count bounds."""

    start: datetime
    end: datetime
    slice: str
    items: list[ItemCount]
    items_max_error: int
    provenance: Provenance


def top(w: Window, limit: int = 10) -> Top:
    """Answer the top-N items from the merged frequent-items sketches."""
    fi = w.merged.sketches.items
    items = sketches.frequent(fi, limit)
    return Top(w.start, w.end, w.slice, items, sketches.items_max_error(fi), w.provenance)


@dataclass
class TrendingItem:
    """One item's rise from the baseline to the recent window."""

    item: str
    recent: int
    baseline: int
    baseline_upper: int
    lift: float
    recent_lower: int
    recent_upper: int


@dataclass
class Trending:
    """Trending items with the windows, the score's definition and both windows' provenance."""

    recent_start: datetime
    recent_end: datetime
    baseline_start: datetime
    baseline_end: datetime
    slice: str
    items: list[TrendingItem]
    min_support: int
    items_max_error: int
    provenance: dict[str, Provenance] = field(default_factory=dict)
    score: str = "lift = (recent + 1) / (baseline_upper * len_recent / len_baseline + 1)"


def trending(recent: Window, baseline: Window, limit: int = 10, min_support: int = 5) -> Trending:
    """Rank items by their lift from the baseline window to the recent window."""
    key = ("trending", id(baseline.merged), baseline.start, baseline.end, limit, min_support)
    ranked = recent.merged.derived.get(key)
    if ranked is None:
        ranked = recent.merged.derived[key] = _rank(recent, baseline, limit, min_support)
    items, max_error = ranked
    return Trending(
        recent.start,
        recent.end,
        baseline.start,
        baseline.end,
        recent.slice,
        list(items),
        min_support,
        max_error,
        {"recent": recent.provenance, "baseline": baseline.provenance},
    )


def _rank(recent: Window, baseline: Window, limit: int, min_support: int) -> tuple[tuple[TrendingItem, ...], int]:
    """Return the ``limit`` items rising most and the recent sketch's maximum error (kept with the merged window)."""
    recent_fi = recent.merged.sketches.items
    base_fi = baseline.merged.sketches.items
    scale = (recent.end - recent.start) / (baseline.end - baseline.start)
    ranked: list[tuple[float, int, str, int, int, int]] = []
    max_error = 0
    if recent_fi is not None and not recent_fi.is_empty():
        max_error = sketches.items_max_error(recent_fi)
        upper = _upper_bounds(base_fi)
        for item, est, lo, hi in recent_fi.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES):
            if est < min_support:
                continue
            # The rise is measured against the most the baseline can hold: an item the baseline's sketch no longer
            # tracks reads 0 there, but may have had up to the sketch's maximum error.
            base_hi = upper(item)
            ranked.append((round((est + 1) / (base_hi * scale + 1), 4), int(est), item, base_hi, int(lo), int(hi)))
    best = heapq.nsmallest(limit, ranked, key=lambda t: (-t[0], -t[1], t[2]))
    items = tuple(
        TrendingItem(item, est, int(base_fi.get_estimate(item)) if base_fi is not None else 0, base_hi, lift, lo, hi)
        for lift, est, item, base_hi, lo, hi in best
    )
    return items, max_error


def _upper_bounds(fi: ds.frequent_strings_sketch | None) -> Callable[[str], int]:
    """Return the sketch's upper bound of any item, read once for all it tracks (a call per item costs more).

    A tracked item's bound is its counter plus the sketch's offset, an untracked one's the offset alone: the offset
    is the upper less the lower bound of any tracked item.
    """
    if fi is None:
        return lambda _item: 0
    listed = fi.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
    if not listed:
        return lambda item: int(fi.get_upper_bound(item))
    bounds = {item: int(hi) for item, _est, _lo, hi in listed}
    offset = int(listed[0][3] - listed[0][2])
    return lambda item: bounds.get(item, offset)


class SeriesPoint(TypedDict):
    """One point of a series: its count, or None when nothing answered there; ``gap`` only where gaps cut into it."""

    start: datetime
    count: int | None
    gap: NotRequired[bool]


@dataclass
class Series:
    """Counts per bucket at a chosen resolution (of one item, or of all events)."""

    start: datetime
    end: datetime
    slice: str
    resolution: str
    item: str | None
    points: list[SeriesPoint]
    provenance: Provenance


def series(w: Window, resolution: str = "hour", item: str | None = None) -> Series:
    """Return counts per bucket of a window loaded with ``coarsest`` = the resolution (or finer).

    :arg item: count only this item (frequent-items estimates, bounded by the sketches' error); the window was
        loaded with this ``item``, or with its rows kept.
    """
    step = RESOLUTIONS[resolution]
    counts: dict[datetime, int] = defaultdict(int)
    if w.merged.item == item:
        for t, n in w.merged.counts.items():
            counts[floor(t, step)] += n
    elif w.buckets:
        for b in w.buckets:
            if item is None:
                n = b.events
            else:
                n = int(ds.frequent_strings_sketch.deserialize(b.items_fi).get_estimate(item)) if b.items_fi else 0
            counts[floor(b.start, step)] += n
    elif w.merged.rows:
        msg = f"the window was merged for item {w.merged.item!r}, not {item!r}, and its rows were not kept"
        raise ValueError(msg)
    gaps = [(g["start"], g["end"]) for g in w.provenance.gaps]
    points: list[SeriesPoint] = []
    t = floor(w.start, step)
    while t < w.end:
        lo, hi = max(t, w.start), min(t + step, w.end)
        gap = sum(((min(hi, b) - max(lo, a)) for a, b in gaps if a < hi and lo < b), timedelta())
        if gap >= hi - lo:  # nothing answered here: no count, never a zero
            points.append(SeriesPoint(start=t, count=None, gap=True))
        elif gap:
            points.append(SeriesPoint(start=t, count=counts.get(t, 0), gap=True))
        else:
            points.append(SeriesPoint(start=t, count=counts.get(t, 0)))
        t += step
    return Series(w.start, w.end, w.slice, resolution, item, points, w.provenance)
