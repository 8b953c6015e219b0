"""The API's refusals: the error body, the responses each operation documents, and the 503 of unreadable views.

Refusals are 4xx with a message naming the parameter or the setting; an unreachable or failing Cassandra is a 503
with ``Retry-After`` and a generic reason (:data:`UNAVAILABLE`; the details go to the log), never a 500.
"""

from typing import Any

from cassandra import DriverException, RequestExecutionException
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from pydantic import BaseModel

RETRY_AFTER_S = 5  # told to clients while Cassandra is unavailable
BUSY_RETRY_AFTER_S = 1  # told to clients refused for too many concurrent queries
UNAVAILABLE = "the views are unavailable right now (the server log has the reason); retry later"


class ErrorBody(BaseModel):
    """The body of every refusal (400, 401, 429, 503): what went wrong, naming the parameter or the setting."""

    detail: str


def error_response(description: str, retry: bool = False, auth: bool = False) -> dict[str, Any]:
    """Declare a refusal in the OpenAPI document: the error body, and the header it carries."""
    out: dict[str, Any] = {"model": ErrorBody, "description": description}
    if retry:
        out["headers"] = {
            "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
        }
    if auth:
        out["headers"] = {"WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}}}
    return out


BAD_REQUEST: dict[int | str, dict[str, Any]] = {
    400: error_response(
        "A parameter (named in the message) its schema refuses, or an answer that would read more sketch bytes "
        "than `serving.max_read_mb`."
    )
}
UNAVAILABLE_503: dict[int | str, dict[str, Any]] = {
    503: error_response("Cassandra is unreachable or the views are not set up.", retry=True)
}
QUERY_ERRORS: dict[int | str, dict[str, Any]] = {
    401: error_response("`serving.api_token` is set and the request lacks `Authorization: Bearer <token>`.", auth=True),
    429: error_response("More concurrent queries than `serving.max_concurrent_requests`.", retry=True),
    **UNAVAILABLE_503,
}


class CassandraUnavailableError(RuntimeError):
    """The views cannot be read right now (the API answers 503 with this message)."""


def driver_errors() -> tuple[type[BaseException], ...]:
    """Return what the driver raises when Cassandra cannot answer (all mapped to 503)."""
    return (NoHostAvailable, DriverException, RequestExecutionException, ConnectionException, OSError)


def reason(exc: BaseException) -> str:
    """Say why Cassandra could not answer, for the log (a client only ever sees :data:`UNAVAILABLE`)."""
    text = str(exc) or type(exc).__name__
    if ("Keyspace" in text and "does not exist" in text) or "unconfigured table" in text:
        return f"the views are not set up ({text}); run `trends admin init`"
    return f"{type(exc).__name__}: {text}"[:500]
