"""The subject store against the real Cassandra: get-or-create agreement, hours, unlinking.

Marked ``privacy`` (``make test-privacy``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from infra import migrations
from infra.cassandra import session
from infra.privacy.subjects import SubjectStore
from infra.settings import Settings

pytestmark = [pytest.mark.privacy]


@pytest.fixture
def store_settings(keyspace_settings: Settings) -> Iterator[Settings]:
    migrations.migrate(keyspace_settings)
    yield keyspace_settings


def test_pseudonyms_are_created_once_and_read_back(store_settings: Settings) -> None:
    key = secrets.token_bytes(32)
    users = [f"user-{i}" for i in range(300)] + ["Ame\u0301lie"]
    with SubjectStore(store_settings, key=key) as first:
        made = first.pseudonyms(users)
        assert len(set(made.values())) == len(users)
        assert all(p.startswith("p_") and len(p) == 18 for p in made.values())
        assert first.stats.created == len(users)
        # the composed form of the same name is the same subject
        assert first.pseudonyms(["Am\u00e9lie"]) == {"Am\u00e9lie": made["Ame\u0301lie"]}
    with SubjectStore(store_settings, key=key) as second:  # another process: no cache, reads the rows
        assert second.pseudonyms(users) == made
        assert second.stats.created == 0
        assert second.lookup("user-7") == made["user-7"]
        assert second.lookup("nobody") is None
    with session(store_settings) as sess:
        rows = list(sess.execute(f"SELECT subject_key, pseudonym FROM {store_settings.cassandra.keyspace}.subjects"))
    assert len(rows) == len(users)
    stored = b"".join(r.subject_key for r in rows)
    assert not any(u.encode() in stored for u in users), "the store holds a raw id"


def test_racing_stores_agree_on_one_pseudonym(store_settings: Settings) -> None:
    key = secrets.token_bytes(32)
    users = [f"racer-{i}" for i in range(400)]
    stores = [SubjectStore(store_settings, key=key) for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda s: s.pseudonyms(users), stores))
        assert all(a == answers[0] for a in answers)
        assert sum(s.stats.created for s in stores) == len(users)
    finally:
        for s in stores:
            s.close()


def test_hours_are_noted_once_and_unlink_removes_everything(store_settings: Settings) -> None:
    key = secrets.token_bytes(32)
    t0 = datetime(2025, 3, 1, 10, 17, tzinfo=UTC)
    with SubjectStore(store_settings, key=key) as store:
        pseudonym = store.pseudonyms(["alice"])["alice"]
        store.note_hours([(pseudonym, t0), ("alice", t0 + timedelta(minutes=30)), ("alice", t0 + timedelta(hours=2))])
        store.note_hours([("bob", t0)])
        assert store.stats.hours_written == 3 and store.stats.hours_skipped == 1
        hour = t0.replace(minute=0)
        assert store.hours("alice") == [hour, hour + timedelta(hours=2)]
        gone = store.unlink("alice")
        assert gone.pseudonym == pseudonym
        assert gone.hours == [hour, hour + timedelta(hours=2)]
        assert gone.subject_key_hash == store.subject_hash("alice")
        assert pseudonym not in repr(gone)
        assert store.lookup("alice") is None
        assert store.hours("alice") == []
        assert store.hours("bob") == [hour]
        again = store.pseudonyms(["alice"])["alice"]
        assert again != pseudonym
