"""The batch view's rows: minute and hour rows under their run's id, daily rollups, and the slices of each day.

Writes are idempotent upserts grouped by partition (:func:`infra.cassandra.write_many`); the run sequence that
orders them (write a version, swap, re-merge, prune) is the batch layer's.
"""

from __future__ import annotations

import functools
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
        p = functools.partial(cql.prepare, sess, settings)
        self.ins_minute = p(cql.INSERT_MINUTE, idempotent=True)
        self.ins_hour = p(cql.INSERT_HOUR, idempotent=True)
        self.ins_day = p(cql.INSERT_DAY, idempotent=True)
        self.ins_day_slice = p(cql.INSERT_DAY_SLICE, idempotent=True)
        self.sel_day_slices = p(cql.SELECT_DAY_SLICES)
        self.sel_day_hours = p(cql.SELECT_DAY_HOURS)
        self.sel_run_minutes = p(cql.SELECT_RUN_MINUTES)
        self.sel_month_days = p(cql.SELECT_MONTH_DAYS)
        self.sel_month_fingerprints = p(cql.SELECT_MONTH_FINGERPRINTS)
        self.del_minutes = p(cql.DELETE_MINUTES)
        self.del_hour = p(cql.DELETE_HOUR)

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
    ) -> int:
        """Write the minute and hour rows of many hours, each under its hour's run id; return the rows written."""
        minute_params = [
            (r.slice, h, runs[h], r.bucket_start, r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in minutes.items()
            for r in rows
        ]
        hour_params = [
            (r.slice, day_key(h), h, runs[h], r.events, r.users_hll, r.values_kll, r.items_fi, r.min_ts, r.max_ts)
            for h, rows in hours.items()
            for r in rows
        ]
        self._write(self.ins_minute, minute_params, by=2)  # (slice, hour)
        self._write(self.ins_hour, hour_params, by=2)  # (slice, day)
        day_slices = sorted({(day_key(h), r.slice) for h, rows in hours.items() for r in rows})
        self._write(self.ins_day_slice, day_slices, by=1)
        return len(minute_params) + len(hour_params)

    def write_days(self, day: date, fingerprint: str, rows: Sequence[ViewRow], hours: Mapping[str, int]) -> int:
        """Write a day's rollup of each slice, marked with the fingerprint of the day's pointers it merged.

        :arg hours: per slice, how many of the day's hours have a row.
        """
        self._write(
            self.ins_day,
            [
                (r.slice, month_key(day), day, fingerprint, hours.get(r.slice, 0), r.events, r.users_hll,
                 r.values_kll, r.items_fi, r.min_ts, r.max_ts)
                for r in rows
            ],
        )  # fmt: skip
        return len(rows)

    def delete_runs(self, hour: datetime, run_ids: Sequence[uuid.UUID]) -> None:
        """Delete the minute and hour rows the runs wrote for the hour, in every slice of its day."""
        day = day_key(hour)
        slices = self.day_slices(day)
        self._write(self.del_minutes, [(sl, hour, rid) for sl in slices for rid in run_ids])
        self._write(self.del_hour, [(sl, day, hour, rid) for sl in slices for rid in run_ids])

    # -- reads ----------------------------------------------------------------------------------------------------
    def day_slices(self, day: date) -> list[str]:
        """Return the slices with a row in some hour of the day."""
        return [r.slice for r in self._read(self.sel_day_slices, (day,))]

    def day_hours(self, slice_: str, day: date, runs: Mapping[datetime, uuid.UUID]) -> list[Any]:
        """Return the slice's hour rows of the day written by the hours' current ``runs`` (others are dropped)."""
        return [r for r in self._read(self.sel_day_hours, (slice_, day)) if runs.get(utc(r.hour)) == r.run_id]  # type: ignore[arg-type]

    def run_minutes(self, slice_: str, hour: datetime, run_id: uuid.UUID | None) -> dict[datetime, Any]:
        """Return the minute rows (``bucket_start, events, users_hll``) a run wrote for the slice, by bucket."""
        return {utc(r.bucket_start): r for r in self._read(self.sel_run_minutes, (slice_, hour, run_id))}  # type: ignore[misc]

    def month_days(self, slice_: str, month: str) -> dict[date, Any]:
        """Return the slice's daily rollups (``day, hour_runs, hours, events``) of a month (``YYYY-MM``), by day."""
        return {as_date(r.day): r for r in self._read(self.sel_month_days, (slice_, month))}

    def fingerprints_request(self, slice_: str, month: str) -> Request:
        """Return the read of the fingerprints (``day, hour_runs``) of the slice's daily rollups of a month."""
        return self.sel_month_fingerprints, (slice_, month)
