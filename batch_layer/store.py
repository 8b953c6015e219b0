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
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, table, write_many
from infra.settings import Settings
from views import sketches
from views.buckets import day_key, utc
from views.store.batch import BatchRows
from views.store.pointers import PointerStore, Watermark, fingerprint_of
from views.store.rows import ViewRow

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
        self.pointer_store = PointerStore(settings, sess)
        runs = table(settings, "batch_runs")
        prep = sess.prepare
        self.ins_run = prep(
            f"INSERT INTO {runs} (hour, run_id, interval_end, status, topic, offsets, forced, code_version, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.upd_run = prep(
            f"UPDATE {runs} SET status = ?, rows_read = ?, rows_unparseable = ?, rows_outside = ?, "
            "rows_in_interval = ?, rows_deduped = ?, rows_kept = ?, rows_late = ?, slices = ?, rows_indexed = ?, "
            "finished_at = ?, error = ? WHERE hour = ? AND run_id = ?"
        )
        self.sel_runs = prep(f"SELECT run_id, status FROM {runs} WHERE hour = ?")
        self.sel_latest_runs = prep(
            f"SELECT run_id, status, rows_read, rows_kept, rows_deduped, rows_late, offsets, code_version "
            f"FROM {runs} WHERE hour = ? LIMIT ?"
        )
        for stmt in (self.ins_run, self.upd_run):
            stmt.is_idempotent = True

    # -- a run's rows -----------------------------------------------------------------------------------------
    def write_version(
        self, hour: datetime, run_id: uuid.UUID, minutes: Iterable[ViewRow], hours: Iterable[ViewRow]
    ) -> int:
        """Write a run's minute and hour rows under its run id (invisible to readers until the swap)."""
        return self.rows.write_versions({hour: run_id}, {hour: list(minutes)}, {hour: list(hours)})

    def write_versions(
        self,
        runs: dict[datetime, uuid.UUID],
        minutes: dict[datetime, list[ViewRow]],
        hours: dict[datetime, list[ViewRow]],
    ) -> int:
        """Write the minute and hour rows of many hours, each under its hour's run id; return the rows written."""
        return self.rows.write_versions(runs, minutes, hours)

    def swap(self, hour: datetime, run_id: uuid.UUID, indexed: int | None = None) -> None:
        """Make ``run_id`` the current version of the hour (one row: atomic for readers)."""
        self.pointer_store.swap([(hour, run_id, indexed)])

    def swap_many(self, swaps: Sequence[tuple[datetime, uuid.UUID, int | None]]) -> None:
        """Swap the pointers of many hours (each one row); ``indexed``: the hour's records the run read."""
        self.pointer_store.swap(swaps)

    def write_day(
        self, day: date, pointers: dict[datetime, uuid.UUID], rows: Sequence[ViewRow], hours: dict[str, int]
    ) -> int:
        """Write a day's rollup computed with its hours.

        :arg pointers: the day's current runs after the swaps (fingerprinted into the row).
        :arg hours: per slice, how many of the day's hours have a row.
        """
        return self.rows.write_days(day, fingerprint_of(pointers), rows, hours)

    def pointers(self, day: date) -> dict[datetime, uuid.UUID]:
        """Return the current run of each completed hour of a day."""
        return self.pointer_store.pointers(day)

    def remerge_day(self, day: date) -> int:
        """Rebuild the day's rollup of every slice from the current hour rows; return the slices written."""
        current = self.pointers(day)
        merged, hours = [], {}
        for sl in self.rows.day_slices(day):
            rows = self.rows.day_hours(sl, day, current)
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
        return self.rows.write_days(day, fingerprint_of(current), merged, hours)

    def delete_superseded(self, hour: datetime, keep: int) -> int:
        """Delete the rows of runs of the hour older than the ``keep`` newest completed ones; return runs deleted."""
        runs = [r for r in self.sess.execute(self.sel_runs, (hour,), execution_profile=READ_PROFILE)]
        completed = [r.run_id for r in runs if r.status == "completed"]  # newest first (clustering order)
        current = self.pointers(day_key(hour)).get(hour)
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

    def runs_started(self, runs: Sequence[tuple[datetime, uuid.UUID, datetime, str, str, bool, str]]) -> None:
        """Record runs as running: (hour, run_id, end, topic, offset spans, forced, code version) each."""
        now = datetime.now(UTC)
        write_many(
            self.settings,
            self.sess,
            self.ins_run,
            [(h, rid, end, "running", t, o, f, c, now) for h, rid, end, t, o, f, c in runs],
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

    # -- watermark ---------------------------------------------------------------------------------------------
    def watermark(self) -> Watermark:
        """Return the watermark row (low, mark, pinned)."""
        return self.pointer_store.watermark()

    def completed(self, hour: datetime, cache: dict[date, dict[datetime, uuid.UUID]]) -> bool:
        """Tell whether the hour has a current run (pointers read once per day into ``cache``)."""
        return self.pointer_store.completed(hour, cache)

    def advance_watermark(self, hint: datetime, max_steps: int = 24 * 400) -> tuple[datetime | None, datetime | None]:
        """Extend [low, watermark) over contiguous completed hours, starting from ``hint`` if there is none yet.

        :returns: the new (low, watermark).
        """
        return self.pointer_store.advance(hint, max_steps)

    def pin(self, boundary: datetime | None) -> None:
        """Pin (or with None unpin) the boundary serving uses."""
        self.pointer_store.pin(boundary)
