"""The soak's judgement (tests/soak/report.py) on made-up series: each bound fails when what it names happens."""

from __future__ import annotations

import math
import random
from pathlib import Path

from tests.soak import report
from tests.soak.report import Fault, Sample, Spec

WARMUP = 600.0


def series(values: list[tuple[float, float, int]]) -> list[Sample]:
    """Samples of one series ``x`` from (t, value, pid)."""
    return [Sample(t, {"x": v}, {"x": pid}) for t, v, pid in values]


def test_flat_series_passes_and_growing_one_fails() -> None:
    ts = [i * 30.0 for i in range(121)]  # an hour of 30-s samples
    flat = series([(t, 1000.0 + (7 if i % 2 else -7), 1) for i, t in enumerate(ts)])
    g = report.growth(flat, "x", WARMUP, 120)
    assert g.relative is not None and abs(g.relative) < 0.01 and g.ok(0.10)
    # 20 % of the level per hour: the bound must catch it
    growing = series([(t, 1000.0 * (1 + 0.2 * t / 3600), 1) for t in ts])
    g = report.growth(growing, "x", WARMUP, 120)
    assert g.relative is not None and 0.15 < g.relative < 0.25 and not g.ok(0.10)


def test_warmup_is_left_out() -> None:
    # fills fast during the warm-up, then flat: not growth
    s = series([(t, min(t, WARMUP) + 1000.0, 1) for t in (i * 30.0 for i in range(121))])
    assert report.growth(s, "x", WARMUP, 120).ok(0.10)
    assert not report.growth(s, "x", 0, 120).ok(0.10)


def test_restarted_process_is_judged_within_each_incarnation() -> None:
    # flat at 1000 MiB; a fault restarts it at 30 min, it re-warms from 300 MiB to 1000 in 2 min, then flat again
    values = []
    for i in range(121):
        t = i * 30.0
        if t < 1800:
            values.append((t, 1000.0, 1))
        else:
            values.append((t, min(1000.0, 300.0 + (t - 1800) * 700 / 120), 2))
    s = series(values)
    assert report.growth(s, "x", WARMUP, 150).ok(0.10)
    # a leak within the new incarnation is still caught
    leaky = series([(t, v * (1 + 0.3 * max(0.0, t - 2000) / 3600) if pid == 2 else v, pid) for t, v, pid in values])
    assert not report.growth(leaky, "x", WARMUP, 150).ok(0.10)


def test_no_samples_after_warmup_is_not_a_pass() -> None:
    assert not report.growth(series([(0.0, 1.0, 1), (30.0, 1.0, 1)]), "x", WARMUP, 120).ok(0.10)


def test_freshness_outside_faults_and_recovery() -> None:
    faults = [Fault(900.0, "speed job SIGKILL", "")]
    windows = [(930.0, 40.0), (960.0, 12.0), (990.0, 3.0), (1020.0, 2.0)]
    (f,) = report.freshness_recovery(windows, faults, 5.0, 300)
    assert f.recovered_s == 90.0
    (never,) = report.freshness_recovery([(930.0, 40.0), (1300.0, 2.0)], faults, 5.0, 300)
    assert never.recovered_s is None
    stamped = [(700.0, 1.0), (910.0, 30.0), (980.0, 6.0), (1200.0, 1.5)]
    assert report.outside_faults(stamped, [f], WARMUP, 300) == [1.0, 1.5]
    # a spike with no fault behind it counts
    assert 9.0 in report.outside_faults([*stamped, (1500.0, 9.0)], [f], WARMUP, 300)
    assert report.percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0


def test_plots_are_written(tmp_path: Path) -> None:
    s = [Sample(t * 30.0, {"a": float(t), "b": 2.0**20 * t}) for t in range(5)]
    files = report.plot(
        s, [Spec("a", "a", "MiB", "one"), Spec("b", "b", "bytes", "one")], [Fault(60, "k", "")], tmp_path
    )
    assert [f.name for f in files] == ["soak-one.png"] and files[0].stat().st_size > 1000


def test_a_step_at_a_named_fault_is_judged_at_its_new_level() -> None:
    # flat at 190 MiB; Cassandra stopped at 30 min, back after 100 s; the series steps +4 MiB at reconnection (past
    # the fault's start + settle time: the window must run from when the fault ended), then flat
    outage = Fault(1800.0, "Cassandra stopped 30 s", "", ended=1900.0)
    ts = [i * 30.0 for i in range(121)]
    stepped = series([(t, 190.0 + (4.0 if t >= 1950 else 0.0), 1) for t in ts])
    assert not report.growth(stepped, "x", WARMUP, 120).ok(0.03)  # through the step: a slope of +3.6 %/h
    assert report.growth(stepped, "x", WARMUP, 120, [outage]).ok(0.001)
    # growth after the step is still caught
    leaky = series([(t, 190.0 + (4.0 + 0.2 * 190 * (t - 1950) / 3600 if t >= 1950 else 0.0), 1) for t in ts])
    g = report.growth(leaky, "x", WARMUP, 120, [outage])
    assert g.relative is not None and not g.ok(0.10)


def test_a_store_between_compactions_is_judged_by_what_each_compaction_leaves() -> None:
    """RocksDB's files swing up to twice their size between compactions; the envelope sees through it, not past growth.

    Read every 5 s, each 30-s sample its low (``probe.Gauges.watch_state``); three incarnations (faults at 25 and
    45 min), a compaction every 2.5-5 min at a random phase: flat, every seed passes; growing 20 % of the level an
    hour underneath, every seed fails (judged per incarnation without the envelope, some would pass).
    """

    def store(seed: int, per_hour: float) -> list[Sample]:
        rng = random.Random(seed)
        values, low, t_compacted, period = [], math.inf, -rng.uniform(0, 300), rng.uniform(150, 300)
        for i in range(721):
            t = i * 5.0
            if t - t_compacted >= period:
                t_compacted, period = t - rng.uniform(0, 5), rng.uniform(150, 300)
            low = min(low, 12e6 * (1 + per_hour * t / 3600) * (1 + (t - t_compacted) / period))
            if i % 6 == 0:
                values.append((t, low, 1 if t < 1500 else 2 if t < 2700 else 3))
                low = math.inf
        return series(values)

    missed = 0
    for seed in range(40):
        flat = report.growth(store(seed, 0.0), "x", 900, 120, envelope_s=600)
        assert flat.ok(0.10), (seed, flat.relative)
        grows = report.growth(store(seed, 0.2), "x", 900, 120, envelope_s=600)
        assert not grows.ok(0.10), (seed, grows.relative)
        missed += report.growth(store(seed, 0.2), "x", 900, 120).ok(0.10)
    assert missed > 0  # judged per incarnation, without the envelope, some growing stores would pass
