"""LRU caches bounded in bytes, shared by the reader's row caches and the answer cache.

A :class:`RowCache` keeps the rows one read returned under a key that says what makes them true (the batch run they
belong to, the speed epoch's count of a minute), so nothing kept can be stale.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from serving.served_row import ServedRow

ROW_OVERHEAD_BYTES = 200  # a cached row's object and key, besides its sketch bytes

V = TypeVar("V")


class BytesLru(Generic[V]):
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

    def peek(self, key: Hashable) -> V | None:
        """Return the value of a key without counting a hit or a miss (nor making it recently used)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry[0] if entry is not None else None

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


def _size(rows: tuple[ServedRow, ...]) -> int:
    return ROW_OVERHEAD_BYTES + sum(ROW_OVERHEAD_BYTES + b.sketch_bytes for b in rows)


class RowCache(BytesLru[tuple[ServedRow, ...]]):
    """An LRU of view rows, bounded in bytes: key -> the rows (maybe none) one read returned."""

    def put(self, key: Hashable, rows: tuple[ServedRow, ...]) -> None:
        """Keep the rows of a key, evicting the least recently used entries beyond ``max_bytes``."""
        self._put(key, rows, _size(rows))
