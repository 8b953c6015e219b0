"""`trends stack` against real servers: idempotent up, clear start-up failures, data kept across down/up."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from infra import topics
from infra.errors import StackError
from infra.settings import Settings
from stack import control
from stack.services.kafka import Kafka
from tests.helpers import consume_all, free_port


def private_kafka(tmp_path: Path, **stack_overrides: object) -> Settings:
    """Settings of a second, throw-away broker on free ports with its own data dir."""
    return Settings(
        data_dir=tmp_path,
        kafka={"bootstrap_servers": f"127.0.0.1:{free_port()}", "partitions": 1},
        stack={"kafka_controller_port": free_port(), "kafka_start_timeout_s": 60, **stack_overrides},
    )


def test_up_twice_is_a_noop(stack_up: Settings) -> None:
    before = {s.name: s.pid for s in control.status(stack_up)}
    again = control.up(stack_up)
    assert all(r.already_running for r in again)
    assert {r.name: r.pid for r in again} == before
    assert all(s.ready for s in control.status(stack_up))


def test_port_taken_by_another_process(tmp_path: Path) -> None:
    settings = private_kafka(tmp_path)
    host, port = settings.kafka.first_broker
    with socket.socket() as squatter:
        squatter.bind((host, port))
        squatter.listen()
        with pytest.raises(StackError, match=rf"port {host}:{port} is already taken by .*TRENDS_KAFKA__BOOTSTRAP"):
            control.up(settings, ["kafka"])
    assert Kafka(settings).pid() is None


def test_server_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    settings = private_kafka(tmp_path, kafka_heap="1k")  # the JVM refuses a 1 KB heap
    with pytest.raises(StackError, match=r"kafka exited during start-up(.|\n)*heap"):
        control.up(settings, ["kafka"])
    assert Kafka(settings).pid() is None


def test_data_survives_down_up_and_reset_wipes_it(tmp_path: Path) -> None:
    settings = private_kafka(tmp_path)
    topic = f"survivor.{uuid.uuid4().hex[:6]}"
    try:
        control.up(settings, ["kafka"])
        topics.ensure_topics(settings.kafka, [topics.TopicSpec(topic, 1, 1, {})])
        producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
        for i in range(10):
            producer.produce(topic, value=str(i).encode())
        assert producer.flush(30) == 0

        assert control.down(settings, ["kafka"]) == ["kafka"]
        assert Kafka(settings).pid() is None
        assert control.down(settings, ["kafka"]) == []
        control.up(settings, ["kafka"])
        assert sorted(consume_all(settings, topic, expect=10)) == [str(i) for i in range(10)]

        removed = control.reset(settings, ["kafka"])
        assert removed == [tmp_path / "kafka" / "data"]
        control.up(settings, ["kafka"])
        from confluent_kafka.admin import AdminClient

        assert topic not in AdminClient(settings.kafka.client_config()).list_topics(timeout=10).topics
    finally:
        control.down(settings, ["kafka"])
