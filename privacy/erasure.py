"""Forget a subject: delete the link from the user to the pseudonym at once, and prove it in the erasure ledger.

Two modes (see docs/privacy.md, "Erasure"):

- ``unlink`` (crypto-shredding): :meth:`SubjectStore.unlink` deletes the subject's row and its hours; the events
  topic keeps the pseudonym's events, and nothing links them to the user any more. ``requested -> unlinked -> done``
  in one call.
- ``exclude``: as ``unlink``, and the pseudonym goes to ``erased_pseudonyms`` *before* the link is deleted (a crash
  between the two leaves it excluded, never forgotten and still counted); the request stays pending until the hours
  holding the subject are recomputed without its events (:func:`request_recompute`, the recompute's entry point).

Repeated and odd requests get a clear answer and leave the chain valid (:class:`Outcome`):

- a user the store never saw: nothing is held, yet the request is recorded (``requested -> done``, reason
  ``no_data``), so the ledger can show that it was answered and when;
- a second forget of a user forgotten before (and not seen since): ``already_forgotten``, no new entry;
- a forget while an earlier request of the subject is still pending (its recompute running): ``in_progress``,
  no new entry;
- a forget cut off between its first entry and the unlink: the next forget ``resumed`` the same request;
- a user seen again after a forget (new events, a new pseudonym): a new request.

No raw id is logged, returned or written: the subject is named by its keyed hash only.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from infra.cassandra import session as cassandra_session
from infra.dag_contract import ERASURE_DAG, HOURS_PARAM, REQUEST_PARAM
from infra.privacy.ledger import Ledger, Request
from infra.privacy.subjects import SubjectStore
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

Outcome = Literal["forgotten", "pending_recompute", "no_data", "already_forgotten", "in_progress", "resumed"]

MESSAGES: dict[str, str] = {
    "forgotten": "forgotten: the link from the user to the pseudonym is deleted; the events left are anonymous",
    "pending_recompute": "unlinked, and the pseudonym is excluded; the hours holding the subject wait for a "
    "recompute without its events (trends privacy status lists it as pending)",
    "no_data": "no data is held for this user; the request is recorded in the ledger as done",
    "already_forgotten": "this user was forgotten before and nothing is linked to it now; nothing to do",
    "in_progress": "an erasure of this user is still in progress; nothing to do until it is done",
    "resumed": "an interrupted erasure of this user was finished",
}


@dataclass
class ForgetResult:
    """The answer to a forget: what was done, the request and its state, the ledger entries written now."""

    outcome: Outcome
    subject_hash: str
    request: Request | None
    entries: list[int] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        """Return the outcome in words."""
        return MESSAGES[self.outcome]

    def to_json(self) -> dict[str, Any]:
        """Return the answer as the API and ``--json`` show it (hashes only)."""
        req = self.request
        return {
            "outcome": self.outcome,
            "message": self.message,
            "subject_hash": self.subject_hash,
            "request_id": None if req is None else req.request_id,
            "mode": None if req is None else req.mode,
            "state": None if req is None else req.state,
            "pending": bool(req and req.pending),
            "hours": 0 if req is None else len(req.hours),
            "new_entries": self.entries,
            "runs": self.runs,
        }


RecomputeTrigger = Callable[[Settings, Request], list[str]]


def request_recompute(settings: Settings, request: Request) -> list[str]:
    """Trigger the ``trends_erasure`` DAG over the request's hours; return the Airflow run id it started.

    Its params are the request id and the hours, never an id or a pseudonym. The DAG recomputes the hours without
    the subject's events (the batch layer reads the erased pseudonyms at every run), purges their older versions and
    speed rows, and records ``recomputed`` and ``done`` in the ledger. Airflow runs one at a time: a request made
    while another's recompute runs is queued behind it. No hours (the subject's events were never indexed into an
    hour): nothing to recompute, no run.

    :raises infra.errors.AirflowError: when Airflow cannot be reached or refuses; the request stays ``unlinked`` and
        a forget of the same user triggers it again.
    """
    if not request.hours:
        return []
    from infra.airflow.client import AirflowClient  # noqa: PLC0415

    conf = {REQUEST_PARAM: request.request_id, HOURS_PARAM: [h.isoformat() for h in request.hours]}
    run_id = AirflowClient(settings).trigger(None, ERASURE_DAG, conf)
    logger.info(
        "erasure request %s: %s hour(s) to recompute without the subject's events, %s run %s",
        request.request_id, len(request.hours), ERASURE_DAG, run_id,
    )  # fmt: skip
    return [run_id]


def record_recompute(
    settings: Settings,
    request_id: str,
    state: Literal["recompute_started", "recomputed", "done", "failed"],
    *,
    runs: list[str] | None = None,
    reason: str | None = None,
    session: Session | None = None,
) -> int:
    """Record a step of an exclusion request's recompute in the ledger; return the entry's number.

    :raises LedgerError: for an unknown request or a step out of order.
    """
    with _session(settings, session) as sess:
        return Ledger(settings, sess).advance(request_id, state, runs=runs or [], reason=reason).seq


def _session(settings: Settings, sess: Session | None) -> AbstractContextManager[Session]:
    """Return the caller's session as a context, or one of our own for the block."""
    return nullcontext(sess) if sess is not None else cassandra_session(settings)


def forget(
    settings: Settings,
    user: str,
    *,
    exclude: bool | None = None,
    store: SubjectStore | None = None,
    session: Session | None = None,
    trigger: RecomputeTrigger = request_recompute,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ForgetResult:
    """Forget one user: unlink it now and write the ledger entries (see the module's docstring for the answers).

    :arg exclude: also exclude the subject's events from the views (default: ``privacy.exclude_on_forget``).
    :arg store: the subject store to use (default: one on the session).
    :arg trigger: what asks for the recompute of an exclusion (default: :func:`request_recompute`).
    """
    mode = "exclude" if (settings.privacy.exclude_on_forget if exclude is None else exclude) else "unlink"
    with _session(settings, session) as sess:
        subjects = store or SubjectStore(settings, sess)
        ledger = Ledger(settings, sess)
        subject = subjects.subject_hash(user)
        earlier = ledger.of_subject(subject)
        pending = [r for r in earlier if r.pending]
        interrupted = next((r for r in pending if r.state == "requested"), None)
        pseudonym = subjects.lookup(user)
        if pseudonym is None and interrupted is None:
            if pending:
                return ForgetResult("in_progress", subject, pending[-1])
            if earlier:
                return ForgetResult("already_forgotten", subject, earlier[-1])
            first = ledger.append(uuid.uuid4().hex, subject, mode, "requested", now=now())
            last = ledger.append(first.request_id, subject, mode, "done", reason="no_data", now=now())
            logger.info("erasure request %s: no data held for the subject", first.request_id)
            return ForgetResult("no_data", subject, ledger.requests()[first.request_id], [first.seq, last.seq])

        written: list[int] = []
        if interrupted is not None:
            request_id, mode, requested_at = interrupted.request_id, interrupted.mode, interrupted.requested_at
        else:
            first = ledger.append(uuid.uuid4().hex, subject, mode, "requested", now=now())
            request_id, requested_at = first.request_id, first.at
            written.append(first.seq)
        if mode == "exclude" and pseudonym is not None:
            ledger.exclude(pseudonym, requested_at)  # before the unlink: a crash here leaves it excluded
        unlinked = subjects.unlink(user)
        written.append(ledger.append(request_id, subject, mode, "unlinked", hours=unlinked.hours, now=now()).seq)
        runs: list[str] = []
        if mode == "unlink":
            written.append(ledger.append(request_id, subject, mode, "done", now=now()).seq)
        else:
            runs = trigger(settings, ledger.requests()[request_id])
            if runs:
                entry = ledger.append(request_id, subject, mode, "recompute_started", runs=runs, now=now())
                written.append(entry.seq)
        request = ledger.requests()[request_id]
        outcome: Outcome = (
            "resumed" if interrupted is not None else "forgotten" if mode == "unlink" else "pending_recompute"
        )
        logger.info("erasure request %s: %s (%s hour(s))", request_id, request.state, len(request.hours))
        return ForgetResult(outcome, subject, request, written, runs)


@dataclass
class Status:
    """The ledger's requests (pending first, oldest first; then the others, newest first) and their counts."""

    requests: list[Request]
    pending: int
    done: int
    failed: int
    oldest_pending_age_s: float | None
    deadline_days: float

    def to_json(self) -> dict[str, Any]:
        """Return the status as the API shows it (hashes only)."""
        return {
            "pending": self.pending,
            "done": self.done,
            "failed": self.failed,
            "oldest_pending_age_s": self.oldest_pending_age_s,
            "deadline_days": self.deadline_days,
            "requests": [r.to_json() for r in self.requests],
        }


def status(
    settings: Settings, *, session: Session | None = None, limit: int = 50, now: datetime | None = None
) -> Status:
    """Return the erasure requests' status from the ledger."""
    from infra.privacy.ledger import ordered, summarize  # noqa: PLC0415

    with _session(settings, session) as sess:
        reqs = list(Ledger(settings, sess).requests().values())
    summary = summarize(reqs)
    reqs = ordered(reqs)
    return Status(
        reqs[:limit],
        summary.pending,
        summary.done,
        summary.failed,
        summary.oldest_pending_age_s(now or datetime.now(UTC)),
        settings.privacy.erasure_deadline_days,
    )
