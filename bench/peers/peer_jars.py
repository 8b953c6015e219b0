"""The peers' jars: fetched with the project's Maven fetch (``infra.jars``) from ``bench/peers/pom.xml``.

They land in the jar cache beside the stack's bundles (``<cache>/jars/flink-peers/``) but are never part of
``trends stack fetch``: nothing of the peers enters the pipeline's dependencies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from infra import jars
from infra.settings import Settings

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent


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


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    for jar in flink_jars(Settings()):
        print(jar)
