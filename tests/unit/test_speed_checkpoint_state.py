"""The speed checkpoint as ``trends stack status`` and the console see it, and the stack's speed service's start."""

from __future__ import annotations

from pathlib import Path

from infra.settings import Settings
from infra.settings_env import to_env
from infra.speed_checkpoint import checkpoint_state, is_remnant, speed_checkpoint
from stack.services.pipeline import SpeedService


def settings_at(root: str, *, from_watermark: bool = False) -> Settings:
    base = Settings()
    return base.model_copy(
        update={
            "spark": base.spark.model_copy(update={"checkpoint_root": root}),
            "speed": base.speed.model_copy(update={"query_name": "q1", "from_watermark": from_watermark}),
        }
    )


def test_a_missing_or_empty_checkpoint_is_no_checkpoint_and_says_where_the_next_start_goes(tmp_path: Path) -> None:
    s = settings_at(str(tmp_path), from_watermark=True)
    assert speed_checkpoint(s) == f"{tmp_path}/q1"
    st = checkpoint_state(s)
    assert st.exists is False
    assert "NO CHECKPOINT" in st.describe() and "batch watermark" in st.describe()
    (tmp_path / "q1" / "offsets").mkdir(parents=True)  # Spark made the folder, logged nothing yet
    (tmp_path / "q1" / "trends_view_definition.json").write_text("{}")
    assert checkpoint_state(s).exists is False
    plain = checkpoint_state(settings_at(str(tmp_path)))
    assert "starting_offsets=earliest" in plain.describe()


def test_a_checkpoint_with_logged_offsets_names_its_last_batch_and_how_it_started(tmp_path: Path) -> None:
    offsets = tmp_path / "q1" / "offsets"
    offsets.mkdir(parents=True)
    (tmp_path / "q1" / "metadata").write_text('{"id":"a"}')
    for name in ("0", "1", "12", ".12.crc", "tmp"):
        (offsets / name).write_text("v1")
    st = checkpoint_state(settings_at(f"file://{tmp_path}"))
    assert (st.exists, st.last_batch, st.from_watermark) == (True, 12, False)
    (tmp_path / "q1" / "trends_start.json").write_text("{}")
    st = checkpoint_state(settings_at(str(tmp_path)))
    assert st.from_watermark and st.describe() == "checkpoint at batch 12, started from the batch watermark"
    (tmp_path / "q1" / "trends_start.json").write_text('{"since": "2026-05-01T10:00:00+00:00"}')
    st = checkpoint_state(settings_at(str(tmp_path)))
    assert st.describe() == "checkpoint at batch 12, started from the batch watermark 2026-05-01T10:00:00+00:00"


def test_spark_files_without_spark_metadata_are_the_remnant_of_a_lost_checkpoint(tmp_path: Path) -> None:
    """A folder deleted under a running query, which went on writing offsets and state into it: never resumed."""
    assert is_remnant(["offsets", "state"]) and is_remnant(["commits", "trends_start.json"])
    assert not is_remnant(["metadata", "offsets", "state", "sources", "commits"])
    assert not is_remnant(["trends_view_definition.json", "trends_start.json"])  # our files before Spark's start
    assert not is_remnant([])
    s = settings_at(str(tmp_path), from_watermark=True)
    (tmp_path / "q1" / "offsets").mkdir(parents=True)
    (tmp_path / "q1" / "offsets" / "41").write_text("v1")
    st = checkpoint_state(s)
    assert (st.exists, st.remnant, st.last_batch) == (False, True, 41)
    assert st.describe().startswith(f"LOST CHECKPOINT ({tmp_path}/q1)") and "batch watermark" in st.describe()
    assert "LOST CHECKPOINT" in SpeedService(s.model_copy(update={"data_dir": tmp_path / "data"})).status().detail


def test_a_checkpoint_on_another_file_system_is_not_judged_here() -> None:
    st = checkpoint_state(settings_at("s3a://bucket/checkpoints"))
    assert st.exists is None and "not checked" in st.describe()


def test_stack_status_says_the_speed_service_has_no_checkpoint(tmp_path: Path) -> None:
    s = settings_at(str(tmp_path), from_watermark=True)
    s = s.model_copy(update={"data_dir": tmp_path / "data"})
    status = SpeedService(s).status()
    assert status.state == "stopped"
    assert "NO CHECKPOINT" in status.detail and "batch watermark" in status.detail


def test_the_stack_speed_service_is_told_to_start_from_the_watermark() -> None:
    # the service runs `trends speed run` with the stack's settings as TRENDS_* variables
    assert to_env(settings_at("/x", from_watermark=True))["TRENDS_SPEED__FROM_WATERMARK"] in ("true", "True")
