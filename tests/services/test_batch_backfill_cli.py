"""``trends batch backfill`` against a real Airflow running the real ``trends_backfill`` DAG (real Kafka, Spark and
Cassandra): 30 days of generated history backfilled exactly, then the same range with Cassandra stopped mid-run.

The module runs its own Cassandra node (free ports, a data dir under tmp) and its own Airflow
(:mod:`tests.airflow_stack`, shared with the network suite's Airflow links), so stopping Cassandra never touches
the shared stack; Kafka is the session's (a topic of the module's own). Airflow's retry delay is
capped at a few seconds (``[core] max_task_retry_delay``) so the DAG's four tries of a failing chunk take about a
minute instead of the production back-off's seven; the number of tries is the DAG's own. Its REST tokens live
30 s (``[api_auth] jwt_expiration_time``; +10 s leeway), so a `--wait` that logs in must renew its token mid-run.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from batch_layer.publish import BatchStore
from infra.airflow.client import AirflowClient
from infra.cassandra import session
from infra.settings import Settings
from stack import control
from tests.airflow_stack import DAY, TRENDS, Backfill, private_backfill

pytestmark = [pytest.mark.spark, pytest.mark.backfill]  # 3-7 min: make test-backfill, kept out of make test

START = datetime(2025, 9, 1, tzinfo=UTC)
DAYS = 30
END = START + DAYS * DAY


@pytest.fixture(scope="module")
def backfill_stack(stack_up: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfill]:
    with private_backfill(
        stack_up,
        tmp_path_factory.mktemp("backfill"),
        start=START,
        days=DAYS,
        # 15-day chunks: 2 mapped spark-submits side by side (a third would double the test's time).
        batch={"lateness_s": 300, "grace_s": 300, "chunk_hours": 15 * 24, "backfill_parallelism": 2},
        airflow_config={"AIRFLOW__CORE__MAX_TASK_RETRY_DELAY": "3", "AIRFLOW__API_AUTH__JWT_EXPIRATION_TIME": "30"},
    ) as bf:
        yield bf


def test_backfill_wait_over_30_days_is_exact(backfill_stack: Backfill) -> None:
    bf = backfill_stack
    t0 = time.monotonic()
    proc = bf.cli("--start", START.isoformat(), "--end", END.isoformat(), "--wait", "--poll", "2", "--timeout", "900")
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    print(f"trends batch backfill --wait over {DAYS} days: exit {proc.returncode} in {took:.1f} s\n{out[-3000:]}")
    assert proc.returncode == 0, out[-4000:]
    assert "chunks 2/2 done" in proc.stderr
    assert f"events {bf.produced:,}/{bf.produced:,}" in proc.stderr  # the index counted every record produced
    assert "ETA" in proc.stderr
    assert "logging in again" in proc.stderr  # the 30 s token expired during the wait and was renewed
    summary = proc.stdout.strip().splitlines()[-1]
    assert "succeeded" in summary and f"2 chunks, {DAYS * 24} hours, {bf.produced:,} events" in summary, summary
    assert "batch watermark" in summary

    counts = bf.day_counts()
    assert counts == {d: bf.truth.day_count(d) for d in counts}
    assert sum(counts.values()) > 5000 and sum(1 for n in counts.values() if n == 0) >= 5  # gap days included
    with session(bf.settings) as sess:
        store = BatchStore(bf.settings, sess)
        assert all(len(store.pointers.runs(d)) == 24 for d in counts)  # every hour has a run, empty ones too
        low, mark, _ = store.pointers.watermark()
        assert low == START and mark is not None and mark >= END

    # Again with --only-missing: every hour has a current run, so nothing is computed.
    proc = bf.cli("--start", START.isoformat(), "--end", END.isoformat(), "--only-missing", "--wait", "--poll", "2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "0 chunks, 0 hours" in proc.stdout and "nothing to compute" in proc.stdout, proc.stdout


def test_backfill_fails_and_names_the_task_when_cassandra_stops(backfill_stack: Backfill) -> None:
    """A token from settings (no login possible: the password is wrong), Cassandra stopped while chunks compute."""
    bf = backfill_stack
    af = AirflowClient(bf.settings)
    login = {
        "username": bf.settings.airflow.admin_user,
        "password": bf.settings.airflow.admin_password.get_secret_value(),
    }
    # A token that outlives the test: SimpleAuthManager's token endpoint for CLIs (jwt_cli_expiration_time, 1 h).
    token = af.send("POST", "/auth/token/cli", login, token="")["access_token"]
    env = {"TRENDS_AIRFLOW__API_TOKEN": token, "TRENDS_AIRFLOW__API_PASSWORD": "not-the-password"}
    t0 = time.monotonic()
    end = START + 10 * DAY  # one chunk: its four tries are the wait
    proc = subprocess.Popen(
        [TRENDS, "batch", "backfill", "--start", START.isoformat(), "--end", end.isoformat(), "--wait", "--poll", "2"],
        env=bf.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any(re.search(r"chunks 0/1 done, 1 running", line) for line in lines):
            assert proc.poll() is None, f"exited early: {proc.returncode}\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"no chunk started computing:\n{''.join(lines)}"
            time.sleep(0.5)
        stopped_at = time.monotonic() - t0
        control.down(bf.settings, ["cassandra"])
        proc.wait(timeout=900)
        stdout = proc.stdout.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    err = "".join(lines)
    print(f"Cassandra stopped {stopped_at:.0f} s after the trigger; exit {proc.returncode} after "
          f"{time.monotonic() - t0:.0f} s\n{stdout}\n{err[-4000:]}")  # fmt: skip
    assert proc.returncode == 1, err[-4000:]
    assert "trends_backfill run" in err and "failed" in err
    failed_line = next(line for line in err.splitlines() if line.startswith("task recompute["))
    assert "failed after 4 tries" in failed_line and "(hours 2025-" in failed_line, failed_line
    assert "not run (upstream failed): advance_watermark" in err
    assert "try 1 failed, Airflow retries it" in err  # the retries were shown as they happened
    assert any(word in err for word in ("NoHostAvailable", "Unable to connect", "Connection refused")), err[-4000:]

    # What the CLI named is what Airflow recorded.
    run_id = next(
        line.split()[3].rstrip(":") for line in stdout.splitlines() if line.startswith("triggered trends_backfill run")
    )
    failed = {f"recompute[{t['map_index']}]" for t in af.task_instances("trends_backfill", run_id)
              if t["state"] == "failed"}  # fmt: skip
    named = {line.split()[1] for line in err.splitlines() if line.startswith("task recompute[")}
    assert failed and named == failed


def test_refused_token_and_login_are_named(backfill_stack: Backfill) -> None:
    bf = backfill_stack
    proc = bf.cli("--run-id", "no-such-run", TRENDS_AIRFLOW__API_TOKEN="not-a-jwt", timeout=60)  # noqa: S106
    assert proc.returncode == 1 and "refused the token of TRENDS_AIRFLOW__API_TOKEN (403" in proc.stderr, proc.stderr
    token, issued = bf.early_token
    time.sleep(max(0.0, issued + 42 - time.monotonic()))  # 30 s + 10 s leeway
    proc = bf.cli("--run-id", "no-such-run", TRENDS_AIRFLOW__API_TOKEN=token, timeout=60)
    assert proc.returncode == 1 and "TRENDS_AIRFLOW__API_TOKEN (401: expired" in proc.stderr, proc.stderr
    proc = bf.cli("--run-id", "no-such-run", TRENDS_AIRFLOW__API_PASSWORD="wrong-password", timeout=60)  # noqa: S106
    assert proc.returncode == 1 and "401" in proc.stderr and "TRENDS_AIRFLOW__API_PASSWORD" in proc.stderr, proc.stderr
    proc = bf.cli("--run-id", "no-such-run", timeout=60)  # the default login works; the run does not exist
    assert proc.returncode == 1 and "404" in proc.stderr and "no-such-run" in proc.stderr, proc.stderr
