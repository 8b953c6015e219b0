"""The batch layer's run sequence over the views' storage: versioned writes, the pointer swap, re-merge, pruning.

A run writes every row of its interval under its own ``run_id`` and only then moves the interval's pointer
(``batch_intervals``) to it — a single-row write, so a reader sees either the old run or the new one, whole. The
daily rollup records which hour runs it merged; a reader that finds it stale merges the hours itself. Old
versions are deleted after the swap, keeping the last ``keep_versions``. The tables and their statements are the
views' (:mod:`views.store`); the lineage table ``batch_runs`` is the batch layer's own.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, table, write_many
from infra.settings import Settings
from views import sketches
from views.buckets import HOUR, day_key, is_day_part, utc
from views.store.batch import BatchRows
from views.store.losses import LossStore
from views.store.pointers import PointerStore, fingerprint_of
from views.store.rows import RunningMerge, ViewRow

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)


def new_run_id() -> uuid.UUID:
    """Return a time-based id: runs of an interval sort by creation."""
    return uuid.uuid1()


class BatchStore:
    """One idempotent step of a run per method, over the views' batch tables and the lineage of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self.rows = BatchRows(settings, sess)
        self.pointers = PointerStore(settings, sess)
        self.losses = LossStore(settings, sess)
        runs = table(settings, "batch_runs")
        prep = sess.prepare
        self.ins_run = prep(
            f"INSERT INTO {runs} (hour, run_id, interval_end, status, topic, offsets, forced, code_version, "
            "started_at, accepted_loss, definition) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.upd_run = prep(
            f"UPDATE {runs} SET status = ?, rows_read = ?, rows_unparseable = ?, rows_outside = ?, "
            "rows_in_interval = ?, rows_deduped = ?, rows_kept = ?, rows_late = ?, slices = ?, rows_indexed = ?, "
            "finished_at = ?, error = ? WHERE hour = ? AND run_id = ?"
        )
        self.sel_runs = prep(f"SELECT run_id, status FROM {runs} WHERE hour = ?")
        self.sel_latest_runs = prep(
            f"SELECT run_id, status, rows_read, rows_kept, rows_deduped, rows_late, offsets, code_version, "
            f"accepted_loss, definition FROM {runs} WHERE hour = ? LIMIT ?"
        )
        for stmt in (self.ins_run, self.upd_run):
            stmt.is_idempotent = True

    # -- a run's rows -----------------------------------------------------------------------------------------
    def write_days(
        self, rollups: Sequence[tuple[date, dict[datetime, uuid.UUID], Sequence[ViewRow], dict[str, int]]]
    ) -> int:
        """Write the rollups of days computed with their hours, all together.

        :arg rollups: per day, its current runs after the swaps (fingerprinted into the rows), its rows, and per
            slice how many of its hours have a row.
        """
        return self.rows.write_days((day, fingerprint_of(runs), rows, hours) for day, runs, rows, hours in rollups)

    def write_day_parts(self, day: date, runs: Mapping[datetime, uuid.UUID], rows: Mapping[str, Sequence[Any]]) -> int:
        """Write the day's parts (prefixes and suffixes, ``batch_day_parts``) of each slice; return the rows written.

        :arg runs: the current run of each hour of the day (after the swaps).
        :arg rows: per slice, its hour rows of those runs (``ViewRow`` or rows read back, with their hour).
        """
        if not self.settings.batch.day_parts:
            return 0
        parts = [p for sl, sl_rows in rows.items() for p in day_parts(sl, day, runs, sl_rows)]
        return self.rows.write_day_parts([(sl, day) for sl in rows], parts)

    def remerge_day(self, day: date) -> int:
        """Rebuild the day's rollup and parts of every slice from the current hour rows; return the slices written."""
        current = self.pointers.runs(day)
        merged, hours = [], {}
        by_slice: dict[str, list[Any]] = {}
        for sl in self.rows.day_slices(day):
            rows = by_slice[sl] = self.rows.day_hours(sl, day, current)
            if not rows:
                continue
            hll, kll, fi = sketches.merge_all((r.users_hll, r.values_kll, r.items_fi) for r in rows)
            merged.append(
                ViewRow(
                    sl,
                    datetime.combine(day, time(), UTC),
                    sum(r.events for r in rows),
                    hll,
                    kll,
                    fi,
                    min(utc(r.min_ts) for r in rows),  # type: ignore[type-var]
                    max(utc(r.max_ts) for r in rows),  # type: ignore[type-var]
                )
            )
            hours[sl] = len(rows)
        self.write_day_parts(day, current, by_slice)
        return self.rows.write_days([(day, fingerprint_of(current), merged, hours)])

    def delete_superseded(self, hour: datetime, keep: int) -> int:
        """Delete the rows of runs of the hour older than the ``keep`` newest completed ones; return runs deleted."""
        runs = [r for r in self.sess.execute(self.sel_runs, (hour,), execution_profile=READ_PROFILE)]
        completed = [r.run_id for r in runs if r.status == "completed"]  # newest first (clustering order)
        current = self.pointers.runs(day_key(hour)).get(hour)
        doomed = [rid for rid in completed[keep:] if rid != current]
        doomed += [r.run_id for r in runs if r.status == "failed" and r.run_id != current]
        if not doomed:
            return 0
        self.rows.delete_runs(hour, doomed)
        return len(doomed)

    # -- lineage ------------------------------------------------------------------------------------------------
    def run_started(
        self, hour: datetime, run_id: uuid.UUID, end: datetime, topic: str, offsets: str, forced: bool, code: str
    ) -> None:
        """Record a run as running, with the offsets it reads."""
        self.runs_started([(hour, run_id, end, topic, offsets, forced, code)])

    def runs_started(
        self,
        runs: Sequence[tuple[datetime, uuid.UUID, datetime, str, str, bool, str]],
        accepted: Mapping[datetime, str] | None = None,
        definition: str | None = None,
    ) -> None:
        """Record runs as running: (hour, run_id, end, topic, offset spans, forced, code version) each.

        :arg accepted: per hour, the losses (JSON) the run accepts (None: none; only those hours may be incomplete).
        :arg definition: the fingerprint of the view definition the runs compute with.
        """
        from cassandra.query import UNSET_VALUE  # noqa: PLC0415 - no null cell (a tombstone) for runs accepting none

        now = datetime.now(UTC)
        accepted = accepted or {}
        write_many(
            self.settings,
            self.sess,
            self.ins_run,
            [
                (h, rid, end, "running", t, o, f, c, now, accepted.get(h, UNSET_VALUE), definition or UNSET_VALUE)
                for h, rid, end, t, o, f, c in runs
            ],
        )

    def run_finished(
        self, hour: datetime, run_id: uuid.UUID, status: str, counts: dict[str, int], error: str | None
    ) -> None:
        """Record a run's outcome and counts."""
        self.runs_finished([(hour, run_id, status, counts, error)])

    def runs_finished(self, runs: Sequence[tuple[datetime, uuid.UUID, str, dict[str, int], str | None]]) -> None:
        """Record runs' outcomes and counts."""
        now = datetime.now(UTC)
        write_many(
            self.settings,
            self.sess,
            self.upd_run,
            [
                (status, c.get("read"), c.get("unparseable"), c.get("outside"), c.get("in_interval"),
                 c.get("deduped"), c.get("kept"), c.get("late"), c.get("slices"), c.get("indexed"), now, error,
                 hour, run_id)
                for hour, run_id, status, c, error in runs
            ],
        )  # fmt: skip

    def latest_runs(self, hour: datetime, limit: int) -> list[Any]:
        """Return the newest runs of an hour (status, counts, offsets, code version), newest first."""
        return list(self.sess.execute(self.sel_latest_runs, (hour, limit), execution_profile=READ_PROFILE))


def day_parts(
    slice_: str, day: date, runs: Mapping[datetime, uuid.UUID], rows: Sequence[Any]
) -> list[tuple[str, date, str, int, ViewRow, datetime]]:
    """Return the slice's parts of a day (:func:`views.buckets.is_day_part`) merged from its hour rows.

    A part is merged only over hours that all have a current run (an hour of it without the slice's row counted
    nothing there), and records their runs' fingerprint; a part without any row of the slice is not written.
    Prefixes grow from midnight and suffixes from the next midnight back, each merged once along the way.
    """
    midnight = datetime.combine(day, time(), UTC)
    hours = [midnight + i * HOUR for i in range(24)]
    by_hour = {_hour_of(r): r for r in rows}
    out = []
    for order in (hours, hours[::-1]):
        merge, covered = RunningMerge(), {}
        for h in order:
            run = runs.get(h)
            if run is None:
                break
            covered[h] = run
            r = by_hour.get(h)
            if r is not None:
                merge.add(r)
            first, end = min(covered), max(covered) + HOUR
            if merge.rows and is_day_part(first, end):
                row = ViewRow(slice_, first, *merge.merged())
                out.append((slice_, day, fingerprint_of(covered), merge.rows, row, end))
    return out


def _hour_of(row: Any) -> datetime:
    """Return the hour of an hour row: read back (``hour``) or computed (``ViewRow.bucket_start``)."""
    hour = utc(getattr(row, "hour", None) or row.bucket_start)
    assert hour is not None  # noqa: S101 - an hour row always has its hour
    return hour
