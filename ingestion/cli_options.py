"""What the ``trends ingest`` commands share: the topic and mapping options, the settings they override, their summary.

One definition each, so ``generate``, ``file``, ``kafka`` and ``collect`` spell an option, its help and the setting it
overrides the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from infra.settings import Settings
from infra.settings_env import env_var


def scoped(
    settings: Settings, topic: str | None, dlq_topic: str | None, key_field: str | None, **ingest: Any
) -> Settings:
    """Return settings with the CLI's topic, key and producer overrides applied."""
    kafka = {k: v for k, v in (("events_topic", topic), ("dlq_topic", dlq_topic)) if v}
    ingest = {k: v for k, v in ingest.items() if v is not None}
    if key_field:
        ingest["key_field"] = key_field
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update=kafka),
            "ingest": settings.ingest.model_copy(update=ingest),
        }
    )


def topic_options(fn: Any) -> Any:
    """Add the options of the topics a command writes to and the field that keys their records."""
    fn = click.option("--topic", help=f"Events topic (default: {env_var('kafka.events_topic')}).")(fn)
    fn = click.option("--dlq-topic", help=f"Dead-letter topic (default: {env_var('kafka.dlq_topic')}).")(fn)
    fn = click.option(
        "--key-field",
        type=click.Choice(["item", "user", "id", "none"]),
        help=f"Field that keys the records (default: {env_var('ingest.key_field')}).",
    )(fn)
    return fn


def mapping_options(noun: str) -> Callable[[Any], Any]:
    """Return the decorator of the options that build a :class:`~ingestion.mapping.ColumnMapping`.

    :arg noun: what the source calls a field: ``column`` (files) or ``field`` (records of other topics, whose
        dimensions are a map and whose times may be Avro or Protobuf timestamps).
    """
    records = noun == "field"
    dims_kind = "a map" if records else "a JSON object"
    stamps = ", Avro/Protobuf timestamps" if records else ""

    def decorate(fn: Any) -> Any:
        fn = click.option("--assume-tz", help="IANA zone of times written without an offset (default: reject them).")(
            fn
        )
        fn = click.option(
            "--time-format",
            default="auto",
            show_default=True,
            help=f"auto (ISO with offset, epoch s/ms{stamps}), iso, epoch_s, epoch_ms, epoch_us, or a strptime "
            "pattern.",
        )(fn)
        fn = click.option(
            "--dims-column",
            default="dims",
            show_default=True,
            help=f"{noun.capitalize()} holding {dims_kind} of dimensions.",
        )(fn)
        fn = click.option(
            "--dim", "dims", multiple=True, metavar="NAME[=COLUMN]", help=f"A {noun} to use as a dimension."
        )(fn)
        return click.option(
            "-m",
            "--map",
            "pairs",
            multiple=True,
            metavar="FIELD=COLUMN",
            help=f"Source {noun} of an event field (id, ts, item, user, value); repeatable. Unmapped fields use their "
            "name; dotted paths reach into nested records.",
        )(fn)

    return decorate


def print_summary(lines: list[str], *, err: bool) -> None:
    """Print a run's summary lines, control characters escaped (they may quote records)."""
    from infra.security import escape_text

    for line in lines:
        click.echo(escape_text(line), err=err)


def with_pseudonyms(lines: list[str], producer: Any) -> list[str]:
    """Add the pseudonym counts of a run (no ids: counts only) when it pseudonymised."""
    if producer.pseudonymiser is None:
        return lines
    return [*lines, producer.pseudonymiser.stats.line()]
