"""The per-row merge: a window's rows folded, as they stream in, into its count, sketches and counts per step.

Every path that merges rows goes through :meth:`Merged.add` (the reader's rows of an uncached answer, the answer
cache's batch part and settled speed part, the speed tail merged on top of them), and a part kept by the answer cache
is merged back with :meth:`Merged.add_part`, so there is one definition of what merging a row means.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import datasketches as ds

from serving.lru import ROW_OVERHEAD_BYTES
from serving.served_row import ServedRow
from views import sketches
from views.buckets import floor


@dataclass
class MergedPart:
    """Rows merged once and kept (by the answer cache): the counts and the union's sketches, serialized.

    :arg sketches: the union's (users_hll, values_kll, items_fi), serialized (empty where not read).
    """

    events: int
    rows: int
    counts: dict[datetime, int]
    sketches: tuple[bytes, bytes, bytes]
    sketch_bytes: int  # what reading these rows costs a request's budget

    @property
    def size(self) -> int:
        """Return the bytes it holds (approximately)."""
        return ROW_OVERHEAD_BYTES * (1 + len(self.counts)) + sum(map(len, self.sketches))


class Merged:
    """A window's rows merged as they stream in: the count, the sketches' union and the counts per bucket.

    Rows are not kept: an answer over a long window holds the merged sketches, never the window's rows.

    :arg item: merge only this item's estimate per bucket (a per-item series: no union needed).
    """

    def __init__(self, step: timedelta, item: str | None = None) -> None:
        self.step = step
        self.item = item
        self.events = 0
        self.rows = 0
        self.sketch_bytes = 0
        self.sketches = sketches.SketchUnion()
        self.counts: dict[datetime, int] = defaultdict(int)  # events per step (or the item's estimate)
        # answers derived from these merged sketches (a cached window is asked the same questions again)
        self.derived: dict[tuple[Any, ...], Any] = {}

    def add(self, b: ServedRow) -> None:
        """Merge one row."""
        self.events += b.events
        self.rows += 1
        self.sketch_bytes += b.sketch_bytes
        key = floor(b.start, self.step)
        if self.item is None:
            self.counts[key] += b.events
            self.sketches.add(b.users_hll, b.values_kll, b.items_fi)
        elif b.items_fi:
            self.counts[key] += int(ds.frequent_strings_sketch.deserialize(b.items_fi).get_estimate(self.item))

    def add_all(self, rows: Iterable[ServedRow]) -> Merged:
        """Merge rows as they stream in; return self."""
        for b in rows:
            self.add(b)
        return self

    def add_part(self, part: MergedPart) -> None:
        """Merge rows merged before (a kept part), as if its rows were merged here again."""
        self.events += part.events
        self.rows += part.rows
        self.sketch_bytes += part.sketch_bytes
        for t, n in part.counts.items():
            self.counts[t] += n
        if self.item is None:
            self.sketches.add(*part.sketches)

    def part(self) -> MergedPart:
        """Return what was merged as a part to keep (its sketches serialized)."""
        return MergedPart(self.events, self.rows, dict(self.counts), self.sketches.serialized(), self.sketch_bytes)

    @property
    def size(self) -> int:
        """Return roughly what it holds: its counts and its sketches serialized."""
        size = 200 * (1 + len(self.counts))
        items = self.sketches.items
        if items is not None:
            size += int(items.get_serialized_size_bytes())
        return size + 8 * 1024  # the HLL union (views.definition.HLL_LG_K: 12, ~4 KiB) and a merged KLL sketch
