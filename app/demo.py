"""``trends demo``: the whole pipeline on the local stack, end to end, left running to explore.

Kafka, Cassandra and Airflow start (or are reused); the speed layer starts as a background service; a generated
workload goes to Kafka — some hours of history with planted bursts in its last half hour, then a live stream at
the wall clock; the Airflow DAG backfills the closed hours through the scheduler; an app's batch arrives through the
HTTP collector (``trends collect``); the API and dashboard start; and the trending answer is printed with its
provenance. A second run reuses the servers, the workload and the batch runs already there (``--fresh`` produces a
new workload).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from batch_layer import horizon, tasks
from batch_layer.backfill import BackfillFailedError, Follower, index_events
from infra import migrations, topics
from infra.cassandra import session
from infra.dag_contract import BACKFILL_DAG, END_PARAM, START_PARAM
from infra.errors import StackError
from infra.settings import Settings
from infra.settings_env import env_var
from serving.reader import ViewReader
from stack import control
from stack.airflow.config import AirflowConfig
from stack.process import child_env
from stack.services.pipeline import ApiService
from views.buckets import HOUR, MINUTE, closed_until, floor, utc
from views.indexing import indexer
from views.store.batch import BatchRows
from views.store.pointers import PointerStore

# Planted bursts: item rank : factor : minutes before the end of the history : duration (minutes).
BURSTS = ((40, 15.0, 25, 20), (90, 12.0, 25, 20), (150, 10.0, 25, 20))
RECENT = timedelta(minutes=30)  # the window the demo asks about


def _step(text: str) -> None:
    click.secho(f"\n== {text}", bold=True)


def _trends(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "trends"), *args]


def _history(
    settings: Settings, state_file: Path, hours: int, event_rate: float, after: datetime | None
) -> dict[str, Any]:
    """Produce the historical part of the workload (as fast as possible) and remember what it was.

    It starts ``hours`` whole hours back, or where an earlier demo's history ended if that is later.
    """
    now = datetime.now(UTC)
    start, end = floor(now, HOUR) - hours * HOUR, floor(now, MINUTE)
    if after is not None:  # continue the earlier slice, with room for the bursts before the end
        start = min(max(start, after), end - 2 * RECENT)
    span_min = (end - start).total_seconds() / 60
    bursts = [f"#t{rank}:{factor}:{span_min - before:g}:{minutes}" for rank, factor, before, minutes in BURSTS]
    truth = state_file.parent / "truth.json"
    cmd = _trends(
        "ingest", "generate", "--start", start.isoformat(), "--end", end.isoformat(), "--event-rate", str(event_rate),
        "--fast", "--items", "2000", "--users", "20000", "--seed", str(int(now.timestamp())), "--truth", str(truth),
    )  # fmt: skip
    for b in bursts:
        cmd += ["--burst", b]
    click.echo(f"history {start:%Y-%m-%d %H:%M} .. {end:%H:%M} UTC, {event_rate:g} events/s, bursts {' '.join(bursts)}")
    state_file.parent.mkdir(parents=True, exist_ok=True)
    if subprocess.run(cmd, check=False, env=_env(settings, "kafka")).returncode != 0:  # noqa: S603 - our own CLI
        msg = "producing the demo workload failed (see above)"
        raise click.ClickException(msg)
    first = floor(start, HOUR) - HOUR if after is not None else start  # redo the hour a previous slice ended in
    state = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "first_hour": first.isoformat(),
        "bursts": [b.split(":")[0] for b in bursts],
    }
    state_file.write_text(json.dumps(state, indent=2))
    return state


def _stop(proc: subprocess.Popen[bytes], started: float, least_s: float = 15) -> None:
    """Stop a generator with Ctrl-C (it flushes what it queued) after it ran ``least_s``; escalate if it hangs."""
    time.sleep(max(0.0, least_s - (time.monotonic() - started)))
    for sig, wait_s in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def _env(settings: Settings, *services: str) -> dict[str, str]:
    """Return the environment of a ``trends`` child: the settings, and as files the secrets of ``services`` only."""
    name = "-".join(services) or "none"
    return child_env(settings, services, settings.data_dir / "demo" / "secrets" / name)


def _wait_speed(settings: Settings, until: datetime, timeout_s: float = 600) -> datetime:
    """Wait until the speed view has written events up to ``until``; return its newest event time."""
    deadline = time.monotonic() + timeout_s
    newest: datetime | None = None
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        while time.monotonic() < deadline:
            newest = reader.coverage(until - HOUR, until, "*").speed_newest_event
            if newest is not None and newest >= until:
                return newest
            time.sleep(2)
    msg = f"the speed layer had written events up to {newest} after {timeout_s:.0f} s (wanted {until})"
    raise click.ClickException(msg)


def _backfill(settings: Settings, first: datetime) -> list[datetime]:
    """Backfill the closed hours from ``first`` through Airflow; return the hours now served by the batch view."""
    result = indexer.run_index(settings)
    hz = horizon.horizon(settings)
    click.echo(f"trends batch index: {result.line()}; {hz.describe()}")
    last_end = closed_until(hz.closed_at, settings)
    if last_end is None:
        return []
    starts = [first + i * HOUR for i in range(int((last_end - first) / HOUR))]
    if not starts:
        click.echo("no closed hour yet")
        return []
    with session(settings) as sess:
        pointers = PointerStore(settings, sess)
        done = {h for d in {s.date() for s in starts} for h in pointers.runs(d)}
    todo = [s for s in starts if s not in done]
    if not todo:
        click.echo(f"batch view already holds {len(starts)} closed hour(s) {starts[0]:%H:%M} .. {last_end:%H:%M}")
        return starts
    af = AirflowConfig(settings).client()
    token = af.token()
    af.wait_dag(token, BACKFILL_DAG)
    conf = {START_PARAM: todo[0].isoformat(), END_PARAM: (todo[-1] + HOUR).isoformat()}
    click.echo(f"airflow dags trigger {BACKFILL_DAG} --conf '{json.dumps(conf)}'")
    run_id = af.trigger(token, BACKFILL_DAG, conf)
    # followed as `trends batch backfill --wait` follows it: chunks done of total, events, ETA, failed tries
    follower = Follower(af, run_id, click.echo, index_events(settings), poll_s=3)
    snap = follower.follow(timeout_s=1800)
    if snap is None:
        msg = f"{BACKFILL_DAG} run {run_id} not done within 30 min"
        raise StackError(msg)
    if snap.state == "failed":
        raise BackfillFailedError(follower.failure(snap))
    return starts


def _hour_events(settings: Settings, hour: datetime) -> int:
    with session(settings) as sess:
        runs = PointerStore(settings, sess).runs(hour.date())
        return sum(r.events for r in BatchRows(settings, sess).day_hours("*", hour.date(), runs) if utc(r.hour) == hour)


def _absorb_late(settings: Settings, hour: datetime) -> None:
    """Produce late events of a completed hour; show it stale in the index, then recomputed by `--stale`."""
    before = _hour_events(settings, hour)
    start = hour + timedelta(minutes=10)
    cmd = _trends("ingest", "generate", "--start", start.isoformat(), "--count", "25", "--event-rate", "0.02",
                  "--fast", "--items", "2000", "--seed", str(time.time_ns() % 1_000_000))  # fmt: skip
    click.echo(f"25 late events of {hour:%H:%M} UTC arrive now (its batch run counted {before})")
    if subprocess.run(cmd, check=False, env=_env(settings, "kafka"), capture_output=True).returncode != 0:  # noqa: S603
        click.echo("(producing the late events failed; skipped)")
        return
    indexer.run_index(settings)
    stale = tasks.stale_hours(settings)
    for h, (now, read) in stale.items():
        click.echo(f"trends batch status: {h:%Y-%m-%d %H:%M} UTC is stale, {now - read} records arrived since its run")
    click.echo("trends batch run --stale")
    cmd = _trends("batch", "run", "--stale")
    proc = subprocess.run(cmd, check=False, env=_env(settings, "kafka", "cassandra"), capture_output=True, text=True)  # noqa: S603
    click.echo((proc.stdout.strip().splitlines() or ["(no output)"])[-1])
    click.echo(f"{hour:%H:%M} UTC now counts {_hour_events(settings, hour)} in the batch view (was {before})")


def _collect(settings: Settings) -> None:
    """Feed a batch through the HTTP collector, as an app would: answered once Kafka acknowledged every record.

    One record is invalid on purpose: the answer names it and its reason, and it goes to the dead-letter topic.
    """
    import socket  # noqa: PLC0415

    _step("a source that is not a generator: the HTTP collector")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {**_env(settings, "kafka", "cassandra"), env_var("collector.port"): str(port)}
    url = f"http://127.0.0.1:{port}/api/v1/events"
    click.echo(f"trends collect  (POST {url})")
    proc = subprocess.Popen(_trends("collect"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    try:
        now = datetime.now(UTC)
        lines = [
            {"id": f"http-{now:%H%M%S}-{i}", "ts": (now - timedelta(seconds=i)).isoformat(), "item": "#from-http",
             "user": f"app-user-{i % 7}", "value": i}
            for i in range(20)
        ]  # fmt: skip
        body = "\n".join([*(json.dumps(x) for x in lines), '{"item": "#no-time"}']).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/x-ndjson"}, method="POST")
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - our own collector on loopback
                    answer = json.load(resp)
                break
            except OSError:  # not listening yet
                if proc.poll() is not None or time.monotonic() > deadline:
                    click.echo("(the collector did not answer; skipped)")
                    return
                time.sleep(0.5)
        rejects = ", ".join(f"line {r['index']}: {r['reason']}" for r in answer["rejects"])
        click.echo(f"200 after Kafka's acks: {answer['accepted']} accepted, {answer['rejected']} rejected ({rejects})")
        click.echo("users pseudonymised at this first hop; the rejected line is in the dead-letter topic")
    finally:
        proc.terminate()
        proc.wait(30)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - our own API on loopback
        return json.load(resp)


def _show_trending(settings: Settings, state: dict[str, Any]) -> str:
    host, port = ApiService(settings).host, settings.serving.port
    query = {"last": "30m", "baseline": "3h", "limit": "10"}
    t = _get(f"http://{host}:{port}/api/v1/trending?{urllib.parse.urlencode(query)}")
    click.echo(f"trending {t['recent_start'][11:16]} .. {t['recent_end'][11:16]} UTC vs the 3 h before ({t['score']})")
    for i, item in enumerate(t["items"], 1):
        mark = "  <- planted" if item["item"] in state["bursts"] else ""
        click.echo(f"{i:3}. {item['item']:10} lift {item['lift']:7.2f}  recent {item['recent']:>6}  "
                   f"baseline {item['baseline']:>6}{mark}")  # fmt: skip
    for name, prov in t["provenance"].items():
        spans = ", ".join(
            f"{s['layer']} {s['resolution']} {s['start'][11:16]}-{s['end'][11:16]}" for s in prov["spans"]
        )
        gaps = ", ".join(f"{g['start'][11:16]}-{g['end'][11:16]}" for g in prov["gaps"]) or "none"
        click.echo(f"{name:8} served by: {spans}; gaps: {gaps}")
    click.echo(f"boundary (batch watermark) {t['provenance']['recent']['boundary']}; "
               f"speed newest event {t['provenance']['recent']['speed_newest_event']}")  # fmt: skip
    found = [b for b in state["bursts"] if b in {i["item"] for i in t["items"]}]
    click.echo(f"planted bursts in the top 10: {len(found)}/{len(state['bursts'])}")
    return f"http://{host}:{port}/?last=30m&baseline=3h"


@click.command()
@click.option("--fresh", is_flag=True, help="Produce a new workload even if an earlier demo's is there.")
@click.option("--hours", default=4, show_default=True, type=click.IntRange(2, 48), help="Hours of history.")
@click.option("--event-rate", default=20.0, show_default=True, type=click.FloatRange(0.1), help="History events/s.")
@click.option("--live-rate", default=100, show_default=True, type=click.IntRange(0), help="Live events/s (0: none).")
@click.pass_obj
def demo(settings: Settings, fresh: bool, hours: int, event_rate: float, live_rate: int) -> None:
    """Run the whole pipeline on the local stack and leave it running: stream, batch, serve, ask."""
    t0 = time.monotonic()
    _step("stack: Kafka, Cassandra, Airflow")
    for r in control.up(settings, ["kafka", "cassandra", "airflow"]):
        how = "already running" if r.already_running else f"started in {r.seconds:.1f} s"
        click.echo(f"{r.name:10} {r.address:22} {how}")
    for topic, how in topics.ensure_topics(settings.kafka, privacy=settings.privacy).items():
        click.echo(f"topic      {topic:22} {how}")
    applied = migrations.migrate(settings)
    click.echo(f"schema     {settings.cassandra.keyspace:22} {len(applied)} migration(s) applied now")

    _step("speed layer: trends speed run (background service)")
    for r in control.up(settings, ["speed"]):
        click.echo(f"speed      metrics {r.address:14} {'already running' if r.already_running else 'started'}")

    _step("workload: history with planted bursts, then a live stream")
    state_file = settings.data_dir / "demo" / "state.json"
    state = None if fresh or not state_file.exists() else json.loads(state_file.read_text())
    if state is not None and datetime.fromisoformat(state["end"]) > datetime.now(UTC) - RECENT:
        click.echo(f"reusing the workload of an earlier demo ({state['start']} .. {state['end']}; --fresh: a new one)")
    else:  # none yet, or its bursts have left the recent window: a new slice after the old one
        after = datetime.fromisoformat(state["end"]) if state is not None else None
        state = _history(settings, state_file, hours, event_rate, after)
    live, live_started = None, time.monotonic()
    if live_rate:
        click.echo(f"live stream: {live_rate} events/s at the wall clock until the batch layer is done (background)")
        live_started = time.monotonic()
        live = subprocess.Popen(  # noqa: S603 - our own CLI
            _trends("ingest", "generate", "--rate", str(live_rate), "--items", "2000", "--seed", str(time.time_ns())),
            env=_env(settings, "kafka"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        newest = _wait_speed(settings, datetime.fromisoformat(state["end"]) - MINUTE)
        click.echo(f"speed view caught up: newest event {newest:%Y-%m-%d %H:%M:%S} UTC")

        _step("batch layer: Airflow backfill of the closed hours")
        first = datetime.fromisoformat(state.get("first_hour", state["start"]))
        hours_done = _backfill(settings, floor(first, HOUR))
        click.echo(f"batch view serves {len(hours_done)} closed hour(s)")
        if hours_done:
            _step("late data: the index finds it, the hour turns stale, a recompute absorbs it")
            _absorb_late(settings, hours_done[0])
        _collect(settings)
    finally:
        if live is not None:
            _stop(live, live_started)
    if live is not None:
        newest = _wait_speed(settings, datetime.now(UTC) - timedelta(seconds=30))
        click.echo(f"live stream stopped; speed view fresh up to {newest:%H:%M:%S} UTC")

    _step("serving: API and dashboard (background service)")
    for r in control.up(settings, ["api"]):
        click.echo(f"api        {r.address:22} {'already running' if r.already_running else 'started'}")
    url = _show_trending(settings, state)

    _step(f"done in {time.monotonic() - t0:.0f} s; everything keeps running")
    click.echo(f"dashboard  {url}")
    click.echo(f"API docs   {url.split('?')[0]}docs")
    click.echo(f"airflow    {AirflowConfig(settings).login_hint()}")
    click.echo("ask        trends query trending --last 30m --baseline 3h")
    click.echo("status     trends stack status      stop: trends stack down")
