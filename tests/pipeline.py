"""A private pipeline per fault case: its own topic, keyspace and checkpoint, a supervised speed layer, the batch layer.

Shared by the reliability and the network-fault suites. Ingestion goes through ``EventProducer``; the speed layer runs
as the stack's ``speed`` service (``trends speed run`` under the shipped :mod:`stack.supervisor`, which restarts it
with back-off whenever it exits non-zero and records the restarts); the batch layer runs over the closed hours; the
serving layer is asked for the window at the end: the count must be exact and the distinct users within the HLL
bounds.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from infra import migrations, topics
from infra.cassandra import session
from infra.settings import Settings
from ingestion.producer import EventProducer
from stack.process import family, process_alive, tail
from stack.services.pipeline import SpeedService
from stack.supervisor import SupervisorState
from tests.helpers import drop_keyspace, free_port
from views.event import Event

HOUR = timedelta(hours=1)


def read_topic(settings: Settings, topic: str, timeout_s: float = 60) -> list[Any]:
    """Return every record a topic holds now (up to each partition's high watermark), read back from the broker."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": f"rel-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        marks = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s) for p in meta.partitions
        }
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _high) in marks.items()])
        todo = {p for p, (low, high) in marks.items() if high > low}
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            records.append(msg)
            if msg.offset() + 1 >= marks[msg.partition()][1]:
                todo.discard(msg.partition())
        assert not todo, f"partitions {sorted(todo)} of {topic} not read to their end within {timeout_s} s"
        return records
    finally:
        consumer.close()


class SupervisedSpeed:
    """The speed job exactly as the stack runs it: :class:`SpeedService`, ``stack.supervisor`` around ``trends speed
    run`` with the stack's back-off settings. Its pid and state files live under the case's own data dir, so a speed
    service of the stack itself is never touched.
    """

    def __init__(self, settings: Settings) -> None:
        self.service = SpeedService(settings)

    def start(self) -> None:
        """Start the supervisor and wait until the first run answers on /metrics."""
        self.service.wait_ready(self.service.start(""))

    def state(self) -> SupervisorState:
        """Return what the supervisor last recorded (it writes its state before the first run starts)."""
        state = self.service.supervisor_state()
        assert state is not None, f"the supervisor wrote no state:\n{tail([self.service.stdout_file])}"
        return state

    @property
    def restarts(self) -> int:
        """Return how often the supervisor restarted the job."""
        return self.state().restarts

    @property
    def exits(self) -> list[int]:
        """Return the exit statuses of the job's runs that ended (negative: killed by that signal)."""
        return self.state().exits

    def exported_restarts(self, timeout_s: float = 120) -> int | None:
        """Return ``trends_speed_restarts_total`` from the running job's /metrics (None if it never answers)."""
        url = f"http://127.0.0.1:{self.service.settings.metrics.speed_port}/metrics"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=2) as resp:
                    found = re.search(
                        r"^trends_speed_restarts_total(?:\{[^}]*\})? ([0-9.]+)", resp.read().decode(), re.M
                    )
                if found:
                    return int(float(found.group(1)))
            time.sleep(1)
        return None

    def running_job(self, timeout_s: float = 120) -> int:
        """Return the pid of the job's current run, waiting (bounded) while the supervisor backs off."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.service.pid() is not None, f"the supervisor died:\n{tail([self.service.stdout_file])}"
            child = self.state().child_pid
            if child is not None and process_alive(child):
                return child
            time.sleep(0.2)
        msg = f"no run of the speed job within {timeout_s} s:\n{tail([self.service.stdout_file])}"
        raise AssertionError(msg)

    def kill(self) -> None:
        """SIGKILL the job's current run, driver and JVM together (a crash with no clean-up); never the supervisor."""
        job = family(self.running_job())
        assert job, "the speed job vanished before it could be killed"
        for proc in job:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(job, timeout=30)

    def stop(self) -> None:
        """Stop the service as ``trends stack down speed`` does (SIGTERM to its group, SIGKILL after the timeout)."""
        self.service.stop()


@dataclass
class Pipeline:
    """One case's private pipeline: topic, keyspace, checkpoint, the speed layer and the events it was given."""

    settings: Settings
    speed_settings: Settings
    window: tuple[datetime, datetime]
    events: list[Event] = field(default_factory=list)
    speed: SupervisedSpeed | None = None
    # where :meth:`final` records its figures (the suite's result table): (case, events in, accounted, ok, note)
    on_result: Callable[[str, int, int, bool, str], None] = lambda *_: None

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
        self.speed = SupervisedSpeed(self.speed_settings)
        self.speed.start()
        return self.speed

    def served_count(self) -> int:
        from serving import queries, window
        from serving.reader import ViewReader

        with session(self.settings) as sess:
            w = window.load(ViewReader(self.settings, sess), *self.window, "*", fields=())
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
        from serving import queries, window
        from serving.reader import ViewReader

        self.batch(spark)
        with session(self.settings) as sess:
            w = window.load(ViewReader(self.settings, sess), *self.window, "*")
        s = queries.summary(w)
        users = {e.user for e in expected}
        batch_only = all(p["layer"] == "batch" for p in s.provenance.spans) and not s.provenance.gaps
        ok = s.events == len(expected) and s.users_lower <= len(users) <= s.users_upper and batch_only
        self.on_result(case, len(expected), s.events, ok, note)
        assert s.events == len(expected)
        assert s.users_lower <= len(users) <= s.users_upper
        assert batch_only, s.provenance


@contextlib.contextmanager
def private_pipeline(
    stack_up: Settings, tmp_path: Path, on_result: Callable[[str, int, int, bool, str], None] = lambda *_: None
) -> Iterator[Pipeline]:
    """Make a case's pipeline on a fresh topic (4 partitions) and keyspace; drop both and stop its speed job after."""
    run = uuid.uuid4().hex[:8]
    topic, keyspace, query = f"test.rel.{run}", f"test_rel_{run}", f"rel_{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    settings = stack_up.model_copy(
        update={
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic, "partitions": 4}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
            "metrics": stack_up.metrics.model_copy(update={"speed_port": free_port()}),
            "speed": stack_up.speed.model_copy(
                update={
                    "query_name": query,
                    "trigger_seconds": 1.0,
                    "allowed_lateness_s": 600,
                    "max_offsets_per_trigger": 5000,
                }
            ),
            "batch": stack_up.batch.model_copy(update={"lateness_s": 3600, "grace_s": 300}),
            "views": stack_up.views.model_copy(update={"slice_dims": ["origin"]}),
            "spark": stack_up.spark.model_copy(update={"checkpoint_root": str(tmp_path / "checkpoints")}),
        }
    )
    migrations.migrate(settings)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 6 * HOUR
    # The speed service's own files (pid, supervisor state, log) under the case's folder, beside nothing else's.
    speed_settings = settings.model_copy(update={"data_dir": tmp_path / "stack"})
    p = Pipeline(settings, speed_settings, (start, start + 2 * HOUR), on_result=on_result)
    try:
        yield p
    finally:
        if p.speed is not None:
            p.speed.stop()
        drop_keyspace(stack_up, keyspace)
        topics.delete_topics(stack_up.kafka, [topic])
