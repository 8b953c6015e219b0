"""What the soak drives and reads while the stack runs: the producer, the dashboards' poller, freshness, the gauges.

Every reader tolerates the faults it lives through (a stopped Cassandra, a restarting broker or API worker): a
reading that fails is recorded as missing (None), never as zero.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer

from infra.cassandra import session, table
from infra.settings import Settings
from stack.airflow.config import SCHEDULER
from stack.airflow.service import Airflow
from stack.services.cassandra import Cassandra
from stack.services.kafka import Kafka
from stack.services.pipeline import ApiService, SpeedService
from views.event import EVENT_SCHEMA_VERSION, Event

logger = logging.getLogger(__name__)

HOUR = timedelta(hours=1)
ORIGINS = ("JFK", "LAX", "SFO", "ORD", "ATL")
BATCH_LINE = re.compile(rb"batch \d+: (\d+) rows in (\d+) ms[^\n]*")
# The dedupe's (updates/removals/commit) ms of a batch line, summed over its state partitions' tasks: removals is
# the eviction, which scans every id the state holds once a batch.
DEDUPE_MS = re.compile(rb"dedupe (\d+)/(\d+)/(\d+)")


def batch_lines(log: bytes) -> list[tuple[int, int, int | None]]:
    """Return (rows, ms, the dedupe's eviction ms or None) of each batch line of the speed job's log."""
    out: list[tuple[int, int, int | None]] = []
    for m in BATCH_LINE.finditer(log):
        dedupe = DEDUPE_MS.search(m[0])
        out.append((int(m[1]), int(m[2]), int(dedupe[2]) if dedupe else None))
    return out


# What a dashboard asks, round-robin: the numbers, the trend, the chart (dashboard_refresh_s apart per viewer).
DASHBOARD = (
    "/api/v1/count?last=15m",
    "/api/v1/trending?last=1h",
    "/api/v1/top?last=1h&limit=10",
    "/api/v1/series?last=1h&resolution=minute",
    "/api/v1/users?last=1h",
    "/api/v1/count?last=6h&slice=origin%3DJFK",
)


def hour_of(ts_ms: int) -> datetime:
    """Return the UTC hour an event time (Unix ms) falls in."""
    return datetime.fromtimestamp(ts_ms // 3_600_000 * 3600, UTC)


def dir_bytes(path: Path, name_contains: str = "") -> int | None:
    """Return the bytes of the files under ``path`` (only in folders whose name holds ``name_contains``).

    A file hard-linked twice counts once: RocksDB's snapshot checkpoints (and Cassandra's snapshots) are hard
    links to the live files, and counting them twice made the speed job's state swing by half each minute.
    """
    if not path.exists():
        return None
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, _dirs, files in os.walk(path):
        if name_contains and name_contains not in root:
            continue
        for f in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(root, f))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


class SoakEvents:
    """The soak's events as wire bytes, cheap enough for tens of thousands a second from one Python thread.

    Building an :class:`~views.event.Event` costs ~25-45 µs: at the capacity run's rates that alone would take most
    of a core from the stack it measures. The item, user, value and origin of a pool of events are drawn once and
    written once by the model (so the bytes are the model's); each event then only formats its id and time in front.
    ``tests/unit/test_soak_events.py`` checks that every event reads back as the model's own.
    """

    def __init__(self, seed: int = 29, pool: int = 1 << 15) -> None:
        rng = random.Random(seed)
        items = [f"#s{i}" for i in range(500)]
        weights = [1 / (i + 1) for i in range(len(items))]
        epoch = datetime(2000, 1, 1, tzinfo=UTC)
        self.tails: list[bytes] = []
        self.keys: list[bytes] = []
        for item in rng.choices(items, weights, k=pool):
            e = Event(
                id="x",
                ts=epoch,
                item=item,
                user=f"u{rng.randrange(20_000)}",
                value=round(rng.lognormvariate(3, 1), 3),
                dims={"origin": rng.choice(ORIGINS)},
            )
            wire = e.to_json()
            head = b'{"v":%d,"id":"x","ts":"2000-01-01T00:00:00.000Z",' % e.v
            assert wire.startswith(head), wire
            self.tails.append(wire[len(head) :])
            self.keys.append(item.encode())

    @staticmethod
    def ts_text(ts_ms: int) -> bytes:
        """Return the wire form of an event time (UTC, milliseconds, ``Z``)."""
        t = datetime.fromtimestamp(ts_ms // 1000, UTC)
        return b"%s.%03dZ" % (t.strftime("%Y-%m-%dT%H:%M:%S").encode(), ts_ms % 1000)

    def wire(self, n: int, ts_text: bytes) -> tuple[bytes, bytes]:
        """Return event number ``n`` with the given time: its wire JSON and key (its item)."""
        k = n % len(self.tails)
        return b'{"v":%d,"id":"soak-%d","ts":"%s",%s' % (EVENT_SCHEMA_VERSION, n, ts_text, self.tails[k]), self.keys[k]


class SteadyProducer:
    """Produce events with live event times at a steady rate; count what the broker acknowledged, per hour.

    Idempotent with acks=all and a 10-minute delivery timeout, so a broker restart delays deliveries instead of
    failing or duplicating them. Every 100 ms one event's time is handed to :class:`Freshness`. The rate may change
    while it runs (:meth:`set_rate`, the capacity run's steps).
    """

    def __init__(self, settings: Settings, rate: float, on_sample: Any) -> None:
        self.settings = settings
        self.on_sample = on_sample
        self.acked: Counter[datetime] = Counter()
        self.acked_minutes: Counter[datetime] = Counter()  # the same, per event-time minute
        self.failed: list[str] = []
        self.sent = 0
        self.last_ts_ms = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)
        self._events = SoakEvents()
        # (monotonic time, events due then, events/s): one tuple, swapped whole, so the producing thread never reads
        # a new rate with the old time it counts from
        self._pace = (0.0, 0, rate)
        self.began = 0.0
        self.ended = 0.0
        self.producer = Producer(
            {
                **settings.kafka.client_config(),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.timeout.ms": 600_000,
            }
        )

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            ts_ms = msg.timestamp()[1]
            self.acked[hour_of(ts_ms)] += 1
            self.acked_minutes[datetime.fromtimestamp(ts_ms // 60_000 * 60, UTC)] += 1
        else:
            self.failed.append(str(err))

    def send(self, ts: datetime, n: int = 1) -> None:
        """Produce ``n`` events with event time ``ts`` (record timestamp = event time, keyed by item)."""
        ts_ms = int(ts.timestamp() * 1000)
        text = self._events.ts_text(ts_ms)
        produce, topic, delivered = self.producer.produce, self.settings.kafka.events_topic, self._delivered
        for _ in range(n):
            value, key = self._events.wire(self.sent, text)
            while True:
                try:
                    produce(topic, value, key, timestamp=ts_ms, on_delivery=delivered)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.sent += 1
        self.last_ts_ms = max(self.last_ts_ms, ts_ms)

    def seed(self, start: datetime, end: datetime, count: int) -> None:
        """Produce ``count`` events over ``[start, end)`` in event-time order (the hour before the soak)."""
        span_ms = int((end - start).total_seconds() * 1000)
        for k in range(count):
            self.send(start + timedelta(milliseconds=span_ms * k // count))
            if k % 1000 == 0:
                self.producer.poll(0)
        assert self.producer.flush(300) == 0, "the seed was not delivered within 300 s"

    def start(self) -> None:
        self.began = time.monotonic()
        self._pace = (self.began, 0, self.rate)
        self._thread.start()

    @property
    def rate(self) -> float:
        """Return the events/s produced now."""
        return self._pace[2]

    def set_rate(self, rate: float) -> None:
        """Produce at ``rate`` events/s from now on (what is due so far stays due)."""
        t0, n0, before = self._pace
        now = time.monotonic()
        self._pace = (now, n0 + int((now - t0) * before), rate)

    def _run(self) -> None:
        done = 0
        next_sample = 0.0
        while not self._stop.is_set():
            mono = time.monotonic()
            t0, n0, rate = self._pace
            due = n0 + int((mono - t0) * rate)
            now = datetime.now(UTC)
            if done < due:
                self.send(now, due - done)
                done = due
            elapsed = mono - self.began
            if elapsed >= next_sample and done:
                self.on_sample(now.timestamp())
                next_sample += 0.1
            self.producer.poll(0)
            time.sleep(0.01)
        self.ended = time.monotonic()

    def stop(self, timeout_s: float = 600) -> int:
        """Stop producing and wait for every delivery report; return how many are still undelivered."""
        self._stop.set()
        self._thread.join(30)
        return int(self.producer.flush(timeout_s))

    @property
    def achieved(self) -> float:
        """Return the events/s sent during the steady phase (the seed excluded)."""
        seconds = (self.ended or time.monotonic()) - self.began
        return self.sent_steady / seconds if seconds > 0 else 0.0

    sent_steady = 0  # set by the test after the seed (sent - seed)


class Freshness:
    """Time from an event's production until the speed view's newest event time reaches it (as bench/speed_bench.py).

    The producer hands in one event time every 100 ms; the speed layer's progress row is polled every 200 ms.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pending: list[float] = []
        self.seen: list[tuple[float, float]] = []  # (event time, latency s)
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-freshness", daemon=True)

    def add(self, ts: float) -> None:
        with self._lock:
            self.pending.append(ts)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        with session(self.settings) as sess:
            stmt = sess.prepare(f"SELECT newest_event_ts FROM {table(self.settings, 'speed_progress')} WHERE query = ?")
            while not self._stop.is_set():
                try:
                    row = sess.execute(stmt, (self.settings.speed.query_name,), timeout=5).one()
                except Exception:  # noqa: BLE001 - Cassandra stopped by a fault: the samples wait
                    self.errors += 1
                    time.sleep(1)
                    continue
                now = time.time()
                if row is not None and row.newest_event_ts is not None:
                    newest = row.newest_event_ts.replace(tzinfo=UTC).timestamp()
                    with self._lock:
                        reached = [t for t in self.pending if t <= newest]
                        self.pending = [t for t in self.pending if t > newest]
                    self.seen.extend((t, now - t) for t in reached)
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


class Poller:
    """Dashboards hitting the API: one request every ``every_s``, round-robin over :data:`DASHBOARD`."""

    def __init__(self, url: str, every_s: float = 0.5, *, fresh_connections: bool = False) -> None:
        self.url = url
        self.every_s = every_s
        # A connection per request reaches every worker (the kernel spreads new connections); one kept alive stays
        # with one worker, as a browser tab does.
        self.fresh_connections = fresh_connections
        self.statuses: Counter[str] = Counter()
        self.answers: list[tuple[float, str, float]] = []  # (monotonic time sent, status, seconds) of each request
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import httpx

        fresh = {"limits": httpx.Limits(max_keepalive_connections=0)} if self.fresh_connections else {}
        with httpx.Client(base_url=self.url, timeout=10, **fresh) as client:
            i = 0
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    status = str(client.get(DASHBOARD[i % len(DASHBOARD)]).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.statuses[status] += 1
                self.answers.append((sent, status, time.monotonic() - sent))
                i += 1
                time.sleep(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def scrape(url: str) -> dict[str, float]:
    """Return the unlabelled and labelled samples of a /metrics page by metric name (labels summed); {} on error."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def rss_split(pid: int) -> tuple[float, float] | None:
    """Return a process's resident memory as (anonymous, file-backed) MiB, from ``/proc/<pid>/status``.

    Anonymous is the heap and native memory; file-backed is mapped files (a broker's segment indexes, jars).
    """
    fields: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                fields[key] = float(rest.split()[0]) / 1024  # kB
    if "RssAnon" not in fields or "RssFile" not in fields:
        return None
    return fields["RssAnon"], fields["RssFile"] + fields.get("RssShmem", 0.0)


def api_workers(api: ApiService) -> list[psutil.Process]:
    """Return the uvicorn worker processes of the API (spawned children; the resource tracker is not one)."""
    master = api.pid()
    if master is None:
        return []
    with contextlib.suppress(psutil.Error):
        return [c for c in psutil.Process(master).children() if "spawn_main" in " ".join(c.cmdline())]
    return []


def resident_mib(proc: psutil.Process) -> float | None:
    """Return a process's RSS in MiB; None for one that is gone, or a zombie not reaped yet.

    A process SIGKILLed a moment before reads 0 until its parent reaps it: the fifth soak recorded the speed JVM at
    0 MiB under its old pid, and that one sample turned its fitted growth from +10 %/h to -23 %/h.
    """
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        rss = proc.memory_info().rss
    except psutil.Error:
        return None
    return rss / 2**20 if rss > 0 else None


def live_state_bytes(spark_local_dir: Path) -> int | None:
    """Return the RocksDB state of the running speed job, None before it has one.

    The speed job's temp folder is the newest that holds state stores: the hourly batch job's driver shares the
    local dir (its folder has none), and a SIGKILLed speed job leaves its own behind.
    """
    if not spark_local_dir.exists():
        return None
    runs = sorted((p for p in spark_local_dir.glob("spark-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    stateful = [p for p in runs if any(p.glob("StateStoreId*"))]
    return dir_bytes(stateful[-1], "StateStoreId") if stateful else None


def speed_pids(speed: SpeedService) -> tuple[int | None, int | None]:
    """Return the speed job's driver (Python) and its JVM, or None for one not running."""
    state = speed.supervisor_state()
    driver = state.child_pid if state is not None else None
    if driver is None or not psutil.pid_exists(driver):
        return None, None
    with contextlib.suppress(psutil.Error):
        jvms = [c.pid for c in psutil.Process(driver).children(recursive=True) if c.name() == "java"]
        return driver, (jvms[0] if jvms else None)
    return None, None


class Gauges:
    """Read every series of one 30-s sample: processes' RSS and CPU, folders, caches, batch durations, lag."""

    def __init__(self, settings: Settings, spark_local_dir: Path) -> None:
        self.settings = settings
        self.spark_local_dir = spark_local_dir
        self.speed = SpeedService(settings)
        self.api = ApiService(settings)
        self.airflow = Airflow(settings)
        self.kafka = Kafka(settings, 0)
        self.cassandra = Cassandra(settings, 0)
        self._procs: dict[int, psutil.Process] = {}
        self._log_offset = 0
        self._cpu_times = psutil.cpu_times()
        self._state_low: int | None = None  # the RocksDB state's lowest reading since the last sample
        self._state_watched = 0.0

    def watch_state(self, every_s: float = 5.0) -> None:
        """Read the RocksDB state every ``every_s`` between samples and keep its low (call it often).

        Its files double between compactions; a sample's low is what the last compaction left, which the growth
        bound judges (``report.growth``'s ``envelope_s``) rather than a reading anywhere in that cycle.
        """
        now = time.monotonic()
        if now - self._state_watched < every_s:
            return
        self._state_watched = now
        live = live_state_bytes(self.spark_local_dir)  # not the whole local dir: only the state is watched
        if live is not None and (self._state_low is None or live < self._state_low):
            self._state_low = live

    def _proc(self, pid: int) -> psutil.Process:
        if pid not in self._procs:
            proc = psutil.Process(pid)
            proc.cpu_percent(None)  # the first call starts the interval
            self._procs[pid] = proc
        return self._procs[pid]

    def api_workers(self) -> list[psutil.Process]:
        return api_workers(self.api)

    def speed_pids(self) -> tuple[int | None, int | None]:
        return speed_pids(self.speed)

    @staticmethod
    def _descendants(pid: int | None) -> list[int | None]:
        if pid is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        return []

    def processes(self) -> dict[str, list[int]]:
        """Return the processes of each series (a series' RSS and CPU are summed over its processes)."""
        driver, jvm = self.speed_pids()
        scheduler = self.airflow.component_pid(SCHEDULER)
        found: dict[str, list[int | None]] = {
            "speed_driver": [driver],
            "speed_jvm": [jvm],
            "api_master": [self.api.pid()],
            "api_workers": [w.pid for w in self.api_workers()],
            "scheduler": [scheduler],
            "airflow_tasks": self._descendants(scheduler),  # the hourly recompute: task runners and Spark's JVM
            "kafka": [self.kafka.pid()],
            "cassandra": [self.cassandra.pid()],
        }
        return {k: [p for p in v if p is not None] for k, v in found.items()}

    def batch_durations(self) -> list[tuple[int, int, int | None]]:
        """Return (rows, ms, the dedupe's eviction ms) of the micro-batches the speed job logged since the last call.

        The eviction's ms is summed over the state partitions' tasks (None: the line has no dedupe figures).
        """
        log = self.speed.stdout_file
        if not log.exists():
            return []
        with log.open("rb") as f:
            f.seek(self._log_offset)
            chunk = f.read()
        cut = chunk.rfind(b"\n") + 1
        self._log_offset += cut
        return batch_lines(chunk[:cut])

    def state_bytes(self) -> tuple[int | None, int | None]:
        """Return the RocksDB state of the running speed job and the whole local dir (leftovers of killed runs)."""
        root = self.spark_local_dir
        if not root.exists():
            return None, None
        return live_state_bytes(root), dir_bytes(root)

    def _machine_cpu(self) -> float | None:
        """Return the CPU every process used since the last call, in % of one core (steal and iowait excluded)."""
        now = psutil.cpu_times()
        before, self._cpu_times = self._cpu_times, now
        busy = ("user", "nice", "system", "irq", "softirq")  # guest time is counted in user already
        every = (*busy, "idle", "iowait", "steal")
        spent = sum(getattr(now, k) - getattr(before, k) for k in busy if hasattr(now, k))
        total = sum(getattr(now, k) - getattr(before, k) for k in every if hasattr(now, k))
        return 100 * spent / total * (psutil.cpu_count() or 1) if total > 0 else None

    def read(self) -> tuple[dict[str, float | None], dict[str, int | None]]:
        """Return every series' value now, and the process id behind each process series (its incarnation)."""
        values: dict[str, float | None] = {}
        pids: dict[str, int | None] = {}
        ours = 0.0
        procs = self.processes()
        for name, group in procs.items():
            rss = cpu = 0.0
            alive = []
            for pid in group:
                with contextlib.suppress(psutil.Error):
                    proc = self._proc(pid)
                    mib = resident_mib(proc)
                    if mib is None:
                        continue
                    rss += mib
                    cpu += proc.cpu_percent(None)
                    alive.append(pid)
            values[f"rss_{name}"] = rss if alive else None
            values[f"cpu_{name}"] = cpu if alive else None
            pids[f"rss_{name}"] = min(alive) if alive else None
            ours += cpu
        # The broker's mapped segment indexes grow with its log, as its disk does (retention -1): its RSS is
        # split, and the bound applies to the anonymous part (heap, pre-touched, and native memory).
        kafka = procs["kafka"]
        split = rss_split(kafka[0]) if kafka else None
        values["rss_kafka_anon"], values["rss_kafka_file"] = split if split is not None else (None, None)
        pids["rss_kafka_anon"] = pids["rss_kafka_file"] = kafka[0] if split is not None else None
        values["load_1m"] = os.getloadavg()[0]
        # The machine is shared: what every process used since the last sample (% of one core), and what the
        # stack's processes above did not (this test's own producer and poller, other engineers' runs, the kernel).
        machine = self._machine_cpu()
        values["cpu_machine"] = machine
        values["cpu_other"] = max(0.0, machine - ours) if machine is not None else None
        live, local = self.state_bytes()
        low, self._state_low = self._state_low, None
        values["state_bytes"] = min(live, low) if live is not None and low is not None else live
        pids["state_bytes"] = pids.get("rss_speed_jvm")  # a restarted job rebuilds its working copy: its incarnation
        values["spark_local_bytes"] = local
        values["checkpoint_bytes"] = dir_bytes(Path(self.settings.checkpoint_root) / self.settings.speed.query_name)
        values["kafka_disk_bytes"] = sum(dir_bytes(p) or 0 for p in self.kafka.data_paths()) or None
        values["cassandra_disk_bytes"] = sum(dir_bytes(p) or 0 for p in self.cassandra.data_paths()) or None
        api = scrape(f"http://127.0.0.1:{self.settings.serving.port}/metrics")
        values["row_cache_bytes"] = api.get("trends_api_row_cache_bytes")
        values["answer_cache_bytes"] = api.get("trends_api_answer_cache_bytes")
        # The workers' caches fill up to their settings by design; what the workers hold beyond them is bounded.
        workers, rows, answers = values.get("rss_api_workers"), values["row_cache_bytes"], values["answer_cache_bytes"]
        values["rss_api_workers_net"] = None  # a failed scrape is no sample
        if workers is not None and rows is not None and answers is not None:
            values["rss_api_workers_net"] = workers - (rows + answers) / 2**20
        pids["rss_api_workers_net"] = pids.get("rss_api_workers")
        speed = scrape(f"http://127.0.0.1:{self.settings.metrics.speed_port}/metrics")
        values["speed_lag_records"] = speed.get("trends_speed_consumer_lag_records")
        values["state_memory_bytes"] = speed.get("trends_speed_state_memory_bytes")
        pids["state_memory_bytes"] = pids.get("rss_speed_jvm")
        logged = [(ms, evict) for rows, ms, evict in self.batch_durations() if rows > 0]
        batches = [ms for ms, _ in logged]
        evictions = [evict for _, evict in logged if evict is not None]
        values["batch_ms_max"] = float(max(batches)) if batches else None
        values["batch_ms_mean"] = sum(batches) / len(batches) if batches else None
        values["eviction_ms_mean"] = sum(evictions) / len(evictions) if evictions else None
        return values, pids
