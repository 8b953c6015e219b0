"""Which Kafka offsets hold a set of hours (from the event-time index), and whether the hours may be computed.

A plan reads exactly the indexed spans of its hours, merged per partition into ranges (Spark's Kafka batch source
takes one range per partition per read, so the k-th ranges of all partitions form the k-th read, and the reads
are unioned). Records of other hours inside the ranges are dropped by the transform, by the hour their timestamp names.

Three refusals, never a silent partial result:

* **not closed** — the hours' end is closed when every *active* partition's newest record time (as the index
  saw it) has passed ``end + grace`` (the one closed-hour rule, :func:`views.buckets.is_closed`); idle partitions
  do not hold it back (:func:`views.store.index.index_horizon`).
* **data lost** — a range begins before the oldest offset retention kept: records the hours need are gone.
* **incomplete** — records removed before the index read them may belong to the hours
  (:mod:`views.store.losses`), unless the operator accepts the loss.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infra.errors import TrendsError
from infra.settings import Settings
from views import buckets
from views.buckets import HOUR
from views.indexing import kafka_topic
from views.store.index import Horizon, IndexStore, OffsetSpan
from views.store.losses import Loss, LossStore

logger = logging.getLogger(__name__)


class IntervalNotClosedError(TrendsError):
    """The interval may still receive events in time; computing it now would be premature."""


class DataLossError(TrendsError):
    """Kafka no longer holds all the offsets the interval needs."""


class LossNotAcceptedError(TrendsError):
    """Records that may belong to the hours were removed before they were indexed, and nobody accepted the loss."""


def refuse_loss(topic: str, incomplete: dict[datetime, list[Loss]], flag: str = "--accept-loss") -> None:
    """Raise :class:`LossNotAcceptedError` naming the losses and the flag, when some hour is incomplete."""
    if not incomplete:
        return
    hours = sorted(incomplete)
    losses = {x.key: x for ls in incomplete.values() for x in ls}
    named = "; ".join(x.describe() for _, x in sorted(losses.items()))
    msg = (
        f"{len(hours)} hour(s) from {hours[0].isoformat()} to {hours[-1].isoformat()} are incomplete: records of "
        f"{topic} were removed before they were indexed and may belong to them ({named}). Computing them would "
        f"complete them as if whole. Recompute with {flag} to accept the loss (the lineage records it)."
    )
    raise LossNotAcceptedError(msg)


def incomplete_of(losses: LossStore, topic: str, hours: Sequence[datetime]) -> dict[datetime, list[Loss]]:
    """Return the hours (of ``hours``) that a loss not accepted for them may touch, with the losses."""
    if not hours:
        return {}
    wanted = set(hours)
    found = losses.incomplete(topic, min(hours), max(hours) + HOUR)
    return {h: ls for h, ls in found.items() if h in wanted}


def accepted_or_refused(
    losses: LossStore, topic: str, hours: Sequence[datetime], accept_loss: bool
) -> dict[datetime, list[Loss]]:
    """Return the incomplete hours a run accepts the loss of; refuse them when it does not."""
    incomplete = incomplete_of(losses, topic, hours)
    if not accept_loss:
        refuse_loss(topic, incomplete)
    elif incomplete:
        logger.warning("accepting the loss for %s incomplete hour(s): %s", len(incomplete), describe_losses(incomplete))
    return incomplete


def describe_losses(incomplete: dict[datetime, list[Loss]]) -> str:
    """Return the losses touching the hours, each described once."""
    return "; ".join(x.describe() for x in {x.key: x for ls in incomplete.values() for x in ls}.values())


@dataclass(frozen=True)
class Range:
    """Offsets ``[start, end)`` of one partition read by a pass."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class HourPlan:
    """The indexed spans of one hour, as recorded in its lineage."""

    hour: datetime
    spans: tuple[OffsetSpan, ...]

    @property
    def records(self) -> int:
        """Return the indexed records of the hour."""
        return sum(s.records for s in self.spans)

    @property
    def late(self) -> int:
        """Return the indexed records of the hour that arrived after their partition had passed its end."""
        return sum(s.late for s in self.spans)

    def to_json(self) -> str:
        """Return the lineage form: per partition the ``[start, end)`` offset spans holding the hour's records."""
        out: dict[str, list[list[int]]] = {}
        for s in sorted(self.spans, key=lambda s: (s.partition, s.first)):
            out.setdefault(str(s.partition), []).append([s.first, s.last + 1])
        return json.dumps(out, sort_keys=True)


@dataclass(frozen=True)
class Plan:
    """The hours of one Spark pass and the offset ranges that hold their records."""

    topic: str
    hours: tuple[HourPlan, ...]
    ranges: tuple[Range, ...]

    @property
    def records(self) -> int:
        """Return the indexed records of the plan's hours."""
        return sum(h.records for h in self.hours)

    @property
    def span_records(self) -> int:
        """Return the width of the ranges in offsets, which is more than the records they hold.

        Besides the hours' records and others between them, a transactional writer's log has holes: the offsets
        of transaction markers and of aborted records.
        """
        return sum(r.end - r.start for r in self.ranges)

    def reads(self) -> list[tuple[str, str, str]]:
        """Return ``(assign, startingOffsets, endingOffsets)`` JSON of each read: the k-th range of each partition."""
        per: dict[int, list[Range]] = {}
        for r in self.ranges:
            per.setdefault(r.partition, []).append(r)
        out = []
        for k in range(max((len(v) for v in per.values()), default=0)):
            chosen = {p: rs[k] for p, rs in sorted(per.items()) if len(rs) > k}
            out.append(
                (
                    json.dumps({self.topic: sorted(chosen)}),
                    json.dumps({self.topic: {str(p): r.start for p, r in chosen.items()}}),
                    json.dumps({self.topic: {str(p): r.end for p, r in chosen.items()}}),
                )
            )
        return out


def coalesce(spans: Iterable[OffsetSpan], gap: int, max_ranges: int) -> list[Range]:
    """Merge spans into offset ranges per partition.

    Overlapping spans and spans at most ``gap`` records apart are merged, then the closest ones until a partition
    has at most ``max_ranges`` (each range is one more Spark read).
    """
    per: dict[int, list[OffsetSpan]] = {}
    for s in spans:
        per.setdefault(s.partition, []).append(s)
    out: list[Range] = []
    for p, ss in sorted(per.items()):
        merged: list[list[int]] = []
        for s in sorted(ss, key=lambda s: s.first):
            if merged and s.first <= merged[-1][1] + gap:
                merged[-1][1] = max(merged[-1][1], s.last + 1)
            else:
                merged.append([s.first, s.last + 1])
        while len(merged) > max_ranges:
            i = min(range(len(merged) - 1), key=lambda i: merged[i + 1][0] - merged[i][1])
            merged[i : i + 2] = [[merged[i][0], merged[i + 1][1]]]
        out += [Range(p, a, b) for a, b in merged]
    return out


def plan(settings: Settings, store: IndexStore, hours: Sequence[datetime], topic: str | None = None) -> Plan:
    """Return the plan of the hours from the index.

    :raises DataLossError: when retention removed records the hours need.
    """
    topic = topic or settings.kafka.events_topic
    spans = store.spans(topic, hours)
    hour_plans = tuple(HourPlan(h, tuple(spans[h])) for h in hours)
    ranges = coalesce(
        (s for h in hour_plans for s in h.spans),
        settings.batch.index_span_gap,
        settings.batch.max_ranges_per_partition,
    )
    earliest = kafka_topic.earliest_offsets(settings.kafka, topic, {r.partition for r in ranges})
    lost = [r for r in ranges if r.start < earliest.get(r.partition, 0)]
    if lost:
        first = {r.partition for r in lost}
        gone = sorted(
            {h.hour for h in hour_plans for s in h.spans if s.partition in first and s.first < earliest[s.partition]}
        )
        detail = ", ".join(f"partition {r.partition} starts at offset {earliest[r.partition]}" for r in lost)
        msg = (
            f"Kafka no longer holds all records of {len(gone)} hour(s) from {gone[0].isoformat()} in {topic}: "
            f"retention removed the records before the range ({detail}). Refusing a partial result."
        )
        raise DataLossError(msg)
    return Plan(topic, hour_plans, tuple(ranges))


def check_closed(h: Horizon, end: datetime, settings: Settings) -> None:
    """Raise :class:`IntervalNotClosedError` unless the interval ending at ``end`` is closed at the horizon."""
    if not buckets.is_closed(h.closed_at, end, settings):
        due = end + buckets.closing_grace(settings)
        msg = (
            f"the interval ending {end.isoformat()} is not closed: {h.describe()}, and it must pass "
            f"{due.isoformat()} (end + grace). Wait, or use --force."
        )
        raise IntervalNotClosedError(msg)


def is_closed(h: Horizon, end: datetime, settings: Settings) -> bool:
    """Tell whether the interval ending at ``end`` is closed at the horizon (:func:`buckets.is_closed`)."""
    return buckets.is_closed(h.closed_at, end, settings)


def describe_ranges(ranges: Sequence[Range]) -> dict[str, Any]:
    """Return the ranges as a JSON-able dict (progress and logs)."""
    return {str(r.partition): [r.start, r.end] for r in ranges}
