"""The operator console's answer (``GET /api/v1/console``) as types: what the OpenAPI document and Schemathesis check.

:mod:`serving.console` assembles it and :mod:`serving.console_sources` fills the sections read beyond the views
(Airflow, the dead letters, the erasure ledger). Every model forbids extra fields, so the document says exactly
what a body holds; a section that could not be read has its own shape (``reachable``/``readable`` false and the
error), never an error of the page.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from infra.privacy.ledger import RequestInfo
from serving.status import LossRecord

SpeedState = Literal["covered", "expired", "started_after", "stopped", "not_yet_seen"]
BatchState = Literal["completed", "empty", "stale", "incomplete", "missing"]


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- an hour's strip --------------------------------------------------------------------------------------------
class SpeedSegmentInfo(_Body):
    """Consecutive minutes in one speed state, owned by one epoch, explained."""

    start: datetime
    end: datetime
    state: SpeedState
    epoch: str | None
    events: int  # events in the speed rows read (covered minutes), or counted there (expired ones)
    minutes: int
    why: str


class BatchInfo(_Body):
    """The batch run holding an hour, or why none does."""

    state: BatchState
    run_id: str | None
    events: int | None
    indexed: int | None
    records_since: int | None
    incomplete: list[str] | str  # the losses the hour may miss, or "unknown" when they could not be read
    why: str


class ServedSpan(_Body):
    """Minutes an answer takes from one view at one resolution."""

    start: datetime
    end: datetime
    layer: str
    resolution: str


class GapInfo(_Body):
    """Minutes an answer reports as a gap, and why."""

    start: datetime
    end: datetime
    reason: str
    minutes: int


class Reconciliation(_Body):
    """An hour's last check of the batch view against the speed view."""

    run_id: str
    checked_at: datetime
    beyond_bound: int  # the largest difference beyond the sketches' bounds, in events (0: within them)
    ok: bool


class HourStrip(_Body):
    """One hour: its batch state, its speed coverage, the answer's sources and gaps, each explained."""

    hour: datetime
    below_boundary: bool
    batch: BatchInfo
    speed: list[SpeedSegmentInfo]
    served: list[ServedSpan]
    gaps: list[GapInfo]
    events: int
    reconciliation: Reconciliation | str | None  # None: never checked
    why: list[str]


# -- around the strips ------------------------------------------------------------------------------------------
class PinMove(_Body):
    """The minutes a pin below the watermark moves to the speed view, and how many the speed view still covers."""

    start: datetime
    end: datetime
    minutes: int
    covered: int
    by_state: dict[SpeedState, int]
    holes: list[SpeedSegmentInfo]  # at most 50


class PinInfo(_Body):
    """What the pin moves between the views."""

    moves_to_speed: PinMove | None
    why: str


class BoundaryInfo(_Body):
    """The batch watermark, its low end and the pin: where the batch view stops answering."""

    boundary: datetime | None
    watermark: datetime | None
    low: datetime | None
    pinned: datetime | None
    pin: PinInfo | None
    why: str


class PartitionInfo(_Body):
    """The event-time index's checkpoint of one partition."""

    partition: int
    next_offset: int
    max_ts: datetime | None
    last_record_at: datetime | None


class HorizonInfo(_Body):
    """How far event time has closed in the events topic, and the partition holding it back."""

    topic: str
    closed_at: datetime | None
    held_by: int | None
    idle: list[int]
    idle_after_s: int
    partitions: list[PartitionInfo]
    why: str


class ServingVersionInfo(_Body):
    """The speed query answers come from, and the definition it computes."""

    query: str
    fingerprint: str | None
    previous_query: str | None
    promoted_at: datetime | None


class QueryVersion(_Body):
    """A speed query (the serving one, or another with a recent epoch) and its current epoch's progress."""

    query: str
    serving: bool
    definition: str | None  # the fingerprint of the definition its epoch computes
    epoch: str | None
    counts_from: datetime | None
    seen_until: datetime | None
    updated_at: datetime | None


class Versions(_Body):
    """The view versions, and the batch hours computed with another definition than the serving one."""

    serving: ServingVersionInfo
    queries: list[QueryVersion]
    old_definition_hours: int
    old_definition_first: datetime | None
    old_definition_last: datetime | None


class CheckpointInfo(_Body):
    """The speed checkpoint as this host sees it (none: the next start is a new epoch, from where)."""

    location: str
    exists: bool | None
    last_batch: int | None
    from_watermark: bool
    next_start: str
    why: str


class EpochInfo(_Body):
    """A checkpoint's lifetime of the serving speed query."""

    id: str
    started_at: datetime
    covered_from: datetime | None
    counts_from: datetime | None
    seen_until: datetime | None
    starting_offsets: str
    last_batch_id: int | None


class SpeedInfo(_Body):
    """The speed layer: its query, checkpoint, freshness and epochs."""

    query: str
    checkpoint: CheckpointInfo
    fresh_until: datetime | None
    newest_event: datetime | None
    updated_at: datetime | None
    lag_s: float | None
    epochs: list[EpochInfo]


class AnswerInfo(_Body):
    """The merged answer over the whole range."""

    events: int
    gaps: int


class LossInfo(LossRecord):
    """A loss as ``/status`` shows it, and why the hours before its bound are incomplete."""

    why: str


# -- the sections read beyond the views ---------------------------------------------------------------------------
class NoAnswer(_Body):
    """A slow source (Airflow, Kafka) that did not answer within the request's wait."""

    reachable: Literal[False]
    error: str


class BackfillRun(_Body):
    """A ``trends_backfill`` run: its range (as Airflow holds it), state and chunks by state."""

    run_id: str | None
    state: str | None
    start: str | None
    end: str | None
    only_missing: bool
    started_at: str | None
    ended_at: str | None
    chunks_total: int
    chunks_done: int
    chunks_failed: int
    chunks_by_state: dict[str, int]
    progress: str


class Backfills(_Body):
    """The newest ``trends_backfill`` runs."""

    reachable: Literal[True]
    url: str
    dag: str
    runs: list[BackfillRun]


class AirflowUnreachable(_Body):
    """Airflow answered with an error, or not at all."""

    reachable: Literal[False]
    url: str
    error: str
    runs: list[BackfillRun]  # empty


class DeadLetters(_Body):
    """The newest dead letters counted by reason."""

    reachable: Literal[True]
    topic: str
    total: int
    scanned: int
    complete: bool
    by_reason: dict[str, int]
    oldest: datetime | None
    newest: datetime | None


class KafkaUnreachable(_Body):
    """Kafka could not be read for the dead letters."""

    reachable: Literal[False]
    topic: str
    error: str


class Erasures(_Body):
    """The erasure ledger's requests (hashes only; pending first, oldest first)."""

    readable: Literal[True]
    pending: int
    done: int
    failed: int
    oldest_pending_age_s: float | None
    deadline_days: int
    overdue: bool
    requests: list[RequestInfo]


class ErasuresUnreadable(_Body):
    """The erasure ledger could not be read."""

    readable: Literal[False]
    error: str


AirflowSection = Backfills | AirflowUnreachable | NoAnswer
DeadLetterSection = DeadLetters | KafkaUnreachable | NoAnswer
ErasureSection = Erasures | ErasuresUnreadable


class ConsoleAnswer(_Body):
    """Why each hour of a range answers as it does, and what feeds the answers."""

    start: datetime
    end: datetime
    now: datetime
    max_hours: int
    refresh_s: float
    boundary: BoundaryInfo
    horizon: HorizonInfo
    versions: Versions
    speed: SpeedInfo
    answer: AnswerInfo
    hours: list[HourStrip]
    losses: list[LossInfo]
    erasures: ErasureSection
    airflow: AirflowSection
    dead_letters: DeadLetterSection
