"""What verify found: each hour's last reconciliation of the batch view against the speed view, and the last one.

The comparison itself is the batch layer's (:mod:`batch_layer.reconcile`); this is where its verdict is kept so
that status, serving and the metrics read it without knowing the batch layer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, WRITE_PROFILE
from infra.settings import Settings
from views.buckets import utc
from views.store import cql

if TYPE_CHECKING:
    from cassandra.cluster import Session


@dataclass(frozen=True)
class Check:
    """A reconciliation's verdict: the largest difference beyond the bounds (0: within them) and where it was."""

    hour: datetime
    run_id: uuid.UUID
    checked_at: datetime
    beyond_bound: int
    details: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Tell whether the views agreed within their bounds."""
        return self.beyond_bound <= 0


def decode_check(r: Any) -> Check | None:
    """Return a reconciliation row as a :class:`Check` (None: no row, or one written before verify had verdicts)."""
    if r is None or r.beyond_bound is None:
        return None
    return Check(utc(r.hour), r.run_id, utc(r.checked_at), int(r.beyond_bound), json.loads(r.details or "{}"))  # type: ignore[arg-type]


class Checks:
    """Prepared statements over the reconciliation tables of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.StatusStatements(settings, sess)

    def write(self, check: Check, counts: tuple[int, int, int, int, int, int, int], report: str) -> None:
        """Store a reconciliation of an hour and make it the last one.

        :arg counts: buckets, missing in speed, missing in batch, count differences, events of batch, of speed,
            users out of bounds.
        """
        details = json.dumps(check.details, default=str)
        self.sess.execute(
            self._stmt(cql.INSERT_RECONCILIATION),
            (check.hour, check.run_id, *counts, report, check.checked_at, check.beyond_bound, details),
            execution_profile=WRITE_PROFILE,
        )
        self.sess.execute(
            self._stmt(cql.INSERT_RECONCILIATION_LAST),
            (cql.LAST_RECONCILIATION_ROW, check.hour, check.run_id, check.checked_at, check.beyond_bound, details),
            execution_profile=WRITE_PROFILE,
        )

    def of_hour(self, hour: datetime) -> Check | None:
        """Return the hour's last reconciliation (of its newest batch run), if verify has judged it."""
        row = self.sess.execute(self._stmt(cql.SELECT_RECONCILIATION), (hour,), execution_profile=READ_PROFILE).one()
        return decode_check(row)

    def of_hours(self, hours: Sequence[datetime]) -> dict[datetime, Check]:
        """Return the last reconciliation of each hour verify has judged, the hours read concurrently."""
        stmt = self._stmt(cql.SELECT_RECONCILIATION)
        futures = [self.sess.execute_async(stmt, (h,), execution_profile=READ_PROFILE) for h in hours]
        found = (decode_check(f.result().one()) for f in futures)
        return {c.hour: c for c in found if c is not None}

    def last(self) -> Check | None:
        """Return the last reconciliation of any hour; its ``beyond_bound`` is the metric's value."""
        row = self.sess.execute(
            self._stmt(cql.SELECT_RECONCILIATION_LAST), (cql.LAST_RECONCILIATION_ROW,), execution_profile=READ_PROFILE
        ).one()
        return decode_check(row)
