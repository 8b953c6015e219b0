"""The one SparkSession factory used by the speed layer, the batch layer, the tests and the benchmarks.

It puts the Kafka connector (fetched once into the jar cache) on ``spark.jars`` so ``format("kafka")`` works with
no network (and spark-avro when the events topic may hold Avro, ``kafka.events_format``), and takes the master,
parallelism and checkpoint root from settings — ``local[2]`` is only the default; a ``spark://`` or ``k8s://``
master gets the same jars shipped to its executors.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from infra import jars
from infra.service_settings import KafkaSettings
from infra.settings import Settings

if TYPE_CHECKING:
    from pydantic import SecretStr
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

LOG4J2_CONF = Path(__file__).parent / "conf" / "spark" / "log4j2.properties"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Names of data source options whose values are secret (redacted from plans and the UI).
REDACTED_OPTIONS = r"(?i)url|jaas|ssl\.keystore\.key|ssl\.key\.password|sasl\.password"


JVM_GC_OPTIONS = "-XX:+ExplicitGCInvokesConcurrent"  # System.gc() (spark.cleaner.periodicGC) starts a G1 cycle


def spark_conf(settings: Settings, app: str) -> dict[str, str]:
    """Return the Spark configuration of a job (separate from session creation so it can be tested and logged)."""
    cfg = settings.spark
    connector = [str(p) for p in jars.spark_jars(settings)]
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
        # Spark compiles new classes in every micro-batch of a query with a watermark (the eviction predicates,
        # and the code stages, inline its value): ~10 a batch, freed only by a GC that unloads classes. Under the
        # speed job's load G1 ran young collections only, so its metaspace, code cache and malloc arenas grew about
        # 6 MiB a minute until Spark's periodic System.gc() (default every 30 min). Every 5 minutes, run as a
        # concurrent cycle rather than a stop-the-world full GC (docs/history.md, "The speed JVM's memory").
        "spark.cleaner.periodicGC.interval": "5min",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_CONF} {JVM_GC_OPTIONS}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_CONF} {JVM_GC_OPTIONS}",
        # Kafka's TLS/SASL options hold secrets (the JAAS config, an inline PEM key, its password): redact them from
        # plans and the UI like URLs (Spark's default for data source options).
        "spark.sql.redaction.options.regex": REDACTED_OPTIONS,
    }
    if is_local_path(settings.checkpoint_root):
        conf.update(LOCAL_CHECKPOINT_CONF)
    conf.update(cfg.conf)
    return conf


# Checkpoints in a local folder (the single-machine stack): Hadoop's local file system without its native library
# runs a process for every symlink check — `readlink` twice per rename in the FileContext API Spark uses by default.
# A 1 s trigger writes a dozen checkpoint files a batch, so the speed job's JVM forked tens of processes a second,
# and walCommit and commitOffsets took ~60 ms each instead of ~5 (docs/history.md, "The soak"). The FileSystem API
# renames with rename(2), atomic on a local disk. Not for hdfs:// or s3a://.
# `fs.file.impl` must stay Hadoop's checksumming LocalFileSystem: with the raw one (which would also save a `chmod`
# per file) RocksDB's snapshot upload fails its cast in FileSystem.getLocal, Spark's maintenance only logs it, and
# the checkpoint keeps every changelog for ever (tests/services/test_speed_state_maintenance.py).
LOCAL_CHECKPOINT_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


def is_local_path(location: str) -> bool:
    """Tell whether a location is a local folder (a path, or a ``file:`` URI) rather than another file system's."""
    scheme = urlparse(location).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter parses as a scheme


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


def kafka_options(kafka: KafkaSettings) -> dict[str, str]:
    """Return the brokers' connection as options of Spark's Kafka source (``kafka.``-prefixed Java client keys).

    Reads see committed records only (``kafka.isolation.level=read_committed``).

    Certificates and keys go inline as PEM text (``ssl.truststore.certificates``, ``ssl.keystore.key``), not as
    file paths: the options travel to the executors, which may run on hosts without the files.

    :raises OSError: when a configured certificate or key file cannot be read.
    """
    opts = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "kafka.security.protocol": kafka.security_protocol,
        # Committed records only: the Kafka bridge writes the events topic in transactions, and the Java
        # consumer's default (read_uncommitted) would also read the records of aborted ones (twice, after a
        # bridge restart). Offsets then have holes (transaction markers, aborted records): ranges never assume
        # contiguous offsets.
        "kafka.isolation.level": "read_committed",
    }
    if kafka.sasl_mechanism:
        opts["kafka.sasl.mechanism"] = kafka.sasl_mechanism
    if kafka.sasl_username and kafka.sasl_password is not None:
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if kafka.sasl_mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        password = kafka.sasl_password.get_secret_value()
        opts["kafka.sasl.jaas.config"] = f'{module} required username="{kafka.sasl_username}" password="{password}";'
    if kafka.uses_tls:
        opts["kafka.ssl.endpoint.identification.algorithm"] = "https" if kafka.ssl_check_hostname else ""
        if kafka.ssl_ca_file is not None:
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.certificates"] = kafka.ssl_ca_file.read_text()
        if kafka.ssl_certificate_file is not None and kafka.ssl_key_file is not None:
            opts["kafka.ssl.keystore.type"] = "PEM"
            opts["kafka.ssl.keystore.certificate.chain"] = kafka.ssl_certificate_file.read_text()
            opts["kafka.ssl.keystore.key"] = pkcs8_pem(kafka.ssl_key_file, kafka.ssl_key_password)
            if kafka.ssl_key_password is not None:
                opts["kafka.ssl.key.password"] = kafka.ssl_key_password.get_secret_value()
    return opts


def pkcs8_pem(path: Path, password: SecretStr | None) -> str:
    """Return a PEM private key as PKCS#8 text (what Java's PEM keystores read), converting PKCS#1 or SEC1 keys.

    An encrypted key stays encrypted with the same password.

    :raises OSError: when the file cannot be read.
    :raises ValueError: when it holds no private key the password opens.
    """
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - only where a client key is used

    raw = path.read_bytes()
    if b"-----BEGIN PRIVATE KEY-----" in raw or b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in raw:
        return raw.decode()
    secret = password.get_secret_value().encode() if password is not None else None
    try:
        key = serialization.load_pem_private_key(raw, password=secret)
    except (ValueError, TypeError) as exc:
        msg = f"{path}: not a PEM private key that the configured password opens ({exc})"
        raise ValueError(msg) from exc
    encryption = serialization.BestAvailableEncryption(secret) if secret is not None else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()
