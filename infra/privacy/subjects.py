"""The subject store: one random pseudonym per user, kept in Cassandra under a keyed hash of the user id.

Raw user ids never reach Kafka: ingestion asks :meth:`SubjectStore.pseudonyms` for each user's pseudonym and puts
that on the wire. The store never holds a raw id either: its rows are keyed by :func:`subject_key`, an HMAC-SHA256
of the NFC-normalised id under a secret key (the key file, ``privacy.subject_key_file``). The pseudonym itself is
random, so deleting a subject's row (:meth:`SubjectStore.unlink`) leaves nothing that links the pseudonym back to
the user, not even with the key: the events topic stays immutable and the subject's events become anonymous
(crypto-shredding).

Producers racing on a new user agree on one pseudonym: each tries ``INSERT ... IF NOT EXISTS`` (a lightweight
transaction) with its own random candidate, and a loser reads the winner's pseudonym from the result. The rows sit in
256 buckets, so a single conditional batch creates many users (:mod:`infra.privacy.pseudonym_rows`).
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from infra.cassandra import READ_PROFILE, WRITE_PROFILE, make_cluster, table
from infra.errors import TrendsError
from infra.privacy.hour_rows import HourRows
from infra.privacy.pseudonym_rows import PseudonymRows, PseudonymRowsError
from infra.privacy.recent import RecentMap
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session

logger = logging.getLogger(__name__)

MIN_KEY_BYTES: Final = 32
PSEUDONYM_PREFIX: Final = "p_"
# Domain separation: the store's row key and the hash shown in ledgers and consoles are different functions of
# the same secret, so a value printed anywhere cannot be used to look a subject up in the store.
ATTEMPTS: Final = 6  # tries of a request that timed out (LWT contention between producers) before giving up
BACKOFF_S: Final = 0.05
_KEY_LABEL: Final = b"trends/subject-key/v1"
_HASH_LABEL: Final = b"trends/subject-hash/v1"
_HOUR_MS: Final = 3_600_000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)


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
    hours_known: int = 0  # (subject, hour) pairs found recorded already (by another process), not written again

    def add(self, counts: dict[str, int]) -> None:
        """Add another process's counts (a validation worker's) to these."""
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        """Return the summary line of a producing run."""
        return (
            f"pseudonyms {self.created:,} created, {self.read:,} found, {self.raced:,} taken from a racing producer, "
            f"{self.cache_hits:,} from the cache; subject hours written {self.hours_written:,}, "
            f"{self.hours_known:,} found recorded"
        )


@dataclass
class _Claim:
    """One :meth:`SubjectStore.resolve` call: what it answered, what it does itself, whose work it waits for."""

    mine: Future[dict[str, str]] = field(default_factory=Future)
    out: dict[str, str] = field(default_factory=dict)
    lookup: dict[str, bytes] = field(default_factory=dict)  # users it reads (or creates) -> their row keys
    keys: dict[str, bytes] = field(default_factory=dict)  # users answered from the cache -> their row keys
    waits: dict[int, Future[dict[str, str]]] = field(default_factory=dict)  # other calls' work it needs
    waited: list[str] = field(default_factory=list)  # users another call is resolving
    fresh: dict[tuple[bytes, int], None] = field(default_factory=dict)  # (row key, hour ms) it records, in order


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
        ttl = privacy.pseudonym_cache_ttl_s
        self._cache: RecentMap[str, tuple[str, bytes]] | None = (  # user -> (pseudonym, row key)
            RecentMap(privacy.pseudonym_cache_size, ttl, timer) if privacy.pseudonym_cache_size else None
        )
        # pseudonym -> row key of the pseudonyms this process handed out, so note_hours takes either
        self._by_pseudonym: RecentMap[str, bytes] | None = (
            RecentMap(privacy.pseudonym_cache_size, ttl, timer) if privacy.pseudonym_cache_size else None
        )
        # (row key, hour ms) -> True once written by this process, or the future of the call writing it; written
        # again after the TTL too, so a pair a forget deleted is recorded again by every producer within it
        self._noted: RecentMap[tuple[bytes, int], Literal[True] | Future[dict[str, str]]] | None = (
            RecentMap(privacy.hours_dedupe_size, ttl, timer) if privacy.hours_dedupe_size else None
        )
        # (user, hour ms) -> pseudonym once both are durable: a batch of known users and hours is one lookup each
        self._ready: RecentMap[tuple[str, int], str] | None = (
            RecentMap(privacy.hours_dedupe_size, ttl, timer)
            if privacy.hours_dedupe_size and privacy.pseudonym_cache_size
            else None
        )
        self._inflight: dict[str, Future[dict[str, str]]] = {}  # user -> the call resolving it now
        self._lock = threading.Lock()
        self._hour_writer: ThreadPoolExecutor | None = None  # writes hours while new users are created
        self._cluster: Cluster | None = None
        self._session = session
        self._owns_session = session is None
        self._statements: dict[str, Any] = {}
        prepare = lambda template, name, idempotent: self._stmt(template, name, idempotent=idempotent)  # noqa: E731
        self._rows = PseudonymRows(prepare, self._concurrent, READ_PROFILE, WRITE_PROFILE)
        self._hours = HourRows(prepare, self._concurrent, READ_PROFILE, WRITE_PROFILE)

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _sess(self) -> Session:
        if self._session is None:
            cluster = make_cluster(self._settings)
            try:
                self._session = cluster.connect()
            except Exception as exc:  # NoHostAvailable, auth, TLS: no pseudonym can be had
                cluster.shutdown()
                msg = f"cannot reach the subject store ({type(exc).__name__}): {exc}"
                raise SubjectStoreError(msg) from exc
            self._cluster = cluster
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

    # -- pseudonyms and hours ---------------------------------------------------------------------------------
    def resolve(self, users: Iterable[str], hours: Iterable[tuple[str, int]] = ()) -> dict[str, str]:
        """Return the pseudonym of each user, creating the missing ones, once every hour given is recorded.

        What this process resolved within the cache's TTL is answered from memory, one lookup per (user, hour).
        The rest takes two rounds of concurrent requests: the reads of the users this process has not seen, then
        the writes (the unrecorded (subject, hour) rows, a conditional batch per bucket of new users). A user or
        an hour that another thread of this process is resolving is waited for, not asked twice, so pipelined
        batches (:meth:`ingestion.pseudonyms.Pseudonymiser.table_async`) share their work and every caller still
        returns only after what it needs is durable.

        :arg hours: (user or pseudonym this store handed out, start of the UTC hour in epoch ms).
        :raises SubjectStoreError: when Cassandra does not answer (the caller must not fall back to the raw id).
        """
        pairs = list(hours)
        if self._ready is None:
            return self._resolve(users, pairs)
        with self._lock:
            self._ready.tick()
            out, missed = self._ready.split(pairs)
            self.stats.cache_hits += len(out)
        rest = [user for user in users if user not in out]
        if rest or missed:
            found = self._resolve(rest, missed)
            with self._lock:
                for pair in missed:
                    pseudonym = found.get(pair[0])
                    if pseudonym is not None:
                        self._ready[pair] = pseudonym
            out.update(found)
        return out

    def memory_turns(self) -> int | None:
        """Return how often this process's memory of pseudonyms dropped entries; None when it keeps none.

        A caller that copies answers of :meth:`resolve` into its own memory drops them when this changes, so a
        forgotten user's pseudonym still leaves it within ``privacy.pseudonym_cache_ttl_s``.
        """
        if self._ready is None:
            return None
        with self._lock:
            self._ready.tick()
            return self._ready.turns

    def _resolve(self, users: Iterable[str], hours: Iterable[tuple[str, int]]) -> dict[str, str]:
        claim = _Claim()
        self._claim_users(claim, users)
        self._claim_hours(claim, hours)
        try:
            made = self._read_then_write(claim.lookup, list(claim.fresh))
        except BaseException as exc:
            self._release(claim, None)
            claim.mine.set_exception(exc)
            raise
        self._release(claim, made)
        claim.mine.set_result(made)
        claim.out.update(made)
        for other in claim.waits.values():
            try:
                theirs = other.result()
            except BaseException as exc:
                msg = f"the subject store did not answer another batch of this process ({type(exc).__name__})"
                raise SubjectStoreError(msg) from exc
            claim.out.update((user, theirs[user]) for user in claim.waited if user in theirs)
        return claim.out

    def _claim_users(self, claim: _Claim, users: Iterable[str]) -> None:
        """Answer users from the cache, wait for those another call is resolving, take on the rest."""
        with self._lock:
            for recent in (self._cache, self._by_pseudonym, self._noted):
                if recent is not None:
                    recent.tick()
            for user in users:
                if user in claim.out or user in claim.lookup:
                    continue
                found = self._cache.get(user) if self._cache is not None else None
                if found is not None:
                    claim.out[user], claim.keys[user] = found
                    self.stats.cache_hits += 1
                    continue
                other = self._inflight.get(user)
                if other is not None:
                    claim.waits[id(other)] = other
                    claim.waited.append(user)
                    continue
                self._inflight[user] = claim.mine
                claim.lookup[user] = b""  # the key is computed below, outside the lock
        for user in claim.lookup:
            claim.lookup[user] = self.keys.subject_key(user)

    def _claim_hours(self, claim: _Claim, hours: Iterable[tuple[str, int]]) -> None:
        """Skip the hours this process recorded, wait for those another call is recording, take on the rest."""
        known = claim.keys
        pairs = [(known.get(who) or self._key_of(who, claim.lookup), hour_ms) for who, hour_ms in hours]
        with self._lock:
            for pair in pairs:
                noted = self._noted.get(pair) if self._noted is not None else None
                if noted is True or pair in claim.fresh:
                    self.stats.hours_skipped += 1
                elif noted is not None:
                    claim.waits[id(noted)] = noted
                else:
                    claim.fresh[pair] = None
                    if self._noted is not None:
                        self._noted[pair] = claim.mine

    def _release(self, claim: _Claim, made: dict[str, str] | None) -> None:
        """Cache what a call made (nothing when it failed) and let other calls take its users and hours again."""
        with self._lock:
            for user, key in claim.lookup.items():
                if made is not None and self._cache is not None and self._by_pseudonym is not None:
                    self._cache[user] = (made[user], key)
                    self._by_pseudonym[made[user]] = key
                self._inflight.pop(user, None)
            if self._noted is not None:
                for pair in claim.fresh:
                    if self._noted.get(pair) is claim.mine:
                        if made is None:
                            self._noted.pop(pair, None)
                        else:
                            self._noted[pair] = True

    def _key_of(self, who: str, lookup: dict[str, bytes]) -> bytes:
        """Return the row key of a user or of a pseudonym this store handed out."""
        key = lookup.get(who)
        if key:
            return key
        if self._cache is not None and self._by_pseudonym is not None:
            with self._lock:
                cached = self._cache.get(who)
                key = cached[1] if cached is not None else self._by_pseudonym.get(who)
            if key is not None:
                return key
        return self.keys.subject_key(who)

    def _read_then_write(self, lookup: dict[str, bytes], fresh: list[tuple[bytes, int]]) -> dict[str, str]:
        """Read the looked-up users' rows, write the hours, then create the missing users; return user -> pseudonym."""
        distinct = list(dict.fromkeys(lookup.values()))
        found = self._rows.read(distinct)
        absent = [key for key in distinct if key not in found]
        legacy = self._rows.legacy(absent)  # rows from before the buckets: copied into theirs below
        # hours of users known to the store may be recorded (by another producer): read, not written, if so
        known = self._hours.recorded([pair for pair in fresh if pair[0] in found])
        write = [pair for pair in fresh if pair not in known]
        # the hour rows and the new users' rows are written at once: each write waits for a commit-log sync
        hours_done = self._writer().submit(self._hours.write, write) if write and absent else None
        if hours_done is None:
            self._hours.write(write)
        try:
            made = self._rows.create({key: legacy.get(key) or new_pseudonym() for key in absent})
        except PseudonymRowsError as exc:
            raise SubjectStoreError(str(exc)) from exc
        finally:
            if hours_done is not None:
                hours_done.result()
        created = 0
        for key, (pseudonym, mine) in made.items():
            found[key] = pseudonym
            created += mine and key not in legacy
        with self._lock:
            stats = self.stats
            stats.read += len(distinct) - len(absent) + len(legacy)
            stats.created += created
            stats.raced += len(absent) - len(legacy) - created
            stats.hours_written += len(write)
            stats.hours_known += len(known)
        return {user: found[key] for user, key in lookup.items()}

    def _concurrent(self, requests: list[tuple[Any, Any]], profile: str) -> list[Any]:
        """Run requests (statement, parameters) concurrently; return their result sets in order.

        A timed-out request is retried (with back-off) up to :data:`ATTEMPTS` times: reads and hour rows are
        idempotent and ``INSERT ... IF NOT EXISTS`` is too in effect (a retry of an applied insert reads back its
        own value). Producers racing on the same new users contend in Paxos, and contention ends in such timeouts.

        :raises SubjectStoreError: when some request still fails.
        """
        from cassandra.concurrent import execute_concurrent  # noqa: PLC0415

        out: list[Any] = [None] * len(requests)
        todo = list(range(len(requests)))
        error: BaseException | None = None
        for attempt in range(ATTEMPTS):
            if not todo:
                return out
            if attempt:
                time.sleep(BACKOFF_S * 2**attempt * (0.5 + secrets.randbelow(1000) / 1000))
            results = execute_concurrent(
                self._sess(),
                [requests[i] for i in todo],
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
            if failed:
                logger.warning(
                    "subject store: %d of %d request(s) failed (%s), attempt %d of %d",
                    len(failed), len(todo), type(error).__name__, attempt + 1, ATTEMPTS,
                )  # fmt: skip
            todo = failed
        if not todo:
            return out
        msg = f"the subject store did not answer ({type(error).__name__}): {error}"
        raise SubjectStoreError(msg) from error

    def pseudonyms(self, users: Iterable[str]) -> dict[str, str]:
        """Return the pseudonym of each user, creating the missing ones (:meth:`resolve` without hours)."""
        return self.resolve(users)

    def lookup(self, user: str) -> str | None:
        """Return the user's pseudonym as the store holds it now (never created, never from the cache)."""
        return self._rows.lookup(self.keys.subject_key(user))

    # -- hours ------------------------------------------------------------------------------------------------
    def note_hours(self, pairs: Iterable[tuple[str, datetime]]) -> None:
        """Record that these hours hold events of these subjects (a user or a pseudonym this store handed out).

        Returns once they are written. Each (subject, hour) is written once per process (up to
        ``privacy.hours_dedupe_size`` remembered).

        :raises SubjectStoreError: when Cassandra does not answer.
        """
        self.resolve((), ((who, (ts - _EPOCH) // _ONE_MS // _HOUR_MS * _HOUR_MS) for who, ts in pairs))

    def hours(self, user: str) -> list[datetime]:
        """Return the UTC hours that hold the user's events, oldest first (one read per month that holds any)."""
        return self._hours.hours(self.keys.subject_key(user))

    # -- erasure ----------------------------------------------------------------------------------------------
    def unlink(self, user: str) -> Unlinked:
        """Delete the user's pseudonym and hours from the store; return what they were.

        After this nothing links the pseudonym to the user; running producers drop it from their caches within
        ``privacy.pseudonym_cache_ttl_s`` and give the user's later events a new pseudonym.
        """
        key = self.keys.subject_key(user)
        pseudonym = self.lookup(user)
        hours = self.hours(user)
        self._rows.delete(key)
        self._hours.delete(key)
        with self._lock:
            if self._cache is not None:
                self._cache.pop(user, None)
            if self._by_pseudonym is not None and pseudonym is not None:
                self._by_pseudonym.pop(pseudonym, None)
            if self._noted is not None:
                for pair in [p for p in self._noted if p[0] == key]:
                    self._noted.pop(pair, None)
            if self._ready is not None:
                for ready in [p for p in self._ready if p[0] in (user, pseudonym)]:
                    self._ready.pop(ready, None)
        return Unlinked(self.keys.subject_hash(user), pseudonym, hours)

    def _writer(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._hour_writer is None:
                self._hour_writer = ThreadPoolExecutor(1, thread_name_prefix="subject-hours")
            return self._hour_writer

    def close(self) -> None:
        """Close the store's own connection (nothing is pending: every call returns once its writes are done)."""
        if self._hour_writer is not None:
            self._hour_writer.shutdown(wait=True)
            self._hour_writer = None
        if self._owns_session and self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
            self._session = None

    def __enter__(self) -> SubjectStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
