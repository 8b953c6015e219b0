"""The soak's knobs, read from ``SOAK_*`` variables so a short validation run needs no code change.

They are the test's own parameters (how long, how fast, how often a fault), not the pipeline's settings: the stack it
starts runs with the pipeline's defaults except where :mod:`tests.soak.conftest` says why not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _num(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


@dataclass(frozen=True)
class SoakConfig:
    """How long the soak runs, at what rate, how often it injects a fault and how it judges the series."""

    minutes: float = 60.0
    # Events/s: a quarter of what the whole stack sustains here (make test-capacity, docs/soak.md "Capacity").
    rate: float = 2000.0
    fault_every_s: float = 600.0
    sample_every_s: float = 30.0
    # > the speed layer's lateness: its dedupe state fills for that long (ids kept until the watermark passes them).
    warmup_minutes: float = 15.0
    # A fault's freshness impact ends once a 30 s window's p99 is back within the goal; it must within this.
    recovery_s: float = 300.0
    # A process restarted by a fault re-warms (JVM heap, caches): its first samples after the restart are left out.
    settle_s: float = 120.0
    # The pipeline's default trigger. The dedupe's eviction scans its whole state once a batch (rate x lateness ids),
    # so a 1 s trigger ran that scan back to back and kept the machine busy (docs/history.md, "The first run").
    trigger_s: float = 2.0
    lateness_s: int = 600  # speed.allowed_lateness_s of the soak's speed job (the pipeline's default)
    seed_events: int = 100_000  # events over the hour before the soak, so even a short run has a closed hour
    close_wait_s: float = 1200.0  # after the run, the longest wait for the DAG runs of the closed hours
    growth_bound: float = 0.10  # state, checkpoint and each process's RSS: < 10 % of its level per hour
    freshness_p99_goal_s: float = 5.0  # docs/benchmarks.md: freshness p99 <= 5 s
    # More options for the speed JVM, e.g. -XX:NativeMemoryTracking=summary to read `jcmd <pid> VM.native_memory`.
    java_options: str = ""

    @classmethod
    def from_env(cls) -> SoakConfig:
        """Read ``SOAK_MINUTES`` and the others; a shorter run scales the fault interval and warm-up with it.

        ``SOAK_MINUTES=10`` alone gives a fault every 100 s and a 2.5 min warm-up (the 60-minute proportions);
        ``SOAK_FAULT_EVERY_S``, ``SOAK_WARMUP_MINUTES`` and the rest override each figure.
        """
        d = cls()
        minutes = _num("SOAK_MINUTES", d.minutes)
        scale = minutes / d.minutes
        return cls(
            minutes=minutes,
            rate=_num("SOAK_RATE", d.rate),
            fault_every_s=_num("SOAK_FAULT_EVERY_S", d.fault_every_s * scale),
            sample_every_s=_num("SOAK_SAMPLE_S", d.sample_every_s),
            warmup_minutes=_num("SOAK_WARMUP_MINUTES", d.warmup_minutes * scale),
            recovery_s=_num("SOAK_RECOVERY_S", d.recovery_s),
            settle_s=_num("SOAK_SETTLE_S", min(d.settle_s, d.fault_every_s * scale / 2)),
            trigger_s=_num("SOAK_TRIGGER_S", d.trigger_s),
            lateness_s=int(_num("SOAK_LATENESS_S", d.lateness_s)),
            seed_events=int(_num("SOAK_SEED_EVENTS", d.seed_events)),
            close_wait_s=_num("SOAK_CLOSE_WAIT_S", d.close_wait_s),
            growth_bound=_num("SOAK_GROWTH_BOUND", d.growth_bound),
            freshness_p99_goal_s=d.freshness_p99_goal_s,
            java_options=os.environ.get("SOAK_JAVA_OPTIONS", d.java_options).strip(),
        )
