"""The one SparkSession factory used by the speed layer, the batch layer, the tests and the benchmarks.

It puts the Kafka connector (fetched once into the jar cache) on ``spark.jars`` so ``format("kafka")`` works with
no network, and takes the master, parallelism and checkpoint root from settings — ``local[2]`` is only the default;
a ``spark://`` or ``k8s://`` master gets the same jars shipped to its executors.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from infra import jars
from infra.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

LOG4J2_CONF = Path(__file__).parent / "conf" / "spark" / "log4j2.properties"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Names of data source options whose values are secret (redacted from plans and the UI).
REDACTED_OPTIONS = r"(?i)url|jaas|ssl\.keystore\.key|ssl\.key\.password|sasl\.password"


def spark_conf(settings: Settings, app: str) -> dict[str, str]:
    """Return the Spark configuration of a job (separate from session creation so it can be tested and logged)."""
    cfg = settings.spark
    connector = [str(p) for p in jars.bundle_jars(settings, jars.SPARK_KAFKA)]
    conf = {
        "spark.master": cfg.master,
        "spark.app.name": f"{cfg.app_name}-{app}",
        "spark.jars": ",".join([*connector, *cfg.extra_jars]),
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.checkpointLocation": f"{settings.checkpoint_root}/_default",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # Commit only a changelog per micro-batch instead of uploading RocksDB snapshots (faster; docs/benchmarks.md).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Counting the state's rows costs a read before every write to it (speed.track_state_rows).
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": str(settings.speed.track_state_rows).lower(),
        # The sketch aggregations run in ObjectHashAggregate, which sorts its whole input once a task holds more
        # than this many groups (default 128). A batch hour has 60 minutes x slices groups per task (360 with 5
        # origins): 512 keeps them hashed (faster, see docs/benchmarks.md), bounded (up to ~100 KB of sketches a group).
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "512",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": cfg.driver_memory,
        "spark.ui.enabled": str(cfg.ui_enabled).lower(),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_CONF}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_CONF}",
        # Kafka's TLS/SASL options hold secrets (the JAAS config, an inline PEM key, its password): redact them from
        # plans and the UI like URLs (Spark's default for data source options).
        "spark.sql.redaction.options.regex": REDACTED_OPTIONS,
    }
    conf.update(cfg.conf)
    return conf


def get_spark(settings: Settings, app: str) -> SparkSession:
    """Create (or return the running) SparkSession for a job.

    :arg app: short job name, appended to the application name.
    """
    from pyspark.sql import SparkSession  # noqa: PLC0415 - starts a JVM; keep imports of this module cheap

    # Python workers must be this interpreter (the venv), on the driver and on executors of a local master.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.spark.local_ip:
        os.environ.setdefault("SPARK_LOCAL_IP", settings.spark.local_ip)
    conf = spark_conf(settings, app)
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Launched by spark-submit (e.g. Airflow's SparkSubmitOperator): the driver JVM already runs with the
        # submitter's master, memory and --jars; don't override them.
        for key in ("spark.master", "spark.driver.memory", "spark.driver.extraJavaOptions"):
            conf.pop(key, None)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    logger.info("spark session %s on %s", spark.sparkContext.appName, spark.sparkContext.master)
    return spark
