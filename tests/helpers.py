"""Small helpers shared by service tests."""

from __future__ import annotations

import socket
import time
import uuid

from confluent_kafka import Consumer

from infra.settings import Settings


def free_port() -> int:
    """Return a loopback port that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def consume_all(settings: Settings, topic: str, expect: int, timeout_s: float = 30) -> list[str]:
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value().decode())
    finally:
        consumer.close()
    return values
