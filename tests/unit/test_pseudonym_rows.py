"""The pseudonym rows' group commit without Cassandra: one round at a time per process, every key asked once.

The conditional batches themselves (agreement between producers, rows from before the buckets) are tested against
the real Cassandra in tests/services/test_privacy_subjects.py.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from infra.privacy.pseudonym_rows import BUCKETS, GroupCommit, bucket_of


def test_a_key_falls_in_the_bucket_of_its_first_byte() -> None:
    assert BUCKETS == 256
    assert bucket_of(b"\x00" + b"x" * 31) == 0
    assert bucket_of(b"\xff" + b"x" * 31) == 255


def test_rounds_never_overlap_and_take_every_key_queued_meanwhile() -> None:
    running = threading.Lock()
    rounds: list[list[bytes]] = []

    def round_(candidates: dict[bytes, str]) -> dict[bytes, tuple[str, bool]]:
        assert running.acquire(blocking=False), "two rounds at once"
        try:
            rounds.append(sorted(candidates))
            time.sleep(0.02)  # the other threads queue their keys meanwhile
            return {key: (candidate, True) for key, candidate in candidates.items()}
        finally:
            running.release()

    rows = GroupCommit(round_)
    keys = [bytes([i % 256, i // 256]) for i in range(400)]

    def create(part: int) -> dict[bytes, tuple[str, bool]]:
        # overlapping asks: every key is wanted by two threads, each with its own candidate
        mine = keys[part * 50 : part * 50 + 100]
        return rows({key: f"p_{part}_{key.hex()}" for key in mine})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(create, range(7)))
    created = [key for batch in rounds for key in batch]
    assert sorted(created) == sorted(set(created)) == sorted(keys[:400]), "a key created twice or not at all"
    assert len(rounds) < 7, "queued keys were not grouped into shared rounds"
    agreed: dict[bytes, str] = {}
    for answer in answers:
        for key, (pseudonym, _mine) in answer.items():
            assert agreed.setdefault(key, pseudonym) == pseudonym, "two threads got two pseudonyms for one key"
    assert not rows._taken and not rows._queued and not rows._leading


def test_a_failed_round_fails_its_callers_and_the_next_round_runs() -> None:
    calls = [0]

    def round_(candidates: dict[bytes, str]) -> dict[bytes, tuple[str, bool]]:
        calls[0] += 1
        if calls[0] == 1:
            msg = "Cassandra did not answer"
            raise RuntimeError(msg)
        return {key: (candidate, True) for key, candidate in candidates.items()}

    rows = GroupCommit(round_)
    with pytest.raises(RuntimeError, match="did not answer"):
        rows({b"\x01a": "p_a"})
    assert rows({b"\x01a": "p_b"}) == {b"\x01a": ("p_b", True)}  # asked again, not stuck on the failure
    assert rows({}) == {}
    assert calls[0] == 2
