"""The stack's broker with SASL/PLAIN: the pipeline's clients get in with the configured user, nobody else does.

A real Kafka node of its own (temporary data_dir, free loopback ports), started by the same code as
`trends stack up kafka`; the shared stack is not touched. SASL is what lets the stack bind a non-loopback address
(see tests/unit/test_security.py); here it runs on loopback, as tests must.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr

from infra import topics
from infra.settings import Settings
from ingestion.producer import EventProducer
from stack import control
from tests.helpers import consume_all, free_port
from views.event import Event

PASSWORD = "sasl-" + uuid.uuid4().hex  # 37 characters


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    base = Settings(data_dir=tmp_path_factory.mktemp("sasl") / "data")
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(
                update={
                    "bootstrap_servers": f"127.0.0.1:{free_port()}",
                    "security_protocol": "SASL_PLAINTEXT",
                    "sasl_mechanism": "PLAIN",
                    "sasl_username": "trends",
                    "sasl_password": SecretStr(PASSWORD),
                    "partitions": 1,
                }
            ),
            "stack": base.stack.model_copy(update={"kafka_controller_port": free_port(), "kafka_heap": "384m"}),
        }
    )
    try:
        control.up(settings, ["kafka"])
        yield settings
    finally:
        control.down(settings, ["kafka"])


def _admin(settings: Settings, **overrides: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers, "log_level": 0, **overrides})


def test_the_configured_user_produces_and_consumes(sasl_kafka: Settings) -> None:
    created = topics.ensure_topics(sasl_kafka.kafka)
    assert set(created) == {sasl_kafka.kafka.events_topic, sasl_kafka.kafka.dlq_topic}
    events = [Event(id=f"s{i}", ts=datetime(2025, 11, 22, 10, i, tzinfo=UTC), item="#sasl") for i in range(5)]
    with EventProducer(sasl_kafka) as producer:
        for event in events:
            producer.produce(event)
    assert producer.summary.sent == 5 and producer.summary.ok
    assert len(consume_all(sasl_kafka, sasl_kafka.kafka.events_topic, 5)) == 5


def test_clients_without_the_password_are_refused(sasl_kafka: Settings) -> None:
    config = (control.nodes(sasl_kafka, "kafka")[0].conf_dir / "server.properties").read_text()
    assert "PLAINTEXT:PLAINTEXT" not in config  # no listener, controller included, without authentication
    anonymous = _admin(sasl_kafka, **{"socket.timeout.ms": "3000"})
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=6)
    wrong = _admin(
        sasl_kafka,
        **{
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "trends",
            "sasl.password": PASSWORD + "x",
        },
    )
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=6)
    # The broker is up and answers whoever holds the password: the two refusals above were authentication.
    right = _admin(sasl_kafka, **{k: str(v) for k, v in sasl_kafka.kafka.client_config().items()})
    assert right.list_topics(timeout=10).brokers


def test_the_status_says_ready(sasl_kafka: Settings) -> None:
    (status,) = control.status(sasl_kafka, ["kafka"])
    assert status.ready and status.pid is not None
