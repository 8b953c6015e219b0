"""Toxiproxy in the network suite: proxies on free loopback ports, a private broker advertising its proxy, waiting."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from infra.settings import Settings
from stack.services.kafka import Kafka
from stack.toxiproxy import Toxiproxy
from tests.helpers import free_port

KAFKA_PROXY = "kafka"
SPEED_CASSANDRA_PROXY = "speed-cassandra"


@dataclass
class Proxies:
    """The session's Toxiproxy server: its API, and proxies made on free loopback ports."""

    api: Toxiproxy

    def front(self, name: str, upstream: str) -> int:
        """Put a proxy named ``name`` in front of ``upstream`` (host:port); return the port it listens on."""
        port = free_port()
        self.api.create(name, f"127.0.0.1:{port}", upstream)
        return port


class ProxiedKafka(Kafka):
    """A private one-node Kafka whose advertised listener is a proxy in front of it.

    Kafka clients bootstrap, then connect to the address the broker advertises: a proxy in front of a broker that
    advertises itself would be bypassed after the first request. Only the ``advertised.listeners`` line differs from
    the stack's broker; the broker still binds and checks its readiness on its own port.
    """

    def __init__(self, settings: Settings, advertised_port: int) -> None:
        super().__init__(settings)
        self.advertised_port = advertised_port

    def listener_config(self) -> str:
        own = f"advertised.listeners=PLAINTEXT://{self.host}:{self.client_port}"
        text = super().listener_config()
        assert own in text, "the proxied broker runs PLAINTEXT on loopback only"
        return text.replace(own, f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.advertised_port}")


def wait_until(check: Any, timeout_s: float, poll_s: float = 0.5) -> float | None:
    """Call ``check()`` until it is true; return the seconds it took, or None when the time ran out."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if check():
            return time.monotonic() - began
        time.sleep(poll_s)
    return None
