"""Speed job -> Cassandra through Toxiproxy, while events flow: the job rides the fault out within its settings or
fails loudly (an exit the supervisor records, a log line naming Cassandra) and is restarted; after the link heals
the speed view catches up by itself with every event counted once, and the batch layer's answer is exact.

The pipeline is the reliability suite's (private topic, keyspace and checkpoint; the speed job under the stack's
supervisor), with only the speed service's ``TRENDS_CASSANDRA__PORT`` pointed at the proxy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from stack.toxiproxy import Toxiproxy
from tests.network.proxies import SPEED_CASSANDRA_PROXY, Proxies, wait_until
from tests.network.table import record
from tests.pipeline import Pipeline

pytestmark = [pytest.mark.network, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(1200)]

LINK = "speed job -> Cassandra"
N = 10_000
RATE = 1_000  # events/s: the stream goes on through the fault
CATCH_UP_LIMIT_S = 420.0


def _latency(api: Toxiproxy) -> None:
    api.latency(SPEED_CASSANDRA_PROXY, 1000, 500)


def _black_hole(api: Toxiproxy) -> None:
    api.timeout(SPEED_CASSANDRA_PROXY, 0, stream="downstream")
    api.timeout(SPEED_CASSANDRA_PROXY, 0, stream="upstream")


def _reset_peer(api: Toxiproxy) -> None:
    api.reset_peer(SPEED_CASSANDRA_PROXY, 0)


CASES: list[tuple[str, Callable[[Toxiproxy], None], float]] = [
    ("latency 1 s ± 500 ms, 30 s", _latency, 30.0),
    ("black hole (timeout toxic, both ways) 60 s", _black_hole, 60.0),
    ("reset_peer (every connection reset), 30 s", _reset_peer, 30.0),
]


@pytest.mark.parametrize(("fault", "inject", "duration_s"), CASES, ids=[c[0].split(" ")[0] for c in CASES])
def test_speed_job_under_fault(
    speed_via_proxy: Pipeline,
    proxies: Proxies,
    spark: Any,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    p = speed_via_proxy
    events = p.make_events(N, "s", random.Random(duration_s))
    speed = p.start_speed()
    p.produce(events[: N // 2], rate=RATE)
    inject(proxies.api)
    began = time.monotonic()
    p.produce(events[N // 2 :], rate=RATE)  # the stream goes on while the link is bad
    time.sleep(max(0.0, duration_s - (time.monotonic() - began)))
    proxies.api.clear(SPEED_CASSANDRA_PROXY)
    recovery = wait_until(lambda: p.served_count() >= N, CATCH_UP_LIMIT_S, poll_s=2)
    speed_count = p.served_count()
    exits, restarts = speed.exits, speed.restarts
    log = speed.service.stdout_file.read_text(errors="replace")
    names_link = any(
        "cassandra" in line.lower() and ("error" in line.lower() or "fail" in line.lower()) for line in log.splitlines()
    )
    behaviour = (
        "rode it out: no exit"
        if not exits
        else f"job exits {exits}, {restarts} supervisor restarts"
        + ("; log names Cassandra" if names_link else "; NO log line naming Cassandra")
    )
    p.close_window()
    try:
        p.final(spark, f"{LINK}: {fault}", events)
        batch_ok = True
    except AssertionError:
        batch_ok = False
    ok = speed_count == N and batch_ok and (not exits or names_link)
    counts = f"speed {speed_count:,} of {N:,}; batch {'exact' if batch_ok else 'NOT exact'}"
    record(LINK, fault, behaviour, recovery, counts, ok)
    assert speed_count == N, f"the speed view counts {speed_count} of {N} (more: counted twice)"
    assert batch_ok, "the batch layer's answer is not exact"
    assert not exits or names_link, "the job exited without a log line naming Cassandra"
    speed.running_job()  # the supervisor keeps the job coming back
