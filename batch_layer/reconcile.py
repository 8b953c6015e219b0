"""Compare the batch view of an hour with the speed view of the same hour, store the verdict, and judge it.

The batch view is the truth: every record of the hour, deduplicated exactly. The speed view may legitimately
hold *fewer* events in a minute (events later than its watermark are dropped there by design and counted by the
batch run; expired or never-written minutes are missing, which the merge's coverage reports as gaps), never
more. So, per minute that both views hold, what lies **beyond the bounds** is:

* events: the speed view's excess over the batch view (the batch view missed records the speed layer counted,
  or the speed layer counted some twice);
* distinct users: how far the two HLL estimates' 3-sigma intervals lie apart, less the users the speed view's
  missing events could account for (k fewer events remove at most k users).

The largest of these over the hour is the reconciliation's ``beyond_bound`` (0: within the bounds); verify fails
on anything above 0. Count differences within the bounds (late events) are reported, not failed.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from infra.cassandra import session
from infra.errors import TrendsError
from infra.settings import Settings
from views import sketches
from views.store.batch import BatchRows
from views.store.checks import Check, Checks
from views.store.definitions import DefinitionStore
from views.store.pointers import PointerStore
from views.store.speed import SpeedRows

logger = logging.getLogger(__name__)

NUM_STD_DEV = 3


class BeyondBoundsError(TrendsError):
    """The batch and speed views of an hour differ by more than their bounds allow."""


@dataclass
class Reconciliation:
    """The comparison of one hour."""

    hour: datetime
    run_id: str
    buckets: int = 0
    buckets_missing_in_speed: int = 0
    buckets_missing_in_batch: int = 0
    count_diffs: int = 0
    events_batch: int = 0
    events_speed: int = 0
    users_out_of_bounds: int = 0
    beyond_bound: int = 0
    worst: dict[str, Any] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        """Return a one-line summary."""
        verdict = (
            "within bounds"
            if self.beyond_bound <= 0
            else f"BEYOND BOUNDS by {self.beyond_bound} {self.worst.get('what', '')} "
            f"(slice {self.worst.get('slice')}, minute {self.worst.get('bucket')}: {self.worst.get('why')})"
        )
        return (
            f"{self.hour:%Y-%m-%dT%H:%MZ}: batch {self.events_batch} events, speed {self.events_speed}; "
            f"{self.buckets} buckets, {self.count_diffs} with other counts, {self.buckets_missing_in_speed} "
            f"missing in speed, {self.buckets_missing_in_batch} only in speed, users out of bounds "
            f"{self.users_out_of_bounds}; {verdict}"
        )


def beyond(
    batch_events: int, batch_users: sketches.Estimate, speed_events: int, speed_users: sketches.Estimate
) -> tuple[int, str, str]:
    """Return how far one minute of the two views differs beyond the bounds: (amount, what, why); 0 within them.

    :arg batch_users: the batch view's distinct users with their 3-sigma bounds (``speed_users`` the same).
    """
    excess = speed_events - batch_events
    if excess > 0:
        return excess, "events", f"speed {speed_events} > batch {batch_events} events"
    deficit = -excess
    above = speed_users.lower - batch_users.upper  # the speed view's events are a subset of the batch view's
    below = batch_users.lower - speed_users.upper - deficit
    gap = max(above, below)
    if gap > 0:
        why = (
            f"users batch [{batch_users.lower:.0f}, {batch_users.upper:.0f}], speed [{speed_users.lower:.0f}, "
            f"{speed_users.upper:.0f}] ({deficit} events fewer in speed)"
        )
        return math.ceil(gap), "users", why
    return 0, "", ""


def reconcile(settings: Settings, hour: datetime, max_examples: int = 10) -> Reconciliation:
    """Compare both views for the hour's current batch run and store the report and its verdict.

    :raises LookupError: when the hour has no completed batch run.
    """
    hour = hour.astimezone(UTC)
    with session(settings) as sess:
        run_id = PointerStore(settings, sess).runs(hour.date()).get(hour)
        if run_id is None:
            msg = f"no completed batch run for {hour.isoformat()}"
            raise LookupError(msg)
        batch_rows, speed_rows = BatchRows(settings, sess), SpeedRows(settings, sess)
        query = DefinitionStore(settings, sess).serving().query  # the speed rows of the serving view version
        slices = batch_rows.day_slices(hour.date())
        rec = Reconciliation(hour, str(run_id))
        for sl in ["*", *(s for s in slices if s != "*")]:
            batch = batch_rows.run_minutes(sl, hour, run_id)
            speed = speed_rows.hour_minutes(query, sl, hour)
            compare(rec, sl, batch, speed, max_examples)
        counts = (
            rec.buckets, rec.buckets_missing_in_speed, rec.buckets_missing_in_batch, rec.count_diffs,
            rec.events_batch, rec.events_speed, rec.users_out_of_bounds,
        )  # fmt: skip
        details = {**rec.worst, "line": rec.line()}
        check = Check(hour, uuid.UUID(rec.run_id), datetime.now(UTC), rec.beyond_bound, details)
        Checks(settings, sess).write(check, counts, _report(rec))
    logger.info("%s", rec.line())
    return rec


def verify(settings: Settings, hour: datetime) -> Reconciliation:
    """Reconcile the hour and fail when the views differ beyond their bounds (the DAG's ``verify`` task).

    :raises BeyondBoundsError: naming the worst minute.
    """
    rec = reconcile(settings, hour)
    if rec.beyond_bound > 0:
        msg = f"the batch and speed views differ beyond their bounds: {rec.line()}"
        raise BeyondBoundsError(msg)
    return rec


def _report(rec: Reconciliation) -> str:
    import json  # noqa: PLC0415

    return json.dumps(asdict(rec), default=str)


def compare(rec: Reconciliation, sl: str, batch: dict[Any, Any], speed: dict[Any, Any], max_examples: int) -> None:
    """Add one slice's minutes (rows with ``events`` and ``users_hll``, by bucket) to the reconciliation."""
    for bucket in sorted(set(batch) | set(speed)):
        b, s = batch.get(bucket), speed.get(bucket)
        rec.buckets += 1
        if sl == "*":
            rec.events_batch += b.events if b else 0
            rec.events_speed += s.events if s else 0
        if b is None and s is not None:  # the speed layer counted events of a minute the batch run has none of
            rec.buckets_missing_in_batch += 1
            rec.count_diffs += 1
            _worst(rec, sl, bucket, s.events, "events", f"speed {s.events} events, batch none")
            continue
        if s is None or b is None:
            rec.buckets_missing_in_speed += 1
            continue
        if b.events != s.events:
            rec.count_diffs += 1
            if len(rec.examples) < max_examples:
                rec.examples.append({"slice": sl, "bucket": bucket.isoformat(), "batch": b.events, "speed": s.events})
        ub = sketches.users([b.users_hll], num_std_dev=NUM_STD_DEV)
        us = sketches.users([s.users_hll], num_std_dev=NUM_STD_DEV)
        if ub.upper < us.lower or us.upper < ub.lower:
            rec.users_out_of_bounds += 1
        _worst(rec, sl, bucket, *beyond(b.events, ub, s.events, us))


def _worst(rec: Reconciliation, sl: str, bucket: datetime, amount: int, what: str, why: str) -> None:
    if amount > rec.beyond_bound:
        rec.beyond_bound = amount
        rec.worst = {"slice": sl, "bucket": bucket.isoformat(), "what": what, "why": why}
