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
        ks = store_settings.cassandra.keyspace
        rows = list(sess.execute(f"SELECT bucket, subject_key, pseudonym FROM {ks}.subject_pseudonyms"))
    assert len(rows) == len(users)
    assert all(r.bucket == r.subject_key[0] for r in rows)
    assert len({r.bucket for r in rows}) > 150  # 301 users over 256 buckets: ~177 of them expected
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


def test_a_bucket_batch_that_meets_a_row_created_elsewhere_takes_that_rows_pseudonym(store_settings: Settings) -> None:
    """A conditional batch applies whole or not at all: the rows another producer made are read, the rest created."""
    key = secrets.token_bytes(32)
    users = [f"crowd-{i}" for i in range(2000)]  # ~8 a bucket: every batch holds one of the first store's users
    with SubjectStore(store_settings, key=key) as first:
        early = first.pseudonyms(users[::7])
    with SubjectStore(store_settings, key=key) as second:
        second._rows.read_requests = lambda _keys: []  # type: ignore[method-assign,assignment]  # as if it raced
        made = second.pseudonyms(users)
        assert {u: made[u] for u in early} == early
        assert second.stats.raced == len(early)
        assert second.stats.created == len(users) - len(early)
    with SubjectStore(store_settings, key=key) as third:
        assert third.pseudonyms(users) == made


def test_rows_from_before_the_buckets_keep_their_pseudonym_and_are_erased(store_settings: Settings) -> None:
    """A deployment's subjects from before migration 0014 keep their pseudonyms, move to a bucket, and unlink."""
    key = secrets.token_bytes(32)
    with SubjectStore(store_settings, key=key) as store, session(store_settings) as sess:
        ks = store_settings.cassandra.keyspace
        old = "p_legacylegacy0001"
        sess.execute(
            f"INSERT INTO {ks}.subjects (subject_key, pseudonym, created_at) VALUES (%s, %s, toTimestamp(now()))",
            (store.subject_key("veteran"), old),
        )
        assert store.lookup("veteran") == old
        assert store.pseudonyms(["veteran", "newcomer"])["veteran"] == old
        assert store.stats.created == 1 and store.stats.read == 1
        bucket = store.subject_key("veteran")[0]
        moved = sess.execute(
            f"SELECT pseudonym FROM {ks}.subject_pseudonyms WHERE bucket = %s AND subject_key = %s",
            (bucket, store.subject_key("veteran")),
        ).one()
        assert moved is not None and moved.pseudonym == old
        assert store.unlink("veteran").pseudonym == old
        assert store.lookup("veteran") is None
        left = sess.execute(f"SELECT * FROM {ks}.subjects WHERE subject_key = %s", (store.subject_key("veteran"),))
        assert left.one() is None
