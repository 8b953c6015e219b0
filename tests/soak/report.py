"""The soak's record and its judgement: samples every 30 s, growth per hour, fault recovery, plots and ``soak.md``.

Pure functions over the samples (no services), so ``tests/unit/test_soak_report.py`` checks that the bound catches a
series growing 20 % an hour, ignores a process restarted by a fault, and that a freshness spike outside any fault
fails the soak.

**The growth bound.** A series grows by its least-squares slope over the samples after the warm-up, relative to its
mean level over the same samples, per hour. A process a fault restarted starts again from a lower RSS and warms up:
its samples are grouped by process id and the slope is the pooled within-group slope (each incarnation keeps its own
intercept), and the first ``settle_s`` of a restarted incarnation are left out. A series may also step once at a
fault and stay at its new level (the API workers' allocator keeps what a reconnection touched): its samples get a
new intercept after such a fault, the fault and ``settle_s`` after it left out; what a fault adds each time is bounded
by ``tests/soak/test_api_outages.py``, which repeats the fault. A store on disk (RocksDB's files, which double
between compactions) is one series across restarts, judged by its lowest reading per 10 minutes. A slope rather than
end minus start:
a 30-s sample lands anywhere in a JVM's garbage-collection cycle, and one unlucky end point would decide the verdict.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Sample:
    """One reading of every series, ``t`` seconds after the steady phase began."""

    t: float
    values: dict[str, float | None] = field(default_factory=dict)
    pids: dict[str, int | None] = field(default_factory=dict)  # series -> process id of the reading (incarnation)


@dataclass(frozen=True)
class Spec:
    """A recorded series: label, unit, plot group, and whether the growth bound applies to it."""

    name: str
    label: str
    unit: str  # "MiB", "bytes", "s", "ms", "%", "records"
    group: str
    bounded: bool = False
    steps_at: tuple[str, ...] = ()  # fault kinds after which the series is judged at its new level
    # > 0: judged by its lowest sample in each window of this many seconds (a store on disk between compactions)
    envelope_s: float = 0.0
    settle_s: float | None = None  # a restarted process's warm-up left out, when longer than the soak's default


@dataclass(frozen=True)
class Growth:
    """A series' growth after the warm-up."""

    name: str
    first: float | None
    last: float | None
    level: float | None
    per_hour: float | None  # slope, units per hour
    relative: float | None  # per_hour / level
    samples: int

    def ok(self, bound: float) -> bool:
        """Tell whether the series grew by less than ``bound`` (a fraction of its level) per hour."""
        return self.relative is not None and self.relative < bound


@dataclass(frozen=True)
class Fault:
    """One injected fault: when (s after the steady phase began), what, and how long freshness took to recover."""

    t: float
    kind: str
    detail: str
    recovered_s: float | None = None
    ended: float | None = None  # when the fault's action returned (e.g. Cassandra accepted clients again)


def growth(
    samples: Sequence[Sample],
    name: str,
    warmup_s: float,
    settle_s: float,
    steps: Sequence[Fault] = (),
    envelope_s: float = 0.0,
) -> Growth:
    """Return the growth of series ``name`` after ``warmup_s``.

    :arg settle_s: the first samples of a restarted incarnation (a pid first seen after the series' first one)
        within this of its first sample are left out: a restarted JVM refilling its heap is not a leak.
    :arg steps: faults the series may step at: from each one's start to ``settle_s`` after its end is left out,
        and the samples after it are a group of their own (as a new incarnation).
    :arg envelope_s: when > 0, the series is a store that outlives its process (a restart reopens it from the
        checkpoint): its incarnations are one group (each one's first ``settle_s`` still left out), reduced to its
        lowest sample per window of this length. RocksDB's files on disk double between compactions and a 30-s
        sample lands anywhere in that cycle; what is left after each compaction is what would grow.
    """
    spans = [(f.t, (f.ended if f.ended is not None else f.t) + settle_s) for f in steps]
    first_seen: dict[int | None, float] = {}
    for s in samples:
        if s.values.get(name) is not None:
            first_seen.setdefault(s.pids.get(name), s.t)
    groups: dict[tuple[int | None, int], list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        v = s.values.get(name)
        if v is None or s.t < warmup_s:
            continue
        pid = s.pids.get(name)
        began = first_seen[pid]
        if began > min(first_seen.values()) and s.t - began < settle_s:
            continue
        if any(start <= s.t < end for start, end in spans):
            continue
        # A store outlives the process that writes it (a restart reopens it from the checkpoint): one series.
        groups[(pid if envelope_s <= 0 else None, sum(end <= s.t for _, end in spans))].append((s.t, v))
    if envelope_s > 0:
        groups = {key: lows(g, envelope_s) for key, g in groups.items()}
    points = [p for g in groups.values() for p in g]
    if not points:
        return Growth(name, None, None, None, None, None, 0)
    level = sum(v for _, v in points) / len(points)
    num = den = 0.0
    for g in groups.values():
        if len(g) < 2:
            continue
        tm = sum(t for t, _ in g) / len(g)
        vm = sum(v for _, v in g) / len(g)
        num += sum((t - tm) * (v - vm) for t, v in g)
        den += sum((t - tm) ** 2 for t, _ in g)
    if den == 0:
        return Growth(name, points[0][1], points[-1][1], level, None, None, len(points))
    per_hour = num / den * 3600
    relative = per_hour / level if level > 0 else (0.0 if per_hour <= 0 else math.inf)
    ordered = sorted(points)
    return Growth(name, ordered[0][1], ordered[-1][1], level, per_hour, relative, len(points))


def lows(points: list[tuple[float, float]], window_s: float) -> list[tuple[float, float]]:
    """Return the lowest of ``points`` (time, value) in each ``window_s`` from the first.

    A window cut short (by a restart's settling, or the end) may hold no compaction: its low is no low, it is left out.
    """
    windows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t, v in points:
        windows[int((t - points[0][0]) // window_s)].append((t, v))
    return [min(w, key=lambda p: p[1]) for w in windows.values() if w[-1][0] - w[0][0] >= window_s / 2]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the ``q`` quantile (nearest rank) of ``values``, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def freshness_recovery(
    windows: Sequence[tuple[float, float | None]], faults: Sequence[Fault], goal_s: float, cap_s: float
) -> list[Fault]:
    """Return the faults with the time until the first 30-s window after each whose freshness p99 met the goal.

    ``windows`` are (window end, p99 of the samples produced in it). A fault not recovered within ``cap_s`` (nor
    before the next fault) keeps ``recovered_s`` None.
    """
    out = []
    for i, f in enumerate(faults):
        limit = min(f.t + cap_s, faults[i + 1].t if i + 1 < len(faults) else math.inf)
        found = next(
            (end - f.t for end, p99 in windows if f.t < end <= limit and p99 is not None and p99 <= goal_s), None
        )
        out.append(Fault(f.t, f.kind, f.detail, found, f.ended))
    return out


def outside_faults(
    stamped: Sequence[tuple[float, float]], faults: Sequence[Fault], warmup_s: float, cap_s: float
) -> list[float]:
    """Return the freshness latencies of samples produced after warm-up and outside every fault's impact window.

    A fault's impact window is [its start, start + its recovery time] (``cap_s`` when it did not recover), so a
    fault that never recovers leaves its samples out only up to the cap — what follows counts against the goal.
    """
    spans = [(f.t, f.t + (f.recovered_s if f.recovered_s is not None else cap_s)) for f in faults]
    return [lat for t, lat in stamped if t >= warmup_s and not any(a <= t <= b for a, b in spans)]


def scaled(value: float | None, unit: str) -> str:
    """Format a value in its unit (bytes as MiB)."""
    if value is None:
        return "-"
    if unit == "bytes":
        return f"{value / 2**20:,.1f} MiB"
    if unit in {"MiB", "ms", "records", "%"}:
        return f"{value:,.0f} {unit}" if unit != "records" else f"{value:,.0f}"
    return f"{value:,.2f} {unit}"


def plot(samples: Sequence[Sample], specs: Sequence[Spec], faults: Sequence[Fault], out_dir: Path) -> list[Path]:
    """Draw one PNG per group of series over time (minutes), faults as vertical lines; return the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[Spec]] = defaultdict(list)
    for spec in specs:
        groups[spec.group].append(spec)
    files = []
    for group, members in groups.items():
        fig, axes = plt.subplots(len(members), 1, figsize=(9, 2.1 * len(members) + 0.6), sharex=True, squeeze=False)
        for ax, spec in zip(axes[:, 0], members, strict=True):
            pts = [(s.t / 60, s.values.get(spec.name)) for s in samples]
            xs = [x for x, y in pts if y is not None]
            ys = [y / 2**20 if spec.unit == "bytes" else y for _, y in pts if y is not None]
            ax.plot(xs, ys, marker=".", linewidth=1)
            ax.set_ylabel("MiB" if spec.unit == "bytes" else spec.unit)
            ax.set_title(spec.label, fontsize=9, loc="left")
            for f in faults:
                ax.axvline(f.t / 60, color="tab:red", alpha=0.35, linewidth=1)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("minutes into the soak (red: a fault)")
        fig.tight_layout()
        path = out_dir / f"soak-{group}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        files.append(path)
    return files


@dataclass
class Step:
    """One step of the capacity run, judged over its second half (the speed layer's dedupe state fills in its first).

    :arg achieved: events/s the producer sent over the judged half.
    :arg lag: the speed consumer's lag (records) at the first and last sample of the judged half.
    :arg polls: the dashboards' answers in the judged half: how many, how many not 200, their p99 (s).
    :arg cpu: mean CPU (% of one core) of each process series over the judged half.
    """

    rate: float
    began: float
    ended: float
    achieved: float
    freshness_p99_s: float | None
    freshness_samples: int
    lag: tuple[float | None, float | None]
    polls: tuple[int, int, float | None]
    cpu: dict[str, float]
    batch_ms_mean: float | None
    eviction_ms_mean: float | None = None  # the dedupe's eviction per batch, task ms summed over its partitions

    def failures(self, freshness_goal_s: float, poll_p99_goal_s: float) -> list[str]:
        """Return what this step missed (empty: the stack sustained its rate)."""
        out = []
        if self.achieved < 0.95 * self.rate:
            out.append(f"the producer sent {self.achieved:,.0f}/s")
        if self.freshness_p99_s is None or self.freshness_samples == 0:
            out.append("no freshness sample seen")
        elif self.freshness_p99_s > freshness_goal_s:
            out.append(f"freshness p99 {self.freshness_p99_s:.1f} s")
        first, last = self.lag
        if first is None or last is None:
            out.append("no lag reading")
        elif last - first > self.rate * freshness_goal_s:
            out.append(f"lag grew from {first:,.0f} to {last:,.0f} records")
        n, bad, p99 = self.polls
        if n == 0:
            out.append("no dashboard answer")
        elif bad:
            out.append(f"{bad} of {n} dashboard answers not 200")
        elif p99 is None or p99 > poll_p99_goal_s:
            out.append(f"dashboard p99 {p99} s")
        return out
