"""The serving side's health as users feel it: minutes answered as gaps, recorded losses, what a pin hands over.

Each reads through the same loader as every answer (:func:`serving.window.load`), so the figures the API's status,
metrics and console show cannot disagree with the answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from serving.plan import GAP_REASONS, runs
from serving.reader import ViewReader
from serving.window import load
from views.buckets import DAY, HOUR, MINUTE, floor


def gap_minutes(reader: ViewReader, now: datetime, hours: int = 24) -> dict[str, int]:
    """Return, by reason, the minutes of the last ``hours`` (to the current minute) an answer reports as gaps.

    The symptom users feel: a figure over these minutes leaves them out. The current minute is excluded (nothing
    has been seen of it yet by definition).
    """
    end = floor(now, MINUTE)
    start = end - hours * HOUR
    window = load(reader, start, end, "*", "hour", ())
    out = dict.fromkeys(GAP_REASONS, 0)
    for g in window.provenance.gaps:
        out[g["reason"]] = out.get(g["reason"], 0) + int((g["end"] - g["start"]) / MINUTE)
    return out


@dataclass(frozen=True)
class GapSpan:
    """Minutes an answer reports as a gap, and why."""

    start: datetime
    end: datetime
    reason: str


@dataclass(frozen=True)
class PinEffect:
    """What a pin below the watermark hands to the speed view (``[pinned, watermark)``), and what it still covers."""

    pinned: datetime
    watermark: datetime
    moved_to_speed_minutes: int
    covered_minutes: int
    gaps: list[GapSpan]


class LossRecord(BaseModel):
    """Records removed from Kafka before the index read them (times as ISO-8601 text, as in the lineage).

    A pydantic model rather than a dataclass like its neighbours: the console's :class:`~serving.console_model.LossInfo`
    extends it with its explanation.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int
    noticed_at: str | None
    older_than: str | None
    retention_ms: int | None
    oldest_surviving: str | None
    hours_before: str


@dataclass(frozen=True)
class IncompleteRange:
    """Hours that lost records may belong to (not accepted yet), and the losses (``partition:first..last``)."""

    start: datetime
    end: datetime
    losses: list[str]


def losses(reader: ViewReader, now: datetime) -> tuple[list[LossRecord], list[IncompleteRange]]:
    """Return the recorded losses and the incomplete hours (ranges) from the batch view's first hour up to now."""
    topic = reader.settings.kafka.events_topic
    found = reader.loss_store.losses(topic)
    if not found:
        return [], []
    low = reader.pointer_store.watermark().low or floor(now, HOUR) - 7 * DAY
    start = min(low, min(loss.hours_end for loss in found) - HOUR)
    incomplete = reader.loss_store.incomplete(topic, start, floor(now, HOUR) + HOUR, found)
    keys = [(h, tuple(f"{x.partition}:{x.first_offset}..{x.last_offset}" for x in xs)) for h, xs in incomplete.items()]
    ranges = [IncompleteRange(a, b, list(v)) for a, b, v in runs(keys, HOUR)]
    return [LossRecord(**loss.to_json()) for loss in found], ranges


def pin_effect(reader: ViewReader) -> PinEffect | None:
    """Say what a pin hands to the speed view (``[pin, watermark)``) and which of those minutes it still covers.

    :returns: None when there is no pin below the watermark.
    """
    mark = reader.pointer_store.watermark()
    if mark.pinned is None or mark.mark is None or mark.pinned >= mark.mark:
        return None
    window = load(reader, mark.pinned, mark.mark, "*", "hour", ())  # the boundary is the pin: all of it is speed's
    gaps = window.provenance.gaps
    moved = int((mark.mark - mark.pinned) / MINUTE)
    return PinEffect(
        pinned=mark.pinned,
        watermark=mark.mark,
        moved_to_speed_minutes=moved,
        covered_minutes=moved - sum(int((g["end"] - g["start"]) / MINUTE) for g in gaps),
        gaps=[GapSpan(g["start"], g["end"], g["reason"]) for g in gaps],
    )


@dataclass(frozen=True)
class SpeedEpochInfo:
    """A checkpoint's lifetime of the serving speed query: a minute is answered by the newest epoch counting it."""

    epoch: str
    started_at: datetime
    covered_from: datetime | None
    seen_until: datetime | None
    starting_offsets: str


@dataclass(frozen=True)
class ViewVersionInfo:
    """The view version answers come from: the serving speed query and its definition's fingerprint."""

    query: str
    fingerprint: str | None


@dataclass(frozen=True)
class StaleHour:
    """A batch hour whose records grew after its run (late data): served as it was until recomputed."""

    hour: datetime
    records_since: int


@dataclass(frozen=True)
class Status:
    """The boundary between the layers, the pin, the speed layer's epochs and freshness, stale and lost hours."""

    now: datetime
    boundary: datetime | None
    boundary_pinned: bool
    batch_low: datetime | None
    speed_newest_event: datetime | None
    speed_updated_at: datetime | None
    speed_lag_s: float | None
    speed_epochs: list[SpeedEpochInfo]
    pin: PinEffect | None  # a pin below the watermark hands [pin, watermark) to the speed view
    slice_dims: list[str]
    view_version: ViewVersionInfo | None
    refresh_s: float
    stale_hours: list[StaleHour]
    losses: list[LossRecord]  # records removed from Kafka before the index read them
    incomplete_hours: list[IncompleteRange]  # the hours they may belong to (not accepted)
