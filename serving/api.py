"""The HTTP API and dashboard: merged answers over both views, health, readiness and Prometheus metrics.

``create_app(settings)`` builds a FastAPI app that holds one Cassandra session for its lifetime (connected lazily
and reconnected, at most every ``serving.cassandra_retry_s``, while Cassandra is unreachable) and gives each request
a fresh :class:`~serving.store.ViewReader` over it. Every query endpoint answers with the provenance, the gaps and
the error bounds of :mod:`serving.queries`. Refusals are 4xx with a message naming the parameter; an unreachable or
failing Cassandra is a 503 with the reason, never a 500.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime, some of them local.
import gc
import logging
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

from infra.cassandra import READ_PROFILE, make_cluster, table
from infra.settings import Settings
from serving import params, queries
from serving.merge import MINUTE, floor
from serving.store import RowCache, ViewReader

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
MAX_POINTS = 10_000  # of one series answer


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
    def cache(self) -> RowCache | None:
        """Return the batch-row cache shared by this process's readers (None before connecting or when disabled)."""
        return self._reader.cache if self._reader is not None else None

    def reader(self) -> ViewReader:
        """Return a per-request reader.

        :raises CassandraUnavailableError: Cassandra is unreachable or the views are not migrated.
        """
        with self._lock:
            reader = self._reader or self._connect()
            return reader.fresh()

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
            reader.sess.execute(
                f"SELECT name FROM {table(self.settings, 'batch_watermark')} LIMIT 1",
                execution_profile=READ_PROFILE,
                timeout=3.0,
            )
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


@dataclass
class Metrics:
    """Prometheus metrics of one app (own registry, so several apps can live in one process)."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    cassandra_up: Gauge
    cache: Gauge

    @classmethod
    def create(cls) -> "Metrics":
        """Register the API's metrics."""
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
            Gauge("trends_api_cassandra_up", "1 if the last Cassandra read succeeded.", registry=reg),
            Gauge(
                "trends_api_row_cache",
                "Batch-row cache: bytes held, hits and misses since start (serving.cache_mb).",
                ["what"],
                registry=reg,
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


class Views:
    """What a request reads through: the app's backend and metrics."""

    def __init__(self, settings: Settings, backend: Backend, metrics: Metrics) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = metrics

    def load(
        self, w: WindowQuery, answer: str, coarsest: str = "day", before: timedelta | None = None
    ) -> list[queries.Window]:
        """Read the window (and the ``before`` long one just before it, if asked) for an answer."""
        windows = [(w.start, w.end)] if before is None else [(w.start, w.end), (w.start - before, w.start)]
        try:
            out = queries.load_many(self.backend.reader(), windows, w.slice, coarsest, queries.NEEDS[answer])
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


def _views(request: Request) -> Views:
    return request.app.state.views  # type: ignore[no-any-return]


def _authorize(request: Request) -> None:
    token = request.app.state.views.settings.serving.api_token
    if token is None:
        return
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(value.encode(), token.get_secret_value().encode()):
        raise HTTPException(401, "this API needs `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})


def _window(
    request: Request,
    last: Annotated[str | None, Query(description="Window ending now: 15m, 1h, 24h, 7d.")] = None,
    start: Annotated[str | None, Query(description="Window start, ISO-8601 with offset (2026-05-01T10:00Z).")] = None,
    end: Annotated[str | None, Query(description="Window end (exclusive), ISO-8601 with offset.")] = None,
    slice_: Annotated[str, Query(alias="slice", description="`*` or a slice like origin=JFK.")] = "*",
) -> WindowQuery:
    settings = _views(request).settings
    try:
        t0 = params.parse_time("start", start) if start else None
        t1 = params.parse_time("end", end) if end else None
        name = params.slice_name(settings, slice_)
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
Reader = Annotated[Views, Depends(_views)]
Ranks = Annotated[list[float] | None, Query(description="Quantile ranks in [0, 1] (repeat the parameter).")]

router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(_authorize)], tags=["queries"])


@router.get("/count", response_model=queries.Count)
def count(w: Win, v: Reader) -> queries.Count:
    """Count the events of a window (exact)."""
    return queries.count(v.load(w, "count")[0])


@router.get("/users", response_model=queries.Users)
def users(w: Win, v: Reader) -> queries.Users:
    """Estimate the distinct users of a window (HLL, with 95% bounds)."""
    return queries.users(v.load(w, "users")[0])


@router.get("/quantiles", response_model=queries.Quantiles)
def quantiles(w: Win, v: Reader, rank: Ranks = None) -> queries.Quantiles:
    """Estimate value quantiles of a window at any ranks (KLL, with its rank error)."""
    return queries.quantiles(v.load(w, "quantiles")[0], _ranks(rank))


@router.get("/top", response_model=queries.Top)
def top(w: Win, v: Reader, limit: int = 10) -> queries.Top:
    """List the top-N items of a window with their count bounds (frequent items)."""
    return queries.top(v.load(w, "top")[0], v.limit("limit", limit))


@router.get("/summary", response_model=queries.Summary)
def summary(w: Win, v: Reader, rank: Ranks = None, top: int = 10) -> queries.Summary:
    """Answer count, users, quantiles and top items of a window at once."""
    return queries.summary(v.load(w, "summary")[0], _ranks(rank), v.limit("top", top))


@router.get("/trending", response_model=queries.Trending)
def trending(
    w: Win,
    v: Reader,
    baseline: Annotated[str | None, Query(description="Baseline length before the window, e.g. 24h.")] = None,
    limit: int = 10,
    min_support: Annotated[int, Query(ge=1, description="Least events of an item in the window.")] = 5,
) -> queries.Trending:
    """Rank the items rising in the window against the baseline before it (lift, minimum support)."""
    try:
        base_len = params.duration(v.settings, "baseline", baseline or v.settings.serving.default_baseline)
    except params.BadQueryError as exc:
        raise _bad(exc) from None
    n = v.limit("limit", limit)
    recent, base = v.load(w, "trending", before=base_len)
    return queries.trending(recent, base, n, min_support)


@router.get("/series", response_model=queries.Series)
def series(
    w: Win,
    v: Reader,
    resolution: Annotated[Literal["minute", "hour", "day"], Query()] = "hour",
    item: Annotated[str | None, Query(max_length=256, description="Count only this item.")] = None,
) -> queries.Series:
    """Count events per minute, hour or day, of all items or of one."""
    points = (w.end - w.start) / queries.RESOLUTIONS[resolution]
    if points > MAX_POINTS:
        raise HTTPException(400, f"resolution: {points:.0f} points; ask for a coarser resolution")
    answer = "series_item" if item else "series"
    return queries.series(v.load(w, answer, coarsest=resolution)[0], resolution, item)


@router.get("/status")
def status(v: Reader) -> dict[str, Any]:
    """Show the boundary between the layers, the pin, the speed layer's freshness and the stale batch hours."""
    now = datetime.now(UTC)
    try:
        reader = v.backend.reader()
        cov = reader.coverage(floor(now, MINUTE), floor(now, MINUTE) + MINUTE, "*")
        stale = reader.stale_hours()
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
        "slice_dims": v.settings.views.slice_dims,
        "refresh_s": v.settings.serving.dashboard_refresh_s,
        # hours whose records grew after their batch run (late data): served as they were until recomputed
        "stale_hours": [{"hour": h, "records_since": n} for h, n in stale.items()],
    }


ops = APIRouter(tags=["ops"])


@ops.get("/health")
def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@ops.get("/ready", responses={503: {"description": "Cassandra unreachable or the views not set up"}})
def ready(v: Reader) -> dict[str, str]:
    """Readiness: the views can be read."""
    v.backend.ping()
    v.metrics.cassandra_up.set(1)
    return {"status": "ready"}


@ops.get("/metrics", response_class=Response)
def prometheus(v: Reader) -> Response:
    """Prometheus text: requests and latency by route, Cassandra up, the batch-row cache."""
    cache = v.backend.cache
    if cache is not None:
        for what, value in (("bytes", cache.bytes), ("hits", cache.hits), ("misses", cache.misses)):
            v.metrics.cache.labels(what).set(value)
    return Response(generate_latest(v.metrics.registry), media_type=CONTENT_TYPE_LATEST)


DASHBOARD = resources.files("serving").joinpath("static/dashboard.html")


@ops.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    """Serve the dashboard (query parameters: last or start/end, baseline, slice, limit, token, refresh)."""
    return HTMLResponse(DASHBOARD.read_text(encoding="utf-8"))


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
    app.state.views = Views(settings, backend, metrics)

    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        began = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        metrics.requests.labels(route, str(response.status_code)).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - began)
        return response

    @app.exception_handler(CassandraUnavailableError)
    async def unavailable(_: Request, exc: CassandraUnavailableError) -> JSONResponse:
        metrics.cassandra_up.set(0)
        return JSONResponse(
            {"detail": f"the views are unavailable: {exc}"}, status_code=503, headers={"Retry-After": "5"}
        )

    app.include_router(router)
    app.include_router(ops)
    return app
