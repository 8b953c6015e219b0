"""A targeted, short reproduction of one soak fault, measured closely: where the cores go before and after it.

``flock /tmp/trends-services.lock python -m tests.soak.outage --out DIR [--fault cassandra] [--before 120]
[--after 300]`` starts a private Kafka and Cassandra and the speed service under the stack's supervisor (1 s trigger,
as the soak), produces events with live event times at ``--rate`` (2,000/s), and injects one fault after ``--before``
seconds (``cassandra``: stopped for 30 s then started, as the soak does; ``none``: no fault, for a baseline). Every
``--every`` seconds (5) it writes one JSON line to ``DIR/samples.jsonl``:

* the machine: load average, and the share of every CPU state from ``/proc/stat`` (user, system, iowait, steal…);
* every process on the machine with its CPU in the interval (``/proc/<pid>/stat``), ours labelled;
* the threads of the speed JVM and of Cassandra by name (``/proc/<pid>/task``: GC, compaction, RocksDB, tasks…);
* Cassandra's thread pools (``system_views.thread_pools``: active, pending, blocked) and compactions in progress
  (``system_views.sstable_tasks``);
* the speed service: its supervisor's restarts, its consumer lag (/metrics), freshness (as the soak measures it).

Each micro-batch's line of the speed log (Spark's phases and the sink's own timings) is copied to ``DIR/batches.log``
and ``DIR/summary.md`` compares the windows before the fault, during it and each minute after it. Everything it
started is stopped at the end. Not a test: the soak judges; this finds out why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from infra import migrations, topics
from infra.cassandra import make_cluster
from infra.settings import Settings
from stack import control
from stack.services.cassandra import Cassandra
from stack.services.kafka import Kafka
from stack.services.pipeline import SpeedService
from tests.helpers import free_port
from tests.soak.private_stack import private_settings
from tests.soak.probe import Freshness, SteadyProducer, dir_bytes, live_state_bytes, scrape, speed_pids

TICK = os.sysconf("SC_CLK_TCK")
BATCH = re.compile(r"batch (\d+): (\d+) rows in (\d+) ms")
PHASES = re.compile(r"; ms: ([^;]*)")
SINK = re.compile(r"; sink: collect (\d+) ms, cassandra (\d+) ms")
CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def proc_stat(pid: int | str, task: str | None = None) -> tuple[str, int] | None:
    """Return (comm, utime + stime in ticks) of a process (or one of its threads), None if it is gone."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        raw = Path(path).read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return comm, int(fields[11]) + int(fields[12])


def cmd_label(pid: int) -> str:
    """Return a short description of a process: its executable and a telling argument."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    tail = [w for w in words[1:] if not w.startswith("-")]
    main = next((w for w in reversed(tail) if "." in w and "/" not in w and len(w) < 80), "")
    return f"{Path(words[0]).name} {main or ' '.join(tail[:2])[:80]}".strip()


def thread_group(name: str) -> str:
    """Fold a thread's name into its pool (``GC Thread#1`` -> ``GC Thread#``, ``CompactionExecutor:3`` -> ...)."""
    return re.sub(r"\d+", "", name).strip(" -:#") or name


class CpuMeter:
    """CPU of every process on the machine, and of the threads of chosen ones, between two calls."""

    def __init__(self) -> None:
        self.last_total: list[int] | None = None
        self.last_procs: dict[int, int] = {}
        self.last_threads: dict[tuple[int, str], int] = {}
        self.last_t = time.monotonic()

    def read(self, labels: dict[int, str], threads_of: list[int]) -> dict[str, Any]:
        now = time.monotonic()
        dt = max(1e-3, now - self.last_t)
        self.last_t = now
        with open("/proc/stat") as f:
            total = [int(x) for x in f.readline().split()[1:9]]
        machine = {}
        if self.last_total is not None:
            d = [a - b for a, b in zip(total, self.last_total, strict=True)]
            machine = {k: round(100 * v / max(1, sum(d)), 1) for k, v in zip(CPU_STATES, d, strict=True)}
        self.last_total = total
        procs: dict[int, int] = {}
        out: list[tuple[float, int, str]] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            st = proc_stat(entry)
            if st is None:
                continue
            pid = int(entry)
            procs[pid] = st[1]
            prev = self.last_procs.get(pid)
            if prev is not None and st[1] > prev:
                pct = 100 * (st[1] - prev) / TICK / dt
                if pct >= 1:
                    out.append((round(pct, 1), pid, labels.get(pid) or f"{st[0]}: {cmd_label(pid)}"))
        self.last_procs = procs
        threads: dict[str, dict[str, float]] = {}
        seen: dict[tuple[int, str], int] = {}
        for pid in threads_of:
            groups: Counter[str] = Counter()
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    st = proc_stat(pid, task)
                    if st is None:
                        continue
                    seen[(pid, task)] = st[1]
                    prev = self.last_threads.get((pid, task))
                    if prev is not None:
                        groups[thread_group(st[0])] += 100 * (st[1] - prev) / TICK / dt
            top = {k: round(v, 1) for k, v in groups.most_common(8) if v >= 1}
            threads[labels.get(pid, str(pid))] = top
        self.last_threads = seen
        return {"machine": machine, "procs": sorted(out, reverse=True)[:15], "threads": threads}


class CassandraPools:
    """Cassandra's own view of its work: thread pools and compactions (virtual tables), over a session that
    reconnects by itself after the node comes back."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cluster: Any = None
        self.sess: Any = None

    def read(self) -> dict[str, Any]:
        try:
            if self.sess is None:
                self.cluster = make_cluster(self.settings, connect_timeout=2)
                self.sess = self.cluster.connect()
            pools = {
                r.name: [r.active_tasks, r.pending_tasks, r.blocked_tasks, r.completed_tasks]
                for r in self.sess.execute("SELECT * FROM system_views.thread_pools", timeout=3)
                if r.active_tasks
                or r.pending_tasks
                or r.blocked_tasks
                or r.name in {"CompactionExecutor", "MemtableFlushWriter", "MutationStage", "Native-Transport-Requests"}
            }
            tasks = [
                f"{r.kind} {r.keyspace_name}.{r.table_name} {r.progress}/{r.total} {r.unit}"
                for r in self.sess.execute("SELECT * FROM system_views.sstable_tasks", timeout=3)
            ]
        except Exception as exc:  # noqa: BLE001 - the node is down (the fault): recorded as such
            return {"error": type(exc).__name__}
        return {"pools": pools, "tasks": tasks}

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()


def make_settings(root: Path, trigger_s: float, lateness_s: int) -> Settings:
    """The soak's private stack settings (tests/soak/conftest.py), without Airflow and the API."""
    local = root / "spark-local"
    local.mkdir(parents=True, exist_ok=True)
    return private_settings(
        root,
        kafka={"partitions": 4},
        spark={"conf": {"spark.local.dir": str(local)}},
        speed={"trigger_seconds": trigger_s, "allowed_lateness_s": lateness_s, "query_name": "soak"},
        metrics={"speed_port": free_port()},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.outage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fault", choices=["cassandra", "none"], default="cassandra")
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--before", type=float, default=120)
    parser.add_argument("--after", type=float, default=300)
    parser.add_argument("--every", type=float, default=5)
    parser.add_argument("--trigger", type=float, default=1.0)
    parser.add_argument("--lateness", type=int, default=600)
    parser.add_argument("--down-s", type=float, default=30)
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    settings = make_settings(out / "stack", args.trigger, args.lateness)
    speed = SpeedService(settings)
    kafka, cassandra = Kafka(settings, 0), Cassandra(settings, 0)
    events: list[tuple[float, str]] = []
    base = [time.monotonic()]  # the events' clock: from the start of production once it began

    def mark(what: str) -> None:
        events.append((round(time.monotonic() - base[0], 1), what))
        print(f"{events[-1][0]:7.1f} s  {what}", flush=True)

    producer = None
    fresh = None
    pools = CassandraPools(settings)
    try:
        control.up(settings, ["kafka", "cassandra"])
        topics.ensure_topics(settings.kafka)
        migrations.migrate(settings)
        mark("kafka and cassandra up")
        fresh = Freshness(settings)
        producer = SteadyProducer(settings, args.rate, fresh.add)
        control.up(settings, ["speed"])
        mark("speed service up")
        producer.start()
        fresh.start()
        t0 = base[0] = time.monotonic()
        mark("producing")
        seen_upto = 0
        meter = CpuMeter()
        samples = (out / "samples.jsonl").open("w")
        log_offset = 0
        batches_log = (out / "batches.log").open("w")
        fault_thread: threading.Thread | None = None
        end = args.before + (args.down_s + 30 if args.fault != "none" else 0) + args.after
        while (t := time.monotonic() - t0) < end:
            if fault_thread is None and t >= args.before and args.fault == "cassandra":

                def outage() -> None:
                    mark("cassandra stopping")
                    control.down(settings, ["cassandra"])
                    mark("cassandra stopped")
                    time.sleep(args.down_s)
                    mark("cassandra starting")
                    control.up(settings, ["cassandra"])
                    mark("cassandra accepts clients")

                fault_thread = threading.Thread(target=outage, daemon=True)
                fault_thread.start()
            driver, jvm = speed_pids(speed)
            labels = {os.getpid(): "probe (producer, freshness, sampler)"}
            for pid, name in ((driver, "speed driver"), (jvm, "speed JVM"), (kafka.pid(), "kafka"),
                              (cassandra.pid(), "cassandra")):  # fmt: skip
                if pid is not None:
                    labels[pid] = name
            cpu = meter.read(labels, [p for p in (jvm, cassandra.pid()) if p is not None])
            state = speed.supervisor_state()
            metrics = scrape(f"http://127.0.0.1:{settings.metrics.speed_port}/metrics")
            with speed.stdout_file.open("rb") as f:
                f.seek(log_offset)
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            log_offset += cut
            lines = chunk[:cut].decode(errors="replace").splitlines()
            batches = []
            for line in lines:
                if "batch " in line and " rows in " in line:
                    batches_log.write(f"{t:7.1f} {line}\n")
                    m = BATCH.search(line)
                    if m:
                        ph, sk = PHASES.search(line), SINK.search(line)
                        parts = (p.rsplit(" ", 1) for p in (ph[1] if ph else "").split(", ") if p)
                        batches.append(
                            {
                                "id": int(m[1]),
                                "rows": int(m[2]),
                                "ms": int(m[3]),
                                "phases": {k: int(v) for k, v in parts},
                                "collect": int(sk[1]) if sk else None,
                                "cassandra": int(sk[2]) if sk else None,
                            }
                        )
                elif any(w in line for w in ("ERROR", "WARN", "Exception", "restart")):
                    batches_log.write(f"{t:7.1f} ! {line[:300]}\n")
            batches_log.flush()
            with fresh._lock:
                pending = len(fresh.pending)
                oldest = min(fresh.pending, default=None)
            sample = {
                "t": round(t, 1),
                "load": os.getloadavg(),
                **cpu,
                "cassandra": pools.read(),
                "restarts": state.restarts if state else None,
                "driver": driver,
                "lag": metrics.get("trends_speed_consumer_lag_records"),
                "batches": batches,
                "fresh_seen": [round(lat, 2) for _ts, lat in fresh.seen[seen_upto:]],
                "fresh_pending": pending,
                "fresh_oldest_wait": round(time.time() - oldest, 1) if oldest else None,
                "events": [e for e in events if e[0] >= t - args.every],
                "checkpoint_bytes": dir_bytes(Path(settings.checkpoint_root) / settings.speed.query_name),
                "checkpoint_files": sum(
                    len(f) for _r, _d, f in os.walk(Path(settings.checkpoint_root) / settings.speed.query_name)
                ),
                "state_bytes": live_state_bytes(out / "stack" / "spark-local"),
            }
            seen_upto = len(sample["fresh_seen"]) + seen_upto
            samples.write(json.dumps(sample) + "\n")
            samples.flush()
            b = batches
            print(
                f"{t:6.0f}s load {sample['load'][0]:.1f} steal {cpu['machine'].get('steal', '-')} "
                f"batches {len(b)} mean {statistics.mean([x['ms'] for x in b]) if b else 0:.0f} ms "
                f"lag {sample['lag']} restarts {sample['restarts']} pend {pending} "
                f"top {cpu['procs'][:4]}",
                flush=True,
            )
            time.sleep(max(0.0, args.every - (time.monotonic() - t0 - t)))
        samples.close()
        batches_log.close()
        (out / "events.json").write_text(json.dumps(events))
        summarize(out, args.before, events)
    finally:
        if producer is not None:
            producer.stop(60)
        if fresh is not None:
            fresh.stop()
        pools.close()
        control.down(settings, ["speed", "kafka", "cassandra"])
        print("stopped the private stack", flush=True)


def summarize(out: Path, before: float, events: list[tuple[float, str]]) -> str:
    """Write ``summary.md``: per window (before the fault, each minute after), batches, phases, CPU."""
    samples = [json.loads(line) for line in (out / "samples.jsonl").open()]
    if not samples:
        return ""
    windows: list[tuple[str, float, float]] = [("before", 30, before)]
    t_end = samples[-1]["t"]
    t = before
    while t < t_end:
        windows.append((f"{t:.0f}-{t + 60:.0f} s", t, t + 60))
        t += 60
    rows = []
    for name, lo, hi in windows:
        sel = [s for s in samples if lo <= s["t"] < hi]
        if not sel:
            continue
        batches = [b for s in sel for b in s["batches"] if b["rows"] > 0]
        procs: dict[str, float] = defaultdict(float)
        for s in sel:
            for pct, _pid, label in s["procs"]:
                procs[label.split(":")[0] if ":" in label else label] += pct / len(sel)
        phases: dict[str, list[int]] = defaultdict(list)
        for b in batches:
            for k, v in b["phases"].items():
                phases[k].append(v)
        steal = statistics.mean([s["machine"].get("steal", 0) for s in sel if s["machine"]] or [0])
        idle = statistics.mean([s["machine"].get("idle", 0) for s in sel if s["machine"]] or [0])
        rows.append(
            f"| {name} | {len(batches)} | "
            f"{statistics.mean([b['ms'] for b in batches]) if batches else 0:.0f} / "
            f"{max([b['ms'] for b in batches], default=0)} | "
            + ", ".join(f"{k} {statistics.mean(v):.0f}" for k, v in phases.items() if k != "triggerExecution")
            + f" | {statistics.mean([b['collect'] for b in batches if b['collect'] is not None] or [0]):.0f} / "
            f"{statistics.mean([b['cassandra'] for b in batches if b['cassandra'] is not None] or [0]):.0f} | "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(procs.items(), key=lambda kv: -kv[1])[:6])
            + f" | {statistics.mean([s['load'][0] for s in sel]):.1f} | {idle:.0f} / {steal:.0f} |"
        )
    text = "\n".join(
        [
            "| window | batches | ms mean / max | Spark phases, mean ms | sink collect / cassandra, mean ms "
            "| CPU % of a core, top processes | load 1m | idle / steal % |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "events: " + "; ".join(f"{t:.0f} s {w}" for t, w in events),
            "",
        ]
    )
    (out / "summary.md").write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
