"""Which Kafka offsets hold an interval's events, and whether the interval may be computed yet.

Events carry their event time as the Kafka record timestamp, so ``ListOffsets`` by timestamp finds, per
partition, the first record at or after a time. For ``[start, end)`` we read from the first record at or after
``start - lateness`` to the first record at or after ``end + lateness`` (exclusive): every event of the interval
that arrived no later than the lateness allowance lies in between (records before the start bound all have
earlier times; an event found past the end bound arrived more than the allowance late, which the speed layer
would have dropped too).

Two refusals, never a silent partial result:

* **not closed** — the interval is closed when, in every partition that holds records, the newest event time
  (``MAX_TIMESTAMP``) has passed ``end + grace``; the grace is at least the lateness allowance.
* **data lost** — the range would begin at the oldest record retention kept (``earliest > 0``): records before
  it, now deleted, may have belonged to the interval.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from infra.errors import TrendsError
from infra.settings import KafkaSettings

logger = logging.getLogger(__name__)

TIMEOUT_S = 30.0


class IntervalNotClosedError(TrendsError):
    """The interval may still receive events in time; computing it now would be premature."""


class DataLossError(TrendsError):
    """Kafka no longer holds all the offsets the interval needs."""


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition to read for an interval, plus where the interval's end falls."""

    partition: int
    start: int
    end: int
    interval_end: int  # first offset with timestamp >= interval end: events after it arrived after the interval
    earliest: int
    latest: int

    @property
    def records(self) -> int:
        """Return how many records the range holds."""
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class OffsetPlan:
    """The offset ranges of one interval, as recorded in the lineage."""

    topic: str
    ranges: tuple[PartitionRange, ...]

    def spark_offsets(self) -> tuple[str, str]:
        """Return ``startingOffsets`` and ``endingOffsets`` JSON for Spark's Kafka batch source."""
        starts = {str(r.partition): r.start for r in self.ranges}
        ends = {str(r.partition): r.end for r in self.ranges}
        return json.dumps({self.topic: starts}), json.dumps({self.topic: ends})

    def to_json(self) -> str:
        """Return the lineage form: per partition ``[start, end)``."""
        return json.dumps({str(r.partition): [r.start, r.end] for r in self.ranges}, sort_keys=True)

    @property
    def records(self) -> int:
        """Return the records the plan reads."""
        return sum(r.records for r in self.ranges)


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def _list_offsets(admin: Any, topic: str, partitions: list[int], spec: Any) -> dict[int, tuple[int, int]]:
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    request = {TopicPartition(topic, p): spec for p in partitions}
    futures = admin.list_offsets(request, request_timeout=TIMEOUT_S)
    out = {}
    for tp, future in futures.items():
        info = future.result(timeout=TIMEOUT_S)
        out[tp.partition] = (int(info.offset), int(info.timestamp))
    return out


def _admin(kafka: KafkaSettings) -> Any:
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    return AdminClient({**kafka.client_config(), "log_level": 3})


def partitions_of(admin: Any, topic: str) -> list[int]:
    """Return the partition ids of a topic.

    :raises TrendsError: when the topic does not exist.
    """
    meta = admin.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        msg = f"topic {topic} does not exist"
        raise TrendsError(msg)
    return sorted(meta.partitions)


def newest_event_times(kafka: KafkaSettings, topic: str) -> dict[int, datetime | None]:
    """Return, per partition, the newest record timestamp (None for an empty partition)."""
    from confluent_kafka.admin import OffsetSpec  # noqa: PLC0415

    admin = _admin(kafka)
    parts = partitions_of(admin, topic)
    newest = _list_offsets(admin, topic, parts, OffsetSpec.max_timestamp())  # type: ignore[no-untyped-call]
    return {
        p: datetime.fromtimestamp(ts / 1000, UTC) if offset >= 0 and ts >= 0 else None
        for p, (offset, ts) in newest.items()
    }


def closed_at(kafka: KafkaSettings, topic: str) -> datetime | None:
    """Return the time up to which every non-empty partition has moved on (the minimum newest event time)."""
    times = [t for t in newest_event_times(kafka, topic).values() if t is not None]
    return min(times) if times else None


def check_closed(kafka: KafkaSettings, topic: str, end: datetime, grace: timedelta) -> None:
    """Raise :class:`IntervalNotClosedError` unless every non-empty partition has passed ``end + grace``."""
    horizon = closed_at(kafka, topic)
    if horizon is None or horizon < end + grace:
        shown = horizon.isoformat() if horizon else "no events at all"
        msg = (
            f"the interval ending {end.isoformat()} is not closed: the newest event time common to all partitions "
            f"is {shown}, and it must pass {(end + grace).isoformat()} (end + grace). Wait, or use --force."
        )
        raise IntervalNotClosedError(msg)


def plan(kafka: KafkaSettings, topic: str, start: datetime, end: datetime, lateness: timedelta) -> OffsetPlan:
    """Resolve the per-partition offset ranges of ``[start, end)`` widened by the lateness allowance.

    :raises DataLossError: when retention removed records the interval may need.
    """
    from confluent_kafka.admin import OffsetSpec  # noqa: PLC0415

    admin = _admin(kafka)
    parts = partitions_of(admin, topic)
    earliest = _list_offsets(admin, topic, parts, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
    latest = _list_offsets(admin, topic, parts, OffsetSpec.latest())  # type: ignore[no-untyped-call]

    def at(ts: datetime) -> dict[int, int]:
        found = _list_offsets(admin, topic, parts, OffsetSpec.for_timestamp(_ms(ts)))
        # -1: no record at or after ts yet -> the range runs to the end of the partition
        return {p: off if off >= 0 else latest[p][0] for p, (off, _ts) in found.items()}

    starts, ends, interval_ends = at(start - lateness), at(end + lateness), at(end)
    ranges = tuple(
        PartitionRange(p, starts[p], max(starts[p], ends[p]), interval_ends[p], earliest[p][0], latest[p][0])
        for p in parts
    )
    lost = [r for r in ranges if r.earliest > 0 and r.start <= r.earliest]
    if lost:
        detail = ", ".join(f"partition {r.partition} starts at offset {r.earliest}" for r in lost)
        msg = (
            f"Kafka no longer holds all events of [{start.isoformat()}, {end.isoformat()}) in {topic}: retention "
            f"removed the records before the range ({detail}). Refusing a partial result."
        )
        raise DataLossError(msg)
    return OffsetPlan(topic, ranges)
