"""Create the pipeline's Kafka topics with their partitions, replication and retention.

Creation is idempotent: an existing topic keeps its partitions (a count can only grow and changing it moves
keys between partitions, so we refuse silently-different counts with an error). An existing topic's configs belong
to its operator (the runbook has them changed with ``kafka-configs.sh``): they are compared with the settings and
left alone, unless the caller asks to apply the settings (``trends stack init --apply-topic-config``), which
changes only the keys that differ and reports each change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from infra.errors import SetupError
from infra.pipeline_settings import PrivacySettings
from infra.service_settings import KafkaSettings

logger = logging.getLogger(__name__)

TIMEOUT_S = 30.0
DAY_MS = 86_400_000


@dataclass(frozen=True)
class TopicSpec:
    """A topic as the pipeline wants it."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]


def dlq_retention(kafka: KafkaSettings, privacy: PrivacySettings) -> dict[str, str]:
    """Return the dead-letter topic's retention configs: deleted well before the erasure deadline.

    Dead letters keep the raw record, user id included, and nothing pseudonymises them; an erasure cannot reach
    into them, so they must be gone before its deadline. Kafka deletes a segment once its newest record is older
    than ``retention.ms`` (checked every 5 minutes, files removed a minute later), so a record lives at most
    ``retention.ms`` plus the time its segment stays open: segments roll daily (``segment.ms``) and the
    retention is the deadline minus that day and one more day of margin (or the configured one, if shorter).
    """
    deadline = privacy.erasure_deadline_days * DAY_MS
    segment = min(DAY_MS, deadline // 4)
    bound = deadline - segment - min(DAY_MS, deadline // 4)
    configured = kafka.dlq_retention_ms
    retention = bound if configured < 0 else min(configured, bound)
    return {"retention.ms": str(retention), "segment.ms": str(segment)}


def topic_specs(kafka: KafkaSettings, privacy: PrivacySettings | None = None) -> list[TopicSpec]:
    """Return the events and dead-letter topics as configured (the dead letters' retention per :func:`dlq_retention`).

    :arg privacy: the erasure deadline that bounds the dead letters' retention (default: the default deadline).
    """
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
            {**common, **dlq_retention(kafka, privacy or PrivacySettings())},
        ),
    ]


@dataclass(frozen=True)
class ConfigChange:
    """A topic config whose value on the broker differs from the settings (``current`` None: not set there)."""

    topic: str
    key: str
    current: str | None
    wanted: str

    def describe(self) -> str:
        """Return ``topic key: current -> wanted``."""
        return f"{self.topic} {self.key}: {self.current if self.current is not None else '(unset)'} -> {self.wanted}"


def ensure_topics(
    kafka: KafkaSettings,
    specs: list[TopicSpec] | None = None,
    *,
    apply_config: bool = False,
    changes: list[ConfigChange] | None = None,
    privacy: PrivacySettings | None = None,
) -> dict[str, str]:
    """Create missing topics with the configured settings; return name -> "created"/"exists".

    An existing topic's configs are compared with the spec; the differences are appended to ``changes`` and
    applied only with ``apply_config`` (otherwise the operator's values stay).
    """
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient, NewTopic  # noqa: PLC0415

    specs = specs if specs is not None else topic_specs(kafka, privacy)
    admin = AdminClient({**kafka.client_config(), "log_level": 3})
    try:
        existing = admin.list_topics(timeout=TIMEOUT_S).topics
    except KafkaException as exc:
        msg = f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc}"
        raise SetupError(msg) from exc
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
                    raise SetupError(msg) from exc
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
            raise SetupError(msg)
        found = align_config(admin, spec, apply=apply_config)
        if changes is not None:
            changes.extend(found)
    return outcome


def align_config(admin: Any, spec: TopicSpec, *, apply: bool) -> list[ConfigChange]:
    """Return the existing topic's configs that differ from the spec; set them to the spec only with ``apply``."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType  # noqa: PLC0415

    differ = config_drift(admin, spec)
    if not differ or not apply:
        if differ:
            logger.info(
                "topic %s: %d config(s) differ from the settings and are left as they are: %s",
                spec.name, len(differ), "; ".join(c.describe() for c in differ),
            )  # fmt: skip
        return differ
    entries = [ConfigEntry(c.key, c.wanted, incremental_operation=AlterConfigOpType.SET) for c in differ]
    resource = ConfigResource(ResourceType.TOPIC, spec.name, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=TIMEOUT_S)
    for change in differ:
        logger.warning("topic config changed: %s", change.describe())
    return differ


def config_drift(admin: Any, spec: TopicSpec) -> list[ConfigChange]:
    """Return the spec's configs whose value on the broker differs (dynamic or default alike)."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # noqa: PLC0415

    if not spec.config:
        return []
    resource = ConfigResource(ResourceType.TOPIC, spec.name)
    described = next(iter(admin.describe_configs([resource], request_timeout=TIMEOUT_S).values()))
    entries = described.result(timeout=TIMEOUT_S)
    out = []
    for key, wanted in spec.config.items():
        entry = entries.get(key)
        current = None if entry is None else entry.value
        if current != wanted:
            out.append(ConfigChange(spec.name, key, current, wanted))
    return out


def delete_topics(kafka: KafkaSettings, names: list[str]) -> None:
    """Delete topics (used by tests and the round-trip check for their throw-away topics)."""
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    admin = AdminClient({**kafka.client_config(), "log_level": 3})
    for future in admin.delete_topics(names, operation_timeout=TIMEOUT_S).values():
        future.result(timeout=TIMEOUT_S)
