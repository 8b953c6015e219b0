"""A bounded map whose entries live at most a given time: what a producer may trust about subjects it has seen.

A producer asks it for every user of every batch, so it is two plain dicts rather than a cache with per-entry
bookkeeping (``cachetools.TTLCache`` cost more than the rest of a warm producer's work per event). Entries go into
the young dict; every half TTL the young become the old and the old are dropped, so an entry lives between half
the TTL and the TTL, and a forgotten user's pseudonym leaves every producer within the TTL. A full young dict turns
early, which bounds the size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


class RecentMap(Generic[K, V]):
    """A map of at most ``size`` entries, each dropped at most ``ttl_s`` after it was set (see the module).

    :arg timer: the clock (tests); the map turns when :meth:`tick` sees half the TTL pass.
    """

    def __init__(self, size: int, ttl_s: float, timer: Callable[[], float]) -> None:
        self._half_size = max(1, size // 2)
        self._half_ttl = ttl_s / 2
        self._timer = timer
        self._young: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self._turned = timer()
        self.turns = 0  # how often entries were dropped (a turn or a pop): what a copy of them must follow

    def tick(self) -> None:
        """Turn the generations the clock says are due (call it before a batch of reads and writes)."""
        steps = int((self._timer() - self._turned) // self._half_ttl)
        if steps <= 0:
            return
        self._old = {} if steps >= 2 else self._young
        self._young = {}
        self._turned += steps * self._half_ttl
        self.turns += 1

    def get(self, key: K, default: V | None = None) -> V | None:
        """Return the entry's value, or ``default``."""
        found = self._young.get(key, _MISSING)
        if found is _MISSING:
            found = self._old.get(key, _MISSING)
        return default if found is _MISSING else found  # type: ignore[return-value]

    def __setitem__(self, key: K, value: V) -> None:
        if len(self._young) >= self._half_size and key not in self._young:
            self._old, self._young = self._young, {}
            self.turns += 1
        self._young[key] = value

    def split(self, keys: Iterable[K]) -> tuple[dict[Any, V], list[K]]:
        """Return the values of the keys found, keyed by their first element, and the keys not found, in order.

        The keys are tuples (a subject and an hour): what is found is answered per subject.
        """
        young, old = self._young, self._old
        found: dict[Any, V] = {}
        missed: list[K] = []
        for key in keys:
            value = young.get(key, _MISSING)
            if value is _MISSING:
                value = old.get(key, _MISSING)
                if value is _MISSING:
                    missed.append(key)
                    continue
            found[key[0]] = value  # type: ignore[index,assignment]
        return found, missed

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove the entry (from both generations); return its value, or ``default``."""
        old = self._old.pop(key, _MISSING)
        young = self._young.pop(key, _MISSING)
        found = young if young is not _MISSING else old
        if found is not _MISSING:
            self.turns += 1
        return default if found is _MISSING else found  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return key in self._young or key in self._old

    def __iter__(self) -> Iterator[K]:
        return iter({**self._old, **self._young})

    def __len__(self) -> int:
        return len(self._young.keys() | self._old.keys())
