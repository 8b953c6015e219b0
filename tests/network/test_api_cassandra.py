"""API -> Cassandra through Toxiproxy: during a fault the API answers the exact count, a named gap or a 503 with a
message — never a wrong number — and after the fault heals it answers exactly again, by itself.

The views hold two closed hours of a private topic, computed by the real batch layer; ``trends serve`` runs in its own
process with ``TRENDS_CASSANDRA__PORT`` set to the proxy (its caches on, as deployed: each request still reads the
layers' state). While a toxic is on the link a client asks for the window's count over and over; each answer is
classified, and after the toxic is removed the time until the first exact answer is the recovery time.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from infra import migrations, topics
from infra.settings import Settings
from stack.toxiproxy import Toxiproxy
from tests.helpers import drop_keyspace, serve
from tests.network.proxies import Proxies, five_faults, wait_until
from tests.network.table import record
from views.event import Event

pytestmark = [pytest.mark.network, pytest.mark.services, pytest.mark.spark]

H0 = datetime(2025, 9, 1, 6, tzinfo=UTC)
HOUR = timedelta(hours=1)
EVENTS = 3000
PROXY = "api-cassandra"
LINK = "API -> Cassandra"
FAULT_S = 20.0  # how long each toxic stays on while the client asks
BLACK_HOLE_S = 60.0
RECOVERY_LIMIT_S = 120.0  # the driver's reconnection back-off and the API's cassandra_retry_s both fit well inside


@dataclass
class Served:
    """The private views, the settings of an API pointed at the proxy, and the exact answer."""

    settings: Settings
    url: str
    log: Path
    expected: int

    def ask(self, timeout_s: float = 90) -> tuple[str, float]:  # noqa: PLR0911 - one return per outcome
        """Ask for the window's count; return (outcome, seconds): exact, gap, wrong:<n>, 503, or what else came."""
        began = time.monotonic()
        query = {"start": H0.isoformat(), "end": (H0 + 2 * HOUR).isoformat()}
        try:
            resp = httpx.get(f"{self.url}/api/v1/count", params=query, timeout=timeout_s)
        except httpx.TimeoutException:
            return "client timeout", time.monotonic() - began
        except httpx.TransportError as exc:
            return f"transport error {type(exc).__name__}", time.monotonic() - began
        took = time.monotonic() - began
        if resp.status_code == 503:
            ok = bool(resp.json().get("detail")) and resp.headers.get("retry-after") is not None
            return ("503" if ok else "503 without message"), took
        if resp.status_code != 200:
            return f"{resp.status_code}", took
        body = resp.json()
        if body["events"] == self.expected and not body["provenance"]["gaps"]:
            return "exact", took
        if body["provenance"]["gaps"]:
            return "gap", took
        return f"wrong:{body['events']}", took


@pytest.fixture(scope="module")
def served(
    stack_up: Settings, spark: Any, proxies: Proxies, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    from batch_layer import job

    run = uuid.uuid4().hex[:8]
    topic, keyspace = f"test.net.{run}", f"test_net_{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 2, 1, {"retention.ms": "-1"})])
    settings = stack_up.model_copy(
        update={
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic, "partitions": 2}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
            "batch": stack_up.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
        }
    )
    migrations.migrate(settings)
    rng = random.Random(run)
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    span_ms = int(2 * HOUR.total_seconds() * 1000)
    for i in range(EVENTS):
        e = Event(id=f"n-{i}", ts=H0 + timedelta(milliseconds=rng.randrange(span_ms)), item=f"#i{i % 40}")
        producer.produce(topic, value=e.to_json(), timestamp=e.ts_ms)
    for part in range(2):  # events well after the window close its hours for the batch layer
        e = Event(id=f"closer-{part}", ts=H0 + 4 * HOUR, item="#closer")
        producer.produce(topic, value=e.to_json(), timestamp=e.ts_ms, partition=part)
    assert producer.flush(60) == 0
    job.run(settings, H0, H0 + 2 * HOUR, spark=spark)
    port = proxies.front(PROXY, f"{settings.cassandra.contact_points[0]}:{settings.cassandra.port}")
    via_proxy = settings.model_copy(update={"cassandra": settings.cassandra.model_copy(update={"port": port})})
    log = tmp_path_factory.mktemp("api") / "serve.log"
    try:
        with serve(via_proxy, log) as url:
            yield Served(via_proxy, url, log, EVENTS)
    finally:
        drop_keyspace(stack_up, keyspace)
        topics.delete_topics(stack_up.kafka, [topic])


CASES = five_faults(PROXY, "downstream", seconds=FAULT_S, black_hole_s=BLACK_HOLE_S)  # the API reads


@pytest.mark.parametrize(("fault", "inject", "duration_s"), CASES, ids=[c[0].split(" ")[0] for c in CASES])
def test_api_under_fault(
    served: Served, proxies: Proxies, fault: str, inject: Callable[[Toxiproxy], None], duration_s: float
) -> None:
    assert served.ask()[0] == "exact", "the API must answer exactly before the fault"
    log_from = len(served.log.read_text())
    inject(proxies.api)
    outcomes: Counter[str] = Counter()
    slowest = 0.0
    began = time.monotonic()
    while time.monotonic() - began < duration_s:
        outcome, took = served.ask()
        outcomes[outcome] += 1
        slowest = max(slowest, took)
        time.sleep(0.5)
    proxies.api.clear(PROXY)
    recovery = wait_until(lambda: served.ask(timeout_s=30)[0] == "exact", RECOVERY_LIMIT_S)
    after = [served.ask()[0] for _ in range(3)]
    allowed = {"exact", "gap", "503"}
    ok = set(outcomes) <= allowed and recovery is not None and after == ["exact"] * 3
    behaviour = ", ".join(f"{n}x {o}" for o, n in outcomes.most_common()) + f" (slowest answer {slowest:.1f} s)"
    log = served.log.read_text()[log_from:]
    if outcomes["503"]:
        behaviour += "; the 503s logged with the driver's reason" if "503 for" in log else "; 503s NOT logged"
    if "CRC mismatch on header" in log:
        behaviour += "; the driver dropped connections: CRC mismatch on header (protocol v5 framing)"
    record(
        LINK, fault, behaviour, recovery, f"{served.expected:,} exact x3" if after == ["exact"] * 3 else str(after), ok
    )
    assert set(outcomes) <= allowed, f"answers during the fault: {dict(outcomes)}"
    assert recovery is not None, f"no exact answer within {RECOVERY_LIMIT_S} s of healing"
    assert after == ["exact"] * 3


def test_api_under_slicer_with_protocol_v4(served: Served, proxies: Proxies, tmp_path: Path) -> None:
    """The slicer with the CQL native protocol v4 (no v5 checksummed segments): every answer exact, no 503."""
    v4 = served.settings.model_copy(
        update={"cassandra": served.settings.cassandra.model_copy(update={"protocol_version": 4})}
    )
    with serve(v4, tmp_path / "serve-v4.log") as url:
        other = Served(v4, url, tmp_path / "serve-v4.log", served.expected)
        assert other.ask()[0] == "exact"
        (slicer,) = [inject for name, inject, _ in CASES if name.startswith("slicer")]
        slicer(proxies.api)
        outcomes: Counter[str] = Counter()
        began = time.monotonic()
        while time.monotonic() - began < FAULT_S:
            outcomes[other.ask()[0]] += 1
            time.sleep(0.5)
        proxies.api.clear(PROXY)
        recovery = wait_until(lambda: other.ask(timeout_s=30)[0] == "exact", RECOVERY_LIMIT_S)
        after = other.ask()[0]
    crc = "CRC mismatch on header" in other.log.read_text()
    behaviour = ", ".join(f"{n}x {o}" for o, n in outcomes.most_common()) + ("; CRC mismatch" if crc else "")
    ok = set(outcomes) == {"exact"} and after == "exact"
    record(
        f"{LINK} (protocol v4)", "slicer 64 ± 32 B every 200 µs", behaviour, recovery, f"{served.expected:,} exact", ok
    )
    assert set(outcomes) == {"exact"}, dict(outcomes)
    assert after == "exact"
