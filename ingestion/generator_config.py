"""What a synthetic stream is to be: its size and pace, its items and users, the planted bursts, and its two clocks.

Two clocks:

- *live* (no ``start``): event time is the wall clock when the event is made, so a paced stream looks like a
  real producer; burst windows are minutes after the stream started.
- *historical* (``start`` given): event time runs from ``start`` at ``event_rate`` events per second of event
  time, independent of how fast they are produced — last year's logs, backfilled as fast as possible. A
  :class:`DailyCycle` gives it quiet hours and gap days.

:class:`GeneratorConfig` is checked (:meth:`GeneratorConfig.check`) before :mod:`ingestion.generator` makes any
event from it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np

from views.event import format_ts, ts_millis

_BURST_RE = re.compile(r"^(?P<item>.+):(?P<factor>[\d.]+):(?P<start>[\d.]+):(?P<duration>[\d.]+)$")


class GeneratorError(ValueError):
    """The generator's configuration is inconsistent."""


def item_name(rank: int) -> str:
    """Return the name of the item of a popularity rank (1 = most popular)."""
    return f"#t{rank}"


@dataclass(frozen=True)
class Burst:
    """Item ``item`` rises ``factor``-fold from minute ``start_minute`` for ``duration_minutes`` minutes."""

    item: str
    factor: float
    start_minute: float
    duration_minutes: float

    @classmethod
    def parse(cls, text: str) -> Burst:
        """Parse ``ITEM:FACTOR:START_MINUTE:DURATION_MINUTES`` (e.g. ``#t150:8:10:5``; ``@150`` = rank 150).

        :raises GeneratorError: on a malformed spec.
        """
        match = _BURST_RE.match(text.strip())
        if not match:
            msg = f"burst {text!r} is not ITEM:FACTOR:START_MINUTE:DURATION_MINUTES (e.g. '#t150:8:10:5')"
            raise GeneratorError(msg)
        item = match["item"]
        if item.startswith("@") and item[1:].isdigit():
            item = item_name(int(item[1:]))
        burst = cls(item, float(match["factor"]), float(match["start"]), float(match["duration"]))
        if burst.factor < 1 or burst.duration_minutes <= 0:
            msg = f"burst {text!r}: the factor must be >= 1 and the duration > 0"
            raise GeneratorError(msg)
        return burst


@dataclass(frozen=True)
class GeneratorConfig:
    """What to generate. See the module docstring for the two clocks.

    :arg count: number of events (``None``: until ``duration_s``, the ``end`` or, live, forever).
    :arg duration_s: live: seconds of wall clock; historical: seconds of event time.
    :arg rate: events per wall-clock second (``None``: as fast as possible).
    :arg start: first event time of a historical stream (aware); ``None`` for a live stream.
    :arg end: end (exclusive) of a historical stream's event time.
    :arg event_rate: historical: events per second of event time (default: ``rate``, else 100).
    """

    seed: int = 42
    count: int | None = None
    duration_s: float | None = None
    rate: float | None = 1000.0
    start: datetime | None = None
    end: datetime | None = None
    event_rate: float | None = None
    items: int = 10_000
    zipf_s: float = 1.1
    users: int = 100_000
    user_zipf_s: float = 0.8
    value_mu: float = 4.0  # log-normal latency: median e^4 ≈ 55 ms
    value_sigma: float = 0.8
    bursts: tuple[Burst, ...] = ()
    key_field: str = "item"
    quiet_hours: tuple[int, ...] = ()  # historical: UTC hours of the day without any event (nights)
    gap_every_days: int = 0  # historical: every n-th day (counted from 1970-01-01) has no event at all; 0: none

    @property
    def cycle(self) -> DailyCycle | None:
        """Return the historical stream's daily cycle, if it has quiet hours or gap days."""
        if not self.quiet_hours and not self.gap_every_days:
            return None
        return DailyCycle(tuple(sorted(set(self.quiet_hours))), self.gap_every_days)

    @property
    def historical(self) -> bool:
        """Tell whether event time is synthetic (from ``start``) rather than the wall clock."""
        return self.start is not None

    @property
    def events_per_event_second(self) -> float:
        """Return the density of event time in a historical stream."""
        return self.event_rate or self.rate or 100.0

    def total(self) -> int | None:
        """Return how many events the stream has, if it is bounded by count or event time."""
        if self.count is not None:
            return self.count
        if self.historical and self.start is not None:
            if self.end is not None:
                cycle = self.cycle
                seconds = (
                    (self.end - self.start).total_seconds()
                    if cycle is None
                    else (cycle.active_ms(ts_millis(self.end)) - cycle.active_ms(ts_millis(self.start))) / 1000
                )
                return max(0, math.floor(seconds * self.events_per_event_second))
            if self.duration_s is not None:
                return math.floor(self.duration_s * self.events_per_event_second)
        return None

    def check(self, now: datetime, max_future_skew: timedelta) -> None:
        """Refuse inconsistent settings before any event is made.

        :raises GeneratorError: with what to change.
        """
        if self.items < 1 or self.users < 1:
            msg = "items and users must be at least 1"
            raise GeneratorError(msg)
        if self.rate is not None and self.rate <= 0:
            msg = "the rate must be positive (or None for as fast as possible)"
            raise GeneratorError(msg)
        if self.start is not None and self.start.tzinfo is None:
            msg = "the start time needs a UTC offset"
            raise GeneratorError(msg)
        if (self.quiet_hours or self.gap_every_days) and not self.historical:
            msg = "quiet hours and gap days shape a historical stream: give a start"
            raise GeneratorError(msg)
        if self.cycle is not None:
            self.cycle.check()
        if self.historical:
            total = self.total()
            if total is None or self.start is None:
                msg = "a historical stream needs an end, a duration or a count"
                raise GeneratorError(msg)
            last = self.start + timedelta(seconds=total / self.events_per_event_second)
            if self.cycle is not None and total:
                offset = (total - 1) * 1000 / self.events_per_event_second
                last_ms = int(self.cycle.times(ts_millis(self.start), [offset])[0])
                last = datetime.fromtimestamp(last_ms / 1000, UTC)
            if last > now + max_future_skew:
                msg = (
                    f"the stream would reach {format_ts(last)}, beyond now + the allowed future skew; "
                    "end it earlier or lower the count"
                )
                raise GeneratorError(msg)
        known = {item_name(r) for r in range(1, self.items + 1)}
        for burst in self.bursts:
            if burst.item not in known:
                msg = f"burst item {burst.item} is not one of #t1..#t{self.items}"
                raise GeneratorError(msg)


DAY_MS: Final = 86_400_000
HOUR_MS: Final = 3_600_000


@dataclass(frozen=True)
class DailyCycle:
    """Real streams are sparse: quiet hours every night and whole days without events (outages, weekends).

    Event time of a historical stream runs on an *active* clock that stops during quiet hours and gap days: the
    n-th event is at active time n / event_rate after the start, mapped onto the calendar.
    """

    quiet_hours: tuple[int, ...]
    gap_every_days: int

    def check(self) -> None:
        """Refuse a cycle without any active hour.

        :raises GeneratorError: with what to change.
        """
        if any(not 0 <= h < 24 for h in self.quiet_hours) or len(set(self.quiet_hours)) >= 24:
            msg = "quiet hours are UTC hours 0..23, and at least one hour of the day must stay active"
            raise GeneratorError(msg)
        if self.gap_every_days == 1 or self.gap_every_days < 0:
            msg = "gap days: every n-th day with n >= 2 (0: none)"
            raise GeneratorError(msg)

    @property
    def active_hours(self) -> list[int]:
        """Return the UTC hours of a day that have events."""
        return [h for h in range(24) if h not in self.quiet_hours]

    def is_gap(self, day: int) -> bool:
        """Tell whether the day (counted from the epoch) is a gap day."""
        return self.gap_every_days > 0 and day % self.gap_every_days == self.gap_every_days - 1

    def active_ms(self, ts_ms: int) -> int:
        """Return the active milliseconds from the epoch to ``ts_ms``."""
        per_day = len(self.active_hours) * HOUR_MS
        day, within = divmod(ts_ms, DAY_MS)
        n = self.gap_every_days
        active_days = day - (day // n if n else 0)
        out = active_days * per_day
        if not self.is_gap(day):
            hour, rest = divmod(within, HOUR_MS)
            out += sum(HOUR_MS for h in self.active_hours if h < hour)
            out += rest if hour in self.active_hours else 0
        return out

    def times(self, start_ms: int, offsets_ms: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Map active-clock offsets (ms after ``start_ms``) to event times (epoch ms)."""
        hours = np.asarray(self.active_hours, dtype=np.int64)
        per_day = len(hours) * HOUR_MS
        active = self.active_ms(start_ms) + np.asarray(offsets_ms, dtype=np.float64).astype(np.int64)
        active_day, within = np.divmod(active, per_day)
        n = self.gap_every_days
        day = active_day + (active_day // (n - 1) if n else 0)  # skip the gap days
        slot, rest = np.divmod(within, HOUR_MS)
        return np.asarray(day * DAY_MS + hours[slot] * HOUR_MS + rest, dtype=np.int64)
