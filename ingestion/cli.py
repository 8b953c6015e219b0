"""``trends ingest``: the command group; each of its commands is defined in a module of its own.

``generate`` (:mod:`ingestion.generate_cli`), ``file`` (:mod:`ingestion.file_cli`), ``kafka``
(:mod:`ingestion.bridge_cli`), ``collect`` (:mod:`ingestion.collect_cli`, also ``trends collect``) and ``dlq``
(:mod:`ingestion.dlq_cli`); the options they share live in :mod:`ingestion.cli_options`. Each command imports what
it runs (the producer, the Kafka clients, uvicorn) only when it runs, so ``--help`` stays quick.
"""

from __future__ import annotations

import click

from ingestion.bridge_cli import kafka
from ingestion.collect_cli import collect
from ingestion.dlq_cli import dlq
from ingestion.file_cli import file_
from ingestion.generate_cli import generate


@click.group()
def ingest() -> None:
    """Feed events into Kafka: a synthetic stream, files of past events, stdin; inspect dead letters.

    Every record reaches the events topic once or the dead-letter topic with a reason; a summary (sent, failed,
    invalid per reason, events/s) ends each run. Ctrl-C stops reading and flushes what is queued.
    """


for command in (generate, file_, kafka, collect, dlq):
    ingest.add_command(command)
