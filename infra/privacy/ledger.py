"""The erasure ledger: an append-only, hash-chained record of every erasure request and the states it reached.

Why a chain: an erasure must be provable later (to the subject, to an auditor) without keeping what was erased.
Each entry holds the keyed subject hash (:func:`infra.privacy.subjects.subject_hash`; never the raw id nor the
pseudonym), the time, the mode, the hours affected, the Airflow runs that recomputed them and the state reached;
it holds the previous entry's hash, and its own hash is SHA-256 of its canonical JSON (the previous hash included).
Editing, removing or inserting an entry breaks every hash after it, which :func:`verify_chain` finds.

Why a lightweight transaction: entries are appended with ``INSERT ... IF NOT EXISTS`` on the next sequence number,
so two writers (the CLI and the API at once) can never both write entry N: the loser re-reads the head and appends
after it. The chain cannot fork.

A request's life: ``requested -> unlinked -> done`` (mode ``unlink``), or ``requested -> unlinked ->
recompute_started -> recomputed -> done`` (mode ``exclude``: the views are recomputed without the subject's
events), or ``failed`` with a reason at any step. A request is *pending* until done or failed; the batch exporter,
the API and the console read :func:`read_summary` and :meth:`Ledger.requests` from here.

The same module keeps ``erased_pseudonyms``: the pseudonyms whose events the speed and batch layers exclude.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel

from infra.cassandra import READ_PROFILE, table
from infra.errors import TrendsError
from infra.privacy.exclusions import TABLE as ERASED_TABLE
from infra.privacy.exclusions import excluded_users
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

CHAIN: Final = "erasure"  # the one chain of erasure requests (the partition key leaves room for others)
GENESIS: Final = "0" * 64  # the previous hash of the first entry
APPEND_ATTEMPTS: Final = 40  # lost races (or contended timeouts) for the next number before giving up

Mode = Literal["unlink", "exclude"]
State = Literal["requested", "unlinked", "recompute_started", "recomputed", "done", "failed"]
MODES: Final[tuple[str, ...]] = ("unlink", "exclude")
STATES: Final[tuple[str, ...]] = ("requested", "unlinked", "recompute_started", "recomputed", "done", "failed")
FINAL: Final = frozenset({"done", "failed"})
# state -> the states an entry of the same request may reach next (a state may repeat: runs are added as they go)
NEXT: Final[dict[str, frozenset[str]]] = {
    "requested": frozenset({"requested", "unlinked", "done", "failed"}),
    "unlinked": frozenset({"unlinked", "recompute_started", "done", "failed"}),
    "recompute_started": frozenset({"recompute_started", "recomputed", "failed"}),
    "recomputed": frozenset({"recomputed", "done", "failed"}),
    "done": frozenset(),
    "failed": frozenset(),
}


class LedgerError(TrendsError):
    """The ledger refused an entry (an unknown state or transition) or could not append it."""


def _ms(t: datetime) -> datetime:
    """Return a UTC time truncated to milliseconds: what a Cassandra timestamp keeps, so hashes survive a read."""
    t = t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    return t.replace(microsecond=t.microsecond - t.microsecond % 1000)


def _iso(t: datetime) -> str:
    return _ms(t).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Entry:
    """One ledger entry: what happened to one request, chained to the entry before it."""

    seq: int
    request_id: str
    subject_hash: str
    at: datetime
    mode: str
    state: str
    hours: tuple[datetime, ...] = ()
    runs: tuple[str, ...] = ()
    reason: str | None = None
    prev_hash: str = GENESIS
    entry_hash: str = ""

    def body(self) -> dict[str, Any]:
        """Return the hashed fields as JSON values (times in UTC ISO with milliseconds)."""
        return {
            "seq": self.seq,
            "request": self.request_id,
            "subject": self.subject_hash,
            "at": _iso(self.at),
            "mode": self.mode,
            "state": self.state,
            "hours": [_iso(h) for h in self.hours],
            "runs": list(self.runs),
            "reason": self.reason,
            "prev": self.prev_hash,
        }

    def canonical(self) -> bytes:
        """Return the canonical JSON of the entry (sorted keys, no spaces, UTF-8): the bytes its hash covers."""
        return json.dumps(self.body(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def computed_hash(self) -> str:
        """Return SHA-256 (hex) of the canonical JSON."""
        return hashlib.sha256(self.canonical()).hexdigest()


def seal(
    prev: Entry | None,
    request_id: str,
    subject_hash: str,
    mode: str,
    state: str,
    at: datetime,
    hours: Iterable[datetime] = (),
    runs: Iterable[str] = (),
    reason: str | None = None,
) -> Entry:
    """Return the entry that follows ``prev`` (None: the first), its time truncated as stored and its hash set.

    :raises LedgerError: on an unknown mode or state.
    """
    if mode not in MODES:
        msg = f"unknown erasure mode {mode!r} (one of {', '.join(MODES)})"
        raise LedgerError(msg)
    if state not in STATES:
        msg = f"unknown erasure state {state!r} (one of {', '.join(STATES)})"
        raise LedgerError(msg)
    entry = Entry(
        seq=1 if prev is None else prev.seq + 1,
        request_id=request_id,
        subject_hash=subject_hash,
        at=_ms(at),
        mode=mode,
        state=state,
        hours=tuple(sorted({_ms(h) for h in hours})),
        runs=tuple(runs),
        reason=reason,
        prev_hash=GENESIS if prev is None else prev.entry_hash,
    )
    return replace(entry, entry_hash=entry.computed_hash())


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_chain` found: ok, or the first broken entry and why."""

    entries: int
    head_hash: str
    broken_at: int | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """Tell whether the whole chain holds."""
        return self.problem is None


def verify_chain(entries: Iterable[Entry]) -> Verification:
    """Check a chain read in sequence order and return the first break, if any.

    Sequence numbers run from 1 without a hole, each previous hash is the hash of the entry before, each hash is the
    hash of the entry's content, and modes, states and each request's transitions are ones an erasure makes.
    """
    prev_hash, count = GENESIS, 0
    states: dict[str, str] = {}
    for e in entries:
        problem = _problem(e, count + 1, prev_hash, states.get(e.request_id))
        if problem is not None:
            return Verification(count, prev_hash, e.seq, problem)
        states[e.request_id] = e.state
        prev_hash, count = e.entry_hash, count + 1
    return Verification(count, prev_hash)


def _problem(e: Entry, expected: int, prev_hash: str, before: str | None) -> str | None:
    """Return why an entry does not continue the chain, or None when it does."""
    if e.seq != expected:
        return f"entry {e.seq} found where entry {expected} belongs (an entry was removed or inserted)"
    if e.prev_hash != prev_hash:
        return f"entry {e.seq} does not chain to the entry before it (its previous hash differs)"
    if e.computed_hash() != e.entry_hash:
        return f"entry {e.seq} was changed after it was written (its content does not match its hash)"
    if e.mode not in MODES or e.state not in STATES:
        return f"entry {e.seq} has an unknown mode or state"
    if before is not None and e.state not in NEXT[before]:
        return f"entry {e.seq} moves its request from {before} to {e.state}, which no erasure does"
    return None


class RequestInfo(BaseModel):
    """One erasure request as the API and the console show it (hashes only): the shape of ``Request.to_json``."""

    request_id: str
    subject_hash: str
    mode: str
    state: str
    pending: bool
    waiting_for: str | None
    requested_at: str
    updated_at: str
    hours: int
    runs: list[str]
    reason: str | None
    entries: list[int]


@dataclass
class Request:
    """One erasure request as its entries leave it (folded from the ledger)."""

    request_id: str
    subject_hash: str
    mode: str
    state: str
    requested_at: datetime
    updated_at: datetime
    hours: tuple[datetime, ...] = ()
    runs: tuple[str, ...] = ()
    reason: str | None = None
    entries: list[int] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        """Tell whether the request still has something to do (not done, not failed)."""
        return self.state not in FINAL

    @property
    def waiting_for(self) -> str | None:
        """Return what a pending request waits for, in words (None when it is finished)."""
        if not self.pending:
            return None
        if self.state == "requested":
            return "the unlink (run the forget again to finish it)"
        if self.mode == "exclude" and self.state == "unlinked":
            return "a recompute of its hours without the subject's events"
        if self.state == "recompute_started":
            return "the recompute runs to finish"
        return "its last step"

    def to_json(self) -> dict[str, Any]:
        """Return the request as the API and the console show it (hashes only)."""
        return {
            "request_id": self.request_id,
            "subject_hash": self.subject_hash,
            "mode": self.mode,
            "state": self.state,
            "pending": self.pending,
            "waiting_for": self.waiting_for,
            "requested_at": _iso(self.requested_at),
            "updated_at": _iso(self.updated_at),
            "hours": len(self.hours),
            "runs": list(self.runs),
            "reason": self.reason,
            "entries": list(self.entries),
        }


def fold(entries: Iterable[Entry]) -> dict[str, Request]:
    """Return every request's current state from the entries (in sequence order), in order of first entry."""
    out: dict[str, Request] = {}
    for e in entries:
        req = out.get(e.request_id)
        if req is None:
            req = out[e.request_id] = Request(e.request_id, e.subject_hash, e.mode, e.state, e.at, e.at)
        req.state, req.updated_at = e.state, e.at
        if e.hours:
            req.hours = e.hours
        if e.runs:
            req.runs = tuple(dict.fromkeys([*req.runs, *e.runs]))
        if e.reason is not None:
            req.reason = e.reason
        req.entries.append(e.seq)
    return out


@dataclass(frozen=True)
class Summary:
    """Counts of the requests and the age of the oldest pending one (for metrics, the console, the status)."""

    pending: int
    done: int
    failed: int
    oldest_pending_at: datetime | None
    entries: int

    def oldest_pending_age_s(self, now: datetime) -> float | None:
        """Return how long the oldest pending request has waited, in seconds (None: none pending)."""
        return None if self.oldest_pending_at is None else max(0.0, (now - self.oldest_pending_at).total_seconds())


def summarize(requests: Iterable[Request], entries: int = 0) -> Summary:
    """Return the counts of pending, done and failed requests and the oldest pending request's time."""
    reqs = list(requests)
    pending = [r for r in reqs if r.pending]
    return Summary(
        pending=len(pending),
        done=sum(r.state == "done" for r in reqs),
        failed=sum(r.state == "failed" for r in reqs),
        oldest_pending_at=min((r.requested_at for r in pending), default=None),
        entries=entries,
    )


def overdue(summary: Summary, now: datetime, deadline_days: float) -> bool:
    """Tell whether the oldest pending request is older than the deadline."""
    age = summary.oldest_pending_age_s(now)
    return age is not None and age > timedelta(days=deadline_days).total_seconds()


def _row(r: Any) -> Entry:
    return Entry(
        seq=int(r.seq),
        request_id=r.request_id,
        subject_hash=r.subject_hash,
        at=_ms(r.at),
        mode=r.mode,
        state=r.state,
        hours=tuple(_parse(h) for h in json.loads(r.hours or "[]")),
        runs=tuple(json.loads(r.runs or "[]")),
        reason=r.reason,
        prev_hash=r.prev_hash,
        entry_hash=r.entry_hash,
    )


COLUMNS: Final = "seq, request_id, subject_hash, at, mode, state, hours, runs, reason, prev_hash, entry_hash"


class Ledger:
    """The ledger and ``erased_pseudonyms`` over one Cassandra session (statements prepared once)."""

    def __init__(self, settings: Settings, session: Session) -> None:
        from cassandra import ConsistencyLevel  # noqa: PLC0415

        self.settings = settings
        self.sess = session
        t, erased = table(settings, "privacy_ledger"), table(settings, ERASED_TABLE)
        p = session.prepare
        self._insert = p(
            f"INSERT INTO {t} (chain, {COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._head = p(f"SELECT {COLUMNS} FROM {t} WHERE chain = ? ORDER BY seq DESC LIMIT 1")
        self._head.consistency_level = ConsistencyLevel.SERIAL  # sees every applied (and in-flight) append
        self._at = p(f"SELECT {COLUMNS} FROM {t} WHERE chain = ? AND seq = ?")
        self._at.consistency_level = ConsistencyLevel.SERIAL
        self._all = p(f"SELECT {COLUMNS} FROM {t} WHERE chain = ?")
        self._all.fetch_size = 1000
        self._exclude = p(f"INSERT INTO {erased} (pseudonym, requested_at) VALUES (?, ?)")
        self._exclude.is_idempotent = True

    # -- reads ------------------------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Return the whole chain in sequence order."""
        return [_row(r) for r in self.sess.execute(self._all, (CHAIN,), execution_profile=READ_PROFILE)]

    def head(self) -> Entry | None:
        """Return the newest entry (a serial read: no append acknowledged before is missed)."""
        row = self.sess.execute(self._head, (CHAIN,)).one()
        return None if row is None else _row(row)

    def verify(self) -> Verification:
        """Check the whole chain (see :func:`verify_chain`)."""
        return verify_chain(self.entries())

    def requests(self) -> dict[str, Request]:
        """Return every request's current state."""
        return fold(self.entries())

    def of_subject(self, subject_hash: str) -> list[Request]:
        """Return the requests of one subject, oldest first."""
        return [r for r in self.requests().values() if r.subject_hash == subject_hash]

    def erased_pseudonyms(self) -> set[str]:
        """Return the pseudonyms whose events the layers exclude."""
        return set(excluded_users(self.settings, self.sess))  # the layers' own read of the table

    # -- writes -----------------------------------------------------------------------------------------------
    def append(
        self,
        request_id: str,
        subject_hash: str,
        mode: str,
        state: str,
        *,
        hours: Iterable[datetime] = (),
        runs: Sequence[str] = (),
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Entry:
        """Append one entry after the current head; retry after the head when another writer took its number.

        :raises LedgerError: on an unknown mode, state or transition, or after ``APPEND_ATTEMPTS`` lost races.
        """
        from cassandra import ReadTimeout, WriteTimeout  # noqa: PLC0415

        hours = list(hours)
        uncertain: Entry | None = None  # an insert that timed out: applied or not, the row at its number tells
        for attempt in range(APPEND_ATTEMPTS):
            try:
                if uncertain is not None:
                    row = self.sess.execute(self._at, (CHAIN, uncertain.seq)).one()
                    if row is not None and row.entry_hash == uncertain.entry_hash:
                        return self._appended(uncertain)
                    uncertain = None
                head = self.head()
                entry = seal(head, request_id, subject_hash, mode, state, now or datetime.now(UTC), hours, runs, reason)
                try:
                    if self.sess.execute(self._insert, self._params(entry)).one()[0]:
                        return self._appended(entry)
                except WriteTimeout:
                    uncertain = entry
                    raise
                logger.debug("ledger entry %s was taken by another writer; appending after it", entry.seq)
            except (ReadTimeout, WriteTimeout) as exc:
                # Writers contending for the chain's next number time out each other's Paxos rounds: back off.
                logger.debug("ledger append contended (%s); retrying", type(exc).__name__)
            time.sleep(random.uniform(0.005, 0.02) * 2 ** min(attempt, 6))  # noqa: S311 - jitter, not a secret
        msg = f"could not append to the erasure ledger after {APPEND_ATTEMPTS} attempts (too many writers at once)"
        raise LedgerError(msg)

    def _params(self, entry: Entry) -> tuple[Any, ...]:
        return (
            CHAIN,
            entry.seq,
            entry.request_id,
            entry.subject_hash,
            entry.at,
            entry.mode,
            entry.state,
            json.dumps([_iso(h) for h in entry.hours]),
            json.dumps(list(entry.runs)),
            entry.reason,
            entry.prev_hash,
            entry.entry_hash,
        )

    def _appended(self, entry: Entry) -> Entry:
        logger.info("ledger entry %s: request %s %s (%s)", entry.seq, entry.request_id, entry.state, entry.mode)
        return entry

    def advance(
        self,
        request_id: str,
        state: str,
        *,
        runs: Sequence[str] = (),
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Entry:
        """Append the next state of an existing request (the recompute's steps call this).

        :raises LedgerError: for an unknown request or a transition no erasure makes.
        """
        req = self.requests().get(request_id)
        if req is None:
            msg = f"no erasure request {request_id} in the ledger"
            raise LedgerError(msg)
        if state not in NEXT.get(req.state, frozenset()):
            msg = f"erasure request {request_id} is {req.state}: it cannot become {state}"
            raise LedgerError(msg)
        return self.append(request_id, req.subject_hash, req.mode, state, runs=runs, reason=reason, now=now)

    def exclude(self, pseudonym: str, requested_at: datetime) -> None:
        """Record a pseudonym whose events the layers must exclude (kept with the request's UTC day only)."""
        day = requested_at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        self.sess.execute(self._exclude, (pseudonym, day))


def read_summary(settings: Settings, session: Session) -> Summary:
    """Return the requests' summary (the batch exporter's and the API's reader): one read of the ledger."""
    ledger = Ledger(settings, session)
    entries = ledger.entries()
    return summarize(fold(entries).values(), len(entries))


def ordered(requests: Iterable[Request]) -> list[Request]:
    """Return requests as operators list them: pending ones first, oldest first, then the others, newest first."""
    return sorted(requests, key=lambda r: (not r.pending, (1 if r.pending else -1) * r.requested_at.timestamp()))


def read_requests(settings: Settings, session: Session, limit: int = 50) -> list[Request]:
    """Return the requests in :func:`ordered` order, at most ``limit``."""
    return ordered(Ledger(settings, session).requests().values())[:limit]
