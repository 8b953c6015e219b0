"""The two Airflow links through Toxiproxy: ``trends batch backfill`` -> Airflow's REST API, Airflow task -> Cassandra.

The module runs a private Cassandra + Airflow with the real ``trends_backfill`` DAG (:mod:`tests.airflow_stack`) and
a few days of generated history. Two proxies stand in front of them: ``airflow-api`` in front of the API server (only
the CLI's ``TRENDS_AIRFLOW__API_URL`` points at it) and ``tasks-cassandra`` in front of the Cassandra node (only the
``TRENDS_CASSANDRA__PORT`` Airflow gives its tasks points at it; the migration, the CLI's and the test's reads go
straight to the node). With no toxic both are transparent.

Each case backfills its own day or two of the history (one chunk, one spark-submit), so the answer checked after it
is one no earlier case computed; the cases' ranges are contiguous, so the batch watermark covers them all and the
served answer comes from the batch layer alone. While the chunk computes, one of the five faults is put on the link
for a while, then healed:

* CLI -> Airflow: ``trends batch backfill --wait`` follows the run through the proxy. It must ride the fault out
  (retrying unanswered polls) or exit non-zero with a message naming Airflow; then it follows the run again with
  ``--run-id``, as an operator would.
* Airflow task -> Cassandra: the chunk's spark-submit (and the DAG's other tasks) reach Cassandra through the proxy.
  The task must succeed, or fail a try whose log names Cassandra (Airflow retries it); a run that failed is cleared
  (its failed tasks, through the REST API, as an operator would in the UI) and followed again.

After healing, the run must have succeeded and the range's answer must be exact against the producer's truth: the
batch view's events per day, and the served count with distinct users within the HLL bounds, batch layer only —
nothing lost and nothing counted twice. The recovery time is how long after the healing the CLI saw the run
succeed.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import pytest

from infra.airflow.client import AirflowClient
from infra.cassandra import session
from infra.dag_contract import BACKFILL_DAG, RECOMPUTE_TASK
from infra.settings import Settings
from stack.toxiproxy import Toxiproxy
from tests.airflow_stack import DAY, TRENDS, Backfill, private_backfill
from tests.helpers import GAP_EVERY, free_port
from tests.network.proxies import Proxies, five_faults, wait_until
from tests.network.table import record

pytestmark = [pytest.mark.network, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(2400)]

API_PROXY = "airflow-api"
TASKS_CASSANDRA_PROXY = "tasks-cassandra"
START = datetime.fromisoformat("2025-10-01T00:00:00+00:00")
DAYS = 13  # ten cases of a day with events each (every 5th day of the history has none: it joins a neighbour)
RUN_TIMEOUT_S = 600.0
CASSANDRA_WORDS = ("cassandra", "nohostavailable", "operationtimedout", "unable to connect", "connection refused")

API_FAULTS = five_faults(API_PROXY, "both")  # the CLI's requests and Airflow's answers alike
TASK_FAULTS = five_faults(TASKS_CASSANDRA_PROXY, "both")
IDS = [f[0].split(" ")[0] for f in API_FAULTS]


@dataclass
class AirflowNet:
    """The private stack, the CLI's settings through the API proxy, and the cases' ranges still to hand out."""

    bf: Backfill
    via_proxy: dict[str, str]  # the CLI's environment: only its Airflow URL changes
    ranges: list[tuple[datetime, datetime]] = field(default_factory=list)

    def next_range(self) -> tuple[datetime, datetime]:
        assert self.ranges, "more cases than ranges of the history"
        return self.ranges.pop(0)


def _ranges(bf: Backfill) -> list[tuple[datetime, datetime]]:
    """Split the history into contiguous ranges that each end on a day with events (gap days join the next one)."""
    out: list[tuple[datetime, datetime]] = []
    begin = bf.start
    for i in range(bf.days):
        day = bf.start + i * DAY
        if bf.truth.day_count(day.date()) > 0:
            out.append((begin, day + DAY))
            begin = day + DAY
    if begin < bf.start + bf.days * DAY and out:  # trailing gap days join the last range
        out[-1] = (out[-1][0], bf.start + bf.days * DAY)
    return out


@pytest.fixture(scope="module")
def airflow_net(stack_up: Settings, proxies: Proxies, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowNet]:
    node = free_port()
    tasks_port = proxies.front(TASKS_CASSANDRA_PROXY, f"127.0.0.1:{node}")
    with private_backfill(
        stack_up,
        tmp_path_factory.mktemp("airflow-net"),
        start=START,
        days=DAYS,
        rate=0.01,
        # one chunk per case (a range is at most two days), one spark-submit at a time (2 cores shared)
        batch={"lateness_s": 300, "grace_s": 300, "chunk_hours": 72, "backfill_parallelism": 1},
        # Airflow's retries 3 s apart instead of the production back-off: the DAG's four tries fit in a case
        airflow_config={"AIRFLOW__CORE__MAX_TASK_RETRY_DELAY": "3"},
        cassandra_port=node,
        tasks_cassandra_port=tasks_port,
    ) as bf:
        api_port = proxies.front(API_PROXY, f"127.0.0.1:{bf.settings.airflow.api_port}")
        net = AirflowNet(bf, {"TRENDS_AIRFLOW__API_URL": f"http://127.0.0.1:{api_port}"}, _ranges(bf))
        assert len(net.ranges) >= 2 * len(API_FAULTS), (net.ranges, GAP_EVERY)
        yield net


@dataclass
class Followed:
    """One ``trends batch backfill --wait`` process, its output read line by line as it comes."""

    proc: subprocess.Popen[str]
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, bf: Backfill, args: list[str], env: dict[str, str]) -> Followed:
        proc = subprocess.Popen(
            [TRENDS, "batch", "backfill", *args, "--wait", "--poll", "2"],
            env=bf.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        f = cls(proc)
        for stream, lines in ((proc.stdout, f.out), (proc.stderr, f.err)):
            t = threading.Thread(target=lambda s=stream, ls=lines: ls.extend(iter(s.readline, "")), daemon=True)
            t.start()
            f.readers.append(t)
        return f

    def wait_running(self, timeout_s: float = 300) -> bool:
        """Wait until the progress says the chunk computes (False: the process ended or the time ran out)."""
        return (
            wait_until(
                lambda: any("chunks 0/1 done, 1 running" in line for line in self.err) or self.proc.poll() is not None,
                timeout_s,
                0.3,
            )
            is not None
            and self.proc.poll() is None
        )

    def wait(self) -> int:
        try:
            rc = self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        for t in self.readers:
            t.join(10)
        return rc

    @property
    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def run_id(self) -> str | None:
        found = re.search(r"triggered trends_backfill run (\S+):", "".join(self.out))
        return found.group(1) if found else None


def _fault_window(api: Toxiproxy, proxy: str, inject: Callable[[Toxiproxy], None], duration_s: float) -> float:
    """Put the fault on the proxy for ``duration_s``, heal it; return when (monotonic) it was healed."""
    inject(api)
    time.sleep(duration_s)
    api.clear(proxy)
    return time.monotonic()


def _exact(bf: Backfill, window: tuple[datetime, datetime]) -> tuple[bool, str]:
    """Return whether the range's answer is exact (per day in the batch view, and served by the batch layer alone)."""
    from serving import queries
    from serving import window as serving_window
    from serving.reader import ViewReader

    first, ndays = window[0].date(), (window[1] - window[0]) // DAY
    days = [first + timedelta(days=i) for i in range(ndays)]
    truth = {d: bf.truth.day_count(d) for d in days}
    counts = bf.day_counts(first, ndays)
    users = set().union(*(bf.truth.users[d] for d in days))
    with session(bf.settings) as sess:
        s = queries.summary(serving_window.load(ViewReader(bf.settings, sess), *window, "*"))
    batch_only = all(x["layer"] == "batch" for x in s.provenance.spans) and not s.provenance.gaps
    total = sum(truth.values())
    ok = counts == truth and s.events == total and s.users_lower <= len(users) <= s.users_upper and batch_only
    note = f"{s.events:,} of {total:,} served, per day {_days(counts)}" + (
        "" if counts == truth else f" (truth {_days(truth)})"
    )
    return ok, note + ("" if batch_only else f"; not batch only: {s.provenance}")


def _days(counts: dict[date, int]) -> str:
    return "/".join(f"{n:,}" for n in counts.values())


def _range_args(window: tuple[datetime, datetime]) -> list[str]:
    return ["--start", window[0].isoformat(), "--end", window[1].isoformat()]


@pytest.mark.parametrize(("fault", "inject", "duration_s"), API_FAULTS, ids=IDS)
def test_backfill_cli_with_airflow_under_fault(
    airflow_net: AirflowNet,
    proxies: Proxies,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    net, bf = airflow_net, airflow_net.bf
    window = net.next_range()
    cli = Followed.start(bf, _range_args(window), net.via_proxy)
    running = cli.wait_running()
    healed = _fault_window(proxies.api, API_PROXY, inject, duration_s) if running else None
    ended_in_fault = cli.proc.poll() is not None
    rc = cli.wait()
    ended = time.monotonic()
    proxies.api.clear(API_PROXY)
    unanswered = sum(1 for line in cli.err if "Airflow did not answer" in line)
    run_id = cli.run_id()
    rerun_rc = None
    if rc == 0:
        behaviour = f"rode it out: {unanswered} polls unanswered and retried, exit 0"
        behaviour += " (saw the run succeed while the fault was on)" if ended_in_fault else ""
    else:
        last = " / ".join(line.strip() for line in cli.err[-2:])[:200]
        named = "airflow" in "".join(cli.err[-3:]).lower()
        behaviour = f"exit {rc} after {unanswered} polls retried" + ("; names Airflow" if named else "; NOT naming it")
        behaviour += f" ({last}); followed again with --run-id"
        if run_id is not None:
            again = Followed.start(bf, ["--run-id", run_id], net.via_proxy)
            rerun_rc = again.wait()
            ended = time.monotonic()
            behaviour += f": exit {rerun_rc}"
    exact, counts = _exact(bf, window)
    recovery = ended - healed if healed is not None else None
    ok = running and exact and (rc == 0 or ("airflow" in "".join(cli.err[-3:]).lower() and rerun_rc == 0))
    record("trends batch backfill -> Airflow API", fault, behaviour, recovery, counts, ok)
    assert running, f"the chunk was never seen computing, so no fault was put on the link:\n{cli.text[-3000:]}"
    assert run_id is not None, cli.text[-3000:]
    assert rc == 0 or "airflow" in "".join(cli.err[-3:]).lower(), f"exit {rc} without naming Airflow:\n{cli.text}"
    assert rc == 0 or rerun_rc == 0, f"following the run again failed:\n{cli.text[-3000:]}"
    assert exact, f"the answer is not exact after the run: {counts}"


def _clear_failed(client: AirflowClient, run_id: str) -> None:
    """Clear the run's failed tasks (and the ones they held back), as an operator does in the UI."""
    body = {"dag_run_id": run_id, "dry_run": False, "only_failed": True, "include_downstream": True}
    client.api("POST", f"/api/v2/dags/{BACKFILL_DAG}/clearTaskInstances", body)


@pytest.mark.parametrize(("fault", "inject", "duration_s"), TASK_FAULTS, ids=IDS)
def test_airflow_task_with_cassandra_under_fault(
    airflow_net: AirflowNet,
    proxies: Proxies,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    net, bf = airflow_net, airflow_net.bf
    window = net.next_range()
    cli = Followed.start(bf, _range_args(window), {})  # the CLI straight to Airflow: only the tasks' link is faulty
    running = cli.wait_running()
    healed = _fault_window(proxies.api, TASKS_CASSANDRA_PROXY, inject, duration_s) if running else None
    rc = cli.wait()
    ended = time.monotonic()
    proxies.api.clear(TASKS_CASSANDRA_PROXY)
    run_id = cli.run_id()
    client = AirflowClient(bf.settings)
    retried = [line for line in cli.err if re.search(r"try \d+ failed, Airflow retries it", line)]
    err = "".join(cli.err).lower()
    names_cassandra = any(w in err for w in CASSANDRA_WORDS)
    cleared_rc = None
    if rc == 0:
        behaviour = f"task succeeded after {len(retried)} failed tr{'y' if len(retried) == 1 else 'ies'}"
    else:
        behaviour = f"run failed (CLI exit {rc}) after {len(retried)} retried tries"
    if retried or rc != 0:
        named = next((x.strip() for x in cli.err if any(w in x.lower() for w in CASSANDRA_WORDS)), "")
        behaviour += f"; the tries' logs name Cassandra ({named[:120]})" if named else "; NO line naming Cassandra"
    if rc != 0 and run_id is not None:
        _clear_failed(client, run_id)
        again = Followed.start(bf, ["--run-id", run_id], {})
        cleared_rc = again.wait()
        ended = time.monotonic()
        behaviour += f"; cleared the failed tasks, run ends {'success' if cleared_rc == 0 else 'failed'}"
    if run_id is not None:
        tries = client.tries(BACKFILL_DAG, run_id, RECOMPUTE_TASK, map_index=0)
        behaviour += f" (recompute[0]: {len(tries)} tr{'y' if len(tries) == 1 else 'ies'})"
    exact, counts = _exact(bf, window)
    recovery = ended - healed if healed is not None else None
    loud = not (retried or rc != 0) or names_cassandra
    ok = running and exact and loud and (rc == 0 or cleared_rc == 0)
    record("Airflow task (spark-submit) -> Cassandra", fault, behaviour, recovery, counts, ok)
    assert running, f"the chunk was never seen computing, so no fault was put on the link:\n{cli.text[-3000:]}"
    assert run_id is not None, cli.text[-3000:]
    assert loud, f"a try failed without a log line naming Cassandra:\n{cli.text[-4000:]}"
    assert rc == 0 or cleared_rc == 0, f"the run did not complete after clearing:\n{cli.text[-3000:]}"
    assert exact, f"the answer is not exact after the run: {counts}"
