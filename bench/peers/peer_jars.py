"""The peers' jars: fetched with the project's Maven fetch (``infra.jars``) from ``bench/peers/pom.xml``.

The Flink sketch UDFs (``bench/peers/udf``, Java 17) are compiled with Maven into the same cache, again only when
their sources changed (a hash of the pom and the sources is stamped beside the jar).

They land in the jar cache beside the stack's bundles (``<cache>/jars/flink-peers/``) but are never part of
``trends stack fetch``: nothing of the peers enters the pipeline's dependencies.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra import jars
from infra.settings import Settings

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
UDF_DIR = HERE / "udf"


@dataclass(frozen=True)
class PeerBundle(jars.Bundle):
    """A bundle whose pom lives in ``bench/peers/`` rather than ``infra/maven/``."""

    @property
    def pom(self) -> Path:
        """Return the bench's pom."""
        return HERE / "pom.xml"


FLINK_PEERS = PeerBundle(
    "flink-peers", "Flink's Kafka SQL connector 5.0.0-2.2 + datasketches-java 6.2.0 (the peers bench)"
)


def flink_jars(settings: Settings) -> list[Path]:
    """Return the Flink peer's jars, fetching them first if the cache has no current copy."""
    return jars.bundle_jars(settings, FLINK_PEERS)


def udf_jar(settings: Settings) -> Path:
    """Return the Flink sketch UDFs' jar, compiling it with Maven first when its sources changed."""
    sources = sorted([UDF_DIR / "pom.xml", *UDF_DIR.glob("src/**/*.java")])
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    target = settings.jars_dir / "flink-udfs"
    jar, stamp = target / "flink-sketch-udfs.jar", target / jars.STAMP
    if jar.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = "Maven (`mvn`) is not on PATH; it compiles the Flink sketch UDFs."
        raise RuntimeError(msg)
    logger.info("compiling the Flink sketch UDFs into %s", target)
    settings.jars_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".flink-udfs-", dir=settings.jars_dir) as tmp:
        work = Path(tmp) / "udf"
        shutil.copytree(UDF_DIR, work, ignore=shutil.ignore_patterns("target"))
        proc = subprocess.run(
            [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "package"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if proc.returncode != 0:
            msg = "Maven failed to build the Flink sketch UDFs:\n" + (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(msg)
        target.mkdir(exist_ok=True)
        shutil.copy(work / "target" / "flink-sketch-udfs-1.jar", jar)
        stamp.write_text(digest + "\n")
    return jar


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    settings = Settings()
    for path in [*flink_jars(settings), udf_jar(settings)]:
        print(path)
