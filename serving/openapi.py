"""The OpenAPI document tells the truth: each parameter carries the exact constraint the server checks.

The patterns are built from the settings (:func:`parameter_schemas`), every answer's status codes are listed with
their body's model (:mod:`serving.errors`), and the rules that span parameters are stated in each operation's
description (:data:`WINDOW_RULES`).
"""

from typing import Any

from infra.settings import Settings
from serving import params

API_PREFIX = "/api/v1"

WINDOW_RULES = (
    "Every combination of `last`, `start` and `end` has one meaning. The window is `last` long "
    f"(`{params.DEFAULT_LAST}` when only `start` or only `end` is given) and ends at `end`, or at the end of the "
    "current minute when neither `start` nor `end` is given: `last` with `end` is the last N ending at `end` (as "
    "Prometheus' range queries and Grafana read it), `start` alone is N from `start`, `start` and `end` are "
    "`[start, end)` and `last` with both keeps its last N. Nothing given means "
    f"`last={params.DEFAULT_LAST}`. Times are floored to whole minutes; `start` and `end` given the wrong way round "
    "bound the same window, a window within one minute is that minute, and one longer than "
    "`serving.max_window_days` keeps its last `serving.max_window_days` (the answer's `start` and `end` say which "
    "window was answered)."
)


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
