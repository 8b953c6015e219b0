"""Toxiproxy in the network suite: proxies on free loopback ports, a private broker advertising its proxy, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from infra.settings import Settings
from stack.services.kafka import Kafka
from stack.toxiproxy import Stream, Toxiproxy
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
    """A private one-node Kafka with a second listener, ``PROXIED``, that advertises a proxy in front of it.

    Kafka clients bootstrap, then connect to the address the broker advertises for the listener they reached: a
    proxy in front of a broker that advertises itself would be bypassed after the first request. So a client
    bootstrapped at the proxy is told the proxy (every byte of it goes through the toxics), while one bootstrapped
    at the broker's own port is told that port: the producer of a case can feed the topic directly while the link
    of the component under test is degraded. The broker binds and checks its readiness on its own port.
    """

    def __init__(self, settings: Settings, proxied_port: int, advertised_port: int) -> None:
        super().__init__(settings)
        self.proxied_port = proxied_port
        self.advertised_port = advertised_port

    def listener_config(self) -> str:
        host, port, ctl = self.host, self.client_port, self.controller_port
        assert not self.settings.stack.tls, "the proxied broker runs PLAINTEXT on loopback only"
        assert self.settings.kafka.security_protocol == "PLAINTEXT", "the proxied broker runs PLAINTEXT only"
        return "\n".join(
            [
                f"listeners=PLAINTEXT://{host}:{port},PROXIED://{host}:{self.proxied_port},CONTROLLER://{host}:{ctl}",
                f"advertised.listeners=PLAINTEXT://{host}:{port},PROXIED://127.0.0.1:{self.advertised_port}",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT",
            ]
        )


@dataclass(frozen=True)
class PrivateKafka:
    """Settings for one private broker: straight to it, and through the proxy ``kafka`` in front of it."""

    direct: Settings
    via_proxy: Settings


def through_proxy(settings: Settings, kafka: PrivateKafka) -> Settings:
    """Return ``settings`` with only the bootstrap servers moved to the proxy (the topic and the rest kept)."""
    servers = kafka.via_proxy.kafka.bootstrap_servers
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": servers})})


def wait_until(check: Any, timeout_s: float, poll_s: float = 0.5) -> float | None:
    """Call ``check()`` until it is true; return the seconds it took, or None when the time ran out."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if check():
            return time.monotonic() - began
        time.sleep(poll_s)
    return None


Fault = tuple[str, Callable[[Toxiproxy], None], float]  # what the table calls it, how to inject it, for how long


def five_faults(
    proxy: str,
    heavy: Stream | Literal["both"],
    *,
    seconds: float = 30.0,
    black_hole_s: float = 60.0,
    reset: Stream = "downstream",
) -> list[Fault]:
    """The five faults every link is put through, on one proxy: ``seconds`` each (the black hole ``black_hole_s``).

    :arg heavy: the direction that carries the component's data (its writes upstream, its reads downstream), which
        the bandwidth cap throttles; ``both`` caps both ways (a request and its answer alike).
    :arg reset: the direction whose connections are reset.
    """

    def latency(api: Toxiproxy) -> None:
        api.latency(proxy, 1000, 500)

    def black_hole(api: Toxiproxy) -> None:
        api.timeout(proxy, 0, stream="downstream")
        api.timeout(proxy, 0, stream="upstream")

    def reset_peer(api: Toxiproxy) -> None:
        api.reset_peer(proxy, 0, stream=reset)

    def bandwidth(api: Toxiproxy) -> None:
        for stream in ("downstream", "upstream") if heavy == "both" else (heavy,):
            api.bandwidth(proxy, 10, stream=stream)

    def slicer(api: Toxiproxy) -> None:
        api.slicer(proxy, 64, 32, 200)

    capped = "both ways" if heavy == "both" else heavy
    return [
        (f"latency 1 s ± 500 ms, {seconds:g} s", latency, seconds),
        (f"black hole (timeout toxic, both ways) {black_hole_s:g} s", black_hole, black_hole_s),
        (f"reset_peer (every connection reset), {seconds:g} s", reset_peer, seconds),
        (f"bandwidth 10 KB/s ({capped}), {seconds:g} s", bandwidth, seconds),
        (f"slicer 64 ± 32 B every 200 µs, {seconds:g} s", slicer, seconds),
    ]


def fault_ids(faults: list[Fault]) -> list[str]:
    """Return the test ids of faults: the first word of each."""
    return [f[0].split(" ")[0] for f in faults]
