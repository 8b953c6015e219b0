"""The speed view's rollups: each closed interval of a slice's minutes merged once, so long reads need few rows.

A window above the batch watermark was one row per slice-minute (a busy minute's frequent-items sketch is ~36 KB):
an hour of it is 60 rows read and merged for every new question. The speed layer merges each closed
:data:`~views.buckets.SPEED_ROLLUP` interval once it can no longer change (the Spark watermark has passed its end:
later events for it are dropped as late) and writes the result beside its minutes (``infra/cql/0012``); with
``speed.live_rollups`` it also merges an open interval again after every micro-batch that wrote minutes in it, so the
newest minutes of a window are one row per interval too.

A rollup is a pure function of the interval's final minute rows, overwritten whole when written again, so writing it
needs no exactly-once bookkeeping: a crash before it is written leaves the minutes, which serving reads instead. It
records the epoch whose rows it merged; serving uses it only when that epoch owns the interval and its ``events``
equal what the epoch's coverage counted there (:class:`serving.read_schedule.ReadSchedule`), so a rollup merged over a
missing or short minute is never taken for the whole interval.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, WRITE_PROFILE, write_many
from infra.settings import Settings
from views import sketches
from views.buckets import MINUTE, SPEED_ROLLUP, day_key, utc
from views.store import cql
from views.store.rows import RunningMerge

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

WIDTH_MIN = int(SPEED_ROLLUP.total_seconds() // 60)
MIN_EDGE = 2  # minutes: the shortest edge of an interval kept merged (one minute is its own row)

Interval = tuple[str, datetime]  # (slice, start of the interval)


def todo_key(interval: Interval) -> str:
    """Return how an interval to merge is kept in ``speed_epochs.rollup_todo``: its start, a space, its slice."""
    sl, start = interval
    return f"{start.astimezone(UTC).isoformat()} {sl}"


def todo_interval(key: str) -> Interval:
    """Return the interval of a ``rollup_todo`` entry (:func:`todo_key`)."""
    start, sl = key.split(" ", 1)
    return sl, datetime.fromisoformat(start).astimezone(UTC)


class SpeedRollups:
    """Merge closed intervals of a speed query's minutes into rollup rows (one session's prepared statements)."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.Statements(settings, sess)

    def todo(self, query: str, epoch: str) -> set[Interval]:
        """Return the intervals the epoch wrote minutes in and has not merged (those of a killed run included)."""
        row = self.sess.execute(self._stmt(cql.SELECT_ROLLUP_TODO), (query, epoch), execution_profile=READ_PROFILE)
        found = row.one()
        return {todo_interval(k) for k in (found.rollup_todo or ())} if found is not None else set()

    def add_todo(self, query: str, epoch: str, intervals: Iterable[Interval]) -> None:
        """Record intervals about to get minutes (before the rows are written: a crash leaves them to merge)."""
        keys = {todo_key(iv) for iv in intervals}
        if keys:
            self.sess.execute(self._stmt(cql.ADD_ROLLUP_TODO), (keys, query, epoch), execution_profile=WRITE_PROFILE)

    def done(self, query: str, epoch: str, intervals: Iterable[Interval]) -> None:
        """Forget intervals merged (or never to be merged)."""
        keys = {todo_key(iv) for iv in intervals}
        if keys:
            self.sess.execute(self._stmt(cql.DONE_ROLLUP_TODO), (keys, query, epoch), execution_profile=WRITE_PROFILE)

    def write(
        self, query: str, epoch: str, intervals: Iterable[Interval], ttl_seconds: int, edge_ttl_s: int = 0
    ) -> int:
        """Read each interval's minute rows, merge them and write the rollup; return the rollups written.

        The minutes are read concurrently; an interval without a row (nothing counted there) gets no rollup. With
        ``edge_ttl_s``, its edges (:func:`edges`) are written too, kept that long. Raise on the first failed read or
        write (the caller decides whether that fails its batch).
        """
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        todo = sorted(set(intervals))
        if not todo:
            return 0
        reads = execute_concurrent_with_args(
            self.sess,
            self._stmt(cql.SELECT_ROLLUP_MINUTES),
            [(query, sl, day_key(start), start, start + SPEED_ROLLUP) for sl, start in todo],
            concurrency=self.settings.cassandra.write_concurrency,
            raise_on_first_error=True,
            execution_profile=READ_PROFILE,
        )
        params, edge_params = [], []
        edge_ttl = min(edge_ttl_s, ttl_seconds) if ttl_seconds > 0 else edge_ttl_s
        # serving reads an interval's edges only while they are younger than the TTL from its end: none older
        edges_after = datetime.now(UTC) - SPEED_ROLLUP - timedelta(seconds=edge_ttl)
        for (sl, start), (_ok, result) in zip(todo, reads, strict=True):
            rows = list(result)
            if not rows:
                continue
            if edge_ttl > 0 and start > edges_after:
                edge_params += [
                    (query, sl, day_key(start), first, width, epoch, *merged, edge_ttl)
                    for first, width, merged in edges(start, rows)
                ]
            hll, kll, items = sketches.merge_all((r.users_hll, r.values_kll, r.items_fi) for r in rows)
            lows = [t for r in rows if (t := utc(r.min_ts)) is not None]
            highs = [t for r in rows if (t := utc(r.max_ts)) is not None]
            params.append(
                (
                    query, sl, day_key(start), start, WIDTH_MIN, epoch, sum(int(r.events) for r in rows),
                    hll, kll, items, min(lows, default=None), max(highs, default=None), ttl_seconds,
                )
            )  # fmt: skip
        write_many(self.settings, self.sess, self._stmt(cql.UPSERT_ROLLUP), params)
        write_many(self.settings, self.sess, self._stmt(cql.UPSERT_EDGE), edge_params)
        logger.debug("query %s: %d rollups of %d closed intervals written", query, len(params), len(todo))
        return len(params)


def edges(start: datetime, rows: Iterable[Any]) -> list[tuple[datetime, int, tuple[Any, ...]]]:
    """Return an interval's edges merged from its minute rows: ``(first minute, minutes, merged)``.

    Every run of :data:`MIN_EDGE` minutes or more from the interval's start (a prefix) or to its end
    (a suffix), short of the whole interval, that holds a row; ``merged`` is ``(events, users_hll, values_kll,
    items_fi, min_ts, max_ts)``. Each side is merged once along the way.
    """
    by_minute = {utc(r.bucket_start): r for r in rows}
    minutes = [start + i * MINUTE for i in range(WIDTH_MIN)]
    out = []
    for order in (minutes, minutes[::-1]):
        merge = RunningMerge()
        for k, m in enumerate(order, 1):
            r = by_minute.get(m)
            if r is not None:
                merge.add(r)
            if merge.rows and MIN_EDGE <= k < WIDTH_MIN:
                out.append((min(m, order[0]), k, merge.merged()))
    return out
