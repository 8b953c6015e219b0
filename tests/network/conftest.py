"""The network-fault suite's harness: a Toxiproxy server, clients pointed at its proxies by settings, the result table.

One Toxiproxy server (``stack.services.toxiproxy``, built into the cache by ``make gotools``) runs for the session on
a free port with its files under a temporary data dir; each case creates the proxies it needs in front of a real
server and points one component at them through its ``TRENDS_*`` settings only, so the code under test never knows.
Every case adds a row (link, fault, what the component did, time to recover, counts after, result) to the table
printed at the end and written to ``artifacts/network.md``. Toxics are removed after each case.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import topics
from infra.settings import Settings
from stack.services.base import find_java
from stack.services.toxiproxy import ToxiproxyService
from tests.helpers import free_port
from tests.network import table
from tests.network.proxies import KAFKA_PROXY, SPEED_CASSANDRA_PROXY, PrivateKafka, ProxiedKafka, Proxies
from tests.pipeline import Pipeline, private_pipeline


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not table.ROWS:
        return
    terminalreporter.write_sep("=", "network faults")
    for line in table.lines():
        terminalreporter.write_line(line)
    table.write()


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


@pytest.fixture
def pipeline(stack_up: Settings, tmp_path: Path) -> Iterator[Pipeline]:
    """A private pipeline (:mod:`tests.pipeline`), as the reliability suite's cases have."""
    with private_pipeline(stack_up, tmp_path) as p:
        yield p


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
def private_kafka(
    settings: Settings, proxies: Proxies, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateKafka]:
    """Start a private broker (own ports and data dir) with a listener behind the proxy ``kafka``.

    Its events topic has 4 partitions. The broker is stopped at the end; the shared stack is never touched.
    """
    direct, proxied, controller = free_port(), free_port(), free_port()
    port = proxies.front(KAFKA_PROXY, f"127.0.0.1:{proxied}")
    own = settings.model_copy(
        update={
            "data_dir": tmp_path_factory.mktemp("kafka-net") / "data",
            "kafka": settings.kafka.model_copy(
                update={"bootstrap_servers": f"127.0.0.1:{direct}", "partitions": 4, "replication_factor": 1}
            ),
            "stack": settings.stack.model_copy(update={"kafka_controller_port": controller, "kafka_heap": "384m"}),
        }
    )
    broker = ProxiedKafka(own, proxied, port)
    broker.wait_ready(broker.start(find_java(own)))
    via_proxy = own.model_copy(
        update={"kafka": own.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{port}"})}
    )
    try:
        topics.ensure_topics(own.kafka)
        yield PrivateKafka(own, via_proxy)
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def proxied_kafka(private_kafka: PrivateKafka) -> Settings:
    """Return settings whose every Kafka connection goes through the proxy ``kafka`` to the private broker."""
    return private_kafka.via_proxy


@pytest.fixture
def kafka_pipeline(stack_up: Settings, private_kafka: PrivateKafka, tmp_path: Path) -> Iterator[Pipeline]:
    """A private pipeline whose topic is on the private broker; it produces straight to the broker.

    A test points the component under test at the proxy (:func:`tests.network.proxies.through_proxy`): only that
    link is degraded.
    """
    with private_pipeline(stack_up.model_copy(update={"kafka": private_kafka.direct.kafka}), tmp_path) as p:
        yield p
