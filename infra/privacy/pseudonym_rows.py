"""The pseudonym rows in Cassandra: read a bucket at a time, created by one conditional batch per bucket.

Producers racing on a new user must agree on one pseudonym, so a row is created with ``INSERT ... IF NOT EXISTS``:
a lightweight transaction, one Paxos round per partition. Rows are grouped in :data:`BUCKETS` partitions by the
first byte of their keyed hash (``subject_pseudonyms``, migration 0014), and the new users of a bucket are created
together in a single conditional batch: one round for up to :data:`CREATE_GROUP` users instead of one each. Within
a process reads and creations are group-committed (:class:`GroupCommit`): while one round runs, the users that other
threads need are queued and go in the next, so a bucket's keys go in one request and two threads of a process never
contend for the same bucket's Paxos.

Rows written before the buckets (``subjects``, one partition per user) are still read when a user is not found in a
bucket, and copied into it at that user's next event; :meth:`PseudonymRows.delete` removes both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

logger = logging.getLogger(__name__)

BUCKETS: Final = 256  # partitions of subject_pseudonyms: fixed, a row's bucket is the first byte of its key
# Users created per conditional batch: ~70 bytes a row keeps a batch under Cassandra's default batch-size warning
# (batch_size_warn_threshold, 5 KiB).
CREATE_GROUP: Final = 50
READ_GROUP: Final = 100  # keys read per request
# Partitions a request spans: a client request costs far more (in the driver, in Python) than a partition costs the
# node, so a read or an unlogged batch takes several buckets at once. Cassandra warns about unlogged batches over
# 10 partitions (unlogged_batch_across_partitions_warn_threshold); a read's cartesian IN stays small at this size.
SPAN: Final = 10
ROUNDS: Final = 8  # passes in a row that resolve no user before a round gives up

TABLE: Final = "subject_pseudonyms"
LEGACY_TABLE: Final = "subjects"
SELECT = "SELECT subject_key, pseudonym FROM {t} WHERE bucket IN ? AND subject_key IN ?"
SELECT_ONE = "SELECT pseudonym FROM {t} WHERE bucket = ? AND subject_key = ?"
INSERT = "INSERT INTO {t} (bucket, subject_key, pseudonym, created_at) VALUES (?, ?, ?, ?) IF NOT EXISTS"
DELETE = "DELETE FROM {t} WHERE bucket = ? AND subject_key = ? IF EXISTS"
LEGACY_ANY = "SELECT subject_key FROM {t} LIMIT 1"
LEGACY_SELECT = "SELECT subject_key, pseudonym FROM {t} WHERE subject_key IN ?"
LEGACY_SELECT_ONE = "SELECT pseudonym FROM {t} WHERE subject_key = ?"
LEGACY_DELETE = "DELETE FROM {t} WHERE subject_key = ?"

V = TypeVar("V")
R = TypeVar("R")
Created = dict[bytes, tuple[str, bool]]  # key -> (pseudonym, created by this process)
# (statement template, table name, idempotent) -> the prepared statement
Prepare = Callable[[str, str, bool], Any]
# (requests of (statement, parameters), execution profile) -> their result sets in order, retried on timeouts
Run = Callable[[list[tuple[Any, Any]], str], list[Any]]


def bucket_of(key: bytes) -> int:
    """Return the bucket (partition) of a row key: its first byte."""
    return key[0]


def packed(groups: dict[Any, list[V]], rows: int, span: int = SPAN) -> list[list[tuple[Any, V]]]:
    """Return the rows of these partitions in requests of at most ``rows`` rows and ``span`` partitions.

    A partition with more rows than a request takes is split over several.
    """
    out: list[list[tuple[Any, V]]] = []
    current: list[tuple[Any, V]] = []
    partitions = 0
    for partition, values in groups.items():
        for i in range(0, len(values), rows):
            part = values[i : i + rows]
            if current and (len(current) + len(part) > rows or partitions >= span):
                out.append(current)
                current, partitions = [], 0
            current += [(partition, v) for v in part]
            partitions += 1
    if current:
        out.append(current)
    return out


def by_bucket(keys: Iterable[bytes]) -> dict[int, list[bytes]]:
    """Return the keys grouped by bucket, in the order given."""
    out: dict[int, list[bytes]] = {}
    for key in keys:
        out.setdefault(bucket_of(key), []).append(key)
    return out


class PseudonymRowsError(RuntimeError):
    """Users' rows could be neither created nor read: :data:`ROUNDS` passes in a row resolved none of them."""


class StoreRows:
    """Rows of one kind in the subject store, read and written through the store's statements and retries.

    :arg prepare: prepares a statement template for a table (the store's, which caches them).
    :arg run: runs requests concurrently with the store's retries.
    :arg read_profile: the execution profile of reads; ``write_profile`` of writes.
    """

    def __init__(self, prepare: Prepare, run: Run, read_profile: str, write_profile: str) -> None:
        self._prepare = prepare
        self._run = run
        self._read_profile = read_profile
        self._write_profile = write_profile


class PseudonymRows(StoreRows):
    """Read, create and delete pseudonym rows (see the module's docstring)."""

    def __init__(self, prepare: Prepare, run: Run, read_profile: str, write_profile: str) -> None:
        super().__init__(prepare, run, read_profile, write_profile)
        self._legacy: bool | None = None
        self._reads: GroupCommit[None, str | None] = GroupCommit(self._read_round)
        self._creates: GroupCommit[str, tuple[str, bool]] = GroupCommit(self._round)

    # -- reads ------------------------------------------------------------------------------------------------
    def read(self, keys: list[bytes]) -> dict[bytes, str]:
        """Return the pseudonyms stored in the buckets for these keys (the keys found).

        Reads of this process's threads are grouped like creations: one round at a time, each taking every key
        asked for meanwhile, so a bucket's keys go in one request rather than one per caller.
        """
        return {key: found for key, found in self._reads(dict.fromkeys(keys)).items() if found is not None}

    def _read_round(self, keys: dict[bytes, None]) -> dict[bytes, str | None]:
        found = found_in(self._run(self.read_requests(list(keys)), self._read_profile))
        return {key: found.get(key) for key in keys}

    def read_requests(self, keys: list[bytes]) -> list[tuple[Any, tuple[Any, ...]]]:
        """Return the reads of these keys' rows: up to :data:`READ_GROUP` keys of up to :data:`SPAN` buckets each.

        Their results go to :func:`found_in` (a key lives in one bucket, so the IN's cartesian product finds only
        the keys asked for).
        """
        select = self._prepare(SELECT, TABLE, True)
        return [
            (select, (list(dict.fromkeys(bucket for bucket, _ in request)), [key for _, key in request]))
            for request in packed(by_bucket(keys), READ_GROUP)
        ]

    def legacy(self, keys: list[bytes]) -> dict[bytes, str]:
        """Return the pseudonyms of these keys found in the rows from before the buckets (none once it is empty)."""
        if not keys or not self._has_legacy():
            return {}
        select = self._prepare(LEGACY_SELECT, LEGACY_TABLE, True)
        reads = [(select, (keys[i : i + READ_GROUP],)) for i in range(0, len(keys), READ_GROUP)]
        return found_in(self._run(reads, self._read_profile))

    def _has_legacy(self) -> bool:
        """Tell whether ``subjects`` holds a row (asked once per process: nothing writes there any more)."""
        if self._legacy is None:
            rows = self._run([(self._prepare(LEGACY_ANY, LEGACY_TABLE, True), ())], self._read_profile)[0]
            self._legacy = rows.one() is not None
            if self._legacy:
                logger.info("subject store: rows from before the buckets are read for users not found in a bucket")
        return self._legacy

    def lookup(self, key: bytes) -> str | None:
        """Return the pseudonym stored for a key now, in its bucket or among the rows from before the buckets."""
        one = self._prepare(SELECT_ONE, TABLE, True)
        row = self._run([(one, (bucket_of(key), key))], self._read_profile)[0].one()
        if row is None and self._has_legacy():
            legacy = self._prepare(LEGACY_SELECT_ONE, LEGACY_TABLE, True)
            row = self._run([(legacy, (key,))], self._read_profile)[0].one()
        return None if row is None else str(row.pseudonym)

    # -- writes -----------------------------------------------------------------------------------------------
    def delete(self, key: bytes) -> None:
        """Delete a key's row (a lightweight transaction, like its creation) and its row from before the buckets."""
        delete = self._prepare(DELETE, TABLE, False)
        requests: list[tuple[Any, Any]] = [(delete, (bucket_of(key), key))]
        if self._has_legacy():
            requests.append((self._prepare(LEGACY_DELETE, LEGACY_TABLE, True), (key,)))
        self._run(requests, self._write_profile)

    def create(self, candidates: dict[bytes, str]) -> Created:
        """Create these keys' rows with their candidate pseudonyms; return key -> (pseudonym, created here).

        A key another producer created first gets that producer's pseudonym (and False). A key another thread
        of this process is creating is waited for.

        :raises PseudonymRowsError: when a key's row could be neither created nor read.
        """
        return self._creates(candidates)

    def _round(self, candidates: dict[bytes, str]) -> Created:
        """Create these rows: a conditional batch of up to :data:`CREATE_GROUP` keys per bucket at a time.

        One batch per bucket is in flight, so the round's own batches never contend for a bucket's Paxos; a
        bucket with more keys sends its next batch once the previous one is answered. A batch applies whole or
        not at all: one that did not apply returns the rows that exist already (created by another producer),
        those keys take the stored pseudonym, and the rest go again.
        """
        from cassandra.query import BatchStatement, BatchType  # noqa: PLC0415

        insert = self._prepare(INSERT, TABLE, False)
        out: Created = {}
        todo = dict(candidates)
        stalled = 0  # passes in a row that resolved no key
        while todo:
            groups = [keys[:CREATE_GROUP] for keys in by_bucket(todo).values()]
            now = datetime.now(UTC)
            requests: list[tuple[Any, Any]] = []
            for group in groups:
                batch = BatchStatement(batch_type=BatchType.UNLOGGED)
                for key in group:
                    batch.add(insert, (bucket_of(key), key, todo[key], now))
                requests.append((batch, None))
            left = len(todo)
            for group, rows in zip(groups, self._run(requests, self._write_profile), strict=True):
                listed = list(rows)
                if not listed or listed[0].applied:
                    out.update((key, (todo.pop(key), True)) for key in group)
                    continue
                for row in listed:  # the batch did not apply: these rows exist
                    if row.subject_key is not None and row.subject_key in todo:
                        del todo[row.subject_key]
                        out[row.subject_key] = (str(row.pseudonym), False)
            stalled = stalled + 1 if len(todo) == left else 0
            if stalled >= ROUNDS:
                msg = f"{len(todo)} pseudonym row(s) neither created nor read in {ROUNDS} passes of conditional batches"
                raise PseudonymRowsError(msg)
        return out


def found_in(results: list[Any]) -> dict[bytes, str]:
    """Return key -> pseudonym of the rows read by :meth:`PseudonymRows.read_requests` (or the legacy reads)."""
    return {row.subject_key: row.pseudonym for rows in results for row in rows}


class GroupCommit(Generic[V, R]):
    """Run ``work`` over the keys concurrent callers ask for: one round at a time, each taking every key queued.

    A caller queues its keys (those another caller queued or is running already are shared, not asked twice),
    then either leads the next round (no round running) or waits; it returns when the rounds holding its keys
    are done. ``work`` returns a result for every key of its round; an exception fails every caller of the round,
    and its keys are asked again by whoever asks next.
    """

    def __init__(self, work: Callable[[dict[bytes, V]], dict[bytes, R]]) -> None:
        self._work = work
        self._cond = threading.Condition()
        self._queued: dict[bytes, V] = {}  # waiting for the next round
        self._next: Future[dict[bytes, R]] = Future()  # the round the queued keys go into
        self._taken: dict[bytes, Future[dict[bytes, R]]] = {}  # key -> its round (queued or running)
        self._leading = False  # a thread is running a round

    def __call__(self, asked: dict[bytes, V]) -> dict[bytes, R]:
        """Return the result of every key asked, once the rounds that hold them are done."""
        with self._cond:
            mine: dict[bytes, Future[dict[bytes, R]]] = {}
            for key, value in asked.items():
                future = self._taken.get(key)
                if future is None:
                    future = self._taken[key] = self._next
                    self._queued[key] = value
                mine[key] = future
        rounds = set(mine.values())
        while True:
            with self._cond:
                if all(f.done() for f in rounds):
                    break
                if self._leading or not self._queued:  # another thread's round holds them
                    self._cond.wait()
                    continue
                self._leading = True
                work, self._queued = self._queued, {}
                running, self._next = self._next, Future()
            try:
                outcome: dict[bytes, R] | BaseException = self._work(work)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                outcome = exc
            with self._cond:
                for key in work:
                    del self._taken[key]
                if isinstance(outcome, BaseException):
                    running.set_exception(outcome)
                else:
                    running.set_result(outcome)
                self._leading = False
                self._cond.notify_all()
        return {key: future.result()[key] for key, future in mine.items()}
