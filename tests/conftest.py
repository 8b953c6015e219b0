"""Shared fixtures: the real local stack for service tests, and factories for throw-away topics and keyspaces.

Service tests are marked ``services``; the ``stack`` fixture starts Kafka and Cassandra through the same code as
``trends stack up`` (reusing them when they already run) and stops at the end only what it started itself.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from infra import migrations, topics
from infra.privacy.subjects import ensure_key_file
from infra.settings import Settings
from stack import control
from tests.helpers import drop_keyspace

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"

# Hypothesis fails an example that takes longer than 200 ms of wall time by default: on a busy machine a test that
# takes a millisecond is sometimes paused for longer than that, and fails as "Unreliable test timings". Our
# property tests check results, not speed: no deadline for any of them.
hypothesis_settings.register_profile("trends", deadline=None)
hypothesis_settings.load_profile("trends")


@pytest.fixture(scope="session")
def settings() -> Settings:
    """Return the settings every service test talks to (the default local stack unless TRENDS_* says otherwise).

    The subject key is named explicitly, as a deployment names its key file: a test that gives its producers a data
    dir of their own (a copy of these settings) keeps the stack's key, which ``stack_up`` creates.
    """
    base = Settings()
    privacy = base.privacy.model_copy(update={"subject_key_file": base.subject_key_path})
    return base.model_copy(update={"privacy": privacy})


@pytest.fixture(scope="session")
def stack_up(settings: Settings) -> Iterator[Settings]:
    """Start (or reuse) Kafka and Cassandra, with topics and schema; stop them afterwards if we started them."""
    results = control.up(settings)
    ensure_key_file(settings.subject_key_path)  # as `trends stack up` does
    topics.ensure_topics(settings.kafka, privacy=settings.privacy)
    migrations.migrate(settings)
    yield settings
    started_here = [r.name for r in results if not r.already_running]
    if started_here and not os.environ.get("TRENDS_TEST_KEEP_STACK"):
        control.down(settings, started_here)


@pytest.fixture(scope="module")
def registry(stack_up: Settings) -> Iterator[Settings]:
    """Start (or reuse) the stack's schema registry; stop it afterwards if it was started here."""
    results = control.up(stack_up, ["registry"])
    yield stack_up
    if not results[0].already_running and not os.environ.get("TRENDS_TEST_KEEP_STACK"):
        control.down(stack_up, ["registry"])


@pytest.fixture
def new_topic(stack_up: Settings) -> Iterator[Callable[..., str]]:
    """Return a factory of uniquely named topics, deleted after the test."""
    created: list[str] = []

    def make(partitions: int = 2, config: dict[str, str] | None = None) -> str:
        name = f"test.{uuid.uuid4().hex[:10]}"
        # Like the events topic: Kafka retention is by record timestamp, and tests use year-old events.
        spec = topics.TopicSpec(name, partitions, stack_up.kafka.replication_factor, config or {"retention.ms": "-1"})
        topics.ensure_topics(stack_up.kafka, [spec])
        created.append(name)
        return name

    yield make
    if created:
        topics.delete_topics(stack_up.kafka, created)


@pytest.fixture
def keyspace_settings(stack_up: Settings) -> Iterator[Settings]:
    """Return settings pointing at a fresh keyspace (dropped afterwards), for tests that create or migrate."""
    name = f"test_{uuid.uuid4().hex[:10]}"
    scoped = stack_up.model_copy(update={"cassandra": stack_up.cassandra.model_copy(update={"keyspace": name})})
    yield scoped
    drop_keyspace(stack_up, name)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Return the folder where tests leave files for people to look at (screenshots, reports)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests under tests/services and tests/reliability as needing the services."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        if {"services", "reliability", "cluster"} & set(parts):
            item.add_marker(pytest.mark.services)
        if "reliability" in parts:
            item.add_marker(pytest.mark.reliability)
        if "cluster" in parts:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def spark(settings: Settings) -> Iterator[object]:
    """Return one local SparkSession for the whole run (starting a JVM costs seconds), with spark-avro on its jars."""
    from infra import jars
    from infra.spark import get_spark

    avro = [str(p) for p in jars.bundle_jars(settings, jars.SPARK_AVRO)]
    spark_settings = settings.spark.model_copy(update={"extra_jars": [*settings.spark.extra_jars, *avro]})
    session = get_spark(settings.model_copy(update={"spark": spark_settings}), "tests")
    yield session
    session.stop()
