"""What the operator console reads beyond the views: Airflow's backfills, the dead letters, the erasure requests.

Airflow and Kafka are slow next to Cassandra and may be down: each is read on a worker thread, at most every
:data:`SLOW_SOURCE_TTL_S` per process (the last answer is kept meanwhile), and a request waits for it at most
:data:`SLOW_SOURCE_WAIT_S`; a source that did not answer is shown in its section ("Airflow unreachable"), never as an
error of the page. The erasure ledger is a Cassandra read like the views' and is read with them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

from infra.dag_contract import BACKFILL_DAG, CHUNKS_TASK, END_PARAM, ONLY_MISSING_PARAM, START_PARAM, is_chunk
from infra.settings import Settings
from serving.console_model import (
    AirflowSection,
    AirflowUnreachable,
    BackfillRun,
    Backfills,
    DeadLetters,
    DeadLetterSection,
    Erasures,
    ErasureSection,
    ErasuresUnreadable,
    KafkaUnreachable,
    NoAnswer,
)

logger = logging.getLogger(__name__)

DLQ_SCAN_RECORDS: Final = 10_000  # newest dead letters counted by reason
SLOW_SOURCE_TTL_S: Final = 15.0  # Airflow and Kafka are asked at most this often per process
SLOW_SOURCE_WAIT_S: Final = 6.0  # an answer waits at most this long for them (they go on filling the cache)
BACKFILL_RUNS: Final = 5  # newest runs shown

T = TypeVar("T")


class _Slow:
    """Values read in the background at most every ``ttl`` seconds (per key); a request waits for one a bounded time."""

    _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="console")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._entries: dict[Any, tuple[float, Future[Any]]] = {}

    def start(self, key: Any, read: Callable[[], T]) -> Future[T]:
        """Return the read of ``key`` under way or done, starting a new one when the last is older than ``ttl``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or (entry[1].done() and time.monotonic() - entry[0] > self.ttl):
                entry = (time.monotonic(), self._pool.submit(read))
                self._entries[key] = entry
            return entry[1]


def _wait(future: Future[T], wait_s: float, what: str) -> T | NoAnswer:
    try:
        return future.result(timeout=wait_s)
    except FutureTimeout:
        return NoAnswer(reachable=False, error=f"{what} unreachable: no answer within {wait_s:g} s")


_SLOW = _Slow(SLOW_SOURCE_TTL_S)


def backfill_progress(run: dict[str, Any], task_instances: Sequence[dict[str, Any]]) -> BackfillRun:
    """Summarize a ``trends_backfill`` run: its range and state, and its chunks (mapped recompute tasks) by state."""
    chunks = [t for t in task_instances if is_chunk(t.get("task_id"), t.get("map_index"))]
    states: dict[str, int] = {}
    for t in chunks:
        states[t.get("state") or "queued"] = states.get(t.get("state") or "queued", 0) + 1
    planning = next((t.get("state") for t in task_instances if t.get("task_id") == CHUNKS_TASK), None)
    conf = run.get("conf") or {}
    done, failed = states.get("success", 0), states.get("failed", 0) + states.get("upstream_failed", 0)
    total = len(chunks)
    return BackfillRun(
        run_id=run.get("dag_run_id"),
        state=run.get("state"),
        start=conf.get(START_PARAM),
        end=conf.get(END_PARAM),
        only_missing=bool(conf.get(ONLY_MISSING_PARAM)),
        started_at=run.get("start_date"),
        ended_at=run.get("end_date"),
        chunks_total=total,
        chunks_done=done,
        chunks_failed=failed,
        chunks_by_state=states,
        progress=(
            f"{done} of {total} chunks done" + (f", {failed} failed" if failed else "")
            if total
            else f"planning chunks ({planning or 'not started'})"
        ),
    )


def read_backfills(settings: Settings) -> Backfills | AirflowUnreachable:
    """Return the newest ``trends_backfill`` runs with their progress, or why Airflow could not be read."""
    from infra.airflow.client import (  # noqa: PLC0415 - reads the Airflow config only when asked
        AirflowClient,
        runs_path,
        task_instances_path,
    )

    client = AirflowClient(settings)
    try:
        token = client.token()
        runs = client.get(token, runs_path(BACKFILL_DAG, limit=BACKFILL_RUNS, order_by="-run_after"))
        out = []
        for run in runs.get("dag_runs", [])[:BACKFILL_RUNS]:
            tis = client.get(token, task_instances_path(BACKFILL_DAG, run["dag_run_id"], limit=1000))
            out.append(backfill_progress(run, tis.get("task_instances", [])))
    except Exception as exc:  # noqa: BLE001 - any failure to read Airflow is shown, never an error of the page
        logger.info("Airflow at %s not read for the console: %s", client.url, exc)
        return AirflowUnreachable(
            reachable=False, url=client.url, error=f"Airflow unreachable: {str(exc)[:300]}", runs=[]
        )
    return Backfills(reachable=True, url=client.url, dag=BACKFILL_DAG, runs=out)


def read_dead_letters(settings: Settings) -> DeadLetters | KafkaUnreachable:
    """Return the newest dead letters counted by reason, or why Kafka could not be read."""
    from infra.dlq_reasons import reason_counts  # noqa: PLC0415 - imports the Kafka client only when asked

    topic = settings.kafka.dlq_topic
    try:
        got = reason_counts(settings, max_records=DLQ_SCAN_RECORDS, timeout_s=SLOW_SOURCE_WAIT_S - 1)
    except Exception as exc:  # noqa: BLE001 - shown in the section, never an error of the page
        logger.info("dead letters not read for the console: %s", exc)
        return KafkaUnreachable(reachable=False, topic=topic, error=f"Kafka unreachable: {str(exc)[:300]}")
    return DeadLetters(
        reachable=True,
        topic=topic,
        total=got.total,
        scanned=got.scanned,
        complete=got.complete,
        by_reason=dict(got.by_reason.most_common()),
        oldest=got.oldest,
        newest=got.newest,
    )


ERASURE_REQUESTS: Final = 20  # newest erasure requests shown (pending first)


def read_erasures(settings: Settings, sess: Any, now: datetime) -> ErasureSection:
    """Return the erasure ledger's requests (hashes only; pending first, oldest first), or why it could not be read."""
    from infra.privacy.ledger import Ledger, RequestInfo, ordered, overdue, summarize  # noqa: PLC0415

    try:
        requests = list(Ledger(settings, sess).requests().values())
    except Exception as exc:  # noqa: BLE001 - shown in the section, never an error of the page
        logger.info("the erasure ledger was not read for the console: %s", exc)
        return ErasuresUnreadable(
            readable=False, error="the erasure ledger could not be read (is migration 0011 applied?)"
        )
    summary = summarize(requests)
    requests = ordered(requests)
    deadline = settings.privacy.erasure_deadline_days
    return Erasures(
        readable=True,
        pending=summary.pending,
        done=summary.done,
        failed=summary.failed,
        oldest_pending_age_s=summary.oldest_pending_age_s(now),
        deadline_days=deadline,
        overdue=overdue(summary, now, deadline),
        requests=[RequestInfo(**r.to_json()) for r in requests[:ERASURE_REQUESTS]],
    )


@dataclass(frozen=True)
class Reads:
    """The two slow reads of one console answer, under way."""

    airflow: Future[Backfills | AirflowUnreachable]
    dead_letters: Future[DeadLetters | KafkaUnreachable]

    def airflow_section(self) -> AirflowSection:
        """Return the backfills, waited for at most :data:`SLOW_SOURCE_WAIT_S`."""
        return _wait(self.airflow, SLOW_SOURCE_WAIT_S, "Airflow")

    def dead_letter_section(self) -> DeadLetterSection:
        """Return the dead letters, waited for at most :data:`SLOW_SOURCE_WAIT_S`."""
        return _wait(self.dead_letters, SLOW_SOURCE_WAIT_S, "Kafka")


def start(settings: Settings) -> Reads:
    """Start (or reuse, within the TTL) the reads of Airflow's backfills and of the dead letters."""
    return Reads(
        _SLOW.start(("airflow", str(settings.data_dir), settings.airflow.api_port), lambda: read_backfills(settings)),
        _SLOW.start(
            ("dlq", settings.kafka.bootstrap_servers, settings.kafka.dlq_topic), lambda: read_dead_letters(settings)
        ),
    )
