"""Every statement on the views' tables, in one place (the tables are created by ``infra/cql/0002-0007``).

``{name}`` in a template is the table ``name`` of the configured keyspace; :func:`prepare` fills it in. The
batch view is versioned: minute and hour rows carry the ``run_id`` of the run that wrote them, and the pointer
table ``batch_intervals`` names the current run of each hour. ``batch_watermark`` holds one row, the batch
layer's contiguous span of completed hours and the operator's pin; ``batch_stale`` the hours whose indexed
records grew after their current run read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infra.cassandra import table

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from cassandra.query import PreparedStatement

    from infra.settings import Settings

VIEW_TABLES = (
    "speed_minutes", "speed_progress", "batch_minutes", "batch_hours", "batch_days", "batch_day_slices",
    "batch_intervals", "batch_watermark", "batch_stale", "speed_epochs", "speed_hours", "speed_coverage",
    "view_definitions", "serving_definition", "speed_rollups", "batch_tens", "batch_day_parts",
    "speed_edges",
)  # fmt: skip
SKETCH_FIELDS = ("users_hll", "values_kll", "items_fi")

# -- batch rows (written under a run id, visible once the pointer names the run) ----------------------------------
INSERT_MINUTE = (
    "INSERT INTO {batch_minutes} (slice, hour, run_id, bucket_start, events, users_hll, values_kll, items_fi, "
    "min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_TEN = (
    "INSERT INTO {batch_tens} (slice, hour, run_id, bucket_start, events, users_hll, values_kll, items_fi, "
    "min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_HOUR = (
    "INSERT INTO {batch_hours} (slice, day, hour, run_id, events, users_hll, values_kll, items_fi, min_ts, max_ts) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_DAY = (
    "INSERT INTO {batch_days} (slice, month, day, hour_runs, hours, events, users_hll, values_kll, items_fi, "
    "min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_DAY_PART = (
    "INSERT INTO {batch_day_parts} (slice, day, first_hour, end_hour, hour_runs, hours, events, users_hll, "
    "values_kll, items_fi, min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
DELETE_DAY_PARTS = "DELETE FROM {batch_day_parts} WHERE slice = ? AND day = ?"
INSERT_DAY_SLICE = "INSERT INTO {batch_day_slices} (day, slice) VALUES (?, ?)"
SELECT_DAY_SLICES = "SELECT slice FROM {batch_day_slices} WHERE day = ?"
SELECT_DAY_HOURS = (
    "SELECT hour, run_id, events, users_hll, values_kll, items_fi, min_ts, max_ts FROM {batch_hours} "
    "WHERE slice = ? AND day = ?"
)
SELECT_RUN_MINUTES = (
    "SELECT bucket_start, events, users_hll FROM {batch_minutes} WHERE slice = ? AND hour = ? AND run_id = ?"
)
SELECT_MONTH_DAYS = "SELECT day, hour_runs, hours, events FROM {batch_days} WHERE slice = ? AND month = ?"
DELETE_MINUTES = "DELETE FROM {batch_minutes} WHERE slice = ? AND hour = ? AND run_id = ?"
DELETE_TENS = "DELETE FROM {batch_tens} WHERE slice = ? AND hour = ? AND run_id = ?"
DELETE_HOUR = "DELETE FROM {batch_hours} WHERE slice = ? AND day = ? AND hour = ? AND run_id = ?"

# -- the pointer, watermark and staleness tables ------------------------------------------------------------------
INSERT_POINTER = (
    "INSERT INTO {batch_intervals} (day, hour, run_id, completed_at, indexed, definition, tens) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SELECT_POINTERS = "SELECT hour, run_id, indexed, definition, tens FROM {batch_intervals} WHERE day = ?"
SELECT_POINTERS_OF_DAYS = "SELECT hour, run_id, indexed, definition, tens FROM {batch_intervals} WHERE day IN ?"
SELECT_WATERMARK = "SELECT low, watermark, pinned FROM {batch_watermark} WHERE name = ?"
INSERT_WATERMARK = "INSERT INTO {batch_watermark} (name, low, watermark, updated_at) VALUES (?, ?, ?, ?)"
PIN_WATERMARK = "UPDATE {batch_watermark} SET pinned = ?, updated_at = ? WHERE name = ?"
PING = "SELECT name FROM {batch_watermark} LIMIT 1"
INSERT_STALE = "INSERT INTO {batch_stale} (topic, hour, records, noticed_at) VALUES (?, ?, ?, ?)"
SELECT_STALE = "SELECT hour, records FROM {batch_stale} WHERE topic = ?"
SELECT_STALE_BETWEEN = "SELECT hour, records FROM {batch_stale} WHERE topic = ? AND hour >= ? AND hour < ?"

# -- the speed view per streaming query (upserts of whole bucket states) and its freshness (infra/cql/0007) ----------
UPSERT_SPEED = (
    "INSERT INTO {speed_minutes} (query, slice, day, bucket_start, events, users_hll, values_kll, items_fi, min_ts, "
    "max_ts, batch_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
)
SELECT_SPEED_MINUTES = (
    "SELECT bucket_start, events, users_hll FROM {speed_minutes} "
    "WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
UPSERT_PROGRESS = (
    "INSERT INTO {speed_progress} (query, newest_event_ts, watermark, last_batch_id, last_batch_rows, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_PROGRESS = "SELECT newest_event_ts, updated_at FROM {speed_progress} WHERE query = ?"

# -- what the speed layer processed: epochs, the hours of each, the minutes counted (infra/cql/0005) ---------------
INSERT_EPOCH = (
    "INSERT INTO {speed_epochs} (query, epoch, started_at, covered_from, starting_offsets, updated_at, definition) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
ADVANCE_EPOCH = (
    "UPDATE {speed_epochs} SET seen_until = ?, first_hour = ?, last_batch_id = ?, updated_at = ? "
    "WHERE query = ? AND epoch = ?"
)
SELECT_EPOCHS = (
    "SELECT epoch, started_at, covered_from, starting_offsets, seen_until, first_hour, last_batch_id, updated_at, "
    "definition, read_all_at FROM {speed_epochs} WHERE query = ?"
)
READ_ALL_EPOCH = "UPDATE {speed_epochs} SET read_all_at = ? WHERE query = ? AND epoch = ?"  # infra/cql/0008
INSERT_SPEED_HOUR = (
    "INSERT INTO {speed_hours} (query, day, hour, epoch, first_written_at, ttl_s) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
)
SELECT_EPOCH_HOUR = "SELECT first_written_at FROM {speed_hours} WHERE query = ? AND day = ? AND hour = ? AND epoch = ?"
# An erasure's purge of an hour from the speed view (its minutes and what they counted; the batch view serves it).
SELECT_SPEED_QUERIES = "SELECT DISTINCT query FROM {speed_epochs}"
DELETE_SPEED_MINUTES = (
    "DELETE FROM {speed_minutes} WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
DELETE_SPEED_COVERAGE = "DELETE FROM {speed_coverage} WHERE query = ? AND slice = ? AND day = ? AND hour = ?"
SELECT_SPEED_HOURS = (
    "SELECT hour, epoch, first_written_at, ttl_s FROM {speed_hours} WHERE query = ? AND day = ? AND hour >= ? "
    "AND hour < ?"
)
UPSERT_COUNTS = (
    "UPDATE {speed_coverage} USING TTL ? SET counts = counts + ? "
    "WHERE query = ? AND slice = ? AND day = ? AND hour = ? AND epoch = ?"
)
SELECT_COUNTS = (
    "SELECT hour, epoch, counts FROM {speed_coverage} WHERE query = ? AND slice = ? AND day = ? AND hour >= ? "
    "AND hour < ?"
)
# -- rollups of closed speed intervals (infra/cql/0012): merged from the minutes, used when they match the coverage --
UPSERT_ROLLUP = (
    "INSERT INTO {speed_rollups} (query, slice, day, bucket_start, width_min, epoch, events, users_hll, values_kll, "
    "items_fi, min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
)
SELECT_ROLLUP_MINUTES = (
    "SELECT bucket_start, events, users_hll, values_kll, items_fi, min_ts, max_ts FROM {speed_minutes} "
    "WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
UPSERT_EDGE = (
    "INSERT INTO {speed_edges} (query, slice, day, bucket_start, width_min, epoch, events, users_hll, values_kll, "
    "items_fi, min_ts, max_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
)
DELETE_SPEED_EDGES = (
    "DELETE FROM {speed_edges} WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
ADD_ROLLUP_TODO = "UPDATE {speed_epochs} SET rollup_todo = rollup_todo + ? WHERE query = ? AND epoch = ?"
DONE_ROLLUP_TODO = "UPDATE {speed_epochs} SET rollup_todo = rollup_todo - ? WHERE query = ? AND epoch = ?"
SELECT_ROLLUP_TODO = "SELECT rollup_todo FROM {speed_epochs} WHERE query = ? AND epoch = ?"
DELETE_SPEED_ROLLUPS = (
    "DELETE FROM {speed_rollups} WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
SELECT_ALL_PROGRESS = (
    "SELECT query, newest_event_ts, watermark, last_batch_id, last_batch_rows, updated_at FROM {speed_progress}"
)

# -- the rows a query reads, with only the sketch columns it needs ({cols}: events and some of SKETCH_FIELDS) -------
READ_DAYS = "SELECT day, hour_runs, {cols} FROM {batch_days} WHERE slice = ? AND month = ? AND day >= ? AND day < ?"
READ_DAY_PART = (
    "SELECT hour_runs, {cols} FROM {batch_day_parts} WHERE slice = ? AND day = ? AND first_hour = ? AND end_hour = ?"
)
READ_HOURS = "SELECT hour, run_id, {cols} FROM {batch_hours} WHERE slice = ? AND day = ? AND hour >= ? AND hour < ?"
READ_MINUTES = (
    "SELECT bucket_start, {cols} FROM {batch_minutes} "
    "WHERE slice = ? AND hour = ? AND run_id = ? AND bucket_start >= ? AND bucket_start < ?"
)
READ_TENS = (
    "SELECT bucket_start, {cols} FROM {batch_tens} "
    "WHERE slice = ? AND hour = ? AND run_id = ? AND bucket_start >= ? AND bucket_start < ?"
)
READ_SPEED = (
    "SELECT bucket_start, {cols} FROM {speed_minutes} "
    "WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
READ_ROLLUPS = (
    "SELECT bucket_start, width_min, epoch, {cols} FROM {speed_rollups} "
    "WHERE query = ? AND slice = ? AND day = ? AND bucket_start >= ? AND bucket_start < ?"
)
READ_EDGE = (
    "SELECT epoch, {cols} FROM {speed_edges} "
    "WHERE query = ? AND slice = ? AND day = ? AND bucket_start = ? AND width_min = ?"
)
# -- view versions: the definitions in use, and the one row naming the serving query (infra/cql/0007) ---------------
SERVING_ROW = "serving"  # the key of the one row of serving_definition
INSERT_DEFINITION = (
    "INSERT INTO {view_definitions} (fingerprint, definition, registered_at, registered_by) VALUES (?, ?, ?, ?)"
)
SELECT_DEFINITION = "SELECT definition FROM {view_definitions} WHERE fingerprint = ?"
SELECT_DEFINITIONS = "SELECT fingerprint, definition FROM {view_definitions}"
SELECT_SERVING = (
    "SELECT query, fingerprint, previous_query, previous_fingerprint, promoted_at FROM {serving_definition} "
    "WHERE name = ?"
)
PROMOTE_FIRST = (
    "INSERT INTO {serving_definition} (name, query, fingerprint, previous_query, previous_fingerprint, promoted_at) "
    "VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS"
)
PROMOTE = (
    "UPDATE {serving_definition} SET query = ?, fingerprint = ?, previous_query = ?, previous_fingerprint = ?, "
    "promoted_at = ? WHERE name = ? IF query = ?"
)

SELECT_MONTH_FINGERPRINTS = "SELECT day, hour_runs FROM {batch_days} WHERE slice = ? AND month = ?"

# Upserts of whole rows: writing one again writes the same row, so the driver may retry them.
IDEMPOTENT = frozenset((
    INSERT_MINUTE, INSERT_TEN, INSERT_HOUR, INSERT_DAY, INSERT_DAY_SLICE, INSERT_POINTER, INSERT_STALE,
    UPSERT_SPEED, UPSERT_PROGRESS, INSERT_EPOCH, ADVANCE_EPOCH, INSERT_SPEED_HOUR, UPSERT_COUNTS, INSERT_DEFINITION,
    READ_ALL_EPOCH, UPSERT_ROLLUP, ADD_ROLLUP_TODO, DONE_ROLLUP_TODO, INSERT_DAY_PART, DELETE_DAY_PARTS,
    UPSERT_EDGE,
))  # fmt: skip


def render(settings: Settings, template: str, **fields: str) -> str:
    """Return a template with its table names (and any other ``fields``) filled in."""
    return template.format(**{name: table(settings, name) for name in VIEW_TABLES}, **fields)


def prepare(sess: Session, settings: Settings, template: str, **fields: str) -> Any:
    """Prepare a template on the session (marked idempotent when it is one of :data:`IDEMPOTENT`)."""
    stmt: PreparedStatement = sess.prepare(render(settings, template, **fields))
    if template in IDEMPOTENT:
        stmt.is_idempotent = True
    return stmt


def prepare_reads(sess: Session, settings: Settings, fields: frozenset[str]) -> dict[str, Any]:
    """Return the row reads of a query needing only the sketches in ``fields``: days, hours, minutes, speed, rollups."""
    cols = ", ".join(["events", *(f for f in SKETCH_FIELDS if f in fields)])
    return {
        name: prepare(sess, settings, template, cols=cols)
        for name, template in (
            ("days", READ_DAYS),
            ("hours", READ_HOURS),
            ("part", READ_DAY_PART),
            ("minutes", READ_MINUTES),
            ("tens", READ_TENS),
            ("speed", READ_SPEED),
            ("rollups", READ_ROLLUPS),
            ("edge", READ_EDGE),
        )
    }


class Statements:
    """The statements of one session, each prepared on its first use and kept (a reader never prepares a write)."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._prepared: dict[str, Any] = {}

    def __call__(self, template: str) -> Any:
        """Return the prepared statement of a template (prepared now if this is its first use)."""
        stmt = self._prepared.get(template)
        if stmt is None:
            stmt = self._prepared[template] = prepare(self.sess, self.settings, template)
        return stmt


# -- losses, incomplete hours and verify (infra/cql/0006): what the batch view's hours may lack, and what verify found
# Not view tables (they qualify the batch view's hours), so they are filled in by :func:`prepare_status`.
STATUS_TABLES = ("batch_losses", "batch_loss_accepted", "batch_reconciliation", "batch_reconciliation_last")
LAST_RECONCILIATION_ROW = "batch"  # the key of the one row of batch_reconciliation_last

INSERT_LOSS = (
    "INSERT INTO {batch_losses} (topic, partition, first_offset, last_offset, records, noticed_at, older_than, "
    "retention_ms, oldest_surviving) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SELECT_LOSSES = (
    "SELECT partition, first_offset, last_offset, records, noticed_at, older_than, retention_ms, oldest_surviving "
    "FROM {batch_losses} WHERE topic = ?"
)
INSERT_LOSS_ACCEPTED = (
    "INSERT INTO {batch_loss_accepted} (topic, partition, first_offset, hour, run_id, accepted_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_LOSS_ACCEPTED = (
    "SELECT hour FROM {batch_loss_accepted} WHERE topic = ? AND partition = ? AND first_offset = ? "
    "AND hour >= ? AND hour < ?"
)
INSERT_RECONCILIATION = (
    "INSERT INTO {batch_reconciliation} (hour, run_id, buckets, buckets_missing_in_speed, buckets_missing_in_batch, "
    "count_diffs, events_batch, events_speed, users_out_of_bounds, report, checked_at, beyond_bound, details) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SELECT_RECONCILIATION = (
    "SELECT hour, run_id, checked_at, beyond_bound, details, events_batch, events_speed, buckets_missing_in_speed "
    "FROM {batch_reconciliation} WHERE hour = ? LIMIT 1"
)
INSERT_RECONCILIATION_LAST = (
    "INSERT INTO {batch_reconciliation_last} (name, hour, run_id, checked_at, beyond_bound, details) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_RECONCILIATION_LAST = (
    "SELECT hour, run_id, checked_at, beyond_bound, details FROM {batch_reconciliation_last} WHERE name = ?"
)
STATUS_IDEMPOTENT = frozenset((INSERT_LOSS, INSERT_LOSS_ACCEPTED, INSERT_RECONCILIATION, INSERT_RECONCILIATION_LAST))


def prepare_status(sess: Session, settings: Settings, template: str) -> Any:
    """Prepare a template over the view and status tables (marked idempotent when it is an upsert)."""
    names = {name: table(settings, name) for name in (*VIEW_TABLES, *STATUS_TABLES)}
    stmt: PreparedStatement = sess.prepare(template.format(**names))
    if template in STATUS_IDEMPOTENT:
        stmt.is_idempotent = True
    return stmt


class StatusStatements(Statements):
    """:class:`Statements` that also know the status tables."""

    def __call__(self, template: str) -> Any:
        """Return the prepared statement of a template (prepared now if this is its first use)."""
        stmt = self._prepared.get(template)
        if stmt is None:
            stmt = self._prepared[template] = prepare_status(self.sess, self.settings, template)
        return stmt
