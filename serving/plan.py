"""Which layer answers which part of a query window: the merge rule, as a pure function, and what it plans with.

The boundary ``B`` is the batch watermark (or an operator's pin). Every minute of the window is served by exactly
one source:

* below ``B`` by the **batch view** — a whole UTC day from its daily rollup when that rollup is current, a whole
  hour from its hourly rollup, the minutes of a partial hour from the minute rows — and by nothing else: an hour
  below ``B`` without a completed batch run is a **gap**;
* at or above ``B`` by the **speed view**, but only where the speed layer's coverage says it counted the minute
  and its rows are still kept: every other minute is a **gap** with its reason (not yet seen, the speed layer
  started after it, its rows expired or are missing). After the rows are read, a minute the speed layer counted
  events in whose row the view no longer holds (or holds with fewer events) becomes a gap too (:func:`punch`).

So no minute is counted twice (the two ranges do not overlap, and a coarser rollup replaces its finer rows) and
none is silently skipped or answered as zero unless a layer counted zero there (every minute not served is
reported as a gap). Cost grows with the number of rollup
rows read, not with events: a week below the watermark is at most 7 daily rows plus its edges (a part of a day,
ten-minute rows and minutes at each, :mod:`serving.read_schedule`).

The state it plans with, :class:`Coverage`, is read by :meth:`serving.reader.ViewReader.coverage`.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Literal, TypeVar

from views.buckets import DAY, HOUR, MINUTE, floor
from views.store.losses import Loss
from views.store.speed import Epoch

Layer = Literal["batch", "speed", "gap"]
Resolution = Literal["day", "hour", "minute"]

NO_BATCH_RUN = "no completed batch run for this hour"
NOT_YET_SEEN = "not yet seen by the speed layer"
STARTED_AFTER = "the speed layer started after this minute"
SPEED_ROWS_GONE = "speed rows expired or missing"
# A batch hour whose current run defines the slice otherwise than the serving view version (another slice
# fingerprint, or no such slice): never a number of another definition. A backfill recomputes it under this one.
DEFINITION = "computed with another view definition (backfill: trends batch run --start ... --end ...)"
NOT_DEFINED = "the serving view definition has no such slice"
# A minute ending after the time its epoch last read the whole topic (``Epoch.read_all_at``) holds only part of its
# events, and that epoch has not read everything for longer than ``serving.speed_live_within_s``: its job crashed,
# was killed, lost its checkpoint, or fell behind. A gap until it reads on or a newer epoch reads past the minute.
STOPPED_INSIDE = "the speed layer stopped or fell behind inside this minute"
GAP_REASONS = (NO_BATCH_RUN, NOT_YET_SEEN, STARTED_AFTER, SPEED_ROWS_GONE, DEFINITION, NOT_DEFINED, STOPPED_INSIDE)
RESOLUTIONS: dict[str, timedelta] = {"minute": MINUTE, "hour": HOUR, "day": DAY}


@dataclass(frozen=True)
class SpeedCoverage:
    """What the speed layer says it counted: its epochs, the hours whose rows are surely kept, minutes counted.

    A minute belongs to the newest epoch that counts it completely (``counts_from`` at or before it); it is served
    when that epoch has read past it and its hour's rows are surely kept at ``now``. Past it means: the epoch read
    every record the topic held at the minute's end (``read_all_at``), or the minute is still under way and the epoch
    read everything at most ``live_within`` ago (the live minute, partial only by what is not produced yet).

    :arg epochs: the query's epochs (checkpoint lifetimes).
    :arg kept: ``(hour, epoch) -> until when all the hour's rows are surely kept`` (None: unknown any more).
    :arg counted: ``(epoch, minute) -> events counted`` for the slice asked.
    :arg other_definition: epochs whose view definition does not define the slice as the serving one does (or
        not at all): their minutes are gaps, never numbers of another definition.
    :arg live_within: how recently an epoch must have read the whole topic for its minute under way to be served
        (None, or ``now`` None: every minute an epoch has an event past is served, the rule before ``read_all_at``).
    """

    epochs: tuple[Epoch, ...]
    kept: Mapping[tuple[datetime, str], datetime | None] = field(default_factory=dict)
    counted: Mapping[tuple[str, datetime], int] = field(default_factory=dict)
    now: datetime | None = None
    other_definition: frozenset[str] = frozenset()
    live_within: timedelta | None = None

    @property
    def fresh_until(self) -> datetime | None:
        """Return the end of the newest minute any epoch has read (None: nothing yet)."""
        return max((e.seen_until for e in self.epochs if e.seen_until is not None), default=None)

    def final_until(self, allowed_lateness_s: float) -> datetime | None:
        """Return the end of the minutes (and speed intervals) no event changes any more (None: nothing read yet).

        The newest event read is at least a minute before :attr:`fresh_until`, and the speed job drops events more
        than ``allowed_lateness_s`` behind the newest as late (its Spark watermark): the minutes ending by this time
        are final, and the speed layer has merged every interval ending by it into its rollup (a batch later).
        """
        fresh = self.fresh_until
        return None if fresh is None else floor(fresh - timedelta(seconds=allowed_lateness_s), MINUTE) - MINUTE

    def owner(self, minute: datetime) -> Epoch | None:
        """Return the newest epoch that counts ``minute`` completely (it alone writes that minute's rows)."""
        owners = [e for e in self.epochs if e.counts_from is not None and e.counts_from <= minute]
        return max(owners, key=lambda e: e.started_at, default=None)

    def status(self, minute: datetime) -> str:
        """Return ``""`` when the speed view answers ``minute``, else the reason it is a gap."""
        fresh = self.fresh_until
        if fresh is None or minute >= fresh:
            return NOT_YET_SEEN
        epoch = self.owner(minute)
        if epoch is None:  # every epoch began counting after it
            return STARTED_AFTER
        if epoch.id in self.other_definition:
            return NOT_DEFINED
        if epoch.seen_until is None or minute >= epoch.seen_until:  # a newer epoch started after it: nobody's
            newest = max(self.epochs, key=lambda e: e.started_at)
            return NOT_YET_SEEN if epoch is newest else STARTED_AFTER
        return self.unread(epoch, minute) or self._kept_status(epoch, minute)

    def _kept_status(self, epoch: Epoch, minute: datetime) -> str:
        kept = self.kept.get((floor(minute, HOUR), epoch.id))
        if kept is None or (self.now is not None and kept <= self.now):
            return SPEED_ROWS_GONE
        return ""

    def unread(self, epoch: Epoch, minute: datetime) -> str:
        """Return why ``minute`` may miss events ``epoch`` has not read (``""``: it read them, or it is the live one).

        Its events are read once the epoch has read every record the topic held at the minute's end; events produced
        later are late and counted when read, as always. A minute under way is answered with what the epoch read
        while it reads on; once it is over, or the epoch stopped reading, it is a gap until read to its end.
        """
        if self.now is None or self.live_within is None:
            return ""
        end, read_all = minute + MINUTE, epoch.read_all_at
        if read_all is not None and read_all >= end:
            return ""
        if read_all is None:  # never read the whole topic yet: catching up (or it stopped before it ever did)
            return NOT_YET_SEEN
        if self.now - read_all > self.live_within:
            return STOPPED_INSIDE
        return "" if self.now < end else NOT_YET_SEEN

    def rollup_matches(self, start: datetime, end: datetime, epoch: str, events: int) -> bool:
        """Tell whether a rollup of ``[start, end)`` merged by ``epoch`` holds exactly what the owner counted there.

        Only the epoch owning every minute of it may answer with its rollup, and only with as many events as its
        coverage counted (a rollup merged while a minute was missing or short holds fewer: its minutes are read).
        """
        owner = self.owner(start)
        if owner is None or owner.id != epoch or self.owner(end - MINUTE) is not owner:
            return False
        counted, m, total = self.counted, start, 0
        while m < end:
            total += counted.get((epoch, m), 0)
            m += MINUTE
        return total == events

    def cuts(self) -> set[datetime]:
        """Return the times the coverage changes at: epochs' starts and ends, where each read all, the minute now."""
        out = {t for e in self.epochs for t in (e.counts_from, e.seen_until) if t is not None}
        if self.now is not None and self.live_within is not None:
            out |= {floor(e.read_all_at, MINUTE) for e in self.epochs if e.read_all_at is not None}
            out.add(floor(self.now, MINUTE))
        return out

    def expected(self, minute: datetime) -> int:
        """Return the events the owning epoch counted in ``minute`` (0: it counted none there)."""
        epoch = self.owner(minute)
        return 0 if epoch is None else self.counted.get((epoch.id, minute), 0)


@dataclass(frozen=True)
class ServedBy:
    """The view version an answer comes from: the serving speed query, its definition, the slice's own fingerprint.

    :arg slice_fingerprint: :func:`views.definition.slice_fingerprint` of the slice asked (None: the serving
        definition has no such slice).
    """

    query: str
    fingerprint: str | None
    slice_fingerprint: str | None


@dataclass(frozen=True)
class Span:
    """A contiguous part of the window and who serves it."""

    start: datetime
    end: datetime
    layer: Layer
    resolution: Resolution
    reason: str = ""

    def minutes(self) -> Iterator[datetime]:
        """Yield the minute buckets the span covers."""
        m = self.start
        while m < self.end:
            yield m
            m += MINUTE


@dataclass(frozen=True)
class Coverage:
    """What the merge rule needs to know about both layers for a window (read by the reader, in one direction)."""

    boundary: datetime | None
    pinned: bool
    batch_low: datetime | None
    batch_hours: set[datetime]
    current_days: set[date]
    speed_newest_event: datetime | None
    speed_updated_at: datetime | None
    speed: SpeedCoverage = field(default_factory=lambda: SpeedCoverage(()))
    stale: dict[datetime, int] = field(default_factory=dict)  # batch hours -> records indexed since their run
    incomplete: dict[datetime, list[Loss]] = field(default_factory=dict)  # hours lost records may belong to
    runs: Mapping[date, Mapping[datetime, uuid.UUID]] = field(default_factory=dict)  # current run per hour, per day
    # batch hours whose current run defines the slice otherwise than the serving view version (gaps: DEFINITION)
    other_definition: frozenset[datetime] = frozenset()
    version: ServedBy | None = None  # the view version answers come from, for this slice
    tens: frozenset[datetime] = frozenset()  # batch hours whose current run wrote ten-minute rows

    @property
    def speed_fresh_until(self) -> datetime | None:
        """Return the end of the newest minute the speed layer has read (its current epoch)."""
        return self.speed.fresh_until

    def plan(self, start: datetime, end: datetime, coarsest: Resolution = "day") -> list[Span]:
        """Split ``[start, end)`` with the merge rule under this coverage (:func:`plan`)."""
        return plan(
            start, end, self.boundary, self.batch_hours, self.current_days, self.speed, coarsest, self.other_definition
        )


def plan(
    start: datetime,
    end: datetime,
    boundary: datetime | None,
    batch_hours: set[datetime],
    current_days: set[date],
    speed: SpeedCoverage,
    coarsest: Resolution = "day",
    other_definition: Iterable[datetime] = (),
) -> list[Span]:
    """Split ``[start, end)`` (whole minutes) into spans served by the batch view, the speed view, or gaps.

    :arg boundary: the batch watermark or pin; None when the batch layer has completed nothing yet.
    :arg batch_hours: hours (below the boundary) with a completed batch run.
    :arg current_days: days whose daily rollup matches the current hour runs.
    :arg speed: what the speed layer counted (its epochs, kept hours and counted minutes).
    :arg coarsest: the coarsest rollup allowed (a time series at hourly resolution must not use daily rows).
    :arg other_definition: batch hours whose run defines the slice otherwise than the serving view version: gaps
        (:data:`DEFINITION`), and no daily rollup over them.
    """
    if start.tzinfo is None or end.tzinfo is None:
        msg = "window bounds must be timezone-aware"
        raise ValueError(msg)
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if floor(start, MINUTE) != start or floor(end, MINUTE) != end or end <= start:
        msg = f"window [{start}, {end}) must be non-empty and on whole minutes"
        raise ValueError(msg)
    split = start if boundary is None else min(max(boundary.astimezone(UTC), start), end)
    other = set(other_definition)
    served = batch_hours - other if other else batch_hours
    spans = _batch_spans(start, split, served, current_days, coarsest, other) + _speed_spans(split, end, speed)
    return _coalesce(spans)


def _batch_spans(
    start: datetime,
    end: datetime,
    hours: set[datetime],
    days: set[date],
    coarsest: Resolution,
    other_definition: Collection[datetime] = (),
) -> list[Span]:
    spans: list[Span] = []
    t = start
    while t < end:
        day_start = floor(t, DAY)
        if (
            coarsest == "day"
            and t == day_start
            and t + DAY <= end
            and day_start.date() in days
            and all(day_start + i * HOUR in hours for i in range(24))
        ):
            spans.append(Span(t, t + DAY, "batch", "day"))
            t += DAY
            continue
        hour = floor(t, HOUR)
        stop = min(hour + HOUR, end)
        if hour not in hours:
            spans.append(Span(t, stop, "gap", "minute", DEFINITION if hour in other_definition else NO_BATCH_RUN))
        elif coarsest != "minute" and t == hour and stop == hour + HOUR:
            spans.append(Span(t, stop, "batch", "hour"))
        else:
            spans.append(Span(t, stop, "batch", "minute"))
        t = stop
    return spans


def _speed_spans(start: datetime, end: datetime, speed: SpeedCoverage) -> list[Span]:
    """Walk the window from one change of coverage to the next (an hour, an epoch's start or end)."""
    spans: list[Span] = []
    fresh = speed.fresh_until
    cuts = sorted(speed.cuts())
    t = start
    while t < end:
        if fresh is None or t >= fresh:  # nothing read here yet: one gap to the end
            spans.append(Span(t, end, "gap", "minute", NOT_YET_SEEN))
            break
        stop = min(floor(t, HOUR) + HOUR, end, *(c for c in cuts if c > t))
        reason = speed.status(t)
        spans.append(Span(t, stop, "gap" if reason else "speed", "minute", reason))
        t = stop
    return _coalesce(spans)


def punch(spans: list[Span], minutes: Iterable[datetime], reason: str = SPEED_ROWS_GONE) -> list[Span]:
    """Turn ``minutes`` of the speed spans into gaps (rows the speed layer counted that the view no longer holds)."""
    holes = set(minutes)
    if not holes:
        return spans
    out: list[Span] = []
    for s in spans:
        if s.layer != "speed" or not any(s.start <= m < s.end for m in holes):
            out.append(s)
            continue
        out.extend(
            Span(m, m + MINUTE, "gap", "minute", reason) if m in holes else Span(m, m + MINUTE, "speed", "minute")
            for m in s.minutes()
        )
    return _coalesce(out)


def _coalesce(spans: list[Span]) -> list[Span]:
    """Merge adjacent gaps with the same reason, and adjacent speed minutes, so answers list few spans."""
    out: list[Span] = []
    for s in spans:
        prev = out[-1] if out else None
        same = prev is not None and prev.layer == s.layer and prev.reason == s.reason and prev.end == s.start
        if prev and same and (s.layer == "gap" or (s.layer == "speed" and prev.resolution == s.resolution)):
            out[-1] = Span(prev.start, s.end, s.layer, "minute", s.reason)
        else:
            out.append(s)
    return out


V = TypeVar("V", bound=Hashable)


def runs(points: Iterable[tuple[datetime, V]], step: timedelta) -> list[tuple[datetime, datetime, V]]:
    """Coalesce sorted time buckets of length ``step`` into ``(start, end, value)`` runs of consecutive equal values.

    The one coalescing of minutes (or hours) into ranges: the speed minutes left to read, the incomplete hours.
    """
    out: list[tuple[datetime, datetime, V]] = []
    for t, value in points:
        if out and out[-1][1] == t and out[-1][2] == value:
            out[-1] = (out[-1][0], t + step, value)
        else:
            out.append((t, t + step, value))
    return out
