"""The supervisor restarts a command that exits non-zero, with back-off, and says so; it stops on SIGTERM.

Real processes (`python -m stack.supervisor` around a small script), bounded in count and time; no services.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra.errors import EXIT_CHECKPOINT_LOST, EXIT_CONFIG
from infra.settings import RESTARTS_ENV
from stack.supervisor import SupervisorState, backoff_delay

# Fails (exit 3) on its first FAILS runs, then runs until SIGTERM and exits 0. Every run appends
# {"t": start time, "restarts": the count it was given} to runs.jsonl.
# Like the speed job, it stops cleanly on SIGTERM however often it arrives (the group's and the forwarded one).
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    log = Path(sys.argv[1])
    fails = int(sys.argv[2])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # before the log line that tests wait for
    with log.open("a") as fh:
        fh.write(json.dumps({"t": time.time(), "restarts": os.environ.get("RESTARTS_ENV")}) + "\\n")
    if len(log.read_text().splitlines()) <= fails:
        sys.exit(3)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not stop:
        time.sleep(0.05)
    sys.exit(0 if stop else 9)
    """
).replace("RESTARTS_ENV", RESTARTS_ENV)


def _wait(predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    msg = f"timed out after {timeout_s} s"
    raise AssertionError(msg)


def _runs(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _supervise(tmp_path: Path, fails: int, *extra: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    log, state = tmp_path / "runs.jsonl", tmp_path / "state.json"
    cmd = [sys.executable, "-m", "stack.supervisor", "--state", str(state), "--backoff", "0.3", "--backoff-max", "0.5"]
    cmd += [*extra, "--", sys.executable, str(script), str(log), str(fails)]
    proc = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE)
    return proc, log, state


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(n, 2, 60) for n in range(8)] == [0, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(10_000, 1, 30) == 30


def test_failed_runs_are_restarted_with_backoff_and_counted(tmp_path: Path) -> None:
    proc, log, state_file = _supervise(tmp_path, 3)
    try:
        _wait(lambda: len(_runs(log)) == 4, 20)  # three failures, then a run that stays up
        runs = _runs(log)
        assert [r["restarts"] for r in runs] == ["0", "1", "2", "3"]  # each run is told the count so far
        gaps = [float(b["t"]) - float(a["t"]) for a, b in itertools.pairwise(runs)]  # type: ignore[arg-type]
        assert gaps[0] >= 0.3 and gaps[1] >= 0.5 and gaps[2] >= 0.5, gaps  # 0.3, then 0.6 capped at 0.5
        _wait(lambda: (s := SupervisorState.read(state_file)) is not None and s.child_pid is not None, 5)
        state = SupervisorState.read(state_file)
        assert state is not None and state.restarts == 3 and state.last_exit_code == 3 and state.exits == [3, 3, 3]
        assert state.supervisor_pid == proc.pid and "restarts 3 (last exit 3 at" in state.describe()
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == 0  # the child exited 0 on SIGTERM: no restart, the supervisor ends
    time.sleep(0.5)
    assert len(_runs(log)) == 4
    state = SupervisorState.read(state_file)
    assert state is not None and state.stopped and state.child_pid is None and state.exits == [3, 3, 3, 0]


def test_a_child_killed_by_a_signal_is_restarted_and_its_exit_recorded(tmp_path: Path) -> None:
    """What the fault suite does to the speed job: SIGKILL the running command, never the supervisor."""
    proc, log, state_file = _supervise(tmp_path, 0)
    try:
        _wait(lambda: len(_runs(log)) == 1, 10)
        _wait(lambda: (s := SupervisorState.read(state_file)) is not None and s.child_pid is not None, 5)
        first = SupervisorState.read(state_file)
        assert first is not None and first.child_pid is not None
        os.kill(first.child_pid, signal.SIGKILL)
        _wait(lambda: len(_runs(log)) == 2, 10)
        _wait(lambda: (s := SupervisorState.read(state_file)) is not None and s.child_pid is not None, 5)
        state = SupervisorState.read(state_file)
        assert state is not None and state.child_pid not in (None, first.child_pid)
        assert state.restarts == 1 and state.exits == [-signal.SIGKILL] and state.supervisor_pid == proc.pid
        assert [r["restarts"] for r in _runs(log)] == ["0", "1"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == 0


def test_a_state_file_without_exits_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"supervisor_pid": 1, "child_pid": None, "restarts": 2, "started_at": "x"}))
    state = SupervisorState.read(path)
    assert state is not None and state.restarts == 2 and state.exits == []


def test_sigterm_to_the_supervisor_alone_reaches_the_child(tmp_path: Path) -> None:
    proc, log, state_file = _supervise(tmp_path, 0)
    try:
        _wait(lambda: (s := SupervisorState.read(state_file)) is not None and s.child_pid is not None, 10)
        state = SupervisorState.read(state_file)
        assert state is not None and state.child_pid is not None
        _wait(lambda: len(_runs(log)) == 1, 10)
        proc.send_signal(signal.SIGTERM)  # only the supervisor's pid, not the group
        assert proc.wait(10) == 0
        _wait(lambda: not Path(f"/proc/{state.child_pid}").exists(), 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_clean_exit_ends_the_supervisor_and_max_restarts_bounds_it(tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    ok = subprocess.run(
        [sys.executable, "-m", "stack.supervisor", "--state", str(done / "s.json"), "--", sys.executable, "-c", "0"],
        timeout=30,
        check=False,
    )
    assert ok.returncode == 0
    state = SupervisorState.read(done / "s.json")
    assert state is not None and state.restarts == 0 and state.last_exit_code == 0

    proc, log, state_file = _supervise(tmp_path, 100, "--max-restarts", "2")
    assert proc.wait(20) == 3
    assert len(_runs(log)) == 3
    state = SupervisorState.read(state_file)
    assert state is not None and state.restarts == 2 and state.stopped


def test_the_speed_metrics_export_the_restart_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from speed_layer.metrics import MetricsRegistry

    assert 'trends_speed_restarts_total{query="q"} 0' in MetricsRegistry("q").render()
    monkeypatch.setenv(RESTARTS_ENV, "4")
    assert 'trends_speed_restarts_total{query="q"} 4' in MetricsRegistry("q").render()


def test_the_child_does_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    proc, log, state_file = _supervise(tmp_path, 0)
    try:
        _wait(lambda: len(_runs(log)) == 1, 10)
        state = SupervisorState.read(state_file)
        assert state is not None and state.child_pid is not None
        proc.kill()  # SIGKILL to the supervisor alone: it cannot forward anything
        proc.wait(5)
        _wait(lambda: not Path(f"/proc/{state.child_pid}").exists(), 10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_command_that_refuses_its_configuration_is_not_restarted(tmp_path: Path) -> None:
    """Exit status 78 (a speed checkpoint of another view definition): restarting cannot help, so none follows."""
    state_file = tmp_path / "state.json"
    cmd = [sys.executable, "-m", "stack.supervisor", "--state", str(state_file), "--backoff", "0.1", "--"]
    proc = subprocess.run(
        [*cmd, sys.executable, "-c", f"import sys; sys.exit({EXIT_CONFIG})"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    state = SupervisorState.read(state_file)
    assert state is not None and state.restarts == 0 and state.exits == [EXIT_CONFIG] and state.stopped
    assert "refused its configuration" in proc.stderr


def test_the_state_names_what_a_known_exit_status_means() -> None:
    """A speed job whose checkpoint was lost exits 75 and is restarted; ``trends stack status`` says why it exited."""
    state = SupervisorState(1, 2, 1, "t0", last_exit_code=EXIT_CHECKPOINT_LOST, last_exit_at="t1", exits=[75])
    assert state.describe() == "restarts 1 (last exit 75: checkpoint lost at t1)"
    assert "(last exit 3 at t1)" in SupervisorState(1, 2, 1, "t0", last_exit_code=3, last_exit_at="t1").describe()
