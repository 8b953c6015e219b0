"""The soak (``make test-soak``): the whole stack for an hour at a steady rate, a fault every 10 minutes, resources
recorded every 30 s and bounded.

The private stack of :mod:`tests.soak.conftest` runs the speed service (under the stack's supervisor), the API with 2
workers and the hourly ``trends_batch`` DAG under Airflow's scheduler. Events with live event times are produced at a
steady rate (:class:`tests.soak.config.SoakConfig`), the hour before the soak is seeded so even a short run has a
closed hour, dashboards poll the API, and a fault is injected every ``fault_every_s``, in rotation: the speed job
SIGKILLed (driver and JVM), the broker restarted, Cassandra stopped for 30 s, an API worker SIGKILLed.

Asserted after the warm-up: state, checkpoint and each process's RSS grow by less than 10 % of their level per hour
(:func:`tests.soak.report.growth`); freshness p99 is within its goal (5 s) outside each fault's recovery, and every
fault recovers within ``recovery_s``; every closed hour, answered by the batch layer through the DAG, counts exactly
the events the broker acknowledged; nothing failed to deliver. ``artifacts/soak.md`` and its plots are written first,
so a failed soak still leaves its record.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from infra.airflow.client import AirflowClient
from infra.cassandra import session
from infra.settings import Settings
from stack import control
from tests.pipeline import SupervisedSpeed
from tests.soak import report
from tests.soak.conftest import SoakStack, start_load
from tests.soak.probe import Gauges, SteadyProducer
from tests.soak.report import Fault, Sample, Spec

pytestmark = [pytest.mark.soak, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(6 * 3600)]

HOUR = timedelta(hours=1)
PROCESSES = {
    "speed_driver": "speed job driver (Python)",
    "speed_jvm": "speed job JVM",
    "api_master": "API (uvicorn master)",
    "api_workers": "API workers (2, summed)",
    "scheduler": "Airflow scheduler",
    "kafka": "Kafka broker",
    "cassandra": "Cassandra",
}
SPECS = [
    # The API workers' RSS includes their row and answer caches, which fill up to serving.cache_mb and
    # serving.answer_cache_mb by design: the bound applies to what they hold beyond them.
    # The broker's RSS includes its mapped segment indexes, which grow with the log as its disk does: the bound
    # applies to its anonymous memory (heap and native).
    # A restarted speed JVM warms up for about 10 minutes (JIT, and the first class-unloading cycles of Spark's
    # periodic GC at 5 and 10): the fifth 60-minute run, docs/history.md.
    *(
        Spec(
            f"rss_{k}",
            f"RSS, {label}",
            "MiB",
            "memory",
            bounded=k not in ("api_workers", "kafka"),
            settle_s=600 if k == "speed_jvm" else None,
        )
        for k, label in PROCESSES.items()
    ),
    Spec(
        "rss_api_workers_net",
        "RSS, API workers beyond their caches (/metrics)",
        "MiB",
        "memory",
        bounded=True,
        steps_at=("Cassandra stopped 30 s",),  # the reconnection's high-water mark (tests/soak/test_api_outages.py)
    ),
    Spec("rss_kafka_anon", "RSS, Kafka broker, anonymous (heap and native)", "MiB", "memory", bounded=True),
    Spec("rss_kafka_file", "RSS, Kafka broker, file-backed (mapped indexes, jars)", "MiB", "memory"),
    Spec(
        "state_bytes",
        "RocksDB state of the running speed job (spark.local.dir, StateStoreId*; low of each 30 s)",
        "bytes",
        "state",
        bounded=True,
        envelope_s=600,  # its low per 10 minutes: what compactions leave, which a growing state would raise
    ),
    Spec("checkpoint_bytes", "speed checkpoint folder", "bytes", "state", bounded=True),
    Spec("state_memory_bytes", "RocksDB memory of the speed job (memtables, block cache, readers)", "bytes", "state"),
    Spec("spark_local_bytes", "spark.local.dir, leftovers of killed runs included", "bytes", "state"),
    Spec("row_cache_bytes", "API row cache (/metrics, both workers)", "bytes", "caches"),
    Spec("answer_cache_bytes", "API answer cache (/metrics, both workers)", "bytes", "caches"),
    Spec("kafka_disk_bytes", "Kafka data dir", "bytes", "disk"),
    Spec("cassandra_disk_bytes", "Cassandra data dir", "bytes", "disk"),
    Spec("batch_ms_max", "speed micro-batch duration, longest in the 30 s", "ms", "speed"),
    Spec("batch_ms_mean", "speed micro-batch duration, mean in the 30 s", "ms", "speed"),
    Spec("freshness_p99_s", "freshness p99 of the events produced in the 30 s", "s", "speed"),
    Spec("speed_lag_records", "speed consumer lag (records)", "records", "speed"),
    *(Spec(f"cpu_{k}", f"CPU, {label}", "%", "cpu") for k, label in PROCESSES.items()),
    Spec("cpu_machine", "CPU, the whole machine (every process)", "%", "cpu"),
    Spec("cpu_other", "CPU, everything but the stack (this test, other runs on the machine)", "%", "cpu"),
    Spec("load_1m", "load average, 1 min (2 cores)", "load", "cpu"),
]


class Faults:
    """The rotation of faults, each run on its own thread so the 30-s samples keep their pace through it."""

    def __init__(self, settings: Settings, gauges: Gauges) -> None:
        self.settings = settings
        self.gauges = gauges
        self.done: list[Fault] = []
        self.errors: list[str] = []
        self.rotation: list[tuple[str, Callable[[], str]]] = [
            ("speed job SIGKILL", self.kill_speed),
            ("broker restart", self.restart_broker),
            ("Cassandra stopped 30 s", self.stop_cassandra),
            ("API worker SIGKILL", self.kill_api_worker),
        ]
        self._threads: list[threading.Thread] = []

    def kill_speed(self) -> str:
        speed = SupervisedSpeed(self.settings)
        pid = speed.running_job()
        speed.kill()
        return f"driver {pid} and its JVM"

    def restart_broker(self) -> str:
        t0 = time.monotonic()
        control.down(self.settings, ["kafka"])
        control.up(self.settings, ["kafka"])
        return f"down and up in {time.monotonic() - t0:.0f} s"

    def stop_cassandra(self) -> str:
        control.down(self.settings, ["cassandra"])
        time.sleep(30)
        t0 = time.monotonic()
        control.up(self.settings, ["cassandra"])
        return f"up again {time.monotonic() - t0:.0f} s after the 30 s"

    def kill_api_worker(self) -> str:
        workers = self.gauges.api_workers()
        assert workers, "no API worker to kill"
        workers[0].kill()
        psutil.wait_procs(workers[:1], timeout=10)
        return f"worker {workers[0].pid} of {len(workers)}"

    def inject(self, t: float) -> None:
        kind, act = self.rotation[len(self.done) % len(self.rotation)]
        fault = Fault(t, kind, "")
        began = time.monotonic()
        self.done.append(fault)
        index = len(self.done) - 1

        def run() -> None:
            try:
                detail = act()
            except Exception as exc:  # noqa: BLE001 - recorded, fails the soak at the end
                detail = f"FAILED: {exc}"
                self.errors.append(f"{kind} at {t:.0f} s: {exc}")
            self.done[index] = Fault(t, kind, detail, ended=t + time.monotonic() - began)

        thread = threading.Thread(target=run, name=f"soak-fault-{index}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(300)


def keep_logs(settings: Settings, out: Path) -> None:
    """Copy the speed job's and the API's logs beside the report: the private stack's folder goes with pytest's."""
    shutil.rmtree(out, ignore_errors=True)
    for service in ("speed", "api"):
        logs = settings.data_dir / service / "logs"
        if logs.is_dir():
            shutil.copytree(logs, out / service)


ClosedHour = tuple[datetime, int, int, bool, str, float]  # hour, acknowledged, served, batch only, DAG run, its s


def hour_runs(client: AirflowClient, hours: list[datetime], timeout_s: float) -> dict[datetime, tuple[str, float]]:
    """Wait (bounded) for the scheduler's ``trends_batch`` runs of these hours; return each one's state and seconds."""
    deadline = time.monotonic() + timeout_s
    found: dict[datetime, tuple[str, float]] = {}
    while time.monotonic() < deadline:
        runs = client.api("GET", "/api/v2/dags/trends_batch/dagRuns?limit=100")["dag_runs"]
        found = {}
        for r in runs:
            h = datetime.fromisoformat(r["data_interval_start"])
            if h in hours:
                began, ended = r.get("start_date"), r.get("end_date")
                took = (
                    (datetime.fromisoformat(ended) - datetime.fromisoformat(began)).total_seconds()
                    if began and ended
                    else float("nan")
                )
                found[h] = (r["state"], took)
        if len(found) == len(hours) and all(s in {"success", "failed"} for s, _ in found.values()):
            break
        time.sleep(10)
    return found


def closed_hours(settings: Settings, producer: SteadyProducer, timeout_s: float) -> list[ClosedHour]:
    """Return every hour the newest event time closed (its end + grace passed), as its DAG run and the API saw it."""
    grace = timedelta(seconds=max(settings.batch.grace_s, settings.batch.lateness_s))
    newest = datetime.fromtimestamp(producer.last_ts_ms / 1000, UTC)
    closed = sorted(h for h in producer.acked if h + HOUR + grace <= newest)
    runs = hour_runs(AirflowClient(settings), closed, timeout_s)
    out = []
    for h in closed:
        served, batch_only = served_hour(settings, h)
        state, took = runs.get(h, ("no run", float("nan")))
        out.append((h, producer.acked[h], served, batch_only, state, took))
    return out


def inexact(hours: list[ClosedHour]) -> list[ClosedHour]:
    """Return the closed hours whose count differs from the acknowledged, or not served by the batch layer alone."""
    return [h for h in hours if h[1] != h[2] or not h[3] or h[4] != "success"]


def served_hour(settings: Settings, hour: datetime) -> tuple[int, bool]:
    """Return the API's count for the hour (slice *) and whether the batch layer alone answered it, without a gap."""
    from serving import queries, window
    from serving.reader import ViewReader

    with session(settings) as sess:
        w = window.load(ViewReader(settings, sess), hour, hour + HOUR, "*", fields=())
    c = queries.count(w)
    batch_only = all(p["layer"] == "batch" for p in c.provenance.spans) and not c.provenance.gaps
    return c.events, batch_only


def test_soak(soak_stack: SoakStack, artifacts_dir: Path) -> None:
    cfg, settings = soak_stack.config, soak_stack.settings
    load = start_load(soak_stack, cfg.rate)
    producer, fresh, poller, gauges = load.producer, load.fresh, load.poller, load.gauges
    seeded, wall_began = load.seeded, load.wall_began
    faults = Faults(settings, gauges)
    samples: list[Sample] = []
    duration = cfg.minutes * 60
    next_fault = cfg.fault_every_s
    k = 0
    while (t := time.monotonic() - producer.began) < duration:
        if t >= next_fault and duration - t > cfg.sample_every_s:
            faults.inject(t)
            next_fault += cfg.fault_every_s
        if t >= k * cfg.sample_every_s:
            values, pids = gauges.read()
            samples.append(Sample(t, values, pids))
            k += 1
        gauges.watch_state()
        time.sleep(0.5)
    poller.stop()
    undelivered = producer.stop()
    producer.sent_steady = producer.sent - seeded
    faults.join()
    time.sleep(20)  # the last events' way to the speed view
    fresh.stop()

    # Freshness per 30-s window of production time; a sample never seen counts as its wait until the end.
    end_rel = time.time() - wall_began
    stamped = [(ts - wall_began, lat) for ts, lat in fresh.seen]
    lost = [(ts - wall_began, end_rel - (ts - wall_began)) for ts in fresh.pending]
    stamped_all = sorted(stamped + lost)
    windows: list[tuple[float, float | None]] = []
    prev = 0.0
    for s in samples[1:]:
        p99 = report.percentile([lat for t, lat in stamped_all if prev <= t < s.t], 0.99)
        s.values["freshness_p99_s"] = p99
        windows.append((s.t, p99))
        prev = s.t
    recovered = report.freshness_recovery(windows, faults.done, cfg.freshness_p99_goal_s, cfg.recovery_s)
    warmup_s = cfg.warmup_minutes * 60
    quiet = report.outside_faults(stamped_all, recovered, warmup_s, cfg.recovery_s)
    quiet_p99 = report.percentile(quiet, 0.99)
    all_p99 = report.percentile([lat for t, lat in stamped_all if t >= warmup_s], 0.99)

    # Every closed hour (its end + grace passed by the newest event time), through the DAG, against the acks.
    exact = closed_hours(settings, producer, cfg.close_wait_s)

    growths, recorded = (
        [
            report.growth(
                samples,
                s.name,
                warmup_s,
                s.settle_s if s.settle_s is not None else cfg.settle_s,
                [f for f in faults.done if f.kind in s.steps_at],
                envelope_s=s.envelope_s,
            )
            for s in SPECS
            if s.bounded == bounded
        ]
        for bounded in (True, False)
    )
    (artifacts_dir / "soak-samples.json").write_text(
        json.dumps([{"t": s.t, **s.values, "pids": s.pids} for s in samples], indent=1)
    )
    files = report.plot(samples, SPECS, recovered, artifacts_dir)
    doc = write_report(
        artifacts_dir / "soak.md",
        soak_stack,
        producer,
        seeded,
        samples,
        growths,
        recorded,
        recovered,
        (quiet_p99, all_p99, len(quiet), len(fresh.seen), len(lost)),
        exact,
        dict(poller.statuses),
        files,
    )
    print(doc)
    keep_logs(settings, artifacts_dir / "soak-logs")

    assert not faults.errors, faults.errors
    assert (undelivered, producer.failed[:5]) == (0, []), "events not acknowledged by the broker"
    assert producer.achieved >= 0.95 * cfg.rate, f"the producer reached {producer.achieved:,.0f} of {cfg.rate:,.0f}/s"
    grew = [
        f"{g.name}: {g.relative:+.1%}/h" if g.relative is not None else f"{g.name}: no fit"
        for g in growths
        if not g.ok(cfg.growth_bound)
    ]
    assert not grew, f"grew by {cfg.growth_bound:.0%}/h or more (or could not be fitted): {grew}"
    slow = [f"{f.kind} at {f.t:.0f} s" for f in recovered if f.recovered_s is None]
    assert not slow, f"freshness p99 not back within {cfg.freshness_p99_goal_s} s in {cfg.recovery_s:.0f} s: {slow}"
    assert quiet and quiet_p99 is not None and quiet_p99 <= cfg.freshness_p99_goal_s, (
        f"freshness p99 {quiet_p99} s outside faults"
    )
    assert exact, "no closed hour to check"
    wrong = inexact(exact)
    assert not wrong, f"closed hours not exact through the DAG (hour, acked, served, batch only, run, s): {wrong}"


def closed_hour_rows(hours: list[ClosedHour]) -> list[str]:
    """Return the report's table of closed hours."""
    return [
        "| closed hour | acknowledged | served | batch layer only, no gap | DAG run | run took |",
        "|---|---|---|---|---|---|",
        *(f"| {h:%Y-%m-%d %H:00} | {a:,} | {s:,} | {b} | {r} | {t:.0f} s |" for h, a, s, b, r, t in hours),
    ]


def write_report(
    path: Path,
    stack: SoakStack,
    producer: SteadyProducer,
    seeded: int,
    samples: list[Sample],
    growths: list[report.Growth],
    recorded: list[report.Growth],
    faults: list[Fault],
    fresh: tuple[float | None, float | None, int, int, int],
    exact: list[ClosedHour],
    statuses: dict[str, int],
    files: list[Path],
) -> str:
    """Write ``soak.md``: the run, each series' start, end and growth per hour, faults, freshness, exactness, plots."""
    cfg = stack.config
    units = {s.name: s.unit for s in SPECS}
    labels = {s.name: s.label for s in SPECS}
    quiet_p99, all_p99, n_quiet, n_seen, n_lost = fresh

    def row(g: report.Growth, bound: str) -> str:
        unit = units[g.name]
        rate = "-" if g.per_hour is None else report.scaled(g.per_hour, unit) + "/h"
        rel = "-" if g.relative is None else f"{g.relative:+.1%}"
        verdict = "" if not bound else ("✔" if g.ok(cfg.growth_bound) else "✘")
        return (
            f"| {labels[g.name]} | {report.scaled(g.first, unit)} | {report.scaled(g.last, unit)} | {rate} | {rel} "
            f"| {bound} {verdict} |"
        )

    cpu = {
        s.name: sum(v for x in samples if (v := x.values.get(s.name)) is not None) / max(1, len(samples))
        for s in SPECS
        if s.group == "cpu"
    }
    longer_settles = "".join(f" ({s.label}: {s.settle_s:.0f} s)" for s in SPECS if s.settle_s is not None)
    lines = [
        "# Soak",
        "",
        f"{cfg.minutes:g} min at {cfg.rate:,.0f} events/s (achieved {producer.achieved:,.0f}/s, "
        f"{producer.sent_steady:,} events, plus {seeded:,} seeded over the hour before), a fault every "
        f"{cfg.fault_every_s:.0f} s, a sample every {cfg.sample_every_s:.0f} s ({len(samples)} samples), warm-up "
        f"{cfg.warmup_minutes:g} min, speed trigger {cfg.trigger_s:g} s and lateness {cfg.lateness_s} s, "
        f"settle after a restart {cfg.settle_s:.0f} s{longer_settles}. "
        f"Private stack ({stack.settings.data_dir}); started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC minus the run.",
        "",
        "Growth is the least-squares slope over the samples after the warm-up (per process incarnation for RSS; "
        "the API workers also per Cassandra outage, whose reconnection steps them once to a new level, bounded per "
        "outage by test_api_outages.py), relative to the series' mean level after the warm-up; "
        f"bound < {cfg.growth_bound:.0%} per hour.",
        "",
        "| series | first after warm-up | last | growth per hour | relative | bound |",
        "|---|---|---|---|---|---|",
        *(row(g, f"< {cfg.growth_bound:.0%}") for g in growths),
        *(row(g, "") for g in recorded if units[g.name] in {"bytes", "ms", "records"}),
        "",
        f"Freshness (event produced → newest event time of the speed view): p99 {report.scaled(quiet_p99, 's')} over "
        f"{n_quiet:,} samples after warm-up outside the faults' recovery (goal ≤ {cfg.freshness_p99_goal_s:g} s), "
        f"p99 {report.scaled(all_p99, 's')} with them; {n_seen:,} samples seen, {n_lost} never seen.",
        "",
        "| fault at | fault | what was done | freshness p99 back within goal after |",
        "|---|---|---|---|",
        *(
            f"| {f.t / 60:.1f} min | {f.kind} | {f.detail} | "
            f"{f'not within {cfg.recovery_s:.0f} s' if f.recovered_s is None else f'{f.recovered_s:.0f} s'} |"
            for f in faults
        ),
        "",
        *closed_hour_rows(exact),
        "",
        f"Dashboard poller: {', '.join(f'{k}: {v:,}' for k, v in sorted(statuses.items()))}.",
        "",
        "Mean CPU over the run (% of one core): "
        + ", ".join(f"{labels[n].removeprefix('CPU, ')} {v:.0f}" for n, v in cpu.items() if n != "load_1m")
        + f"; load average {cpu.get('load_1m', 0):.2f}.",
        "",
        *(f"![{f.stem}]({urllib.parse.quote(f.name)})" for f in files),
        "",
    ]
    text = "\n".join(lines)
    path.write_text(text)
    return text
