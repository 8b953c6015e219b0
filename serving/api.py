"""The HTTP API and dashboard: merged answers over both views, health, readiness and Prometheus metrics.

``create_app(settings)`` builds a FastAPI app that holds one Cassandra session for its lifetime (connected lazily
and reconnected, at most every ``serving.cassandra_retry_s``, while Cassandra is unreachable) and gives each request
a :class:`~serving.store.ViewReader` of its own over it. Every query endpoint answers with the provenance, the gaps and
the error bounds of :mod:`serving.queries`. Refusals are 4xx with a message naming the parameter or the setting; an
unreachable or failing Cassandra is a 503 with ``Retry-After`` and a generic reason (the details go to the log),
never a 500. More concurrent queries than ``serving.max_concurrent_requests`` are refused with a 429.

The OpenAPI document tells the truth: each parameter's schema carries the exact constraint the server checks (the
same patterns, built from the settings), every answer's status codes are listed with their body's model, and the
rules that span parameters, which OpenAPI cannot express, are stated in each operation's description.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime, some of them local.
import gc
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Annotated, Any, Literal

from cassandra import DriverException, RequestExecutionException
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from pydantic import BaseModel

from infra.cassandra import make_cluster
from infra.settings import Settings
from serving import console, params, queries
from serving.merge import Resolution
from serving.store import ReadBudget, ReadBudgetExceededError, ViewReader
from views.buckets import MINUTE, floor

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
MAX_POINTS = 10_000  # of one series answer
RETRY_AFTER_S = 5  # told to clients while Cassandra is unavailable
BUSY_RETRY_AFTER_S = 1  # told to clients refused for too many concurrent queries
UNAVAILABLE = "the views are unavailable right now (the server log has the reason); retry later"


class ErrorBody(BaseModel):
    """The body of every refusal (400, 401, 429, 503): what went wrong, naming the parameter or the setting."""

    detail: str


def _error(description: str, retry: bool = False, auth: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"model": ErrorBody, "description": description}
    if retry:
        out["headers"] = {
            "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
        }
    if auth:
        out["headers"] = {"WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}}}
    return out


BAD_REQUEST: dict[int | str, dict[str, Any]] = {
    400: _error(
        "A parameter (named in the message) out of its range, or a rule spanning parameters broken: `last` and "
        "`start`/`end` together, only one of `start`/`end`, an empty, reversed or too long window, too many "
        "points, or more sketch bytes than `serving.max_read_mb`."
    )
}
UNAVAILABLE_503: dict[int | str, dict[str, Any]] = {
    503: _error("Cassandra is unreachable or the views are not set up.", retry=True)
}
QUERY_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("`serving.api_token` is set and the request lacks `Authorization: Bearer <token>`.", auth=True),
    429: _error("More concurrent queries than `serving.max_concurrent_requests`.", retry=True),
    **UNAVAILABLE_503,
}
WINDOW_RULES = (
    "The window is `last` (ending at the end of the current minute) or `start` and `end` together, never both; "
    f"neither means `last={params.DEFAULT_LAST}`. Times are floored to whole minutes; the window must not be "
    "empty and at most `serving.max_window_days` long. These rules span parameters, which OpenAPI cannot express: "
    "breaking one is a 400 naming the parameter."
)


class CassandraUnavailableError(RuntimeError):
    """The views cannot be read right now (the API answers 503 with this message)."""


def _driver_errors() -> tuple[type[BaseException], ...]:
    """Return what the driver raises when Cassandra cannot answer (all mapped to 503)."""
    return (NoHostAvailable, DriverException, RequestExecutionException, ConnectionException, OSError)


class Backend:
    """One Cassandra session for the app, connected on first use and retried with a pause while it fails."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._reader: ViewReader | None = None
        self._next_attempt = 0.0
        self.last_error: str | None = None

    @property
    def current(self) -> ViewReader | None:
        """Return the process's reader (its caches) if connected, without connecting."""
        return self._reader

    def reader(self) -> ViewReader:
        """Return the process's reader (shared by every request: it holds no state of a request).

        :raises CassandraUnavailableError: Cassandra is unreachable or the views are not migrated.
        """
        reader = self._reader
        if reader is not None:
            return reader
        with self._lock:
            return self._reader or self._connect()

    def _connect(self) -> ViewReader:
        now = time.monotonic()
        if now < self._next_attempt:
            raise CassandraUnavailableError(self.last_error or "Cassandra is unreachable")
        cluster = make_cluster(self.settings, connect_timeout=min(5.0, self.settings.cassandra.connect_timeout_s))
        try:
            self._reader = ViewReader(self.settings, cluster.connect())
        except Exception as exc:
            cluster.shutdown()
            self._next_attempt = now + self.settings.serving.cassandra_retry_s
            self.last_error = f"Cassandra at {self._where()}: {_reason(exc)}"
            logger.warning("cannot open the views: %s", self.last_error)
            raise CassandraUnavailableError(self.last_error) from exc
        self._cluster, self.last_error = cluster, None
        logger.info("serving the views of keyspace %s from %s", self.settings.cassandra.keyspace, self._where())
        return self._reader

    def ping(self) -> None:
        """Read one row of the watermark table (readiness).

        :raises CassandraUnavailableError: the read failed.
        """
        reader = self.reader()
        try:
            reader.ping(timeout=3.0)
        except _driver_errors() as exc:
            raise CassandraUnavailableError(_reason(exc)) from exc

    def _where(self) -> str:
        c = self.settings.cassandra
        return f"{','.join(c.contact_points)}:{c.port}"

    def close(self) -> None:
        """Shut the driver down."""
        with self._lock:
            if self._cluster is not None:
                self._cluster.shutdown()
            self._cluster, self._reader = None, None


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if ("Keyspace" in text and "does not exist" in text) or "unconfigured table" in text:
        return f"the views are not set up ({text}); run `trends stack init`"
    return f"{type(exc).__name__}: {text}"[:500]


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # set by `trends serve --workers N` (N > 1) to a fresh directory


def multiprocess() -> bool:
    """Tell whether this process is one of several workers whose metrics prometheus_client adds up in files."""
    return bool(os.environ.get(MULTIPROC_ENV))


class CacheMetrics:
    """The caches' sizes and outcomes as Prometheus metrics, brought up to date after each request and on scrape.

    Plain counters and gauges (not a collector reading the caches on scrape): with several workers a scrape is
    answered by one of them, and only metrics written to prometheus_client's files add up across all of them.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.row_bytes = Gauge(
            "trends_api_row_cache_bytes",
            "Bytes of view rows the caches hold (batch rows by run, speed minutes by count; serving.cache_mb).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.row_hits = Counter(
            "trends_api_row_cache_hits", "View-row reads answered from the cache.", registry=registry
        )
        self.row_misses = Counter("trends_api_row_cache_misses", "View-row reads sent to Cassandra.", registry=registry)
        self.answer_bytes = Gauge(
            "trends_api_answer_cache_bytes",
            "Bytes of merged answers the answer cache holds (serving.answer_cache_mb).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.answers = Counter(
            "trends_api_answers",
            "Questions by outcome: hit (a lookup), partial (batch part kept, changed speed minutes read), miss.",
            ["outcome"],
            registry=registry,
        )
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def _add(self, name: str, now: int, counter: Any) -> None:
        delta = now - self._seen.get(name, 0)
        if delta > 0:
            counter.inc(delta)
            self._seen[name] = now

    def sync(self, reader: ViewReader | None) -> None:
        """Copy the reader's cache figures into the metrics (counters by what changed since the last call)."""
        if reader is None:
            return
        with self._lock:
            caches = [c for c in (reader.cache, reader.speed_cache) if c is not None]
            self.row_bytes.set(sum(c.bytes for c in caches))
            self._add("row_hits", sum(c.hits for c in caches), self.row_hits)
            self._add("row_misses", sum(c.misses for c in caches), self.row_misses)
            answers = reader.answers
            if answers is not None:
                self.answer_bytes.set(answers.bytes)
                self._add("hit", answers.hits, self.answers.labels("hit"))
                self._add("partial", answers.partial, self.answers.labels("partial"))
                self._add("miss", answers.misses, self.answers.labels("miss"))


@dataclass
class Metrics:
    """Prometheus metrics of one app (own registry, so several apps can live in one process)."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    cassandra_up: Gauge
    cache: CacheMetrics
    gaps: Gauge

    @classmethod
    def create(cls) -> "Metrics":
        """Register the API's metrics (in this process's files too when several workers serve: :func:`multiprocess`)."""
        reg = CollectorRegistry()
        return cls(
            reg,
            Counter("trends_api_requests", "HTTP requests by route and status.", ["route", "status"], registry=reg),
            Histogram(
                "trends_api_request_seconds",
                "Request latency by route.",
                ["route"],
                buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
                registry=reg,
            ),
            Gauge(
                "trends_api_cassandra_up",
                "1 if the last Cassandra read succeeded.",
                registry=reg,
                multiprocess_mode="mostrecent",
            ),
            CacheMetrics(reg),
            Gauge(
                "trends_api_gap_minutes",
                "Minutes of the last 24 h (slice *) that answers report as gaps, by reason (read on scrape).",
                ["reason"],
                registry=reg,
                multiprocess_mode="mostrecent",
            ),
        )


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
    ) -> list[queries.Window]:
        """Merge the window's rows (and the ``before`` long window's just before it, if asked) for an answer.

        Rows are merged as they stream in, never all held, and the request may read at most
        ``serving.max_read_mb`` of sketches (a 400 past it).
        """
        windows = [(w.start, w.end)] if before is None else [(w.start, w.end), (w.start - before, w.start)]
        budget = ReadBudget(int(self.settings.serving.max_read_mb * 1024 * 1024))
        try:
            out = queries.load_many(
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
        except _driver_errors() as exc:
            raise CassandraUnavailableError(_reason(exc)) from exc
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
    if token is None:
        return
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(value.encode(), token.get_secret_value().encode()):
        raise HTTPException(401, "this API needs `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})


def _window(
    request: Request,
    last: Annotated[
        str | None,
        Query(
            description="Window ending at the end of the current minute: 15m, 1h, 24h, 7d (at most "
            "`serving.max_window_days`). Not with `start`/`end`; neither given means 1h."
        ),
    ] = None,
    start: Annotated[
        str | None,
        Query(description="Window start, ISO-8601 with an offset (2026-05-01T10:00Z), years 1970-2999; with `end`."),
    ] = None,
    end: Annotated[
        str | None, Query(description="Window end (exclusive), ISO-8601 with an offset; with `start`.")
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


@_query("/series", queries.Series, f" A series has at most {MAX_POINTS:,} points: ask a coarser `resolution`.")
def series(
    w: Win,
    ctx: Context,
    resolution: Annotated[Literal["minute", "hour", "day"], Query()] = "hour",
    item: Annotated[str | None, Query(max_length=256, description="Count only this item.")] = None,
) -> queries.Series:
    """Count events per minute, hour or day, of all items or of one."""
    points = (w.end - w.start) / queries.RESOLUTIONS[resolution]
    if points > MAX_POINTS:
        raise HTTPException(400, f"resolution: {points:.0f} points; ask for a coarser resolution")
    answer = "series_item" if item else "series"
    return queries.series(ctx.load(w, answer, coarsest=resolution, item=item or None)[0], resolution, item or None)


@router.get("/status")
def status(ctx: Context) -> dict[str, Any]:
    """Show the boundary between the layers, the pin, the speed layer's epochs and freshness, the stale hours."""
    now = datetime.now(UTC)
    try:
        reader = ctx.backend.reader()
        cov = reader.coverage(floor(now, MINUTE), floor(now, MINUTE) + MINUTE, "*")
        stale = reader.stale_hours()
        pin = queries.pin_effect(reader) if cov.pinned else None
        losses, incomplete = queries.losses(reader, now)
    except _driver_errors() as exc:
        raise CassandraUnavailableError(_reason(exc)) from exc
    newest = cov.speed_newest_event
    return {
        "now": now,
        "boundary": cov.boundary,
        "boundary_pinned": cov.pinned,
        "batch_low": cov.batch_low,
        "speed_newest_event": newest,
        "speed_updated_at": cov.speed_updated_at,
        "speed_lag_s": None if newest is None else round((now - newest).total_seconds(), 3),
        # the checkpoint lifetimes of the speed layer: a minute is answered by the newest epoch that counts it
        "speed_epochs": [
            {
                "epoch": e.id,
                "started_at": e.started_at,
                "covered_from": e.covered_from,
                "seen_until": e.seen_until,
                "starting_offsets": e.starting_offsets,
            }
            for e in cov.speed.epochs
        ],
        # a pin below the watermark hands [pin, watermark) to the speed view: is it still covered there?
        "pin": pin,
        "slice_dims": ctx.settings.views.slice_dims,
        "refresh_s": ctx.settings.serving.dashboard_refresh_s,
        # hours whose records grew after their batch run (late data): served as they were until recomputed
        "stale_hours": [{"hour": h, "records_since": n} for h, n in stale.items()],
        # records removed from Kafka before the index read them, and the hours they may belong to (not accepted)
        "losses": losses,
        "incomplete_hours": incomplete,
    }


@router.get("/console", responses=BAD_REQUEST, description=console.RANGE_RULES)
def console_answer(
    ctx: Context,
    start: Annotated[
        str | None, Query(description="First hour (floored), ISO-8601 with an offset; with `end`.")
    ] = None,
    end: Annotated[
        str | None, Query(description="End (exclusive, rounded up to an hour), ISO-8601; with `start`.")
    ] = None,
) -> dict[str, Any]:
    """Explain each hour of a range (the operator console): batch run, speed coverage, gaps, and what feeds them."""
    try:
        lo, hi = console.hour_range(start, end, datetime.now(UTC))
    except params.BadQueryError as exc:
        raise _bad(exc) from None
    try:
        return console.build(ctx.backend.reader(), lo, hi)
    except _driver_errors() as exc:
        raise CassandraUnavailableError(_reason(exc)) from exc


ops = APIRouter(tags=["ops"])


@ops.get("/health")
def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@ops.get("/ready", responses=UNAVAILABLE_503)
def ready(ctx: Context) -> dict[str, str]:
    """Readiness: the views can be read (a 503 says only that; the reason goes to the server log)."""
    ctx.backend.ping()
    ctx.metrics.cassandra_up.set(1)
    return {"status": "ready"}


@ops.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
)
def prometheus(ctx: Context) -> Response:
    """Prometheus text: requests and latency by route, Cassandra up, the batch-row cache, gaps by reason."""
    unavailable: tuple[type[BaseException], ...] = (CassandraUnavailableError, *_driver_errors())
    try:
        gaps = queries.gap_minutes(ctx.backend.reader(), datetime.now(UTC))
    except unavailable as exc:  # the scrape still answers; the gaps keep their last values
        logger.warning("gap minutes not read: %s", _reason(exc))
        ctx.metrics.cassandra_up.set(0)
    else:
        ctx.metrics.cassandra_up.set(1)
        for reason, minutes in gaps.items():
            ctx.metrics.gaps.labels(reason).set(minutes)
    ctx.metrics.cache.sync(ctx.backend.current)
    if multiprocess():  # every worker's figures, added up from prometheus_client's files
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


def create_app(settings: Settings) -> FastAPI:
    """Build the API and dashboard app for these settings."""
    backend = Backend(settings)
    metrics = Metrics.create()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with suppress(CassandraUnavailableError):
            backend.reader()  # connect eagerly when possible; a failure only makes /ready answer 503
        # The modules, the app and the driver live as long as the process: keep them out of the collector's full
        # passes, which otherwise walk them all every few hundred requests (a pause of tens of ms on a busy host).
        gc.collect()
        gc.freeze()
        yield
        backend.close()

    app = FastAPI(
        title="trends",
        summary="Trending, top-N, uniques, quantiles and series over the merged batch and speed views.",
        version="1",
        lifespan=lifespan,
    )
    app.state.context = ApiContext(settings, backend, metrics)

    busy = {"queries": 0}  # query requests in flight (the event loop's thread only: no lock needed)
    limit = settings.serving.max_concurrent_requests

    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        began = time.perf_counter()
        query = request.url.path.startswith(API_PREFIX + "/")
        if query and busy["queries"] >= limit:
            metrics.requests.labels("refused", "429").inc()
            return JSONResponse(
                {"detail": f"more than {limit} queries at once (serving.max_concurrent_requests); retry shortly"},
                status_code=429,
                headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
            )
        if query:
            busy["queries"] += 1
        try:
            response = await call_next(request)
        finally:
            if query:
                busy["queries"] -= 1
                metrics.cache.sync(backend.current)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        metrics.requests.labels(route, str(response.status_code)).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - began)
        return response

    @app.exception_handler(CassandraUnavailableError)
    async def unavailable(request: Request, exc: CassandraUnavailableError) -> JSONResponse:
        metrics.cassandra_up.set(0)
        logger.warning("503 for %s: %s", request.url.path, exc)  # the reason (contact points, driver error): log only
        return JSONResponse({"detail": UNAVAILABLE}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    app.include_router(router)
    app.include_router(ops)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document(FastAPI.openapi(app), settings)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def app_from_env() -> FastAPI:
    """Build the app from ``TRENDS_*`` variables (the factory of each worker of ``trends serve --workers N``)."""
    return create_app(Settings())


def parameter_schemas(settings: Settings) -> dict[str, dict[str, Any]]:
    """Return the schema of each query parameter: the exact constraint the server checks, built from the settings."""
    duration = {"type": "string", "pattern": params.duration_pattern(settings.serving.max_window_days)}
    limit = {"type": "integer", "minimum": 1, "maximum": settings.serving.max_limit, "default": 10}
    return {
        "last": duration,
        "baseline": {**duration, "default": settings.serving.default_baseline},
        "start": {"type": "string", "pattern": params.TIME_PATTERN},
        "end": {"type": "string", "pattern": params.TIME_PATTERN},
        "slice": {"type": "string", "pattern": params.slice_pattern(settings), "default": "*"},
        "limit": limit,
        "top": limit,
        "rank": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 100},
    }


def document(schema: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Put the settings' constraints into the parameters of an OpenAPI document, and the bearer scheme if needed."""
    exact = parameter_schemas(settings)
    for path, operations in schema.get("paths", {}).items():
        for op in operations.values():
            for parameter in op.get("parameters", []):
                if parameter.get("in") == "query" and parameter["name"] in exact:
                    parameter["schema"] = {**exact[parameter["name"]], "title": parameter["name"]}
            if settings.serving.api_token is not None and path.startswith(API_PREFIX + "/"):
                op["security"] = [{"bearer": []}]
    if settings.serving.api_token is not None:
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
        }
    return schema
