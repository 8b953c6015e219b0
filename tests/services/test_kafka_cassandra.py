"""The real broker and the real Cassandra: produce/consume, topic configs, CQL round trip, migrations."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from infra import migrations
from infra.cassandra import session, table
from infra.errors import MigrationError
from infra.settings import Settings
from tests.helpers import consume_all


def test_produce_consume_through_the_broker(stack_up: Settings, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=3)
    producer = Producer({**stack_up.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    sent = [f"event-{i}" for i in range(500)]
    acked: list[str] = []
    for value in sent:
        producer.produce(
            topic, key=value[-1:], value=value, on_delivery=lambda e, m: e or acked.append(m.value().decode())
        )
    assert producer.flush(30) == 0
    assert sorted(acked) == sorted(sent)
    assert sorted(consume_all(stack_up, topic, expect=len(sent))) == sorted(sent)


def test_pipeline_topics_have_configured_partitions_and_retention(stack_up: Settings) -> None:
    admin = AdminClient(stack_up.kafka.client_config())
    meta = admin.list_topics(timeout=10).topics
    for name in (stack_up.kafka.events_topic, stack_up.kafka.dlq_topic):
        assert len(meta[name].partitions) == stack_up.kafka.partitions
    resource = ConfigResource(ResourceType.TOPIC, stack_up.kafka.events_topic)
    configs = next(iter(admin.describe_configs([resource]).values())).result(timeout=10)
    assert configs["retention.ms"].value == "-1"  # events a year old must not be deleted on arrival


def test_cql_round_trip(keyspace_settings: Settings) -> None:
    migrations.migrate(keyspace_settings)
    with session(keyspace_settings) as sess:
        name = table(keyspace_settings, "speed_progress")
        ts = datetime(2025, 11, 23, 12, 0, tzinfo=UTC)
        insert = sess.prepare(f"INSERT INTO {name} (query, newest_event_ts, last_batch_id) VALUES (?, ?, ?)")
        sess.execute(insert, ("q1", ts, 42))
        row = sess.execute(f"SELECT newest_event_ts, last_batch_id FROM {name} WHERE query = 'q1'").one()
    assert (row.newest_event_ts.replace(tzinfo=UTC), row.last_batch_id) == (ts, 42)


def test_migrations_rerun_cleanly_and_apply_only_new_files(keyspace_settings: Settings, tmp_path: Path) -> None:
    shipped = migrations.discover()
    first = migrations.migrate(keyspace_settings)
    assert [m.version for m in first] == [m.version for m in shipped]
    assert migrations.migrate(keyspace_settings) == []

    folder = tmp_path / "cql"
    shutil.copytree(migrations.CQL_DIR, folder)
    (folder / "9001_extra.cql").write_text(
        "CREATE TABLE IF NOT EXISTS extra (k int PRIMARY KEY);\n"
        "CREATE TABLE IF NOT EXISTS extra2 (k int PRIMARY KEY);\n"
    )
    assert [m.version for m in migrations.migrate(keyspace_settings, folder)] == [9001]
    assert migrations.migrate(keyspace_settings, folder) == []
    with session(keyspace_settings) as sess:
        ledger = {
            r.version for r in sess.execute(f"SELECT version FROM {table(keyspace_settings, 'schema_migrations')}")
        }
        tables = {
            r.table_name
            for r in sess.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
                (keyspace_settings.cassandra.keyspace,),
            )
        }
    assert ledger == {*(m.version for m in shipped), 9001}
    assert {"extra", "extra2", "speed_minutes", "schema_migrations"} <= tables
    assert not {"speed_view", "roundtrip_events"} & tables  # retired: a fresh keyspace holds none of them

    (folder / "9001_extra.cql").write_text("CREATE TABLE IF NOT EXISTS extra (k int PRIMARY KEY, v text);")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrations.migrate(keyspace_settings, folder)


def test_keyspace_uses_configured_replication(keyspace_settings: Settings) -> None:
    migrations.migrate(keyspace_settings)
    with session(keyspace_settings) as sess:
        row = sess.execute(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
            (keyspace_settings.cassandra.keyspace,),
        ).one()
    assert row.replication["class"].endswith("SimpleStrategy")
    assert row.replication["replication_factor"] == str(keyspace_settings.cassandra.replication_factor)
