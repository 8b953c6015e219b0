"""The horizon of the events topic, read from the event-time index: is an interval closed yet.

An interval is closed once every partition still receiving records has passed its end plus the grace (the rule,
:func:`views.store.index.index_horizon`, is shared with serving's console); idle partitions do not hold it back.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from infra.cassandra import session
from infra.settings import Settings
from views.store.index import Horizon, IndexStore, index_horizon


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
    return index_horizon(states.values(), now or datetime.now(UTC), timedelta(seconds=settings.batch.idle_partition_s))
