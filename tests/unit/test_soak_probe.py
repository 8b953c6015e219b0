"""The soak's disk gauges: what they count is what is on disk, and the speed job's state is the speed job's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

from speed_layer.metrics import BatchMetrics
from tests.soak.probe import Gauges, batch_lines, dir_bytes, resident_mib


def test_a_hard_linked_file_counts_once(tmp_path: Path) -> None:
    live = tmp_path / "workingDir"
    snapshot = tmp_path / "checkpoint-1"  # RocksDB's snapshot checkpoint: hard links to the live SST files
    live.mkdir()
    snapshot.mkdir()
    (live / "000001.sst").write_bytes(b"x" * 1000)
    os.link(live / "000001.sst", snapshot / "000001.sst")
    (snapshot / "MANIFEST").write_bytes(b"m" * 10)
    assert dir_bytes(tmp_path) == 1010


def test_the_speed_jobs_state_is_the_newest_temp_folder_holding_state_stores(tmp_path: Path) -> None:
    killed = tmp_path / "spark-killed" / "StateStoreId(opId=1,partId=0,name=default)-a" / "workingDir"
    running = tmp_path / "spark-running" / "StateStoreId(opId=1,partId=0,name=default)-b" / "workingDir"
    batch = tmp_path / "spark-batch" / "blocks"  # the hourly batch job shares spark.local.dir: no state stores
    for folder, size in ((killed, 100), (running, 300), (batch, 5000)):
        folder.mkdir(parents=True)
        (folder / "f").write_bytes(b"x" * size)
    now = time.time()
    for age, name in ((30, "spark-killed"), (20, "spark-running"), (10, "spark-batch")):
        os.utime(tmp_path / name, (now - age, now - age))
    live, local = Gauges.state_bytes(SimpleNamespace(spark_local_dir=tmp_path))  # type: ignore[arg-type]
    assert (live, local) == (300, 5400)


def test_a_killed_process_not_reaped_yet_is_no_sample() -> None:
    """A zombie reads 0 MiB; as a sample it would drag the fitted growth of its series down (the fifth soak)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = psutil.Process(child.pid)
        mib = resident_mib(proc)
        assert mib is not None and mib > 0
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_mib(proc) is None
    finally:
        child.kill()
        child.wait()
    assert resident_mib(proc) is None  # reaped: gone


def test_the_batch_lines_are_read_as_the_speed_job_logs_them() -> None:
    """The capacity run's eviction column comes from the job's own log line: a change of its format fails here."""
    dedupe = BatchMetrics(7, 12_000, 6_000.0, 9_000.0, 1_300, None, 0, 0, None, 0, state_ms={"dedupe": (170, 1_213, 9)})
    none = BatchMetrics(8, 0, 0.0, 0.0, 40, None, 0, 0, None, 0)  # no stateful operator reported
    log = f"06:26:48 INFO    speed_layer.job: {dedupe.log_line()}\nother line\n{none.log_line()}\n".encode()
    assert batch_lines(log) == [(12_000, 1_300, 1_213), (0, 40, None)]
