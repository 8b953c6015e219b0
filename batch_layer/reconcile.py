"""Compare the batch view of an hour with the speed view of the same hour, and store the report.

The batch view is the truth; the comparison says how far the speed layer was off (late events it dropped,
events it has not seen, buckets whose speed rows expired) so an operator can see the speed layer's quality.
Counts are compared exactly; distinct users by whether the two HLL estimates' 3-sigma intervals overlap.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from infra.cassandra import WRITE_PROFILE, session, table
from infra.settings import Settings
from views import sketches
from views.store.batch import BatchRows
from views.store.pointers import PointerStore
from views.store.speed import SpeedRows

logger = logging.getLogger(__name__)


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
    examples: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        """Return a one-line summary."""
        return (
            f"{self.hour:%Y-%m-%dT%H:%MZ}: batch {self.events_batch} events, speed {self.events_speed}; "
            f"{self.buckets} buckets, {self.count_diffs} with other counts, {self.buckets_missing_in_speed} "
            f"missing in speed, {self.buckets_missing_in_batch} only in speed, users out of bounds "
            f"{self.users_out_of_bounds}"
        )


def reconcile(settings: Settings, hour: datetime, max_examples: int = 10) -> Reconciliation:
    """Compare both views for the hour's current batch run and store the report.

    :raises LookupError: when the hour has no completed batch run.
    """
    hour = hour.astimezone(UTC)
    with session(settings) as sess:
        run_id = PointerStore(settings, sess).runs(hour.date()).get(hour)
        if run_id is None:
            msg = f"no completed batch run for {hour.isoformat()}"
            raise LookupError(msg)
        batch_rows, speed_rows = BatchRows(settings, sess), SpeedRows(settings, sess)
        slices = batch_rows.day_slices(hour.date())
        rec = Reconciliation(hour, str(run_id))
        for sl in ["*", *(s for s in slices if s != "*")]:
            batch = batch_rows.run_minutes(sl, hour, run_id)
            speed = speed_rows.hour_minutes(sl, hour)
            _compare(rec, sl, batch, speed, max_examples)
        sess.execute(
            sess.prepare(
                f"INSERT INTO {table(settings, 'batch_reconciliation')} (hour, run_id, buckets, "
                "buckets_missing_in_speed, buckets_missing_in_batch, count_diffs, events_batch, events_speed, "
                "users_out_of_bounds, report, checked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            (
                hour,
                uuid.UUID(rec.run_id),
                rec.buckets,
                rec.buckets_missing_in_speed,
                rec.buckets_missing_in_batch,
                rec.count_diffs,
                rec.events_batch,
                rec.events_speed,
                rec.users_out_of_bounds,
                json.dumps(asdict(rec), default=str),
                datetime.now(UTC),
            ),
            execution_profile=WRITE_PROFILE,
        )
    logger.info("%s", rec.line())
    return rec


def _compare(rec: Reconciliation, sl: str, batch: dict[Any, Any], speed: dict[Any, Any], max_examples: int) -> None:
    for bucket in sorted(set(batch) | set(speed)):
        b, s = batch.get(bucket), speed.get(bucket)
        rec.buckets += 1
        if sl == "*":
            rec.events_batch += b.events if b else 0
            rec.events_speed += s.events if s else 0
        if b is None:
            rec.buckets_missing_in_batch += 1
            continue
        if s is None:
            rec.buckets_missing_in_speed += 1
            continue
        if b.events != s.events:
            rec.count_diffs += 1
            if len(rec.examples) < max_examples:
                rec.examples.append({"slice": sl, "bucket": bucket.isoformat(), "batch": b.events, "speed": s.events})
        ub = sketches.users([b.users_hll], num_std_dev=3)
        us = sketches.users([s.users_hll], num_std_dev=3)
        if ub.upper < us.lower or us.upper < ub.lower:
            rec.users_out_of_bounds += 1
