"""The dead-letter topic's headers, and a bounded count of its records by reason (for the operator console).

The record format (the JSON value) belongs to ``ingestion/dlq.py``; the headers are the part any reader may use
without parsing values, so their names live here, imported by the writer (ingestion) and by readers that may not
import ingestion (serving).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from infra.settings import Settings

logger = logging.getLogger(__name__)

REASON_HEADER: Final = "reason"  # why the record was rejected (ingestion.validate.Reason, or "delivery_failed" …)
SOURCE_HEADER: Final = "source"  # the file, stdin or generator the record came from
NO_REASON: Final = "(no reason header)"


@dataclass
class ReasonCounts:
    """Dead letters by reason among the newest ``scanned`` records of the topic (``total`` it holds in all)."""

    topic: str
    total: int = 0  # records the topic holds now (sum of high - low watermarks)
    scanned: int = 0  # the newest records read (at most the bound asked)
    by_reason: Counter[str] = field(default_factory=Counter)
    oldest: datetime | None = None  # rejection time (record timestamp) of the oldest record scanned
    newest: datetime | None = None
    complete: bool = True  # False: the read stopped at its time bound before the end of some partition


def reason_counts(settings: Settings, *, max_records: int, timeout_s: float) -> ReasonCounts:
    """Count the newest ``max_records`` dead letters by their reason header (values are not parsed).

    Each partition is read from ``high - share`` to the high watermark seen at the start, ``share`` being its part
    of ``max_records``; the whole read gives up after ``timeout_s`` (``complete`` False). No offsets are committed.

    :raises RuntimeError: Kafka does not answer or the topic does not exist (the message says which).
    """
    from confluent_kafka import Consumer  # noqa: PLC0415

    out = ReasonCounts(settings.kafka.dlq_topic)
    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": f"trends-console-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "log_level": 3,
        }
    )
    deadline = time.monotonic() + timeout_s
    try:
        ends = _assign_tails(consumer, settings, out, max_records, deadline)
        todo = set(ends)
        while todo and time.monotonic() < deadline:
            record = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if record is None or record.error() is not None:
                continue
            part, offset = record.partition() or 0, record.offset() or 0
            if offset + 1 >= ends.get(part, 0):
                todo.discard(part)
            if offset < ends.get(part, 0):
                _count(record, out)
        if todo:
            out.complete = False
            logger.warning("dead-letter count stopped after %.1f s with partitions %s unread", timeout_s, sorted(todo))
    finally:
        consumer.close()
    return out


def _assign_tails(
    consumer: Any, settings: Settings, out: ReasonCounts, max_records: int, deadline: float
) -> dict[int, int]:
    """Assign each partition's newest records to the consumer; return partition -> end offset (only those to read)."""
    from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

    topic = out.topic
    where = f"Kafka at {settings.kafka.bootstrap_servers} does not answer"
    try:
        meta = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic())).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            msg = f"dead-letter topic {topic} does not exist"
            raise RuntimeError(msg)
        share = max(1, max_records // len(meta.partitions))
        starts, ends = [], {}
        for p in sorted(meta.partitions):
            tp = TopicPartition(topic, p)
            low, high = consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()))
            out.total += high - low
            if max(low, high - share) < high:
                starts.append(TopicPartition(topic, p, max(low, high - share)))
                ends[p] = high
    except KafkaException as exc:
        msg = f"{where}: {exc}"
        raise RuntimeError(msg) from exc
    if starts:
        consumer.assign(starts)
    return ends


def _count(record: Any, out: ReasonCounts) -> None:
    """Count one record by its reason header, and its rejection time (the record timestamp)."""
    reason = dict(record.headers() or []).get(REASON_HEADER)
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    out.by_reason[reason or NO_REASON] += 1
    out.scanned += 1
    kind, ms = record.timestamp()
    if kind != 0 and ms is not None and ms >= 0:  # kind 0: the record has no timestamp
        at = datetime.fromtimestamp(ms / 1000, UTC)
        out.oldest = at if out.oldest is None else min(out.oldest, at)
        out.newest = at if out.newest is None else max(out.newest, at)
