"""The indexer: one incremental pass over the events topic's new offsets into the event-time index.

Offset-by-timestamp (``ListOffsets``) finds the first record at or after a time, which only locates an hour when
the log is in time order. History replayed behind newer events, late producers and merged topics break that, so
the batch layer indexes the log itself: one pass over the offsets not indexed yet records, per hour of the
**record timestamp** and per partition, the offset spans holding that hour's records and their counts. Ingestion
sets the record timestamp to the event time (the contract, see ``docs/layers.md``); a record whose JSON time
names another hour is counted as *outside* in the lineage of the hour its timestamp names, never lost silently.

The spans come from :mod:`views.indexing.spans`, the tables are :mod:`views.store.index`'s. The checkpoint per
partition (next offset, newest record time, spans still open) is written after the spans it covers, and spans are
keyed by their first offset: killed at any point, a rerun from the checkpoint writes the same rows again and ends
with the same index. Cost: O(new records), no Spark.

Offsets Kafka removed (retention, ``DeleteRecords``) before a pass read them are a **loss**: recorded with their
offsets and the bound on their time (:mod:`views.store.losses`) before any checkpoint passes them, so the hours
they may belong to are incomplete instead of completing as if whole. Records without a usable timestamp are
counted apart (``untimed``). The consumer never resets silently to the end when offsets vanish under it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infra.cassandra import session
from infra.errors import TrendsError
from infra.settings import Settings
from views.indexing import kafka_topic
from views.indexing.spans import PartitionIndexer
from views.store.index import IndexStore, OffsetSpan, PartitionState, ms_to_dt
from views.store.losses import Loss, loss_bound

logger = logging.getLogger(__name__)


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


class OffsetsRemovedError(TrendsError):
    """Retention removed offsets a running pass was about to read (the next pass records them as lost)."""


class IndexPass:
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
        retention = kafka_topic.retention_ms(settings, self.topic)
        firsts = kafka_topic.first_timestamps(settings, self.topic, gaps)
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
        spans: list[tuple[int, OffsetSpan]] = []
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
    store: IndexStore | None = None,
) -> IndexResult:
    """Index the topic's records from the checkpoint up to the end the partitions had when the pass started.

    Records removed before they were indexed are recorded as losses (:mod:`views.store.losses`); when retention
    removes offsets under a running pass, what was read is checkpointed and a new pass records the gap.

    :arg store: the index's store on the caller's Cassandra session (a recompute indexes, plans and loads on one);
        None opens a session for the pass.
    """
    topic = topic or settings.kafka.events_topic
    t0 = time.monotonic()
    total = IndexResult()
    for attempt in range(1, 4):
        consumer = kafka_topic.index_consumer(settings)
        try:
            partitions = kafka_topic.partitions(consumer, topic)
            with contextlib.ExitStack() as stack:
                if store is None:
                    store = IndexStore(settings, stack.enter_context(session(settings)))
                one = IndexPass(settings, store, consumer, topic)
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
    consumer = kafka_topic.index_consumer(settings)
    try:
        lows = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[0]
            for p in kafka_topic.partitions(consumer, topic)
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
