"""Blue/green view definitions: promote a caught-up speed query to serving, and stop the one it replaces.

A new view definition runs as a second speed query (its own ``TRENDS_SPEED__QUERY_NAME``, its own checkpoint,
started from the batch watermark) writing its own rows beside the serving query's. ``trends speed promote <query>``
makes it the serving one — only once its current epoch has caught up (:func:`promote_problems`): it has read as far
as the serving query, and it counts every minute from the batch boundary on, so the switch leaves no minute above
the boundary unanswered. The swap is one lightweight transaction on ``serving_definition``
(:meth:`views.store.definitions.DefinitionStore.promote`). The demoted query notices (:class:`ServingWatch`, polled by
the job) that it no longer serves and stops cleanly; its rows expire by their TTL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from infra.settings import Settings
from infra.settings_env import env_var
from views.store.definitions import DefinitionStore, ServingVersion
from views.store.speed import Epoch, SpeedRows

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)


def current_epoch(epochs: list[Epoch]) -> Epoch | None:
    """Return a query's current epoch (the newest checkpoint lifetime), None when it has none."""
    return max(epochs, key=lambda e: e.started_at, default=None)


# Two caught-up queries record reading the whole topic a trigger or two apart (Epoch.read_all_at).
READ_ALL_SLACK = timedelta(seconds=10)


def _at(t: datetime | None) -> str:
    return t.isoformat() if t is not None else "nothing"


def promote_problems(
    query: str,
    serving: ServingVersion,
    green: Epoch | None,
    blue: Epoch | None,
    boundary: datetime | None,
) -> list[str]:
    """Return why ``query`` cannot be promoted now (empty: it can), each with what to do (pure).

    :arg serving: the version serving now.
    :arg green: the current epoch of ``query``; ``blue``: the current epoch of the serving query (None: none).
    :arg boundary: the batch watermark or pin (None: no batch watermark yet).
    """
    if query == serving.query:
        return [f"{query} already serves answers"]
    if green is None:
        return [
            f"{query} has no speed epoch: start it first ({env_var('speed.query_name')}={query} with the new "
            f"{env_var('views.*')} settings, `trends speed run --from-watermark`)"
        ]
    problems = []
    if green.definition is None:
        problems.append(f"{query}'s epoch {green.id} records no view definition (started by an older version)")
    ours, theirs = green.seen_until, blue.seen_until if blue is not None else None
    ours_all, theirs_all = green.read_all_at, blue.read_all_at if blue is not None else None
    behind = ours is None or (theirs is not None and ours < theirs)
    # an event past a minute is not the whole minute: serving answers what green has read the whole topic to
    unread = ours_all is None or (theirs_all is not None and ours_all < theirs_all - READ_ALL_SLACK)
    if behind or unread:
        problems.append(
            f"{query} has not caught up: it has read up to {_at(ours)} (the whole topic as of {_at(ours_all)}), "
            f"the serving query {serving.query} up to {_at(theirs)} (as of {_at(theirs_all)}); wait (`trends speed "
            "versions` shows both)"
        )
    bound = boundary if boundary is not None else (blue.counts_from if blue is not None else None)
    counts_from = green.counts_from
    if counts_from is None:
        problems.append(f"{query} has counted nothing yet")
    elif bound is not None and counts_from > bound:
        what = "the batch boundary" if boundary is not None else f"the serving query {serving.query}"
        problems.append(
            f"{query} counts minutes only from {counts_from.isoformat()}, after {what} {bound.isoformat()}: "
            "the minutes between would be gaps; start it from the watermark (--from-watermark, a new checkpoint)"
        )
    return problems


@dataclass(frozen=True)
class Versions:
    """What a promote decides on: the serving version, both queries' current epochs, the batch boundary."""

    serving: ServingVersion
    green: Epoch | None
    blue: Epoch | None
    boundary: datetime | None


def read_versions(settings: Settings, sess: Session, query: str) -> Versions:
    """Read the serving version, the current epoch of ``query`` and of the serving query, and the boundary."""
    from views.store.pointers import PointerStore  # noqa: PLC0415

    serving = DefinitionStore(settings, sess).serving()
    speed = SpeedRows(settings, sess)
    green = current_epoch(speed.epochs(query))
    blue = current_epoch(speed.epochs(serving.query))
    return Versions(serving, green, blue, PointerStore(settings, sess).watermark().boundary)


def serving_query(settings: Settings, sess: Session) -> ServingVersion:
    """Return the version serving answers now."""
    return DefinitionStore(settings, sess).serving()


class ServingWatch:
    """A speed query's periodic look at ``serving_definition``: has a promote demoted it.

    A query is demoted when it served (when the job started, or at a later look) and another query serves now. A query
    that has not served during this run — a green one waiting for its promote, or a replaced one started again to
    roll back — is a standby, never demoted.
    """

    def __init__(self, settings: Settings, every_s: float) -> None:
        self.settings = settings
        self.every_s = every_s
        self.query = settings.speed.query_name
        self.served = False
        self._next = 0.0

    def start(self, sess: Session) -> ServingVersion:
        """Look once at the start: does this query serve now? Return the serving version."""
        serving = DefinitionStore(self.settings, sess).serving()
        self.served = serving.query == self.query
        self._next = time.monotonic() + self.every_s
        return serving

    def demoted_by(self, sess: Session, now: float | None = None) -> ServingVersion | None:
        """Return the serving version that replaced this query (None: not demoted, or not time to look yet)."""
        t = time.monotonic() if now is None else now
        if t < self._next:
            return None
        self._next = t + self.every_s
        serving = DefinitionStore(self.settings, sess).serving()
        self.served = self.served or serving.query == self.query
        return serving if is_demoted(self.query, serving, served=self.served) else None


def is_demoted(query: str, serving: ServingVersion, *, served: bool) -> bool:
    """Tell whether a promote replaced ``query`` while it ran (pure): it served, and another query serves now."""
    return served and serving.query != query


def replaced(query: str, serving: ServingVersion) -> bool:
    """Tell whether the last promote replaced ``query`` (a start of it runs it as a standby, e.g. to roll back)."""
    return serving.recorded and serving.query != query and serving.previous_query == query
