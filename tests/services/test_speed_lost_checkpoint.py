"""The checkpoint folder of a *running* speed service is deleted: the service restarts from the watermark by itself.

A private pipeline (:mod:`tests.pipeline`: its own topic of 4 partitions, keyspace and checkpoint) on the shared
Kafka and Cassandra. The hour before the current one is seeded and computed by the batch layer, which sets the batch
watermark at the current hour ``W``; a few late events of that hour arrive after its run (records below the
watermark that a start from it meets and skips). The speed layer runs as the stack's speed service (``trends speed
run`` under :mod:`stack.supervisor`) with ``TRENDS_SPEED__FROM_WATERMARK=true``, and events with current event times
are produced at a steady rate, each acknowledged one counted per minute.

Once the service has caught up, ``rm -rf`` its checkpoint folder while it runs. Asserted: the job notices (a log line
naming the checkpoint), exits with the lost-checkpoint status and is restarted by the supervisor, the restart is a
new epoch from the watermark, ``trends stack status`` says what happened at each step, and afterwards every minute
from the watermark to the last event is answered with no gap and exactly the events the producer had acknowledged;
``trends_speed_skipped_below_batch_watermark_rows_total`` counts the late records each start met.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from batch_layer import job
from infra.cassandra import session
from infra.errors import EXIT_CHECKPOINT_LOST
from infra.settings import Settings
from infra.speed_checkpoint import START_FILE, checkpoint_state, speed_checkpoint
from serving import queries, window
from serving.reader import ViewReader
from stack import control
from stack.process import tail
from tests.pipeline import Pipeline, SupervisedSpeed, private_pipeline, read_topic
from tests.soak.probe import SteadyProducer
from views.aggregation import GLOBAL_SLICE
from views.buckets import HOUR, MINUTE, floor
from views.store.pointers import PointerStore
from views.store.speed import SpeedRows

pytestmark = [pytest.mark.spark, pytest.mark.faults, pytest.mark.timeout(900)]

RATE = 40.0  # live events/s
SEED = 600  # events seeded in the hour before W, and again in [W, now)
LATE = 40  # events of the hour before W produced after its batch run: below the watermark
SKIPPED = "trends_speed_skipped_below_batch_watermark_rows_total"


@dataclass
class Answer:
    """The speed layer's answer for [W, end) against the acknowledged events."""

    gaps: list[dict[str, Any]]
    counts: dict[datetime, int]
    wrong: dict[datetime, tuple[int | None, int]] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return not self.gaps and not self.wrong

    def gap_minutes(self) -> int:
        return sum(int((g["end"] - g["start"]) / MINUTE) for g in self.gaps)


def answer(settings: Settings, start: datetime, end: datetime, acked: Counter[datetime]) -> Answer:
    with session(settings) as sess:
        w = window.load(ViewReader(settings, sess), start, end, GLOBAL_SLICE, coarsest="minute")
    counts = {p["start"]: p["count"] for p in queries.series(w, "minute").points}
    wrong = {m: (counts.get(m), acked[m]) for m in minutes(start, end) if counts.get(m) != acked[m]}
    return Answer(w.provenance.gaps, counts, wrong)


def scrape(speed: SupervisedSpeed, name: str, timeout_s: float = 120) -> int | None:
    """Return a counter of the running job's /metrics (None: it never answered with it)."""
    url = f"http://127.0.0.1:{speed.service.settings.metrics.speed_port}/metrics"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            found = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)", resp.read().decode(), re.M)
            if found:
                return int(float(found.group(1)))
        time.sleep(1)
    return None


def below_met(settings: Settings, since: datetime) -> int:
    """Count the records below ``since`` at or after each partition's first record at or above it (read back)."""
    first: dict[int, int] = {}
    records = sorted(read_topic(settings, settings.kafka.events_topic), key=lambda m: (m.partition(), m.offset()))
    for m in records:
        if m.timestamp()[1] >= since.timestamp() * 1000:
            first.setdefault(m.partition(), m.offset())
    return sum(
        1
        for m in records
        if m.partition() in first and m.offset() > first[m.partition()] and m.timestamp()[1] < since.timestamp() * 1000
    )


def status_line(settings: Settings) -> str:
    st = control.status(settings, ["speed"])[0]
    return f"{st.state} {st.detail}"


def wait_for(what: str, check: Any, timeout_s: float, speed: SupervisedSpeed, every_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    msg = f"{what}: not within {timeout_s:.0f} s\n{tail([speed.service.stdout_file], 80)}"
    raise AssertionError(msg)


class Recovery:
    """What happens after the rm, polled every half second: the status line, the job's exit and restart, the epochs,
    the answer for [W, the last whole minute) — gap minutes, and minutes answered with a count that is not the
    acknowledged one (short) — until a new epoch answers exactly past the deletion.
    """

    def __init__(
        self,
        p: Pipeline,
        speed: SupervisedSpeed,
        since: datetime,
        deleted_at: datetime,
        t_del: float,
        acked: Counter[datetime],
    ) -> None:
        self.p, self.speed, self.since, self.deleted_at, self.t_del = p, speed, since, deleted_at, t_del
        self.acked = acked
        self.seen: list[tuple[float, str]] = []  # each change of what is observed, seconds after the rm
        self._last: dict[str, str] = {}
        self.marks: dict[str, float] = {}
        self.max_gap_minutes = 0
        self.short: dict[datetime, tuple[int | None, int]] = {}
        self.short_seen: list[float] = []  # when a short minute was seen, seconds after the rm

    def note(self, kind: str, line: str) -> None:
        if self._last.get(kind) != line:
            self._last[kind] = line
            self.seen.append((time.monotonic() - self.t_del, f"{kind}: {line}"))

    def mark(self, what: str) -> None:
        self.marks.setdefault(what, time.monotonic() - self.t_del)

    def poll(self) -> bool:
        status = re.sub(r"at batch \d+", "at batch N", status_line(self.p.speed_settings))
        self.note("trends stack status", f"speed {status}")
        state = self.speed.state()
        if state.exits:
            self.mark("exited")
        if state.restarts and state.child_pid is not None:
            self.mark("restarted")
        with session(self.p.settings) as sess:
            epochs = SpeedRows(self.p.settings, sess).epochs(self.p.settings.speed.query_name)
        newest = max(epochs, key=lambda e: e.started_at)
        if len(epochs) > 1:
            self.mark("new epoch")
        # "read into the deletion's minute": its newest minute ends after the rm (live events: it read past it)
        read_past = len(epochs) > 1 and newest.seen_until is not None and newest.seen_until > self.deleted_at
        read_to = f"{newest.seen_until:%H:%M}" if newest.seen_until else "nothing yet"
        self.note("speed view", f"{len(epochs)} epoch(s), the newest read to {read_to}")
        now = datetime.now(UTC)
        to_now = answer(self.p.settings, self.since, floor(now, MINUTE) + MINUTE, self.acked)
        self.max_gap_minutes = max(self.max_gap_minutes, to_now.gap_minutes())  # the current minute included
        got = answer(self.p.settings, self.since, floor(now - timedelta(seconds=5), MINUTE), self.acked)
        gap_starts = {m for g in got.gaps for m in minutes(g["start"], g["end"])}
        short = {m: v for m, v in got.wrong.items() if m not in gap_starts}
        if short:
            self.short.update(short)
            self.short_seen.append(time.monotonic() - self.t_del)
        if read_past and got.exact:
            self.mark("serving again")
            return True
        return False

    def report(self) -> str:
        m = self.marks
        return (
            f"the job exited (lost checkpoint) {m.get('exited', -1):.1f} s after the rm, was restarted by the "
            f"supervisor at {m.get('restarted', -1):.1f} s, its new epoch from the watermark registered at "
            f"{m.get('new epoch', -1):.1f} s, serving again (the new epoch read into the deletion's minute, every "
            f"whole minute from the watermark exact, no gap) at {m.get('serving again', -1):.1f} s; meanwhile the "
            f"answer up to now showed at most {self.max_gap_minutes} minute(s) as a gap, and {self.describe_short()}"
        )

    def describe_short(self) -> str:
        if not self.short:
            return "no whole minute short"
        shown = ", ".join(f"{m:%H:%M} {got} of {acked}" for m, (got, acked) in sorted(self.short.items()))
        return (
            f"answered short (not as a gap): {shown}, seen from {min(self.short_seen):.1f} s to "
            f"{max(self.short_seen):.1f} s after the rm"
        )


def minutes(start: datetime, end: datetime) -> list[datetime]:
    out, m = [], start
    while m < end:
        out.append(m)
        m += MINUTE
    return out


def test_the_checkpoint_deleted_under_the_running_speed_service_restarts_from_the_watermark_no_gap_exact(
    stack_up: Settings, tmp_path: Path, spark: Any
) -> None:
    with private_pipeline(stack_up, tmp_path) as p:
        p.settings = p.settings.model_copy(
            update={"serving": p.settings.serving.model_copy(update={"state_max_age_ms": 0})}
        )
        s = p.speed_settings
        p.speed_settings = s.model_copy(
            update={"speed": s.speed.model_copy(update={"from_watermark": True, "allowed_lateness_s": 3600})}
        )
        run_case(p, spark)


def run_case(p: Pipeline, spark: Any) -> None:
    now = datetime.now(UTC)
    W = floor(now, HOUR)  # noqa: N806 - the batch watermark
    producer = SteadyProducer(p.settings, RATE, on_sample=lambda _ts: None)
    producer.seed(W - HOUR, W, SEED)
    producer.seed(W, now, SEED)
    job.run(p.settings, W - HOUR, W, spark=spark, force=True)  # the hour is complete: force, not the grace
    with session(p.settings) as sess:
        assert PointerStore(p.settings, sess).watermark().mark == W
    producer.seed(W - 30 * MINUTE, W - 29 * MINUTE, LATE)  # late for the batch run, below the watermark
    expected_skipped = below_met(p.settings, W)
    assert expected_skipped >= LATE

    checkpoint = Path(speed_checkpoint(p.speed_settings))
    assert "NO CHECKPOINT" in status_line(p.speed_settings)
    speed = p.start_speed()
    producer.start()

    def exact_until(cutoff_after: datetime) -> Answer | None:
        """The answer for [W, the last whole minute) when it is exact and reaches past ``cutoff_after``."""
        end = floor(datetime.now(UTC) - timedelta(seconds=5), MINUTE)
        if end <= cutoff_after:
            return None
        got = answer(p.settings, W, end, producer.acked_minutes)
        return got if got.exact else None

    try:
        t0 = time.monotonic()
        wait_for("caught up from the watermark", lambda: exact_until(W), 300, speed)
        first_catch_up_s = time.monotonic() - t0
        time.sleep(10)  # a few micro-batches of live traffic on the checkpoint
        before = status_line(p.speed_settings)
        assert f"started from the batch watermark {W.isoformat()}" in before, before
        # the counter is fed by Spark's progress events, which may come after the rows are served: wait for it
        wait_for("the skipped count", lambda: scrape(speed, SKIPPED) == expected_skipped, 60, speed)
        old_job = speed.running_job()

        # The folder goes while the job runs. Spark may write into it meanwhile: remove until it is gone once.
        deleted_at = datetime.now(UTC)
        t_del = time.monotonic()
        while checkpoint.exists():
            shutil.rmtree(checkpoint, ignore_errors=True)
        recovery = Recovery(p, speed, W, deleted_at, t_del, producer.acked_minutes)
        wait_for("serving again from a new epoch, past the deletion", recovery.poll, 300, speed, every_s=0.5)
        assert speed.exits == [EXIT_CHECKPOINT_LOST], (speed.exits, tail([speed.service.stdout_file], 80))
        assert speed.running_job() != old_job
        log = speed.service.stdout_file.read_text(errors="replace")
        assert f"speed checkpoint {checkpoint} lost under the running query" in log, log[-4000:]
        start_record = json.loads((checkpoint / START_FILE).read_text())  # written by the new start
        print(
            f"\nafter the rm at {deleted_at:%H:%M:%S}: {recovery.report()}; the new epoch had "
            f"{start_record['to_read']:,} of the topic's {start_record['topic_records']:,} records to read"
        )
        for t, line in recovery.seen:
            print(f"  +{t:5.1f} s  {line}")
        # While it recovered, every whole minute was a gap or exact: the minute the old epoch died in ends after the
        # last time it read the whole topic, so it is a gap (not what the old epoch had read of it) until the new
        # epoch has read past it.
        assert not recovery.short, recovery.describe_short()
        # the new epoch met the same late records, and the new run knows it was restarted once
        wait_for("the skipped count again", lambda: scrape(speed, SKIPPED) == expected_skipped, 60, speed)
        assert scrape(speed, "trends_speed_restarts_total") == 1
        time.sleep(10)  # live traffic on the new checkpoint
    finally:
        undelivered = producer.stop()
    assert undelivered == 0 and not producer.failed, producer.failed[:5]

    end = max(m for m, n in producer.acked_minutes.items() if n) + MINUTE

    def final_answer() -> Answer | None:
        got = answer(p.settings, W, end, producer.acked_minutes)
        return got if got.exact else None

    final = wait_for("the last events answered", final_answer, 180, speed)
    acked = sum(n for m, n in producer.acked_minutes.items() if W <= m < end)
    assert sum(final.counts.values()) == acked and len(final.counts) == int((end - W) / MINUTE)
    with session(p.settings) as sess:
        epochs = SpeedRows(p.settings, sess).epochs(p.settings.speed.query_name)
    assert [e.covered_from for e in epochs] == [W, W], epochs
    assert all(e.starting_offsets.startswith(f"watermark {W.isoformat()}") for e in epochs)
    assert speed.restarts == 1 and speed.exits == [EXIT_CHECKPOINT_LOST]
    after = status_line(p.speed_settings)
    assert "restarts 1 (last exit 75: checkpoint lost at" in after, after
    assert f"started from the batch watermark {W.isoformat()}" in after, after
    state = checkpoint_state(p.speed_settings)
    assert state.exists and state.from_watermark
    remnants = sorted(x.name for x in checkpoint.parent.glob(f"{checkpoint.name}.lost-*"))
    print(
        f"\nlost checkpoint: caught up from the watermark {W:%H:%M} in {first_catch_up_s:.1f} s; deleted under the "
        f"running job at {deleted_at:%H:%M:%S}; "
        f"final window {W:%H:%M}-{end:%H:%M}: {acked} acknowledged events, {sum(final.counts.values())} answered, "
        f"gap minutes {final.gap_minutes()}; {SKIPPED} {expected_skipped} per start; remnants moved aside: "
        f"{remnants or 'none'}"
    )
