"""The capacity run (``make test-capacity``): the soak's whole stack at rising rates, to find the rate it sustains.

The private stack of :mod:`tests.soak.conftest` (Kafka, Cassandra, Airflow's scheduler with the hourly DAG, the speed
service, the API with 2 workers and dashboards polling it) takes events at each rate of ``CAPACITY_RATES`` for
``CAPACITY_STEP_MINUTES``, without faults (the soak at the rate found adds them). A step is judged on its second
half, once the speed layer's dedupe state has filled toward its size at that rate (:class:`tests.soak.report.Step`):
freshness p99 ≤ 5 s, the producer's achieved rate, the consumer lag not growing, every dashboard answer a 200 within
``CAPACITY_POLL_P99_S``. The run stops after the first step that misses. Then every closed hour, recomputed by the
scheduler's DAG, must count exactly what the broker acknowledged, and its run's duration is printed against the hour.

``artifacts/capacity.md`` gives each step's figures and each process's CPU: at the first step that misses, what
saturated first. The soak's events are produced straight to the events topic (no pseudonymisation: the ingest
bench measures that hop on its own).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.soak import report
from tests.soak.conftest import SoakStack, start_load
from tests.soak.report import Sample, Step
from tests.soak.test_soak import PROCESSES, ClosedHour, closed_hour_rows, closed_hours, inexact, keep_logs

pytestmark = [pytest.mark.capacity, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(6 * 3600)]

HOUR = timedelta(hours=1)
RATES = [float(r) for r in os.environ.get("CAPACITY_RATES", "2000,4000,6000,8000,12000,16000,20000,25000").split(",")]
STEP_S = float(os.environ.get("CAPACITY_STEP_MINUTES", "10")) * 60
POLL_P99_S = float(os.environ.get("CAPACITY_POLL_P99_S", "1.0"))


def _mean(samples: list[Sample], key: str) -> float | None:
    """Return the mean of a series over the samples that read it (None: none did)."""
    vals = [v for s in samples if (v := s.values.get(key)) is not None]
    return sum(vals) / len(vals) if vals else None


def judge_step(
    rate: float,
    began: float,
    ended: float,
    sent: tuple[int, int, float],
    samples: list[Sample],
    stamped: list[tuple[float, float]],
    polls: list[tuple[float, str, float]],
) -> Step:
    """Return the step's figures over ``[began, ended)`` (seconds after the steady phase began).

    :arg sent: events sent by the judged half's start and by the step's end, and the seconds between.
    """
    inside = [s for s in samples if began <= s.t < ended]
    lags = [v for s in inside if (v := s.values.get("speed_lag_records")) is not None]
    answers = [(status, took) for t, status, took in polls if began <= t < ended]  # t: as ``began``
    cpu = {}
    for name in (*PROCESSES, "airflow_tasks", "machine", "other"):
        mean = _mean(inside, f"cpu_{name}")
        cpu[name] = mean if mean is not None else float("nan")
    lat = [lat for t, lat in stamped if began <= t < ended]
    return Step(
        rate=rate,
        began=began,
        ended=ended,
        achieved=(sent[1] - sent[0]) / sent[2],
        freshness_p99_s=report.percentile(lat, 0.99),
        freshness_samples=len(lat),
        lag=(lags[0] if lags else None, lags[-1] if lags else None),
        polls=(
            len(answers),
            sum(1 for status, _ in answers if status != "200"),
            report.percentile([took for _, took in answers], 0.99),
        ),
        cpu=cpu,
        batch_ms_mean=_mean(inside, "batch_ms_mean"),
        eviction_ms_mean=_mean(inside, "eviction_ms_mean"),
    )


def test_capacity(soak_stack: SoakStack, artifacts_dir: Path) -> None:
    cfg, settings = soak_stack.config, soak_stack.settings
    load = start_load(soak_stack, RATES[0])
    producer, fresh, poller, gauges = load.producer, load.fresh, load.poller, load.gauges
    seeded, wall_began = load.seeded, load.wall_began
    samples: list[Sample] = []
    steps: list[Step] = []
    k = 0
    for i, rate in enumerate(RATES):
        if i:
            producer.set_rate(rate)
        step_began = time.monotonic() - producer.began
        half = step_began + STEP_S / 2
        sent_half = None
        while (t := time.monotonic() - producer.began) < step_began + STEP_S:
            if sent_half is None and t >= half:
                sent_half = producer.sent - seeded
            if t >= k * cfg.sample_every_s:
                values, pids = gauges.read()
                samples.append(Sample(t, values, pids))
                k += 1
            time.sleep(0.5)
        ended = time.monotonic() - producer.began
        sent_end = producer.sent - seeded
        # the judged half ends 20 s before the step: an event's freshness sample may still be on its way
        stamped = [(ts - wall_began, lat) for ts, lat in fresh.seen]
        stamped += [(ts - wall_began, time.time() - ts) for ts in fresh.pending if ts - wall_began < ended - 20]
        polls = [(t - producer.began, status, took) for t, status, took in poller.answers]
        sent = (sent_half or 0, sent_end, ended - half)
        step = judge_step(rate, half, ended - 20, sent, samples, stamped, polls)
        steps.append(step)
        missed = step.failures(cfg.freshness_p99_goal_s, POLL_P99_S)
        print(f"{rate:,.0f} events/s: {'; '.join(missed) or 'sustained'}", flush=True)
        if missed:
            break
    poller.stop()
    undelivered = producer.stop()
    producer.sent_steady = producer.sent - seeded
    time.sleep(20)
    fresh.stop()

    hours = closed_hours(settings, producer, cfg.close_wait_s)

    sustained = [s for s in steps if not s.failures(cfg.freshness_p99_goal_s, POLL_P99_S)]
    doc = write_report(artifacts_dir / "capacity.md", soak_stack, steps, hours, sustained, seeded)
    (artifacts_dir / "capacity-samples.json").write_text(
        json.dumps({"steps": [asdict(s) for s in steps], "samples": [{"t": s.t, **s.values} for s in samples]})
    )
    print(doc)
    keep_logs(settings, artifacts_dir / "capacity-logs")

    assert (undelivered, producer.failed[:5]) == (0, []), "events not acknowledged by the broker"
    assert sustained, "not even the first step's rate was sustained"
    assert hours, "no closed hour to check"
    wrong = inexact(hours)
    assert not wrong, f"closed hours not exact through the DAG (hour, acked, served, batch only, run, s): {wrong}"


def write_report(
    path: Path,
    stack: SoakStack,
    steps: list[Step],
    hours: list[ClosedHour],
    sustained: list[Step],
    seeded: int,
) -> str:
    """Write ``capacity.md``: each step's figures and CPU per process, then each closed hour's recompute."""
    cfg = stack.config
    names = [*PROCESSES, "airflow_tasks", "machine", "other"]
    head = [
        "step",
        "achieved",
        "freshness p99",
        "lag (first → last)",
        "dashboards (n, not 200, p99)",
        "micro-batch",
        f"dedupe eviction (task ms, {stack.settings.spark.shuffle_partitions} partitions)",
    ]
    labels = {
        **PROCESSES,
        "airflow_tasks": "hourly recompute (Airflow tasks)",
        "machine": "machine",
        "other": "other (producer, poller)",
    }
    lines = [
        "# Capacity",
        "",
        f"The soak's private stack at rising rates, {STEP_S / 60:g} min a step, judged on each step's second half; "
        f"speed trigger {cfg.trigger_s:g} s, lateness {cfg.lateness_s} s; {seeded:,} events seeded over the hour "
        f"before; run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        "",
        f"**Sustained: {sustained[-1].rate:,.0f} events/s**" if sustained else "**No rate sustained.**",
        "",
        "| " + " | ".join(head + [f"CPU {labels[n]}" for n in names]) + " | verdict |",
        "|" + "---|" * (len(head) + len(names) + 1),
    ]
    for s in steps:
        missed = s.failures(cfg.freshness_p99_goal_s, POLL_P99_S)
        lag = " → ".join("-" if v is None else f"{v:,.0f}" for v in s.lag)
        n, bad, p99 = s.polls
        cells = [
            f"{s.rate:,.0f}/s",
            f"{s.achieved:,.0f}/s",
            report.scaled(s.freshness_p99_s, "s"),
            lag,
            f"{n}, {bad}, {report.scaled(p99, 's')}",
            "-" if s.batch_ms_mean is None else f"{s.batch_ms_mean:,.0f} ms",
            "-" if s.eviction_ms_mean is None else f"{s.eviction_ms_mean:,.0f} ms",
            *(f"{s.cpu[n]:.0f} %" for n in names),
            "; ".join(missed) or "✔",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        *closed_hour_rows(hours),
        "",
    ]
    text = "\n".join(lines)
    path.write_text(text)
    return text
