"""``trends batch backfill``: trigger the ``trends_backfill`` DAG through Airflow's REST API and follow the run.

What an operator used to do with curl and a JWT. The progress comes from what the REST API shows of the run: the
``chunks`` task's XCom (the hours of each Spark pass), the mapped ``recompute`` instances (one per chunk: done,
running, retrying, failed) and the event-time index (the records of those hours, read once from Cassandra; when
it cannot be read the line shows chunks and hours only). A failed run names each failed task, its chunk's hours and
the error lines of its last try's log, and exits 1.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import click

from infra.airflow.client import AirflowAPIError, AirflowClient, ui_run_path
from infra.dag_contract import (
    ADVANCE_TASK,
    BACKFILL_DAG,
    CHUNKS_TASK,
    END_PARAM,
    HOURS_ARG,
    ONLY_MISSING_PARAM,
    RECOMPUTE_TASK,
    START_PARAM,
    is_chunk,
)
from infra.errors import TrendsError
from infra.settings import Settings
from infra.user_time import UTC_TIME

logger = logging.getLogger(__name__)

EXIT_STILL_RUNNING = 3
# How long the REST API may stay unreachable (an API server restart) before following gives up.
API_OUTAGE_S = 120.0
REPEAT_S = 60.0  # an unchanged progress line is printed again this often
ERROR_RE = re.compile(r"(error|exception|refused|unable to|unavailable|failed|timed? ?out)", re.IGNORECASE)
NOISE_RE = re.compile(r"NativeCodeLoader|Traceback \(most recent call last\)")  # matches ERROR_RE, says nothing


class BackfillFailedError(TrendsError):
    """The backfill run ended failed; the message names the failed tasks."""


@dataclass(frozen=True)
class TaskState:
    """One task instance of the run, as ``GET …/taskInstances`` lists it."""

    task_id: str
    map_index: int
    state: str | None
    try_number: int
    max_tries: int
    seconds: float = 0.0  # its duration when it ended, else how long it has been running (0 when not started)

    @classmethod
    def of(cls, ti: dict[str, Any], now: datetime | None = None) -> TaskState:
        """Read a task instance of the REST API (``now``: Airflow's clock, for the time a running one has taken)."""
        seconds = float(ti.get("duration") or 0.0)
        if ti.get("state") == "running" and ti.get("start_date"):
            started = datetime.fromisoformat(ti["start_date"])
            seconds = max(0.0, ((now or datetime.now(UTC)) - started).total_seconds())
        return cls(
            ti["task_id"], int(ti.get("map_index", -1)), ti.get("state"), int(ti.get("try_number") or 0),
            int(ti.get("max_tries") or 0), seconds,
        )  # fmt: skip

    @property
    def name(self) -> str:
        """Return ``task`` or ``task[map index]``."""
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"


def chunk_hours(xcom: Any) -> list[list[datetime]] | None:
    """Return the hours of each chunk from the ``chunks`` task's XCom (spark-submit arguments with ``--hours``)."""
    if not isinstance(xcom, list):
        return None
    out: list[list[datetime]] = []
    for args in xcom:
        if not isinstance(args, list) or HOURS_ARG not in args or args.index(HOURS_ARG) + 1 >= len(args):
            return None
        out.append([datetime.fromisoformat(h) for h in json.loads(args[args.index(HOURS_ARG) + 1])])
    return out


def duration(seconds: float) -> str:
    """Return ``1h02m``, ``3m05s`` or ``42s``."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def span(hours: Sequence[datetime]) -> str:
    """Return the hours of a chunk as ``first .. last`` (UTC)."""
    if not hours:
        return "no hours"
    first, last = min(hours), max(hours)
    return f"{first:%Y-%m-%dT%HZ}" if first == last else f"{first:%Y-%m-%dT%HZ} .. {last:%Y-%m-%dT%HZ}"


@dataclass
class Snapshot:
    """What one poll of the run saw, and the progress line it makes."""

    state: str
    tasks: list[TaskState]
    chunks: list[list[datetime]] | None = None
    events: list[int] | None = None
    slots: int = 1  # most chunks seen computing at once (the DAG's backfill_parallelism, as it shows)
    run_s: float | None = None  # the run's own duration once it ended (Airflow's clock)

    def recompute(self) -> dict[int, TaskState]:
        """Return the mapped recompute instances by chunk (empty until the chunks are known)."""
        return {t.map_index: t for t in self.tasks if is_chunk(t.task_id, t.map_index)}

    def done(self) -> list[int]:
        """Return the chunks whose recompute succeeded."""
        return sorted(i for i, t in self.recompute().items() if t.state == "success")

    def weights(self) -> list[float]:
        """Return each chunk's share of the work: its events when the index told them, else its hours."""
        chunks = self.chunks or []
        if self.events is not None and len(self.events) == len(chunks) and any(self.events):
            return [float(n) for n in self.events]
        return [float(len(c)) for c in chunks]

    def eta_s(self) -> float | None:
        """Return the seconds left: each chunk not done at the rate of the chunks done, spread over the slots.

        None before a chunk with work in it is done, and once all are.
        """
        tasks, weights = self.recompute(), self.weights()
        done = [i for i in self.done() if i < len(weights)]
        work, took = sum(weights[i] for i in done), sum(tasks[i].seconds for i in done)
        todo = [i for i in range(len(weights)) if i not in done]
        if not todo or work <= 0 or took <= 0:
            return None
        per_unit = took / work
        left = [max(0.0, weights[i] * per_unit - (tasks[i].seconds if i in tasks else 0.0)) for i in todo]
        return max(*left, sum(left) / max(1, min(self.slots, len(todo))))

    def status(self) -> str:
        """Return the progress without times (printed when it changes)."""
        others = [t for t in self.tasks if t.task_id != RECOMPUTE_TASK and t.state not in {None, "success"}]
        # max_active_runs=1: a run stays queued while another trends_backfill run is active
        parts = [self.state if self.state != "queued" else "queued (one trends_backfill run at a time)"]
        if self.chunks is None:
            parts.append("planning the chunks")
        else:
            by_state: dict[str, int] = {}
            for t in self.recompute().values():
                by_state[t.state or "scheduled"] = by_state.get(t.state or "scheduled", 0) + 1
            by_state.pop("success", None)
            done = self.done()
            more = "".join(f", {n} {s.replace('_', ' ')}" for s, n in sorted(by_state.items()))
            parts.append(f"chunks {len(done)}/{len(self.chunks)} done{more}")
            parts.append(f"hours {sum(len(self.chunks[i]) for i in done)}/{sum(len(c) for c in self.chunks)}")
            if self.events is not None:
                parts.append(f"events {sum(self.events[i] for i in done):,}/{sum(self.events):,}")
        parts += [f"{t.name} {t.state}" for t in others]
        return " | ".join(parts)

    def line(self, elapsed_s: float) -> str:
        """Return the progress line: state, chunks done of total, hours, events, elapsed, ETA."""
        eta = self.eta_s()
        return f"[{duration(elapsed_s):>6}] {self.status()} | ETA {duration(eta) if eta is not None else '-'}"


def error_lines(log: Sequence[str], keep: int = 6) -> list[str]:
    """Return the lines of a task log that say what went wrong (the last ``keep``), else its last lines."""
    picked: list[str] = []
    for line in log:
        text = line.strip()
        if text and ERROR_RE.search(text) and not NOISE_RE.search(text) and text not in picked:
            picked.append(text)
    return [t[:400] for t in (picked or [x.strip() for x in log if x.strip()])[-keep:]]


@dataclass
class Follower:
    """Poll a ``trends_backfill`` run until it ends, echoing progress and each failed try."""

    client: AirflowClient
    run_id: str
    echo: Callable[[str], None]
    events_of: Callable[[list[list[datetime]]], list[int] | None] = lambda _chunks: None
    poll_s: float = 5.0
    chunks: list[list[datetime]] | None = None
    events: list[int] | None = None
    reported: set[tuple[str, int]] = field(default_factory=set)
    examined: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    slots: int = 1

    def poll(self) -> Snapshot:
        """Read the run once (its state, its task instances, the chunks once they are planned)."""
        run = self.client.dag_run(BACKFILL_DAG, self.run_id)
        now = datetime.now(UTC)
        tasks = [TaskState.of(ti, now) for ti in self.client.task_instances(BACKFILL_DAG, self.run_id)]
        planned = any(t.task_id == CHUNKS_TASK and t.state == "success" for t in tasks)
        if self.chunks is None and planned:
            self.chunks = chunk_hours(self.client.xcom(BACKFILL_DAG, self.run_id, CHUNKS_TASK))
            if self.chunks is not None:
                self.events = self.events_of(self.chunks)
        running = sum(1 for t in tasks if t.task_id == RECOMPUTE_TASK and t.state == "running")
        self.slots = max(self.slots, running)
        run_s = None
        if run.get("start_date") and run.get("end_date"):
            ended, started = datetime.fromisoformat(run["end_date"]), datetime.fromisoformat(run["start_date"])
            run_s = (ended - started).total_seconds()
        return Snapshot(run["state"], tasks, self.chunks, self.events, self.slots, run_s)

    def why(self, task: TaskState, try_number: int) -> list[str]:
        """Return the error lines of one try's log (or why they cannot be shown)."""
        try:
            log = self.client.task_log(BACKFILL_DAG, self.run_id, task.task_id, try_number, map_index=task.map_index)
        except AirflowAPIError as exc:
            return [f"(its log could not be read: {exc})"]
        return error_lines(log)

    def hours_of(self, task: TaskState) -> str:
        """Return `` (hours a .. b)`` for a recompute instance whose chunk is known."""
        if task.task_id == RECOMPUTE_TASK and self.chunks and 0 <= task.map_index < len(self.chunks):
            return f" (hours {span(self.chunks[task.map_index])})"
        return ""

    def report_retries(self, snap: Snapshot) -> None:
        """Echo each try that failed before the current one, once, with the error lines of its log.

        Read from the instance's tries, not from catching ``up_for_retry`` in a poll: a short retry delay passes
        between two polls.
        """
        for t in snap.tasks:
            seen = (t.try_number, t.state)
            if (t.try_number <= 1 and t.state != "up_for_retry") or self.examined.get(t.name) == seen:
                continue
            self.examined[t.name] = seen
            tries = self.client.tries(BACKFILL_DAG, self.run_id, t.task_id, map_index=t.map_index)
            for n in sorted(int(x["try_number"]) for x in tries if x.get("state") in {"failed", "up_for_retry"}):
                final = t.state == "failed" and n == t.try_number  # the failure message shows that one
                if final or (t.name, n) in self.reported:
                    continue
                self.reported.add((t.name, n))
                self.echo(f"{t.name}{self.hours_of(t)}: try {n} failed, Airflow retries it:")
                for line in self.why(t, n):
                    self.echo(f"    {line}")

    def failure(self, snap: Snapshot) -> str:
        """Return the message of a failed run: each failed task, its chunk, the error lines of its last try."""
        failed = [t for t in snap.tasks if t.state == "failed"]
        lines = [f"{BACKFILL_DAG} run {self.run_id} failed"]
        for t in failed:
            lines.append(
                f"task {t.name}{self.hours_of(t)} failed after {t.try_number} tr{'y' if t.try_number == 1 else 'ies'}:"
            )
            lines += [f"    {line}" for line in self.why(t, t.try_number)]
        blocked = [t.name for t in snap.tasks if t.state == "upstream_failed"]
        if blocked:
            lines.append(f"not run (upstream failed): {', '.join(blocked)}")
        if not failed:
            lines.append("no task failed: the run itself was marked failed (by hand, or it timed out)")
        lines.append(f"the run in the UI: {self.client.url}{ui_run_path(BACKFILL_DAG, self.run_id)}")
        return "\n".join(lines)

    def follow(self, timeout_s: float = 0.0) -> Snapshot | None:
        """Poll until the run ends; return its last snapshot, or None when ``timeout_s`` passed first.

        :raises AirflowAPIError: the API refused (401, 403, 404), or did not answer for ``API_OUTAGE_S``.
        """
        started = time.monotonic()
        shown, shown_at = "", 0.0
        outage: float | None = None
        while True:
            try:
                snap = self.poll()
                self.report_retries(snap)
                outage = None
            except AirflowAPIError as exc:
                if exc.status is not None and exc.status < 500:
                    raise
                outage = outage or time.monotonic()
                if time.monotonic() - outage > API_OUTAGE_S:
                    raise
                self.echo(f"Airflow did not answer ({exc}); trying again")
                time.sleep(self.poll_s)
                continue
            now = time.monotonic()
            if snap.status() != shown or now - shown_at >= REPEAT_S or snap.state in {"success", "failed"}:
                self.echo(snap.line(now - started))
                shown, shown_at = snap.status(), now
            if snap.state in {"success", "failed"}:
                return snap
            if timeout_s and now - started >= timeout_s:
                return None
            time.sleep(self.poll_s)


def index_events(settings: Settings) -> Callable[[list[list[datetime]]], list[int] | None]:
    """Return a reader of each chunk's indexed records (what its pass reads), or None when Cassandra cannot say."""

    def read(chunks: list[list[datetime]]) -> list[int] | None:
        from infra.cassandra import session  # noqa: PLC0415 - the driver only when following
        from views.store.index import IndexStore  # noqa: PLC0415

        try:
            with session(settings) as sess:
                totals = IndexStore(settings, sess).hour_totals(
                    settings.kafka.events_topic, sorted({h.date() for c in chunks for h in c})
                )
        except Exception as exc:  # noqa: BLE001 - events are extra information: progress goes on without them
            logger.warning("events per chunk unknown (the index could not be read: %s)", exc)
            return None
        return [sum(totals.get(h, (0, 0))[0] for h in c) for c in chunks]

    return read


def check_range(start: datetime | None, end: datetime | None, now: datetime) -> tuple[datetime, datetime]:
    """Return the range if it is one ``trends_backfill`` can compute, else raise a usage error saying why."""
    if start is None or end is None:
        msg = "give --start and --end (or --run-id to follow a run already triggered)"
        raise click.UsageError(msg)
    for name, ts in (("start", start), ("end", end)):
        if ts.minute or ts.second or ts.microsecond:
            msg = f"--{name} {ts:%Y-%m-%dT%H:%M:%SZ} is not a whole hour: the batch layer computes UTC hours"
            raise click.UsageError(msg)
    if end <= start:
        msg = f"--end {end:%Y-%m-%dT%H:%MZ} is not after --start {start:%Y-%m-%dT%H:%MZ}: the range is empty"
        raise click.UsageError(msg)
    if end > now:
        msg = (
            f"--end {end:%Y-%m-%dT%H:%MZ} is in the future: only closed hours are computed (the hourly DAG "
            "keeps up with live data)"
        )
        raise click.UsageError(msg)
    return start.astimezone(UTC), end.astimezone(UTC)


@click.command("backfill")
@click.option("--start", type=UTC_TIME, help="First hour (inclusive), e.g. 2025-01-01 or 2025-01-01T06:00Z.")
@click.option("--end", type=UTC_TIME, help="End (exclusive), a whole hour.")
@click.option("--only-missing", is_flag=True, help="Skip hours that already have a current run.")
@click.option("--wait", is_flag=True, help="Follow the run until it ends; exit 1 if it failed.")
@click.option("--run-id", help="Follow this run of trends_backfill instead of triggering one (implies --wait).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help=f"With --wait: stop following after this many seconds (exit {EXIT_STILL_RUNNING}; the run goes on). "
    "0: no limit.",
)
@click.option("--poll", type=click.FloatRange(min=0.5), default=5.0, show_default=True, help="Seconds between polls.")
@click.pass_context
def backfill(
    ctx: click.Context,
    start: datetime | None,
    end: datetime | None,
    only_missing: bool,
    wait: bool,
    run_id: str | None,
    timeout: float,
    poll: float,
) -> None:
    """Recompute [START, END) through Airflow's trends_backfill DAG, and with --wait follow it to the end.

    The DAG indexes the topic, splits the range into chunks (batch.chunk_hours / batch.chunk_events) and runs one
    spark-submit per chunk. --wait prints chunks done of total, hours, events and an ETA as they change, each failed
    try with its error, and exits 1 naming the failed task when the run fails (0 when it succeeds). Airflow is the
    local stack's, or airflow.api_url with airflow.api_token or airflow.api_user/api_password.
    """
    settings: Settings = ctx.obj
    if run_id is not None and (start is not None or end is not None or only_missing):
        msg = "--run-id follows an existing run: it takes no --start, --end or --only-missing"
        raise click.UsageError(msg)
    wait = wait or run_id is not None
    if timeout and not wait:
        msg = "--timeout applies to --wait (or --run-id)"
        raise click.UsageError(msg)
    client = AirflowClient(settings)
    if run_id is None:
        first, last = check_range(start, end, datetime.now(UTC))
        conf = {START_PARAM: first.isoformat(), END_PARAM: last.isoformat(), ONLY_MISSING_PARAM: only_missing}
        run_id = client.trigger(None, BACKFILL_DAG, conf)
        click.echo(f"triggered {BACKFILL_DAG} run {run_id}: [{first:%Y-%m-%dT%H:%MZ}, {last:%Y-%m-%dT%H:%MZ})"
                   f"{' (only missing hours)' if only_missing else ''}")  # fmt: skip
        if not wait:
            click.echo(f"follow it: trends batch backfill --run-id {run_id}")
            click.echo(f"the run in the UI: {client.url}{ui_run_path(BACKFILL_DAG, run_id)}")
            return
    follower = Follower(client, run_id, lambda line: click.echo(line, err=True), index_events(settings), poll)
    snap = follower.follow(timeout)
    if snap is None:
        click.echo(
            f"{BACKFILL_DAG} run {run_id} still running after {duration(timeout)}; it goes on "
            f"(follow it again: trends batch backfill --run-id {run_id})"
        )
        ctx.exit(EXIT_STILL_RUNNING)
    assert snap is not None  # noqa: S101 - ctx.exit raised otherwise
    if snap.state == "failed":
        raise BackfillFailedError(follower.failure(snap))
    watermark = client.xcom(BACKFILL_DAG, run_id, ADVANCE_TASK)
    chunks = snap.chunks or []
    events = f", {sum(snap.events):,} events" if snap.events is not None else ""
    took = f" in {duration(snap.run_s)}" if snap.run_s is not None else ""
    hours = sum(len(c) for c in chunks)
    summary = f"{BACKFILL_DAG} run {run_id} succeeded{took}: {len(chunks)} chunks, {hours} hours{events}"
    if not chunks:
        summary += " (nothing to compute: every hour of the range has a current run)"
    click.echo(summary + (f"; {watermark}" if isinstance(watermark, str) else ""))
