"""The network-fault suite's harness: a Toxiproxy server, clients pointed at its proxies by settings, the result table.

One Toxiproxy server (``stack.services.toxiproxy``, built into the cache by ``make gotools``) runs for the session on
a free port with its files under a temporary data dir; each case creates the proxies it needs in front of a real
server and points one component at them through its ``TRENDS_*`` settings only, so the code under test never knows.
Every case adds a row (link, fault, what the component did, time to recover, counts after, result) to the table
printed at the end and written to ``artifacts/network.md``. Toxics are removed after each case.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra import topics
from infra.settings import Settings
from stack.services.base import find_java
from stack.services.kafka import Kafka
from stack.services.toxiproxy import ToxiproxyService
from stack.toxiproxy import Toxiproxy
from tests.helpers import free_port
from tests.reliability.conftest import Pipeline, pipeline  # noqa: F401 - the reliability suite's harness, reused


@dataclass(frozen=True)
class Row:
    """One case of the table."""

    link: str
    fault: str
    behaviour: str
    recovery: str
    counts: str
    ok: bool


ROWS: list[Row] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    lines = [
        "| link | fault | what the component did | recovery after healing | counts after | result |",
        "|---|---|---|---:|---|---|",
    ]
    lines += [
        f"| {r.link} | {r.fault} | {r.behaviour} | {r.recovery} | {r.counts} | {'PASS' if r.ok else 'FAIL'} |"
        for r in ROWS
    ]
    terminalreporter.write_sep("=", "network faults")
    for line in lines:
        terminalreporter.write_line(line)
    out = Path(__file__).resolve().parents[2] / "artifacts"
    out.mkdir(exist_ok=True)
    (out / "network.md").write_text("\n".join(lines) + "\n")


def record(link: str, fault: str, behaviour: str, recovery_s: float | None, counts: str, ok: bool) -> None:
    """Add a row to the table (before the case's assertions, so a failure shows its figures too)."""
    recovery = "never" if recovery_s is None else f"{recovery_s:.1f} s"
    ROWS.append(Row(link, fault, behaviour, recovery, counts, ok))


@dataclass
class Proxies:
    """The session's Toxiproxy server: its API, and proxies made on free loopback ports."""

    api: Toxiproxy

    def front(self, name: str, upstream: str) -> int:
        """Put a proxy named ``name`` in front of ``upstream`` (host:port); return the port it listens on."""
        port = free_port()
        self.api.create(name, f"127.0.0.1:{port}", upstream)
        return port


@pytest.fixture(scope="session")
def proxies(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxies]:
    """Run a Toxiproxy server for the session (its pid file and log under a temporary data dir)."""
    own = settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("toxiproxy")})
    service = ToxiproxyService(own, free_port())
    service.wait_ready(service.start(""))
    try:
        yield Proxies(service.api())
    finally:
        service.stop()


@pytest.fixture(autouse=True)
def _healthy_network(request: pytest.FixtureRequest) -> Iterator[None]:
    """Remove every toxic and enable every proxy after each case (a failed case leaves no fault behind)."""
    yield
    if "proxies" in request.fixturenames:
        request.getfixturevalue("proxies").api.reset()


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


KAFKA_PROXY = "kafka"
SPEED_CASSANDRA_PROXY = "speed-cassandra"


@pytest.fixture
def speed_via_proxy(request: pytest.FixtureRequest, proxies: Proxies) -> Pipeline:
    """Return the reliability suite's private pipeline with the speed job's Cassandra behind a proxy.

    Only the speed service's settings change (``TRENDS_CASSANDRA__PORT``); the test reads the views directly.
    """
    p: Pipeline = request.getfixturevalue("pipeline")
    c = p.settings.cassandra
    port = proxies.front(SPEED_CASSANDRA_PROXY, f"{c.contact_points[0]}:{c.port}")
    s = p.speed_settings
    p.speed_settings = s.model_copy(update={"cassandra": s.cassandra.model_copy(update={"port": port})})
    return p


@pytest.fixture(scope="module")
def proxied_kafka(settings: Settings, proxies: Proxies, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Start a private broker (own ports and data dir) behind the proxy ``kafka``; yield settings pointing at the proxy.

    Its events topic has 4 partitions. The broker is stopped at the end; the shared stack is never touched.
    """
    direct, controller = free_port(), free_port()
    port = proxies.front(KAFKA_PROXY, f"127.0.0.1:{direct}")
    own = settings.model_copy(
        update={
            "data_dir": tmp_path_factory.mktemp("kafka-net") / "data",
            "kafka": settings.kafka.model_copy(
                update={"bootstrap_servers": f"127.0.0.1:{direct}", "partitions": 4, "replication_factor": 1}
            ),
            "stack": settings.stack.model_copy(update={"kafka_controller_port": controller, "kafka_heap": "384m"}),
        }
    )
    broker = ProxiedKafka(own, port)
    broker.wait_ready(broker.start(find_java(own)))
    via_proxy = own.model_copy(
        update={"kafka": own.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{port}"})}
    )
    try:
        topics.ensure_topics(via_proxy.kafka)
        yield via_proxy
    finally:
        broker.stop()


def wait_until(check: Any, timeout_s: float, poll_s: float = 0.5) -> float | None:
    """Call ``check()`` until it is true; return the seconds it took, or None when the time ran out."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if check():
            return time.monotonic() - began
        time.sleep(poll_s)
    return None
