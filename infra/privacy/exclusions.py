"""The erased subjects whose events both layers leave out (an erasure's exclusion mode).

An erasure with ``--exclude`` records the subject's pseudonym here. The speed layer reads the set when its query
starts and looks again every ``speed.serving_check_s`` (a change restarts the query with the new set, from its
checkpoint); the batch layer reads it at the start of every run. So a recompute, a backfill, a reprocess or a
restart from the watermark never counts the subject again. Only pseudonyms are kept: with the subject store's link
deleted, nothing here leads back to a person.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from infra.cassandra import READ_PROFILE, table
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

TABLE: Final = "erased_pseudonyms"


def excluded_users(settings: Settings, sess: Session) -> frozenset[str]:
    """Return the pseudonyms whose events no view may count (an empty set before any exclusion)."""
    rows = sess.execute(f"SELECT pseudonym FROM {table(settings, TABLE)}", execution_profile=READ_PROFILE)
    return frozenset(row.pseudonym for row in rows)
