"""The speed checkpoint as ``trends stack status`` and the console see it, and the stack's speed service's start."""

from __future__ import annotations

from pathlib import Path

from infra.checkpoints import checkpoint_state, speed_checkpoint
from infra.settings import Settings
from infra.settings_env import to_env
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
    for name in ("0", "1", "12", ".12.crc", "tmp"):
        (offsets / name).write_text("v1")
    st = checkpoint_state(settings_at(f"file://{tmp_path}"))
    assert (st.exists, st.last_batch, st.from_watermark) == (True, 12, False)
    (tmp_path / "q1" / "trends_start.json").write_text("{}")
    st = checkpoint_state(settings_at(str(tmp_path)))
    assert st.from_watermark and st.describe() == "checkpoint at batch 12, started from the batch watermark"


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
