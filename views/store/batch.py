"""The batch view's rows: minute and hour rows under their run's id, daily rollups, and the slices of each day.

Writes are idempotent upserts grouped by partition (:func:`infra.cassandra.write_many`); the run sequence that
orders them (write a version, swap, re-merge, prune) is the batch layer's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, write_many
from infra.settings import Settings
from views.buckets import as_date, day_key, month_key, utc
from views.store import cql
from views.store.rows import Request, ViewRow

if TYPE_CHECKING:
    from cassandra.cluster import Session


class BatchRows:
    """Prepared statements over the batch view's row tables of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.Statements(settings, sess)

    def _write(self, stmt: Any, params: Sequence[tuple[Any, ...]], by: int = 0) -> None:
        """Write rows; with ``by`` > 0, the rows sharing their first ``by`` values (the partition key) go together."""
        write_many(self.settings, self.sess, stmt, params, (lambda p: tuple(p[:by])) if by else None)

    def _read(self, stmt: Any, params: tuple[Any, ...]) -> Iterable[Any]:
        return self.sess.execute(stmt, params, execution_profile=READ_PROFILE)  # type: ignore[no-any-return]

    # -- writes ---------------------------------------------------------------------------------------------------
    def write_versions(
        self,
        runs: Mapping[datetime, uuid.UUID],
        minutes: Mapping[datetime, Sequence[ViewRow]],
        hours: Mapping[datetime, Sequence[ViewRow]],
        tens: Mapping[datetime, Sequence[ViewRow]] | None = None,
    ) -> int:
        """Write the minute, ten-minute and hour rows of many hours, each under its hour's run; return the rows."""
        minute_params = [
            (r.slice, h, runs[h], r.bucket_start, r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in minutes.items()
            for r in rows
        ]
        ten_params = [
            (r.slice, h, runs[h], r.bucket_start, r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in (tens or {}).items()
            for r in rows
        ]
        hour_params = [
            (r.slice, day_key(h), h, runs[h], r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in hours.items()
            for r in rows
        ]
        self._write(self._stmt(cql.INSERT_MINUTE), minute_params, by=2)  # (slice, hour)
        self._write(self._stmt(cql.INSERT_TEN), ten_params, by=2)
        self._write(self._stmt(cql.INSERT_HOUR), hour_params, by=2)  # (slice, day)
        day_slices = sorted({(day_key(h), r.slice) for h, rows in hours.items() for r in rows})
        self._write(self._stmt(cql.INSERT_DAY_SLICE), day_slices, by=1)
        return len(minute_params) + len(ten_params) + len(hour_params)

    def write_days(self, rollups: Iterable[tuple[date, str, Sequence[ViewRow], Mapping[str, int]]]) -> int:
        """Write daily rollups of each slice, all days together; return the rows written.

        :arg rollups: per day, the fingerprint of the day's pointers it merged, its rows, and per slice how many of
            the day's hours have a row.
        """
        params = [
            (r.slice, month_key(day), day, fingerprint, hours.get(r.slice, 0), r.events, r.users_hll, r.values_kll,
             r.items_fi, r.min_ts, r.max_ts)
            for day, fingerprint, rows, hours in rollups
            for r in rows
        ]  # fmt: skip
        self._write(self._stmt(cql.INSERT_DAY), params)
        return len(params)

    def write_day_parts(
        self, days: Iterable[tuple[str, date]], parts: Iterable[tuple[str, date, str, int, ViewRow, datetime]]
    ) -> int:
        """Replace the parts of days (``batch_day_parts``) of slices with new ones; return the rows written.

        The slices' parts of the days are deleted first, so none merged over rows no longer current stays (a slice
        whose rows an erasure emptied keeps no part); a reader finding none in between reads the hours.

        :arg days: the (slice, day) whose parts are replaced.
        :arg parts: per part, its slice, day, the fingerprint of its hours' runs, how many of them have a row, its
            merged row (``bucket_start``: its first hour) and its end.
        """
        self._write(self._stmt(cql.DELETE_DAY_PARTS), list(days))
        params = [
            (sl, day, r.bucket_start, end, fingerprint, hours, r.events, r.users_hll, r.values_kll, r.items_fi,
             r.min_ts, r.max_ts)
            for sl, day, fingerprint, hours, r, end in parts
        ]  # fmt: skip
        self._write(self._stmt(cql.INSERT_DAY_PART), params, by=2)
        return len(params)

    def delete_runs(self, hour: datetime, run_ids: Sequence[uuid.UUID]) -> None:
        """Delete the minute, ten-minute and hour rows the runs wrote for the hour, in every slice of its day."""
        day = day_key(hour)
        slices = self.day_slices(day)
        self._write(self._stmt(cql.DELETE_MINUTES), [(sl, hour, rid) for sl in slices for rid in run_ids])
        self._write(self._stmt(cql.DELETE_TENS), [(sl, hour, rid) for sl in slices for rid in run_ids])
        self._write(self._stmt(cql.DELETE_HOUR), [(sl, day, hour, rid) for sl in slices for rid in run_ids])

    # -- reads ----------------------------------------------------------------------------------------------------
    def day_slices(self, day: date) -> list[str]:
        """Return the slices with a row in some hour of the day."""
        return [r.slice for r in self._read(self._stmt(cql.SELECT_DAY_SLICES), (day,))]

    def day_hours(self, slice_: str, day: date, runs: Mapping[datetime, uuid.UUID]) -> list[Any]:
        """Return the slice's hour rows of the day written by the hours' current ``runs`` (others are dropped)."""
        rows = self._read(self._stmt(cql.SELECT_DAY_HOURS), (slice_, day))
        return [r for r in rows if runs.get(utc(r.hour)) == r.run_id]  # type: ignore[arg-type]

    def run_minutes(self, slice_: str, hour: datetime, run_id: uuid.UUID | None) -> dict[datetime, Any]:
        """Return the minute rows (``bucket_start, events, users_hll``) a run wrote for the slice, by bucket."""
        rows = self._read(self._stmt(cql.SELECT_RUN_MINUTES), (slice_, hour, run_id))
        return {utc(r.bucket_start): r for r in rows}  # type: ignore[misc]

    def month_days(self, slice_: str, month: str) -> dict[date, Any]:
        """Return the slice's daily rollups (``day, hour_runs, hours, events``) of a month (``YYYY-MM``), by day."""
        return {as_date(r.day): r for r in self._read(self._stmt(cql.SELECT_MONTH_DAYS), (slice_, month))}

    def fingerprints_request(self, slice_: str, month: str) -> Request:
        """Return the read of the fingerprints (``day, hour_runs``) of the slice's daily rollups of a month."""
        return self._stmt(cql.SELECT_MONTH_FINGERPRINTS), (slice_, month)
