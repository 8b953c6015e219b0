"""The API's routes: the windowed queries, status, the operator console's answer, health, readiness, metrics.

Each query route validates its parameters (:mod:`serving.params`), loads its window through the one loader
(:func:`serving.window.load_many`, within the request's read budget) and answers with :mod:`serving.queries`, whose
answers carry the provenance, the gaps and the error bounds. The app around them is :mod:`serving.api`.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime, some of them local.
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from pydantic import BaseModel

from infra.security import bearer_refusal
from infra.settings import Settings
from serving import console, params, queries, window
from serving.backend import Backend
from serving.budget import ReadBudget, ReadBudgetExceededError
from serving.console_model import ConsoleAnswer
from serving.errors import BAD_REQUEST, QUERY_ERRORS, UNAVAILABLE_503, CassandraUnavailableError, driver_errors, reason
from serving.metrics import Metrics, forget_dead_workers, multiprocess
from serving.openapi import API_PREFIX, WINDOW_RULES
from serving.plan import RESOLUTIONS, Resolution
from serving.status import SpeedEpochInfo, StaleHour, Status, ViewVersionInfo, gap_minutes, losses, pin_effect
from views.buckets import MINUTE, floor

logger = logging.getLogger(__name__)

MAX_POINTS = 10_000  # of one series answer
RESOLUTION_ORDER: tuple[Resolution, ...] = ("minute", "hour", "day")  # finest first


@dataclass
class WindowQuery:
    """The window and slice of a request, validated."""

    start: datetime
    end: datetime
    slice: str


def _bad(exc: params.BadQueryError) -> HTTPException:
    return HTTPException(400, detail=str(exc))


class ApiContext:
    """What every request works through: the settings, the Cassandra backend and the metrics; merges windows."""

    def __init__(self, settings: Settings, backend: Backend, metrics: Metrics) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = metrics

    def load(
        self,
        w: WindowQuery,
        answer: str,
        coarsest: Resolution = "day",
        before: timedelta | None = None,
        item: str | None = None,
    ) -> list[window.Window]:
        """Merge the window's rows (and the ``before`` long window's just before it, if asked) for an answer.

        Rows are merged as they stream in, never all held, and the request may read at most
        ``serving.max_read_mb`` of sketches (a 400 past it).
        """
        windows = [(w.start, w.end)] if before is None else [(w.start, w.end), (w.start - before, w.start)]
        budget = ReadBudget(int(self.settings.serving.max_read_mb * 1024 * 1024))
        try:
            out = window.load_many(
                self.backend.reader(),
                windows,
                w.slice,
                coarsest,
                queries.NEEDS[answer],
                item=item,
                keep_rows=False,
                budget=budget,
            )
        except ReadBudgetExceededError as exc:
            raise HTTPException(400, str(exc)) from None
        except driver_errors() as exc:
            raise CassandraUnavailableError(reason(exc)) from exc
        self.metrics.cassandra_up.set(1)
        return out

    def limit(self, name: str, value: int) -> int:
        """Check a limit against the cap."""
        try:
            return params.limit(self.settings, name, value)
        except params.BadQueryError as exc:
            raise _bad(exc) from None


def _context(request: Request) -> ApiContext:
    return request.app.state.context  # type: ignore[no-any-return]


def _authorize(request: Request) -> None:
    token = request.app.state.context.settings.serving.api_token
    secret = token.get_secret_value() if token is not None else None
    if bearer_refusal(request.headers.get("authorization"), secret) is not None:  # a wrong token too: 401 here
        raise HTTPException(401, "this API needs `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})


def _window(
    request: Request,
    last: Annotated[
        str | None,
        Query(
            description="Window length: 15m, 1h, 24h, 7d (at most `serving.max_window_days`), ending at `end` or at "
            "the end of the current minute; with `start` alone, from `start`; with both, the last part of "
            "`[start, end)`. Nothing given means 1h."
        ),
    ] = None,
    start: Annotated[
        str | None,
        Query(description="Window start, ISO-8601 with an offset (2026-05-01T10:00Z), years 1970-2999."),
    ] = None,
    end: Annotated[
        str | None, Query(description="Window end (exclusive), ISO-8601 with an offset, years 1970-2999.")
    ] = None,
    slice_: Annotated[
        str, Query(alias="slice", description="`*` or a slice of a dimension in `views.slice_dims`, e.g. origin=JFK.")
    ] = "*",
) -> WindowQuery:
    settings = _context(request).settings
    try:
        t0 = params.parse_time("start", start) if start is not None else None
        t1 = params.parse_time("end", end) if end is not None else None
        name = params.slice_name(settings, slice_)
        if last is None and start is None and end is None:
            last = params.DEFAULT_LAST
        lo, hi = params.window(settings, last, t0, t1)
    except params.BadQueryError as exc:
        raise _bad(exc) from None
    return WindowQuery(lo, hi, name)


def _ranks(rank: list[float] | None) -> tuple[float, ...]:
    try:
        return params.ranks(rank or [])
    except params.BadQueryError as exc:
        raise _bad(exc) from None


Win = Annotated[WindowQuery, Depends(_window)]
Context = Annotated[ApiContext, Depends(_context)]
Ranks = Annotated[list[float] | None, Query(description="Quantile ranks in [0, 1] (repeat the parameter).")]

router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(_authorize)], tags=["queries"], responses=QUERY_ERRORS)


def _query(path: str, model: Any, extra_rules: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a windowed query route: its model, its 400 and the rules spanning its parameters."""
    return router.get(path, response_model=model, responses=BAD_REQUEST, description=WINDOW_RULES + extra_rules)


@_query("/count", queries.Count)
def count(w: Win, ctx: Context) -> queries.Count:
    """Count the events of a window (exact)."""
    return queries.count(ctx.load(w, "count")[0])


@_query("/users", queries.Users)
def users(w: Win, ctx: Context) -> queries.Users:
    """Estimate the distinct users of a window (HLL, with 95% bounds)."""
    return queries.users(ctx.load(w, "users")[0])


@_query("/quantiles", queries.Quantiles)
def quantiles(w: Win, ctx: Context, rank: Ranks = None) -> queries.Quantiles:
    """Estimate value quantiles of a window at any ranks (KLL, with its rank error)."""
    return queries.quantiles(ctx.load(w, "quantiles")[0], _ranks(rank))


@_query("/top", queries.Top)
def top(w: Win, ctx: Context, limit: int = 10) -> queries.Top:
    """List the top-N items of a window with their count bounds (frequent items)."""
    return queries.top(ctx.load(w, "top")[0], ctx.limit("limit", limit))


@_query("/summary", queries.Summary)
def summary(w: Win, ctx: Context, rank: Ranks = None, top: int = 10) -> queries.Summary:
    """Answer count, users, quantiles and top items of a window at once."""
    return queries.summary(ctx.load(w, "summary")[0], _ranks(rank), ctx.limit("top", top))


@_query("/trending", queries.Trending, " `baseline` is at most `serving.max_window_days` long too.")
def trending(
    w: Win,
    ctx: Context,
    baseline: Annotated[str | None, Query(description="Baseline length before the window, e.g. 24h.")] = None,
    limit: int = 10,
    min_support: Annotated[int, Query(ge=1, description="Least events of an item in the window.")] = 5,
) -> queries.Trending:
    """Rank the items rising in the window against the baseline before it (lift, minimum support)."""
    try:
        base_len = params.duration(
            ctx.settings, "baseline", baseline if baseline is not None else ctx.settings.serving.default_baseline
        )
    except params.BadQueryError as exc:
        raise _bad(exc) from None
    n = ctx.limit("limit", limit)
    recent, base = ctx.load(w, "trending", before=base_len)
    return queries.trending(recent, base, n, min_support)


@_query(
    "/series",
    queries.Series,
    f" A series has at most {MAX_POINTS:,} points: a `resolution` too fine for the window is answered at the next "
    "coarser one that fits (the answer's `resolution` says which).",
)
def series(
    w: Win,
    ctx: Context,
    resolution: Annotated[Literal["minute", "hour", "day"], Query()] = "hour",
    item: Annotated[str | None, Query(max_length=256, description="Count only this item.")] = None,
) -> queries.Series:
    """Count events per minute, hour or day, of all items or of one."""
    resolution = series_resolution(w, resolution)
    answer = "series_item" if item else "series"
    return queries.series(ctx.load(w, answer, coarsest=resolution, item=item or None)[0], resolution, item or None)


def series_resolution(w: WindowQuery, asked: Resolution) -> Resolution:
    """Return the resolution asked, or the finest coarser one whose series fits in ``MAX_POINTS`` points.

    :raises HTTPException: 400 when not even daily points fit (a ``serving.max_window_days`` beyond 27 years).
    """
    for resolution in RESOLUTION_ORDER[RESOLUTION_ORDER.index(asked) :]:
        if (w.end - w.start) / RESOLUTIONS[resolution] <= MAX_POINTS:
            return resolution
    raise HTTPException(400, f"resolution: more than {MAX_POINTS:,} daily points; ask for a shorter window")


@router.get("/status", response_model=Status)
def status(ctx: Context) -> Status:
    """Show the boundary between the layers, the pin, the speed layer's epochs and freshness, the stale hours."""
    now = datetime.now(UTC)
    try:
        reader = ctx.backend.reader()
        cov = reader.coverage(floor(now, MINUTE), floor(now, MINUTE) + MINUTE, "*")
        stale = reader.stale_hours()
        pin = pin_effect(reader) if cov.pinned else None
        lost, incomplete = losses(reader, now)
    except driver_errors() as exc:
        raise CassandraUnavailableError(reason(exc)) from exc
    newest = cov.speed_newest_event
    return Status(
        now=now,
        boundary=cov.boundary,
        boundary_pinned=cov.pinned,
        batch_low=cov.batch_low,
        speed_newest_event=newest,
        speed_updated_at=cov.speed_updated_at,
        speed_lag_s=None if newest is None else round((now - newest).total_seconds(), 3),
        speed_epochs=[
            SpeedEpochInfo(e.id, e.started_at, e.covered_from, e.seen_until, e.starting_offsets)
            for e in cov.speed.epochs
        ],
        pin=pin,
        slice_dims=list(ctx.settings.views.slice_dims),
        view_version=None if cov.version is None else ViewVersionInfo(cov.version.query, cov.version.fingerprint),
        refresh_s=ctx.settings.serving.dashboard_refresh_s,
        stale_hours=[StaleHour(h, n) for h, n in stale.items()],
        losses=lost,
        incomplete_hours=incomplete,
    )


@router.get("/console", response_model=ConsoleAnswer, responses=BAD_REQUEST, description=console.RANGE_RULES)
def console_answer(
    ctx: Context,
    start: Annotated[
        str | None, Query(description="First hour (floored), ISO-8601 with an offset; with `end`.")
    ] = None,
    end: Annotated[
        str | None, Query(description="End (exclusive, rounded up to an hour), ISO-8601; with `start`.")
    ] = None,
) -> ConsoleAnswer:
    """Explain each hour of a range (the operator console): batch run, speed coverage, gaps, and what feeds them."""
    try:
        lo, hi = console.hour_range(start, end, datetime.now(UTC))
    except params.BadQueryError as exc:
        raise _bad(exc) from None
    try:
        return console.build(ctx.backend.reader(), lo, hi)
    except driver_errors() as exc:
        raise CassandraUnavailableError(reason(exc)) from exc


ops = APIRouter(tags=["ops"])


class Health(BaseModel):
    """Liveness or readiness: what the process says of itself."""

    status: Literal["ok", "ready"]


@ops.get("/health", response_model=Health)
def health() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@ops.get("/ready", response_model=Health, responses=UNAVAILABLE_503)
def ready(ctx: Context) -> Health:
    """Readiness: the views can be read (a 503 says only that; the reason goes to the server log)."""
    ctx.backend.ping()
    ctx.metrics.cassandra_up.set(1)
    return Health(status="ready")


@ops.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
)
def prometheus(ctx: Context) -> Response:
    """Prometheus text: requests and latency by route, Cassandra up, the batch-row cache, gaps by reason."""
    unavailable: tuple[type[BaseException], ...] = (CassandraUnavailableError, *driver_errors())
    try:
        gaps = gap_minutes(ctx.backend.reader(), datetime.now(UTC))
    except unavailable as exc:  # the scrape still answers; the gaps keep their last values
        logger.warning("gap minutes not read: %s", reason(exc))
        ctx.metrics.cassandra_up.set(0)
    else:
        ctx.metrics.cassandra_up.set(1)
        for why, minutes in gaps.items():
            ctx.metrics.gaps.labels(why).set(minutes)
    ctx.metrics.cache.sync(ctx.backend.current)
    if multiprocess():  # every worker's figures, added up from prometheus_client's files
        try:
            forget_dead_workers()
        except OSError as exc:  # a clean-up: the scrape still answers
            logger.warning("metrics: dead workers' gauges not removed: %s", exc)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)


DASHBOARD = resources.files("serving").joinpath("static/dashboard.html")


@ops.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    """Serve the dashboard (query parameters: last or start/end, baseline, slice, limit, token, refresh)."""
    return HTMLResponse(DASHBOARD.read_text(encoding="utf-8"))


CONSOLE = resources.files("serving").joinpath("static/console.html")


@ops.get("/console", response_class=HTMLResponse, include_in_schema=False)
def console_page() -> HTMLResponse:
    """Serve the operator console (query parameters: start/end, token, refresh)."""
    return HTMLResponse(CONSOLE.read_text(encoding="utf-8"))
