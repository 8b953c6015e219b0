"""The event-time index's storage: its spans, hour totals and per-partition checkpoint, written and read.

The indexer (:mod:`views.indexing.indexer`) writes these tables and the batch layer plans its passes from them;
serving reads the checkpoint too (the console's horizon), and may not import the batch layer, so the tables, their
rows and the horizon rule live here, below both. Every write is an idempotent upsert.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from infra.cassandra import READ_PROFILE, table, write_many
from infra.settings import Settings
from views.buckets import utc
from views.store.losses import LossStore
from views.store.pointers import Pointer, PointerStore

if TYPE_CHECKING:
    from cassandra.cluster import Session

SELECT_INDEX_STATE = (
    "SELECT partition, next_offset, max_ts, last_record_at, updated_at FROM {batch_index_state} WHERE topic = %s"
)


def ms_to_dt(ms: int) -> datetime:
    """Return epoch milliseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def dt_to_ms(ts: datetime) -> int:
    """Return an aware datetime as epoch milliseconds."""
    return int(ts.timestamp() * 1000)


@dataclass(frozen=True)
class OffsetSpan:
    """Offsets ``[first, last]`` (inclusive) of one partition hold ``records`` records of one hour."""

    partition: int
    first: int
    last: int
    records: int
    late: int = 0


@dataclass
class OpenSpan:
    """A span of the checkpoint that a later record of its hour may still extend."""

    first: int
    last: int
    records: int
    late: int


@dataclass
class PartitionState:
    """The indexer's checkpoint of one partition."""

    partition: int
    next_offset: int = 0
    max_ts_ms: int | None = None
    last_record_at: datetime | None = None
    open: dict[int, OpenSpan] = field(default_factory=dict)  # hour (epoch ms) -> span a later record may extend
    untimed: int = 0  # records without a usable timestamp (not indexed into any hour)
    lost: int = 0  # records removed (retention, DeleteRecords) before they were indexed (see views.store.losses)

    @property
    def max_ts(self) -> datetime | None:
        """Return the newest record time indexed."""
        return None if self.max_ts_ms is None else ms_to_dt(self.max_ts_ms)

    def open_json(self) -> str:
        """Return the open spans as the checkpoint stores them."""
        return json.dumps({str(h): [s.first, s.last, s.records, s.late] for h, s in sorted(self.open.items())})

    @staticmethod
    def parse_open(text: str | None) -> dict[int, OpenSpan]:
        """Read the open spans of a checkpoint."""
        return {int(h): OpenSpan(*v) for h, v in json.loads(text or "{}").items()}


class PartitionProgress(Protocol):
    """What the horizon rule needs of a partition (the indexer's state, or its row read back)."""

    @property
    def partition(self) -> int: ...  # noqa: D102
    @property
    def max_ts(self) -> datetime | None: ...  # noqa: D102
    @property
    def last_record_at(self) -> datetime | None: ...  # noqa: D102


@dataclass(frozen=True)
class IndexedPartition:
    """How far the index has read one partition: its next offset, newest record time, and when it last grew."""

    partition: int
    next_offset: int
    max_ts: datetime | None
    last_record_at: datetime | None
    updated_at: datetime | None


@dataclass(frozen=True)
class Horizon:
    """How far event time has moved on in the topic, as the index saw it.

    The time every partition still receiving records has passed, the partition holding it back, the idle ones, and
    each partition's newest record.
    """

    closed_at: datetime | None
    held_by: int | None  # None: no active partition (all idle, or nothing indexed)
    idle: tuple[int, ...]
    newest: dict[int, datetime | None] = field(default_factory=dict)

    def describe(self) -> str:
        """Return a line for status output."""
        idle = f"; idle partitions (ignored): {', '.join(map(str, self.idle))}" if self.idle else ""
        held = f"held back by partition {self.held_by}" if self.held_by is not None else "no active partition"
        shown = self.closed_at.isoformat() if self.closed_at else "no events indexed"
        return f"event time closed up to {shown} ({held}{idle})"


def decode_index_state(rows: Iterable[Any]) -> list[IndexedPartition]:
    """Turn ``batch_index_state`` rows into partitions, in partition order."""
    out = [
        IndexedPartition(int(r.partition), int(r.next_offset or 0), utc(r.max_ts), utc(r.last_record_at),
                         utc(r.updated_at))
        for r in rows
    ]  # fmt: skip
    return sorted(out, key=lambda p: p.partition)


def read_index_state(settings: Settings, sess: Session, topic: str) -> list[IndexedPartition]:
    """Return the index's checkpoint of every partition of ``topic`` (empty: never indexed)."""
    stmt = SELECT_INDEX_STATE.format(batch_index_state=table(settings, "batch_index_state"))
    return decode_index_state(sess.execute(stmt, (topic,), execution_profile=READ_PROFILE))


def index_horizon(parts: Iterable[PartitionProgress], now: datetime, idle_after: timedelta) -> Horizon:
    """Return the horizon: the oldest newest-record time of the partitions that got a record within ``idle_after``.

    The one home of the rule (the batch layer's closing check and serving's console use it): a partition without
    a new record for longer than ``idle_after`` (wall time, as the indexer saw it) is idle and does not hold the
    horizon back, as Flink's ``withIdleness`` does for watermarks; when every partition is idle the stream as a
    whole is quiet and the horizon is the newest record time or ``now - idle_after``, whichever is later (an event
    arriving after that is late, and the hour it belongs to turns stale and is recomputed); it never runs ahead of
    ``now``.
    """
    parts = list(parts)
    with_data = [p for p in parts if p.max_ts is not None]
    active = [p for p in with_data if p.last_record_at is not None and now - p.last_record_at <= idle_after]
    idle = tuple(sorted(p.partition for p in with_data if p not in active))
    held_by, closed = None, None
    if active:
        oldest = min(active, key=lambda p: (p.max_ts, p.partition))
        held_by, closed = oldest.partition, oldest.max_ts
    elif with_data:
        closed = max(*(p.max_ts for p in with_data if p.max_ts), now - idle_after)
    if closed is not None:
        closed = min(closed, now)
    return Horizon(closed, held_by, idle, {p.partition: p.max_ts for p in parts})


class IndexStore:
    """The index tables over one session (prepared statements; every write an idempotent upsert)."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self.views = PointerStore(settings, sess)  # the batch view's pointers and stale hours
        self.losses = LossStore(settings, sess)  # records removed before they were indexed
        t = {n: table(settings, n) for n in ("batch_index_spans", "batch_index_hours", "batch_index_state")}
        p = sess.prepare
        self.ins_span = p(
            f"INSERT INTO {t['batch_index_spans']} (topic, day, hour, partition, first_offset, last_offset, records, "
            "late) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.sel_spans = p(
            f"SELECT hour, partition, first_offset, last_offset, records, late FROM {t['batch_index_spans']} "
            "WHERE topic = ? AND day = ?"
        )
        self.ins_hour = p(
            f"INSERT INTO {t['batch_index_hours']} (topic, day, hour, records, late, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )
        self.sel_hours = p(f"SELECT hour, records, late FROM {t['batch_index_hours']} WHERE topic = ? AND day = ?")
        self.ins_state = p(
            f"INSERT INTO {t['batch_index_state']} (topic, partition, next_offset, max_ts, last_record_at, open_spans, "
            "skipped, lost, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.sel_state = p(
            f"SELECT partition, next_offset, max_ts, last_record_at, open_spans, skipped, lost "
            f"FROM {t['batch_index_state']} WHERE topic = ?"
        )
        for stmt in (self.ins_span, self.ins_hour, self.ins_state):
            stmt.is_idempotent = True

    # -- bulk helpers -----------------------------------------------------------------------------------------
    def _write(self, stmt: Any, params: list[tuple[Any, ...]], by: int = 0) -> None:
        """Write rows; with ``by`` > 0, the rows sharing their first ``by`` values (the partition key) go together."""
        write_many(self.settings, self.sess, stmt, params, (lambda p: tuple(p[:by])) if by else None)

    def _read(self, stmt: Any, params: list[tuple[Any, ...]]) -> list[list[Any]]:
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        if not params:
            return []
        results = execute_concurrent_with_args(
            self.sess,
            stmt,
            params,
            concurrency=self.settings.cassandra.read_concurrency,
            raise_on_first_error=True,
            execution_profile=READ_PROFILE,
        )
        return [list(r.result_or_exc) for r in results]

    # -- reads ------------------------------------------------------------------------------------------------
    def states(self, topic: str) -> dict[int, PartitionState]:
        """Return the checkpoint of every partition indexed so far."""
        out = {}
        for r in self.sess.execute(self.sel_state, (topic,), execution_profile=READ_PROFILE):
            max_ts = utc(r.max_ts)
            out[r.partition] = PartitionState(
                r.partition,
                int(r.next_offset or 0),
                dt_to_ms(max_ts) if max_ts else None,
                utc(r.last_record_at),
                PartitionState.parse_open(r.open_spans),
                int(r.skipped or 0),
                int(r.lost or 0),
            )
        return out

    def spans(self, topic: str, hours: Iterable[datetime]) -> dict[datetime, list[OffsetSpan]]:
        """Return the spans of each hour (an hour without records has none): one read per day."""
        out: dict[datetime, list[OffsetSpan]] = {h: [] for h in hours}
        days = sorted({h.date() for h in out})
        for rows in self._read(self.sel_spans, [(topic, d) for d in days]):
            for r in rows:
                hour = utc(r.hour)
                if hour in out:
                    out[hour].append(OffsetSpan(r.partition, r.first_offset, r.last_offset, r.records, r.late or 0))
        return out

    def hour_totals(self, topic: str, days: Iterable[date]) -> dict[datetime, tuple[int, int]]:
        """Return (records, late) of every indexed hour of the days."""
        days = list(days)
        out: dict[datetime, tuple[int, int]] = {}
        for rows in self._read(self.sel_hours, [(topic, d) for d in days]):
            for r in rows:
                out[utc(r.hour)] = (int(r.records), int(r.late or 0))  # type: ignore[index]
        return out

    def stale(self, topic: str) -> dict[datetime, tuple[int, int]]:
        """Return hour -> (records indexed now, records its current run read) for every stale hour."""
        noticed = self.views.stale(topic)
        if not noticed:
            return {}
        pointers = self.views.pointers_indexed({h.date() for h in noticed})
        totals = self.hour_totals(topic, {h.date() for h in noticed})
        out = {}
        for hour in noticed:
            run = pointers.get(hour)
            now = totals.get(hour, (noticed[hour], 0))[0]
            if run is not None and run.indexed is not None and now > run.indexed:
                out[hour] = (now, run.indexed)
        return dict(sorted(out.items()))

    # -- writes -----------------------------------------------------------------------------------------------
    def write_spans(self, topic: str, spans: list[tuple[int, OffsetSpan]]) -> None:
        """Upsert spans (keyed by hour, partition and first offset)."""
        self._write(
            self.ins_span,
            [
                (topic, ms_to_dt(h).date(), ms_to_dt(h), s.partition, s.first, s.last, s.records, s.late)
                for h, s in spans
            ],
            by=2,  # (topic, day)
        )

    def resum(self, topic: str, hours: Iterable[datetime]) -> dict[datetime, tuple[int, int]]:
        """Recompute and store the totals of the hours from their spans; return them."""
        spans = self.spans(topic, hours)
        totals = {h: (sum(s.records for s in ss), sum(s.late for s in ss)) for h, ss in spans.items()}
        now = datetime.now(UTC)
        self._write(self.ins_hour, [(topic, h.date(), h, r, late, now) for h, (r, late) in totals.items()], by=2)
        return totals

    def mark_stale(self, topic: str, totals: dict[datetime, tuple[int, int]]) -> int:
        """Record the hours whose indexed records exceed what their current run read; return how many."""
        pointers: dict[datetime, Pointer] = self.views.pointers_indexed({h.date() for h in totals})
        stale = {
            h: records
            for h, (records, _late) in totals.items()
            if h in pointers and pointers[h].indexed is not None and records > int(pointers[h].indexed)  # type: ignore[arg-type]
        }
        self.views.mark_stale(topic, stale)
        return len(stale)

    def drop(self, topic: str) -> int:
        """Delete the topic's spans, hour totals and checkpoint; return how many days of spans there were.

        The days come from the tables' partition keys (``SELECT DISTINCT``, a scan of keys only: an operator's
        rebuild, not a hot path). Deletes get newer write timestamps than the rows they cover and the rebuild's
        rows newer ones still, so nothing dropped comes back and nothing rebuilt is shadowed.
        """
        spans, hours, state = (table(self.settings, n) for n in ("batch_index_spans", "batch_index_hours",
                                                                  "batch_index_state"))  # fmt: skip
        days: dict[str, set[date]] = {}
        for name in (spans, hours):
            rows = self.sess.execute(f"SELECT DISTINCT topic, day FROM {name}", execution_profile=READ_PROFILE)
            days[name] = {r.day.date() if hasattr(r.day, "date") else r.day for r in rows if r.topic == topic}
        for name, found in days.items():
            delete = self.sess.prepare(f"DELETE FROM {name} WHERE topic = ? AND day = ?")
            self._write(delete, [(topic, d) for d in sorted(found)])
        self.sess.execute(self.sess.prepare(f"DELETE FROM {state} WHERE topic = ?"), (topic,))
        return len(days[spans])

    def write_states(self, topic: str, states: Iterable[PartitionState]) -> None:
        """Write the checkpoint of the partitions (after the spans they cover)."""
        now = datetime.now(UTC)
        self._write(
            self.ins_state,
            [
                (topic, s.partition, s.next_offset, s.max_ts, s.last_record_at, s.open_json(), s.untimed, s.lost, now)
                for s in states
            ],
        )
