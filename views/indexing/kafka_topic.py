"""What the indexer and the batch planner ask Kafka of the events topic, and the consumer the indexer reads with.

Its partitions, its retention, the oldest offsets kept, the first record time of an offset range.

Small clients of their own, made per call: the indexer and the planner ask once per pass, never per record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from infra.errors import TrendsError
from infra.service_settings import KafkaSettings
from infra.settings import Settings

logger = logging.getLogger(__name__)

TIMEOUT_S = 30.0


def index_consumer(settings: Settings) -> Any:
    """Return the indexer's consumer: it never commits offsets, and offsets removed under it are an error."""
    from confluent_kafka import Consumer  # noqa: PLC0415

    return Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": "trends-batch-indexer",  # offsets are never committed: the checkpoint is in Cassandra
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Committed records only (librdkafka's default, stated): the Kafka bridge writes in transactions, and
            # the records of an aborted one are no events. The offsets of markers and aborted records are holes
            # inside spans; a span's count is of the records read, and the end of a partition is reported (EOF)
            # at its last stable offset.
            "isolation.level": "read_committed",
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


def partitions(consumer: Any, topic: str) -> list[int]:
    """Return the topic's partitions, in order.

    :raises TrendsError: when the topic does not exist.
    """
    meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        msg = f"topic {topic} does not exist"
        raise TrendsError(msg)
    return sorted(meta.partitions)


def retention_ms(settings: Settings, topic: str) -> int | None:
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
            "isolation.level": "read_committed",
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


def earliest_offsets(kafka: KafkaSettings, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """Return the oldest offset retention kept, per partition."""
    from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient, OffsetSpec  # noqa: PLC0415

    admin = AdminClient({**kafka.client_config(), "log_level": 3})
    request = {TopicPartition(topic, p): OffsetSpec.earliest() for p in partitions}  # type: ignore[no-untyped-call]
    if not request:
        return {}
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        futures = admin.list_offsets(request, request_timeout=TIMEOUT_S)
        try:
            return {tp.partition: int(f.result(timeout=TIMEOUT_S).offset) for tp, f in futures.items()}
        except KafkaException as exc:
            # A leader moving or a broker just restarted (UNKNOWN_LEADER_EPOCH, NOT_LEADER...) passes: ask again.
            err = exc.args[0] if exc.args else None
            if not _transient(err) or time.monotonic() > deadline:
                raise
            logger.info("listing the earliest offsets of %s: %s; retrying", topic, err)
            time.sleep(0.5)


def _transient(err: Any) -> bool:
    """Return whether a Kafka error passes by itself (leadership moving, a broker restarting)."""
    from confluent_kafka import KafkaError  # noqa: PLC0415

    passing = {
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in passing)
