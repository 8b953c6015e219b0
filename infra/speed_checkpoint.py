"""Where the speed query's checkpoint lives, and what a process without Spark can tell of it.

The speed job resumes from its checkpoint; without one (a new deployment, a disk replaced, a volume not mounted,
a folder moved aside after a view-definition change) it starts anew — at ``speed.starting_offsets``, or at the
batch watermark with ``speed.from_watermark``. ``trends stack status`` and the operator console say which, before
it happens. Only a local folder can be looked at here; a checkpoint on HDFS or S3 is reported as unknown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from infra.settings import Settings

START_FILE = "trends_start.json"  # a start from the batch watermark, recorded by the speed job
# Spark writes the query's id into ``metadata`` when it starts a checkpoint, before any other file, and never again;
# its logs and state go into these folders.
SPARK_METADATA = "metadata"
SPARK_FOLDERS = ("offsets", "commits", "sources", "state")


def is_remnant(names: Iterable[str]) -> bool:
    """Tell whether a checkpoint folder holding these entries is what is left of a lost checkpoint (pure).

    Spark's logs or state without its ``metadata``: the folder was deleted under a running query, which went on
    writing into it (or it was restored in part). Spark would resume such a folder as a new query with the old
    logs and state, so it is never resumed (:mod:`speed_layer.guard` moves it aside).
    """
    entries = set(names)
    return SPARK_METADATA not in entries and bool(entries & set(SPARK_FOLDERS))


def speed_checkpoint(settings: Settings) -> str:
    """Return the durable checkpoint folder (offsets, commits, state) of the speed query."""
    return f"{settings.checkpoint_root}/{settings.speed.query_name}"


@dataclass(frozen=True)
class CheckpointState:
    """What the speed checkpoint holds, seen from this host.

    :arg exists: True: Spark logged offsets there; False: none (the next start is a new epoch); None: not a local
        folder, so unknown here.
    :arg last_batch: the newest micro-batch whose offsets are logged.
    :arg from_watermark: the checkpoint was started from the batch watermark.
    :arg since: the batch boundary it started from (when it did).
    :arg remnant: ``exists`` is False because the folder is what is left of a lost checkpoint (:func:`is_remnant`).
    """

    location: str
    exists: bool | None
    last_batch: int | None = None
    from_watermark: bool = False
    next_start: str = ""
    since: str | None = None
    remnant: bool = False

    def describe(self) -> str:
        """Return a line for ``trends stack status`` and the console."""
        if self.exists is None:
            return f"checkpoint {self.location}: not a local folder, not checked here"
        if self.remnant:
            return (
                f"LOST CHECKPOINT ({self.location}): Spark's files without its metadata (deleted under the running "
                f"job); the next start moves them aside and begins a new epoch from {self.next_start}"
            )
        if not self.exists:
            return f"NO CHECKPOINT ({self.location}): the next start is a new epoch from {self.next_start}"
        how = ""
        if self.from_watermark:
            how = (
                f", started from the batch watermark {self.since}"
                if self.since
                else ", started from the batch watermark"
            )
        return f"checkpoint at batch {self.last_batch}{how}"


def next_start(settings: Settings) -> str:
    """Return where a query without a checkpoint starts, in words."""
    if settings.speed.from_watermark:
        return f"the batch watermark (speed.from_watermark; {settings.speed.starting_offsets} when there is none)"
    return f"starting_offsets={settings.speed.starting_offsets}"


def checkpoint_state(settings: Settings) -> CheckpointState:
    """Look at the speed checkpoint, when it is a local folder."""
    location = speed_checkpoint(settings)
    folder = _local(location)
    if folder is None:
        return CheckpointState(location, None)
    batches = [int(p.name) for p in (folder / "offsets").glob("*") if re.fullmatch(r"\d+", p.name)]
    if folder.is_dir() and is_remnant(p.name for p in folder.iterdir()):
        return CheckpointState(
            location, False, max(batches, default=None), next_start=next_start(settings), remnant=True
        )
    if not batches:
        return CheckpointState(location, False, next_start=next_start(settings))
    start = folder / START_FILE
    return CheckpointState(location, True, max(batches), start.exists(), since=_since(start))


def _since(start: Path) -> str | None:
    """Return the boundary a start from the watermark recorded (None: none, or unreadable)."""
    try:
        return str(json.loads(start.read_text())["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _local(location: str) -> Path | None:
    """Return the local folder of a checkpoint location (None: another file system)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") or re.fullmatch(r"[a-zA-Z]", parsed.scheme):
        return Path(parsed.path if parsed.scheme == "file" else location)
    return None
