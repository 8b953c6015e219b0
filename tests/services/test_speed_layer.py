"""The speed layer against real Kafka, Spark and Cassandra, run as `trends speed run` in its own process.

Exactly once: random SIGKILLs of the whole job (driver and JVM) while it works, restarts from the checkpoint,
then exact counts and sketches within their bounds. Late events and duplicates: counted once, dropped and
counted as dropped.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra.cassandra import session, table
from infra.settings import Settings
from serving import window
from serving.reader import ViewReader
from tests.helpers import produce_events
from views import sketches
from views.buckets import SPEED_ROLLUP
from views.event import Event

pytestmark = pytest.mark.spark

TRENDS = str(Path(sys.executable).parent / "trends")


@dataclass
class Truth:
    """Exact answers per (slice, minute)."""

    events: Counter[tuple[str, datetime]] = field(default_factory=Counter)
    users: dict[tuple[str, datetime], set[str]] = field(default_factory=lambda: defaultdict(set))
    values: dict[tuple[str, datetime], list[float]] = field(default_factory=lambda: defaultdict(list))
    items: dict[tuple[str, datetime], Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, e: Event) -> None:
        minute = e.ts.replace(second=0, microsecond=0)
        for sl in ["*", *(f"{k}={v}" for k, v in e.dims.items() if k == "origin")]:
            key = (sl, minute)
            self.events[key] += 1
            if e.user:
                self.users[key].add(e.user)
            if e.value is not None:
                self.values[key].append(e.value)
            self.items[key][e.item] += 1


@dataclass
class SpeedEnv:
    settings: Settings
    env: dict[str, str]
    logs: Path

    def produce(self, events: list[Event], duplicate_every: int = 0) -> None:
        produce_events(self.settings, events, duplicate_every=duplicate_every)

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"speed-{time.monotonic_ns()}.log").open("wb")
        return subprocess.Popen(
            [TRENDS, "speed", "run", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def drain(self, timeout: float = 240) -> str:
        """Run with --available-now until the topic is processed; return the job's output."""
        proc = subprocess.run(
            [TRENDS, "speed", "run", "--available-now"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stderr

    def view(self) -> dict[tuple[str, datetime], object]:
        with session(self.settings) as sess:
            rows = sess.execute(
                f"SELECT slice, bucket_start, events, users_hll, values_kll, items_fi FROM "
                f"{table(self.settings, 'speed_minutes')}"
            )
            return {(r.slice, r.bucket_start.replace(tzinfo=UTC)): r for r in rows}


@pytest.fixture
def speed_env(
    stack_up: Settings, new_topic: Callable[..., str], keyspace_settings: Settings, tmp_path: Path
) -> Iterator[SpeedEnv]:
    """A private topic, keyspace, checkpoint and query for one test, passed to the job as TRENDS_* variables."""
    from infra import migrations

    migrations.migrate(keyspace_settings)
    topic = new_topic(partitions=4)
    query = f"test_{uuid.uuid4().hex[:8]}"
    overrides = {
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_CASSANDRA__KEYSPACE": keyspace_settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": query,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__TRIGGER_SECONDS": "1",
        "TRENDS_SPEED__MAX_OFFSETS_PER_TRIGGER": "3000",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRENDS_VIEWS__SLICE_DIMS": '["origin"]',
    }
    env = {**os.environ, **overrides}
    settings = keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "speed": keyspace_settings.speed.model_copy(update={"query_name": query}),
        }
    )
    yield SpeedEnv(settings, env, tmp_path)


def make_events(rng: random.Random, count: int, start: datetime, minutes: int, prefix: str) -> list[Event]:
    items = [f"#tag{i}" for i in range(40)]
    weights = [1 / (i + 1) for i in range(len(items))]
    events = []
    for i in range(count):
        ts = start + timedelta(milliseconds=rng.randrange(minutes * 60_000))
        events.append(
            Event(
                id=f"{prefix}-{i}",
                ts=ts,
                item=rng.choices(items, weights)[0],
                user=f"user{rng.randrange(3000)}" if rng.random() < 0.95 else None,
                value=round(rng.lognormvariate(3, 1), 3) if rng.random() < 0.9 else None,
                dims={"origin": rng.choice(["JFK", "LAX", "SFO"])} if rng.random() < 0.8 else {},
            )
        )
    return events


def assert_view_matches(view: dict[tuple[str, datetime], object], truth: Truth) -> None:
    assert set(view) == set(truth.events), "buckets differ"
    for key, exact in truth.events.items():
        row = view[key]
        assert row.events == exact, (key, row.events, exact)  # type: ignore[attr-defined]
        est = sketches.users([row.users_hll], num_std_dev=3)  # type: ignore[attr-defined]
        n_users = len(truth.users[key])
        assert est.lower <= n_users <= est.upper, (key, est, n_users)
        values = sorted(truth.values[key])
        if values:
            eps = sketches.kll_rank_error([row.values_kll])  # type: ignore[attr-defined]
            for q in (0.5, 0.9, 0.99):
                got = sketches.quantiles([row.values_kll], [q])[0]  # type: ignore[attr-defined]
                rank = sum(v <= got for v in values) / len(values)
                assert q - eps - 1 / len(values) <= rank <= q + eps + 1 / len(values), (key, q, rank)
        top, max_error = sketches.top_items([row.items_fi], limit=100)  # type: ignore[attr-defined]
        listed = {t.item: t for t in top}
        for item, count in truth.items[key].items():
            if item in listed:
                assert listed[item].lower <= count <= listed[item].upper, (key, item)
            else:
                assert count <= max_error, (key, item, count)


def test_exactly_once_across_random_sigkills(speed_env: SpeedEnv) -> None:
    seed = int(os.environ.get("TRENDS_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"seed {seed}")
    # 32 minutes in time order (none later than the lateness behind the newest): the Spark watermark passes the
    # first intervals while the job runs, so their rollups are merged (and their to-do kept) across the kills
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=40)
    events = sorted(make_events(rng, 30_000, start, minutes=32, prefix="x"), key=lambda e: e.ts)
    truth = Truth()
    for e in events:
        truth.add(e)
    speed_env.produce(events, duplicate_every=10)  # 10% re-sent: duplicates must count once

    checkpoint = Path(speed_env.env["TRENDS_SPARK__CHECKPOINT_ROOT"]) / speed_env.settings.speed.query_name

    def committed() -> int:
        commits = checkpoint / "commits"
        return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0

    for _ in range(3):  # each round: start, let it commit at least one more batch, kill at a random moment after
        before = committed()
        proc = speed_env.start()
        deadline = time.monotonic() + 180
        while committed() <= before and time.monotonic() < deadline:
            assert proc.poll() is None, "the job died by itself"
            time.sleep(0.2)
        assert committed() > before, "no batch committed within 180 s"
        time.sleep(rng.uniform(0, 2.5))  # mid-batch, between batches, inside foreachBatch: wherever it lands
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    planned = len([p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()])
    print(f"before the drain: {planned} batches planned, {committed()} committed")
    assert committed() < 12, "the data ran out before the kills: the kills did not interrupt real work"
    out = speed_env.drain()
    assert "stopped after" in out
    assert_view_matches(speed_env.view(), truth)
    assert_rollups_match(speed_env, truth, start, start + timedelta(minutes=32))


def assert_rollups_match(env: SpeedEnv, truth: Truth, start: datetime, end: datetime) -> None:
    """Every rollup merged holds exactly its minutes' events; the window answered through them counts every event."""
    with session(env.settings) as sess:
        rows = list(sess.execute(f"SELECT slice, bucket_start, events FROM {table(env.settings, 'speed_rollups')}"))
        assert rows, "no interval was merged: the watermark never passed one"
        for r in rows:
            first = r.bucket_start.replace(tzinfo=UTC)
            want = sum(n for (sl, m), n in truth.events.items() if sl == r.slice and first <= m < first + SPEED_ROLLUP)
            assert r.events == want, (r.slice, first, r.events, want)
        off = {"cache_mb": 0, "answer_cache_mb": 0, "state_max_age_ms": 0}
        reader = ViewReader(
            env.settings.model_copy(update={"serving": env.settings.serving.model_copy(update=off)}), sess
        )
        got = window.load(reader, start, end, "*", keep_rows=False)
    minutes = sum(1 for sl, _ in truth.events if sl == "*")
    assert not got.provenance.gaps
    assert got.merged.events == sum(n for (sl, _), n in truth.events.items() if sl == "*")
    assert got.merged.rows < minutes, "the answer read no rollup"


@pytest.mark.faults  # slow (make test-faults; the batch layer's correction of both stays in make test)
def test_late_events_and_duplicates(speed_env: SpeedEnv) -> None:
    env = speed_env
    env.env["TRENDS_SPEED__ALLOWED_LATENESS_S"] = "120"
    t0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
    first = [Event(id=f"a{i}", ts=t0 + timedelta(minutes=10, seconds=i), item="#a", user=f"u{i}") for i in range(10)]
    env.produce(first)
    env.drain()  # watermark is now t0+10m+9s - 120s
    inside = Event(id="late-ok", ts=t0 + timedelta(minutes=9), item="#late", user="u1")  # 69 s behind: counted
    too_late = Event(id="late-drop", ts=t0 + timedelta(minutes=5), item="#late", user="u1")  # 309 s: dropped
    dup = first[3]  # the same id again inside the watermark: counted once
    env.produce([inside, too_late, dup, dup])
    out = env.drain()
    dropped = int(re.search(r"(\d+) dropped as too late", out).group(1))  # type: ignore[union-attr]
    assert dropped == 1, out
    view = env.view()
    assert view[("*", t0 + timedelta(minutes=10))].events == 10  # type: ignore[attr-defined]
    assert view[("*", t0 + timedelta(minutes=9))].events == 1  # type: ignore[attr-defined]
    assert ("*", t0 + timedelta(minutes=5)) not in view


def test_sigterm_finishes_cleanly_with_metrics_and_freshness(speed_env: SpeedEnv) -> None:
    import urllib.request

    from tests.helpers import free_port

    env = speed_env
    port = free_port()
    env.env["TRENDS_METRICS__SPEED_PORT"] = str(port)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    events = [
        Event(id=f"t{i}", ts=start + timedelta(milliseconds=i * 20), item="#t", user=f"u{i % 9}") for i in range(9000)
    ]
    env.produce(events)
    proc = env.start()
    try:
        deadline = time.monotonic() + 120
        text = ""
        while time.monotonic() < deadline and "trends_speed_input_rows_total" not in text:
            assert proc.poll() is None, "the job died by itself"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
            except OSError:
                time.sleep(0.5)
        assert f'trends_speed_batches_total{{query="{env.settings.speed.query_name}"}}' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = sorted(env.logs.glob("speed-*.log"))[-1].read_text()
    assert "received signal 15" in log and "stopped after" in log
    env.drain()  # the restart resumes from the checkpoint: every event counted once
    assert sum(r.events for (sl, _), r in env.view().items() if sl == "*") == len(events)  # type: ignore[attr-defined]
    with session(env.settings) as sess:
        row = sess.execute(
            f"SELECT newest_event_ts, updated_at FROM {table(env.settings, 'speed_progress')} WHERE query = %s",
            (env.settings.speed.query_name,),
        ).one()
    assert row.newest_event_ts.replace(tzinfo=UTC) == max(e.ts for e in events)
    assert row.updated_at is not None
