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
    "The window is `last` (ending at the end of the current minute) or `start` and `end` together, never both; "
    f"neither means `last={params.DEFAULT_LAST}`. Times are floored to whole minutes; the window must not be "
    "empty and at most `serving.max_window_days` long. These rules span parameters, which OpenAPI cannot express: "
    "breaking one is a 400 naming the parameter."
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
