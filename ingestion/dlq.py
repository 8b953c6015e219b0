"""The dead-letter topic: the record format of rejects, and reading them back for ``trends ingest dlq``.

A dead-letter record's value is JSON::

    {"v": 1, "reason": "bad_time", "detail": "…", "source": "logs/2025-11.csv", "line": 17,
     "rejected_at": "2026-11-22T10:00:00.123Z", "raw_size": 84, "truncated": false,
     "raw_encoding": "utf-8", "raw": "…the original record…"}

A record read from another Kafka topic (``trends ingest kafka``) has the topic as ``source``, no ``line``, and
``source_partition`` and ``source_offset`` besides: where to find the original record (records of older writers
lack both keys, and read back as -1).

``raw`` holds the original bytes exactly: as text when they are valid UTF-8, else base64 (``raw_encoding``).
Records longer than :data:`MAX_DLQ_RAW_BYTES` keep only their start (``truncated``; ``raw_size`` is the whole
size). Headers repeat ``reason`` and ``source`` for tools that do not parse values (their names live in
:mod:`infra.dlq_reasons`, which readers outside ingestion import); the Kafka timestamp is the rejection time, so
retention counts from then, not from a possibly year-old event time.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from infra.dlq_reasons import REASON_HEADER, SOURCE_HEADER
from infra.errors import TrendsError
from infra.settings import Settings
from infra.settings_env import env_var
from ingestion.validate import Reason, Reject
from views.event import format_ts, parse_time, ts_millis

logger = logging.getLogger(__name__)

DLQ_FORMAT_VERSION: Final = 1
MAX_DLQ_RAW_BYTES: Final = 64 * 1024


def encode_reject(reject: Reject) -> tuple[bytes, list[tuple[str, bytes]], int]:
    """Return the value, headers and timestamp (ms) of the dead-letter record of a reject."""
    raw = reject.raw[:MAX_DLQ_RAW_BYTES]
    size = reject.raw_size if reject.raw_size is not None else len(reject.raw)
    try:
        text, encoding = raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(raw).decode("ascii"), "base64"
    value: dict[str, Any] = {
        "v": DLQ_FORMAT_VERSION,
        "reason": str(reject.reason),
        "detail": reject.detail,
        "source": reject.source,
        "line": reject.line,
        "rejected_at": format_ts(reject.rejected_at),
        "raw_size": size,
        "truncated": len(raw) < size,
        "raw_encoding": encoding,
        "raw": text,
    }
    if reject.partition is not None:
        value["source_partition"] = reject.partition
        value["source_offset"] = reject.offset
    headers = [(REASON_HEADER, str(reject.reason).encode()), (SOURCE_HEADER, reject.source.encode("utf-8", "replace"))]
    return json.dumps(value, ensure_ascii=False).encode(), headers, ts_millis(reject.rejected_at)


@dataclass(frozen=True)
class DeadLetter:
    """A dead-letter record read back from the topic."""

    reason: str
    detail: str
    source: str
    line: int | None
    rejected_at: datetime
    raw: bytes
    raw_size: int
    truncated: bool
    partition: int = -1
    offset: int = -1
    source_partition: int = -1  # a record of another Kafka topic: its partition and offset there
    source_offset: int = -1

    @classmethod
    def decode(cls, value: bytes, partition: int = -1, offset: int = -1) -> DeadLetter:
        """Parse a dead-letter record's value.

        :raises ValueError: when the value is not a dead-letter record of a known version.
        """
        obj: dict[str, Any] = json.loads(value)
        if not isinstance(obj, dict) or obj.get("v") != DLQ_FORMAT_VERSION:
            msg = f"not a version {DLQ_FORMAT_VERSION} dead-letter record"
            raise ValueError(msg)
        text = obj["raw"]
        try:
            raw = base64.b64decode(text, validate=True) if obj["raw_encoding"] == "base64" else text.encode("utf-8")
        except binascii.Error as exc:
            msg = f"bad base64 raw bytes: {exc}"
            raise ValueError(msg) from exc
        return cls(
            reason=obj["reason"],
            detail=obj["detail"],
            source=obj["source"],
            line=obj["line"],
            rejected_at=parse_time(obj["rejected_at"]),
            raw=raw,
            raw_size=obj["raw_size"],
            truncated=obj["truncated"],
            partition=partition,
            offset=offset,
            source_partition=obj.get("source_partition", -1),
            source_offset=obj.get("source_offset", -1),
        )


@dataclass
class DlqReport:
    """What ``trends ingest dlq`` shows: counts per reason and source, and samples per reason."""

    total: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[DeadLetter]] = field(default_factory=dict)
    unreadable: int = 0


def read_dead_letters(
    settings: Settings,
    topic: str | None = None,
    *,
    since: datetime | None = None,
    limit: int | None = None,
    timeout_s: float = 60.0,
) -> Iterator[DeadLetter]:
    """Yield the dead-letter records present now, oldest first per partition, then stop.

    The end is each partition's high watermark when reading starts, so records arriving meanwhile are left for
    the next look. No consumer group offsets are committed.

    :arg since: start at the first record rejected at or after this time (``offsets_for_times``).
    :arg limit: stop after this many records.
    :arg timeout_s: give up waiting for the broker after this long.
    :raises TrendsError: when the topic does not exist or the broker does not answer.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition  # noqa: PLC0415

    topic = topic or settings.kafka.dlq_topic
    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": f"trends-dlq-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            msg = f"cannot reach Kafka at {settings.kafka.bootstrap_servers}: {exc}"
            raise TrendsError(msg) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            msg = (
                f"dead-letter topic {topic} does not exist (run `trends stack up` or check "
                f"{env_var('kafka.dlq_topic')})"
            )
            raise TrendsError(msg)
        partitions = sorted(meta.partitions)
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s) for p in partitions}
        ends = {p: high for p, (_low, high) in marks.items()}
        starts = [TopicPartition(topic, p, marks[p][0]) for p in partitions]
        if since is not None:
            asked = [TopicPartition(topic, p, ts_millis(since)) for p in partitions]
            starts = [
                tp if tp.offset >= 0 else TopicPartition(topic, tp.partition, ends[tp.partition])  # -1: none after
                for tp in consumer.offsets_for_times(asked, timeout=timeout_s)
            ]
        todo = {tp.partition for tp in starts if tp.offset < ends[tp.partition]}
        consumer.assign(starts)
        count = 0
        deadline = time.monotonic() + timeout_s
        while todo and (limit is None or count < limit):
            if time.monotonic() > deadline:
                logger.warning("stopped reading %s after %.0f s with partitions %s unfinished", topic, timeout_s, todo)
                break
            record = consumer.poll(0.5)
            if record is None:
                continue
            if record.error() is not None:
                logger.warning("dead-letter read error: %s", record.error())
                continue
            deadline = time.monotonic() + timeout_s
            part, offset = record.partition() or 0, record.offset() or 0
            if offset + 1 >= ends[part]:
                todo.discard(part)
            if offset >= ends[part]:
                continue
            count += 1
            try:
                yield DeadLetter.decode(record.value() or b"", part, offset)
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("unreadable dead-letter record at %s/%s: %s", part, offset, exc)
                yield DeadLetter(
                    reason="unreadable",
                    detail=str(exc),
                    source="?",
                    line=None,
                    rejected_at=datetime.fromtimestamp((record.timestamp()[1] or 0) / 1000, UTC),
                    raw=record.value() or b"",
                    raw_size=len(record.value() or b""),
                    truncated=False,
                    partition=part,
                    offset=offset,
                )
    finally:
        consumer.close()


def report(letters: Iterator[DeadLetter], *, samples_per_reason: int = 3, reason: str | None = None) -> DlqReport:
    """Count dead letters per reason and source and keep the first few of each reason."""
    out = DlqReport()
    for letter in letters:
        if reason is not None and letter.reason != reason:
            continue
        out.total += 1
        out.by_reason[letter.reason] += 1
        out.by_source[letter.source] += 1
        if letter.reason == "unreadable":
            out.unreadable += 1
        kept = out.samples.setdefault(letter.reason, [])
        if len(kept) < samples_per_reason:
            kept.append(letter)
    return out


KNOWN_REASONS: Final = tuple(str(r) for r in Reason)
