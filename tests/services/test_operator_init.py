"""`trends admin init` (also run by `trends stack init`) against what operators and other deployments do.

An operator's topic config (set with the admin client, as ``kafka-configs.sh`` does) survives init unless
``--apply-topic-config``, which prints the change; two migration runs at once apply each migration once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from infra import migrations, topics
from infra.cassandra import session
from infra.errors import MigrationError
from infra.settings import Settings
from infra.settings_env import to_env

TRENDS = str(Path(sys.executable).parent / "trends")
OPERATOR_RETENTION = str(14 * 24 * 3600 * 1000)


def _retention(admin: AdminClient, topic: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return str(next(iter(admin.describe_configs([resource]).values())).result(timeout=30)["retention.ms"].value)


def test_an_operators_retention_survives_init_unless_applied(keyspace_settings: Settings) -> None:
    topic = f"test.opinit.{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **to_env(keyspace_settings),
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_KAFKA__DLQ_TOPIC": f"{topic}.dlq",
        "TRENDS_KAFKA__PARTITIONS": "1",
    }

    def init(*flags: str) -> str:
        proc = subprocess.run(
            [TRENDS, "admin", "init", *flags], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    admin = AdminClient({**keyspace_settings.kafka.client_config(), "log_level": 3})
    try:
        first = init()
        assert f"{topic:22} created" in first
        assert _retention(admin, topic) == "-1"  # created with the configured settings

        op = ConfigEntry("retention.ms", OPERATOR_RETENTION, incremental_operation=AlterConfigOpType.SET)
        altered = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[op])
        next(iter(admin.incremental_alter_configs([altered]).values())).result(timeout=30)

        again = init()
        assert _retention(admin, topic) == OPERATOR_RETENTION  # the operator's value stays
        assert f"kept {topic} retention.ms={OPERATOR_RETENTION} (settings: -1" in again
        assert "changed" not in again

        applied = init("--apply-topic-config")
        assert f"changed {topic} retention.ms: {OPERATOR_RETENTION} -> -1" in applied
        assert _retention(admin, topic) == "-1"
        assert "kept" not in init()  # in line with the settings again: nothing to report
    finally:
        topics.delete_topics(keyspace_settings.kafka, [topic, f"{topic}.dlq"])


MIGRATE = """
import json
from infra import migrations
from infra.settings import Settings
from infra.settings_env import to_env
print(json.dumps([m.version for m in migrations.migrate(Settings())]))
"""


def test_two_concurrent_migration_runs_apply_each_migration_once(keyspace_settings: Settings) -> None:
    """Two processes migrate a fresh keyspace at the same moment: one applies everything, the other nothing."""
    env = {**os.environ, **to_env(keyspace_settings)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for proc, (_out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    runs = sorted((json.loads(out.strip().splitlines()[-1]) for out, _err in outs), key=len)
    shipped = [m.version for m in migrations.discover()]
    assert runs == [[], shipped]  # each migration applied by exactly one run
    ks = keyspace_settings.cassandra.keyspace
    with session(keyspace_settings) as sess:
        assert list(sess.execute(f"SELECT * FROM {ks}.{migrations.LOCK_TABLE}")) == []  # released
        ledger = sorted(r.version for r in sess.execute(f"SELECT version FROM {ks}.schema_migrations"))
        assert ledger == shipped
        ids = {
            r.id
            for r in sess.execute(
                "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
                (ks, migrations.LOCK_TABLE),
            )
        }
        assert ids == {migrations.lock_table_id(ks)}


def test_a_held_lock_makes_a_run_wait_and_an_expired_one_lets_it_go(keyspace_settings: Settings) -> None:
    ks = keyspace_settings.cassandra.keyspace
    with session(keyspace_settings) as sess:
        migrations.create_keyspace(sess, keyspace_settings)
        other = migrations.MigrationLock(sess, ks, owner="deploy-b:4242", ttl_s=6)
        assert other.try_acquire() == (True, None)
        t0 = time.monotonic()
        with pytest.raises(MigrationError, match=r"held by deploy-b:4242 .*expires"):
            migrations.migrate(keyspace_settings, lock_wait_s=0.5)
        assert time.monotonic() - t0 < 6  # gave up after its wait, before the TTL
        assert len(migrations.migrate(keyspace_settings, lock_wait_s=20)) == len(migrations.discover())
