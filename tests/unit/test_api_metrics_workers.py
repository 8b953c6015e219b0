"""A worker that died is not counted in the API's live gauges: its last cache bytes would be added in forever."""

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from serving.metrics import forget_dead_workers

WORKER = """
from prometheus_client import CollectorRegistry
from serving.metrics import CacheMetrics
CacheMetrics(CollectorRegistry()).row_bytes.set({value})
print("set", flush=True)
input()  # a live worker until the test closes its stdin
"""


def _row_bytes(directory: Path) -> float:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("trends_api_row_cache_bytes "):
            return float(line.split()[1])
    return 0.0


def test_a_dead_workers_cache_bytes_leave_the_sum_and_its_counts_stay(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    workers = []
    for value in (1000, 2000, 500):
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER.format(value=value)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert worker.stdout is not None and worker.stdout.readline() == b"set\n"
        workers.append(worker)
    *killed, live = workers
    try:
        for worker in killed:  # as a SIGKILL or the OOM killer leaves them: files and all
            worker.kill()
            worker.wait(10)
        counted = sorted(p.name for p in tmp_path.glob("counter_*.db"))
        assert _row_bytes(tmp_path) == 3500  # the dead ones still added in

        stray = tmp_path / "gauge_livesum_notapid.db"  # not prometheus_client's name: left alone, no error
        stray.touch()
        assert forget_dead_workers(str(tmp_path)) == sorted(w.pid for w in killed)
        assert stray.exists()
        stray.unlink()

        assert _row_bytes(tmp_path) == 500
        assert [p.name for p in tmp_path.glob("gauge_livesum_*.db")] == [f"gauge_livesum_{live.pid}.db"]
        assert sorted(p.name for p in tmp_path.glob("counter_*.db")) == counted
        assert forget_dead_workers(str(tmp_path)) == []
    finally:
        live.communicate(b"\n", timeout=10)
