"""Create the pipeline's Kafka topics with their partitions, replication and retention.

Creation is idempotent: an existing topic keeps its partitions (a count can only grow and changing it moves
keys between partitions, so we refuse silently-different counts with an error), and its retention-related
configs are brought to the settings with an incremental alter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from infra.errors import StackError
from infra.settings import KafkaSettings

logger = logging.getLogger(__name__)

TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TopicSpec:
    """A topic as the pipeline wants it."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]


def topic_specs(kafka: KafkaSettings) -> list[TopicSpec]:
    """Return the events and dead-letter topics as configured."""
    common = {"min.insync.replicas": str(kafka.min_insync_replicas)}
    return [
        TopicSpec(
            kafka.events_topic,
            kafka.partitions,
            kafka.replication_factor,
            {
                **common,
                "retention.ms": str(kafka.events_retention_ms),
                "retention.bytes": str(kafka.events_retention_bytes),
                # Events carry their event time as the record timestamp; historical events must be accepted.
                "message.timestamp.type": "CreateTime",
                "message.timestamp.before.max.ms": str(2**63 - 1),
            },
        ),
        TopicSpec(
            kafka.dlq_topic,
            kafka.partitions,
            kafka.replication_factor,
            {**common, "retention.ms": str(kafka.dlq_retention_ms)},
        ),
    ]


def ensure_topics(kafka: KafkaSettings, specs: list[TopicSpec] | None = None) -> dict[str, str]:
    """Create missing topics and align the configs of existing ones; return name -> "created"/"exists"."""
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import (  # noqa: PLC0415
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    specs = specs if specs is not None else topic_specs(kafka)
    admin = AdminClient({**kafka.client_config(), "log_level": 3})
    try:
        existing = admin.list_topics(timeout=TIMEOUT_S).topics
    except KafkaException as exc:
        msg = f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc}"
        raise StackError(msg) from exc
    outcome: dict[str, str] = {}
    to_create = [
        NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor, config=s.config)
        for s in specs
        if s.name not in existing
    ]
    if to_create:
        for name, future in admin.create_topics(to_create, request_timeout=TIMEOUT_S).items():
            try:
                future.result(timeout=TIMEOUT_S)
                outcome[name] = "created"
                logger.info("created topic %s", name)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    msg = f"creating topic {name} failed: {exc}"
                    raise StackError(msg) from exc
                outcome[name] = "exists"
    for spec in specs:
        if spec.name not in existing:
            continue
        outcome[spec.name] = "exists"
        have = len(existing[spec.name].partitions)
        if have != spec.partitions:
            msg = (
                f"topic {spec.name} has {have} partitions but settings ask for {spec.partitions}; "
                "partition counts are not changed automatically (it would move keys between partitions)"
            )
            raise StackError(msg)
        resource = ConfigResource(
            ResourceType.TOPIC,
            spec.name,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in spec.config.items()
            ],
        )
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=TIMEOUT_S)
    return outcome


def delete_topics(kafka: KafkaSettings, names: list[str]) -> None:
    """Delete topics (used by tests and the round-trip check for their throw-away topics)."""
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    admin = AdminClient({**kafka.client_config(), "log_level": 3})
    for future in admin.delete_topics(names, operation_timeout=TIMEOUT_S).values():
        future.result(timeout=TIMEOUT_S)
