"""Batch run -> Cassandra and batch run -> Kafka through Toxiproxy: ``trends batch run`` while its link is degraded.

Each case writes a private pipeline's two hours of events, closes them, and starts ``trends batch run`` over them
as an operator (or the DAG's task) would, with only that link's ``TRENDS_*`` settings pointed at a proxy. Once the
run has indexed the topic (its log says ``indexed``), the fault is put on the link for a while: then the run
plans, reads the offsets with Spark and loads the views through it. The run either ends 0 or ends non-zero with a
log line naming the link; after the link heals, a failed run is run again (recompute is idempotent), and the
served answer must then be exact — every event once, distinct users within the HLL bounds, served by the batch
layer alone. The recovery time is how long after the healing the exact answer was written.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO

import pytest

from infra.cassandra import session
from infra.settings import Settings
from infra.settings_env import to_env
from stack.toxiproxy import Toxiproxy
from tests.network.proxies import KAFKA_PROXY, PrivateKafka, Proxies, fault_ids, five_faults, through_proxy
from tests.network.table import record
from tests.pipeline import Pipeline, private_pipeline

pytestmark = [pytest.mark.network, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(1800)]

N = 8_000
CASSANDRA_PROXY = "batch-cassandra"
MARKER = "indexed "  # the run's index line: what follows is planning, Spark's read and the load
RUN_TIMEOUT_S = 900.0


@pytest.fixture
def cassandra_link(stack_up: Settings, proxies: Proxies, tmp_path: Path) -> Iterator[tuple[Pipeline, Settings]]:
    """A private pipeline on the stack, and the settings of a batch run whose Cassandra is behind a proxy."""
    with private_pipeline(stack_up, tmp_path) as p:
        c = p.settings.cassandra
        port = proxies.front(CASSANDRA_PROXY, f"{c.contact_points[0]}:{c.port}")
        yield p, p.settings.model_copy(update={"cassandra": c.model_copy(update={"port": port})})


@pytest.fixture
def kafka_link(kafka_pipeline: Pipeline, private_kafka: PrivateKafka) -> tuple[Pipeline, Settings]:
    """A private pipeline on a private broker (produced to directly); the batch run reads through the proxy."""
    p = kafka_pipeline
    return p, through_proxy(p.settings, private_kafka)


def _run(settings: Settings, window: tuple[datetime, datetime], log: IO[str]) -> subprocess.Popen[str]:
    """Start ``trends batch run`` over the window with ``settings`` as its environment, its output into ``log``."""
    trends = str(Path(sys.executable).parent / "trends")
    cmd = [trends, "batch", "run", "--start", window[0].isoformat(), "--end", window[1].isoformat()]
    return subprocess.Popen(
        cmd, env={**os.environ, **to_env(settings)}, stdout=log, stderr=subprocess.STDOUT, text=True
    )


def _exact(p: Pipeline) -> tuple[bool, str]:
    """Return whether the served answer over the window is exact and served by the batch layer alone, and a note."""
    from serving import queries, window
    from serving.reader import ViewReader

    with session(p.settings) as sess:
        s = queries.summary(window.load(ViewReader(p.settings, sess), *p.window, "*"))
    users = len({e.user for e in p.events})
    batch_only = all(x["layer"] == "batch" for x in s.provenance.spans) and not s.provenance.gaps
    ok = s.events == len(p.events) and s.users_lower <= users <= s.users_upper and batch_only
    return ok, f"{s.events:,} of {len(p.events):,}" + ("" if batch_only else f"; not batch only: {s.provenance}")


def _names(link: str, text: str) -> bool:
    """Return whether a line of the run's output names the link with an error."""
    return any(
        link in line.lower() and any(w in line.lower() for w in ("error", "fail", "timeout", "timed out", "unavail"))
        for line in text.splitlines()
    )


def _case(
    p: Pipeline,
    run_settings: Settings,
    api: Toxiproxy,
    proxy: str,
    name: str,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
    tmp_path: Path,
) -> None:
    p.produce(p.make_events(N, "b", random.Random(duration_s)))
    p.close_window()
    log_path = tmp_path / "batch-run.log"
    healed: list[float] = []

    def fault_window() -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while MARKER not in log_path.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.2)
        inject(api)
        time.sleep(duration_s)
        api.clear(proxy)
        healed.append(time.monotonic())

    with log_path.open("w") as log:
        proc = _run(run_settings, p.window, log)
        injector = threading.Thread(target=fault_window, daemon=True)
        injector.start()
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        injector.join(timeout=RUN_TIMEOUT_S)
    api.clear(proxy)  # healed, whatever happened
    text = log_path.read_text(errors="replace")
    faulted = bool(healed)
    if rc == 0:
        behaviour = "rode it out within its settings, exit 0"
        rerun_rc = None
    else:
        last = " / ".join(line.strip() for line in text.strip().splitlines()[-2:])[:160]
        behaviour = f"exit {rc}" + ("; log names " + name if _names(name.lower(), text) else "; NO line naming it")
        behaviour += f" ({last}); rerun after healing"
        with (tmp_path / "batch-rerun.log").open("w") as log:
            rerun_rc = _run(p.settings, p.window, log).wait(timeout=RUN_TIMEOUT_S)
        behaviour += f" exit {rerun_rc}"
    recovery = time.monotonic() - healed[0] if healed else None
    exact, counts = _exact(p)
    ok = faulted and exact and (rc == 0 or (_names(name.lower(), text) and rerun_rc == 0))
    record(f"batch run -> {name}", fault, behaviour, recovery, f"batch {counts}", ok)
    assert faulted, f"the run never logged {MARKER!r}, so the fault was not put on the link:\n{text[-3000:]}"
    assert rc == 0 or _names(name.lower(), text), f"the run failed without naming {name}:\n{text[-3000:]}"
    assert rc == 0 or rerun_rc == 0, f"the run after healing failed too:\n{text[-3000:]}"
    assert exact, f"the answer is not exact after the run: {counts}"


CASSANDRA_CASES = five_faults(CASSANDRA_PROXY, "upstream")
KAFKA_CASES = five_faults(KAFKA_PROXY, "downstream")


@pytest.mark.parametrize(("fault", "inject", "duration_s"), CASSANDRA_CASES, ids=fault_ids(CASSANDRA_CASES))
def test_batch_run_with_cassandra_under_fault(
    cassandra_link: tuple[Pipeline, Settings],
    proxies: Proxies,
    tmp_path: Path,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    p, run_settings = cassandra_link
    _case(p, run_settings, proxies.api, CASSANDRA_PROXY, "Cassandra", fault, inject, duration_s, tmp_path)


@pytest.mark.parametrize(("fault", "inject", "duration_s"), KAFKA_CASES, ids=fault_ids(KAFKA_CASES))
def test_batch_run_with_kafka_under_fault(
    kafka_link: tuple[Pipeline, Settings],
    proxies: Proxies,
    tmp_path: Path,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    p, run_settings = kafka_link
    _case(p, run_settings, proxies.api, KAFKA_PROXY, "Kafka", fault, inject, duration_s, tmp_path)
