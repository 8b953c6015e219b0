"""The migration lock is renewed between statements only when due (each renewal is a lightweight transaction)."""

from __future__ import annotations

from typing import Any

import pytest

from infra import migrations
from infra.errors import MigrationError


class Result:
    def __init__(self, applied: bool) -> None:
        self.applied = applied

    def one(self) -> tuple[bool]:
        return (self.applied,)


class Session:
    """Counts the renewals (the only conditional UPDATE the lock sends)."""

    def __init__(self, renew_applies: bool = True) -> None:
        self.renewals = 0
        self.renew_applies = renew_applies

    def execute(self, stmt: Any, params: Any = None) -> Result:
        if stmt == "renew":
            self.renewals += 1
            return Result(self.renew_applies)
        return Result(True)

    def prepare(self, cql: str) -> str:
        return "renew" if cql.startswith("UPDATE") else cql


def test_renewed_only_once_due(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(migrations.time, "monotonic", lambda: now[0])
    sess = Session()
    lock = migrations.MigrationLock(sess, "ks", owner="me", ttl_s=600)  # type: ignore[arg-type]
    lock.acquire()
    for _ in range(50):  # statements within the first half minute: no renewal
        now[0] += 0.5
        lock.renew_if_due()
    assert sess.renewals == 0
    now[0] += 6
    lock.renew_if_due()
    assert sess.renewals == 1  # 31 s after the take
    lock.renew_if_due()
    assert sess.renewals == 1  # not again until 30 s after that renewal


def test_a_short_ttl_is_renewed_within_a_quarter_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(migrations.time, "monotonic", lambda: now[0])
    sess = Session()
    lock = migrations.MigrationLock(sess, "ks", owner="me", ttl_s=8)  # type: ignore[arg-type]
    lock.acquire()
    now[0] = 2.0
    lock.renew_if_due()
    assert sess.renewals == 1


def test_a_lost_lock_stops_the_run_when_renewed(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(migrations.time, "monotonic", lambda: now[0])
    lock = migrations.MigrationLock(Session(renew_applies=False), "ks", owner="me")  # type: ignore[arg-type]
    lock.acquire()
    now[0] = 31.0
    with pytest.raises(MigrationError, match="lost the migration lock"):
        lock.renew_if_due()
