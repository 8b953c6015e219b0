"""What a serving process keeps between requests, each keyed by what makes it true, so nothing kept can be stale.

* :class:`RowCache` — rows read from the views, in an LRU bounded in bytes. Batch rows are keyed by the run they
  belong to (immutable once current: a rerun changes the key, never the entry). Speed minutes are keyed by the
  epoch that owns the minute and the events it says it counted there (:func:`speed_key`): the speed layer writes the
  full cumulative state of a minute, then its count, so a row holding as many events as counted is that state, and a
  minute whose count moved has a new key (its old row is simply not asked for again).
* :class:`AnswerCache` — merged windows per question (the windows, the slice, the sketches, the resolution, the
  item), with the signature they were merged under: the plan (the boundary or pin, every span and gap with its
  reason, so a gap that appears — speed rows expiring at their hour's keep-until — changes it), the run of every
  batch hour merged (and the pointers' fingerprint of every daily rollup) and, per speed minute, its owning epoch
  and count. A repeated question whose signature is unchanged is a lookup; when only the speed part moved, the
  merged batch part is kept, and so is the merged part of the speed minutes older than the speed layer's lateness
  (final for their epoch): only the newer minutes are merged again, and only those whose count changed are read.

Provenance is never cached: every answer describes the coverage read for it (freshness, stale and incomplete hours).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from serving.merge import Layer, Resolution

ROW_OVERHEAD_BYTES = 200  # a cached row's object and key, besides its sketch bytes


@dataclass(frozen=True)
class Bucket:
    """One row of a view as a query sees it."""

    start: datetime
    resolution: Resolution
    layer: Layer
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes

    @property
    def sketch_bytes(self) -> int:
        """Return the bytes of its sketches (what a read budget counts)."""
        return len(self.users_hll) + len(self.values_kll) + len(self.items_fi)


def _size(rows: tuple[Bucket, ...]) -> int:
    return ROW_OVERHEAD_BYTES + sum(ROW_OVERHEAD_BYTES + b.sketch_bytes for b in rows)


V = TypeVar("V")


class _Lru(Generic[V]):
    """A thread-safe LRU bounded in bytes (the caller says what each value weighs); counts hits and misses."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        """Return the value of a key (most recently used now), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def _put(self, key: Hashable, value: V, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    @property
    def bytes(self) -> int:
        """Return the bytes held (sketches plus a fixed overhead per row and entry)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class RowCache(_Lru[tuple[Bucket, ...]]):
    """An LRU of view rows, bounded in bytes: key -> the rows (maybe none) one read returned."""

    def put(self, key: Hashable, rows: tuple[Bucket, ...]) -> None:
        """Keep the rows of a key, evicting the least recently used entries beyond ``max_bytes``."""
        self._put(key, rows, _size(rows))


def speed_key(slice_: str, fields: frozenset[str], epoch: str, minute: datetime, counted: int) -> Hashable:
    """Return the key of a speed minute's row: valid while its owning epoch's count of the minute is ``counted``."""
    return ("speed", slice_, fields, epoch, minute, counted)


@dataclass
class BatchPart:
    """The batch rows of one window merged once: kept while the runs (and daily fingerprints) they came from hold.

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


@dataclass(frozen=True)
class SpeedPart:
    """A window's settled speed minutes (older than the speed layer's lateness) merged, with their versions.

    :arg versions: (minute, epoch, events counted) of each minute merged, in time order.
    :arg holes: those minutes counted whose rows were missing or short.
    """

    versions: tuple[tuple[datetime, str, int], ...]
    part: BatchPart
    holes: frozenset[datetime]


@dataclass
class Answer:
    """A question's merged windows and what they were merged under.

    :arg batch_signature: the batch spans with their runs (and daily fingerprints).
    :arg signature: the batch signature, the plan's speed spans and gaps, and each speed minute's epoch and count.
    :arg windows: the merged windows (:class:`serving.queries.Window`, provenance refreshed on every use).
    :arg holes: speed minutes counted whose rows were missing or short (answered as gaps).
    """

    batch_signature: Hashable
    signature: Hashable
    batch_parts: list[BatchPart]
    windows: list[Any]
    holes: frozenset[datetime]
    speed_bytes: int  # the speed rows' sketch bytes merged (the budget of a hit)
    size: int
    speed_parts: list[SpeedPart]  # per window, its settled speed minutes merged


class AnswerCache(_Lru[Answer]):
    """Merged answers by question (:class:`Answer`), an LRU bounded in bytes; counts full hits, speed-only moves."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.partial = 0  # questions answered with the batch part kept, only changed speed minutes read

    def count(self, outcome: str) -> None:
        """Count a question's outcome: ``hit`` (a lookup), ``partial`` (speed minutes re-read) or ``miss``."""
        with self._lock:
            if outcome == "hit":
                self.hits += 1
            elif outcome == "partial":
                self.partial += 1
            else:
                self.misses += 1

    def put(self, key: Hashable, answer: Answer) -> None:
        """Keep an answer (replacing the question's previous one)."""
        self._put(key, answer, answer.size)

    def peek(self, key: Hashable) -> Answer | None:
        """Return the question's previous answer without counting a hit or a miss."""
        with self._lock:
            entry = self._entries.get(key)
            return entry[0] if entry is not None else None
