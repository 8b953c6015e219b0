"""The hours that hold a subject's events in Cassandra: written a bucket and month at a time.

Ingestion records a row per new (subject, hour) before it produces the events, so an erasure or an export finds
a subject's hours without reading the log. The rows sit in partitions of a bucket (the first byte of the keyed
hash, as the pseudonyms' rows) and a UTC month (``subject_hours_by_month``, migration 0015), so one unlogged batch
writes many subjects' hours in a single mutation: with a partition per subject each row was a mutation of its own,
and the node's commit log capped them near 8,500 a second. A batch spans a few partitions, as a read does: a
request costs the driver more than a partition costs the node.

Writing a row again is harmless, but a write waits for a commit-log sync and a read does not: the hours of users
a process reads (rather than creates) are looked up first, and only those not recorded are written. The months
that hold rows are listed in ``subject_hour_months``; a subject's hours are one read per month listed.

Rows written before (``subject_hours``, one partition per subject) are still read and deleted with the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

from infra.privacy.pseudonym_rows import GroupCommit, Prepare, Run, StoreRows, bucket_of, packed

TABLE: Final = "subject_hours_by_month"
MONTHS_TABLE: Final = "subject_hour_months"
LEGACY_TABLE: Final = "subject_hours"
MONTHS_SCOPE: Final = "hours"
READ_GROUP: Final = 100  # keys per read of recorded hours
# Rows per unlogged batch (one partition): ~50 bytes a row keeps a batch under Cassandra's default batch-size
# warning (batch_size_warn_threshold, 5 KiB).
WRITE_GROUP: Final = 80

INSERT = "INSERT INTO {t} (bucket, month, subject_key, hour) VALUES (?, ?, ?, ?)"
SELECT = "SELECT hour FROM {t} WHERE bucket = ? AND month = ? AND subject_key = ?"
SELECT_KNOWN = "SELECT subject_key FROM {t} WHERE bucket IN ? AND month = ? AND subject_key IN ? AND hour = ?"
DELETE = "DELETE FROM {t} WHERE bucket = ? AND month = ? AND subject_key = ?"
INSERT_MONTH = "INSERT INTO {t} (scope, month) VALUES (?, ?)"
SELECT_MONTHS = "SELECT month FROM {t} WHERE scope = ?"
LEGACY_SELECT = "SELECT hour FROM {t} WHERE subject_key = ?"
LEGACY_DELETE = "DELETE FROM {t} WHERE subject_key = ?"


@functools.lru_cache(maxsize=4096)
def hour_and_month(hour_ms: int) -> tuple[datetime, datetime]:
    """Return an hour (epoch ms) as the driver binds it, and the start of the UTC month holding it.

    Cached: a batch's rows share a few hours, and the conversion costs more than the rest of a row.
    """
    hour = datetime.fromtimestamp(hour_ms // 1000, UTC)
    return hour, hour.replace(day=1, hour=0)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


class HourRows(StoreRows):
    """Write, read and delete subjects' hour rows (see the module's docstring)."""

    def __init__(self, prepare: Prepare, run: Run, read_profile: str, write_profile: str) -> None:
        super().__init__(prepare, run, read_profile, write_profile)
        self._months: set[datetime] = set()  # months this process listed in subject_hour_months
        self._writes: GroupCommit[None, None] = GroupCommit(self._write_round)

    def recorded(self, pairs: Iterable[tuple[bytes, int]]) -> set[tuple[bytes, int]]:
        """Return which of these (row key, hour ms) are recorded already (by any producer).

        A read is answered without waiting for a commit-log sync, a write is not: a producer meeting users that
        others met before (a replay, a restarted producer) reads rather than writes their hours again.
        """
        by_hour: dict[int, dict[int, list[bytes]]] = {}
        for key, hour_ms in pairs:
            by_hour.setdefault(hour_ms, {}).setdefault(bucket_of(key), []).append(key)
        if not by_hour:
            return set()
        select = self._prepare(SELECT_KNOWN, TABLE, True)
        requests: list[tuple[Any, Any]] = []
        hours: list[int] = []
        for hour_ms, buckets in by_hour.items():
            hour, month = hour_and_month(hour_ms)
            for request in packed(buckets, READ_GROUP):
                in_buckets = list(dict.fromkeys(bucket for bucket, _ in request))
                requests.append((select, (in_buckets, month, [key for _, key in request], hour)))
                hours.append(hour_ms)
        results = self._run(requests, self._read_profile)
        return {(row.subject_key, hour_ms) for hour_ms, rows in zip(hours, results, strict=True) for row in rows}

    def write(self, pairs: Iterable[tuple[bytes, int]]) -> None:
        """Write these (row key, start of the hour in epoch ms); return once all are durable.

        Writes of this process's threads are grouped: one round at a time, each taking every row asked for
        meanwhile, so a bucket's rows of a month go in one batch rather than one per caller. A month new to this
        process is listed in the same round (an hour is findable once this returns).
        """
        rows = dict.fromkeys(key + hour_ms.to_bytes(8, "big") for key, hour_ms in pairs)
        if rows:
            self._writes(rows)

    def _write_round(self, asked: dict[bytes, None]) -> dict[bytes, None]:
        from cassandra.query import BatchStatement, BatchType  # noqa: PLC0415

        groups: dict[tuple[int, datetime], list[tuple[bytes, datetime]]] = {}
        for row in asked:
            key = row[:-8]
            hour, month = hour_and_month(int.from_bytes(row[-8:], "big"))
            groups.setdefault((bucket_of(key), month), []).append((key, hour))
        insert = self._prepare(INSERT, TABLE, True)
        requests: list[tuple[Any, Any]] = []
        new_months = {month for _bucket, month in groups} - self._months
        if new_months:
            listed = self._prepare(INSERT_MONTH, MONTHS_TABLE, True)
            requests += [(listed, (MONTHS_SCOPE, month)) for month in sorted(new_months)]
        for rows in packed(groups, WRITE_GROUP):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            batch.is_idempotent = True
            for (bucket, month), (key, hour) in rows:
                batch.add(insert, (bucket, month, key, hour))
            requests.append((batch, None))
        self._run(requests, self._write_profile)
        self._months |= new_months
        return dict.fromkeys(asked)

    def months(self) -> list[datetime]:
        """Return the months that hold any subject's hours, oldest first."""
        rows = self._run([(self._prepare(SELECT_MONTHS, MONTHS_TABLE, True), (MONTHS_SCOPE,))], self._read_profile)
        return sorted(_utc(r.month) for r in rows[0])

    def hours(self, key: bytes) -> list[datetime]:
        """Return the UTC hours recorded for a row key, oldest first: one read per month, and the rows from before."""
        bucket = bucket_of(key)
        select = self._prepare(SELECT, TABLE, True)
        requests: list[tuple[Any, Any]] = [(select, (bucket, month, key)) for month in self.months()]
        requests.append((self._prepare(LEGACY_SELECT, LEGACY_TABLE, True), (key,)))
        return sorted({_utc(r.hour) for rows in self._run(requests, self._read_profile) for r in rows})

    def delete(self, key: bytes) -> None:
        """Delete a row key's hours in every month listed, and its rows from before."""
        bucket = bucket_of(key)
        delete = self._prepare(DELETE, TABLE, True)
        requests: list[tuple[Any, Any]] = [(delete, (bucket, month, key)) for month in self.months()]
        requests.append((self._prepare(LEGACY_DELETE, LEGACY_TABLE, True), (key,)))
        self._run(requests, self._write_profile)
