"""The speed job reads its query's progress by polling: every batch reported once, missed ones read back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from speed_layer import job


@dataclass
class Report:
    batchId: int  # noqa: N815 - pyspark's name

    @property
    def json(self) -> str:
        return json.dumps({"batchId": self.batchId, "numInputRows": 10, "durationMs": {"addBatch": 5}})


@dataclass
class FakeQuery:
    done: list[int] = field(default_factory=list)
    trigger_active: bool = False
    data_available: bool = True

    @property
    def lastProgress(self) -> Report | None:  # noqa: N802
        return Report(self.done[-1]) if self.done else None

    @property
    def recentProgress(self) -> list[Report]:  # noqa: N802
        return [Report(b) for b in self.done[-100:]]

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": self.trigger_active, "isDataAvailable": self.data_available}


class Recorder:
    """Stands in for the adapter (``on_progress``) and its metrics registry (``idle``)."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.idles = 0
        self.registry = self
        self.read_all_at: list[datetime] = []

    def on_progress(self, progress: dict[str, Any]) -> None:
        self.batches.append(progress["batchId"])

    def idle(self) -> None:
        self.idles += 1

    def read_all(self, at: datetime) -> None:
        self.read_all_at.append(at)


TRIGGER_S = 2.0


@pytest.fixture
def poller() -> tuple[FakeQuery, Recorder, Any]:
    query, rec = FakeQuery(), Recorder()
    return query, rec, job._ProgressPoller(query, rec, TRIGGER_S)  # type: ignore[arg-type]


def test_each_batch_is_reported_once_and_missed_ones_are_read_back(poller: tuple[FakeQuery, Recorder, Any]) -> None:
    query, rec, p = poller
    p.poll()
    assert rec.batches == []
    query.done = [7]  # a restarted query resumes at its checkpoint's batch
    p.poll()
    p.poll()
    query.done += [8, 9, 10]  # three batches between two polls
    p.poll()
    query.done += [11]
    p.poll()
    assert rec.batches == [7, 8, 9, 10, 11]


def test_the_final_poll_reports_every_batch_not_seen_yet(poller: tuple[FakeQuery, Recorder, Any]) -> None:
    query, rec, p = poller
    query.done = [0, 1, 2]  # an availableNow query that ended between two polls
    p.poll(final=True)
    assert rec.batches == [0, 1, 2]
    p.poll(final=True)
    assert rec.batches == [0, 1, 2]


@pytest.fixture
def clock(poller: tuple[FakeQuery, Recorder, Any], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The driver's monotonic clock, moved by hand; the poller's timers start at it."""
    now = [1000.0]
    monkeypatch.setattr(job.time, "monotonic", lambda: now[0])
    poller[2]._idle_checked = poller[2]._alive_reported = now[0]
    return now


def test_a_query_waiting_for_data_is_reported_alive_but_a_running_batch_is_not(
    poller: tuple[FakeQuery, Recorder, Any], clock: list[float]
) -> None:
    query, rec, p = poller
    clock[0] += job.IDLE_EVERY_S + 1
    p.poll()
    assert rec.idles == 1
    query.trigger_active = True  # a batch that hangs: no sign of life
    clock[0] += job.IDLE_EVERY_S + 1
    p.poll()
    assert rec.idles == 1


def test_a_trigger_that_found_no_new_data_read_the_whole_topic_a_waiting_one_with_data_did_not(
    poller: tuple[FakeQuery, Recorder, Any], clock: list[float]
) -> None:
    """Serving answers a minute ending after the epoch's read_all_at only while it is under way: idle is caught up."""
    query, rec, p = poller
    query.done = [3]
    p.poll()  # a batch: its own report says whether it read to the end (the adapter's job)
    clock[0] += TRIGGER_S
    p.poll()  # waiting for the next trigger with data seen last time: nothing is known of what came since
    assert rec.read_all_at == []
    query.data_available = False  # the last trigger found nothing new
    clock[0] += TRIGGER_S / 2
    p.poll()  # not before a trigger interval since the last look
    assert rec.read_all_at == []
    clock[0] += TRIGGER_S / 2
    before = datetime.now(UTC)
    p.poll()
    assert len(rec.read_all_at) == 1
    lag = before - rec.read_all_at[0]
    assert timedelta(seconds=TRIGGER_S) <= lag <= timedelta(seconds=TRIGGER_S + job.STATUS_SLACK_S + 1)
    query.trigger_active = True  # a trigger running: the status says nothing yet
    clock[0] += TRIGGER_S
    p.poll()
    assert len(rec.read_all_at) == 1
