"""The subject store: one random pseudonym per user, kept in Cassandra under a keyed hash of the user id.

Raw user ids never reach Kafka: ingestion asks :meth:`SubjectStore.pseudonyms` for each user's pseudonym and puts
that on the wire. The store never holds a raw id either: its rows are keyed by :func:`subject_key`, an HMAC-SHA256
of the NFC-normalised id under a secret key (the key file, ``privacy.subject_key_file``). The pseudonym itself is
random, so deleting a subject's row (:meth:`SubjectStore.unlink`) leaves nothing that links the pseudonym back to
the user, not even with the key: the events topic stays immutable and the subject's events become anonymous
(crypto-shredding).

Producers racing on a new user agree on one pseudonym: each tries ``INSERT ... IF NOT EXISTS`` (a lightweight
transaction) with its own random candidate, and a loser reads the winner's pseudonym from the result.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
import unicodedata
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cachetools import LRUCache, TTLCache

from infra.cassandra import READ_PROFILE, WRITE_PROFILE, make_cluster, table
from infra.errors import TrendsError
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, ResponseFuture, Session

logger = logging.getLogger(__name__)

MIN_KEY_BYTES: Final = 32
PSEUDONYM_PREFIX: Final = "p_"
# Domain separation: the store's row key and the hash shown in ledgers and consoles are different functions of
# the same secret, so a value printed anywhere cannot be used to look a subject up in the store.
READ_GROUP: Final = 100  # subjects read per request (one IN query)
# Subject hours written per request, as an unlogged batch: Cassandra warns (to the server log and every client)
# about unlogged batches over more than 10 partitions (unlogged_batch_across_partitions_warn_threshold).
WRITE_GROUP: Final = 10
ATTEMPTS: Final = 6  # tries of a request that timed out (LWT contention between producers) before giving up
BACKOFF_S: Final = 0.05
_KEY_LABEL: Final = b"trends/subject-key/v1"
_HASH_LABEL: Final = b"trends/subject-hash/v1"
_HOUR_MS: Final = 3_600_000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)

SELECT_PSEUDONYM = "SELECT pseudonym FROM {t} WHERE subject_key = ?"
SELECT_PSEUDONYMS = "SELECT subject_key, pseudonym FROM {t} WHERE subject_key IN ?"
INSERT_SUBJECT = "INSERT INTO {t} (subject_key, pseudonym, created_at) VALUES (?, ?, ?) IF NOT EXISTS"
DELETE_SUBJECT = "DELETE FROM {t} WHERE subject_key = ? IF EXISTS"
INSERT_HOUR = "INSERT INTO {t} (subject_key, hour) VALUES (?, ?)"
SELECT_HOURS = "SELECT hour FROM {t} WHERE subject_key = ?"
DELETE_HOURS = "DELETE FROM {t} WHERE subject_key = ?"


class SubjectKeyError(TrendsError):
    """The subject key file is missing, unreadable or too short."""


class SubjectStoreError(TrendsError):
    """Cassandra did not answer a pseudonym request: nothing may be produced with a raw id instead."""


def normalise(user: str) -> str:
    """Return the user id as the store hashes it: Unicode NFC (the event model normalises text the same way)."""
    return user if user.isascii() else unicodedata.normalize("NFC", user)


def new_pseudonym() -> str:
    """Return a fresh random pseudonym: ``p_`` and 16 url-safe base64 characters of 12 random bytes."""
    return PSEUDONYM_PREFIX + urlsafe_b64encode(secrets.token_bytes(12)).decode("ascii")


def hour_of(ts: datetime) -> datetime:
    """Return the start of the UTC hour holding ``ts`` (aware)."""
    ms = (ts - _EPOCH) // _ONE_MS
    return datetime.fromtimestamp(ms // _HOUR_MS * 3600, UTC)


def read_key(path: Path) -> bytes:
    """Return the subject key's bytes (the file's content without surrounding whitespace).

    :raises SubjectKeyError: when the file is missing, unreadable or shorter than :data:`MIN_KEY_BYTES`; the
        message names the file and never its content.
    """
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError as exc:
        msg = (
            f"the subject key file {path} does not exist: `trends stack init` creates it for the local stack; "
            "elsewhere set privacy.subject_key_file to the deployment's key (the same on every producer)"
        )
        raise SubjectKeyError(msg) from exc
    except OSError as exc:
        msg = f"cannot read the subject key file {path}: {exc.strerror}"
        raise SubjectKeyError(msg) from exc
    if len(key) < MIN_KEY_BYTES:
        msg = f"the subject key file {path} holds {len(key)} bytes; it needs at least {MIN_KEY_BYTES}"
        raise SubjectKeyError(msg)
    return key


def ensure_key_file(path: Path) -> bool:
    """Create a random subject key at ``path`` (mode 0600, folder 0700) unless one exists; tell whether it did.

    Created with ``O_EXCL``: two processes doing this at once end with one key.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(MIN_KEY_BYTES) + "\n")
    logger.info("created the subject key file %s", path)
    return True


class SubjectKeys:
    """The two keyed hashes of a user id: the store's row key, and the hash shown in ledgers and consoles."""

    def __init__(self, key: bytes) -> None:
        self._row = hmac.new(key, _KEY_LABEL, hashlib.sha256)
        self._shown = hmac.new(key, _HASH_LABEL, hashlib.sha256)

    def __repr__(self) -> str:
        return "SubjectKeys(<secret>)"

    def subject_key(self, user: str) -> bytes:
        """Return the store's row key of a user: HMAC-SHA256 of the NFC id (32 bytes)."""
        mac = self._row.copy()
        mac.update(normalise(user).encode("utf-8", "surrogatepass"))
        return mac.digest()

    def subject_hash(self, user: str) -> str:
        """Return the hex hash of a user that ledgers and consoles show (not usable to look the store up)."""
        mac = self._shown.copy()
        mac.update(normalise(user).encode("utf-8", "surrogatepass"))
        return mac.hexdigest()


def subject_key(user: str, key: bytes) -> bytes:
    """Return the store's row key of ``user`` under the secret ``key`` (see :class:`SubjectKeys`)."""
    return SubjectKeys(key).subject_key(user)


def subject_hash(user: str, key: bytes) -> str:
    """Return the shown hash of ``user`` under the secret ``key`` (see :class:`SubjectKeys`)."""
    return SubjectKeys(key).subject_hash(user)


@dataclass(frozen=True)
class Unlinked:
    """What :meth:`SubjectStore.unlink` removed: the subject's shown hash, its pseudonym (if it had one), its hours.

    The pseudonym is the last link to the subject's events; the caller keeps it only as long as it needs it
    (to exclude those events), never in a log.
    """

    subject_key_hash: str
    pseudonym: str | None = field(repr=False)
    hours: list[datetime]


@dataclass
class StoreStats:
    """What a store did in this process (the benchmark and the ingest summary read it)."""

    cache_hits: int = 0
    read: int = 0  # pseudonyms found by a plain read
    created: int = 0  # pseudonyms this process created (its LWT applied)
    raced: int = 0  # LWTs lost to another producer: its pseudonym taken
    hours_written: int = 0
    hours_skipped: int = 0  # (subject, hour) pairs already written by this process

    def add(self, counts: dict[str, int]) -> None:
        """Add another process's counts (a validation worker's) to these."""
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        """Return the summary line of a producing run."""
        return (
            f"pseudonyms {self.created:,} created, {self.read:,} found, {self.raced:,} taken from a racing producer, "
            f"{self.cache_hits:,} from the cache; subject hours written {self.hours_written:,}"
        )


class SubjectStore:
    """Get or create pseudonyms, record the hours that hold a subject's events, and unlink a subject.

    :arg settings: the settings (Cassandra, ``privacy``); the key is read from ``settings.subject_key_path``.
    :arg session: a driver session to use (not closed by :meth:`close`); default: one of its own.
    :arg key: the subject key's bytes instead of the key file (tests).
    :arg timer: the clock of the cache's TTL (tests).
    """

    def __init__(
        self,
        settings: Settings,
        session: Session | None = None,
        *,
        key: bytes | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        privacy = settings.privacy
        self.keys = SubjectKeys(key if key is not None else read_key(settings.subject_key_path))
        self.stats = StoreStats()
        self._settings = settings
        self._concurrency = privacy.lookup_concurrency
        self._cache: TTLCache[str, tuple[str, bytes]] | None = (  # user -> (pseudonym, row key)
            TTLCache(privacy.pseudonym_cache_size, privacy.pseudonym_cache_ttl_s, timer)
            if privacy.pseudonym_cache_size
            else None
        )
        # pseudonym -> row key of the pseudonyms this process handed out, so note_hours takes either
        self._by_pseudonym: TTLCache[str, bytes] | None = (
            TTLCache(privacy.pseudonym_cache_size, privacy.pseudonym_cache_ttl_s, timer)
            if privacy.pseudonym_cache_size
            else None
        )
        self._noted: LRUCache[tuple[bytes, int], bool] | None = (
            LRUCache(privacy.hours_dedupe_size) if privacy.hours_dedupe_size else None
        )
        self._lock = threading.Lock()
        self._cluster: Cluster | None = None
        self._session = session
        self._owns_session = session is None
        self._statements: dict[str, Any] = {}
        self._writes = threading.Condition()
        self._pending = 0  # hour writes in flight
        self._write_errors: list[str] = []

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _sess(self) -> Session:
        if self._session is None:
            self._cluster = make_cluster(self._settings)
            self._session = self._cluster.connect()
        return self._session

    def _stmt(self, template: str, table_name: str, *, idempotent: bool = True) -> Any:
        stmt = self._statements.get(template)
        if stmt is None:
            stmt = self._sess().prepare(template.format(t=table(self._settings, table_name)))
            stmt.is_idempotent = idempotent
            self._statements[template] = stmt
        return stmt

    def subject_key(self, user: str) -> bytes:
        """Return the store's row key of a user (see :class:`SubjectKeys`)."""
        return self.keys.subject_key(user)

    def subject_hash(self, user: str) -> str:
        """Return the hash of a user that ledgers and consoles show (see :class:`SubjectKeys`)."""
        return self.keys.subject_hash(user)

    # -- pseudonyms -------------------------------------------------------------------------------------------
    def pseudonyms(self, users: Iterable[str]) -> dict[str, str]:
        """Return the pseudonym of each user, creating the missing ones; many users at once, cached.

        Users not in the cache are read concurrently; the ones without a row get a random pseudonym through a
        lightweight transaction each, concurrently, and whoever lost a race takes the winner's.

        :raises SubjectStoreError: when Cassandra does not answer (the caller must not fall back to the raw id).
        """
        out: dict[str, str] = {}
        missing: dict[str, bytes] = {}
        cache = self._cache
        for user in users:
            if user in out or user in missing:
                continue
            if cache is not None:
                with self._lock:
                    found = cache.get(user)
                if found is not None:
                    out[user] = found[0]
                    self.stats.cache_hits += 1
                    continue
            missing[user] = self.keys.subject_key(user)
        if missing:
            out.update(self._fetch_or_create(missing))
        return out

    def _fetch_or_create(self, users: dict[str, bytes]) -> dict[str, str]:
        names = list(users)
        keys = [users[u] for u in names]
        found: dict[bytes, str] = {}
        # many partitions per read (IN): a round trip per READ_GROUP users rather than per user
        select = self._stmt(SELECT_PSEUDONYMS, "subjects")
        distinct = list(dict.fromkeys(keys))
        groups = [(distinct[i : i + READ_GROUP],) for i in range(0, len(distinct), READ_GROUP)]
        for rows in self._concurrent(select, groups, READ_PROFILE):
            for row in rows:
                found[row.subject_key] = row.pseudonym
        self.stats.read += len(found)
        absent = list(dict.fromkeys(k for k in keys if k not in found))
        if absent:
            insert = self._stmt(INSERT_SUBJECT, "subjects", idempotent=False)
            now = datetime.now(UTC)
            candidates = [new_pseudonym() for _ in absent]
            params = [(k, p, now) for k, p in zip(absent, candidates, strict=True)]
            results = self._concurrent(insert, params, WRITE_PROFILE)
            for key, candidate, rows in zip(absent, candidates, results, strict=True):
                row = rows.one()
                if row is None or row.applied:
                    found[key] = candidate
                    self.stats.created += 1
                else:  # another producer created it first: its pseudonym is the one
                    found[key] = row.pseudonym
                    self.stats.raced += 1
        out = {u: found[k] for u, k in zip(names, keys, strict=True)}
        with self._lock:
            if self._cache is not None and self._by_pseudonym is not None:
                for user, key in users.items():
                    self._cache[user] = (out[user], key)
                    self._by_pseudonym[out[user]] = key
        return out

    def _concurrent(self, stmt: Any, params: list[Any], profile: str) -> list[Any]:
        """Run a statement for each parameter tuple concurrently; return the result sets in order.

        A timed-out request is retried (with back-off) up to :data:`ATTEMPTS` times: reads are idempotent and
        ``INSERT ... IF NOT EXISTS`` is too in effect (a retry of an applied insert reads back its own value).
        Producers racing on the same new users contend in Paxos, and contention ends in such timeouts.

        :raises SubjectStoreError: when some request still fails.
        """
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        out: list[Any] = [None] * len(params)
        todo = list(range(len(params)))
        error: BaseException | None = None
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(BACKOFF_S * 2**attempt * (0.5 + secrets.randbelow(1000) / 1000))
            results = execute_concurrent_with_args(
                self._sess(),
                stmt,
                [params[i] for i in todo],
                concurrency=self._concurrency,
                raise_on_first_error=False,
                execution_profile=profile,
            )
            failed = []
            for i, (ok, result) in zip(todo, results, strict=True):
                if ok:
                    out[i] = result
                else:
                    failed.append(i)
                    error = result
            if not failed:
                return out
            logger.warning(
                "subject store: %d of %d request(s) failed (%s), attempt %d of %d",
                len(failed), len(todo), type(error).__name__, attempt + 1, ATTEMPTS,
            )  # fmt: skip
            todo = failed
        msg = f"the subject store did not answer ({type(error).__name__}): {error}"
        raise SubjectStoreError(msg) from error

    def lookup(self, user: str) -> str | None:
        """Return the user's pseudonym as the store holds it now (never created, never from the cache)."""
        stmt = self._stmt(SELECT_PSEUDONYM, "subjects")
        row = self._sess().execute(stmt, (self.keys.subject_key(user),), execution_profile=READ_PROFILE).one()
        return None if row is None else str(row.pseudonym)

    # -- hours ------------------------------------------------------------------------------------------------
    def note_hours(self, pairs: Iterable[tuple[str, datetime]]) -> None:
        """Record that these hours hold events of these subjects (a user or a pseudonym this store handed out).

        Each (subject, hour) is written once per process (up to ``privacy.hours_dedupe_size`` remembered);
        writes are asynchronous, at most ``privacy.lookup_concurrency`` in flight: :meth:`flush` waits for them
        and raises the first error.
        """
        from cassandra.query import BatchStatement, BatchType  # noqa: PLC0415

        insert = self._stmt(INSERT_HOUR, "subject_hours")
        rows: list[tuple[bytes, datetime]] = []
        for who, ts in pairs:
            key = self._key_of(who)
            hour_ms = (ts - _EPOCH) // _ONE_MS // _HOUR_MS * _HOUR_MS
            if self._noted is not None:
                with self._lock:
                    seen = (key, hour_ms) in self._noted
                    if not seen:
                        self._noted[(key, hour_ms)] = True
                if seen:
                    self.stats.hours_skipped += 1
                    continue
            rows.append((key, datetime.fromtimestamp(hour_ms / 1000, UTC)))
        self.stats.hours_written += len(rows)
        for i in range(0, len(rows), WRITE_GROUP):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            batch.is_idempotent = True
            for row in rows[i : i + WRITE_GROUP]:
                batch.add(insert, row)
            self._write_async(batch, None)

    def _key_of(self, who: str) -> bytes:
        if self._cache is not None and self._by_pseudonym is not None:
            with self._lock:
                cached = self._cache.get(who)
                key = cached[1] if cached is not None else self._by_pseudonym.get(who)
            if key is not None:
                return key
        return self.keys.subject_key(who)

    def _write_async(self, stmt: Any, params: tuple[Any, ...] | None) -> None:
        with self._writes:
            while self._pending >= self._concurrency:
                self._writes.wait()
            self._pending += 1
        try:
            future: ResponseFuture = self._sess().execute_async(stmt, params, execution_profile=WRITE_PROFILE)
        except Exception:
            self._one_done()
            raise
        future.add_callbacks(self._written, self._failed)

    def _one_done(self) -> None:
        with self._writes:
            self._pending -= 1
            self._writes.notify_all()

    def _written(self, _rows: Any) -> None:
        self._one_done()

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            if len(self._write_errors) < 20:
                self._write_errors.append(f"{type(exc).__name__}: {exc}")
        self._one_done()

    def flush(self) -> None:
        """Wait for the hours written so far.

        :raises SubjectStoreError: when some were not written (this process forgets having written any hour,
            so they are written again).
        """
        with self._writes:
            while self._pending:
                self._writes.wait()
        with self._lock:
            errors, self._write_errors = self._write_errors, []
            if errors and self._noted is not None:
                self._noted.clear()
        if errors:
            msg = f"{len(errors)} subject hour(s) were not written; first: {errors[0]}"
            raise SubjectStoreError(msg)

    def hours(self, user: str) -> list[datetime]:
        """Return the UTC hours that hold the user's events, oldest first."""
        stmt = self._stmt(SELECT_HOURS, "subject_hours")
        rows = self._sess().execute(stmt, (self.keys.subject_key(user),), execution_profile=READ_PROFILE)
        return sorted(r.hour.replace(tzinfo=UTC) for r in rows)

    # -- erasure ----------------------------------------------------------------------------------------------
    def unlink(self, user: str) -> Unlinked:
        """Delete the user's pseudonym and hours from the store; return what they were.

        After this nothing links the pseudonym to the user; running producers drop it from their caches within
        ``privacy.pseudonym_cache_ttl_s`` and give the user's later events a new pseudonym.
        """
        key = self.keys.subject_key(user)
        pseudonym = self.lookup(user)
        hours = self.hours(user)
        sess = self._sess()
        sess.execute(self._stmt(DELETE_SUBJECT, "subjects", idempotent=False), (key,), execution_profile=WRITE_PROFILE)
        sess.execute(self._stmt(DELETE_HOURS, "subject_hours"), (key,), execution_profile=WRITE_PROFILE)
        with self._lock:
            if self._cache is not None:
                self._cache.pop(user, None)
            if self._by_pseudonym is not None and pseudonym is not None:
                self._by_pseudonym.pop(pseudonym, None)
            if self._noted is not None:
                for pair in [p for p in self._noted if p[0] == key]:
                    self._noted.pop(pair, None)
        return Unlinked(self.keys.subject_hash(user), pseudonym, hours)

    def close(self) -> None:
        """Wait for pending writes (errors are logged), then close the store's own connection."""
        try:
            self.flush()
        except SubjectStoreError as exc:
            logger.error("closing the subject store: %s", exc)
        if self._owns_session and self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
            self._session = None

    def __enter__(self) -> SubjectStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
