"""A private Cassandra + Airflow running the real ``trends_backfill`` DAG, for the suites that drive backfills.

Shared by the backfill suite (tests/services/test_batch_backfill_cli.py) and the network suite's Airflow links
(tests/network/test_airflow_links.py). The Cassandra node has free ports and a data dir under the test's tmp folder,
the Airflow its own API port and home there, so neither touches the shared stack; Kafka is the session's (a topic of
the module's own, deleted after). A generated history is produced into the topic, and every partition is moved
past the range's end + grace so the whole range is closed.

Airflow's tasks get the stack's settings as ``TRENDS_*``; ``tasks_cassandra_port`` gives them another Cassandra
port than the node's (a proxy in front of it) while everything else — the migration, the test's own reads — talks
to the node directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from infra import migrations, topics
from infra.airflow.client import AirflowClient
from infra.cassandra import session
from infra.dag_contract import dags_folder
from infra.settings import Settings
from infra.settings_env import to_env
from stack import control
from tests.helpers import Truth, free_port, history_config, produce_events, produce_history
from views.buckets import month_key
from views.event import Event
from views.store.batch import BatchRows

TRENDS = str(Path(sys.executable).parent / "trends")
DAY = timedelta(days=1)


@dataclass
class Backfill:
    """The private Cassandra + Airflow, the topic holding the history, and what was produced."""

    settings: Settings  # what the test and the CLI use: the Cassandra node directly
    truth: Truth
    produced: int  # records in the range, re-sent duplicates included (what the index counts)
    early_token: tuple[str, float]  # a REST token from the token endpoint, and when (monotonic) it was issued
    start: datetime
    days: int

    def env(self, **extra: str) -> dict[str, str]:
        """Return the environment of a `trends` process that talks to this stack."""
        return {**os.environ, **to_env(self.settings), **extra}

    def cli(self, *args: str, timeout: float = 900, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``trends batch backfill <args>`` against this stack (``env``: extra variables) to its end."""
        return subprocess.run(
            [TRENDS, "batch", "backfill", *args], env=self.env(**env), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def day_counts(self, first: date | None = None, days: int | None = None) -> dict[date, int]:
        """Return the batch view's events per UTC day (the history's days, or ``days`` from ``first``)."""
        first = first or self.start.date()
        wanted = [first + i * DAY for i in range(days if days is not None else self.days)]
        with session(self.settings) as sess:
            rows = BatchRows(self.settings, sess)
            got = {d: r.events for m in {month_key(d) for d in wanted} for d, r in rows.month_days("*", m).items()}
        return {d: got.get(d, 0) for d in wanted}


@contextmanager
def private_backfill(
    stack_up: Settings,
    root: Path,
    *,
    start: datetime,
    days: int,
    batch: dict[str, Any],
    airflow_config: dict[str, str],
    rate: float = 0.02,
    partitions: int = 2,
    cassandra_port: int | None = None,
    tasks_cassandra_port: int | None = None,
) -> Iterator[Backfill]:
    """Start a private Cassandra + Airflow under ``root``, produce ``days`` of history from ``start``; stop both after.

    :arg batch: the ``batch`` settings (chunking, parallelism, lateness); ``airflow_config``: ``AIRFLOW__*`` extras.
    :arg cassandra_port: the node's native port (free when None); ``tasks_cassandra_port``: the port Airflow's tasks
        are given instead of it (None: the node's).
    """
    topic = f"test.backfill.{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=root / "data",
        kafka=stack_up.kafka.model_copy(update={"events_topic": topic}).model_dump(),
        cassandra={"port": cassandra_port or free_port(), "keyspace": "trends"},
        stack={"cassandra_storage_port": free_port(), "cassandra_jmx_port": free_port(), "cassandra_heap": "768M"},
        batch=batch,
        airflow={"api_port": free_port(), "dags_folder": dags_folder(), "config": airflow_config},
    )
    tasks = settings
    if tasks_cassandra_port is not None:
        tasks = settings.model_copy(
            update={"cassandra": settings.cassandra.model_copy(update={"port": tasks_cassandra_port})}
        )
    end = start + days * DAY
    spec = topics.TopicSpec(topic, partitions, stack_up.kafka.replication_factor, {"retention.ms": "-1"})
    topics.ensure_topics(stack_up.kafka, [spec])
    try:
        t0 = time.monotonic()
        if tasks is settings:
            control.up(settings, ["cassandra", "airflow"])
        else:  # Airflow (its tasks' environment) from the other settings: one after the other
            control.up(settings, ["cassandra"])
            control.up(tasks, ["airflow"])
        migrations.migrate(settings)
        print(f"private Cassandra + Airflow up in {time.monotonic() - t0:.1f} s")
        truth = Truth()
        produced = produce_history(settings, history_config(start=start, days=days, rate=rate), truth)
        produced += sum(truth.dups.values())
        # Every partition moves past the range's end + grace, so the range is closed.
        closers = [Event(id=f"closer{p}", ts=end + timedelta(hours=2), item="#c") for p in range(partitions)]
        produce_events(settings, closers, partitions=partitions)
        af = AirflowClient(settings)
        early = (af.token(), time.monotonic())
        af.wait_dag(early[0], "trends_backfill")
        yield Backfill(settings, truth, produced, early, start.astimezone(UTC), days)
    finally:
        control.down(settings, ["airflow", "cassandra"])
        topics.delete_topics(stack_up.kafka, [topic])
