"""Every bench's smoke mode, run as a user would (``.venv/bin/python bench/x.py --smoke``), against the real stack.

A bench is not a test of timing, but one that measures nothing (an empty answer, no records sent, no visible
sample) must fail CI instead of rotting (the serving bench once timed 0-row answers for weeks). Each smoke runs
every step of its bench on tiny sizes and keeps its checks (exact counts, no gap, exactness against the truth); this
test fails when the bench exits non-zero or prints none of its figures (each with its baseline or ratio beside it).
The peers bench's smoke runs without ``.venv-peers`` (the speed layer and the bare read only, checked exact).

To keep ``make test`` short the smokes run in lanes, started together: two Spark smokes at a time (each slower, the
whole about 80 s shorter than one after the other; the speed bench waits 90 s at most for its job, ample on two
cores), the others beside them (``TRENDS_TEST_BENCH_SPARK_LANES=1`` runs the Spark ones one after the other). Each
test then waits for its own bench's run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.settings import Settings
from infra.settings_env import to_env

pytestmark = pytest.mark.services

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 600  # on 2 shared cores the slowest (Spark) smokes took 1.5-2.5 min

# bench script -> figures its smoke must print (regular expressions, each searched in its output)
FIGURES: dict[str, tuple[str, ...]] = {
    "api_footprint_bench.py": (
        r"served \(no pyspark\) +[\d.]+/[\d.]+ +[\d.]+/[\d.]+ +[\d.]+/[\d.]+",
        r"baseline: \+ pyspark\.sql +[\d.]+/[\d.]+ +[\d.]+/[\d.]+ +[\d.]+/[\d.]+",
        r"saved per API process \(medians\): -?[\d.]+ s of start-up, -?[\d.]+ MiB RSS",
    ),
    "ingest_bench.py": (
        r"ProducerPerformance .*: 3,000 records -> [\d,]+/s",
        r"trends ingest generate, pseudonymised, cold store .*: 3,000 events -> [\d,]+ events/s",
        r"trends ingest generate, pseudonymised, warm store .*: 3,000 events -> [\d,]+ events/s",
        r"trends ingest generate, not pseudonymised: 3,000 events -> [\d,]+ events/s",
        r"pseudonymised / not: cold store [\d.]+, warm store [\d.]+",
        r"the long-running producer (after its first 3,000 events .*: [\d,]+ events/s|printed too little progress)",
        r"trends ingest file .*, pseudonymised: 3,000 events -> [\d,]+ events/s",
        r"ratio to the bare keyed producer \d+\.\d\d",
        r"trends collect \(HTTP, 1000 events per request as JSON lines, 4 clients\): 3,000 events -> [\d,]+ events/s",
        r"bare HTTP forwarder .*: 3,000 records -> [\d,]+/s",
        r"ratio to the bare HTTP forwarder \d+\.\d\d",
        r"the long-running collector, the same events again .*: [\d,]+ events/s = \d+\.\d\d of the bare HTTP",
        r"bare consume-produce loop \(json .*\): 6,000 records -> [\d,]+/s",  # the file twice
        r"trends ingest kafka --format json .*: 6,000 events -> [\d,]+ events/s",
        r"ratio to the bare consume-produce loop \d+\.\d\d",
        r"the long-running bridge after its first 3,000 records .*: ([\d,]+|nan) events/s",
        r"subject store alone .*: create \(LWT\) [\d,]+/s, read [\d,]+/s, .*subject hours: written [\d,]+/s",
    ),
    "serving_bench.py": (
        r"trending  1h uncached \(every cache off\): p50 +[\d.]+ ms +p99 +[\d.]+ ms +\| reads alone \(state \+ rows\) "
        r"p50 +[\d.]+ p99 +[\d.]+ +merge alone \(in memory\) p50 +[\d.]+ p99 +[\d.]+ +reads \+ merge p50 +[\d.]+ ms"
        r" +\| [1-9]\d* rows, 4,800 events of both windows, no gap",  # ten-minute rows: how many depends on the minute
        r"trending  1h uncached, minutes only \(serving.ten_minute_rows off\): p50 .* \| 120 rows",
        r"trending 24h uncached .* [1-9][\d,]* rows, [1-9][\d,]* events of both windows, no gap",
        r"trending 24h speed moved one minute: p50 +[\d.]+ ms .* ratio [\d.]+x faster",
        r"http trending 24h +2 clients: +[1-9]\d* req/s .* errors 0 +\| ratio to /health [\d.]+",
        r"rss of trends serve .* statuses \{200: 8\}.* a window 20% longer: 400 .*✔",
    ),
    "batch_bench.py": (
        r"indexer \(cold\): 3,00\d records in [\d.]+ s .* ratio [\d.]+",
        r"ratio = bare s / recompute s = [\d.]+",
        r"hourly row 3000, sum of minute rows 3,000 \(expected 3,000\) OK",
        r"recompute / its own read \+ decode \+ dedupe ceiling: [\d.]+",
    ),
    "speed_bench.py": (
        r"speed layer +[1-9][\d,]* rows/s",
        r"ratio speed layer / bare Kafka -> noop: [\d.]+",
        r"[1-9]\d* samples, \d+ lost .*: p50 [\d.]+ s",
        r"from_avro, avro_schema +[\d.]+ / +[\d.]+ s +[1-9][\d,]* / +[1-9][\d,]* rows/s",
        r"bytes per event: JSON [1-9][\d.]*, Avro [1-9][\d.]*",
        r"ratio from_avro / the layers' decode \(parse_events\): [\d.]+x faster",
    ),
    "backfill_bench.py": (
        r"indexer: [\d,]+ records in [\d.]+ s; bare Spark read \+ count [\d,]+ in [\d.]+ s: ratio [\d.]+",
        r"\(a\) trends batch run, 2 days: [\d.]+ s .* ratio bare read / it = [\d.]+",
        r"48 of 48 hours with a current run; daily counts EXACT",
    ),
    "privacy_export_bench.py": (
        r"sparse +2 +2 +\d+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ ",
        r"dense +48 +48 +\d+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ ",
        r"forget --unlink sparse: forgotten \(done\) in [\d.]+ s, 2 hour\(s\) found; export after it: 0 events",
        r"forget --exclude dense: pending_recompute \(recompute_started\) in [\d.]+ s, 48 hour\(s\) found, 48 handed",
    ),
    "peers/peers_bench.py": (
        r"bare Kafka -> noop +[1-9][\d,]* rows/s +\(baseline\)",
        r"speed layer \(Cassandra\) +[1-9][\d,]* rows/s +[\d.]+ of bare +exact",
        r"speed layer \(null\) +[1-9][\d,]* rows/s +[\d.]+ of bare +exact",
    ),
}
SPARK = {"batch_bench.py", "speed_bench.py", "backfill_bench.py", "peers/peers_bench.py"}


@dataclass(frozen=True)
class SmokeRun:
    """A bench's smoke run: its exit status, output and wall time."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_smoke(script: str, env: dict[str, str]) -> SmokeRun:
    """Run ``bench/<script> --smoke`` with the venv's python, as ``.venv/bin/python bench/x.py --smoke`` does."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "bench" / script), "--smoke"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=SMOKE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return SmokeRun(-1, out, f"timed out after {SMOKE_TIMEOUT_S} s", time.monotonic() - t0)
    return SmokeRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest, stack_up: Settings) -> Iterator[dict[str, Future[SmokeRun]]]:
    """Start the selected benches' smokes at once in two lanes (Spark ones in turn, the others beside them)."""
    selected = [
        item.callspec.params["script"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    ]
    env = {**os.environ, **to_env(stack_up), "PYTHONUNBUFFERED": "1"}
    spark_lanes = int(os.environ.get("TRENDS_TEST_BENCH_SPARK_LANES", "2"))
    with (
        ThreadPoolExecutor(spark_lanes, "bench-spark") as spark_lane,
        ThreadPoolExecutor(1, "bench-other") as other_lane,
    ):
        runs = {s: (spark_lane if s in SPARK else other_lane).submit(run_smoke, s, env) for s in selected}
        yield runs


@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=[pytest.mark.spark] if s in SPARK else [], id=s) for s in FIGURES]
)
def test_bench_smoke_measures_something(script: str, smoke_runs: dict[str, Future[SmokeRun]]) -> None:
    run = smoke_runs[script].result()
    tail = "\n".join((run.stdout + run.stderr).splitlines()[-40:])
    took = f"{run.seconds:.0f} s"
    print(f"bench/{script} --smoke: exit {run.returncode} in {took}")  # its own time (the test's includes the wait)
    assert run.returncode == 0, f"bench/{script} --smoke exited {run.returncode} after {took}:\n{tail}"
    missing = [f for f in FIGURES[script] if not re.search(f, run.stdout)]
    assert not missing, f"bench/{script} --smoke printed none of {missing} ({took}):\n{run.stdout[-4000:]}"
