"""The HTTP API and dashboard app: ``create_app(settings)`` builds it over one Cassandra backend.

The app holds one Cassandra session for its lifetime (:mod:`serving.backend`: connected lazily and reconnected, at
most every ``serving.cassandra_retry_s``, while Cassandra is unreachable) shared by every request through one
:class:`~serving.reader.ViewReader`. Its routes are :mod:`serving.routes`; refusals and the 503 of unreadable views
are :mod:`serving.errors`; its metrics :mod:`serving.metrics`; its OpenAPI document :mod:`serving.openapi`. More
concurrent queries than ``serving.max_concurrent_requests`` are refused with a 429.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime, some of them local.
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from infra.settings import Settings
from serving.backend import Backend
from serving.errors import BUSY_RETRY_AFTER_S, RETRY_AFTER_S, UNAVAILABLE, CassandraUnavailableError
from serving.metrics import Metrics
from serving.openapi import API_PREFIX, document
from serving.routes import ApiContext, ops, router

logger = logging.getLogger(__name__)


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
