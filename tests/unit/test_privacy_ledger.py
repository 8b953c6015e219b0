"""The erasure ledger's chain, pure: sealing, verifying, folding requests, the pending summary."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from infra.privacy.ledger import GENESIS, Entry, LedgerError, fold, overdue, seal, summarize, verify_chain

T0 = datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=UTC)
H = datetime(2026, 10, 30, 7, tzinfo=UTC)


def chain() -> list[Entry]:
    """Two requests: one unlinked and done, one excluded and still waiting for its recompute."""
    out: list[Entry] = []

    def add(req: str, subject: str, mode: str, state: str, minutes: int, **kw: object) -> None:
        out.append(seal(out[-1] if out else None, req, subject, mode, state, T0 + timedelta(minutes=minutes), **kw))  # type: ignore[arg-type]

    add("r1", "a" * 64, "unlink", "requested", 0)
    add("r1", "a" * 64, "unlink", "unlinked", 1, hours=[H, H + timedelta(hours=1)])
    add("r1", "a" * 64, "unlink", "done", 1)
    add("r2", "b" * 64, "exclude", "requested", 5)
    add("r2", "b" * 64, "exclude", "unlinked", 6, hours=[H])
    return out


def test_each_entry_hashes_its_canonical_json_including_the_previous_hash() -> None:
    entries = chain()
    assert entries[0].prev_hash == GENESIS and entries[0].seq == 1
    for before, e in itertools.pairwise(entries):
        assert e.prev_hash == before.entry_hash and e.seq == before.seq + 1
        body = json.loads(e.canonical())
        assert body["prev"] == before.entry_hash
        assert hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest() == (
            e.entry_hash
        )
    # what Cassandra keeps (milliseconds) is what was hashed: a read-back entry verifies
    assert entries[0].at.microsecond == 123000


def test_an_intact_chain_verifies() -> None:
    got = verify_chain(chain())
    assert got.ok and got.entries == 5 and got.head_hash == chain()[-1].entry_hash
    assert verify_chain([]).ok


@pytest.mark.parametrize(
    ("tamper", "broken_at", "words"),
    [
        (lambda es: es.__setitem__(1, replace(es[1], hours=(H,))), 2, "changed after it was written"),
        (lambda es: es.__setitem__(0, replace(es[0], subject_hash="c" * 64)), 1, "changed after it was written"),
        (lambda es: es.__setitem__(2, replace(es[2], state="failed")), 3, "changed after it was written"),
        (lambda es: es.pop(2), 4, "entry 4 found where entry 3 belongs"),
        (lambda es: es.pop(0), 2, "entry 2 found where entry 1 belongs"),
        (lambda es: es.insert(2, es[1]), 2, "entry 2 found where entry 3 belongs"),
    ],
)
def test_a_tampered_chain_is_found_at_its_first_broken_entry(tamper: object, broken_at: int, words: str) -> None:
    entries = chain()
    tamper(entries)  # type: ignore[operator]
    got = verify_chain(entries)
    assert not got.ok and got.broken_at == broken_at and words in (got.problem or ""), got


def test_a_rehashed_edit_still_breaks_the_chain_after_it() -> None:
    entries = chain()
    forged = replace(entries[1], hours=())
    entries[1] = replace(forged, entry_hash=forged.computed_hash())  # the forger recomputes the entry's own hash
    got = verify_chain(entries)
    assert not got.ok and got.broken_at == 3 and "does not chain" in (got.problem or "")


def test_a_transition_no_erasure_makes_breaks_the_chain() -> None:
    entries = chain()
    entries.append(seal(entries[-1], "r1", "a" * 64, "unlink", "unlinked", T0 + timedelta(hours=1)))  # after done
    got = verify_chain(entries)
    assert not got.ok and got.broken_at == 6 and "from done to unlinked" in (got.problem or "")


def test_unknown_modes_and_states_are_refused() -> None:
    with pytest.raises(LedgerError, match="mode"):
        seal(None, "r", "a" * 64, "shred", "requested", T0)
    with pytest.raises(LedgerError, match="state"):
        seal(None, "r", "a" * 64, "unlink", "forgotten", T0)


def test_requests_fold_to_their_state_and_the_summary_counts_the_pending() -> None:
    reqs = fold(chain())
    assert [(r.request_id, r.state, r.pending) for r in reqs.values()] == [
        ("r1", "done", False),
        ("r2", "unlinked", True),
    ]
    assert reqs["r1"].hours == (H, H + timedelta(hours=1)) and reqs["r1"].entries == [1, 2, 3]
    assert "recompute" in (reqs["r2"].waiting_for or "")
    summary = summarize(reqs.values(), 5)
    assert (summary.pending, summary.done, summary.failed) == (1, 1, 0)
    assert summary.oldest_pending_at == reqs["r2"].requested_at
    now = reqs["r2"].requested_at + timedelta(days=31)
    assert summary.oldest_pending_age_s(now) == 31 * 86400
    assert overdue(summary, now, 30) and not overdue(summary, now, 32)
    assert not overdue(summarize(fold(chain()[:3]).values()), now, 1)  # nothing pending: never overdue


def test_the_entries_hold_hashes_not_ids() -> None:
    text = b"".join(e.canonical() for e in chain())
    assert set(json.loads(chain()[0].canonical())) == {
        "seq",
        "request",
        "subject",
        "at",
        "mode",
        "state",
        "hours",
        "runs",
        "reason",
        "prev",
    }
    assert b"user" not in text and b"pseudonym" not in text
