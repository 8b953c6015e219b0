"""``trends query``: merged answers from the batch and speed views, as a table or ``--json``."""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from infra.security import escape_text, listen_options
from infra.settings import Settings
from infra.settings_env import env_var, to_env, with_env_vars
from infra.user_time import UTC_TIME

if TYPE_CHECKING:
    from serving.plan import Resolution

logger = logging.getLogger(__name__)


@contextmanager
def _bad_query() -> Iterator[None]:
    """Turn a refused parameter into click's usage error."""
    from serving.params import BadQueryError

    try:
        yield
    except BadQueryError as exc:
        raise click.BadParameter(exc.message, param_hint=f"--{exc.param.replace('_', '-')}") from exc


def _window(
    settings: Settings, last: str | None, start: datetime | None, end: datetime | None, slice_: str
) -> tuple[datetime, datetime]:
    from serving import params

    with _bad_query():
        params.slice_name(settings, slice_)
        return params.window(settings, last, start, end)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable(asdict(value))
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@contextmanager
def _reader(settings: Settings) -> Iterator[Any]:
    from infra.cassandra import session
    from serving.reader import ViewReader

    with session(settings) as sess:
        yield ViewReader(settings, sess)


def window_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --last/--start/--end/--slice/--json to a query command."""
    for opt in reversed(
        [
            click.option("--last", help="Window length: 15m, 1h, 24h, 7d, ending at --end (default: now)."),
            click.option(
                "--start",
                type=UTC_TIME,
                help="Window start: ISO-8601 (no offset: UTC), now, or relative like -2h.",
            ),
            click.option("--end", type=UTC_TIME, help="Window end, exclusive."),
            click.option("--slice", "slice_", default="*", show_default=True, help="`*` or a slice like origin=JFK."),
            click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts."),
        ]
    ):
        fn = opt(fn)
    return fn


def _provenance_lines(p: Any) -> list[str]:  # the caller escapes
    lines = [
        f"boundary {p.boundary}{' (pinned)' if p.boundary_pinned else ''}; speed newest event {p.speed_newest_event}"
    ]
    d = getattr(p, "definition", None) or {}
    if d:
        lines.append(
            f"view version: speed query {d.get('query')}, definition {d.get('fingerprint')}, "
            f"slice {d.get('slice_fingerprint') or 'not defined'}"
        )
    for s in p.spans:
        lines.append(f"  {s['layer']:5} {s['resolution']:6} {s['start']:%Y-%m-%d %H:%M} .. {s['end']:%Y-%m-%d %H:%M}")
    for g in p.gaps:
        lines.append(f"  GAP   {g['start']:%Y-%m-%d %H:%M} .. {g['end']:%Y-%m-%d %H:%M}  ({g.get('reason', '')})")
    for i in getattr(p, "incomplete", []):
        lines.append(
            f"  INCOMPLETE {i['start']:%Y-%m-%d %H:%M} .. {i['end']:%Y-%m-%d %H:%M}: records lost before indexing "
            f"may belong here: {'; '.join(i['losses'])}"
        )
    return lines


def _over_gaps(p: Any) -> str:
    """Say that an exact figure leaves the gaps out (never read as zeros there)."""
    minutes = sum((g["end"] - g["start"]).total_seconds() // 60 for g in p.gaps)
    return f" over the answered minutes; {minutes:.0f} minutes in gaps, not counted" if minutes else ""


@click.group()
def query() -> None:
    """Ask the merged views: summary, trending, series."""


def serve_command(app_module: str = "serving.api") -> click.Command:
    """Return the ``serve`` command over the app of ``app_module`` (its ``create_app`` and ``app_from_env``).

    The command root serves the composed app (``app.api``: the API and the routes of the layers above serving);
    serving itself cannot import them, so the module is named, not imported, here.
    """

    @click.command()
    @listen_options("serving")
    @click.option(
        "--workers",
        type=click.IntRange(1, 64),
        help="Worker processes on the port (default: serving.workers); they share nothing but Cassandra.",
    )
    @click.pass_obj
    @with_env_vars
    def serve(settings: Settings, host: str | None, port: int | None, insecure: bool, workers: int | None) -> None:
        """Serve the HTTP API (/api/v1, /docs, /health, /ready, /metrics) and the dashboard (/).

        Off loopback the API needs ${serving.api_token} (16 characters or more) unless --insecure is given.
        With several workers, /metrics adds up all of them (Prometheus multiprocess mode, a fresh directory per start).
        """
        from infra.security import refuse_exposure

        host, port = (
            host if host is not None else settings.serving.host,
            settings.serving.port if port is None else port,
        )
        refuse_exposure(
            "the API",
            host,
            settings.serving.api_token,
            host_var=f"--host/{env_var('serving.host')}",
            insecure=insecure,
            risk="query it",
        )

        import uvicorn

        create_app = importlib.import_module(app_module).create_app

        workers = workers if workers is not None else settings.serving.workers
        click.echo(f"dashboard http://{host}:{port}/  API docs http://{host}:{port}/docs  ({workers} worker(s))")
        if workers == 1:
            uvicorn.run(
                create_app(settings), host=host, port=port, log_level=settings.log_level.lower(), access_log=False
            )
            return
        _serve_workers(settings, host, port, workers, app_module)

    return serve


serve = serve_command()


def _serve_workers(settings: Settings, host: str, port: int, workers: int, app_module: str) -> None:
    """Run uvicorn's workers over the app module's ``app_from_env``, with a fresh metrics directory for this start.

    The workers are new interpreters: they read these settings from ``TRENDS_*`` variables and write their metrics
    to files in ``PROMETHEUS_MULTIPROC_DIR``, which must exist before prometheus_client is imported there and must not
    hold files of an earlier server (their counts would be added in).
    """
    import os
    import shutil
    import tempfile

    import uvicorn

    from serving.metrics import MULTIPROC_ENV

    metrics_dir = tempfile.mkdtemp(prefix="trends-serve-metrics-")
    os.environ.update(to_env(settings))
    os.environ[MULTIPROC_ENV] = metrics_dir
    try:
        uvicorn.run(
            f"{app_module}:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=settings.log_level.lower(),
            access_log=False,
        )
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


@query.command()
@window_options
@click.option("--rank", "ranks", multiple=True, type=click.FloatRange(0, 1), help="Quantile ranks (repeatable).")
@click.option("--top", default=10, show_default=True, type=int, help="Top-N items (up to serving.max_limit).")
@click.pass_obj
def summary(
    settings: Settings,
    last: str | None,
    start: datetime | None,
    end: datetime | None,
    slice_: str,
    as_json: bool,
    ranks: tuple[float, ...],
    top: int,
) -> None:
    """Show the count, distinct users, value quantiles and top items of a window."""
    from serving import params, queries, window

    start, end = _window(settings, last, start, end, slice_)
    with _bad_query():
        params.limit(settings, "top", top)
    with _reader(settings) as reader:
        ans = queries.summary(window.load(reader, start, end, slice_), ranks or (0.5, 0.9, 0.99), top)
    if as_json:
        click.echo(json.dumps(_jsonable(ans), indent=2))  # ensure_ascii: control characters come out as \u escapes
        return
    click.echo(escape_text(f"{slice_} {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC"))
    click.echo(f"events  {ans.events} (exact{_over_gaps(ans.provenance)})")
    click.echo(
        f"users   {ans.users:.0f}  [{ans.users_lower:.0f}, {ans.users_upper:.0f}] (HLL, RSE {ans.users_rse:.2%})"
    )
    qs = ", ".join(f"p{float(r) * 100:g}={v:.3f}" if v is not None else f"p{r}=-" for r, v in ans.quantiles.items())
    click.echo(f"values  {qs}  (rank error ±{ans.quantile_rank_error:.2%})")
    click.echo(f"top items (count within [lower, upper]; unlisted items ≤ {ans.items_max_error}):")
    for t in ans.top_items:
        click.echo(f"  {escape_text(t.item):30} {t.estimate:>8}  [{t.lower}, {t.upper}]")
    for line in _provenance_lines(ans.provenance):
        click.echo(escape_text(line))


@query.command()
@window_options
@click.option("--baseline", default="24h", show_default=True, help="Length of the baseline window before it.")
@click.option("--limit", default=10, show_default=True, type=int, help="Items to show (up to serving.max_limit).")
@click.option("--min-support", default=5, show_default=True, type=click.IntRange(1), help="Least recent events.")
@click.pass_obj
def trending(
    settings: Settings,
    last: str | None,
    start: datetime | None,
    end: datetime | None,
    slice_: str,
    as_json: bool,
    baseline: str,
    limit: int,
    min_support: int,
) -> None:
    """Rank the items rising in the window against the baseline window just before it."""
    from serving import params, queries, window

    start, end = _window(settings, last, start, end, slice_)

    with _bad_query():
        base_len = params.duration(settings, "baseline", baseline)
        params.limit(settings, "limit", limit)
    with _reader(settings) as reader:
        windows = [(start, end), (start - base_len, start)]
        recent, base = window.load_many(reader, windows, slice_, fields=queries.NEEDS["trending"])
        ans = queries.trending(recent, base, limit, min_support)
    if as_json:
        click.echo(json.dumps(_jsonable(ans), indent=2))
        return
    click.echo(
        escape_text(
            f"trending in {slice_} {start:%Y-%m-%d %H:%M} .. {end:%H:%M} vs the {baseline} before ({ans.score})"
        )
    )
    for i, t in enumerate(ans.items, 1):
        click.echo(f"{i:3}. {escape_text(t.item):30} lift {t.lift:8.2f}  recent {t.recent:>7} baseline {t.baseline:>7}")
    for line in _provenance_lines(ans.provenance["recent"]):
        click.echo(escape_text(line))


@query.command()
@window_options
@click.option("--resolution", type=click.Choice(["minute", "hour", "day"]), default="hour", show_default=True)
@click.option("--item", help="Count only this item.")
@click.pass_obj
def series(
    settings: Settings,
    last: str | None,
    start: datetime | None,
    end: datetime | None,
    slice_: str,
    as_json: bool,
    resolution: Resolution,
    item: str | None,
) -> None:
    """Show counts per minute, hour or day (of all events or of one item)."""
    from serving import queries, window

    start, end = _window(settings, last, start, end, slice_)
    with _reader(settings) as reader:
        need = queries.NEEDS["series_item" if item else "series"]
        ans = queries.series(window.load(reader, start, end, slice_, resolution, need), resolution, item)
    if as_json:
        click.echo(json.dumps(_jsonable(ans), indent=2))
        return
    for p in ans.points:
        click.echo(f"{p['start']:%Y-%m-%d %H:%M}  {p['count']:>9}")
    for line in _provenance_lines(ans.provenance):
        click.echo(escape_text(line))
