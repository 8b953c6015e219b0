"""The speed view's rows (whole-bucket upserts with a TTL), its freshness row, and what it has processed.

Each write is the full cumulative state of a bucket, never an increment: writing it again (a replayed
micro-batch) writes the same row, which keeps an at-least-once sink exactly-once in effect.

Coverage (``infra/cql/0005``) says which minutes the speed layer counted, so serving never takes a missing row
for a zero: an *epoch* per checkpoint lifetime with the event time it covers, a row per epoch and hour written
before the hour's first speed row (so its rows are kept at least until ``first_written_at + ttl_s``), and per
slice the events counted in each minute, written with the row and its TTL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, WRITE_PROFILE
from infra.settings import Settings
from views.buckets import HOUR, day_key, days_between, floor, utc
from views.store import cql
from views.store.rows import Request, read_many

if TYPE_CHECKING:
    from cassandra.cluster import Session


@dataclass(frozen=True)
class QueryFreshness:
    """The freshness row of a streaming query: the newest event time written and its last micro-batch."""

    query: str
    newest_event_ts: datetime | None
    watermark: datetime | None
    last_batch_id: int | None
    last_batch_rows: int | None
    updated_at: datetime | None


@dataclass(frozen=True)
class Epoch:
    """A checkpoint's lifetime of a streaming query: the minutes it counts completely, and how far it has read.

    :arg covered_from: first minute counted completely (None: from the topic's beginning).
    :arg seen_until: end of the minute of its newest event (None: nothing written yet).
    :arg first_hour: the earliest hour it has written (or read through).
    """

    id: str
    started_at: datetime
    covered_from: datetime | None
    seen_until: datetime | None
    starting_offsets: str = ""
    last_batch_id: int | None = None
    updated_at: datetime | None = None
    first_hour: datetime | None = None
    definition: str | None = None  # the view definition's fingerprint (None: an epoch from before it was recorded)
    read_all_at: datetime | None = None  # when it had last read every record the topic held (None: not yet)

    @property
    def counts_from(self) -> datetime | None:
        """Return the first minute the epoch answers for (None: none yet).

        From the topic's beginning it has read, but before the first hour it wrote it knows of no event: a replay
        of history behind newer events is dropped as late there, so those minutes are not its to answer.
        """
        return self.covered_from if self.covered_from is not None else self.first_hour


@dataclass(frozen=True)
class KeptHour:
    """An hour an epoch processed, and until when all its speed rows are surely kept (their TTL)."""

    hour: datetime
    epoch: str
    kept_until: datetime | None  # None: the hour's first-write record has expired


def epoch_row(query: str, epoch: Epoch, now: datetime) -> tuple[Any, ...]:
    """Return the values of :data:`views.store.cql.INSERT_EPOCH` for a new epoch."""
    return (query, epoch.id, epoch.started_at, epoch.covered_from, epoch.starting_offsets, now, epoch.definition)


def decode_epochs(rows: Iterable[Any]) -> list[Epoch]:
    """Turn ``speed_epochs`` rows into epochs, oldest first."""
    out = [
        Epoch(
            r.epoch, utc(r.started_at) or datetime.min.replace(tzinfo=UTC), utc(r.covered_from), utc(r.seen_until),
            r.starting_offsets or "", r.last_batch_id, utc(r.updated_at), utc(r.first_hour),
            getattr(r, "definition", None), utc(getattr(r, "read_all_at", None)),
        )
        for r in rows
    ]  # fmt: skip
    return sorted(out, key=lambda e: e.started_at)


def decode_hours(rows: Iterable[Any]) -> list[KeptHour]:
    """Turn ``speed_hours`` rows into the hours each epoch processed, with how long their rows are kept."""
    out = []
    for r in rows:
        first = utc(r.first_written_at)
        if first is None or r.ttl_s is None:
            kept = None
        else:  # a TTL of 0 is none: rows kept until deleted
            kept = first + timedelta(seconds=r.ttl_s) if r.ttl_s > 0 else datetime.max.replace(tzinfo=UTC)
        hour = utc(r.hour)
        assert hour is not None  # noqa: S101 - a clustering column is never null
        out.append(KeptHour(hour, r.epoch, kept))
    return out


def decode_counts(rows: Iterable[Any]) -> dict[tuple[str, datetime], int]:
    """Turn ``speed_coverage`` rows into ``(epoch, minute) -> events counted``."""
    out: dict[tuple[str, datetime], int] = {}
    for r in rows:
        for minute, events in (r.counts or {}).items():
            m = utc(minute)
            assert m is not None  # noqa: S101 - a map key is never null
            out[(r.epoch, m)] = int(events)
    return out


def decode_freshness(rows: Iterable[Any]) -> tuple[datetime | None, datetime | None]:
    """Turn the rows of :meth:`SpeedRows.progress_request` into (newest event written, last update)."""
    row = next(iter(rows), None)
    return (utc(row.newest_event_ts), utc(row.updated_at)) if row else (None, None)


class SpeedRows:
    """Prepared statements over the speed view and its progress table of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.Statements(settings, sess)

    def write(self, query: str, rows: Iterable[Any], batch_id: int, ttl_seconds: int) -> tuple[int, datetime | None]:
        """Upsert a query's whole bucket rows (Spark rows of the view's columns); raise on the first failed write.

        :returns: the rows written and the newest event time among them.
        """
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        params = []
        newest = None
        for r in rows:
            bucket = utc(r.bucket_start)
            assert bucket is not None  # noqa: S101 - the window start is never null
            max_ts = utc(r.max_ts)
            params.append(
                (
                    query,
                    r.slice,
                    day_key(bucket),
                    bucket,
                    r.events,
                    bytes(r.users_hll),
                    bytes(r.values_kll),
                    bytes(r.items_fi),
                    utc(r.min_ts),
                    max_ts,
                    batch_id,
                    ttl_seconds,
                )
            )
            if max_ts is not None and (newest is None or max_ts > newest):
                newest = max_ts
        execute_concurrent_with_args(
            self.sess,
            self._stmt(cql.UPSERT_SPEED),
            params,
            concurrency=self.settings.cassandra.write_concurrency,
            raise_on_first_error=True,
            execution_profile=WRITE_PROFILE,
        )
        return len(params), newest

    def write_progress(
        self, query: str, newest: datetime | None, watermark: datetime | None, batch_id: int, rows: int
    ) -> None:
        """Record a micro-batch: the newest event time written so far, the batch and its rows."""
        self.sess.execute(
            self._stmt(cql.UPSERT_PROGRESS),
            (query, newest, watermark, batch_id, rows, datetime.now(UTC)),
            execution_profile=WRITE_PROFILE,
        )

    def progress_request(self, query: str) -> Request:
        """Return the read of a query's freshness (``newest_event_ts, updated_at``)."""
        return self._stmt(cql.SELECT_PROGRESS), (query,)

    def newest_event(self, query: str) -> datetime | None:
        """Return the newest event time the query has written (None: nothing yet)."""
        row = self.sess.execute(*self.progress_request(query), execution_profile=READ_PROFILE).one()
        return utc(row.newest_event_ts) if row else None

    def progress(self) -> list[QueryFreshness]:
        """Return the freshness row of every streaming query."""
        rows = self.sess.execute(cql.render(self.settings, cql.SELECT_ALL_PROGRESS), execution_profile=READ_PROFILE)
        return [
            QueryFreshness(
                r.query, utc(r.newest_event_ts), utc(r.watermark), r.last_batch_id, r.last_batch_rows,
                utc(r.updated_at),
            )
            for r in rows
        ]  # fmt: skip

    def hour_minutes(self, query: str, slice_: str, hour: datetime) -> dict[datetime, Any]:
        """Return a query's minute rows of a slice (``bucket_start, events, users_hll``) in an hour, by bucket."""
        rows = self.sess.execute(
            self._stmt(cql.SELECT_SPEED_MINUTES),
            (query, slice_, day_key(hour), hour, hour + HOUR),
            execution_profile=READ_PROFILE,
        )
        return {utc(r.bucket_start): r for r in rows}  # type: ignore[misc]

    # -- coverage: epochs, the hours each processed, the minutes counted ------------------------------------------
    def epochs_request(self, query: str) -> Request:
        """Return the read of a query's epochs (decode with :func:`decode_epochs`)."""
        return self._stmt(cql.SELECT_EPOCHS), (query,)

    def epochs(self, query: str) -> list[Epoch]:
        """Return the query's epochs, oldest first."""
        return decode_epochs(self.sess.execute(*self.epochs_request(query), execution_profile=READ_PROFILE))

    def register_epoch(self, query: str, epoch: Epoch) -> None:
        """Record a new epoch (once: the sink calls it only for an epoch it finds no row of)."""
        self.sess.execute(
            self._stmt(cql.INSERT_EPOCH),
            epoch_row(query, epoch, datetime.now(UTC)),
            execution_profile=WRITE_PROFILE,
        )

    def advance_epoch(
        self, query: str, epoch: str, seen_until: datetime | None, first_hour: datetime | None, batch_id: int
    ) -> None:
        """Record how far the epoch has read (and its earliest hour), after the batch's rows and counts."""
        self.sess.execute(
            self._stmt(cql.ADVANCE_EPOCH),
            (seen_until, first_hour, batch_id, datetime.now(UTC), query, epoch),
            execution_profile=WRITE_PROFILE,
        )

    def read_all(self, query: str, epoch: str, at: datetime) -> None:
        """Record that the epoch had read every record the topic held at ``at`` (its rows of them written)."""
        self.sess.execute(self._stmt(cql.READ_ALL_EPOCH), (at, query, epoch), execution_profile=WRITE_PROFILE)

    def mark_hours(
        self, query: str, epoch: str, hours: Iterable[datetime], ttl_seconds: int, read_until: datetime | None = None
    ) -> list[datetime]:
        """Record the hours an epoch is about to write, each once: when it was first written, and the rows' TTL.

        Called before the rows are written, so every row of the hour is written at or after ``first_written_at``.
        An hour the epoch had already read into (before ``read_until``, the end of what it read before this batch)
        that has no mark any more lost its mark to the TTL, and its older rows with it: it is not marked again
        (a fresh mark would claim those rows kept), so its minutes stay gaps. Return the hours marked.
        """
        hours = sorted(set(hours))
        found = [
            self.sess.execute_async(self._stmt(cql.SELECT_EPOCH_HOUR), (query, day_key(h), h, epoch)) for h in hours
        ]
        now = datetime.now(UTC)
        todo = [
            (query, day_key(h), h, epoch, now, ttl_seconds, ttl_seconds)
            for h, f in zip(hours, found, strict=True)
            if ((row := f.result().one()) is None or row.first_written_at is None)
            and (read_until is None or h >= read_until)
        ]
        self._write_many(cql.INSERT_SPEED_HOUR, todo)
        return [t[2] for t in todo]

    def write_counts(
        self, query: str, epoch: str, counts: Mapping[tuple[str, datetime], Mapping[datetime, int]], ttl: int
    ) -> None:
        """Record the events counted per minute, per (slice, hour): the rows' values, with the rows' TTL."""
        params = [
            (ttl, dict(minutes), query, slice_, day_key(hour), hour, epoch)
            for (slice_, hour), minutes in counts.items()
        ]
        self._write_many(cql.UPSERT_COUNTS, params)

    def _write_many(self, template: str, params: list[tuple[Any, ...]]) -> None:
        if not params:
            return
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        execute_concurrent_with_args(
            self.sess,
            self._stmt(template),
            params,
            concurrency=self.settings.cassandra.write_concurrency,
            raise_on_first_error=True,
            execution_profile=WRITE_PROFILE,
        )

    def queries(self) -> list[str]:
        """Return every speed query that ever started an epoch (whose rows may still be kept)."""
        return [
            r.query for r in self.sess.execute(self._stmt(cql.SELECT_SPEED_QUERIES), execution_profile=READ_PROFILE)
        ]

    def delete_hour(self, query: str, slices: Iterable[str], hour: datetime) -> int:
        """Delete a query's minutes (rollups, edges) of the hour in the slices, and its counts; return the slices done.

        An erasure's purge: the hour is served by the batch view, which was recomputed without the subject.
        """
        day = day_key(hour)
        todo = sorted(set(slices))
        self._write_many(cql.DELETE_SPEED_MINUTES, [(query, sl, day, hour, hour + HOUR) for sl in todo])
        self._write_many(cql.DELETE_SPEED_ROLLUPS, [(query, sl, day, hour, hour + HOUR) for sl in todo])
        self._write_many(cql.DELETE_SPEED_EDGES, [(query, sl, day, hour, hour + HOUR) for sl in todo])
        self._write_many(cql.DELETE_SPEED_COVERAGE, [(query, sl, day, hour) for sl in todo])
        return len(todo)

    def hours_requests(self, query: str, start: datetime, end: datetime) -> list[Request]:
        """Return the reads of the hours processed in ``[start, end)`` (one per UTC day; :func:`decode_hours`)."""
        return [(self._stmt(cql.SELECT_SPEED_HOURS), (query, d, start, end)) for d in days_between(start, end)]

    def counts_requests(self, query: str, slice_: str, start: datetime, end: datetime) -> list[Request]:
        """Return the reads of a slice's counted minutes in ``[start, end)`` (one per day; :func:`decode_counts`)."""
        return [(self._stmt(cql.SELECT_COUNTS), (query, slice_, d, start, end)) for d in days_between(start, end)]

    def counted(
        self, query: str, slice_: str, start: datetime, end: datetime, boundary: datetime | None, epochs: list[Epoch]
    ) -> tuple[dict[tuple[datetime, str], datetime | None], dict[tuple[str, datetime], int]]:
        """Read what the query counted in the part of ``[start, end)`` it may serve: its hours kept, minutes counted.

        Only from the boundary on, and only where an epoch has read: speed rows expire by the time they were
        written, not by their event time, so no other bound is safe. One round of concurrent reads (none when
        nothing of the window is the speed layer's).

        :returns: ``(hour, epoch) -> kept until`` and ``(epoch, minute) -> events counted`` for the slice.
        """
        span = counted_span(start, end, boundary, epochs)
        if span is None:
            return {}, {}
        reqs = self.counted_requests(query, slice_, *span)
        return decode_counted(read_many(self.sess, reqs), span)

    def counted_requests(self, query: str, slice_: str, lo: datetime, hi: datetime) -> list[Request]:
        """Return the reads of the hours kept and the minutes counted in ``[floor(lo, hour), hi)``: one pair per day.

        Their rows decode with :func:`decode_counted` (the hours' reads first, then the counts', day by day).
        """
        lo = floor(lo, HOUR)
        return [*self.hours_requests(query, lo, hi), *self.counts_requests(query, slice_, lo, hi)]


def counted_span(
    start: datetime, end: datetime, boundary: datetime | None, epochs: list[Epoch]
) -> tuple[datetime, datetime] | None:
    """Return the part of ``[start, end)`` the speed layer may serve (from the boundary, where an epoch read)."""
    lo = start if boundary is None else max(start, boundary)
    firsts = [e.covered_from for e in epochs]
    if epochs and None not in firsts:
        lo = max(lo, min(t for t in firsts if t is not None))
    hi = min(end, max((e.seen_until for e in epochs if e.seen_until is not None), default=lo))
    return (lo, hi) if lo < hi else None


def decode_counted(
    rows: list[list[Any]], span: tuple[datetime, datetime]
) -> tuple[dict[tuple[datetime, str], datetime | None], dict[tuple[str, datetime], int]]:
    """Decode the rows of :meth:`SpeedRows.counted_requests` (of a span holding ``span``), keeping ``span``'s part."""
    lo, hi = floor(span[0], HOUR), span[1]
    days = len(rows) // 2
    kept = {(k.hour, k.epoch): k.kept_until for day in rows[:days] for k in decode_hours(day) if lo <= k.hour < hi}
    counts = {key: n for day in rows[days:] for key, n in decode_counts(day).items() if lo <= key[1] and
              floor(key[1], HOUR) < hi}  # fmt: skip
    return kept, counts
