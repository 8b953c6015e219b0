"""The speed job's checkpoint guard: a lost checkpoint noticed while the query runs, its remnant never resumed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from infra.errors import EXIT_CHECKPOINT_LOST
from speed_layer.guard import LOST_SUFFIX, CheckpointGuard

pytestmark = pytest.mark.spark  # Hadoop's file system API through the JVM, as on HDFS or S3


def started(root: Path, query_id: str = "q-1") -> Path:
    """A checkpoint as Spark leaves it after a few batches."""
    for folder in ("offsets", "commits", "sources/0", "state/0/0"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(f'{{"id":"{query_id}"}}')
    (root / "offsets" / "3").write_text("v1")
    (root / "trends_start.json").write_text("{}")
    return root


def test_a_vanished_or_replaced_checkpoint_is_noticed_and_named(spark: Any, tmp_path: Path) -> None:
    root = started(tmp_path / "speed_view")
    guard = CheckpointGuard(spark, str(root), check_every_s=2.0)
    assert guard.check(now=0.0) is None  # not watching before the query started
    guard.watch("q-1")
    assert guard.check(now=10.0) is None
    shutil.rmtree(root)
    (root / "offsets").mkdir(parents=True)  # Spark goes on writing into the folder it believes is there
    assert guard.check(now=11.0) is None  # looked at most every 2 s
    assert guard.check(now=12.0) == "its metadata file is gone"
    error = guard.error()
    assert error.exit_code == EXIT_CHECKPOINT_LOST and str(root) in str(error) and "new epoch" in str(error)

    other = CheckpointGuard(spark, str(started(tmp_path / "other", "someone-else")))
    other.watch("q-1")
    assert other.check() == "its metadata names query someone-else, not this one"


def test_the_remnant_of_a_lost_checkpoint_is_moved_aside_and_a_whole_one_is_left_alone(
    spark: Any, tmp_path: Path
) -> None:
    whole = started(tmp_path / "whole")
    assert CheckpointGuard(spark, str(whole)).clear_remnant() is None
    assert (whole / "metadata").exists()
    ours = tmp_path / "ours"  # our records written, Spark not started yet: a new checkpoint, not a remnant
    ours.mkdir()
    (ours / "trends_view_definition.json").write_text("{}")
    assert CheckpointGuard(spark, str(ours)).clear_remnant() is None
    assert CheckpointGuard(spark, str(tmp_path / "none")).clear_remnant() is None

    remnant = started(tmp_path / "remnant")
    (remnant / "metadata").unlink()
    aside = CheckpointGuard(spark, f"file://{remnant}").clear_remnant()
    assert aside is not None and LOST_SUFFIX in aside
    assert not remnant.exists()
    moved = next(tmp_path.glob(f"remnant{LOST_SUFFIX}*"))
    assert (moved / "offsets" / "3").exists()
