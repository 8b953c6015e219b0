"""The horizon of the events topic: how far event time has moved on, as the index saw it.

An interval is closed once every partition still receiving records has passed its end plus the grace (the rule,
:func:`views.store.index.index_horizon`, is shared with serving's console); idle partitions do not hold it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from infra.cassandra import session
from infra.settings import Settings
from views.store.index import IndexStore, PartitionState, index_horizon


@dataclass(frozen=True)
class Horizon:
    """How far event time has moved on in the topic, as the index saw it."""

    closed_at: datetime | None  # every partition that still receives records has passed this time
    held_by: int | None  # the partition whose newest record is the oldest (None: no active partition)
    idle: tuple[int, ...]  # partitions with records but none new for longer than the idle setting
    newest: dict[int, datetime | None]

    def describe(self) -> str:
        """Return a line for status output."""
        idle = f"; idle partitions (ignored): {', '.join(map(str, self.idle))}" if self.idle else ""
        held = f"held back by partition {self.held_by}" if self.held_by is not None else "no active partition"
        shown = self.closed_at.isoformat() if self.closed_at else "no events indexed"
        return f"event time closed up to {shown} ({held}{idle})"


def horizon_of(states: Iterable[PartitionState], now: datetime, idle_after: timedelta) -> Horizon:
    """Return the time every partition still receiving records has passed.

    A partition without a new record for longer than ``idle_after`` (wall time, as the indexer saw it) is idle and
    does not hold the horizon back, as Flink's ``withIdleness`` does for watermarks. When every partition is idle
    the stream as a whole is quiet: its horizon is the newest record time or ``now - idle_after``, whichever is
    later (an event arriving after that is late, and the hour it belongs to turns stale and is recomputed). The
    horizon never runs ahead of the wall clock.
    """
    states = list(states)
    rule = index_horizon(states, now, idle_after)
    return Horizon(rule.closed_at, rule.held_by, rule.idle, {s.partition: s.max_ts for s in states})


def horizon(
    settings: Settings, topic: str | None = None, now: datetime | None = None, store: IndexStore | None = None
) -> Horizon:
    """Return the topic's horizon from the index checkpoint (index first for a fresh one).

    :arg store: the index's store on the caller's session; None opens a session to read it.
    """
    topic = topic or settings.kafka.events_topic
    if store is not None:
        states = store.states(topic)
    else:
        with session(settings) as sess:
            states = IndexStore(settings, sess).states(topic)
    return horizon_of(states.values(), now or datetime.now(UTC), timedelta(seconds=settings.batch.idle_partition_s))
