"""``trends demo``: bring the local stack up and show events making the whole trip Kafka -> Spark -> Cassandra.

This is the foundation's demo; later layers extend it into the full pipeline run.
"""

from __future__ import annotations

import time

import click

from infra import migrations, roundtrip, stack, topics
from infra.settings import Settings


@click.command()
@click.option("--events", default=5, show_default=True, type=click.IntRange(1, 10_000), help="Events to send.")
@click.pass_obj
def demo(settings: Settings, events: int) -> None:
    """Start the stack, create topics and schema, round-trip a few events and print them."""
    t0 = time.monotonic()
    for result in stack.up(settings):
        how = "already running" if result.already_running else f"started in {result.seconds:.1f} s"
        click.echo(f"{result.name:10} {result.address:22} {how}")
    for topic, state in topics.ensure_topics(settings.kafka).items():
        click.echo(f"topic      {topic:22} {state}")
    applied = migrations.migrate(settings)
    click.echo(f"schema     {settings.cassandra.keyspace:22} {len(applied)} migration(s) applied now")
    click.echo(f"\nround-tripping {events} events Kafka -> Spark Structured Streaming -> Cassandra …")
    rows = roundtrip.run(settings, count=events)
    click.echo(f"\n{'event id':24} {'item':8} {'event time (UTC)':26} {'partition':>9} {'offset':>6}")
    for r in rows:
        click.echo(f"{r.event_id:24} {r.item:8} {r.ts.isoformat():26} {r.kafka_partition:9d} {r.kafka_offset:6d}")
    status = "OK" if len(rows) == events else "MISMATCH"
    click.echo(f"\n{status}: {len(rows)}/{events} events read back from Cassandra ({time.monotonic() - t0:.0f} s).")
    click.echo("The stack keeps running: `trends stack status`, stop it with `trends stack down`.")
    if len(rows) != events:
        raise SystemExit(1)
