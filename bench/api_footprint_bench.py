"""The API process's start time and memory, as served (no pyspark), beside the same process with pyspark loaded.

Run with the stack up: ``.venv/bin/python bench/api_footprint_bench.py [--runs N]``. Each run starts ``trends serve``
on a free port, times it until ``/ready`` answers 200, asks one summary (so the routes, the reader and the merge
have run), then reads the process's RSS and unique set size (USS) and stops it. The baseline is the same command
with ``pyspark.sql`` imported first: what every API worker loaded while the API took a constant from
``views.aggregation``. The two alternate run by run, so both see the same machine. Prints min/median per variant and
the saving; ``--smoke`` does one run of each.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
# `trends serve` as the console script runs it; the baseline imports pyspark.sql before it.
SERVE = "import sys; {pre}from app.cli import main; sys.argv = ['trends', 'serve']; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(with_pyspark: bool) -> dict[str, float]:
    port = free_port()
    env = {**os.environ, "TRENDS_SERVING__PORT": str(port), "TRENDS_SERVING__WORKERS": "1"}
    code = SERVE.format(pre="import pyspark.sql; " if with_pyspark else "")
    t0 = time.monotonic()
    proc = subprocess.Popen([str(PYTHON), "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"trends serve exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() - t0 > 120:
                raise SystemExit("trends serve was not ready within 120 s")
            time.sleep(0.05)
        ready_s = time.monotonic() - t0
        answer = httpx.get(f"{url}/api/v1/summary", params={"last": "1h"}, timeout=60)
        assert answer.status_code == 200, answer.text[:500]
        info = psutil.Process(proc.pid).memory_full_info()
        return {"ready_s": ready_s, "rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="runs of each variant (alternating)")
    parser.add_argument("--smoke", action="store_true", help="one run of each, to check the bench works")
    args = parser.parse_args()
    runs = 1 if args.smoke else args.runs
    results: dict[str, list[dict[str, float]]] = {"served (no pyspark)": [], "baseline: + pyspark.sql": []}
    for _ in range(runs):
        results["served (no pyspark)"].append(one_run(with_pyspark=False))
        results["baseline: + pyspark.sql"].append(one_run(with_pyspark=True))
    print(f"trends serve, {runs} run(s) each, alternating; python {sys.version.split()[0]}")
    print(f"{'variant':26} {'ready s min/med':>16} {'RSS MiB min/med':>16} {'USS MiB min/med':>16}")
    med: dict[str, dict[str, float]] = {}
    for name, rows in results.items():
        cols = {k: [r[k] for r in rows] for k in ("ready_s", "rss_mib", "uss_mib")}
        med[name] = {k: statistics.median(v) for k, v in cols.items()}
        print(
            f"{name:26} {min(cols['ready_s']):7.2f}/{med[name]['ready_s']:<8.2f} "
            f"{min(cols['rss_mib']):7.1f}/{med[name]['rss_mib']:<8.1f} "
            f"{min(cols['uss_mib']):7.1f}/{med[name]['uss_mib']:<8.1f}"
        )
    a, b = med["served (no pyspark)"], med["baseline: + pyspark.sql"]
    print(
        f"saved per API process (medians): {b['ready_s'] - a['ready_s']:.2f} s of start-up, "
        f"{b['rss_mib'] - a['rss_mib']:.1f} MiB RSS, {b['uss_mib'] - a['uss_mib']:.1f} MiB USS"
    )


if __name__ == "__main__":
    main()
