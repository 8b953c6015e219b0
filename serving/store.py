"""Read both views from Cassandra for a merge plan: the boundary, coverage, freshness and the rows of each span.

All statements are prepared once per reader and bound; every read uses the read consistency profile. A reader
holds one session (the API keeps one for its lifetime).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from batch_layer.store import fingerprint_of, utc
from infra.cassandra import READ_PROFILE, table
from infra.settings import Settings
from serving.merge import DAY, HOUR, Span, floor

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

SKETCH_FIELDS = ("users_hll", "values_kll", "items_fi")


@dataclass(frozen=True)
class Bucket:
    """One row of a view as a query sees it."""

    start: datetime
    resolution: str
    layer: str
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes


@dataclass(frozen=True)
class Coverage:
    """What the merge rule needs to know about both layers for a window."""

    boundary: datetime | None
    pinned: bool
    batch_low: datetime | None
    batch_hours: set[datetime]
    current_days: set[date]
    speed_newest_event: datetime | None
    speed_updated_at: datetime | None

    @property
    def speed_fresh_until(self) -> datetime | None:
        """Return the end of the minute of the newest event the speed layer has written."""
        if self.speed_newest_event is None:
            return None
        return floor(self.speed_newest_event, timedelta(minutes=1)) + timedelta(minutes=1)


def _days(start: datetime, end: datetime) -> list[date]:
    d, out = floor(start, DAY), []
    while d < end:
        out.append(d.date())
        d += DAY
    return out


class ViewReader:
    """Prepared reads of the speed and batch views."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        p = sess.prepare
        self.q_watermark = p(f"SELECT low, watermark, pinned FROM {table(settings, 'batch_watermark')} WHERE name = ?")
        self.q_pointers = p(f"SELECT hour, run_id FROM {table(settings, 'batch_intervals')} WHERE day = ?")
        self.q_progress = p(
            f"SELECT newest_event_ts, updated_at FROM {table(settings, 'speed_progress')} WHERE query = ?"
        )
        self._rows: dict[frozenset[str], dict[str, Any]] = {}
        self.q_day_rollups = p(
            f"SELECT day, hour_runs FROM {table(settings, 'batch_days')} WHERE slice = ? AND month = ?"
        )
        self._pointers: dict[date, dict[datetime, Any]] = {}

    def _row_statements(self, fields: frozenset[str]) -> dict[str, Any]:
        """Return the row reads selecting only ``fields`` of the sketches (prepared once per field set)."""
        stmts = self._rows.get(fields)
        if stmts is None:
            cols = ", ".join(["events", *(f for f in SKETCH_FIELDS if f in fields)])
            p, t = self.sess.prepare, functools.partial(table, self.settings)
            stmts = {
                "days": p(
                    f"SELECT day, hour_runs, {cols} FROM {t('batch_days')} "
                    "WHERE slice = ? AND month = ? AND day >= ? AND day < ?"
                ),
                "hours": p(
                    f"SELECT hour, run_id, {cols} FROM {t('batch_hours')} "
                    "WHERE slice = ? AND day = ? AND hour >= ? AND hour < ?"
                ),
                "minutes": p(
                    f"SELECT bucket_start, {cols} FROM {t('batch_minutes')} "
                    "WHERE slice = ? AND hour = ? AND run_id = ? AND bucket_start >= ? AND bucket_start < ?"
                ),
                "speed": p(
                    f"SELECT bucket_start, {cols} FROM {t('speed_view')} "
                    "WHERE slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
                ),
            }
            self._rows[fields] = stmts
        return stmts

    def fresh(self) -> ViewReader:
        """Return a reader sharing this one's session and prepared statements, with an empty pointer cache.

        A long-lived process (the API) takes one per request: batch reruns move the pointers, and requests served
        by concurrent threads must not share a cache.
        """
        other = copy.copy(self)
        other._pointers = {}
        return other

    def _exec(self, stmt: Any, params: tuple[Any, ...]) -> Iterable[Any]:
        return self.sess.execute(stmt, params, execution_profile=READ_PROFILE)  # type: ignore[no-any-return]

    def _exec_many(self, requests: list[tuple[Any, tuple[Any, ...]]]) -> list[list[Any]]:
        """Run reads concurrently (one round trip of latency instead of one per read); results in order."""
        futures = [self.sess.execute_async(stmt, params, execution_profile=READ_PROFILE) for stmt, params in requests]
        return [list(f.result()) for f in futures]

    def pointers(self, day: date) -> dict[datetime, Any]:
        """Return the current batch run per completed hour of a day (cached per reader)."""
        self._load_pointers([day])
        return self._pointers[day]

    def _load_pointers(self, days: list[date]) -> None:
        missing = [d for d in days if d not in self._pointers]
        for day, rows in zip(missing, self._exec_many([(self.q_pointers, (d,)) for d in missing]), strict=True):
            self._pointers[day] = {utc(r.hour): r.run_id for r in rows}  # type: ignore[misc]

    def coverage(self, start: datetime, end: datetime, slice_: str) -> Coverage:
        """Read the boundary, the completed hours, current daily rollups and the speed freshness.

        All of it in one round of concurrent reads: the watermark, the speed progress, the hour pointers of the
        window's days (those not cached yet) and the daily rollups' fingerprints of its months.
        """
        days = _days(start, end)
        missing = [d for d in days if d not in self._pointers]
        months: dict[str, list[date]] = {}
        for day in days:
            months.setdefault(day.strftime("%Y-%m"), []).append(day)
        rows = self._exec_many(
            [
                (self.q_watermark, ("batch",)),
                (self.q_progress, (self.settings.speed.query_name,)),
                *((self.q_pointers, (d,)) for d in missing),
                *((self.q_day_rollups, (slice_, m)) for m in months),
            ]
        )
        mark_rows, prog_rows, rest = rows[0], rows[1], rows[2:]
        for day, pointer_rows in zip(missing, rest[: len(missing)], strict=True):
            self._pointers[day] = {utc(r.hour): r.run_id for r in pointer_rows}  # type: ignore[misc]
        current: set[date] = set()
        for month_days, rollups in zip(months.values(), rest[len(missing) :], strict=True):
            wanted = set(month_days)
            for r in rollups:
                if r.day in wanted and r.hour_runs == fingerprint_of(self._pointers[r.day]):
                    current.add(r.day)
        hours: set[datetime] = set()
        for day in days:
            hours |= set(self._pointers[day])
        row = mark_rows[0] if mark_rows else None
        low, mark, pinned = (utc(row.low), utc(row.watermark), utc(row.pinned)) if row else (None, None, None)
        prog = prog_rows[0] if prog_rows else None
        return Coverage(
            boundary=pinned or mark,
            pinned=pinned is not None,
            batch_low=low,
            batch_hours=hours,
            current_days=current,
            speed_newest_event=utc(prog.newest_event_ts) if prog else None,
            speed_updated_at=utc(prog.updated_at) if prog else None,
        )

    def read(self, spans: list[Span], slice_: str, fields: Iterable[str] = SKETCH_FIELDS) -> list[Bucket]:
        """Return the rows that serve the spans (gaps read nothing), with all reads issued concurrently.

        Consecutive whole hours of a day are read with one range query; rows of other runs are dropped. Only the
        sketches in ``fields`` are read (the others are empty in the buckets): an answer that needs the items only
        moves a fraction of the bytes.
        """
        stmt = self._row_statements(frozenset(fields))
        requests: list[tuple[Any, tuple[Any, ...]]] = []
        keep: list[Callable[[Any], Bucket | None]] = []

        def add(stmt: Any, params: tuple[Any, ...], convert: Callable[[Any], Bucket | None]) -> None:
            requests.append((stmt, params))
            keep.append(convert)

        hour_runs: dict[date, list[Span]] = {}
        for span in spans:
            if span.layer == "gap":
                continue
            if span.layer == "speed":
                for day in _days(span.start, span.end):
                    add(
                        stmt["speed"],
                        (slice_, day, span.start, span.end),
                        lambda r: self._bucket(utc(r.bucket_start), "minute", "speed", r),
                    )
            elif span.resolution == "day":
                day = span.start.date()
                add(
                    stmt["days"],
                    (slice_, day.strftime("%Y-%m"), day, day + timedelta(days=1)),
                    functools.partial(self._bucket, span.start, "day", "batch"),
                )
            elif span.resolution == "hour":
                hour_runs.setdefault(span.start.date(), []).append(span)
            else:
                hour = floor(span.start, HOUR)
                run = self.pointers(hour.date()).get(hour)
                add(
                    stmt["minutes"],
                    (slice_, hour, run, span.start, span.end),
                    lambda r: self._bucket(utc(r.bucket_start), "minute", "batch", r),
                )
        for day, day_spans in hour_runs.items():
            pts = self.pointers(day)
            wanted = {s.start for s in day_spans}
            lo, hi = min(wanted), max(s.end for s in day_spans)

            def hour_row(r: Any, pts: dict[datetime, Any] = pts, wanted: set[datetime] = wanted) -> Bucket | None:
                hour = utc(r.hour)
                if hour in wanted and pts.get(hour) == r.run_id:
                    return self._bucket(hour, "hour", "batch", r)
                return None

            add(stmt["hours"], (slice_, day, lo, hi), hour_row)
        out: list[Bucket] = []
        for convert, rows in zip(keep, self._exec_many(requests), strict=True):
            out.extend(b for b in map(convert, rows) if b is not None)
        return out

    @staticmethod
    def _bucket(start: datetime | None, resolution: str, layer: str, r: Any) -> Bucket:
        if start is None:
            msg = "a view row without a bucket start"
            raise ValueError(msg)
        return Bucket(
            start.astimezone(UTC),
            resolution,
            layer,
            int(r.events),
            bytes(getattr(r, "users_hll", b"")),
            bytes(getattr(r, "values_kll", b"")),
            bytes(getattr(r, "items_fi", b"")),
        )
