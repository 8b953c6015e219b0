"""The batch view's pointers (the current run of each hour), its watermark row and its stale hours.

A run's rows are invisible until :meth:`PointerStore.swap` names the run in the hour's pointer row: a single-row
write, so a reader sees the old run or the new one, whole. The watermark row holds ``[low, watermark)``, the
contiguous completed hours, and the operator's pin; serving answers from the batch view below the pin, else
below the watermark. A daily rollup records the :func:`fingerprint_of` its day's pointers, so a reader can tell
whether it is current.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from infra.cassandra import READ_PROFILE, WRITE_PROFILE, write_many
from infra.errors import TrendsError
from infra.settings import Settings
from views.buckets import HOUR, day_key, floor, utc
from views.store import cql
from views.store.losses import LossStore, plain
from views.store.rows import Request

if TYPE_CHECKING:
    from cassandra.cluster import Session

WATERMARK_ROW = "batch"  # the key of the one row of batch_watermark
DAYS_PER_READ = 32  # days of pointers read by one request (an IN over their partitions)


class Pointer(NamedTuple):
    """The current run of an hour, the indexed records of the hour it read (None: not recorded), its definition.

    ``definition`` is the view definition's fingerprint (None: a run from before definitions were recorded, taken
    as the serving one).
    """

    run_id: uuid.UUID
    indexed: int | None
    definition: str | None = None
    tens: bool = False  # the run wrote its ten-minute rows (infra/cql/0013)


class Watermark(NamedTuple):
    """The batch view's span of contiguous completed hours ``[low, mark)`` and the operator's pin."""

    low: datetime | None = None
    mark: datetime | None = None
    pinned: datetime | None = None

    @property
    def boundary(self) -> datetime | None:
        """Return where serving switches from the batch view to the speed view (the pin wins)."""
        return self.pinned or self.mark


class PinError(TrendsError):
    """A pin that would make holes: not a whole hour, above the watermark, or with no watermark yet."""


def pin_problem(at: datetime, current: Watermark) -> str | None:
    """Return why ``at`` cannot be pinned (None: it can).

    A pin moves ``[at, watermark)`` from the batch view to the speed view; above the watermark it would serve hours
    from the batch view that have no completed run (holes), and a pin between hours would split an hour's rows.
    """
    if at.tzinfo is None:
        return f"--at {at.isoformat()} needs a time zone (e.g. 2026-05-01T10:00Z)"
    if floor(plain(at), HOUR) != at:
        return f"--at {at.isoformat()} is not a whole hour: the boundary is a UTC hour"
    if current.mark is None:
        return "there is no batch watermark yet: nothing to pin below"
    if at > current.mark:
        return (
            f"--at {at.isoformat()} is above the batch watermark {current.mark.isoformat()}: hours from the watermark "
            "have no completed batch run, so serving them from the batch view would make holes"
        )
    return None


def pinned_hours(current: Watermark) -> list[datetime]:
    """Return the hours the pin moves from the batch view to the speed view: ``[pin, watermark)``."""
    out: list[datetime] = []
    if current.pinned is None or current.mark is None:
        return out
    hour = current.pinned
    while hour < current.mark:
        out.append(hour)
        hour += HOUR
    return out


def fingerprint_of(pointers: Mapping[datetime, uuid.UUID]) -> str:
    """Return a stable digest of which run is current for each hour."""
    return _fingerprint(frozenset(pointers.items()))


@functools.lru_cache(maxsize=4096)
def _fingerprint(pointers: frozenset[tuple[datetime, uuid.UUID]]) -> str:
    """Digest once per set of runs: serving checks every day's and part's runs on every state read."""
    canonical = json.dumps(sorted((h.isoformat(), str(r)) for h, r in pointers))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def decode_pointers(rows: Iterable[Any]) -> dict[datetime, Pointer]:
    """Return pointer rows (``hour, run_id, indexed, definition, tens``) by their hour."""
    return {
        utc(r.hour): Pointer(r.run_id, r.indexed, getattr(r, "definition", None), bool(getattr(r, "tens", False)))  # type: ignore[misc]
        for r in rows
    }


def decode_watermark(row: Any) -> Watermark:
    """Return the watermark row (or None: no batch run has completed yet)."""
    return Watermark() if row is None else Watermark(utc(row.low), utc(row.watermark), utc(row.pinned))


def decode_stale(rows: Iterable[Any]) -> dict[datetime, int]:
    """Return stale rows as hour -> the records the index held when it noticed the hour."""
    return {utc(r.hour): int(r.records) for r in rows}  # type: ignore[misc]


class PointerStore:
    """Prepared statements over the pointer, watermark and staleness tables of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.Statements(settings, sess)
        self._ping = cql.render(settings, cql.PING)

    # -- reads issued together by a reader (statement, values); decode the rows with the functions above --------
    def pointers_request(self, day: date) -> Request:
        """Return the read of a day's pointer rows."""
        return self._stmt(cql.SELECT_POINTERS), (day,)

    def pointers_requests(self, days: Sequence[date]) -> list[Request]:
        """Return the reads of the pointer rows of the days: one per :data:`DAYS_PER_READ` of them (``IN``)."""
        stmt = self._stmt(cql.SELECT_POINTERS_OF_DAYS)
        return [(stmt, (list(days[i : i + DAYS_PER_READ]),)) for i in range(0, len(days), DAYS_PER_READ)]

    def watermark_request(self) -> Request:
        """Return the read of the watermark row."""
        return self._stmt(cql.SELECT_WATERMARK), (WATERMARK_ROW,)

    def stale_request(self, topic: str, start: datetime, end: datetime) -> Request:
        """Return the read of the stale hours of ``[start, end)``."""
        return self._stmt(cql.SELECT_STALE_BETWEEN), (topic, start, end)

    # -- pointers -------------------------------------------------------------------------------------------------
    def runs(self, day: date) -> dict[datetime, uuid.UUID]:
        """Return the current run of each completed hour of a day."""
        rows = self.sess.execute(*self.pointers_request(day), execution_profile=READ_PROFILE)
        return {h: p.run_id for h, p in decode_pointers(rows).items()}

    def pointers_indexed(self, days: Iterable[date]) -> dict[datetime, Pointer]:
        """Return the pointer of every completed hour of the days (one read per day, concurrently)."""
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        params = [(d,) for d in days]
        if not params:
            return {}
        results = execute_concurrent_with_args(
            self.sess,
            self._stmt(cql.SELECT_POINTERS),
            params,
            concurrency=self.settings.cassandra.read_concurrency,
            raise_on_first_error=True,
            execution_profile=READ_PROFILE,
        )
        out: dict[datetime, Pointer] = {}
        for r in results:
            out.update(decode_pointers(r.result_or_exc))
        return out

    def swap(
        self, swaps: Sequence[tuple[datetime, uuid.UUID, int | None]], definition: str | None = None, tens: bool = False
    ) -> None:
        """Make each run the current version of its hour (one row per hour: atomic for readers).

        :arg swaps: (hour, run id, the hour's indexed records the run read) each.
        :arg definition: the fingerprint of the view definition the runs computed with.
        :arg tens: the runs wrote their ten-minute rows (serving reads them for whole ten minutes).
        """
        now = datetime.now(UTC)
        params = [(day_key(h), h, run_id, now, indexed, definition, tens) for h, run_id, indexed in swaps]
        write_many(self.settings, self.sess, self._stmt(cql.INSERT_POINTER), params, lambda p: (p[0],))

    def completed(self, hour: datetime, cache: dict[date, dict[datetime, uuid.UUID]]) -> bool:
        """Tell whether the hour has a current run (pointers read once per day into ``cache``)."""
        day = day_key(hour)
        if day not in cache:
            cache[day] = self.runs(day)
        return hour in cache[day]

    # -- watermark ------------------------------------------------------------------------------------------------
    def watermark(self) -> Watermark:
        """Return the watermark row."""
        return decode_watermark(self.sess.execute(*self.watermark_request(), execution_profile=READ_PROFILE).one())

    def advance(self, hint: datetime, max_steps: int = 24 * 400) -> tuple[datetime | None, datetime | None]:
        """Extend [low, watermark) over contiguous completed hours, starting from ``hint`` if there is none yet.

        Never over an incomplete hour (records lost before indexing may belong to it, :mod:`views.store.losses`):
        the watermark waits there until the loss is accepted.

        :returns: the new (low, watermark).
        """
        current = self.watermark()
        low, mark = current.low, current.mark
        cache: dict[date, dict[datetime, uuid.UUID]] = {}
        if mark is None or low is None:
            if not self.completed(hint, cache):
                return None, None
            low, mark = hint, hint + HOUR
        was_low, was_mark = (low, mark) if current.mark is not None else (hint, hint)
        steps = 0
        while steps < max_steps and self.completed(mark, cache):
            mark += HOUR
            steps += 1
        while steps < 2 * max_steps and self.completed(low - HOUR, cache):
            low -= HOUR
            steps += 1
        losses = LossStore(self.settings, self.sess)
        lost = losses.losses(self.settings.kafka.events_topic)
        if lost:
            incomplete = losses.incomplete(self.settings.kafka.events_topic, low, mark, lost)
            mark = min((h for h in incomplete if h >= was_mark), default=mark)
            low = max((h + HOUR for h in incomplete if h < was_low), default=low)
            if mark <= low:
                return current.low, current.mark
        self.write_watermark(low, mark)
        return low, mark

    def write_watermark(self, low: datetime, mark: datetime) -> None:
        """Set the span ``[low, mark)`` of contiguous completed hours (the pin stays)."""
        self.sess.execute(
            self._stmt(cql.INSERT_WATERMARK),
            (WATERMARK_ROW, low, mark, datetime.now(UTC)),
            execution_profile=WRITE_PROFILE,
        )

    def pin(self, boundary: datetime | None) -> None:
        """Pin (or with None unpin) the boundary serving uses.

        :raises PinError: when the boundary is not a whole hour at or below the watermark (:func:`pin_problem`).
        """
        if boundary is not None:
            problem = pin_problem(boundary, self.watermark())
            if problem:
                raise PinError(problem)
        self.sess.execute(
            self._stmt(cql.PIN_WATERMARK), (boundary, datetime.now(UTC), WATERMARK_ROW), execution_profile=WRITE_PROFILE
        )

    def ping(self, timeout: float) -> None:
        """Read one row of the watermark table (readiness); raise the driver's error when Cassandra cannot."""
        self.sess.execute(self._ping, execution_profile=READ_PROFILE, timeout=timeout)

    # -- stale hours ----------------------------------------------------------------------------------------------
    def stale(self, topic: str) -> dict[datetime, int]:
        """Return every hour noticed stale, with the records the index held then (compare with its pointer)."""
        return decode_stale(self.sess.execute(self._stmt(cql.SELECT_STALE), (topic,), execution_profile=READ_PROFILE))

    def mark_stale(self, topic: str, hours: Mapping[datetime, int]) -> None:
        """Record hours whose indexed records exceed what their current run read (hour -> records indexed)."""
        now = datetime.now(UTC)
        write_many(
            self.settings,
            self.sess,
            self._stmt(cql.INSERT_STALE),
            [(topic, h, n, now) for h, n in hours.items()],
            None,
        )
