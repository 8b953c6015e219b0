"""Speed job -> Cassandra and speed job -> Kafka through Toxiproxy, while events flow: the job rides the fault out
within its settings or fails loudly (an exit the supervisor records, a log line naming the link) and is restarted;
after the link heals the speed view catches up by itself with every event counted once, and the batch layer's
answer is exact.

The pipeline is a private one (:mod:`tests.pipeline`: topic, keyspace and checkpoint; the speed job under the
stack's supervisor), with only the speed service's settings pointed at the proxy: ``TRENDS_CASSANDRA__PORT``, or
``TRENDS_KAFKA__BOOTSTRAP_SERVERS`` of a private broker that the producer feeds directly.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.settings_env import to_env
from stack.toxiproxy import Toxiproxy
from tests.network.proxies import (
    KAFKA_PROXY,
    SPEED_CASSANDRA_PROXY,
    PrivateKafka,
    Proxies,
    fault_ids,
    five_faults,
    through_proxy,
    wait_until,
)
from tests.network.table import record
from tests.pipeline import Pipeline

pytestmark = [pytest.mark.network, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(1200)]

N = 10_000
RATE = 1_000  # events/s: the stream goes on through the fault
CATCH_UP_LIMIT_S = 420.0
CASSANDRA_CASES = five_faults(SPEED_CASSANDRA_PROXY, "upstream")  # the job writes
KAFKA_CASES = five_faults(KAFKA_PROXY, "downstream")  # the job reads


@pytest.mark.parametrize(("fault", "inject", "duration_s"), CASSANDRA_CASES, ids=fault_ids(CASSANDRA_CASES))
def test_speed_job_under_fault(
    speed_via_proxy: Pipeline,
    proxies: Proxies,
    spark: Any,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    _case(speed_via_proxy, proxies, spark, SPEED_CASSANDRA_PROXY, "Cassandra", fault, inject, duration_s)


@pytest.mark.parametrize(("fault", "inject", "duration_s"), KAFKA_CASES, ids=fault_ids(KAFKA_CASES))
def test_speed_job_reading_kafka_under_fault(
    kafka_pipeline: Pipeline,
    private_kafka: PrivateKafka,
    proxies: Proxies,
    spark: Any,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    p = kafka_pipeline
    p.speed_settings = through_proxy(p.speed_settings, private_kafka)
    _case(p, proxies, spark, KAFKA_PROXY, "Kafka", fault, inject, duration_s)


def _case(
    p: Pipeline,
    proxies: Proxies,
    spark: Any,
    proxy: str,
    name: str,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    link = f"speed job -> {name}"
    events = p.make_events(N, "s", random.Random(duration_s))
    speed = p.start_speed()
    p.produce(events[: N // 2], rate=RATE)
    inject(proxies.api)
    began = time.monotonic()
    p.produce(events[N // 2 :], rate=RATE)  # the stream goes on while the link is bad
    time.sleep(max(0.0, duration_s - (time.monotonic() - began)))
    proxies.api.clear(proxy)
    recovery = wait_until(lambda: p.served_count() >= N, CATCH_UP_LIMIT_S, poll_s=2)
    speed_count = p.served_count()
    exits, restarts = speed.exits, speed.restarts
    log = speed.service.stdout_file.read_text(errors="replace")
    names_link = any(
        name.lower() in line.lower() and ("error" in line.lower() or "fail" in line.lower())
        for line in log.splitlines()
    )
    behaviour = (
        "rode it out: no exit"
        if not exits
        else f"job exits {exits}, {restarts} supervisor restarts"
        + (f"; log names {name}" if names_link else f"; NO log line naming {name}")
    )
    # what an operator sees: the supervisor's restarts in `trends stack status`, the same count on /metrics
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "trends"), "stack", "status"],
        env={**os.environ, **to_env(p.speed_settings)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    speed_line = next((line for line in shown.splitlines() if line.startswith("speed ")), "")
    status_ok = f"restarts {restarts}" in speed_line and "running" in speed_line
    exported = speed.exported_restarts() if exits else 0
    behaviour += f"; status shows restarts {restarts}" if status_ok else f"; status line: {speed_line!r}"
    p.close_window()
    try:
        p.final(spark, f"{link}: {fault}", events)
        batch_ok = True
    except AssertionError:
        batch_ok = False
    ok = speed_count == N and batch_ok and (not exits or names_link) and status_ok and exported == restarts
    counts = f"speed {speed_count:,} of {N:,}; batch {'exact' if batch_ok else 'NOT exact'}"
    record(link, fault, behaviour, recovery, counts, ok)
    assert speed_count == N, f"the speed view counts {speed_count} of {N} (more: counted twice)"
    assert batch_ok, "the batch layer's answer is not exact"
    assert not exits or names_link, f"the job exited without a log line naming {name}"
    assert status_ok, f"trends stack status does not show the speed service running with its restarts:\n{shown}"
    assert exported == restarts, f"/metrics says {exported} restarts, the supervisor {restarts}"
    speed.running_job()  # the supervisor keeps the job coming back
