"""The reliability suite's harness: a private pipeline per case, a supervised speed layer, and the result table.

Each case runs the real pipeline on a fresh topic and keyspace — ingestion through ``EventProducer``, the speed
layer as ``trends speed run`` in its own process group (restarted by a small supervisor, as systemd or Kubernetes
would, whenever it exits), the batch layer over the closed hours — injects its fault, and ends by asking the serving
layer for the window: the count must be exact and the distinct users within the HLL bounds. Every case adds a row
(case, events in, events accounted for, result) to the table printed at the end and written to
``artifacts/reliability.md``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infra import migrations, topics
from infra.cassandra import session
from infra.settings import Settings
from ingestion.producer import EventProducer
from views.event import Event

TRENDS = str(Path(sys.executable).parent / "trends")
HOUR = timedelta(hours=1)
ROWS: list[tuple[str, int, int, str]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    lines = ["| case | events in | events accounted for | result |", "|---|---:|---:|---|"]
    lines += [f"| {c} | {n:,} | {a:,} | {r} |" for c, n, a, r in ROWS]
    terminalreporter.write_sep("=", "reliability")
    for line in lines:
        terminalreporter.write_line(line)
    out = Path(__file__).resolve().parents[2] / "artifacts"
    out.mkdir(exist_ok=True)
    (out / "reliability.md").write_text("\n".join(lines) + "\n")


def record(case: str, events_in: int, accounted: int, ok: bool, note: str = "") -> None:
    """Add a row to the table (before the case's assertions, so a failure shows its figures too)."""
    ROWS.append((case, events_in, accounted, ("PASS" if ok else "FAIL") + (f" ({note})" if note else "")))


class SupervisedSpeed:
    """``trends speed run`` kept running: restarted a moment after it exits, until :meth:`stop`."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.exits: list[int] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="speed-supervisor", daemon=True)

    def _launch(self) -> None:
        log = (self.logs / f"speed-{time.monotonic_ns()}.log").open("wb")
        self.proc = subprocess.Popen(
            [TRENDS, "speed", "run"], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self) -> None:
        with self._lock:
            self._launch()
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                proc = self.proc
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    self.exits.append(proc.returncode)
                    time.sleep(2)  # like Restart=on-failure with RestartSec=2
                    self.restarts += 1
                    self._launch()
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL the whole job (driver and JVM) wherever it is."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(90)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(30)


@dataclass
class Pipeline:
    """One case's private pipeline: topic, keyspace, checkpoint, the speed layer and the events it was given."""

    settings: Settings
    env: dict[str, str]
    logs: Path
    window: tuple[datetime, datetime]
    events: list[Event] = field(default_factory=list)
    speed: SupervisedSpeed | None = None

    def make_events(self, count: int, prefix: str, rng: random.Random) -> list[Event]:
        """Events over the window in event-time order, with users, values and an origin dimension."""
        start, end = self.window
        span_ms = int((end - start).total_seconds() * 1000)
        stamps = sorted(rng.randrange(span_ms) for _ in range(count))
        items = [f"#r{i}" for i in range(60)]
        weights = [1 / (i + 1) for i in range(len(items))]
        return [
            Event(
                id=f"{prefix}-{i}",
                ts=start + timedelta(milliseconds=ms),
                item=rng.choices(items, weights)[0],
                user=f"u{rng.randrange(4000)}",
                value=round(rng.lognormvariate(3, 1), 3),
                dims={"origin": rng.choice(["JFK", "LAX", "SFO"])},
            )
            for i, ms in enumerate(stamps)
        ]

    def producer(self) -> EventProducer:
        s = self.settings
        return EventProducer(
            s.model_copy(update={"ingest": s.ingest.model_copy(update={"message_timeout_ms": 300_000})})
        )

    def produce(
        self, events: list[Event], rate: float | None = None, during: Callable[[int], None] | None = None
    ) -> None:
        """Produce through the ingestion producer (idempotent), paced at ``rate``; ``during(sent)`` runs between."""
        producer = self.producer()
        began = time.monotonic()
        for i, e in enumerate(events):
            producer.produce(e)
            if i % 500 == 0:
                producer.poll(0)
                if during is not None:
                    during(i)
                if rate:
                    time.sleep(max(0.0, began + i / rate - time.monotonic()))
        summary = producer.close(timeout_s=300)
        assert (summary.failed, summary.undelivered) == (0, 0), summary.lines()
        self.events.extend(events)

    def close_window(self) -> None:
        """One event per partition well after the window, so every hour of it is closed for the batch layer."""
        from confluent_kafka import Producer

        end = self.window[1]
        p = Producer({**self.settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
        for part in range(self.settings.kafka.partitions):
            e = Event(id=f"closer-{part}", ts=end + 2 * HOUR, item="#closer")
            p.produce(self.settings.kafka.events_topic, value=e.to_json(), timestamp=e.ts_ms, partition=part)
        assert p.flush(30) == 0

    def start_speed(self) -> SupervisedSpeed:
        self.speed = SupervisedSpeed(self.env, self.logs)
        self.speed.start()
        return self.speed

    def served_count(self) -> int:
        from serving import queries
        from serving.store import ViewReader

        with session(self.settings) as sess:
            w = queries.load(ViewReader(self.settings, sess), *self.window, "*", fields=())
        return queries.count(w).events

    def wait_speed(self, expected: int, timeout_s: float = 300) -> int:
        """Wait until the speed view counts ``expected`` events in the window (or the time runs out)."""
        deadline, got = time.monotonic() + timeout_s, -1
        while time.monotonic() < deadline:
            got = self.served_count()
            if got >= expected:
                break
            time.sleep(2)
        return got

    def batch(self, spark: Any) -> None:
        from batch_layer import job

        job.run(self.settings, *self.window, spark=spark)

    def final(self, spark: Any, case: str, expected: list[Event], note: str = "") -> None:
        """Run the batch layer over the window and check the merged answer against the exact one; record it."""
        from serving import queries
        from serving.store import ViewReader

        self.batch(spark)
        with session(self.settings) as sess:
            w = queries.load(ViewReader(self.settings, sess), *self.window, "*")
        s = queries.summary(w)
        users = {e.user for e in expected}
        batch_only = all(p["layer"] == "batch" for p in s.provenance.spans) and not s.provenance.gaps
        ok = s.events == len(expected) and s.users_lower <= len(users) <= s.users_upper and batch_only
        record(case, len(expected), s.events, ok, note)
        assert s.events == len(expected)
        assert s.users_lower <= len(users) <= s.users_upper
        assert batch_only, s.provenance


@pytest.fixture
def pipeline(stack_up: Settings, tmp_path: Path) -> Iterator[Pipeline]:
    run = uuid.uuid4().hex[:8]
    topic, keyspace, query = f"test.rel.{run}", f"test_rel_{run}", f"rel_{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    settings = stack_up.model_copy(
        update={
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic, "partitions": 4}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
            "speed": stack_up.speed.model_copy(
                update={"query_name": query, "metrics_port": 0, "trigger_seconds": 1.0, "allowed_lateness_s": 600}
            ),
            "batch": stack_up.batch.model_copy(update={"lateness_s": 3600, "grace_s": 300}),
            "views": stack_up.views.model_copy(update={"slice_dims": ["origin"]}),
            "spark": stack_up.spark.model_copy(update={"checkpoint_root": str(tmp_path / "checkpoints")}),
        }
    )
    migrations.migrate(settings)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 6 * HOUR
    env = {**os.environ, **settings.to_env(), "TRENDS_SPEED__MAX_OFFSETS_PER_TRIGGER": "5000"}
    p = Pipeline(settings, env, tmp_path, (start, start + 2 * HOUR))
    try:
        yield p
    finally:
        if p.speed is not None:
            p.speed.stop()
        with session(stack_up) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        topics.delete_topics(stack_up.kafka, [topic])
