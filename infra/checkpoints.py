"""Where the speed query's checkpoint lives, and what a process without Spark can tell of it.

The speed job resumes from its checkpoint; without one (a new deployment, a disk replaced, a volume not mounted,
a folder moved aside after a view-definition change) it starts anew — at ``speed.starting_offsets``, or at the
batch watermark with ``speed.from_watermark``. ``trends stack status`` and the operator console say which, before
it happens. Only a local folder can be looked at here; a checkpoint on HDFS or S3 is reported as unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from infra.settings import Settings

START_FILE = "trends_start.json"  # a start from the batch watermark, recorded by the speed job


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
    """

    location: str
    exists: bool | None
    last_batch: int | None = None
    from_watermark: bool = False
    next_start: str = ""

    def describe(self) -> str:
        """Return a line for ``trends stack status`` and the console."""
        if self.exists is None:
            return f"checkpoint {self.location}: not a local folder, not checked here"
        if not self.exists:
            return f"NO CHECKPOINT ({self.location}): the next start is a new epoch from {self.next_start}"
        how = ", started from the batch watermark" if self.from_watermark else ""
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
    if not batches:
        return CheckpointState(location, False, next_start=next_start(settings))
    return CheckpointState(location, True, max(batches), (folder / START_FILE).exists())


def _local(location: str) -> Path | None:
    """Return the local folder of a checkpoint location (None: another file system)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") or re.fullmatch(r"[a-zA-Z]", parsed.scheme):
        return Path(parsed.path if parsed.scheme == "file" else location)
    return None
