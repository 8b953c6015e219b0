"""The load of a pass into Cassandra: new versions, pointer swaps, daily rollups, each hour's lineage.

Every write is a new version or an idempotent upsert, so a pass run again replaces the hours it computed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import date, datetime

from batch_layer.compute import Computed
from batch_layer.offsets import Plan
from batch_layer.publish import BatchStore, new_run_id
from batch_layer.report import RunResult, counts_of
from views.buckets import HOUR
from views.store.index import IndexStore
from views.store.losses import Loss, losses_json
from views.store.rows import ViewRow


def load(
    store: BatchStore,
    plan: Plan,
    done: Computed | None,
    *,
    force: bool,
    code: str,
    accepted: dict[datetime, list[Loss]] | None = None,
    definition: str | None = None,
) -> list[RunResult]:
    """Write a pass's versions, swap every hour's pointer, roll the days up and write each hour's lineage.

    :arg accepted: per hour, the losses the operator accepted for it: recorded in its lineage and, once the hour
        completed, marked accepted (the hour is no longer incomplete).
    :arg definition: the fingerprint of the view definition the pass computed with (recorded per run and pointer).
    """
    accepted = accepted or {}
    hours = [h.hour for h in plan.hours]
    days = sorted({h.date() for h in hours})
    before = {d: store.pointers.runs(d) for d in days}
    runs = {h: new_run_id() for h in hours}
    store.runs_started(
        [(hp.hour, runs[hp.hour], hp.hour + HOUR, plan.topic, hp.to_json(), force, code) for hp in plan.hours],
        {h: losses_json(ls) for h, ls in accepted.items() if h in runs},
        definition,
    )
    try:
        if done is not None:
            store.rows.write_versions(runs, done.minutes, done.hours, done.tens)
        swaps = [(hp.hour, runs[hp.hour], hp.records) for hp in plan.hours]
        store.pointers.swap(swaps, definition, tens=done is None or bool(done.tens) or not done.minutes)
        computed = _write_computed_days(store, done, days, runs, before)
        for day in days:
            if day not in computed:
                store.remerge_day(day)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        store.runs_finished([(h, runs[h], "failed", {}, error) for h in hours])
        raise
    results = [RunResult(hp.hour, str(runs[hp.hour]), hp.to_json(), counts_of(hp, done)) for hp in plan.hours]
    store.runs_finished([(r.hour, runs[r.hour], "completed", r.counts, None) for r in results])
    if accepted:
        store.losses.accept([(loss, h, runs[h]) for h in hours for loss in accepted.get(h, ())])
    for hour in hours:
        if hour in before[hour.date()]:
            store.delete_superseded(hour, store.settings.batch.keep_versions)
    return results


def _write_computed_days(
    store: BatchStore,
    done: Computed | None,
    days: list[date],
    runs: dict[datetime, uuid.UUID],
    before: dict[date, dict[datetime, uuid.UUID]],
) -> set[date]:
    """Write the rollups and parts of the days whose 24 hours are all in the pass, together; return those days."""
    computed = {d for d in days if done is not None and d in done.days}
    if done is None or not computed:
        return set()
    current = {d: dict(before[d]) for d in computed}
    slices: dict[date, Counter[str]] = {d: Counter() for d in computed}
    for h, run in runs.items():
        if h.date() in computed:
            current[h.date()][h] = run
            slices[h.date()].update(r.slice for r in done.hours.get(h, ()))
    store.write_days([(d, current[d], done.days[d], slices[d]) for d in sorted(computed)])
    for d in sorted(computed):
        rows: dict[str, list[ViewRow]] = {}
        for h in current[d]:
            for r in done.hours.get(h, ()):
                rows.setdefault(r.slice, []).append(r)
        store.write_day_parts(d, current[d], rows)
    return computed


def recheck_stale(idx: IndexStore, plan: Plan) -> int:
    """After the swaps: mark hours whose index grew while they were computed (the indexer may have checked first)."""
    totals = idx.hour_totals(plan.topic, {h.hour.date() for h in plan.hours})
    grown = {h.hour: totals[h.hour] for h in plan.hours if totals.get(h.hour, (0, 0))[0] > h.records}
    return idx.mark_stale(plan.topic, grown) if grown else 0
