"""Notice a speed checkpoint that vanished under the running query, and never resume what is left of one.

Spark reads its checkpoint's logs when a query starts and keeps going from memory: a checkpoint folder deleted under
a running query (a volume unmounted, a clean-up script, an operator's ``rm -rf``) is not noticed by Spark until a
write into it fails — or never, when its file system recreates the folders it writes into, and the query goes on
logging offsets and state into a folder that has lost the history behind them. Started again on such a folder,
Spark would make it a new query (its ``metadata`` is gone) resuming from the surviving logs with the old state's
files beside it, and the speed view's coverage would no longer say from which offsets its rows were counted.

So the job watches its checkpoint (:class:`CheckpointGuard`): Spark writes the query's id into ``metadata`` when it
starts a checkpoint and never again, so a ``metadata`` that is gone, or names another query, means the checkpoint
was lost. The job then stops the query and fails loudly (:class:`CheckpointLostError`, exit status
:data:`infra.errors.EXIT_CHECKPOINT_LOST`, naming the checkpoint); the stack's supervisor restarts it. On every
start, a folder holding Spark's files without its ``metadata`` (:func:`infra.speed_checkpoint.is_remnant`) is moved
aside (``<checkpoint>.lost-<time>``, kept for a post-mortem), so the start is a new epoch — from the batch watermark
with ``speed.from_watermark``, or at ``speed.starting_offsets``.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from infra.errors import CheckpointLostError
from infra.settings_env import env_var
from infra.speed_checkpoint import SPARK_METADATA, is_remnant
from speed_layer.checkpoint_definition import CheckpointFiles

logger = logging.getLogger(__name__)

CHECK_EVERY_S = 2.0  # a look at the checkpoint's metadata (one stat, one small read) at most this often
LOST_SUFFIX = ".lost-"


class CheckpointGuard:
    """The checkpoint of one run of the speed job: remnants moved aside before the start, loss noticed during it."""

    def __init__(self, spark: Any, checkpoint: str, check_every_s: float = CHECK_EVERY_S) -> None:
        self.checkpoint = checkpoint.rstrip("/")
        self.files = CheckpointFiles(spark, self.checkpoint)
        self.root = self.files.jvm.org.apache.hadoop.fs.Path(self.checkpoint)
        self.check_every_s = check_every_s
        self.query_id: str | None = None
        self._next_check = 0.0
        self.lost: str | None = None  # why the checkpoint is considered lost (None: it is not)

    def clear_remnant(self) -> str | None:
        """Move a lost checkpoint's remnant aside before the query starts; return where to (None: nothing to move)."""
        if not self.files.fs.exists(self.root):
            return None
        names = [status.getPath().getName() for status in self.files.fs.listStatus(self.root)]
        if not is_remnant(names):
            return None
        aside = f"{self.checkpoint}{LOST_SUFFIX}{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
        if not self.files.fs.rename(self.root, self.files.jvm.org.apache.hadoop.fs.Path(aside)):
            msg = f"could not move the remnant of the lost speed checkpoint {self.checkpoint} aside to {aside}"
            raise CheckpointLostError(msg)
        logger.warning(
            "the speed checkpoint %s holds Spark's files (%s) without its metadata: what is left of a checkpoint "
            "lost under a running query. Moved aside to %s; this start is a new epoch",
            self.checkpoint, ", ".join(sorted(names)), aside,
        )  # fmt: skip
        return aside

    def watch(self, query_id: str) -> None:
        """Start watching the checkpoint of the query just started (Spark has written its ``metadata``)."""
        self.query_id = str(query_id)
        self._next_check = 0.0

    def check(self, *, now: float | None = None, force: bool = False) -> str | None:
        """Look at the checkpoint (at most every ``check_every_s`` unless ``force``); return why it is lost, or None."""
        if self.query_id is None or self.lost is not None:
            return self.lost
        now = time.monotonic() if now is None else now
        if not force and now < self._next_check:
            return None
        self._next_check = now + self.check_every_s
        try:
            found = json.loads(self.files.read(SPARK_METADATA)).get("id") if self.files.exists(SPARK_METADATA) else None
        except Exception:  # the file system did not answer (deleted between two calls, a store unreachable)
            logger.warning("could not read %s/%s", self.checkpoint, SPARK_METADATA, exc_info=True)
            return None
        if found is None:
            self.lost = f"its {SPARK_METADATA} file is gone"
        elif found != self.query_id:
            self.lost = f"its {SPARK_METADATA} names query {found}, not this one"
        if self.lost is not None:
            logger.error(
                "speed checkpoint %s lost under the running query %s (%s): stopping the query",
                self.checkpoint, self.query_id, self.lost,
            )  # fmt: skip
        return self.lost

    def error(self) -> CheckpointLostError:
        """Return the error a run whose checkpoint was lost ends with (the CLI prints it, exit status 75)."""
        msg = (
            f"the speed checkpoint {self.checkpoint} was lost under the running query {self.query_id} ({self.lost}). "
            "The query was stopped: what it wrote since is not a checkpoint it can resume. The next start moves "
            "what is left aside and begins a new epoch (from the batch watermark with "
            f"{env_var('speed.from_watermark')}="
            f"true, else at {env_var('speed.starting_offsets')}); the stack's supervisor restarts the job by itself. "
            "See docs/runbook.md, 'A lost speed checkpoint'."
        )
        return CheckpointLostError(msg)
