"""The events topic in Avro against the real Kafka, Cassandra, Spark and schema registry (Apicurio Registry 3.3.3).

The same events — three historical hours, users, values, dimensions, every 25th re-sent — are produced through
``EventProducer`` three times, each into a topic and keyspace of its own: as JSON, as Avro (``kafka.events_format``
``avro``, registered under ``<topic>-value``), and half as JSON then half as Avro (a topic switched mid-life). Then
the speed layer (``trends speed run --available-now``, as deployed) and the batch layer (``job.run``) read each
topic: every hour counts the same in both layers and in all three topics, nothing is unparseable, and the Avro
topic really holds framed records of the registered id.

The stack's registry is started on demand (``trends stack up registry``) like tests/services/test_bridge.py's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from batch_layer import job
from infra import migrations
from infra.cassandra import session, table
from infra.registry import register, registry_client, subject_schemas, value_subject
from infra.settings import Settings
from infra.settings_env import env_var
from ingestion.producer import EventProducer
from tests.helpers import drop_keyspace, speed_drain
from tests.pipeline import read_topic
from views.event import Event, avro_schema
from views.event_avro import EventValues, header, is_framed

pytestmark = [pytest.mark.spark, pytest.mark.sources]

H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)  # a year ago: historical events
HOUR = timedelta(hours=1)
HOURS = [H0, H0 + HOUR, H0 + 2 * HOUR]
SIZES = (240, 180, 210)
RESEND_EVERY = 25


@pytest.fixture
def pipeline_of(registry: Settings, new_topic: Callable[..., str]) -> Iterator[Callable[[str], Settings]]:
    """Return a factory of settings with a topic and keyspace of their own, in the given events format."""
    keyspaces: list[str] = []

    def make(fmt: str) -> Settings:
        keyspace = f"test_{uuid.uuid4().hex[:10]}"
        settings = registry.model_copy(
            update={
                "kafka": registry.kafka.model_copy(update={"events_topic": new_topic(3), "events_format": fmt}),
                "cassandra": registry.cassandra.model_copy(update={"keyspace": keyspace}),
                "views": registry.views.model_copy(update={"slice_dims": ["origin"]}),
            }
        )
        migrations.migrate(settings)
        keyspaces.append(keyspace)
        return settings

    yield make
    for keyspace in keyspaces:
        drop_keyspace(registry, keyspace)


def history() -> list[Event]:
    out = []
    for hour, n in zip(HOURS, SIZES, strict=True):
        out += [
            Event(
                id=f"e-{hour:%H}-{i}",
                ts=hour + timedelta(seconds=(i * 37) % 3600),
                item=f"#i{i % 7}",
                user=f"u{i % 40}" if i % 5 else None,
                value=float(i % 17) if i % 3 else None,
                dims={"origin": "JFK" if i % 3 else "LAX"} if i % 4 else {},
            )
            for i in range(n)
        ]
    return sorted(out, key=lambda e: e.ts)


def produce(settings: Settings, events: list[Event]) -> None:
    """Produce through ingestion's producer (users kept as given: no subject store needed), every 25th twice."""
    with EventProducer(settings, pseudonymise=False) as producer:
        producer.check_topics()
        for i, event in enumerate(events):
            for _ in range(2 if i % RESEND_EVERY == 0 else 1):
                producer.produce(event)
    assert producer.summary.ok and producer.summary.sent == len(events) + len(range(0, len(events), RESEND_EVERY))


def speed_counts(settings: Settings) -> dict[datetime, int]:
    with session(settings) as sess:
        out = dict.fromkeys(HOURS, 0)
        for hour in HOURS:
            rows = sess.execute(
                f"SELECT bucket_start, events FROM {table(settings, 'speed_minutes')} "
                "WHERE query = %s AND slice = '*' AND day = %s",
                (settings.speed.query_name, hour.date()),
            )
            out[hour] = sum(r.events for r in rows if hour <= r.bucket_start.replace(tzinfo=UTC) < hour + HOUR)
        return out


def layer_counts(settings: Settings, spark: Any, checkpoints: Path) -> tuple[dict[datetime, int], dict[datetime, int]]:
    """Run both layers over the topic; return the events each counted per hour (speed, batch)."""
    env = {
        env_var("kafka.events_format"): settings.kafka.events_format,
        env_var("registry.url"): settings.registry.url,
    }
    out = speed_drain(settings, checkpoints, **env)
    assert ", 0 unparseable" in out, out[-2000:]
    results = job.run(settings, H0, H0 + 3 * HOUR, force=True, spark=spark)  # force: no closer events needed
    assert [r.hour for r in results] == HOURS
    assert all(r.counts["unparseable"] == 0 for r in results), [r.line() for r in results]
    return speed_counts(settings), {r.hour: r.counts["kept"] for r in results}


def test_json_avro_and_a_switched_topic_give_both_layers_the_same_counts(
    pipeline_of: Callable[[str], Settings], spark: Any, tmp_path: Path
) -> None:
    events = history()
    as_json, as_avro, switched = pipeline_of("json"), pipeline_of("avro"), pipeline_of("avro")
    produce(as_json, events)
    produce(as_avro, events)
    half = len(events) // 2
    before_switch = switched.kafka.model_copy(update={"events_format": "json"})
    produce(switched.model_copy(update={"kafka": before_switch}), events[:half])
    produce(switched, events[half:])

    # The Avro topic holds framed records of the contract's registered id, which Python readers decode back
    client = registry_client(as_avro.registry)
    subject = value_subject(as_avro.kafka.events_topic)
    schema_id = register(client, subject, avro_schema())  # the id the contract has already (the registry keeps it)
    assert list(subject_schemas(client, subject)) == [schema_id]
    records = read_topic(as_avro, as_avro.kafka.events_topic)
    assert records and all(r.value()[:5] == header(schema_id) for r in records)
    values = EventValues(as_avro.registry)
    by_id = {e.id: e for e in events}
    for record in records:
        fields, wire = values.decode(record.value())
        assert Event.model_validate_json(wire) == by_id[fields["id"]]
    mixed = read_topic(switched, switched.kafka.events_topic)
    as_text = half + len(range(0, half, RESEND_EVERY))  # the first half, written as JSON (re-sent ones twice)
    assert sum(not is_framed(r.value()) for r in mixed) == as_text and len(mixed) > as_text

    expected = {hour: n for hour, n in zip(HOURS, SIZES, strict=True)}
    for settings in (as_json, as_avro, switched):
        speed, batch = layer_counts(settings, spark, tmp_path / settings.cassandra.keyspace)
        assert speed == batch == expected, settings.kafka.events_format
