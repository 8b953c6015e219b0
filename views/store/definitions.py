"""View versions in Cassandra: the definitions in use (by fingerprint) and the row naming the serving speed query.

Every speed query and batch run registers the definition it computes with (:meth:`DefinitionStore.register`);
serving reads a batch hour's or a speed epoch's definition by the fingerprint recorded beside it. The row of
``serving_definition`` names the speed query answers come from; only :meth:`DefinitionStore.promote` writes it,
with a lightweight transaction conditioned on the query it replaces, so two promotes cannot both win. Without the
row the serving query is ``settings.speed.query_name`` (deployments from before view versions need nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, WRITE_PROFILE
from infra.settings import Settings
from views.buckets import utc
from views.definition import Definition, fingerprint, from_json, to_json, view_definition
from views.store import cql
from views.store.pointers import Pointer
from views.store.rows import Request
from views.store.speed import Epoch, SpeedRows

if TYPE_CHECKING:
    from cassandra.cluster import Session


@dataclass(frozen=True)
class ServingVersion:
    """The speed query serving answers, and its definition's fingerprint (None: not known).

    :arg recorded: False when no promote ever wrote the row (the settings' query serves).
    """

    query: str
    fingerprint: str | None
    previous_query: str | None = None
    previous_fingerprint: str | None = None
    promoted_at: datetime | None = None
    recorded: bool = False

    def describe(self) -> str:
        """Return ``query (fingerprint)`` for answers, logs and the console."""
        return f"{self.query} ({self.fingerprint or 'definition not recorded'})"


def decode_serving(row: Any, settings: Settings, epochs: Iterable[Epoch] = ()) -> ServingVersion:
    """Return the serving row, or (no row) the settings' query with its definition.

    Without a row the definition is the one its newest epoch recorded (``epochs``: the settings' query's), else the
    settings' (an epoch from before definitions were recorded).
    """
    if row is None:
        newest = max(epochs, key=lambda e: e.started_at, default=None)
        fp = newest.definition if newest is not None and newest.definition else fingerprint(view_definition(settings))
        return ServingVersion(settings.speed.query_name, fp)
    return ServingVersion(
        row.query, row.fingerprint, row.previous_query, row.previous_fingerprint, utc(row.promoted_at), recorded=True
    )


def other_definition_hours(
    pointers: Mapping[datetime, Pointer], serving_fp: str | None, below: datetime | None
) -> dict[datetime, str]:
    """Return the hours below ``below`` whose current run computed with another definition than the serving one.

    A run without a recorded definition (from before they were recorded) is taken to be of the serving one. These
    hours are served only for the slices their definition defines alike (:func:`views.definition.slice_matcher`);
    a backfill recomputes them under the serving definition.
    """
    return {
        h: p.definition
        for h, p in sorted(pointers.items())
        if (below is None or h < below) and p.definition is not None and p.definition != serving_fp
    }


class DefinitionStore:
    """Prepared statements over ``view_definitions`` and ``serving_definition`` of one session.

    Definitions are immutable (a fingerprint names one JSON), so those read are kept for the store's lifetime.
    """

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.Statements(settings, sess)
        self._known: dict[str, Definition] = {}
        self._lock = threading.Lock()

    def register(self, definition: Definition, by: str) -> str:
        """Record a definition under its fingerprint (the same row again on every start); return the fingerprint."""
        fp = fingerprint(definition)
        self.sess.execute(
            self._stmt(cql.INSERT_DEFINITION),
            (fp, to_json(definition), datetime.now(UTC), by),
            execution_profile=WRITE_PROFILE,
        )
        with self._lock:
            self._known[fp] = definition
        return fp

    def get(self, fp: str) -> Definition | None:
        """Return the definition of a fingerprint (None: never registered)."""
        with self._lock:
            known = self._known.get(fp)
        if known is not None:
            return known
        row = self.sess.execute(self._stmt(cql.SELECT_DEFINITION), (fp,), execution_profile=READ_PROFILE).one()
        if row is None or row.definition is None:
            return None
        definition = from_json(row.definition)
        with self._lock:
            self._known[fp] = definition
        return definition

    def all(self) -> dict[str, Definition]:
        """Return every registered definition by fingerprint."""
        rows = self.sess.execute(cql.render(self.settings, cql.SELECT_DEFINITIONS), execution_profile=READ_PROFILE)
        out = {r.fingerprint: from_json(r.definition) for r in rows if r.definition}
        with self._lock:
            self._known.update(out)
        return out

    def serving_request(self) -> Request:
        """Return the read of the serving row (decode with :func:`decode_serving`)."""
        return self._stmt(cql.SELECT_SERVING), (cql.SERVING_ROW,)

    def serving(self) -> ServingVersion:
        """Return the serving query and its definition (the settings' query when no promote wrote the row)."""
        row = self.sess.execute(*self.serving_request(), execution_profile=READ_PROFILE).one()
        if row is not None:
            return decode_serving(row, self.settings)
        return decode_serving(
            None, self.settings, SpeedRows(self.settings, self.sess).epochs(self.settings.speed.query_name)
        )

    def serving_definition(self) -> Definition:
        """Return the serving definition (the settings' when none is recorded, or its JSON is unknown)."""
        current = self.serving()
        found = self.get(current.fingerprint) if current.fingerprint else None
        return found if found is not None else view_definition(self.settings)

    def promote(self, query: str, fp: str, current: ServingVersion) -> tuple[bool, ServingVersion]:
        """Make ``query`` (definition ``fp``) the serving one if ``current`` still serves (a lightweight transaction).

        :returns: whether it applied, and the serving version after it (the winner's when another promote won).
        """
        now = datetime.now(UTC)
        params: tuple[Any, ...]
        if current.recorded:
            stmt, params = (
                self._stmt(cql.PROMOTE),
                (query, fp, current.query, current.fingerprint, now, cql.SERVING_ROW, current.query),
            )
        else:
            stmt = self._stmt(cql.PROMOTE_FIRST)
            params = (cql.SERVING_ROW, query, fp, current.query, current.fingerprint, now)
        result = self.sess.execute(stmt, params, execution_profile=WRITE_PROFILE)
        # The first column of a lightweight transaction's row is [applied]. ResultSet.was_applied refuses a row
        # factory other than the driver's own, and the session's is infra.cassandra.named_rows.
        row = result.one()
        applied = bool(row[0]) if row is not None else False
        return applied, self.serving()
