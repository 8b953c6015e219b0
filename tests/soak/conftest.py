"""The soak's private stack: Kafka, Cassandra, Airflow (scheduler and the repo's DAGs), the speed service and the API.

Everything runs from a data dir of its own on free ports, so the faults (a broker restart, Cassandra stopped) never
touch the shared stack, and everything is stopped at the end. It differs from the defaults only where the soak needs
it, each for a reason:

* ``batch.lateness_s`` 60 and ``grace_s`` 120: an hour of live events closes 2 minutes after its end instead of an
  hour, so the hourly DAG computes closed hours within the soak (the events are never late);
* ``batch.heal_max_hours`` 2: a fresh keyspace has nothing below the seeded hour to heal;
* ``spark.conf["spark.local.dir"]``: the speed job's RocksDB working copy in a folder the soak can measure;
* ``spark.conf["spark.driver.defaultJavaOptions"]`` ``-Xms`` = ``-Xmx`` and ``-XX:+AlwaysPreTouch``: the speed
  JVM's heap resident from its start. Otherwise its RSS climbs toward ``spark.driver.memory`` for longer than the
  10 minutes between faults (the first 60-minute run: from 450-700 MiB to 1.2-1.35 GiB in each incarnation), a
  heap being touched that the growth bound would take for a leak; pre-touched, what grows is native memory or a
  leak. The hourly batch job's driver shares the setting (its runs are short);
* ``serving.workers`` 2, as the issue asks; ``serving.cache_mb`` 2 and ``answer_cache_mb`` 1: the caches fill up
  to their settings by design, and the defaults (256 and 64 MiB a worker) take longer than an hour of dashboards
  to fill. The bound is on the workers' RSS beyond the bytes the caches count, and the objects holding those bytes
  cost more than them (the second 60-minute run: +6 %/h while the caches filled): full by about the end of the
  warm-up, they stop growing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra import migrations, topics
from infra.dag_contract import dags_folder
from infra.settings import Settings
from stack import control
from stack.airflow.config import AirflowConfig
from tests.helpers import free_port
from tests.soak.config import SoakConfig
from tests.soak.private_stack import private_settings
from tests.soak.probe import Freshness, Gauges, Poller, SteadyProducer

CACHE_MB, ANSWER_CACHE_MB = 2, 1  # per worker; a run filled 4 MiB of rows by 11 min, 2 MiB of answers by 15
DRIVER_MEMORY = "1g"  # the pipeline's default spark.driver_memory, pinned so -Xms matches it


@dataclass
class SoakStack:
    """The private stack's settings, where the speed job's Spark temp files go, and the soak's knobs."""

    settings: Settings
    spark_local_dir: Path
    config: SoakConfig

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.serving.port}"


@pytest.fixture(scope="module")
def soak_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoakStack]:
    """Start the whole private stack (servers first, then Airflow beside them, then the speed job and the API)."""
    cfg = SoakConfig.from_env()
    root = tmp_path_factory.mktemp("soak")
    local = root / "spark-local"
    local.mkdir()
    settings = private_settings(
        root,
        kafka={"partitions": 4},
        spark={
            "conf": {
                "spark.local.dir": str(local),
                "spark.driver.defaultJavaOptions": f"-Xms{DRIVER_MEMORY} -XX:+AlwaysPreTouch {cfg.java_options}",
            },
            "driver_memory": DRIVER_MEMORY,
        },
        speed={"trigger_seconds": cfg.trigger_s, "allowed_lateness_s": cfg.lateness_s, "query_name": "soak"},
        batch={"lateness_s": 60, "grace_s": 120, "heal_max_hours": 2},
        serving={"port": free_port(), "workers": 2, "cache_mb": CACHE_MB, "answer_cache_mb": ANSWER_CACHE_MB},
        metrics={"speed_port": free_port()},
        airflow={"api_port": free_port(), "dags_folder": dags_folder()},
    )
    try:
        t0 = time.monotonic()
        control.up(settings, ["kafka", "cassandra", "airflow"])
        topics.ensure_topics(settings.kafka)
        migrations.migrate(settings)
        print(f"private Kafka, Cassandra and Airflow up in {time.monotonic() - t0:.0f} s")
        yield SoakStack(settings, local, cfg)
    finally:
        control.down(settings, ["api", "speed", "airflow", "kafka", "cassandra"])


def unpause_batch_dag(settings: Settings) -> None:
    """Unpause ``trends_batch`` once it is parsed: the scheduler then runs the latest closed hour, and each next one."""
    af = AirflowConfig(settings)
    client = af.client()
    client.wait_dag(client.token(), "trends_batch", timeout_s=300)
    done = af.cli("dags", "unpause", "trends_batch")
    assert done.returncode == 0, done.stdout + done.stderr


@dataclass
class Load:
    """What drives and watches the running stack: the producer, freshness, the dashboards' poller, the gauges.

    :arg seeded: events produced over the hour before (not part of the steady phase).
    :arg wall_began: the wall-clock time the steady phase began (freshness samples are stamped in it).
    """

    producer: SteadyProducer
    fresh: Freshness
    poller: Poller
    gauges: Gauges
    seeded: int
    wall_began: float


def start_load(stack: SoakStack, rate: float) -> Load:
    """Seed the hour before, start the speed service and the API, unpause the hourly DAG, then produce and poll."""
    settings = stack.settings
    fresh = Freshness(settings)
    producer = SteadyProducer(settings, rate, fresh.add)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    producer.seed(hour - timedelta(hours=1), hour, stack.config.seed_events)
    seeded = producer.sent
    control.up(settings, ["speed", "api"])
    unpause_batch_dag(settings)
    gauges = Gauges(settings, stack.spark_local_dir)
    poller = Poller(stack.api_url)
    wall_began = time.time()
    producer.start()
    fresh.start()
    poller.start()
    return Load(producer, fresh, poller, gauges, seeded, wall_began)
