"""The speed view's rows (whole-bucket upserts with a TTL) and its freshness row per streaming query.

Each write is the full cumulative state of a bucket, never an increment: writing it again (a replayed
micro-batch) writes the same row, which keeps an at-least-once sink exactly-once in effect.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, WRITE_PROFILE
from infra.settings import Settings
from views.buckets import HOUR, day_key, utc
from views.store import cql
from views.store.rows import Request

if TYPE_CHECKING:
    from cassandra.cluster import Session


@dataclass(frozen=True)
class Progress:
    """The freshness row of a streaming query: the newest event time written and its last micro-batch."""

    query: str
    newest_event_ts: datetime | None
    watermark: datetime | None
    last_batch_id: int | None
    last_batch_rows: int | None
    updated_at: datetime | None


class SpeedRows:
    """Prepared statements over the speed view and its progress table of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.Statements(settings, sess)

    def write(self, rows: Iterable[Any], batch_id: int, ttl_seconds: int) -> tuple[int, datetime | None]:
        """Upsert whole bucket rows (Spark rows of the view's columns); raise on the first failed write.

        :returns: the rows written and the newest event time among them.
        """
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        params = []
        newest = None
        for r in rows:
            bucket = utc(r.bucket_start)
            assert bucket is not None  # noqa: S101 - the window start is never null
            max_ts = utc(r.max_ts)
            params.append(
                (
                    r.slice,
                    day_key(bucket),
                    bucket,
                    r.events,
                    bytes(r.users_hll),
                    bytes(r.values_kll),
                    bytes(r.items_fi),
                    utc(r.min_ts),
                    max_ts,
                    batch_id,
                    ttl_seconds,
                )
            )
            if max_ts is not None and (newest is None or max_ts > newest):
                newest = max_ts
        execute_concurrent_with_args(
            self.sess,
            self._stmt(cql.UPSERT_SPEED),
            params,
            concurrency=self.settings.cassandra.write_concurrency,
            raise_on_first_error=True,
            execution_profile=WRITE_PROFILE,
        )
        return len(params), newest

    def write_progress(
        self, query: str, newest: datetime | None, watermark: datetime | None, batch_id: int, rows: int
    ) -> None:
        """Record a micro-batch: the newest event time written so far, the batch and its rows."""
        self.sess.execute(
            self._stmt(cql.UPSERT_PROGRESS),
            (query, newest, watermark, batch_id, rows, datetime.now(UTC)),
            execution_profile=WRITE_PROFILE,
        )

    def progress_request(self, query: str) -> Request:
        """Return the read of a query's freshness (``newest_event_ts, updated_at``)."""
        return self._stmt(cql.SELECT_PROGRESS), (query,)

    def newest_event(self, query: str) -> datetime | None:
        """Return the newest event time the query has written (None: nothing yet)."""
        row = self.sess.execute(*self.progress_request(query), execution_profile=READ_PROFILE).one()
        return utc(row.newest_event_ts) if row else None

    def progress(self) -> list[Progress]:
        """Return the freshness row of every streaming query."""
        rows = self.sess.execute(cql.render(self.settings, cql.SELECT_ALL_PROGRESS), execution_profile=READ_PROFILE)
        return [
            Progress(
                r.query, utc(r.newest_event_ts), utc(r.watermark), r.last_batch_id, r.last_batch_rows,
                utc(r.updated_at),
            )
            for r in rows
        ]  # fmt: skip

    def hour_minutes(self, slice_: str, hour: datetime) -> dict[datetime, Any]:
        """Return the slice's minute rows (``bucket_start, events, users_hll``) of an hour, by bucket."""
        rows = self.sess.execute(
            self._stmt(cql.SELECT_SPEED_MINUTES),
            (slice_, day_key(hour), hour, hour + HOUR),
            execution_profile=READ_PROFILE,
        )
        return {utc(r.bucket_start): r for r in rows}  # type: ignore[misc]
