"""What the DAGs' tasks call, besides the recompute (:mod:`batch_layer.submit`).

Is the hour closed, which hours an hourly run computes, a backfill's chunks, the watermark's advance; and the stale
and missing hours they heal (``trends batch`` shows and recomputes the same).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import date, datetime

from batch_layer import horizon, offsets
from batch_layer.hours import chunks, hours_between
from infra.cassandra import session
from infra.settings import Settings
from views.buckets import HOUR
from views.indexing.indexer import run_index
from views.store.index import IndexStore
from views.store.losses import LossStore
from views.store.pointers import PointerStore

logger = logging.getLogger(__name__)


def hour_closed(settings: Settings, end: datetime) -> bool:
    """Index new records, then tell whether every active partition has passed ``end`` + grace (the sensor's poke)."""
    with session(settings) as sess:
        idx = IndexStore(settings, sess)
        run_index(settings, store=idx)
        return offsets.is_closed(horizon.horizon(settings, store=idx), end, settings)


def advance(settings: Settings, hint: datetime) -> tuple[datetime | None, datetime | None]:
    """Advance the batch watermark over contiguous completed hours (``hint``: an hour just completed)."""
    with session(settings) as sess:
        return PointerStore(settings, sess).advance(hint)


def stale_hours(settings: Settings) -> dict[datetime, tuple[int, int]]:
    """Return hour -> (records indexed now, records its current run read) for every stale hour."""
    with session(settings) as sess:
        return IndexStore(settings, sess).stale(settings.kafka.events_topic)


def missing_hours(settings: Settings, below: datetime, limit: int) -> list[datetime]:
    """Return up to ``limit`` closed hours from the watermark up to ``below`` without a current run, oldest first."""
    if limit <= 0:
        return []
    with session(settings) as sess:
        pointers = PointerStore(settings, sess)
        _low, mark, _pinned = pointers.watermark()
        if mark is None or mark >= below:
            return []
        out: list[datetime] = []
        hour = mark
        cache: dict[date, dict[datetime, uuid.UUID]] = {}
        while hour < below and len(out) < limit:
            if not pointers.completed(hour, cache):
                out.append(hour)
            hour += HOUR
        return out


def plan_hourly(settings: Settings, hour: datetime, *, heal: bool = True) -> list[datetime]:
    """Return the hours an hourly DAG run computes: its own, missing closed hours below it, and stale ones.

    :arg heal: also the missing and stale hours below it (not in a backfill's runs: each hour has its own there).

    Missing and stale hours that are incomplete (records lost before indexing may belong to them) are left out and
    logged: healing them would complete them as if whole; they wait for an operator's ``--accept-loss``.

    :raises offsets.LossNotAcceptedError: when the run's own hour is incomplete (the run turns red).
    """
    limit = settings.batch.heal_max_hours if heal else 0
    topic = settings.kafka.events_topic
    missing = missing_hours(settings, hour, limit)
    stale = [h for h in stale_hours(settings) if h < hour][:limit] if limit else []
    healed = sorted({*missing, *stale} - {hour})
    with session(settings) as sess:
        incomplete = offsets.incomplete_of(LossStore(settings, sess), topic, [*healed, hour])
    if hour in incomplete:
        offsets.refuse_loss(topic, {hour: incomplete[hour]}, "`trends batch run --accept-loss`")
    if incomplete:
        logger.warning(
            "not healing %s incomplete hour(s) (%s .. %s): %s; `trends batch run --accept-loss` computes them",
            len(incomplete), min(incomplete).isoformat(), max(incomplete).isoformat(),
            offsets.describe_losses(incomplete),
        )  # fmt: skip
    return sorted({hour, *(h for h in healed if h not in incomplete)})


def backfill_chunks(
    settings: Settings, start: datetime, end: datetime, *, only_missing: bool = False, accept_loss: bool = False
) -> list[str]:
    """Index the topic, refuse an open range, and return the chunks of ``[start, end)`` (JSON lists of hours).

    :raises offsets.IntervalNotClosedError: when the range's end is not closed yet.
    :raises offsets.LossNotAcceptedError: when some hour is incomplete and ``accept_loss`` is not given.
    """
    hours = list(hours_between(start, end))
    topic = settings.kafka.events_topic
    with session(settings) as sess:
        idx, pointers = IndexStore(settings, sess), PointerStore(settings, sess)
        run_index(settings, store=idx)
        offsets.check_closed(horizon.horizon(settings, store=idx), hours[-1] + HOUR, settings)
        days = sorted({h.date() for h in hours})
        if only_missing:
            done = {h for d in days for h in pointers.runs(d)}
            hours = [h for h in hours if h not in done]
        if not accept_loss:
            offsets.refuse_loss(topic, offsets.incomplete_of(LossStore(settings, sess), topic, hours), "accept_loss")
        totals = idx.hour_totals(topic, days)
    records = {h: totals.get(h, (0, 0))[0] for h in hours}
    passes = chunks(hours, records, settings.batch.chunk_events, settings.batch.chunk_hours)
    logger.info("backfill of %s hours (%s records) in %s chunks", len(hours), sum(records.values()), len(passes))
    return [json.dumps([h.isoformat() for h in p]) for p in passes]
