"""``trends ingest kafka``: run the bridge (:mod:`ingestion.bridge`) from other topics into the events topic."""

from __future__ import annotations

from typing import cast

import click

from infra.settings import Settings
from infra.settings_env import env_var
from ingestion.cli_options import mapping_options, print_summary, scoped, topic_options

KAFKA_EXAMPLES = """\b
Examples:
  trends ingest kafka --from clicks --format json -m id=event_id -m ts=timestamp -m item=page -m user=uid
  trends ingest kafka --from orders.v1 --from orders.v2 --format avro -m item=sku -m user=customer.id
  trends ingest kafka --from telemetry --format protobuf --group telemetry-bridge --dim region
"""


@click.command(name="kafka", epilog=KAFKA_EXAMPLES)
@click.option(
    "--from",
    "sources",
    multiple=True,
    metavar="TOPIC",
    help=f"A topic to read (repeatable), as the consumer group --group. Default: {env_var('bridge.sources')}.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "avro", "protobuf"]),
    help=f"json: plain JSON; avro, protobuf: Confluent wire format, schemas from {env_var('registry.url')}. "
    f"Default: {env_var('bridge.format')}.",
)
@mapping_options("field")
@click.option("--group", help=f"Consumer group on the source topics (default: {env_var('bridge.group_id')}).")
@click.option(
    "--transactional-id",
    help="transactional.id of the producer (default: <group>.bridge); each bridge of one group needs its own.",
)
@click.option(
    "--idle-exit",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Stop after this many seconds without a record (catch up, then exit). Default: run until stopped.",
)
@click.option("--no-progress", is_flag=True, help="Do not print progress lines.")
@topic_options
@click.pass_obj
def kafka(
    settings: Settings,
    *,
    sources: tuple[str, ...],
    fmt: str | None,
    pairs: tuple[str, ...],
    dims: tuple[str, ...],
    dims_column: str,
    time_format: str,
    assume_tz: str | None,
    group: str | None,
    transactional_id: str | None,
    idle_exit: float | None,
    no_progress: bool,
    topic: str | None,
    dlq_topic: str | None,
    key_field: str | None,
) -> None:
    """Bridge other Kafka topics into the events topic, exactly once, until stopped (SIGTERM/Ctrl-C: clean stop).

    Each batch of source records becomes one Kafka transaction holding its events, its dead letters (with the
    source topic, partition and offset) and the group's offsets: a kill at any point neither loses nor duplicates
    an event. Readers of the events topic must read committed records only (the speed and batch layers do).
    """
    from ingestion import metrics
    from ingestion.bridge import Bridge, BridgeError
    from ingestion.mapping import ColumnMapping, MappingError
    from ingestion.progress import Progress, graceful_stop
    from ingestion.wire import Format

    settings = scoped(settings, topic, dlq_topic, key_field)
    bridge_update = {k: v for k, v in (("group_id", group), ("transactional_id", transactional_id)) if v}
    settings = settings.model_copy(update={"bridge": settings.bridge.model_copy(update=bridge_update)})
    sources = sources or tuple(settings.bridge.sources)
    if not sources:
        msg = f"name the topics to read: --from TOPIC (or {env_var('bridge.sources')})"
        raise click.UsageError(msg)
    try:
        mapping = ColumnMapping.parse(
            pairs or settings.bridge.mapping,
            dims or settings.bridge.dims,
            dims_column=dims_column or None,
            time_format=time_format,
            assume_tz=assume_tz,
        )
    except MappingError as exc:
        raise click.UsageError(str(exc)) from exc
    progress = Progress(settings.ingest.progress_interval_s, enabled=not no_progress)
    bridge = Bridge(settings, sources, cast("Format", fmt or settings.bridge.format), mapping)
    try:
        with graceful_stop() as stopper, metrics.serving(settings, lambda: bridge.stats.summary, "kafka"):
            try:
                stats = bridge.run(
                    stopper,
                    idle_exit_s=idle_exit,
                    on_batch=lambda st: progress.update(st.records, st.summary),
                )
            finally:
                progress.done()
                bridge.close()
    except BridgeError as exc:
        del exc
        print_summary(bridge.stats.lines(), err=False)
        raise
    print_summary(stats.lines(), err=False)
