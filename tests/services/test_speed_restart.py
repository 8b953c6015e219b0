"""The stack restarts the speed service when it exits non-zero, and status and metrics show the restarts.

Real services: the speed job (Spark) reads a fresh topic of the shared Kafka and writes to a keyspace of the shared
Cassandra that does not exist yet, so its first write fails and the job exits with an error — a write error as in
production. The supervisor restarts it with back-off; once the keyspace is created, the restarted job stays up.
Everything the service owns is under a temporary data_dir, on a free metrics port, so the shared stack is not
touched. Bounded in time.
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from ingestion.producer import EventProducer
from stack import control
from stack.cli import stack as stack_cli
from stack.process import process_alive, tail
from stack.services.pipeline import SpeedService
from tests.helpers import drop_keyspace, free_port
from views.event import Event

WAIT_S = 240


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def _value(text: str, name: str) -> int | None:
    match = re.search(rf"^{name}\{{[^}}]*\}} (\d+)", text, re.M)
    return int(match.group(1)) if match else None


def _until(what: str, check: Callable[[], bool], svc: SpeedService) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        assert svc.pid() is not None, f"the supervisor died while waiting for {what}:\n{tail([svc.stdout_file])}"
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}:\n{tail([svc.stdout_file], 60)}")


@pytest.mark.faults  # slow (make test-faults): kept out of make test to hold it under 25 minutes
def test_a_failing_speed_service_is_restarted_with_backoff_and_counted(
    stack_up: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    keyspace = f"test_restart_{uuid.uuid4().hex[:10]}"
    port = free_port()
    settings = stack_up.model_copy(
        update={
            "data_dir": tmp_path / "data",
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
            "speed": stack_up.speed.model_copy(update={"trigger_seconds": 1.0}),
            "metrics": stack_up.metrics.model_copy(update={"speed_port": port}),
            "stack": stack_up.stack.model_copy(
                update={
                    "speed_restart_backoff_s": 1.0,
                    "speed_restart_backoff_max_s": 2.0,
                    "speed_restart_healthy_s": 600.0,
                    "stop_timeout_s": 30.0,
                }
            ),
        }
    )
    now = datetime.now(UTC)
    with EventProducer(settings, pseudonymise=False) as producer:  # the keyspace (and its subject store) is missing
        for i in range(20):
            producer.produce(Event(id=f"r{i}", ts=now - timedelta(seconds=i), item=f"#r{i % 3}", user=f"u{i}"))
    assert producer.summary.ok

    svc = SpeedService(settings)
    supervisor = svc.start("")
    try:
        # 1. The keyspace is missing: each run fails at its first write and is restarted.
        _until("a restart", lambda: (s := svc.supervisor_state()) is not None and s.restarts >= 1, svc)
        state = svc.supervisor_state()
        assert state is not None and state.last_exit_code not in (None, 0)
        assert svc.pid() == supervisor  # the same supervisor: the service itself never went away
        status = control.status(settings, ["speed"])[0]
        assert re.search(r"restarts [1-9]\d* \(last exit [1-9]", status.detail), status.detail
        shown = CliRunner().invoke(stack_cli, ["status"], obj=settings)
        assert shown.exit_code == 0, shown.output
        assert re.search(r"^speed .* restarts [1-9]", shown.output, re.M), shown.output

        # 2. The cause is fixed: the next run stays up, serves metrics with the restart count and writes the view.
        migrations.migrate(settings)
        _until(
            "a healthy run with metrics",
            lambda: (
                (_value(m := _metrics(port), "trends_speed_batches_total") or 0) >= 1
                and (_value(m, "trends_speed_restarts_total") or 0) >= 1
            ),
            svc,
        )
        restarts = svc.supervisor_state()
        assert restarts is not None and restarts.child_pid is not None
        assert _value(_metrics(port), "trends_speed_restarts_total") == restarts.restarts
        with session(settings) as sess:
            _until(
                "speed view rows",
                lambda: sum(r.events for r in sess.execute(f"SELECT events FROM {keyspace}.speed_minutes")) == 20,
                svc,
            )
    finally:
        stopped = svc.stop()
        drop_keyspace(stack_up, keyspace)
    assert stopped and svc.pid() is None
    final = svc.supervisor_state()
    assert final is not None and final.stopped and final.child_pid is None
    assert not process_alive(supervisor) and not process_alive(int(restarts.child_pid))
