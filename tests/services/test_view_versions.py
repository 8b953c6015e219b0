"""Blue/green view definitions under live traffic: a new slice dimension with no gap and no mixed answer.

A private pipeline (its own topic, keyspace and checkpoints): two hours of history before the live hour, the batch
layer computes them (the watermark is the live hour), and a producer thread sends events stamped *now* at a steady
rate. Blue — the supervised speed service, sliced by ``origin`` — serves. Green — a second supervised speed service,
another ``TRENDS_SPEED__QUERY_NAME``, sliced by ``origin`` and ``device``, started from the watermark — writes its own
rows beside blue's. ``trends speed promote`` is refused until green has caught up, then swaps the serving version;
blue notices and stops by itself (exit 0). Throughout, a poller asks the serving layer for every minute above the
watermark: no gap (but the minute not yet seen at the tail), every settled minute exact against the producer's
truth, each answer naming one version, blue then green. The new slice is answered above the watermark from the
switch on; below it, the hours blue's definition computed are a named ``definition`` gap (never a number) until a
backfill recomputes them under green's definition, then exact.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from batch_layer import job
from batch_layer.cli import batch as batch_cli
from infra.cassandra import session
from infra.settings import Settings
from ingestion.producer import EventProducer
from serving import console, window
from serving.plan import DEFINITION, NOT_YET_SEEN
from serving.reader import ViewReader
from speed_layer.cli import speed as speed_cli
from speed_layer.promote import read_versions
from stack.process import tail
from tests.helpers import free_port, produce_events
from tests.pipeline import SupervisedSpeed, private_pipeline
from views.buckets import HOUR, MINUTE, floor
from views.definition import GLOBAL_SLICE
from views.event import Event
from views.store.definitions import DefinitionStore
from views.store.pointers import PointerStore

pytestmark = [pytest.mark.spark, pytest.mark.faults]

RATE = 25  # live events per second
ORIGINS, DEVICES = ("JFK", "LAX", "SFO"), ("ios", "web")
NEW_SLICE = "device=ios"


def event(i: int, ts: datetime, prefix: str) -> Event:
    return Event(
        id=f"{prefix}-{i}", ts=ts, item=f"#t{i % 40}", user=f"u{i % 900}", value=float(i % 97),
        dims={"origin": ORIGINS[i % 3], "device": DEVICES[(i // 3) % 2]},
    )  # fmt: skip


class Truth:
    """Events per (slice, minute), for the global slice and the new one."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, datetime]] = Counter()
        self.lock = threading.Lock()

    def add(self, e: Event) -> None:
        m = floor(e.ts, MINUTE)
        with self.lock:
            self.counts[(GLOBAL_SLICE, m)] += 1
            if e.dims.get("device") == "ios":
                self.counts[(NEW_SLICE, m)] += 1

    def of(self, slice_: str, start: datetime, end: datetime) -> dict[datetime, int]:
        with self.lock:
            out, m = {}, start
            while m < end:
                out[m] = self.counts[(slice_, m)]
                m += MINUTE
            return out


class LiveProducer(threading.Thread):
    """Events stamped now at a steady rate through the ingestion producer, until stopped."""

    def __init__(self, settings: Settings, truth: Truth) -> None:
        super().__init__(daemon=True)
        self.producer = EventProducer(settings)
        self.truth = truth
        self.stop = threading.Event()
        self.sent = 0
        self.last: datetime | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        began = time.monotonic()
        try:
            while not self.stop.is_set():
                e = event(self.sent, datetime.now(UTC), "live")
                self.producer.produce(e)
                self.truth.add(e)
                self.sent += 1
                self.last = e.ts
                if self.sent % 50 == 0:
                    self.producer.poll(0)
                time.sleep(max(0.0, began + self.sent / RATE - time.monotonic()))
            summary = self.producer.close(timeout_s=120)
            assert (summary.failed, summary.undelivered) == (0, 0), summary.lines()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc


@dataclass
class Poll:
    """One answer of the serving layer for the minutes above the watermark."""

    at: datetime
    query: str
    gaps: list[dict[str, Any]]
    counts: dict[datetime, int]
    newest: datetime | None


@dataclass(eq=False)  # a thread must stay hashable
class Poller(threading.Thread):
    """Ask the serving layer for [watermark, now) every few seconds, as the API does (its reader and caches)."""

    settings: Settings
    since: datetime
    polls: list[Poll] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        try:
            with session(self.settings) as sess:
                reader = ViewReader(self.settings, sess)
                while not self.stop.is_set():
                    now = datetime.now(UTC)
                    end = floor(now, MINUTE)
                    if end <= self.since:
                        self.stop.wait(3)
                        continue
                    w = window.load(reader, self.since, end, GLOBAL_SLICE, coarsest="minute", fields=())
                    p = w.provenance
                    self.polls.append(
                        Poll(now, p.definition["query"], list(p.gaps), dict(w.merged.counts), p.speed_newest_event)
                    )
                    self.stop.wait(3)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc


def nonzero(counts: dict[datetime, int]) -> dict[datetime, int]:
    return {k: v for k, v in counts.items() if v}


def gap_minutes(poll: Poll, end: datetime) -> int:
    """Return the minutes a poll answered as gaps, but the tail the speed layer has not seen yet."""
    n = 0
    for g in poll.gaps:
        if g.get("reason") == NOT_YET_SEEN and g["end"] == end and (g["end"] - g["start"]) <= 2 * MINUTE:
            continue
        n += int((g["end"] - g["start"]) / MINUTE)
    return n


def input_rows(port: int) -> int | None:
    """Return ``trends_speed_input_rows_total`` of a running speed job (None: not answering)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            found = re.search(r"^trends_speed_input_rows_total(?:\{[^}]*\})? ([0-9.e+]+)", resp.read().decode(), re.M)
    except OSError:
        return None
    return int(float(found.group(1))) if found else None


def until(what: str, check: Callable[[], bool], timeout_s: float, log: Path | None = None) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if check():
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout_s} s" + (f"\n{tail([log])}" if log else ""))


def test_a_new_slice_dimension_blue_green_under_live_traffic(stack_up: Settings, tmp_path: Path, spark: Any) -> None:
    with private_pipeline(stack_up, tmp_path) as p:
        blue_settings = p.speed_settings.model_copy(
            update={"speed": p.speed_settings.speed.model_copy(update={"allowed_lateness_s": 3600})}
        )
        # the answers polled: a speed job held up by the other one's JVM start on 2 cores is late, not stopped
        p.settings = p.settings.model_copy(
            update={"serving": p.settings.serving.model_copy(update={"speed_live_within_s": 120.0})}
        )
        settings, blue_query = p.settings, blue_settings.speed.query_name
        green_query = f"green_{uuid.uuid4().hex[:8]}"
        green_settings = blue_settings.model_copy(
            update={
                "data_dir": tmp_path / "green",
                "speed": blue_settings.speed.model_copy(update={"query_name": green_query, "from_watermark": True}),
                "views": blue_settings.views.model_copy(update={"slice_dims": ["origin", "device"]}),
                "metrics": blue_settings.metrics.model_copy(update={"speed_port": free_port()}),
            }
        )
        truth = Truth()
        now = datetime.now(UTC)
        wm = floor(now, HOUR)
        # history: two hours below the live hour, and the live hour up to now (6 events a minute)
        history = []
        m = wm - 2 * HOUR
        while m < floor(now, MINUTE):
            history += [event(len(history) + i, m + timedelta(seconds=7 * i + 3), "hist") for i in range(6)]
            m += MINUTE
        produce_events(settings, history)
        for e in history:
            truth.add(e)

        blue = SupervisedSpeed(blue_settings)
        p.speed = blue
        blue.start()
        until(
            "blue read the history",
            lambda: (_seen(settings, blue_query) or wm - 3 * HOUR) >= floor(now, MINUTE),
            240,
            blue.service.stdout_file,
        )
        live = LiveProducer(settings, truth)
        live.start()
        job.run(settings, wm - 2 * HOUR, wm, force=True, spark=spark)  # the watermark moves to the live hour
        with session(settings) as sess:
            assert PointerStore(settings, sess).watermark().mark == wm
        poller = Poller(settings, wm)
        poller.start()
        time.sleep(10)

        # promote is refused while green does not exist / has not caught up
        refused = CliRunner().invoke(speed_cli, ["promote", green_query], obj=settings)
        assert refused.exit_code == 2 and "no speed epoch" in refused.output, refused.output

        green = SupervisedSpeed(green_settings)
        try:
            check_blue_green(settings, p, blue, green, truth, live, poller, history, wm, spark)
        finally:
            live.stop.set()
            poller.stop.set()
            green.stop()


def check_blue_green(
    settings: Settings,
    p: Any,
    blue: SupervisedSpeed,
    green: SupervisedSpeed,
    truth: Truth,
    live: LiveProducer,
    poller: Poller,
    history: list[Event],
    wm: datetime,
    spark: Any,
) -> None:
    """Start green from the watermark, promote it once caught up, then check every answer and the new slice."""
    blue_query = blue.service.settings.speed.query_name
    green_query = green.service.settings.speed.query_name
    green_port = green.service.settings.metrics.speed_port
    t_green = time.monotonic()
    green.start()
    refusals: list[str] = []

    def promoted() -> bool:
        got = CliRunner().invoke(speed_cli, ["promote", green_query], obj=settings)
        if got.exit_code == 0:
            refusals.append(got.output.strip())
            return True
        assert got.exit_code == 2, got.output
        refusals.append(got.output.strip().splitlines()[-1])
        return False

    until("green caught up and promoted", promoted, 300, green.service.stdout_file)
    catch_up_s = time.monotonic() - t_green
    promoted_at = datetime.now(UTC)
    start_record = json.loads(
        (Path(settings.spark.checkpoint_root) / green_query / "trends_start.json").read_text()
    )  # the records from green's start offsets to the topic's end when it started: its catch-up
    with session(settings) as sess:
        v = read_versions(settings, sess, green_query)
        assert v.serving.query == green_query and v.serving.previous_query == blue_query
        green_start = v.green.counts_from if v.green else None
    assert green_start == wm

    # blue notices and stops by itself, exit 0
    until(
        "blue stopped by itself",
        lambda: blue.service.supervisor_state() is not None and blue.state().exits[-1:] == [0],
        90,
        blue.service.stdout_file,
    )
    blue_log = tail([blue.service.stdout_file], 400)
    assert "no longer serves answers" in blue_log, blue_log[-3000:]
    p.speed = green
    time.sleep(30)  # answers from green under live traffic
    green_read = input_rows(green_port)
    live.stop.set()
    live.join(150)
    assert live.error is None, live.error
    last = live.last
    assert last is not None
    end = floor(last, MINUTE) + MINUTE
    until("green read the last event", lambda: (_seen(settings, green_query) or wm) >= end, 120)
    until("green read the whole topic past it", lambda: (_read_all(settings, green_query) or wm) >= end, 120)
    time.sleep(4)
    poller.stop.set()
    poller.join(60)
    assert poller.error is None, poller.error

    # every poll: no gap above the watermark, one version named, blue then green, settled minutes exact
    polls = poller.polls
    assert polls, "no answer polled"
    queries_seen = [q for i, q in enumerate(x.query for x in polls) if i == 0 or polls[i - 1].query != q]
    assert queries_seen == [blue_query, green_query], queries_seen
    gaps = {x.at: gap_minutes(x, floor(x.at, MINUTE)) for x in polls}
    wrong: list[tuple[datetime, datetime, int, int]] = []
    for poll in polls:
        if poll.newest is None:
            continue
        minute = wm
        while minute + MINUTE <= poll.newest - timedelta(seconds=90):  # settled: read whole by then
            n, want = poll.counts.get(minute, 0), truth.of(GLOBAL_SLICE, minute, minute + MINUTE)[minute]
            if n != want:
                wrong.append((poll.at, minute, n, want))
            minute += MINUTE
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        whole = window.load(reader, wm - 2 * HOUR, end, GLOBAL_SLICE, coarsest="minute", fields=())
        above = window.load(reader, wm, end, NEW_SLICE, coarsest="minute", fields=())
        below = window.load(reader, wm - 2 * HOUR, wm, NEW_SLICE, coarsest="minute", fields=())
        before = console.build(reader, wm - 2 * HOUR, wm + HOUR).versions
    status = CliRunner().invoke(batch_cli, ["status"], obj=settings)
    print(
        f"\nblue/green: green ({green_query}, slices origin+device) from the watermark {wm:%H:%M} caught up and "
        f"was promoted {catch_up_s:.1f} s after its start (JVM start included); its start offsets left "
        f"{start_record['to_read']} of the topic's {start_record['topic_records']} records to read, and it had read "
        f"{green_read} records 30 s after the promote (the topic then: {len(history) + live.sent}); "
        f"{len(polls)} answers polled from "
        f"{polls[0].at:%H:%M:%S} to {polls[-1].at:%H:%M:%S} (promote at {promoted_at:%H:%M:%S}), gap minutes "
        f"above the watermark: {sum(gaps.values())}; settled minutes not exact: {len(wrong)}; refusals before: "
        f"{refusals[:-1][:3]}...; promote: {refusals[-1]}\nconsole versions: {before}"
    )
    assert sum(gaps.values()) == 0, [(x.at, x.gaps) for x in polls if gaps[x.at]]
    assert not wrong, wrong[:10]
    # the whole window, global slice: batch (blue's runs, the global slice defined alike) + green's speed, exact
    assert whole.provenance.gaps == [], whole.provenance.gaps
    assert nonzero(whole.merged.counts) == nonzero(truth.of(GLOBAL_SLICE, wm - 2 * HOUR, end))
    assert whole.provenance.definition["query"] == green_query
    # the new slice: from the switch on above the watermark; below it a named definition gap, never a number
    assert above.provenance.gaps == [], above.provenance.gaps
    assert nonzero(above.merged.counts) == nonzero(truth.of(NEW_SLICE, wm, end))
    assert above.provenance.definition["slice_fingerprint"] is not None
    assert [s["layer"] for s in below.provenance.spans] == []
    assert {g["reason"] for g in below.provenance.gaps} == {DEFINITION}
    assert sum(int((g["end"] - g["start"]) / MINUTE) for g in below.provenance.gaps) == 120
    assert below.merged.events == 0
    assert before.serving.query == green_query and before.old_definition_hours == 2, before
    assert status.exit_code == 0 and "old-definition hours (2;" in status.output, status.output

    # a backfill recomputes those hours under the serving (green) definition: then exact, no gap
    job.run(settings, wm - 2 * HOUR, wm, force=True, spark=spark)
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        below = window.load(reader, wm - 2 * HOUR, wm, NEW_SLICE, coarsest="minute", fields=())
        after = console.build(reader, wm - 2 * HOUR, wm + HOUR).versions
        fp = DefinitionStore(settings, sess).serving().fingerprint
    assert below.provenance.gaps == [], below.provenance.gaps
    assert nonzero(below.merged.counts) == nonzero(truth.of(NEW_SLICE, wm - 2 * HOUR, wm))
    assert after.old_definition_hours == 0, after
    assert below.provenance.definition["fingerprint"] == fp
    print(f"after the backfill: {NEW_SLICE} below the watermark answered from the batch view; console: {after}")


def _read_all(settings: Settings, query: str) -> datetime | None:
    """Return when a speed query's current epoch last read the whole topic (None: not yet)."""
    from views.store.speed import SpeedRows

    with session(settings) as sess:
        epochs = SpeedRows(settings, sess).epochs(query)
    newest = max(epochs, key=lambda e: e.started_at, default=None)
    return newest.read_all_at if newest is not None else None


def _seen(settings: Settings, query: str) -> datetime | None:
    """Return how far a speed query's current epoch has read (None: nothing yet)."""
    from views.store.speed import SpeedRows

    with session(settings) as sess:
        epochs = SpeedRows(settings, sess).epochs(query)
    newest = max(epochs, key=lambda e: e.started_at, default=None)
    return newest.seen_until if newest is not None else None
