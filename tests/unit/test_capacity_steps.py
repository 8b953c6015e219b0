"""The capacity run's verdict on a step: each bound it names fails the step on its own."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.soak.report import Sample, Step
from tests.soak.test_capacity import judge_step

GOOD = Step(
    rate=10_000,
    began=0,
    ended=600,
    achieved=9_990,
    freshness_p99_s=3.2,
    freshness_samples=3_000,
    lag=(20_000, 21_000),
    polls=(600, 0, 0.4),
    cpu={"speed_jvm": 90.0},
    batch_ms_mean=900.0,
)


def test_a_step_within_every_bound_passes() -> None:
    assert GOOD.failures(5.0, 1.0) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"achieved": 9_000}, "producer sent"),
        ({"freshness_p99_s": 5.5}, "freshness p99"),
        ({"freshness_p99_s": None, "freshness_samples": 0}, "no freshness"),
        ({"lag": (20_000, 80_001)}, "lag grew"),
        ({"lag": (None, 1)}, "no lag reading"),
        ({"polls": (600, 2, 0.4)}, "not 200"),
        ({"polls": (600, 0, 1.5)}, "dashboard p99"),
        ({"polls": (0, 0, None)}, "no dashboard answer"),
    ],
)
def test_each_bound_fails_a_step(change: dict[str, object], named: str) -> None:
    failures = dataclasses.replace(GOOD, **change).failures(5.0, 1.0)  # type: ignore[arg-type]
    assert len(failures) == 1 and named in failures[0], failures


def test_a_step_averages_only_its_own_samples_and_only_those_that_read_a_series() -> None:
    samples = [
        Sample(10, {"batch_ms_mean": 1000.0, "eviction_ms_mean": 700.0, "cpu_machine": 100.0, "speed_lag_records": 0}),
        Sample(20, {"batch_ms_mean": 1200.0, "eviction_ms_mean": None, "cpu_machine": 120.0, "speed_lag_records": 0}),
        Sample(99, {"batch_ms_mean": 9999.0, "eviction_ms_mean": 9999.0}),  # after the step: not its own
    ]
    step = judge_step(8000, 0, 50, (0, 400_000, 50.0), samples, [(5, 2.0)], [(5, "200", 0.03)])
    assert (step.batch_ms_mean, step.eviction_ms_mean, step.cpu["machine"]) == (1100.0, 700.0, 110.0)
    assert math.isnan(step.cpu["speed_jvm"])  # a series no sample read
    assert step.achieved == 8000 and step.lag == (0, 0)
