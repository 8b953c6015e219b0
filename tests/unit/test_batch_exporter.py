"""The batch exporter's collector: what it exports of a state, and how a failed or slow read shows (up 0, no state)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batch_layer.exporter import METRICS, AirflowState, BatchCollector, BatchState, hours_without_run
from infra.settings import Settings
from views.buckets import HOUR
from views.store.index import Horizon
from views.store.pointers import Watermark

NOW = datetime(2026, 5, 3, 12, 20, tzinfo=UTC)
CLOSED = datetime(2026, 5, 3, 11, tzinfo=UTC)


def _state(**changes: object) -> BatchState:
    values: dict[str, object] = {
        "now": NOW,
        "watermark": Watermark(CLOSED - 48 * HOUR, CLOSED - 5 * HOUR, None),
        "horizon": Horizon(NOW - timedelta(minutes=80), 2, (3,), {0: NOW, 2: NOW - timedelta(minutes=80), 3: None}),
        "closed_until": CLOSED,
        "stale_hours": 2,
        "missing_hours": 0,
        "pending_hours": 5,
        "skipped": {0: 0, 2: 7},
    }
    values.update(changes)
    return BatchState(**values)  # type: ignore[arg-type]


def _settings(**metrics: object) -> Settings:
    base = Settings()
    return base.model_copy(update={"metrics": base.metrics.model_copy(update=metrics)})


def _scrape(collector: BatchCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }


def test_a_state_is_exported_in_base_units() -> None:
    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=_state))
    assert got[("trends_batch_up", ())] == 1
    assert got[("trends_batch_watermark_lag_seconds", ())] == 5 * 3600
    assert got[("trends_batch_watermark_timestamp_seconds", ())] == (CLOSED - 5 * HOUR).timestamp()
    assert got[("trends_batch_index_horizon_lag_seconds", (("partition", "2"),))] == 80 * 60
    assert got[("trends_batch_index_idle_partitions", ())] == 1
    assert got[("trends_batch_index_skipped_records_total", (("partition", "2"),))] == 7
    assert got[("trends_batch_stale_hours", ())] == 2 and got[("trends_batch_pending_hours", ())] == 5
    assert ("trends_batch_pinned_timestamp_seconds", ()) not in got  # not pinned: no sample
    assert ("trends_batch_incomplete_hours", ()) not in got  # not read: no sample, never a made-up 0
    assert ("trends_batch_reconciliation_beyond_bound_events", ()) not in got  # no reconciliation yet
    assert ("trends_airflow_up", ()) not in got  # Airflow not asked
    assert {name.removesuffix("_total") for name, _ in got} <= {n.removesuffix("_total") for n in METRICS}


def test_losses_and_the_last_reconciliation_are_exported() -> None:
    checked = NOW - timedelta(minutes=3)
    state = _state(incomplete_hours=4, reconciliation_beyond_bound=40, reconciliation_at=checked, lost={1: 20, 2: 0})
    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=lambda: state))
    assert got[("trends_batch_incomplete_hours", ())] == 4
    assert got[("trends_batch_reconciliation_beyond_bound_events", ())] == 40
    assert got[("trends_batch_reconciliation_timestamp_seconds", ())] == checked.timestamp()
    assert got[("trends_batch_index_lost_records_total", (("partition", "1"),))] == 20


def test_erasures_are_exported_by_state_with_the_oldest_pending_age() -> None:
    from infra.privacy.ledger import Summary

    pending = Summary(pending=2, done=5, failed=1, oldest_pending_at=NOW - timedelta(days=3), entries=20)
    state = _state(erasures=pending, erasure_deadline_s=30 * 86400.0)
    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=lambda: state))
    by_state = {dict(k[1])["state"]: v for k, v in got.items() if k[0] == "trends_privacy_erasure_requests"}
    assert by_state == {"pending": 2, "done": 5, "failed": 1}
    assert got[("trends_privacy_erasure_oldest_pending_age_seconds", ())] == 3 * 86400
    assert got[("trends_privacy_erasure_deadline_seconds", ())] == 30 * 86400
    none_pending = _state(erasures=Summary(0, 5, 0, None, 10), erasure_deadline_s=30 * 86400.0)
    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=lambda: none_pending))
    assert ("trends_privacy_erasure_oldest_pending_age_seconds", ()) not in got  # no pending: no age, no alert
    assert got[("trends_privacy_erasure_requests", (("state", "pending"),))] == 0
    unread = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=_state))  # ledger unreadable
    assert not any(name.startswith("trends_privacy_") for name, _ in unread)


def test_no_watermark_yet_means_no_lag_sample_and_a_watermark_ahead_is_no_lag() -> None:
    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=lambda: _state(watermark=Watermark())))
    assert ("trends_batch_watermark_lag_seconds", ()) not in got and got[("trends_batch_up", ())] == 1
    ahead = Watermark(CLOSED - HOUR, CLOSED + 3 * HOUR, CLOSED)  # forced runs beyond the closed hours; pinned
    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=lambda: _state(watermark=ahead)))
    assert got[("trends_batch_watermark_lag_seconds", ())] == 0
    assert got[("trends_batch_pinned_timestamp_seconds", ())] == CLOSED.timestamp()


def test_a_failed_read_is_up_0_without_state() -> None:
    def broken() -> BatchState:
        msg = "NoHostAvailable"
        raise RuntimeError(msg)

    got = _scrape(BatchCollector(_settings(airflow_enabled=False), batch=broken))
    assert got[("trends_batch_up", ())] == 0
    assert not [name for name, _ in got if name.startswith("trends_batch_watermark")]


def test_a_slow_read_is_abandoned_at_the_timeout_and_not_doubled() -> None:
    release = threading.Event()
    calls: list[int] = []

    def hung() -> BatchState:
        calls.append(1)
        release.wait(10)
        return _state()

    collector = BatchCollector(_settings(airflow_enabled=False, batch_read_timeout_s=0.2), batch=hung)
    assert _scrape(collector)[("trends_batch_up", ())] == 0
    assert _scrape(collector)[("trends_batch_up", ())] == 0  # the first read still hangs: no second one
    assert len(calls) == 1
    release.set()
    for _ in range(50):  # once it returned, the next scrape reads again
        got = _scrape(collector)
        if got[("trends_batch_up", ())] == 1:
            break
        time.sleep(0.05)
    assert got[("trends_batch_up", ())] == 1 and len(calls) >= 2


def test_airflow_state_per_dag() -> None:
    success = datetime(2026, 5, 3, 11, 5, tzinfo=UTC)
    flow = AirflowState({"trends_batch": success, "trends_backfill": None}, {"trends_batch": 0, "trends_backfill": 3})
    got = _scrape(BatchCollector(_settings(), batch=_state, airflow=lambda: flow))
    assert got[("trends_airflow_up", ())] == 1
    assert got[("trends_airflow_dag_last_success_timestamp_seconds", (("dag_id", "trends_batch"),))] == (
        success.timestamp()
    )
    assert ("trends_airflow_dag_last_success_timestamp_seconds", (("dag_id", "trends_backfill"),)) not in got
    assert got[("trends_airflow_failed_task_instances", (("dag_id", "trends_backfill"),))] == 3


def test_hours_without_run() -> None:
    start = datetime(2026, 5, 1, tzinfo=UTC)
    done = {start, start + 2 * HOUR}
    assert hours_without_run(start, start + 4 * HOUR, done) == 2
    assert hours_without_run(start, start, done) == 0
