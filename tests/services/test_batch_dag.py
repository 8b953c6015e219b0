"""The real `trends_batch` DAG on a real Airflow (started by the stack code): a scheduler-driven backfill over three
historical hours through the Airflow 3 CLI, then a reprocess; batch rows, lineage and watermark checked in Cassandra.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from batch_layer.publish import BatchStore
from infra import migrations
from infra.airflow.client import AirflowClient
from infra.cassandra import session, table
from infra.dag_contract import dags_folder
from infra.settings import Settings
from stack import control
from stack.airflow.config import AirflowConfig
from stack.airflow.service import Airflow
from stack.process import tail
from tests.helpers import Truth, drop_keyspace, free_port, history_config, produce_events, produce_history
from views.buckets import month_key
from views.event import Event
from views.store.batch import BatchRows

pytestmark = pytest.mark.spark

H0 = datetime(2025, 11, 20, 4, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
HISTORY = datetime(2025, 9, 1, tzinfo=UTC)  # a month of sparse history, older than the hours above
HISTORY_DAYS = 32


def api(af: AirflowClient, token: str, path: str) -> Any:
    req = urllib.request.Request(af.url + path, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
        return json.loads(resp.read())


def wait_runs(af: AirflowClient, token: str, starts: list[datetime], attempt: int, timeout_s: float = 420) -> None:
    """Wait until every run of these hours succeeded with the recompute at ``attempt`` tries or more."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        runs = api(af, token, "/api/v2/dags/trends_batch/dagRuns?limit=100")["dag_runs"]
        mine = {r["dag_run_id"]: r for r in runs if datetime.fromisoformat(r["data_interval_start"]) in starts}
        states = {k: r["state"] for k, r in mine.items()}
        failed = [k for k, s in states.items() if s == "failed"]
        assert not failed, f"runs failed: {failed}: {tail(af.config.log_files(), 30)}"
        if len(mine) == len(starts) and all(s == "success" for s in states.values()):
            tries = [
                api(
                    af,
                    token,
                    f"/api/v2/dags/trends_batch/dagRuns/{urllib.request.quote(k, safe='')}/taskInstances/recompute",
                )["try_number"]
                for k in mine
            ]
            if min(tries) >= attempt:
                return
        time.sleep(3)
    pytest.fail(f"backfill not done within {timeout_s} s: {states}")


@pytest.fixture
def dag_env(
    stack_up: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> Iterator[tuple[Settings, AirflowClient]]:
    topic = new_topic(partitions=2)
    keyspace = f"test_dag_{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=tmp_path / "data",
        kafka={"events_topic": topic},
        cassandra={"keyspace": keyspace},
        batch={"lateness_s": 300, "grace_s": 300, "chunk_hours": 16 * 24},
        views={"slice_dims": ["origin"]},
        airflow={"api_port": free_port(), "dags_folder": dags_folder()},
    )
    migrations.migrate(settings)
    try:
        control.up(settings, ["airflow"])
        yield settings, AirflowConfig(settings).client()
    finally:
        control.down(settings, ["airflow"])
        drop_keyspace(stack_up, keyspace)


@pytest.mark.backfill  # Airflow's scheduler over three hours, a reprocess and 32 days of history: make test-backfill
def test_scheduler_driven_backfill_and_reprocess(dag_env: tuple[Settings, AirflowClient]) -> None:
    settings, af = dag_env
    sizes = [120, 80, 100]
    produce_events(settings, [
        Event(id=f"d{h}-{i}", ts=H0 + h * HOUR + timedelta(seconds=i * 29), item=f"#i{i % 4}", user=f"u{i % 9}",
              dims={"origin": "JFK"})
        for h, n in enumerate(sizes) for i in range(n)
    ])  # fmt: skip
    # every partition moves past the last hour's end + grace
    produce_events(settings, [Event(id=f"closer{p}", ts=H0 + 5 * HOUR, item="#c") for p in (0, 1)], partitions=2)

    token = af.token()
    deadline = time.monotonic() + 90
    while "trends_batch" not in {d["dag_id"] for d in api(af, token, "/api/v2/dags")["dags"]}:
        assert time.monotonic() < deadline, "trends_batch was not parsed"
        time.sleep(2)
    starts = [H0 + h * HOUR for h in range(3)]
    AirflowConfig(settings).backfill("trends_batch", starts[0], starts[-1])
    wait_runs(af, token, starts, attempt=1)

    def check() -> list[Any]:
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            low, mark, _ = store.pointers.watermark()
            assert (low, mark) == (H0, H0 + 3 * HOUR)
            pointers = store.pointers.runs(H0.date())
            for h, n in enumerate(sizes):
                hour = H0 + h * HOUR
                rows = sess.execute(
                    f"SELECT run_id, events FROM {table(settings, 'batch_hours')} WHERE slice = '*' AND day = %s "
                    "AND hour = %s",
                    (hour.date(), hour),
                )
                assert [r.events for r in rows if r.run_id == pointers[hour]] == [n]
            return [
                r
                for h in range(3)
                for r in sess.execute(
                    f"SELECT hour, status, rows_kept, offsets FROM {table(settings, 'batch_runs')} WHERE hour = %s",
                    (H0 + h * HOUR,),
                )
            ]

    runs = check()
    assert sorted((r.hour.replace(tzinfo=UTC), r.status, r.rows_kept) for r in runs) == [
        (H0 + h * HOUR, "completed", n) for h, n in enumerate(sizes)
    ]
    assert all(json.loads(r.offsets) for r in runs)

    # Reprocess after a "code fix": the same hours again, replacing, never adding.
    AirflowConfig(settings).backfill("trends_batch", starts[0], starts[-1], "--reprocess-behavior", "completed")
    wait_runs(af, token, starts, attempt=2)
    runs = check()
    assert sorted(r.status for r in runs) == ["completed"] * 6

    # History replayed into the live topic, then a month of it backfilled through trends_backfill with a range:
    # chunked spark-submits mapped over the range (chunk_hours 16 days: 2 chunks, side by side).
    truth = Truth()
    produce_history(settings, history_config(start=HISTORY, days=HISTORY_DAYS, rate=0.004), truth)
    end = HISTORY + HISTORY_DAYS * DAY
    run_id = af.trigger(token, "trends_backfill", {"start": HISTORY.isoformat(), "end": end.isoformat()})
    af.wait_run(token, "trends_backfill", run_id, timeout_s=900)
    mapped = api(af, token, f"/api/v2/dags/trends_backfill/dagRuns/{run_id}/taskInstances?limit=100")
    assert sorted(t["map_index"] for t in mapped["task_instances"] if t["task_id"] == "recompute") == [0, 1]
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        days = [(HISTORY + i * DAY).date() for i in range(HISTORY_DAYS)]
        assert all(len(store.pointers.runs(d)) == 24 for d in days)  # every hour, the empty ones included
        batch_rows = BatchRows(settings, sess)
        rows = {d: r.events for m in {month_key(d) for d in days} for d, r in batch_rows.month_days("*", m).items()}
    assert {d: rows.get(d, 0) for d in days} == {d: truth.day_count(d) for d in days}
    assert sum(truth.count.values()) > 1000 and sum(1 for d in days if not truth.day_count(d)) >= 5


@pytest.mark.backfill  # seven hourly runs in process (~100 s): make test-backfill keeps make test under 25 minutes
def test_hourly_runs_compute_empty_missing_and_stale_hours(
    stack_up: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """``airflow dags test trends_batch <T>``, in-process runs of the hourly DAG: an empty hour completes and the
    watermark passes it; a run after an outage computes every closed hour left behind; late data is absorbed."""
    topic = new_topic(partitions=2)
    keyspace = f"test_dagtest_{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=tmp_path / "data",
        kafka={"events_topic": topic},
        cassandra={"keyspace": keyspace},
        batch={"lateness_s": 300, "grace_s": 300},
        airflow={"api_port": free_port(), "dags_folder": dags_folder()},
    )
    migrations.migrate(settings)
    h0 = H0 - 24 * HOUR
    sizes = {0: 90, 1: 40, 2: 0, 3: 0, 4: 25, 5: 60, 6: 10}  # hours 2 and 3: a quiet night
    events = [
        Event(id=f"t{h}-{i}", ts=h0 + h * HOUR + timedelta(seconds=i * 39), item=f"#i{i % 3}", user=f"u{i % 7}")
        for h, n in sizes.items()
        for i in range(n)
    ]
    events += [Event(id=f"closer{p}", ts=h0 + 9 * HOUR, item="#c") for p in (0, 1)]
    produce_events(settings, events, partitions=2)
    af = Airflow(settings)

    def dag_test(hour: datetime) -> None:
        proc = af.cli("dags", "test", "trends_batch", (hour + HOUR).isoformat(), timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "state=success" in proc.stdout + proc.stderr

    def hour_counts(sess: Any, store: BatchStore) -> dict[int, int]:
        out = {}
        for h in sizes:
            hour = h0 + h * HOUR
            run = store.pointers.runs(hour.date()).get(hour)
            rows = sess.execute(
                f"SELECT run_id, events FROM {table(settings, 'batch_hours')} WHERE slice = '*' AND day = %s "
                "AND hour = %s",
                (hour.date(), hour),
            )
            out[h] = -1 if run is None else sum(r.events for r in rows if r.run_id == run)
        return out

    try:
        af.init_db()
        dag_test(h0)
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            assert store.pointers.watermark()[:2] == (h0, h0 + HOUR)
            assert hour_counts(sess, store) == {0: 90, 1: -1, 2: -1, 3: -1, 4: -1, 5: -1, 6: -1}

        # The scheduler was down for hours 1..4 (catchup=False schedules only the latest): the run of hour 5
        # computes them too, the quiet night included, and the watermark passes all of them.
        dag_test(h0 + 5 * HOUR)
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            assert store.pointers.watermark()[:2] == (h0, h0 + 6 * HOUR)
            assert hour_counts(sess, store) == {**sizes, 6: -1}

        # Late events of hour 1 arrive; the next scheduled run finds the hour stale and recomputes it.
        late = [Event(id=f"late{i}", ts=h0 + HOUR + timedelta(minutes=5 * i), item="#late") for i in range(6)]
        produce_events(settings, late, partitions=2)
        dag_test(h0 + 6 * HOUR)
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            assert store.pointers.watermark()[:2] == (h0, h0 + 7 * HOUR)
            assert hour_counts(sess, store) == {**sizes, 1: 46}
    finally:
        drop_keyspace(stack_up, keyspace)
