"""A speed checkpoint started with one view definition refuses a start with another, and says what to do; one
started with the dedupe by id (every checkpoint before ``speed.dedupe_by``) resumes with it under the new default.

The real speed job (``trends speed run --available-now``) over a fresh topic and keyspace: a first run records the
definition beside its checkpoint; a run with a new slice dimension on that checkpoint exits 78 (EX_CONFIG: the
supervisor does not restart it) naming the change and the way out, and writes nothing; the way out (a new query
name, so a new checkpoint) runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra import migrations
from infra.cassandra import session
from infra.errors import EXIT_CONFIG
from infra.settings import Settings
from ingestion.producer import EventProducer
from speed_layer.checkpoint_definition import DEFINITION_FILE, fingerprint, view_definition
from views.event import Event

pytestmark = [pytest.mark.spark, pytest.mark.install]  # make test-install (installs and upgrades)

T0 = datetime(2025, 8, 3, 10, tzinfo=UTC)


def _speed(
    settings: Settings, root: Path, query: str, dims: list[str], **more: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": settings.kafka.events_topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": query,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "3600",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(root),
        "TRENDS_VIEWS__SLICE_DIMS": json.dumps(dims),
        **more,
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "trends"), "speed", "run", "--available-now"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _slices(settings: Settings) -> set[str]:
    with session(settings) as sess:
        ks = settings.cassandra.keyspace
        return {r.slice for r in sess.execute(f"SELECT slice FROM {ks}.speed_minutes")}


@pytest.fixture
def fresh(keyspace_settings: Settings, new_topic: Callable[..., str]) -> Settings:
    """A fresh keyspace, migrated, and a fresh topic of 2 partitions."""
    topic = new_topic(2)
    settings = keyspace_settings.model_copy(
        update={"kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic})}
    )
    migrations.migrate(settings)
    return settings


def test_a_changed_view_definition_is_refused_on_an_old_checkpoint(fresh: Settings, tmp_path: Path) -> None:
    settings = fresh
    with EventProducer(settings) as producer:
        for i in range(200):
            ts = T0 + timedelta(seconds=7 * i)
            producer.produce(Event(id=f"c{i}", ts=ts, item=f"#i{i % 9}", dims={"country": "US" if i % 2 else "FR"}))
    assert producer.summary.ok
    root = tmp_path / "checkpoints"

    first = _speed(settings, root, "speed_ckpt", [])
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = json.loads((root / "speed_ckpt" / DEFINITION_FILE).read_text())
    assert recorded["fingerprint"] == fingerprint(view_definition(settings))
    assert _slices(settings) == {"*"}

    refused = _speed(settings, root, "speed_ckpt", ["country"])
    assert refused.returncode == EXIT_CONFIG, refused.stderr[-3000:]  # 78: a supervisor does not restart it
    assert "the view definition changed since the speed checkpoint" in refused.stderr
    assert "slice_dims: [] -> ['country']" in refused.stderr
    assert "TRENDS_SPEED__QUERY_NAME" in refused.stderr and "trends batch run" in refused.stderr
    assert "Traceback" not in refused.stderr  # a message, not a crash
    assert _slices(settings) == {"*"}  # nothing written under the new definition

    again = _speed(settings, root, "speed_ckpt", [])  # the old definition still runs on its checkpoint
    assert again.returncode == 0, again.stderr[-3000:]

    fresh = _speed(settings, root, "speed_ckpt_v2", ["country"])  # the way out: a new checkpoint
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert _slices(settings) == {"*", "country=US", "country=FR"}


def _produce(settings: Settings, ids: range, copies: int = 1) -> None:
    with EventProducer(settings) as producer:
        for i in ids:
            for _ in range(copies):
                producer.produce(Event(id=f"d{i}", ts=T0 + timedelta(seconds=7 * i), item=f"#i{i % 9}"))
    assert producer.summary.ok


def _events(settings: Settings, query: str) -> int:
    with session(settings) as sess:
        ks = settings.cassandra.keyspace
        rows = sess.execute(f"SELECT query, slice, events FROM {ks}.speed_minutes")
        return sum(r.events for r in rows if r.query == query and r.slice == "*")


def _dedupe_operator(checkpoint: Path) -> str:
    """Return the dedupe operator Spark recorded in the checkpoint's state metadata."""
    names = [
        json.loads(p.read_text().splitlines()[-1])["operatorInfo"]["operatorName"]
        for p in checkpoint.glob("state/*/_metadata/metadata")
    ]
    (name,) = [n for n in names if n.startswith("dedupe")]
    return name


def test_a_checkpoint_keeps_the_dedupe_its_state_was_started_with(fresh: Settings, tmp_path: Path) -> None:
    settings = fresh
    root = tmp_path / "checkpoints"
    _produce(settings, range(200))
    old = _speed(settings, root, "old", [], TRENDS_SPEED__DEDUPE_BY="id")  # as every version before the setting
    assert old.returncode == 0, old.stderr[-3000:]
    assert _dedupe_operator(root / "old") == "dedupeWithinWatermark"

    _produce(settings, range(150, 300), copies=2)  # re-sent events, and new ones, each twice
    resumed = _speed(settings, root, "old", [])  # the upgrade: the default is now by id and event time
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # Spark refuses state under another dedupe operator
    assert "keeps the dedupe by id its state was started with" in resumed.stderr
    assert _events(settings, "old") == 300  # each event once across the upgrade

    _produce(settings, range(300, 310))
    fresh = _speed(settings, root, "new", [])  # a new checkpoint dedupes by id and event time
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert _dedupe_operator(root / "new") == "dedupe"
    assert _events(settings, "new") == 310
