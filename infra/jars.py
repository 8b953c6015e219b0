"""Fetch the Java servers, the Spark Kafka connector and Spark's Avro functions with Maven into the jar cache.

Each bundle is a small pom under ``infra/maven/<bundle>/``; its runtime dependencies are copied into
``<cache_dir>/jars/<bundle>/`` — one folder per bundle because Kafka's and Cassandra's jars conflict. A bundle is
re-fetched only when its pom changes (the pom's hash is stamped into the folder), and a fetch is staged in a
temporary folder and renamed into place, so an interrupted fetch never leaves a half-filled bundle behind.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.errors import SetupError
from infra.settings import Settings

logger = logging.getLogger(__name__)

MAVEN_DIR = Path(__file__).parent / "maven"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies"
STAMP = ".pom.sha256"
FETCH_TIMEOUT_S = 900

# name-version.jar -> name; the version is the first '-'-separated part shaped like digits-dot-…
_ARTIFACT_RE = re.compile(r"^(?P<name>.+?)-(?P<version>\d+\.[\w.\-]*)\.jar$")


@dataclass(frozen=True)
class Bundle:
    """One folder of jars fetched from one pom."""

    name: str
    description: str
    skip_jars_shipped_by_pyspark: bool = False
    unpack: bool = False  # the artifacts are tar.gz archives (a Quarkus app): unpacked in place, then removed

    @property
    def pom(self) -> Path:
        """Return the pom that lists the bundle's artifacts."""
        return MAVEN_DIR / self.name / "pom.xml"

    def pom_hash(self) -> str:
        """Return the hash that decides whether the cached copy is current."""
        return hashlib.sha256(self.pom.read_bytes()).hexdigest()


KAFKA = Bundle("kafka", "Kafka 4.3.1 broker (KRaft) + kafka-tools + log4j2 binding")
CASSANDRA = Bundle("cassandra", "Cassandra 5.0.8 server")
SPARK_KAFKA = Bundle(
    "spark-kafka",
    "Spark 4.2.0 Kafka connector (spark-sql-kafka-0-10_2.13)",
    skip_jars_shipped_by_pyspark=True,
)
REGISTRY = Bundle("registry", "Apicurio Registry 3.3.3 (Quarkus app, Confluent-compatible API; Java 21+)", unpack=True)
# On the jobs' spark.jars only with kafka.events_format avro (spark_jars); the speed bench's decode uses it too.
SPARK_AVRO = Bundle(
    "spark-avro",
    "Spark 4.2.0 Avro functions (spark-avro_2.13)",
    skip_jars_shipped_by_pyspark=True,
)
BUNDLES = {b.name: b for b in (KAFKA, CASSANDRA, SPARK_KAFKA, SPARK_AVRO)}
# Fetched when first needed (`trends stack up registry`) or asked for (`trends stack fetch --with-registry`):
# 160 MB that only the Kafka bridge's Avro and Protobuf sources and the events topic in Avro use.
ON_DEMAND = {REGISTRY.name: REGISTRY}


def artifact_name(jar: str) -> str:
    """Return the artifact id of a jar file name (``kafka-clients-3.9.2.jar`` -> ``kafka-clients``)."""
    match = _ARTIFACT_RE.match(jar)
    return match.group("name") if match else jar.removesuffix(".jar")


def pyspark_jar_names() -> set[str]:
    """Return the artifact ids of the jars that pip's pyspark already puts on Spark's classpath."""
    import pyspark  # noqa: PLC0415 - heavy, and only needed for the connector bundle

    jars = Path(pyspark.__file__).parent / "jars"
    return {artifact_name(p.name) for p in jars.glob("*.jar")}


def bundle_dir(settings: Settings, bundle: Bundle) -> Path:
    """Return the folder that holds a bundle's jars."""
    return settings.jars_dir / bundle.name


def is_fetched(settings: Settings, bundle: Bundle) -> bool:
    """Tell whether the bundle's jars are in the cache and match its current pom."""
    stamp = bundle_dir(settings, bundle) / STAMP
    return stamp.is_file() and stamp.read_text().strip() == bundle.pom_hash()


def bundle_jars(settings: Settings, bundle: Bundle) -> list[Path]:
    """Return the bundle's jars, fetching them first if needed."""
    fetch(settings, bundle)
    return sorted(bundle_dir(settings, bundle).glob("*.jar"))


def fetch(settings: Settings, bundle: Bundle, *, force: bool = False) -> Path:
    """Fetch a bundle into the jar cache unless a current copy is there.

    :arg force: fetch again even if the cached copy is current.
    :returns: the bundle's folder.
    :raises SetupError: when Maven is missing or the fetch fails (with the tail of Maven's output).
    """
    target = bundle_dir(settings, bundle)
    if not force and is_fetched(settings, bundle):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = "Maven (`mvn`) is not on PATH; it is needed once to fetch the server and connector jars."
        raise SetupError(msg)
    settings.jars_dir.mkdir(parents=True, exist_ok=True)
    logger.info("fetching %s into %s", bundle.description, target)
    with tempfile.TemporaryDirectory(prefix=f".{bundle.name}-", dir=settings.jars_dir) as tmp:
        work = Path(tmp)
        shutil.copy(bundle.pom, work / "pom.xml")
        out = work / "jars"
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(work / "pom.xml"),
            DEPENDENCY_PLUGIN,
            "-DincludeScope=runtime",
            f"-DoutputDirectory={out}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)  # noqa: S603
        except subprocess.TimeoutExpired as exc:
            msg = f"Maven did not finish fetching {bundle.name} within {FETCH_TIMEOUT_S} s"
            raise SetupError(msg) from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            msg = f"Maven failed to fetch {bundle.name} ({bundle.pom}):\n{tail}"
            raise SetupError(msg)
        if bundle.unpack:
            for archive in out.glob("*.tar.gz"):
                with tarfile.open(archive) as tar:
                    tar.extractall(out, filter="data")  # refuses absolute paths and links out of the folder
                archive.unlink()
        if bundle.skip_jars_shipped_by_pyspark:
            shipped = pyspark_jar_names()
            for jar in out.glob("*.jar"):
                if artifact_name(jar.name) in shipped:
                    jar.unlink()
        (out / STAMP).write_text(bundle.pom_hash() + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    count = len(list(target.glob("*.jar")))
    logger.info("fetched %s: %d jars", bundle.name, count)
    return target


def job_bundles(settings: Settings) -> list[Bundle]:
    """Return the bundles a Spark job of the layers reads with: the Kafka connector, and spark-avro for Avro events."""
    return [SPARK_KAFKA, SPARK_AVRO] if settings.kafka.events_format == "avro" else [SPARK_KAFKA]


def spark_jars(settings: Settings) -> list[Path]:
    """Return the jars of :func:`job_bundles`, fetching them first if needed (``spark.jars``, spark-submit's --jars)."""
    return [jar for bundle in job_bundles(settings) for jar in bundle_jars(settings, bundle)]


def fetch_all(settings: Settings, *, force: bool = False, on_demand: bool = False) -> dict[str, Path]:
    """Fetch every bundle (and the on-demand ones when asked); return their folders by name."""
    wanted = {**BUNDLES, **(ON_DEMAND if on_demand else {})}
    return {name: fetch(settings, bundle, force=force) for name, bundle in wanted.items()}
