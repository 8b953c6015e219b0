"""Read and merge the views' sketches in Python, with the error bounds every answer must state.

The Spark side writes Apache DataSketches binaries (see :mod:`views.aggregation`); this module is the one place
that knows how to turn them into numbers with bounds. It needs no Spark.

Bounds (stated in answers, and what the tests check against):

* HLL, lg_k 12: relative standard error 1.62% (after unions too); :func:`users` gives the sketch's own bounds at
  the requested number of standard deviations.
* KLL (k 200): normalized rank error 1.33% at 99% confidence for a single quantile: a returned q-quantile has
  a true rank in q ± :func:`kll_rank_error`.
* Frequent items: each count is within [lower, upper] (both returned); an item not listed has a count of at most
  the sketch's maximum error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import datasketches as ds

from views.definition import HLL_LG_K, KLL_K

HLL_RSE = 1.04 / (2 ** (HLL_LG_K / 2))  # 1.625% for lg_k 12


@dataclass(frozen=True)
class Estimate:
    """A distinct-count estimate with bounds."""

    value: float
    lower: float
    upper: float


@dataclass(frozen=True)
class ItemCount:
    """An item's estimated count with guaranteed bounds."""

    item: str
    estimate: int
    lower: int
    upper: int


class SketchUnion:
    """Merge rows' sketches one row at a time, so a stream of rows is never held: HLL union, KLL, frequent items.

    The one place sketches are deserialized and merged: serving merges through it row by row, and the free functions
    below (a list of blobs at once) are built on it. Empty blobs (a sketch the read did not select) are skipped. The
    merge order is the order of :meth:`add`.
    """

    def __init__(self) -> None:
        self._hll: ds.hll_union | None = None
        self._kll: ds.kll_doubles_sketch | None = None
        self._items: ds.frequent_strings_sketch | None = None

    def add(self, hll: bytes, kll: bytes, items: bytes) -> None:
        """Merge one row's (users_hll, values_kll, items_fi)."""
        self.add_hll(hll)
        self.add_kll(kll)
        self.add_items(items)

    def add_hll(self, blob: bytes) -> None:
        """Merge one HLL sketch (order-independent)."""
        if blob:
            if self._hll is None:
                self._hll = ds.hll_union(HLL_LG_K)
            self._hll.update(ds.hll_sketch.deserialize(bytes(blob)))

    def add_kll(self, blob: bytes) -> None:
        """Merge one KLL doubles sketch."""
        if blob:
            sketch = ds.kll_doubles_sketch.deserialize(bytes(blob))
            if self._kll is None:
                self._kll = sketch
            else:
                self._kll.merge(sketch)

    def add_items(self, blob: bytes) -> None:
        """Merge one frequent-items sketch."""
        if blob:
            sketch = ds.frequent_strings_sketch.deserialize(bytes(blob))
            if self._items is None:
                self._items = sketch
            else:
                self._items.merge(sketch)

    def hll(self) -> ds.hll_sketch:
        """Return the HLL union as a sketch (an empty one when no row carried one)."""
        union = self._hll if self._hll is not None else ds.hll_union(HLL_LG_K)
        return union.get_result(ds.tgt_hll_type.HLL_8)

    def kll(self) -> ds.kll_doubles_sketch:
        """Return the merged KLL sketch (an empty one when no row carried one)."""
        return self._kll if self._kll is not None else ds.kll_doubles_sketch(KLL_K)

    @property
    def items(self) -> ds.frequent_strings_sketch | None:
        """Return the merged frequent-items sketch (None when no row carried one)."""
        return self._items

    def users(self, num_std_dev: int = 2) -> Estimate:
        """Return the distinct users of the union, with bounds at ``num_std_dev`` standard deviations."""
        sketch = self.hll()
        return Estimate(sketch.get_estimate(), sketch.get_lower_bound(num_std_dev), sketch.get_upper_bound(num_std_dev))

    def quantiles(self, ranks: Sequence[float]) -> list[float | None]:
        """Return the values at the given normalized ranks (None when no values were seen)."""
        if self._kll is None or self._kll.is_empty():
            return [None for _ in ranks]
        return [float(self._kll.get_quantile(r)) for r in ranks]

    def rank_error(self) -> float:
        """Return the normalized rank error (single quantile, 99% confidence) of the merged KLL sketch."""
        if self._kll is None or self._kll.is_empty():
            return float(ds.kll_doubles_sketch.get_normalized_rank_error(KLL_K, False))
        return float(self._kll.normalized_rank_error(False))

    def top_items(self, limit: int) -> tuple[list[ItemCount], int]:
        """Return the most frequent items with bounds, and the most any count can be off (items not listed too)."""
        return frequent(self._items, limit), items_max_error(self._items)

    def serialized(self) -> tuple[bytes, bytes, bytes]:
        """Return the merged (users_hll, values_kll, items_fi) to keep or merge again; empty where no row had one."""
        hll = bytes(self.hll().serialize_compact()) if self._hll is not None else b""
        kll = bytes(self._kll.serialize()) if self._kll is not None else b""
        items = bytes(self._items.serialize()) if self._items is not None else b""
        return hll, kll, items


def _union_of(blobs: Iterable[bytes], add: str) -> SketchUnion:
    union = SketchUnion()
    for blob in blobs:
        getattr(union, add)(blob)
    return union


def merge_hll(blobs: Iterable[bytes]) -> ds.hll_sketch:
    """Return the union of HLL sketches (order-independent)."""
    return _union_of(blobs, "add_hll").hll()


def users(blobs: Iterable[bytes], num_std_dev: int = 2) -> Estimate:
    """Return the distinct users of merged HLL sketches, with bounds at ``num_std_dev`` standard deviations."""
    return _union_of(blobs, "add_hll").users(num_std_dev)


def merge_kll(blobs: Iterable[bytes]) -> ds.kll_doubles_sketch:
    """Return the merge of KLL doubles sketches."""
    return _union_of(blobs, "add_kll").kll()


def quantiles(blobs: Iterable[bytes], ranks: Sequence[float]) -> list[float | None]:
    """Return the values at the given normalized ranks (None when no values were seen)."""
    return _union_of(blobs, "add_kll").quantiles(ranks)


def kll_rank_error(blobs: Iterable[bytes] | None = None) -> float:
    """Return the normalized rank error (single quantile, 99% confidence) of the merged sketch."""
    return _union_of(blobs or [], "add_kll").rank_error()


def merge_items(blobs: Iterable[bytes]) -> ds.frequent_strings_sketch | None:
    """Return the merge of frequent-items sketches (None when there are none)."""
    return _union_of(blobs, "add_items").items


def items_max_error(sketch: ds.frequent_strings_sketch | None) -> int:
    """Return the most any item's count can be off in a (merged) frequent-items sketch: ``ceil(epsilon * N)``.

    The one definition of the bound every answer states (items not listed included); 0 for no or an empty sketch.
    """
    if sketch is None or sketch.is_empty():
        return 0
    return math.ceil(float(sketch.epsilon) * float(sketch.total_weight))


def frequent(sketch: ds.frequent_strings_sketch | None, limit: int) -> list[ItemCount]:
    """Return the ``limit`` most frequent items of a merged sketch with their bounds (no false negatives)."""
    if sketch is None or sketch.is_empty():
        return []
    rows = sketch.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
    return [ItemCount(item, int(est), int(lo), int(hi)) for item, est, lo, hi in rows[:limit]]


def top_items(blobs: Iterable[bytes], limit: int) -> tuple[list[ItemCount], int]:
    """Return the most frequent items with bounds, and the maximum error of any count (items not listed included)."""
    return _union_of(blobs, "add_items").top_items(limit)


def merge_all(rows: Iterable[tuple[bytes, bytes, bytes]]) -> tuple[bytes, bytes, bytes]:
    """Merge (users_hll, values_kll, items_fi) triples into one triple of serialized sketches.

    HLL and KLL are serialized even when empty (a rollup row always carries both); items only when a row had some.
    """
    union = SketchUnion()
    for hll, kll, items in rows:
        union.add(hll, kll, items)
    merged = union.items
    return (
        bytes(union.hll().serialize_compact()),
        bytes(union.kll().serialize()),
        bytes(merged.serialize()) if merged is not None else b"",
    )
