"""The event-time index of the events topic: which offsets hold each hour's records, built incrementally.

Offset-by-timestamp (``ListOffsets``) finds the first record at or after a time, which only locates an hour when
the log is in time order. History replayed behind newer events, late producers and merged topics break that, so
the batch layer indexes the log itself: one pass over the offsets not indexed yet records, per hour of the
**record timestamp** and per partition, the offset spans holding that hour's records and their counts. Ingestion
sets the record timestamp to the event time (the contract, see ``docs/layers.md``); a record whose JSON time
names another hour is counted as *outside* in the lineage of the hour its timestamp names, never lost silently.

A span ``[first, last]`` of an hour grows while the hour's next record lies at most ``index_span_gap`` records
after it (so interleaved hours near a boundary share spans instead of shattering them into thousands), else a new
span starts. The checkpoint per partition (next offset, newest record time, spans still open) is written after
the spans it covers, and spans are keyed by their first offset: killed at any point, a rerun from the checkpoint
writes the same rows again and ends with the same index. Cost: O(new records), no Spark.

Offsets Kafka removed (retention, ``DeleteRecords``) before a pass read them are a **loss**: recorded with their
offsets and the bound on their time (:mod:`views.store.losses`) before any checkpoint passes them, so the hours
they may belong to are incomplete instead of completing as if whole. Records without a usable timestamp are
counted apart (``untimed``). The consumer never resets silently to the end when offsets vanish under it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, session, table, write_many
from infra.errors import TrendsError
from infra.settings import Settings
from views.buckets import HOUR, utc
from views.store.index_state import index_horizon
from views.store.losses import Loss, LossStore, loss_bound
from views.store.pointers import Pointer, PointerStore

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

HOUR_MS = int(HOUR / timedelta(milliseconds=1))  # the hour bucket in epoch milliseconds (the indexer works in ms)


def ms_to_dt(ms: int) -> datetime:
    """Return epoch milliseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def dt_to_ms(ts: datetime) -> int:
    """Return an aware datetime as epoch milliseconds."""
    return int(ts.timestamp() * 1000)


@dataclass(frozen=True)
class Span:
    """Offsets ``[first, last]`` (inclusive) of one partition hold ``records`` records of one hour."""

    partition: int
    first: int
    last: int
    records: int
    late: int = 0


@dataclass
class _Open:
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
    open: dict[int, _Open] = field(default_factory=dict)  # hour (epoch ms) -> span a later record may extend
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
    def parse_open(text: str | None) -> dict[int, _Open]:
        """Read the open spans of a checkpoint."""
        return {int(h): _Open(*v) for h, v in json.loads(text or "{}").items()}


class PartitionIndexer:
    """Turns one partition's records, in offset order, into hour spans (pure: no I/O)."""

    def __init__(self, state: PartitionState, gap: int) -> None:
        self.state = state
        self.gap = gap
        self.changed: dict[tuple[int, int], _Open] = {}  # (hour, first) -> span to write
        self.touched: set[int] = set()
        self.new_records = 0

    def add(self, offset: int, ts_ms: int) -> None:
        """Index one record (offsets ascending)."""
        st = self.state
        st.next_offset = offset + 1
        if ts_ms < 0:
            st.untimed += 1
            return
        hour = ts_ms - ts_ms % HOUR_MS
        late = 1 if st.max_ts_ms is not None and st.max_ts_ms >= hour + HOUR_MS else 0
        span = st.open.get(hour)
        if span is not None and offset - span.last <= self.gap:
            span.last = offset
            span.records += 1
            span.late += late
        else:
            span = _Open(offset, offset, 1, late)
            st.open[hour] = span
        self.changed[(hour, span.first)] = span
        self.touched.add(hour)
        if st.max_ts_ms is None or ts_ms > st.max_ts_ms:
            st.max_ts_ms = ts_ms
        self.new_records += 1

    def drain(self) -> list[tuple[int, Span]]:
        """Return the spans changed since the last drain and forget the open ones no record can extend any more."""
        out = [
            (h, Span(self.state.partition, s.first, s.last, s.records, s.late)) for (h, _), s in self.changed.items()
        ]
        self.changed = {}
        horizon = self.state.next_offset - 1 - self.gap
        self.state.open = {h: s for h, s in self.state.open.items() if s.last >= horizon}
        return out


@dataclass(frozen=True)
class Horizon:
    """How far event time has moved on in the topic, as the index saw it."""

    closed_at: datetime | None  # every partition that still receives records has passed this time
    held_by: int | None  # the partition whose newest record is the oldest (None: no active partition)
    idle: tuple[int, ...]  # partitions with records but none new for longer than the idle setting
    newest: dict[int, datetime | None]

    def describe(self) -> str:
        """Return a line for status output."""
        idle = f"; idle partitions (ignored): {', '.join(map(str, self.idle))}" if self.idle else ""
        held = f"held back by partition {self.held_by}" if self.held_by is not None else "no active partition"
        shown = self.closed_at.isoformat() if self.closed_at else "no events indexed"
        return f"event time closed up to {shown} ({held}{idle})"


def horizon_of(states: Iterable[PartitionState], now: datetime, idle_after: timedelta) -> Horizon:
    """Return the time every partition still receiving records has passed.

    A partition without a new record for longer than ``idle_after`` (wall time, as the indexer saw it) is idle and
    does not hold the horizon back, as Flink's ``withIdleness`` does for watermarks. When every partition is idle
    the stream as a whole is quiet: its horizon is the newest record time or ``now - idle_after``, whichever is
    later (an event arriving after that is late, and the hour it belongs to turns stale and is recomputed). The
    horizon never runs ahead of the wall clock.
    """
    states = list(states)
    rule = index_horizon(states, now, idle_after)
    return Horizon(rule.closed_at, rule.held_by, rule.idle, {s.partition: s.max_ts for s in states})


@dataclass
class IndexResult:
    """What one indexing pass did."""

    records: int = 0
    partitions: int = 0
    hours_touched: int = 0
    stale_hours: int = 0
    seconds: float = 0.0
    flushes: int = 0
    losses: list[Loss] = field(default_factory=list)  # gaps noticed by this pass (recorded in batch_losses)

    def line(self) -> str:
        """Return a one-line summary."""
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lost = (
            f"; {sum(x.records for x in self.losses)} records LOST before indexing: "
            + "; ".join(x.describe() for x in self.losses)
            if self.losses
            else ""
        )
        return (
            f"indexed {self.records} new records of {self.partitions} partitions in {self.seconds:.1f} s "
            f"({rate:,.0f}/s): {self.hours_touched} hours touched, {self.stale_hours} now stale{lost}"
        )


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

    def spans(self, topic: str, hours: Iterable[datetime]) -> dict[datetime, list[Span]]:
        """Return the spans of each hour (an hour without records has none): one read per day."""
        out: dict[datetime, list[Span]] = {h: [] for h in hours}
        days = sorted({h.date() for h in out})
        for rows in self._read(self.sel_spans, [(topic, d) for d in days]):
            for r in rows:
                hour = utc(r.hour)
                if hour in out:
                    out[hour].append(Span(r.partition, r.first_offset, r.last_offset, r.records, r.late or 0))
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
    def write_spans(self, topic: str, spans: list[tuple[int, Span]]) -> None:
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


def _consumer(settings: Settings) -> Any:
    from confluent_kafka import Consumer  # noqa: PLC0415

    return Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": "trends-batch-indexer",  # offsets are never committed: the checkpoint is in Cassandra
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Offsets removed under a running pass are an error, never a silent jump to the end (librdkafka's
            # default, "largest", would skip everything between): the next pass records them as a loss.
            "auto.offset.reset": "error",
            # Big fetches: the indexer reads whole partitions; librdkafka's defaults halve its throughput here.
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.min.messages": 1_000_000,
            "log_level": 3,
        }
    )


class OffsetsRemovedError(TrendsError):
    """Retention removed offsets a running pass was about to read (the next pass records them as lost)."""


def topic_retention_ms(settings: Settings, topic: str) -> int | None:
    """Return the topic's ``retention.ms`` (-1: none), or None when the config cannot be read."""
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # noqa: PLC0415

    admin = AdminClient({**settings.kafka.client_config(), "log_level": 3})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource], request_timeout=30)[resource].result(timeout=30)
    except KafkaException as exc:
        logger.warning("cannot read retention.ms of %s (%s): the loss bound falls back to now", topic, exc)
        return None
    entry = configs.get("retention.ms")
    return None if entry is None or entry.value is None else int(entry.value)


def first_timestamps(settings: Settings, topic: str, starts: dict[int, tuple[int, int]]) -> dict[int, int | None]:
    """Return the timestamp (ms) of the first timestamped record of ``[low, high)`` per partition (None: none).

    A small consumer of its own: it runs only when a loss was noticed, to bound the lost records by the ones kept.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition  # noqa: PLC0415

    out: dict[int, int | None] = dict.fromkeys(starts)
    pending = {p for p, (low, high) in starts.items() if low < high}
    if not pending:
        return out
    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": "trends-batch-indexer",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "log_level": 3,
        }
    )
    deadline = time.monotonic() + settings.batch.index_stall_s
    try:
        consumer.assign([TopicPartition(topic, p, starts[p][0]) for p in sorted(pending)])
        while pending and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=100, timeout=1.0):
                p = m.partition()
                if p not in pending:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(p)
                    continue
                if m.timestamp()[1] >= 0:
                    out[p] = m.timestamp()[1]
                    pending.discard(p)
                elif (m.offset() or 0) >= starts[p][1] - 1:
                    pending.discard(p)
    finally:
        consumer.close()
    return out


def _partitions(consumer: Any, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        msg = f"topic {topic} does not exist"
        raise TrendsError(msg)
    return sorted(meta.partitions)


class _Pass:
    """One indexing pass: the partitions' indexers, the end offsets it stops at, and what it did."""

    def __init__(self, settings: Settings, store: IndexStore, consumer: Any, topic: str) -> None:
        self.cfg = settings.batch
        self.store = store
        self.consumer = consumer
        self.topic = topic
        self.indexers: dict[int, PartitionIndexer] = {}
        self.ends: dict[int, int] = {}
        self.result = IndexResult()
        self.touched: set[int] = set()  # every hour this pass touched

    def start(self, partitions: list[int], now: Callable[[], datetime]) -> None:
        """Resume every partition from its checkpoint, up to the end it has now; record offsets removed meanwhile."""
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        states = self.store.states(self.topic)
        assign = []
        gaps: dict[int, tuple[int, int]] = {}
        marks: dict[int, tuple[int, int]] = {}
        for p in partitions:
            st = states.get(p) or PartitionState(p)
            low, high = marks[p] = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
            if st.next_offset > high:
                msg = (
                    f"partition {p} of {self.topic} ends at offset {high} but {st.next_offset} was indexed already: "
                    "the topic was recreated or truncated; its index (batch_index_* rows of the topic) must go too"
                )
                raise TrendsError(msg)
            if st.next_offset < low:
                gaps[p] = (low, high)
            self.indexers[p] = PartitionIndexer(st, self.cfg.index_span_gap)
        if gaps:
            self.record_losses(gaps, now())
        for p in partitions:
            st, high = self.indexers[p].state, marks[p][1]
            if st.next_offset < high:
                self.ends[p] = high
                assign.append(TopicPartition(self.topic, p, st.next_offset))
        self.result.partitions = len(partitions)
        if assign:
            self.consumer.assign(assign)

    def record_losses(self, gaps: dict[int, tuple[int, int]], noticed: datetime) -> None:
        """Record each gap ``[next offset, low)`` as a loss with its time bound, before any checkpoint passes it."""
        settings = self.store.settings
        noticed = noticed.replace(microsecond=noticed.microsecond // 1000 * 1000)  # Cassandra keeps milliseconds
        retention = topic_retention_ms(settings, self.topic)
        firsts = first_timestamps(settings, self.topic, gaps)
        losses = []
        for p, (low, _high) in sorted(gaps.items()):
            st = self.indexers[p].state
            survivor = None if firsts[p] is None else ms_to_dt(firsts[p])  # type: ignore[arg-type]
            loss = Loss(
                self.topic, p, st.next_offset, low - 1, low - st.next_offset, noticed,
                loss_bound(noticed, retention, survivor), retention, survivor,
            )  # fmt: skip
            losses.append(loss)
            st.lost += loss.records
            st.next_offset = low
        self.store.losses.record(losses)
        for loss in losses:
            logger.error("records removed before they were indexed: %s", loss.describe())
        self.result.losses += losses

    def consume(self, now: Callable[[], datetime], progress: Callable[[IndexResult], None] | None) -> None:
        """Read until every partition reached its end, checkpointing every ``index_flush_records`` records."""
        pending = dict(self.ends)
        since_flush = 0
        t0 = time.monotonic()
        quiet_until = t0 + self.cfg.index_stall_s
        while pending:
            batch = self.consumer.consume(num_messages=10_000, timeout=1.0)
            if not batch:
                if time.monotonic() > quiet_until:
                    msg = f"the indexer got no record of {self.topic} for {self.cfg.index_stall_s} s ({pending})"
                    raise TrendsError(msg)
                continue
            quiet_until = time.monotonic() + self.cfg.index_stall_s
            since_flush += self._records(batch, pending)
            if since_flush >= self.cfg.index_flush_records:
                self.flush(now())
                since_flush = 0
                if progress is not None:
                    self.result.seconds = time.monotonic() - t0
                    progress(self.result)
        self.flush(now())

    def _records(self, batch: list[Any], pending: dict[int, int]) -> int:
        from confluent_kafka import KafkaError  # noqa: PLC0415

        added = 0
        for m in batch:
            err = m.error()
            p = m.partition()
            if err is not None:
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    msg = f"partition {p} of {self.topic}: offsets were removed while they were read ({err})"
                    raise OffsetsRemovedError(msg)
                if err.code() != KafkaError._PARTITION_EOF:
                    msg = f"reading {self.topic}: {err}"
                    raise TrendsError(msg)
                st = self.indexers[p].state
                st.next_offset = max(st.next_offset, min(m.offset(), self.ends.get(p, m.offset())))
                if p in pending and st.next_offset >= pending[p]:
                    del pending[p]
                continue
            offset, end = m.offset(), self.ends.get(p)
            if end is None or offset >= end:
                pending.pop(p, None)
                continue
            self.indexers[p].add(offset, m.timestamp()[1])
            added += 1
            if offset >= end - 1:
                pending.pop(p, None)
        return added

    def flush(self, now: datetime) -> None:
        """Write the spans, then the hours' totals and staleness, then the checkpoint: a kill anywhere repeats."""
        spans: list[tuple[int, Span]] = []
        touched: set[int] = set()
        for ix in self.indexers.values():
            spans += ix.drain()
            touched |= ix.touched
            ix.touched = set()
            if ix.new_records:
                ix.state.last_record_at = now
                self.result.records += ix.new_records
                ix.new_records = 0
        self.store.write_spans(self.topic, spans)
        totals = self.store.resum(self.topic, (ms_to_dt(h) for h in sorted(touched)))
        self.result.stale_hours += self.store.mark_stale(self.topic, totals)
        self.touched |= touched
        self.result.hours_touched = len(self.touched)
        self.store.write_states(self.topic, (ix.state for ix in self.indexers.values()))
        self.result.flushes += 1


def run_index(
    settings: Settings,
    *,
    topic: str | None = None,
    progress: Callable[[IndexResult], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> IndexResult:
    """Index the topic's records from the checkpoint up to the end the partitions had when the pass started.

    Records removed before they were indexed are recorded as losses (:mod:`views.store.losses`); when retention
    removes offsets under a running pass, what was read is checkpointed and a new pass records the gap.
    """
    topic = topic or settings.kafka.events_topic
    t0 = time.monotonic()
    total = IndexResult()
    for attempt in range(1, 4):
        consumer = _consumer(settings)
        try:
            partitions = _partitions(consumer, topic)
            with session(settings) as sess:
                one = _Pass(settings, IndexStore(settings, sess), consumer, topic)
                one.start(partitions, now)
                try:
                    one.consume(now, progress)
                except OffsetsRemovedError as exc:
                    if attempt == 3:
                        raise
                    logger.warning("%s; checkpointing and indexing again", exc)
                    one.flush(now())
                    continue
                finally:
                    _add(total, one.result)
        finally:
            consumer.close()
        break
    total.seconds = time.monotonic() - t0
    logger.info("%s", total.line())
    return total


def rebuild_index(
    settings: Settings,
    *,
    topic: str | None = None,
    force: bool = False,
    progress: Callable[[IndexResult], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> tuple[int, IndexResult]:
    """Drop the topic's index and index the topic again from its first offsets; return (days dropped, the pass).

    :raises TrendsError: when Kafka removed the first offsets of a partition and ``force`` is not given: the
        rebuilt index could not place those records, their hours would turn incomplete.
    """
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    topic = topic or settings.kafka.events_topic
    consumer = _consumer(settings)
    try:
        lows = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[0]
            for p in _partitions(consumer, topic)
        }
    finally:
        consumer.close()
    removed = {p: low for p, low in lows.items() if low > 0}
    if removed and not force:
        msg = (
            f"Kafka no longer holds the first offsets of {topic} (partition: first offset kept = {removed}); a "
            "rebuilt index cannot place the removed records, so their hours would turn incomplete (recorded as "
            "losses). Rebuild anyway with --force, or keep the current index."
        )
        raise TrendsError(msg)
    with session(settings) as sess:
        dropped = IndexStore(settings, sess).drop(topic)
    logger.warning("dropped the event-time index of %s (%d day(s) of spans); indexing it again", topic, dropped)
    return dropped, run_index(settings, topic=topic, progress=progress, now=now)


def _add(total: IndexResult, one: IndexResult) -> None:
    total.records += one.records
    total.partitions = one.partitions
    total.hours_touched += one.hours_touched
    total.stale_hours += one.stale_hours
    total.flushes += one.flushes
    total.losses += one.losses


def horizon(settings: Settings, topic: str | None = None, now: datetime | None = None) -> Horizon:
    """Return the topic's horizon from the index checkpoint (run :func:`run_index` first for a fresh one)."""
    topic = topic or settings.kafka.events_topic
    with session(settings) as sess:
        states = IndexStore(settings, sess).states(topic)
    return horizon_of(states.values(), now or datetime.now(UTC), timedelta(seconds=settings.batch.idle_partition_s))
