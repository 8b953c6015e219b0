"""A hole is never a zero: the speed view's faults as they happen, each answered as a gap with its reason.

The real speed layer (``trends speed run``) reads a private topic into a private keyspace; the faults are injected
the way they occur: speed rows lost (a write Cassandra lost, or rows removed), rows expired by a (short) TTL, a
checkpoint lost and the job restarted at ``latest`` on a topic that holds history. Each window is asked through
the serving layer's queries, the HTTP API (the real app on the real Cassandra) and the ``trends query`` CLI, and
checked against the events produced: every minute is either answered exactly or reported as a gap, never as a
silent zero.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from serving import queries, window
from serving.api import create_app
from serving.plan import NOT_YET_SEEN, SPEED_ROWS_GONE, STARTED_AFTER, STOPPED_INSIDE
from serving.reader import ViewReader
from tests.helpers import iso, produce_events, speed_drain
from views.buckets import MINUTE, floor
from views.event import Event

pytestmark = [pytest.mark.spark, pytest.mark.faults]  # make test-faults (slow: TTLs, restarts, a browser)

TRENDS = str(Path(sys.executable).parent / "trends")
TTL_S = 90  # the speed rows' TTL in the expiry case: the checks before it must end within it
LIVE_WITHIN_S = 10.0  # a stopped job's unread minute turns into a gap this long after it last read the whole topic


@dataclass
class Env:
    settings: Settings
    env: dict[str, str]
    checkpoints: Path
    logs: Path
    truth: Counter[datetime]

    def produce(self, events: list[Event]) -> None:
        produce_events(self.settings, events)
        for e in events:
            self.truth[floor(e.ts, MINUTE)] += 1

    def drain(self, **extra: str) -> None:
        speed_drain(self.settings, self.logs, lateness_s=3600, **extra)

    def start(self, **extra: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"speed-{time.monotonic_ns()}.log").open("wb")
        return subprocess.Popen(
            [TRENDS, "speed", "run"], env={**self.env, **extra}, stdout=log, stderr=subprocess.STDOUT
        )

    def window(self, start: datetime, end: datetime) -> window.Window:
        with session(self.settings) as sess:
            return window.load(ViewReader(self.settings, sess), start, end, "*", coarsest="minute")

    def cli(self, start: datetime, end: datetime) -> str:
        proc = subprocess.run(
            [
                TRENDS,
                "query",
                "summary",
                "--start",
                f"{start:%Y-%m-%dT%H:%M:%SZ}",
                "--end",
                f"{end:%Y-%m-%dT%H:%M:%SZ}",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    def api(self, start: datetime, end: datetime) -> dict[str, Any]:
        with TestClient(create_app(self.settings)) as client:
            r = client.get(
                "/api/v1/series",
                params={
                    "start": f"{start:%Y-%m-%dT%H:%M:%SZ}",
                    "end": f"{end:%Y-%m-%dT%H:%M:%SZ}",
                    "resolution": "minute",
                },
            )
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def gap_metric(self, reason: str) -> float:
        with TestClient(create_app(self.settings)) as client:
            text = client.get("/metrics").text
        found = re.search(rf'^trends_api_gap_minutes{{reason="{re.escape(reason)}"}} (\S+)$', text, re.M)
        assert found, text
        return float(found.group(1))


@pytest.fixture
def cov_env(
    stack_up: Settings, new_topic: Callable[..., str], keyspace_settings: Settings, tmp_path: Path
) -> Iterator[Env]:
    migrations.migrate(keyspace_settings)
    topic = new_topic(partitions=2)
    query = f"cov_{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_CASSANDRA__KEYSPACE": keyspace_settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": query,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__TRIGGER_SECONDS": "1",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "3600",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRENDS_SERVING__SPEED_LIVE_WITHIN_S": str(LIVE_WITHIN_S),
    }
    settings = keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "speed": keyspace_settings.speed.model_copy(update={"query_name": query}),
            "serving": keyspace_settings.serving.model_copy(update={"speed_live_within_s": LIVE_WITHIN_S}),
        }
    )
    yield Env(settings, env, tmp_path / "checkpoints", tmp_path, Counter())


def events(start: datetime, minutes: int, per_minute: int, prefix: str) -> list[Event]:
    return [
        Event(id=f"{prefix}{m}-{i}", ts=start + m * MINUTE + timedelta(seconds=i % 60), item=f"#{prefix}{i % 7}",
              user=f"u{i % 40}")
        for m in range(minutes)
        for i in range(per_minute)
    ]  # fmt: skip


def answered(w: window.Window) -> dict[datetime, str]:
    """Each minute of the window: the layer that served it, or the gap's reason."""
    out = {}
    for s in w.provenance.spans:
        out.update(dict.fromkeys(_minutes(s["start"], s["end"]), s["layer"]))
    for g in w.provenance.gaps:
        out.update(dict.fromkeys(_minutes(g["start"], g["end"]), g["reason"]))
    return out


def _minutes(a: datetime, b: datetime) -> list[datetime]:
    return [a + i * MINUTE for i in range(int((b - a) / MINUTE))]


def assert_no_hidden_hole(env: Env, start: datetime, end: datetime) -> dict[datetime, str]:
    """Every minute answered is exact (a counted zero is a zero), every other one is a gap; the total is the sum."""
    w = queries.series(env.window(start, end), "minute")
    who = answered(env.window(start, end))
    total = 0
    for p in w.points:
        m = p["start"]
        if who[m] in ("speed", "batch"):
            assert p["count"] == env.truth[m], (m, p, who[m])
            total += env.truth[m]
        else:
            assert p["count"] is None and p["gap"], (m, p, who[m])
    assert env.window(start, end).merged.events == total
    return who


def test_lost_and_expired_speed_rows_are_gaps_not_zeros(cov_env: Env) -> None:
    env = cov_env
    t0 = floor(datetime.now(UTC), MINUTE) - 20 * MINUTE
    env.produce(events(t0, 12, 250, "a"))  # 3,000 events over 12 minutes
    env.drain(TRENDS_SPEED__VIEW_TTL_S=str(TTL_S))
    written = time.monotonic()  # the rows and coverage were written before this
    start, end = t0, t0 + 12 * MINUTE
    assert set(assert_no_hidden_hole(env, start, end).values()) == {"speed"}
    assert env.window(start, end).merged.events == 3000

    # A lost write: four minutes of rows gone from the view (every slice), as an expired TTL or lost write leaves
    lost = [t0 + (3 + i) * MINUTE for i in range(4)]
    with session(env.settings) as sess:
        for m in lost:
            sess.execute(
                f"DELETE FROM {table(env.settings, 'speed_minutes')} WHERE query = %s AND slice = '*' AND day = %s "
                "AND bucket_start = %s",
                (env.settings.speed.query_name, m.date(), m),
            )
    who = assert_no_hidden_hole(env, start, end)
    assert {m for m, r in who.items() if r == SPEED_ROWS_GONE} == set(lost)
    assert env.window(start, end).merged.events == 3000 - 4 * 250
    series = env.api(start, end)
    gaps = series["provenance"]["gaps"]
    assert [(g["start"], g["end"], g["reason"]) for g in gaps] == [
        (iso(lost[0]), iso(lost[-1] + MINUTE), SPEED_ROWS_GONE)
    ]
    assert [p["count"] for p in series["points"][3:7]] == [None] * 4
    assert env.gap_metric(SPEED_ROWS_GONE) == 4
    out = env.cli(start, end)
    assert "events  2000 " in out and f"GAP   {lost[0]:%Y-%m-%d %H:%M}" in out and SPEED_ROWS_GONE in out

    # The TTL passes: every minute is a gap, the answer is no zero
    time.sleep(max(0.0, written + TTL_S - 30 - time.monotonic()))
    deadline = written + TTL_S + 30
    while set(answered(env.window(start, end)).values()) != {SPEED_ROWS_GONE} and time.monotonic() < deadline:
        time.sleep(2)
    who = assert_no_hidden_hole(env, start, end)
    assert set(who.values()) == {SPEED_ROWS_GONE}
    assert env.window(start, end).merged.events == 0
    assert all(p["count"] is None for p in env.api(start, end)["points"])

    # The same epoch reads on (its checkpoint kept, the default TTL): the hour it had read into lost its keep with
    # its rows, and a fresh keep must not claim them — the expired minutes stay gaps, the new ones are answered.
    z0 = floor(datetime.now(UTC), MINUTE) - MINUTE
    env.produce(events(z0, 1, 50, "z"))
    env.drain()
    who = assert_no_hidden_hole(env, start, z0 + MINUTE)
    assert {who[m] for m in _minutes(start, end)} == {SPEED_ROWS_GONE}, who


def test_a_lost_checkpoint_restarted_at_latest_leaves_a_reported_gap(cov_env: Env) -> None:
    env = cov_env
    t0 = floor(datetime.now(UTC), MINUTE) - 30 * MINUTE
    env.produce(events(t0, 5, 100, "a"))  # seen by the first epoch
    env.drain()
    shutil.rmtree(env.checkpoints)  # the checkpoint is lost
    env.produce(events(t0 + 10 * MINUTE, 5, 100, "b"))  # produced while no speed job runs: nobody reads them
    proc = env.start(TRENDS_SPEED__STARTING_OFFSETS="latest")
    try:
        initial = next(env.checkpoints.glob("*/sources/0/0"), None)
        deadline = time.monotonic() + 180
        while initial is None and time.monotonic() < deadline:
            time.sleep(1)
            initial = next(env.checkpoints.glob("*/sources/0/0"), None)
        assert initial is not None, "the restarted speed job never resolved its starting offsets"
        resolved = datetime.fromtimestamp(initial.stat().st_mtime, UTC)
        c0 = floor(resolved, MINUTE) + MINUTE  # the new epoch counts completely from here
        env.produce(events(c0, 2, 100, "c"))  # after the restart (event times up to 2 min ahead: Kafka takes 1 h)
        deadline = time.monotonic() + 180
        while env.window(c0, c0 + 2 * MINUTE).merged.events < 200 and time.monotonic() < deadline:
            time.sleep(2)
        # while the job reads on, both minutes ahead of the clock are answered as read so far (the live minutes)
        start, end = t0, c0 + 3 * MINUTE
        who = assert_no_hidden_hole(env, start, end)
        assert all(who[t0 + i * MINUTE] == "speed" for i in range(5))  # the first epoch's minutes still served
        # the minutes the lost checkpoint's job never read, up to the new epoch's start, are gaps with the reason
        assert {who[m] for m in _minutes(t0 + 10 * MINUTE, c0)} == {STARTED_AFTER}
        assert all(who[c0 + i * MINUTE] == "speed" for i in range(2)), who
        assert who[c0 + 2 * MINUTE] == NOT_YET_SEEN
        assert env.window(start, end).merged.events == 700  # 500 of b are in a gap, not counted as zero
    finally:
        proc.terminate()
        proc.wait(120)
    # Stopped: a minute that ends after the last time the epoch read the whole topic may miss events produced since,
    # so once it has not read for serving.speed_live_within_s it is a gap, not what the stopped job had read of it.
    with session(env.settings) as sess:
        read_all = {r.epoch: r.read_all_at for r in sess.execute(
            f"SELECT epoch, read_all_at FROM {table(env.settings, 'speed_epochs')}"
        )}  # fmt: skip
    assert all(read_all.values()), read_all  # both epochs read the whole topic at some point
    newest = max(read_all.values()).replace(tzinfo=UTC)
    time.sleep(max(0.0, (newest + env.settings.serving.speed_live_within - datetime.now(UTC)).total_seconds() + 1))
    who = assert_no_hidden_hole(env, start, end)
    unread = [m for m in _minutes(c0, c0 + 2 * MINUTE) if m + MINUTE > newest]
    assert unread and {who[m] for m in unread} == {STOPPED_INSIDE}, (newest, who)
    assert all(who[m] == "speed" for m in _minutes(c0, c0 + 2 * MINUTE) if m not in unread)
    assert STOPPED_INSIDE in env.cli(start, end)
    gaps = env.api(start, end)["provenance"]["gaps"]
    assert any(g["reason"] == STARTED_AFTER for g in gaps)
    assert STARTED_AFTER in env.cli(start, end)
    with session(env.settings) as sess:
        rows = list(sess.execute(f"SELECT epoch, covered_from FROM {table(env.settings, 'speed_epochs')}"))
    assert len(rows) == 2 and sorted(r.covered_from is None for r in rows) == [False, True]
    print(json.dumps({m.isoformat(): r for m, r in who.items()}, indent=0)[:2000])
