"""The stack's Cassandra with PasswordAuthenticator: the configured role gets in, the default superuser does not.

A real Cassandra node of its own (temporary data_dir, free loopback ports, small heap), started by the same code as
`trends stack up cassandra`; the shared stack is not touched. Authentication is what lets the stack bind a
non-loopback address (see tests/unit/test_security.py); here it runs on loopback, as tests must.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from cassandra import AuthenticationFailed
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable
from pydantic import SecretStr

from infra import migrations
from infra.cassandra import READ_PROFILE, WRITE_PROFILE, ping, session, table
from infra.settings import Settings
from stack import control
from tests.helpers import free_port

PASSWORD = "cas-" + uuid.uuid4().hex  # 36 characters


@pytest.fixture(scope="module")
def auth_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    base = Settings(data_dir=tmp_path_factory.mktemp("casauth") / "data")
    settings = base.model_copy(
        update={
            "cassandra": base.cassandra.model_copy(
                update={
                    "port": free_port(),
                    "username": "trends",
                    "password": SecretStr(PASSWORD),
                    "keyspace": "authed",
                    "connect_timeout_s": 5.0,
                }
            ),
            "stack": base.stack.model_copy(
                update={
                    "cassandra_storage_port": free_port(),
                    "cassandra_jmx_port": free_port(),
                    "cassandra_heap": "512M",
                    "cassandra_start_timeout_s": 300.0,
                }
            ),
        }
    )
    try:
        control.up(settings, ["cassandra"])
        yield settings
    finally:
        control.down(settings, ["cassandra"])


def _login(settings: Settings, user: str | None, password: str | None) -> None:
    auth = PlainTextAuthProvider(user, password) if user is not None else None
    cluster = Cluster(["127.0.0.1"], port=settings.cassandra.port, auth_provider=auth, connect_timeout=5)
    try:
        cluster.connect().execute("SELECT release_version FROM system.local")
    finally:
        cluster.shutdown()


def test_the_configured_role_reads_and_writes(auth_cassandra: Settings) -> None:
    migrations.migrate(auth_cassandra)
    progress = table(auth_cassandra, "speed_progress")
    minute = datetime(2026, 5, 1, 10, 17, tzinfo=UTC)
    row = ("auth-test", minute, 42, 7)
    insert = f"INSERT INTO {progress} (query, newest_event_ts, last_batch_rows, last_batch_id) VALUES (%s, %s, %s, %s)"
    with session(auth_cassandra) as sess:  # as the layers write and read: their execution profiles
        sess.execute(insert, row, execution_profile=WRITE_PROFILE)
    with session(auth_cassandra) as sess:  # a new connection reads back what the first one wrote
        got = sess.execute(
            f"SELECT newest_event_ts, last_batch_rows, last_batch_id FROM {progress} WHERE query = %s",
            row[:1],
            execution_profile=READ_PROFILE,
        ).one()
    assert got is not None
    assert (got.newest_event_ts.replace(tzinfo=UTC), got.last_batch_rows, got.last_batch_id) == (minute, 42, 7)


@pytest.mark.parametrize(
    ("user", "password"),
    [(None, None), ("cassandra", "cassandra"), ("trends", PASSWORD + "x"), ("trends", "")],
    ids=["anonymous", "default-superuser", "wrong-password", "empty-password"],
)
def test_everyone_else_is_refused(auth_cassandra: Settings, user: str | None, password: str | None) -> None:
    with pytest.raises(NoHostAvailable) as refused:
        _login(auth_cassandra, user, password)
    reasons = list(refused.value.errors.values())
    assert reasons and all(isinstance(r, AuthenticationFailed) for r in reasons), reasons  # not a connection error
    _login(auth_cassandra, "trends", PASSWORD)  # the node is up: the refusal above was authentication


def test_a_restart_keeps_the_role(auth_cassandra: Settings) -> None:
    control.down(auth_cassandra, ["cassandra"])
    assert not ping(auth_cassandra)
    (result,) = control.up(auth_cassandra, ["cassandra"])
    assert not result.already_running
    assert ping(auth_cassandra)
    with pytest.raises(NoHostAvailable):
        _login(auth_cassandra, "cassandra", "cassandra")
