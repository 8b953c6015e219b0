"""The HTTP collector: ``POST /api/v1/events`` puts a batch of events into Kafka and answers once it is durable.

A request's body is a JSON array of event objects (``application/json``) or JSON lines (``application/x-ndjson``),
optionally gzip-compressed (``Content-Encoding: gzip``). Each record goes the way a line of ``trends ingest file``
goes: :func:`ingestion.validate.encode_json` on its original bytes, then the one :class:`~ingestion.producer.
EventProducer` (idempotent, acks=all), valid events to the events topic and rejects with their reason to the
dead-letter topic. The answer (200, with the accepted and rejected counts and each reject's reason) is sent only
after Kafka acknowledged every record of the request; a delivery that fails or does not finish within
``collector.delivery_timeout_s`` is a 503 with ``Retry-After``. Events carry ids (derived from the content when
absent), so a retried request is dropped downstream by the layers' dedupe instead of counted twice.

This module is the app: the token, the limits, validation and the answers. The body is read by
:mod:`ingestion.collector_body`; the records are produced and their acks awaited by
:mod:`ingestion.collector_delivery` (one producer thread, as in a replay). Limits: the body size (checked on
``Content-Length``, then counted as read and as inflated, so a gzip bomb is bounded too), the records per request, a
token bucket of events per second, and the producer's local queue (a 429 when it is full).

This app is its own process (``trends collect``), apart from the query API: serving never imports ingestion.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime.
import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel

from infra.errors import TrendsError
from infra.security import bearer_refusal
from infra.settings import Settings
from ingestion.collector_body import (
    BodyFormat,
    Refusal,
    body_format,
    content_length_refusal,
    inflate,
    read_body,
    records,
)
from ingestion.collector_delivery import Answer, Batch, DeliveryFailedError, ProducerLoop
from ingestion.pseudonyms import KnownPairs
from ingestion.validate import Context, Encoded, Reject, encode_json, encode_json_fast

logger = logging.getLogger(__name__)

EVENTS_PATH: Final = "/api/v1/events"
SOURCE: Final = "collector"  # the dead-letter records' source; their line is the record's 1-based position
QUEUE_FULL_RETRY_AFTER_S: Final = 1

# name -> help of every metric the collector exports (docs/metrics.md lists them).
METRICS: Final = {
    "trends_collector_requests_total": "Requests to POST /api/v1/events, by the status they were answered with.",
    "trends_collector_events_total": "Records of answered requests: accepted (events acknowledged on the events "
    "topic) or rejected (acknowledged on the dead-letter topic).",
    "trends_collector_request_seconds": "Time from a request's arrival to its answer, Kafka's acknowledgements "
    "included.",
}


# -- the rate limit ----------------------------------------------------------------------------------------------


class TokenBucket:
    """Events per second with a burst: a request takes one token per record, or is told how long to wait.

    Used from the event loop's thread only (no lock).
    """

    def __init__(self, rate: float, burst: int, clock: Any = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.clock = clock
        self.last = clock()

    def take(self, n: int) -> float:
        """Take ``n`` tokens and return 0, or take none and return the seconds until ``n`` would be there."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if n <= self.tokens:
            self.tokens -= n
            return 0.0
        if n > self.burst:
            return math.inf
        return (n - self.tokens) / self.rate


# -- the app -----------------------------------------------------------------------------------------------------


class ErrorOut(BaseModel):
    """The body of every refusal: what went wrong, naming the setting when a limit did."""

    detail: str


@dataclass
class CollectorMetrics:
    """The collector's Prometheus metrics, in a registry of its own."""

    registry: CollectorRegistry
    requests: Counter
    events: Counter
    seconds: Histogram

    @classmethod
    def create(cls) -> "CollectorMetrics":
        """Return the metrics, every status and outcome of the documented ones starting at 0."""
        registry = CollectorRegistry()
        requests = Counter(
            "trends_collector_requests",
            METRICS["trends_collector_requests_total"],
            ["status"],
            registry=registry,
        )
        for status in ("200", "400", "401", "403", "413", "415", "429", "503"):
            requests.labels(status)
        events = Counter(
            "trends_collector_events", METRICS["trends_collector_events_total"], ["outcome"], registry=registry
        )
        for outcome in ("accepted", "rejected"):
            events.labels(outcome)
        seconds = Histogram(
            "trends_collector_request_seconds",
            METRICS["trends_collector_request_seconds"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        return cls(registry, requests, events, seconds)


def _error(description: str, *headers: str) -> dict[str, Any]:
    docs = {
        "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}},
        "WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}},
    }
    out: dict[str, Any] = {"model": ErrorOut, "description": description}
    if headers:
        out["headers"] = {h: docs[h] for h in headers}
    return out


def _request_body(settings: Settings) -> dict[str, Any]:
    limit = settings.collector.max_records
    event = (
        "An event object: `id` (optional; derived from the content when absent, so a retry dedupes), `ts` "
        "(ISO-8601 with an offset, or epoch seconds or milliseconds), `item`, `user`, `value`, `dims`. Any element "
        "that is not a valid event is answered as a reject (with its reason) and goes to the dead-letter topic."
    )
    return {
        "required": True,
        "description": f"At most {limit} records and `collector.max_body_bytes` bytes (also after gzip).",
        "content": {
            "application/json": {"schema": {"type": "array", "maxItems": limit, "items": {"description": event}}},
            "application/x-ndjson": {
                "schema": {"description": "One event object per line (blank lines skipped); other lines are rejects."}
            },
        },
    }


class Collector:
    """What a request goes through: the token, the body's limits, validation, the rate limit, the producer."""

    def __init__(self, settings: Settings, producer_config: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.cfg = settings.collector
        secret = settings.serving.api_token
        self.token = secret.get_secret_value() if secret is not None else None
        self.metrics = CollectorMetrics.create()
        self.bucket = TokenBucket(self.cfg.rate_limit_events_s, self.cfg.rate_limit_burst)
        self.skew = timedelta(seconds=settings.ingest.max_future_skew_s)
        self.producer_config = producer_config
        self.loop: ProducerLoop | None = None
        # the (user, hour) pairs this process recorded: a record of one is encoded with its pseudonym at once
        cache = settings.privacy.pseudonym_cache_size
        self._known = KnownPairs(cache) if settings.privacy.pseudonymise and cache > 0 else None

    def validate(self, body: bytes, fmt: BodyFormat) -> tuple[list[tuple[int, Encoded | Reject]], frozenset[int]]:
        """Split a body into records and validate each as a file line is (``index + 1`` as its line).

        :returns: the outcomes, and the positions of events already encoded with their pseudonyms: a record in the
            event's own form whose (user, hour) this process had recorded (:class:`KnownPairs`).
        """
        ctx = Context(source=SOURCE, now=datetime.now(UTC), max_future_skew=self.skew)
        key_field = self.settings.ingest.key_field
        fuse = self._known_lookup()
        out: list[tuple[int, Encoded | Reject]] = []
        fused: set[int] = set()
        for index, raw, size in records(body, fmt, self.cfg.max_records):
            done = encode_json_fast(raw, ctx, key_field, fuse) if fuse is not None and size is None else None
            if done is not None:
                fused.add(len(out))
                out.append((index, done))
            else:
                out.append((index, encode_json(raw, ctx, key_field, index + 1, size=size)))
        return out, frozenset(fused)

    def _known_lookup(self) -> Callable[[str, int], str | None] | None:
        """Return the lookup of the known pairs, dropped first if the store's memory turned (None: nothing known)."""
        known, loop = self._known, self.loop
        pseudonymiser = loop.producer.pseudonymiser if loop is not None else None
        if known is None or pseudonymiser is None:
            return None
        try:
            known.refresh(pseudonymiser)
        except TrendsError:  # the store cannot open: nothing is fused, and pseudonymise answers the 503
            return None
        return known.lookup()

    def pseudonymise(
        self, outcomes: list[tuple[int, Encoded | Reject]], fused: frozenset[int] = frozenset()
    ) -> list[tuple[int, Encoded | Reject]]:
        """Replace the events' users by their pseudonyms (their hours recorded first), with ``privacy.pseudonymise``.

        Run on the request's own thread: requests resolve their users concurrently, and the producer's thread
        only produces. The events at ``fused`` carry theirs already; the pairs recorded here are remembered.

        :raises Refusal: 503 when the subject store does not answer (nothing of the request is produced).
        """
        key_field = self.settings.ingest.key_field
        pseudonymiser = self._loop().producer.pseudonymiser
        at = [i for i, (_index, done) in enumerate(outcomes) if i not in fused and not isinstance(done, Reject)]
        if pseudonymiser is None or not at:
            return outcomes
        learned: dict[tuple[str, int], str] | None = {} if self._known is not None else None
        try:
            events = pseudonymiser.encoded([cast("Encoded", outcomes[i][1]) for i in at], key_field, learned)
        except TrendsError as exc:  # the store did not answer, or the subject key is missing
            logger.warning("503 for a request of %d records: %s", len(outcomes), exc)
            msg = "the subject store (Cassandra) did not answer; send the same request again"
            raise Refusal(503, msg, {"Retry-After": str(self.cfg.retry_after_s)}) from None
        if self._known is not None and learned:
            self._known.learn(learned)
        for i, event in zip(at, events, strict=True):
            outcomes[i] = (outcomes[i][0], event)
        return outcomes

    async def respond(self, request: Request) -> Response:
        """Answer a request, counting it in the metrics."""
        began = time.perf_counter()
        try:
            answer = await self.handle(request)
            response: Response = JSONResponse(answer.model_dump())
            self.metrics.events.labels("accepted").inc(answer.accepted)
            self.metrics.events.labels("rejected").inc(answer.rejected)
        except Refusal as refusal:
            response = JSONResponse({"detail": refusal.detail}, status_code=refusal.status, headers=refusal.headers)
        self.metrics.requests.labels(str(response.status_code)).inc()
        self.metrics.seconds.observe(time.perf_counter() - began)
        return response

    async def handle(self, request: Request) -> Answer:
        """Return the answer to a request once Kafka acknowledged all its records.

        :raises Refusal: for a request refused as a whole (its status says why).
        """
        cfg = self.cfg
        refused = bearer_refusal(request.headers.get("authorization"), self.token)
        if refused == 401:
            raise Refusal(401, "this collector needs `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})
        if refused == 403:
            raise Refusal(403, "the bearer token is not the one configured (serving.api_token)")
        fmt = body_format(request.headers.get("content-type"))
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in {"identity", "gzip", "x-gzip"}:
            msg = f"Content-Encoding {encoding!r} is not supported: send gzip or nothing"
            raise Refusal(415, msg)
        early = content_length_refusal(request.headers.get("content-length"), cfg.max_body_bytes)
        if early is not None:
            raise early
        body = await read_body(request.stream(), cfg.max_body_bytes)
        if encoding != "identity":
            body = await run_in_threadpool(inflate, body, cfg.max_body_bytes)
        outcomes, fused = await run_in_threadpool(self.validate, body, fmt)
        self._admit(len(outcomes))
        outcomes = await run_in_threadpool(self.pseudonymise, outcomes, fused)
        batch = Batch(outcomes)
        self._loop().submit(batch)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(batch.answer), cfg.delivery_timeout_s)
        except (TimeoutError, DeliveryFailedError) as exc:
            logger.warning("503 for a request of %d records: %s", len(outcomes), str(exc) or "delivery timed out")
            msg = "Kafka did not acknowledge every record in time; send the same request again"
            raise Refusal(503, msg, {"Retry-After": str(cfg.retry_after_s)}) from None

    def _admit(self, n: int) -> None:
        """Take ``n`` events from the rate limit and the producer's queue, or refuse the request."""
        cfg = self.cfg
        wait = self.bucket.take(n)
        if math.isinf(wait):
            msg = f"{n} records is more than collector.rate_limit_burst ({cfg.rate_limit_burst})"
            raise Refusal(413, msg)
        if wait:
            msg = f"over the rate limit of {cfg.rate_limit_events_s:g} events/s (collector.rate_limit_events_s)"
            raise Refusal(429, msg, {"Retry-After": str(max(1, math.ceil(wait)))})
        loop = self._loop()
        if loop.queued() + n > loop.queue_limit:
            msg = "the producer's queue is full (Kafka is slower than the clients); retry shortly"
            raise Refusal(429, msg, {"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)})

    def _loop(self) -> ProducerLoop:
        if self.loop is None:
            msg = "the collector's producer runs only inside the app's lifespan"
            raise RuntimeError(msg)
        return self.loop

    @asynccontextmanager
    async def running(self, _: FastAPI) -> AsyncIterator[None]:
        """Run the producer's thread while the app runs; flush it at the end."""
        self.loop = ProducerLoop(self.settings, self.producer_config)
        self.loop.start()
        try:
            yield
        finally:
            await run_in_threadpool(self.loop.close, self.cfg.delivery_timeout_s + 5)


def create_app(settings: Settings, *, producer_config: dict[str, Any] | None = None) -> FastAPI:
    """Build the collector app for these settings.

    :arg producer_config: extra librdkafka properties of its producer (tests, benchmarks).
    """
    collector = Collector(settings, producer_config)
    app = FastAPI(
        title="trends collector",
        summary="Events over HTTP into the events topic, each answered once Kafka acknowledged it.",
        version="1",
        lifespan=collector.running,
    )
    app.state.collector = collector

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            if collector.token is not None:  # the bearer scheme, so clients and contract tests know it is needed
                schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                    "type": "http",
                    "scheme": "bearer",
                }
                schema["paths"][EVENTS_PATH]["post"]["security"] = [{"bearer": []}]
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]

    @app.post(
        EVENTS_PATH,
        response_model=Answer,
        summary="Post a batch of events",
        description="Validates every record as `trends ingest file` does and answers once Kafka acknowledged all "
        "of them (acks=all): valid events on the events topic, rejects with their reason on the dead-letter "
        "topic. A 503 means some record may not be durable: send the same request again (events with the same "
        "`id` are counted once).",
        openapi_extra={"requestBody": _request_body(settings)},
        responses=RESPONSES,
    )
    async def post_events(request: Request) -> Response:
        return await collector.respond(request)

    @app.get("/health", summary="Liveness: the process answers.")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", summary="Prometheus metrics of this collector.", response_class=Response)
    async def prometheus() -> Response:
        return Response(generate_latest(collector.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    400: _error("The body is not JSON (or not a JSON array), or not valid gzip."),
    401: _error("`serving.api_token` is set and the request has no `Authorization: Bearer`.", "WWW-Authenticate"),
    403: _error("The bearer token is not `serving.api_token`."),
    413: _error(
        "The body is over `collector.max_body_bytes` (sent or inflated), or it carries more records than "
        "`collector.max_records` (or than `collector.rate_limit_burst` while a rate limit is set)."
    ),
    415: _error(
        "A Content-Type other than application/json or application/x-ndjson, a charset other than UTF-8, or a "
        "Content-Encoding other than gzip."
    ),
    429: _error(
        "Over the rate limit (`collector.rate_limit_events_s`) or the producer's queue is full.", "Retry-After"
    ),
    503: _error(
        "Kafka did not acknowledge every record within `collector.delivery_timeout_s`, or the subject store "
        "(Cassandra) did not answer for the users' pseudonyms.",
        "Retry-After",
    ),
}
