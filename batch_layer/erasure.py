"""An erasure's recompute: the hours holding an erased subject computed again without it, then nothing older kept.

The ``trends_erasure`` DAG calls these, in order, for the hours a request names: wait until the last of them is
closed, compute them in chunks (the batch layer reads the erased subjects at every run, :mod:`infra.privacy.
exclusions`, so the new versions leave the subject out), then :func:`purge` what still holds the subject: the
hours' superseded batch versions (kept for rollback otherwise) and the speed view's minutes of those hours (the batch
view serves them; the speed rows would only expire by their TTL). Every other hour is left as it was.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from batch_layer import horizon, offsets
from batch_layer.hours import chunks
from batch_layer.publish import BatchStore
from infra.cassandra import session
from infra.privacy.ledger import Ledger
from infra.settings import Settings
from views.buckets import HOUR, day_key
from views.indexing.indexer import run_index
from views.store.index import IndexStore
from views.store.losses import LossStore
from views.store.pointers import PointerStore
from views.store.speed import SpeedRows

logger = logging.getLogger(__name__)


def parse_hours(texts: Sequence[str]) -> list[datetime]:
    """Return a request's hours (ISO-8601 with an offset, whole hours), sorted and without repeats.

    :raises ValueError: on a text that is not an aware whole hour.
    """
    hours = set()
    for text in texts:
        hour = datetime.fromisoformat(text)
        if hour.tzinfo is None or hour != hour.replace(minute=0, second=0, microsecond=0):
            msg = f"{text!r} is not a whole hour with a UTC offset"
            raise ValueError(msg)
        hours.add(hour)
    return sorted(hours)


def hours_closed(settings: Settings, hours: Sequence[datetime]) -> bool:
    """Index new records, then tell whether the last hour is closed (the sensor's poke; nothing to wait for: True)."""
    if not hours:
        return True
    with session(settings) as sess:
        idx = IndexStore(settings, sess)
        run_index(settings, store=idx)
        return offsets.is_closed(horizon.horizon(settings, store=idx), max(hours) + HOUR, settings)


def erasure_chunks(settings: Settings, hours: Sequence[datetime]) -> list[str]:
    """Return the chunks of the hours to recompute (JSON lists of hours), as a backfill plans them.

    :raises offsets.LossNotAcceptedError: when an hour is incomplete (records lost before indexing may belong to
        it): recomputing it would mark it whole; an operator accepts the loss first (``trends batch run
        --accept-loss``), then clears the task.
    """
    if not hours:
        return []
    topic = settings.kafka.events_topic
    with session(settings) as sess:
        idx = IndexStore(settings, sess)
        offsets.refuse_loss(topic, offsets.incomplete_of(LossStore(settings, sess), topic, list(hours)), "accept_loss")
        totals = idx.hour_totals(topic, {h.date() for h in hours})
    records = {h: totals.get(h, (0, 0))[0] for h in hours}
    passes = chunks(list(hours), records, settings.batch.chunk_events, settings.batch.chunk_hours)
    logger.info(
        "erasure recompute of %s hours (%s records) in %s chunks", len(hours), sum(records.values()), len(passes)
    )
    return [json.dumps([h.isoformat() for h in p]) for p in passes]


@dataclass(frozen=True)
class Purged:
    """What a purge deleted: superseded batch versions, and speed hours (query x slice) of the hours."""

    hours: int
    versions: int
    speed_slices: int
    watermark: datetime | None

    def line(self) -> str:
        """Return the summary a task log and the ledger show."""
        return (
            f"purged {self.hours} hours: {self.versions} superseded batch versions, {self.speed_slices} speed "
            f"slice-hours; batch watermark {self.watermark.isoformat() if self.watermark else 'none'}"
        )


def purge(settings: Settings, hours: Sequence[datetime]) -> Purged:
    """Delete what still holds the hours' old counts once they are recomputed; advance the watermark over them.

    Only the current (recomputed) version of each hour is kept, so a rollback cannot bring the subject back; the speed
    view's minutes of the hours go, in every slice the batch view has that day and for every speed query; the days'
    rollups are merged again from the current hours.
    """
    versions = slices = 0
    mark = None
    with session(settings) as sess:
        store, speed = BatchStore(settings, sess), SpeedRows(settings, sess)
        queries = speed.queries()
        for hour in sorted(set(hours)):
            versions += store.delete_superseded(hour, keep=1)
            day_slices = store.rows.day_slices(day_key(hour))
            slices += sum(speed.delete_hour(query, day_slices, hour) for query in queries)
        # The chunks ran side by side, each rolling its days up from the pointers it saw: a chunk that read them
        # before another's swap wrote a day row with an old hour. Every swap is done now: roll the days up again.
        for day in sorted({day_key(h) for h in hours}):
            store.remerge_day(day)
        if hours:
            _low, mark = PointerStore(settings, sess).advance(min(hours))
    out = Purged(len(set(hours)), versions, slices, mark)
    logger.info("%s", out.line())
    return out


def finish(settings: Settings, request: str, hours: Sequence[datetime], run_id: str) -> str:
    """Record the request's hours as recomputed, purge them, and record the request as done in the erasure ledger.

    A retry after a failure between the steps finds the state it reached and goes on from there; the purge deletes
    only what is left. A run triggered by hand with an unknown request id purges and records nothing.
    """
    with session(settings) as sess:
        ledger = Ledger(settings, sess)
        found = ledger.requests().get(request) if request else None
        if found is None:
            logger.warning("erasure request %r is not in the ledger: purging its hours, recording nothing", request)
        elif found.state == "recompute_started":
            ledger.advance(request, "recomputed", runs=[run_id] if run_id else [])
        purged = purge(settings, hours)
        if found is not None and found.state != "done":
            ledger.advance(request, "done")
    logger.info("erasure %s: recomputed by %s; %s", request, run_id, purged.line())
    return purged.line()
