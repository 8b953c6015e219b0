"""The reads of one request's rows, scheduled: one unit per read (or rows from the cache), run in time order.

Few rows are held at once: a long read with sketches comes in pages, and reads run ahead of the one being consumed
only while their first pages stay small. Batch rows are served from the reader's row cache under the run (or the
day's pointers' fingerprint) they belong to, so a cached row cannot be stale.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE
from serving.lru import RowCache
from serving.plan import Span, SpeedCoverage
from serving.served_row import ServedRow
from views.buckets import DAY, HOUR, MINUTE, SPEED_ROLLUP, days_between, floor, is_day_part, month_key, utc
from views.store.pointers import fingerprint_of
from views.store.rollups import MIN_EDGE, WIDTH_MIN

if TYPE_CHECKING:
    from cassandra.cluster import Session

PAGE_ROWS = 1000  # rows per page of a read that carries no sketch
PAGE_ROWS_SKETCHES = 25  # rows per page of a long read with sketches (a frequent-items sketch is 8-100 KB)
SHORT_READ_ROWS = 200  # a read of at most this many rows comes in one page (the speed tail of an ordinary window)
IN_FLIGHT_ROWS = 150  # reads run ahead of the one being consumed while their first pages hold at most this many rows


@dataclass
class _Unit:
    """One read of a request (or rows from the cache), placed in time, and what turns its result into served rows."""

    start: datetime
    request: Any  # a bound statement, paged; None when the cache serves the unit
    emit: Callable[[Iterable[Any]], Iterable[ServedRow]]
    rows: int  # most rows its first page holds


class ReadSchedule:
    """The reads of one :meth:`~serving.reader.ViewReader.stream`: a unit per read (or cache hit), run in time order.

    It is given all it reads with (the session, the prepared reads, the batch-row cache, the runs of the plan's
    coverage) and reaches back into nothing.
    """

    def __init__(
        self,
        sess: Session,
        statements: Mapping[str, Any],
        cache: RowCache | None,
        slice_: str,
        fields: frozenset[str],
        runs: Mapping[date, Mapping[datetime, uuid.UUID]],
        query: str = "",
        rollups: SpeedCoverage | None = None,
        rollups_until: datetime | None = None,
        tens: frozenset[datetime] = frozenset(),
        live: bool = False,
        parts: bool = False,
        edge_ttl: timedelta | None = None,
    ) -> None:
        self.query = query  # the speed query (view version) whose rows the speed spans read
        # speed rollups are read for whole intervals ending by rollups_until, checked against this coverage; with
        # live rollups (speed.live_rollups) for open intervals too
        self.rollups = rollups if rollups_until is not None or (live and rollups is not None) else None
        self.rollups_until = rollups_until
        self.live = live
        self.parts = parts  # whole hours at a day's start or end from the day's parts (batch.day_parts)
        self.edge_ttl = edge_ttl  # how long the edges of closed speed intervals are kept (speed.edge_ttl_s)
        self.tens = tens  # batch hours whose current run wrote ten-minute rows
        self.sess = sess
        self.stmt = statements
        self.cache = cache
        self.slice = slice_
        self.fields = fields
        self.runs = runs
        self.units: list[_Unit] = []

    def pointers(self, day: date) -> Mapping[datetime, uuid.UUID]:
        """Return the current runs of a day's hours as the plan's coverage read them."""
        return self.runs.get(day, {})

    def _add(
        self,
        start: datetime,
        statement: str | None,
        params: tuple[Any, ...],
        emit: Callable[[Iterable[Any]], Iterable[ServedRow]],
        rows: int = 0,
    ) -> None:
        if statement is None:
            self.units.append(_Unit(start, None, emit, 0))
            return
        short = rows <= SHORT_READ_ROWS
        page = PAGE_ROWS if not self.fields else (rows if short else PAGE_ROWS_SKETCHES)
        bound = self.stmt[statement].bind(params)
        bound.fetch_size = max(page, 1)
        self.units.append(_Unit(start, bound, emit, min(rows, page)))

    def _cached(self, key: Hashable) -> tuple[ServedRow, ...] | None:
        return self.cache.get(key) if self.cache is not None else None

    def _remember(self, key: Hashable, rows: Iterable[ServedRow]) -> None:
        if self.cache is not None:
            self.cache.put(key, tuple(rows))

    def speed(self, span: Span) -> None:
        """Read a speed span a day at a time, streamed in pages (never cached: it changes every micro-batch).

        With rollups, the whole closed intervals inside the span are read from their rollups (one read per day piece)
        and only the minutes at its edges (and of intervals whose rollup is missing or does not match) as minutes.
        With live rollups, open intervals are read from theirs too, and so is the interval the span ends inside when
        the speed layer counted nothing in it past the span's end (the newest interval of a window ending now).
        """
        for day in days_between(span.start, span.end):
            first = max(span.start, datetime.combine(day, time(), UTC))
            last = min(span.end, datetime.combine(day, time(), UTC) + DAY)
            lo = floor(first + SPEED_ROLLUP - MINUTE, SPEED_ROLLUP)  # the first interval starting inside
            hi = self._rolled_end(first, last)
            if self.rollups is None or hi <= lo:
                self._speed_minutes(day, first, last)
                continue
            if first < lo and not self._speed_edge(day, first, lo, lo - SPEED_ROLLUP):
                self._speed_minutes(day, first, lo)
            self._speed_rollups(day, lo, hi, last)
            if hi < last and not self._speed_edge(day, hi, last, hi):
                self._speed_minutes(day, hi, last)

    def _rolled_end(self, first: datetime, last: datetime) -> datetime:
        """Return the end of the last interval of ``[first, last)`` worth reading from its rollup."""
        if not self.live or self.rollups is None:
            return floor(min(last, self.rollups_until or first), SPEED_ROLLUP)  # the end of the last one closed
        top = floor(last - MINUTE, SPEED_ROLLUP) + SPEED_ROLLUP  # the end of the interval holding the last minute
        nothing_after = all(self.rollups.expected(m) == 0 for m in _times(last, top, MINUTE))
        return top if nothing_after else floor(last, SPEED_ROLLUP)

    def _speed_edge(self, day: date, first: datetime, end: datetime, interval: datetime) -> bool:
        """Serve ``[first, end)``, an edge of a closed interval, from its merged edge when one is surely kept.

        Return False (read its minutes) when edges are off, it is shorter than :data:`MIN_EDGE` minutes, the interval
        is not surely merged yet, or its edges have surely expired. A kept edge answers only when it holds exactly what
        the coverage counted there, else the minutes are read at once.
        """
        cov, ttl, until = self.rollups, self.edge_ttl, self.rollups_until
        closes = interval + SPEED_ROLLUP
        if cov is None or ttl is None or until is None or closes > until or end - first < MIN_EDGE * MINUTE:
            return False
        if cov.now is not None and closes + ttl <= cov.now + MINUTE:
            return False

        def emit(result: Iterable[Any]) -> Iterable[ServedRow]:
            r = next(iter(result), None)
            if r is not None and cov.rollup_matches(first, end, r.epoch, int(r.events)):
                return [dataclasses.replace(ServedRow.of_row(first, "minutes", "speed", r), width=end - first)]
            return self._read_minutes_now(day, first, end)

        minutes = int((end - first) / MINUTE)
        self._add(first, "edge", (self.query, self.slice, day, first, minutes), emit, 1)
        return True

    def _speed_minutes(self, day: date, first: datetime, last: datetime) -> None:
        minutes = int((last - first) / MINUTE)
        self._add(first, "speed", (self.query, self.slice, day, first, last), _minute_rows, minutes)

    def _speed_rollups(self, day: date, lo: datetime, hi: datetime, last: datetime) -> None:
        """Serve ``[lo, min(hi, last))`` from rollups matching the coverage; the minutes of any other read at once.

        ``hi`` may pass ``last`` (the span's end) inside an interval the speed layer counted nothing in after it.
        """
        cov = self.rollups
        assert cov is not None  # noqa: S101 - only called with rollups

        def emit(result: Iterable[Any]) -> Iterator[ServedRow]:
            found = {utc(r.bucket_start): r for r in result if r.width_min == WIDTH_MIN}
            t, todo = lo, lo  # todo: the start of the minutes not served by a rollup yet
            while t < hi:
                r = found.get(t)
                if r is not None and cov.rollup_matches(t, t + SPEED_ROLLUP, r.epoch, int(r.events)):
                    if todo < t:
                        yield from self._read_minutes_now(day, todo, t)
                    yield ServedRow.of_row(t, "10min", "speed", r)
                    todo = t + SPEED_ROLLUP
                t += SPEED_ROLLUP
            if todo < min(hi, last):
                yield from self._read_minutes_now(day, todo, min(hi, last))

        self._add(lo, "rollups", (self.query, self.slice, day, lo, hi), emit, int((hi - lo) / SPEED_ROLLUP))

    def _read_minutes_now(self, day: date, first: datetime, last: datetime) -> Iterator[ServedRow]:
        """Read minutes at once (a rollup missing or not matching its interval's coverage: a second round trip)."""
        bound = self.stmt["speed"].bind((self.query, self.slice, day, first, last))
        bound.fetch_size = PAGE_ROWS_SKETCHES if self.fields else PAGE_ROWS
        return _minute_rows(self.sess.execute(bound, execution_profile=READ_PROFILE))

    def day(self, span: Span) -> None:
        """Serve a daily rollup, cached under the fingerprint of the day's pointers."""
        day = span.start.date()
        fingerprint = fingerprint_of(self.pointers(day))
        key = ("day", self.slice, day, fingerprint, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(span.start, None, (), lambda _rows: hit)
            return

        def emit(result: Iterable[Any]) -> list[ServedRow]:
            rows = list(result)
            got = [ServedRow.of_row(span.start, "day", "batch", r) for r in rows]
            if all(r.hour_runs == fingerprint for r in rows):  # re-merged since the coverage read: don't keep it
                self._remember(key, got)
            return got

        self._add(span.start, "days", (self.slice, month_key(day), day, day + timedelta(days=1)), emit, 1)

    def minutes(self, span: Span) -> None:
        """Serve a batch span inside an hour: its whole ten minutes from the run's ten-minute rows, the rest minutes."""
        hour = floor(span.start, HOUR)
        lo = floor(span.start + SPEED_ROLLUP - MINUTE, SPEED_ROLLUP)
        hi = floor(span.end, SPEED_ROLLUP)
        if hour not in self.tens or hi <= lo:
            self._batch_minutes(span)
            return
        if span.start < lo:  # the edges alone (at most 9 minutes each), not kept: the hour's tens are
            self._batch_minutes(Span(span.start, lo, "batch", "minute"), whole=False)
        self._tens(hour, lo, hi)
        if hi < span.end:
            self._batch_minutes(Span(hi, span.end, "batch", "minute"), whole=False)

    def _tens(self, hour: datetime, lo: datetime, hi: datetime) -> None:
        """Serve ``[lo, hi)`` from the current run's ten-minute rows (the hour's cached under that run)."""
        run = self.pointers(hour.date()).get(hour)
        key = ("tens", self.slice, hour, run, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(lo, None, (), lambda _rows: [b for b in hit if lo <= b.start < hi])
            return

        whole = self.cache is not None  # without a cache, read only the span

        def emit(rows: Iterable[Any]) -> list[ServedRow]:
            got = [ServedRow.of_row(utc(r.bucket_start), "10min", "batch", r) for r in rows]
            if whole:  # only the whole hour is kept under the run
                self._remember(key, got)
            return [b for b in got if lo <= b.start < hi]

        first, last = (hour, hour + HOUR) if whole else (lo, hi)
        self._add(lo, "tens", (self.slice, hour, run, first, last), emit, int((last - first) / SPEED_ROLLUP))

    def _batch_minutes(self, span: Span, whole: bool = True) -> None:
        """Serve batch minutes from the current run's whole hour (cached under that run; ``whole``: read it so)."""
        hour = floor(span.start, HOUR)
        run = self.pointers(hour.date()).get(hour)
        key = ("minutes", self.slice, hour, run, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(span.start, None, (), lambda _rows: [b for b in hit if span.start <= b.start < span.end])
            return

        whole = whole and self.cache is not None  # without a cache, read only the span

        def emit(rows: Iterable[Any]) -> list[ServedRow]:
            got = [ServedRow.of_row(utc(r.bucket_start), "minute", "batch", r) for r in rows]
            if whole:  # only the whole hour is kept under the run
                self._remember(key, got)
            return [b for b in got if span.start <= b.start < span.end]

        lo, hi = (hour, hour + HOUR) if whole else (span.start, span.end)
        self._add(span.start, "minutes", (self.slice, hour, run, lo, hi), emit, int((hi - lo) / MINUTE))

    def hours(self, day: date, spans: list[Span]) -> None:
        """Serve whole hours of a day: cached ones from the cache, the others with one range read (<= 24 rows).

        With parts, a run of hours from the day's start or to its end is one row of its part instead.
        """
        if self.parts:
            spans = self._day_parts(day, spans)
            if not spans:
                return
        pointers = self.pointers(day)
        cached: dict[datetime, tuple[ServedRow, ...]] = {}
        missing: dict[datetime, Hashable] = {}
        for span in spans:
            key = ("hour", self.slice, span.start, pointers.get(span.start), self.fields)
            hit = self._cached(key)
            if hit is None:
                missing[span.start] = key
            else:
                cached[span.start] = hit

        def emit(rows: Iterable[Any]) -> list[ServedRow]:
            found: dict[datetime, tuple[ServedRow, ...]] = dict(cached)
            for b in _current_hours(rows, pointers):
                if b.start in missing:
                    found[b.start] = (b,)
            for hour, key in missing.items():  # an hour without a row for this slice is cached as empty
                found.setdefault(hour, ())
                self._remember(key, found[hour])
            return [b for hour in sorted(found) for b in found[hour]]

        first = min(s.start for s in spans)
        if missing:
            self._add(first, "hours", (self.slice, day, min(missing), max(missing) + HOUR), emit, len(missing))
        else:
            self._add(first, None, (), emit)

    def _day_parts(self, day: date, spans: list[Span]) -> list[Span]:
        """Serve each run of consecutive hours that is a part of the day from its part; return the other spans."""
        rest: list[Span] = []
        group: list[Span] = []
        for span in [*sorted(spans, key=lambda s: s.start), None]:
            if span is not None and group and group[-1].end == span.start:
                group.append(span)
                continue
            if group and is_day_part(group[0].start, group[-1].end):
                self._part(day, group[0].start, group[-1].end)
            else:
                rest += group
            group = [span] if span is not None else []
        return rest

    def _part(self, day: date, first: datetime, end: datetime) -> None:
        """Serve ``[first, end)`` from the day's part when it was merged from the current runs (else its hours)."""
        pointers = self.pointers(day)
        covered = {h: pointers[h] for h in _times(first, end, HOUR)}
        fingerprint = fingerprint_of(covered)
        key = ("part", self.slice, first, end, fingerprint, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(first, None, (), lambda _rows: hit)
            return

        def emit(result: Iterable[Any]) -> list[ServedRow]:
            found = [r for r in result if r.hour_runs == fingerprint]
            if not found:  # not written (yet) for these runs, or no row of the slice: its hours, a second read
                bound = self.stmt["hours"].bind((self.slice, day, first, end))
                return list(_current_hours(self.sess.execute(bound, execution_profile=READ_PROFILE), covered))
            got = [dataclasses.replace(ServedRow.of_row(first, "hours", "batch", r), width=end - first) for r in found]
            self._remember(key, got)
            return got

        self._add(first, "part", (self.slice, day, first, end), emit, 1)

    def run(self) -> Iterator[ServedRow]:
        """Yield every unit's rows in time order, reads running ahead while their first pages stay small.

        Reads are issued ahead of the one being consumed as long as the rows their first pages may hold stay within
        :data:`IN_FLIGHT_ROWS` (a short window's reads all run at once; a long one's a few at a time). Units never
        overlap in time (the spans of a plan are disjoint), so this order is the order of the rows' bucket starts,
        whether they come from the cache or from Cassandra: warm and cold answers merge alike.
        """
        units = sorted(self.units, key=lambda u: u.start)
        sess = self.sess
        pending: dict[int, Any] = {}
        issued, ahead_rows = 0, 0
        for i, unit in enumerate(units):
            while issued < len(units) and (issued <= i or ahead_rows + units[issued].rows <= IN_FLIGHT_ROWS):
                req = units[issued].request
                if req is not None:
                    pending[issued] = sess.execute_async(req, execution_profile=READ_PROFILE)
                    ahead_rows += units[issued].rows
                issued += 1
            future = pending.pop(i, None)
            ahead_rows -= unit.rows if future is not None else 0
            yield from unit.emit(future.result() if future is not None else ())


def _times(first: datetime, end: datetime, step: timedelta) -> Iterator[datetime]:
    t = first
    while t < end:
        yield t
        t += step


def _current_hours(rows: Iterable[Any], runs: Mapping[datetime, uuid.UUID]) -> Iterator[ServedRow]:
    """Yield the hour rows written by their hour's current run (rows of other runs are dropped)."""
    for r in rows:
        hour = utc(r.hour)
        if hour is not None and runs.get(hour) == r.run_id:
            yield ServedRow.of_row(hour, "hour", "batch", r)


def _minute_rows(rows: Iterable[Any]) -> Iterator[ServedRow]:
    """Turn speed minute rows into served rows."""
    return (ServedRow.of_row(utc(r.bucket_start), "minute", "speed", r) for r in rows)
