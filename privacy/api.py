"""The HTTP routes of erasure: ``POST /api/v1/privacy/forget`` and ``GET /api/v1/privacy/status``, behind the API token.

:func:`router` builds them for a settings tree; ``app/`` mounts them into the API app (serving may not import this
layer). Answers name subjects by their keyed hash only, and the server log never holds the user id of a request.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime.
import logging
import secrets
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, StrictBool, StringConstraints

from infra.privacy.ledger import RequestInfo
from infra.settings import Settings

logger = logging.getLogger(__name__)

PREFIX = "/api/v1/privacy"
RETRY_AFTER_S = 5
UNAVAILABLE = "erasure is unavailable right now (the server log has the reason); retry later"


# The user id as events carry it (views.event's limit; that module is not imported here: it reaches for pyspark).
MAX_USER_CHARS = 128
User = Annotated[str, StringConstraints(min_length=1, max_length=MAX_USER_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$")]


class ErrorBody(BaseModel):
    """A refusal: what went wrong."""

    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorBody,
        "description": "`serving.api_token` is set and the request lacks `Authorization: Bearer <token>`.",
        "headers": {"WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}}},
    },
    503: {
        "model": ErrorBody,
        "description": "Cassandra is unreachable, or the subject key or the privacy tables are not set up.",
        "headers": {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}},
    },
}


BAD_BODY: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not JSON (FastAPI's parse error)."},
}


class ForgetBody(BaseModel):
    """Who to forget, and how."""

    user: User = Field(description="The user id as producers send it (never logged, never returned).")
    exclude: StrictBool | None = Field(
        None,
        description="Also exclude the user's events from the views (a recompute of its hours); default: "
        "`privacy.exclude_on_forget`.",
    )


class ForgetAnswer(BaseModel):
    """What the forget did (see `trends privacy forget`)."""

    outcome: str = Field(
        description="forgotten, pending_recompute, no_data, already_forgotten, in_progress or resumed."
    )
    message: str
    subject_hash: str = Field(description="The keyed hash of the user (the ledger's name for it).")
    request_id: str | None
    mode: str | None
    state: str | None
    pending: bool
    hours: int = Field(description="Hours that held the user's events.")
    new_entries: list[int] = Field(description="Ledger entries written by this call.")
    runs: list[str] = Field(description="Recompute runs started by this call.")


class StatusAnswer(BaseModel):
    """The erasure requests: counts, the oldest pending one's age, the newest requests (pending first)."""

    pending: int
    done: int
    failed: int
    oldest_pending_age_s: float | None
    deadline_days: float
    requests: list[RequestInfo]


class _Sessions:
    """One Cassandra session for the routes, connected on first use and again after a failure."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.cluster: Any = None
        self.sess: Any = None

    def get(self) -> Any:
        from infra.cassandra import make_cluster  # noqa: PLC0415

        with self.lock:
            if self.sess is None:
                cluster = make_cluster(self.settings)
                try:
                    self.sess = cluster.connect()
                except Exception:
                    cluster.shutdown()
                    raise
                self.cluster = cluster
            return self.sess

    def reset(self) -> None:
        with self.lock:
            if self.cluster is not None:
                self.cluster.shutdown()
            self.cluster = self.sess = None


def router(settings: Settings) -> APIRouter:
    """Return the erasure routes for these settings (the app's lifespan does not own their session: it is lazy)."""
    token = settings.serving.api_token
    sessions = _Sessions(settings)

    def authorize(request: Request) -> None:
        if token is None:
            return
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(value.encode(), token.get_secret_value().encode()):
            raise HTTPException(401, "this API needs `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})

    def unavailable(what: str, exc: Exception) -> HTTPException:
        # The driver's error names hosts; a TrendsError may name a file: both stay in the log.
        logger.warning("privacy %s answered 503: %s: %s", what, type(exc).__name__, str(exc)[:300])
        sessions.reset()
        return HTTPException(503, UNAVAILABLE, {"Retry-After": str(RETRY_AFTER_S)})

    api = APIRouter(prefix=PREFIX, dependencies=[Depends(authorize)], tags=["privacy"], responses=ERRORS)

    @api.post("/forget", response_model=ForgetAnswer, responses=BAD_BODY)
    def forget(body: ForgetBody) -> dict[str, Any]:
        """Forget a user now: delete the link to its pseudonym and record the request in the erasure ledger.

        A repeated forget is answered (`already_forgotten`, `in_progress`), not repeated; a user never seen is
        answered `no_data` and still recorded.
        """
        from privacy.erasure import forget as run_forget  # noqa: PLC0415

        try:
            return run_forget(settings, body.user, exclude=body.exclude, session=sessions.get()).to_json()
        except Exception as exc:  # noqa: BLE001 - the driver's, the key file's, the ledger's: no 500, no host named
            refused = unavailable("forget", exc)
        raise refused from None

    @api.get("/status", response_model=StatusAnswer)
    def status(
        show: Annotated[int, Query(ge=1, le=1000, description="How many requests to list (pending first).")] = 50,
    ) -> dict[str, Any]:
        """List the erasure requests (pending first, hashes only), how many are pending and the oldest one's age."""
        from privacy.erasure import status as read_status  # noqa: PLC0415

        try:
            return read_status(settings, session=sessions.get(), limit=show).to_json()
        except Exception as exc:  # noqa: BLE001
            refused = unavailable("status", exc)
        raise refused from None

    return api


def mount(app: FastAPI, settings: Settings) -> None:
    """Mount the erasure routes into an app, and keep the user id out of their 422s.

    FastAPI's validation errors echo each refused value (``input``); for a forget that value is the user id, which no
    answer may carry. The other routes keep FastAPI's default answer.
    """
    app.include_router(router(settings))

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)  # noqa: S101 - registered for this class only
        if not request.url.path.startswith(PREFIX + "/"):
            return await request_validation_exception_handler(request, exc)
        errors = [{k: v for k, v in e.items() if k not in ("input", "ctx", "url")} for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    app.add_exception_handler(RequestValidationError, refused)
