"""The view definition a speed checkpoint was started with, recorded beside it; a start with another is refused.

The checkpoint's state store holds partial aggregates (sketches per minute and slice) of the definition the query
started with. Spark checks the state's *schema* on restart, but a change of slices, of the frequent-items size or
of a sketch parameter keeps the schema: the job would resume and merge old-definition state with new-definition
rows, silently. So the first start writes the definition into the checkpoint folder (any Hadoop file system, like
the checkpoint) and every later start compares it with the settings' one, refusing a difference with the way out.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from infra.errors import ConfigurationError
from infra.settings import DedupeBy, Settings
from infra.settings_env import env_var
from views.definition import KLL_K, Definition, differences, fingerprint, to_json, view_definition

__all__ = [
    "KLL_K",
    "CheckpointFiles",
    "check_view_definition",
    "dedupe_of",
    "differences",
    "fingerprint",
    "view_definition",
]

logger = logging.getLogger(__name__)

DEFINITION_FILE = "trends_view_definition.json"
# Typed as the setting's values, so mypy refuses one that is not among them.
DEDUPE_ID_AND_TIME: DedupeBy = "id_and_time"  # dropDuplicates(id, ts): ids kept for the lateness
DEDUPE_ID: DedupeBy = "id"  # dropDuplicatesWithinWatermark(id): ids kept for twice the lateness
# Spark's names of the two operators, in the state's metadata.
SPARK_DEDUPE: dict[str, DedupeBy] = {"dedupe": DEDUPE_ID_AND_TIME, "dedupeWithinWatermark": DEDUPE_ID}


class ViewDefinitionChangedError(ConfigurationError):
    """The settings define the views differently from the speed checkpoint's state."""


def refusal(checkpoint: str, recorded: dict[str, Any], current: Definition) -> str:
    """Return the message of a refused start: what changed and the two ways out."""
    return (
        f"the view definition changed since the speed checkpoint {checkpoint} was started "
        f"({'; '.join(differences(recorded, current))}). Its state holds sketches of the old definition, which "
        f"the job would merge with new ones. Either restore the settings ({env_var('views.*')}), or start a new "
        "checkpoint: stop the speed job, move the checkpoint folder aside (or set "
        f"{env_var('speed.query_name')} to a new name), start the job again with --from-watermark (or "
        f"{env_var('speed.from_watermark')}=true: it starts at the batch watermark, no gap above it; without it, "
        f"it reads from {env_var('speed.starting_offsets')}), and "
        "recompute with `trends batch run --start ... --end ...` the hours to be served under the new definition. "
        "See docs/runbook.md, 'Upgrades'."
    )


class CheckpointFiles:
    """Small text files under a checkpoint, on whatever file system it lives (local, hdfs://, s3a://)."""

    def __init__(self, spark: Any, root: str) -> None:
        self.jvm = spark.sparkContext._jvm
        self.root = root.rstrip("/")
        path = self.jvm.org.apache.hadoop.fs.Path(self.root)
        self.fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, name: str) -> Any:
        """Return the Hadoop path of a file under the root."""
        return self.jvm.org.apache.hadoop.fs.Path(f"{self.root}/{name}")

    def exists(self, name: str) -> bool:
        """Tell whether a file or folder exists under the root."""
        return bool(self.fs.exists(self.path(name)))

    def read(self, name: str) -> str:
        """Return a file's text."""
        stream = self.fs.open(self.path(name))
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write(self, name: str, text: str) -> None:
        """Write a file's text (overwriting)."""
        out = self.fs.create(self.path(name), True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()


def check_view_definition(spark: Any, settings: Settings, checkpoint: str) -> str:
    """Record the view definition in a new checkpoint, or compare it with the one recorded; return its fingerprint.

    A checkpoint that has state but no record (started before records were kept) adopts the current definition,
    with a warning: it cannot be checked.

    :raises ViewDefinitionChangedError: when the checkpoint was started with another definition.
    """
    current = view_definition(settings)
    files = CheckpointFiles(spark, checkpoint)
    if files.exists(DEFINITION_FILE):
        recorded = json.loads(files.read(DEFINITION_FILE))
        if recorded.get("fingerprint") != fingerprint(current):
            raise ViewDefinitionChangedError(refusal(checkpoint, recorded.get("definition", {}), current))
        return fingerprint(current)
    if files.exists("offsets"):
        logger.warning(
            "the speed checkpoint %s has no record of its view definition (started by an older version); "
            "recording the current one (%s), which cannot be checked against its state",
            checkpoint, to_json(current),
        )  # fmt: skip
    files.write(
        DEFINITION_FILE, json.dumps({"fingerprint": fingerprint(current), "definition": current.as_json()}, indent=1)
    )
    logger.info("speed checkpoint %s: view definition %s recorded", checkpoint, fingerprint(current))
    return fingerprint(current)


def _state_dedupe(files: CheckpointFiles) -> DedupeBy | None:
    """Return the dedupe Spark recorded for the checkpoint's state (its operator metadata), or None if none."""
    if not files.exists("state"):
        return None
    for status in files.fs.listStatus(files.path("state")):
        name = f"state/{status.getPath().getName()}/_metadata/metadata"
        if files.exists(name):
            lines = files.read(name).strip().splitlines()  # "v1", then the operator's JSON
            operator = json.loads(lines[-1]).get("operatorInfo", {}).get("operatorName") if lines else None
            if operator in SPARK_DEDUPE:
                return SPARK_DEDUPE[operator]
    return None


def dedupe_of(spark: Any, settings: Settings, checkpoint: str) -> DedupeBy:
    """Return how the checkpoint's query dedupes: as its state was started, or ``speed.dedupe_by`` for a new one.

    Spark refuses to resume state under another dedupe operator, so an existing checkpoint keeps its own (read from
    the operator metadata Spark keeps beside the state): an upgrade resumes a checkpoint started with the dedupe by
    id with no gap, and a new query (docs/runbook.md, blue/green) gets the setting's.
    """
    files = CheckpointFiles(spark, checkpoint)
    wanted = settings.speed.dedupe_by
    found = _state_dedupe(files)
    if found is None and files.exists("state") and files.exists("offsets"):
        found = DEDUPE_ID  # state without Spark's operator metadata: written before it kept one, by the dedupe by id
    if found is not None and found != wanted:
        logger.warning(
            "the speed checkpoint %s keeps the dedupe by %s its state was started with; %s=%s "
            "applies to a new checkpoint (docs/runbook.md, 'Upgrades')",
            checkpoint, found, env_var("speed.dedupe_by"), wanted,
        )  # fmt: skip
    return found or wanted
