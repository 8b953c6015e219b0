"""The batch view in Cassandra: versioned writes, the pointer swap per interval, daily re-merge, lineage, watermark.

A run writes every row of its interval under its own ``run_id`` and only then moves the interval's pointer
(``batch_intervals``) to it — a single-row write, so a reader sees either the old run or the new one, whole. The
daily rollup records which hour runs it merged; a reader that finds it stale merges the hours itself. Old
versions are deleted after the swap, keeping the last ``keep_versions``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, WRITE_PROFILE, table, write_many
from infra.settings import Settings
from views import sketches

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

HOUR = timedelta(hours=1)
WATERMARK_ROW = "batch"


def utc(ts: datetime | None) -> datetime | None:
    """Return a driver timestamp (naive UTC) as an aware datetime."""
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def new_run_id() -> uuid.UUID:
    """Return a time-based id: runs of an interval sort by creation."""
    return uuid.uuid1()


@dataclass(frozen=True)
class ViewRow:
    """One bucket of one slice, as computed by Spark."""

    slice: str
    bucket_start: datetime
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes
    min_ts: datetime | None
    max_ts: datetime | None

    @classmethod
    def from_spark(cls, row: Any) -> ViewRow:
        """Convert a collected Spark row of :data:`views.aggregation.VIEW_COLUMNS`, in that order.

        Positional access: a year of sparse history is hundreds of thousands of rows, and ``Row.__getattr__``
        searches the field names on every access.
        """
        bucket_start, slice_, events, users_hll, values_kll, items_fi, min_ts, max_ts = row
        bucket = utc(bucket_start)
        assert bucket is not None  # noqa: S101 - grouping key, never null
        return cls(
            slice_, bucket, int(events), bytes(users_hll), bytes(values_kll), bytes(items_fi), utc(min_ts), utc(max_ts)
        )


class BatchStore:
    """Prepared statements over one session; every method is one idempotent step of a run."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        t = {name: table(settings, name) for name in (
            "batch_minutes", "batch_hours", "batch_days", "batch_intervals", "batch_runs",
            "batch_watermark", "batch_day_slices",
        )}  # fmt: skip
        prep = sess.prepare
        self.ins_minute = prep(
            f"INSERT INTO {t['batch_minutes']} (slice, hour, run_id, bucket_start, events, users_hll, values_kll, "
            "items_fi, min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.ins_hour = prep(
            f"INSERT INTO {t['batch_hours']} (slice, day, hour, run_id, events, users_hll, values_kll, items_fi, "
            "min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.ins_day_slice = prep(f"INSERT INTO {t['batch_day_slices']} (day, slice) VALUES (?, ?)")
        self.sel_day_slices = prep(f"SELECT slice FROM {t['batch_day_slices']} WHERE day = ?")
        self.sel_hours = prep(
            f"SELECT hour, run_id, events, users_hll, values_kll, items_fi, min_ts, max_ts FROM {t['batch_hours']} "
            "WHERE slice = ? AND day = ?"
        )
        self.ins_day = prep(
            f"INSERT INTO {t['batch_days']} (slice, month, day, hour_runs, hours, events, users_hll, values_kll, "
            "items_fi, min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.ins_pointer = prep(
            f"INSERT INTO {t['batch_intervals']} (day, hour, run_id, completed_at, indexed) VALUES (?, ?, ?, ?, ?)"
        )
        self.sel_pointers = prep(f"SELECT hour, run_id FROM {t['batch_intervals']} WHERE day = ?")
        self.ins_run = prep(
            f"INSERT INTO {t['batch_runs']} (hour, run_id, interval_end, status, topic, offsets, forced, "
            "code_version, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.upd_run = prep(
            f"UPDATE {t['batch_runs']} SET status = ?, rows_read = ?, rows_unparseable = ?, rows_outside = ?, "
            "rows_in_interval = ?, rows_deduped = ?, rows_kept = ?, rows_late = ?, slices = ?, rows_indexed = ?, "
            "finished_at = ?, error = ? WHERE hour = ? AND run_id = ?"
        )
        self.sel_runs = prep(f"SELECT run_id, status FROM {t['batch_runs']} WHERE hour = ?")
        self.del_minutes = prep(f"DELETE FROM {t['batch_minutes']} WHERE slice = ? AND hour = ? AND run_id = ?")
        self.del_hour = prep(f"DELETE FROM {t['batch_hours']} WHERE slice = ? AND day = ? AND hour = ? AND run_id = ?")
        self.sel_watermark = prep(f"SELECT low, watermark, pinned FROM {t['batch_watermark']} WHERE name = ?")
        self.ins_watermark = prep(
            f"INSERT INTO {t['batch_watermark']} (name, low, watermark, updated_at) VALUES (?, ?, ?, ?)"
        )
        self.pin_watermark = prep(f"UPDATE {t['batch_watermark']} SET pinned = ?, updated_at = ? WHERE name = ?")
        for stmt in (
            self.ins_minute, self.ins_hour, self.ins_day, self.ins_day_slice, self.ins_pointer, self.ins_run,
            self.upd_run,
        ):  # fmt: skip
            stmt.is_idempotent = True

    # -- a run's rows -----------------------------------------------------------------------------------------
    def _bulk(self, stmt: Any, params: Sequence[tuple[Any, ...]], by: int = 0) -> None:
        """Write rows; with ``by`` > 0, the rows sharing their first ``by`` values (the partition key) go together."""
        key = (lambda p: tuple(p[:by])) if by else None
        write_many(self.settings, self.sess, stmt, params, key)

    def write_version(
        self, hour: datetime, run_id: uuid.UUID, minutes: Iterable[ViewRow], hours: Iterable[ViewRow]
    ) -> int:
        """Write a run's minute and hour rows under its run id (invisible to readers until the swap)."""
        minute_params = [
            (r.slice, hour, run_id, r.bucket_start, r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for r in minutes
        ]
        hour_rows = list(hours)
        hour_params = [
            (r.slice, hour.date(), hour, run_id, r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for r in hour_rows
        ]
        self._bulk(self.ins_minute, minute_params)
        self._bulk(self.ins_hour, hour_params)
        self._bulk(self.ins_day_slice, [(hour.date(), r.slice) for r in hour_rows])
        return len(minute_params) + len(hour_params)

    def write_versions(
        self,
        runs: dict[datetime, uuid.UUID],
        minutes: dict[datetime, list[ViewRow]],
        hours: dict[datetime, list[ViewRow]],
    ) -> int:
        """Write the minute and hour rows of many hours, each under its hour's run id; return the rows written."""
        minute_params = [
            (r.slice, h, runs[h], r.bucket_start, r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in minutes.items()
            for r in rows
        ]
        hour_params = [
            (r.slice, h.date(), h, runs[h], r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in hours.items()
            for r in rows
        ]
        self._bulk(self.ins_minute, minute_params, by=2)  # (slice, hour)
        self._bulk(self.ins_hour, hour_params, by=2)  # (slice, day)
        self._bulk(self.ins_day_slice, sorted({(h.date(), r.slice) for h, rows in hours.items() for r in rows}), by=1)
        return len(minute_params) + len(hour_params)

    def swap(self, hour: datetime, run_id: uuid.UUID, indexed: int | None = None) -> None:
        """Make ``run_id`` the current version of the hour (one row: atomic for readers)."""
        self.swap_many([(hour, run_id, indexed)])

    def swap_many(self, swaps: Sequence[tuple[datetime, uuid.UUID, int | None]]) -> None:
        """Swap the pointers of many hours (each one row); ``indexed``: the hour's records the run read."""
        now = datetime.now(UTC)
        self._bulk(self.ins_pointer, [(h.date(), h, run_id, now, indexed) for h, run_id, indexed in swaps], by=1)

    def write_day(
        self, day: date, pointers: dict[datetime, uuid.UUID], rows: Sequence[ViewRow], hours: dict[str, int]
    ) -> int:
        """Write a day's rollup computed with its hours.

        :arg pointers: the day's current runs after the swaps (fingerprinted into the row).
        :arg hours: per slice, how many of the day's hours have a row.
        """
        fingerprint = fingerprint_of(pointers)
        self._bulk(
            self.ins_day,
            [
                (r.slice, day.strftime("%Y-%m"), day, fingerprint, hours.get(r.slice, 0), r.events, r.users_hll,
                 r.values_kll, r.items_fi, r.min_ts, r.max_ts)
                for r in rows
            ],
        )  # fmt: skip
        return len(rows)

    def pointers(self, day: date) -> dict[datetime, uuid.UUID]:
        """Return the current run of each completed hour of a day."""
        rows = self.sess.execute(self.sel_pointers, (day,), execution_profile=READ_PROFILE)
        return {utc(r.hour): r.run_id for r in rows}  # type: ignore[misc]

    def remerge_day(self, day: date) -> int:
        """Rebuild the day's rollup of every slice from the current hour rows; return the slices written."""
        current = self.pointers(day)
        fingerprint = fingerprint_of(current)
        slices = [r.slice for r in self.sess.execute(self.sel_day_slices, (day,), execution_profile=READ_PROFILE)]
        params = []
        for sl in slices:
            rows = [
                r
                for r in self.sess.execute(self.sel_hours, (sl, day), execution_profile=READ_PROFILE)
                if current.get(utc(r.hour)) == r.run_id  # type: ignore[arg-type]
            ]
            if not rows:
                continue
            hll, kll, fi = sketches.merge_all((r.users_hll, r.values_kll, r.items_fi) for r in rows)
            params.append(
                (
                    sl,
                    day.strftime("%Y-%m"),
                    day,
                    fingerprint,
                    len(rows),
                    sum(r.events for r in rows),
                    hll,
                    kll,
                    fi,
                    min(utc(r.min_ts) for r in rows),  # type: ignore[type-var]
                    max(utc(r.max_ts) for r in rows),  # type: ignore[type-var]
                )
            )
        self._bulk(self.ins_day, params)
        return len(params)

    def delete_superseded(self, hour: datetime, keep: int) -> int:
        """Delete the rows of runs of the hour older than the ``keep`` newest completed ones; return runs deleted."""
        runs = [r for r in self.sess.execute(self.sel_runs, (hour,), execution_profile=READ_PROFILE)]
        completed = [r.run_id for r in runs if r.status == "completed"]  # newest first (clustering order)
        current = self.pointers(hour.date()).get(hour)
        doomed = [rid for rid in completed[keep:] if rid != current]
        doomed += [r.run_id for r in runs if r.status == "failed" and r.run_id != current]
        if not doomed:
            return 0
        slices = [r.slice for r in self.sess.execute(self.sel_day_slices, (hour.date(),))]
        self._bulk(self.del_minutes, [(sl, hour, rid) for sl in slices for rid in doomed])
        self._bulk(self.del_hour, [(sl, hour.date(), hour, rid) for sl in slices for rid in doomed])
        return len(doomed)

    # -- lineage ------------------------------------------------------------------------------------------------
    def run_started(
        self, hour: datetime, run_id: uuid.UUID, end: datetime, topic: str, offsets: str, forced: bool, code: str
    ) -> None:
        """Record a run as running, with the offsets it reads."""
        self.runs_started([(hour, run_id, end, topic, offsets, forced, code)])

    def runs_started(self, runs: Sequence[tuple[datetime, uuid.UUID, datetime, str, str, bool, str]]) -> None:
        """Record runs as running: (hour, run_id, end, topic, offset spans, forced, code version) each."""
        now = datetime.now(UTC)
        self._bulk(self.ins_run, [(h, rid, end, "running", t, o, f, c, now) for h, rid, end, t, o, f, c in runs])

    def run_finished(
        self, hour: datetime, run_id: uuid.UUID, status: str, counts: dict[str, int], error: str | None
    ) -> None:
        """Record a run's outcome and counts."""
        self.runs_finished([(hour, run_id, status, counts, error)])

    def runs_finished(self, runs: Sequence[tuple[datetime, uuid.UUID, str, dict[str, int], str | None]]) -> None:
        """Record runs' outcomes and counts."""
        now = datetime.now(UTC)
        self._bulk(
            self.upd_run,
            [
                (status, c.get("read"), c.get("unparseable"), c.get("outside"), c.get("in_interval"),
                 c.get("deduped"), c.get("kept"), c.get("late"), c.get("slices"), c.get("indexed"), now, error,
                 hour, run_id)
                for hour, run_id, status, c, error in runs
            ],
        )  # fmt: skip

    # -- watermark ---------------------------------------------------------------------------------------------
    def watermark(self) -> tuple[datetime | None, datetime | None, datetime | None]:
        """Return (low, watermark, pinned)."""
        row = self.sess.execute(self.sel_watermark, (WATERMARK_ROW,), execution_profile=READ_PROFILE).one()
        if row is None:
            return None, None, None
        return utc(row.low), utc(row.watermark), utc(row.pinned)

    def completed(self, hour: datetime, cache: dict[date, dict[datetime, uuid.UUID]]) -> bool:
        """Tell whether the hour has a current run (pointers read once per day into ``cache``)."""
        day = hour.date()
        if day not in cache:
            cache[day] = self.pointers(day)
        return hour in cache[day]

    def advance_watermark(self, hint: datetime, max_steps: int = 24 * 400) -> tuple[datetime | None, datetime | None]:
        """Extend [low, watermark) over contiguous completed hours, starting from ``hint`` if there is none yet.

        :returns: the new (low, watermark).
        """
        low, mark, _pinned = self.watermark()
        cache: dict[date, dict[datetime, uuid.UUID]] = {}
        if mark is None or low is None:
            if not self.completed(hint, cache):
                return None, None
            low, mark = hint, hint + HOUR
        steps = 0
        while steps < max_steps and self.completed(mark, cache):
            mark += HOUR
            steps += 1
        while steps < 2 * max_steps and self.completed(low - HOUR, cache):
            low -= HOUR
            steps += 1
        self.sess.execute(
            self.ins_watermark, (WATERMARK_ROW, low, mark, datetime.now(UTC)), execution_profile=WRITE_PROFILE
        )
        return low, mark

    def pin(self, boundary: datetime | None) -> None:
        """Pin (or with None unpin) the boundary serving uses."""
        self.sess.execute(
            self.pin_watermark, (boundary, datetime.now(UTC), WATERMARK_ROW), execution_profile=WRITE_PROFILE
        )


def fingerprint_of(pointers: dict[datetime, uuid.UUID]) -> str:
    """Return a stable digest of which run is current for each hour."""
    canonical = json.dumps(sorted((h.isoformat(), str(r)) for h, r in pointers.items()))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]
