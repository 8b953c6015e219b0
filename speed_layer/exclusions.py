"""The speed query's look at the erased subjects: a new exclusion restarts the query with it.

A filter on the event frame changes no state schema, so the query stops after its running micro-batch and starts
again from its checkpoint with the new set: exactly once as ever, and the subject's events are left out of every
micro-batch from then on (within ``speed.serving_check_s`` of the request, plus the restart).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from infra.privacy.exclusions import excluded_users
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)


class ExclusionWatch:
    """Hold the set the query runs with and tell when the stored one differs (looked at every ``every_s``)."""

    def __init__(self, settings: Settings, every_s: float, current: frozenset[str]) -> None:
        self.settings = settings
        self.every_s = every_s
        self.current = current
        self._next = time.monotonic() + every_s

    def changed(self, sess: Session | None, now: float | None = None) -> frozenset[str] | None:
        """Return the new set when it differs from the query's, else None (also when it is not time to look)."""
        t = time.monotonic() if now is None else now
        if sess is None or t < self._next:
            return None
        self._next = t + self.every_s
        try:
            stored = excluded_users(self.settings, sess)
        except Exception:  # Cassandra unreachable: the sink's own writes fail the batch; look again later
            logger.warning("could not read the erased subjects", exc_info=True)
            return None
        if stored == self.current:
            return None
        logger.info(
            "erased subjects changed (%d -> %d): restarting the speed query with the new exclusions",
            len(self.current), len(stored),
        )  # fmt: skip
        self.current = stored
        return stored
