"""The API's OpenAPI document against what the server checks, the concurrency limit, and one error bound."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import datasketches as ds
from fastapi.testclient import TestClient
from pydantic import SecretStr

from infra.settings import Settings
from serving import api, provenance, queries, window
from serving.errors import CassandraUnavailableError
from serving.merge import Merged
from serving.plan import Coverage, Span
from serving.served_row import ServedRow
from views import sketches

QUERY_ROUTES = ["count", "users", "quantiles", "top", "summary", "trending", "series"]


def _settings(**serving: Any) -> Settings:
    s = Settings()
    return s.model_copy(
        update={
            "views": s.views.model_copy(update={"slice_dims": ["origin"]}),
            "serving": s.serving.model_copy(update=serving),
            "cassandra": s.cassandra.model_copy(update={"port": 1, "connect_timeout_s": 1.0}),  # never reached
        }
    )


def _spec(settings: Settings) -> dict[str, Any]:
    return api.create_app(settings).openapi()


def test_every_query_documents_its_refusals_with_the_error_model() -> None:
    spec = _spec(_settings())
    assert spec["components"]["schemas"]["ErrorBody"]["required"] == ["detail"]
    for name in QUERY_ROUTES:
        responses = spec["paths"][f"/api/v1/{name}"]["get"]["responses"]
        assert {"200", "400", "401", "422", "429", "503"} <= set(responses), name
        for code in ("400", "401", "429", "503"):
            body = responses[code]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, (name, code)
        assert "Retry-After" in responses["429"]["headers"] and "Retry-After" in responses["503"]["headers"]
        assert "last N ending at `end`" in spec["paths"][f"/api/v1/{name}"]["get"]["description"]
    status = spec["paths"]["/api/v1/status"]["get"]["responses"]
    assert {"401", "429", "503"} <= set(status) and "400" not in status  # it takes no parameter to refuse
    ready = spec["paths"]["/ready"]["get"]["responses"]
    assert ready["503"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


def test_parameter_schemas_carry_the_settings_constraints() -> None:
    spec = _spec(_settings(max_window_days=7, max_limit=50))
    params = {p["name"]: p["schema"] for p in spec["paths"]["/api/v1/trending"]["get"]["parameters"]}
    assert params["last"]["pattern"] == params["baseline"]["pattern"]
    last = re.compile(params["last"]["pattern"])
    assert last.fullmatch("10080m") and not last.fullmatch("10081m") and params["baseline"]["default"] == "24h"
    assert params["start"]["pattern"].startswith("^(?:") and params["slice"]["pattern"].startswith("^(?:\\*|(?:origin)")
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 50)
    assert params["min_support"]["minimum"] == 1
    top = {p["name"]: p["schema"] for p in spec["paths"]["/api/v1/summary"]["get"]["parameters"]}
    assert top["rank"]["items"] == {"type": "number", "minimum": 0, "maximum": 1} and top["rank"]["maxItems"] == 100
    series = {p["name"]: p["schema"] for p in spec["paths"]["/api/v1/series"]["get"]["parameters"]}
    assert series["resolution"]["enum"] == ["minute", "hour", "day"] and series["item"]["anyOf"][0]["maxLength"] == 256
    assert "securitySchemes" not in spec.get("components", {})  # no token: no auth to document


def test_the_bearer_scheme_is_documented_only_with_a_token() -> None:
    spec = _spec(_settings(api_token=SecretStr("a-long-enough-token")))
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert spec["paths"]["/api/v1/count"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/health"]["get"]


class _BlockingBackend:
    """Stands in for the backend in the limiter test only: a query that holds its slot until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.cache = None

    def reader(self) -> Any:
        self.entered.set()
        self.release.wait(10)
        msg = "released"
        raise CassandraUnavailableError(msg)


def test_queries_beyond_the_concurrency_limit_get_a_429_with_retry_after() -> None:
    app = api.create_app(_settings(max_concurrent_requests=1))
    blocking = _BlockingBackend()
    app.state.context.backend = blocking
    with TestClient(app, raise_server_exceptions=False) as client:
        first: dict[str, Any] = {}
        holder = threading.Thread(target=lambda: first.update(r=client.get("/api/v1/count?last=1h")))
        holder.start()
        try:
            assert blocking.entered.wait(10)
            refused = client.get("/api/v1/top?last=1h")
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert "serving.max_concurrent_requests" in refused.json()["detail"]
            assert client.get("/health").status_code == 200  # ops routes are not limited
        finally:
            blocking.release.set()
            holder.join(10)
        assert first["r"].status_code == 503
        deadline = time.monotonic() + 5
        while client.get("/api/v1/count?last=1h").status_code == 429 and time.monotonic() < deadline:
            time.sleep(0.05)  # the slot is given back once the first answer is sent
        assert client.get("/api/v1/count?last=1h").status_code == 503  # the slot was given back


def _items_window(start: datetime, counts: dict[str, int], lg_max: int = 3) -> window.Window:
    fi = ds.frequent_strings_sketch(lg_max)
    for item, n in counts.items():
        fi.update(item, n)
    b = ServedRow(start, "minute", "speed", sum(counts.values()), b"", b"", bytes(fi.serialize()))
    cov = Coverage(None, False, None, set(), set(), None, None)
    end = start + timedelta(minutes=1)
    w = window.Window(start, end, "*", provenance.Provenance.of([Span(start, end, "speed", "minute")], cov),
                       Merged(timedelta(days=1)))  # fmt: skip
    w.merged.add(b)
    return w


def test_top_and_trending_state_one_error_bound() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    counts = {f"#i{i}": 1 + (i * 37) % 11 for i in range(40)}  # more items than the small sketch keeps: it purges
    recent = _items_window(t0 + timedelta(minutes=1), counts)
    base = _items_window(t0, {"#i1": 3})
    fi = recent.merged.sketches.items
    assert fi is not None and 0 < fi.epsilon * fi.total_weight % 1 < 0.5  # round() would state one less
    bound = sketches.items_max_error(fi)
    assert bound == -int(-fi.epsilon * fi.total_weight // 1)  # ceil, in one place
    assert queries.top(recent, 5).items_max_error == bound
    assert queries.trending(recent, base, 5, 1).items_max_error == bound
    assert queries.summary(recent).items_max_error == bound


def test_last_with_end_is_answered_for_the_last_n_ending_at_end(monkeypatch: Any) -> None:
    """Schema-valid, so answered (issue 29): `last` with `end` is the last N ending at `end`, as in Prometheus."""
    app = api.create_app(_settings())
    asked: list[tuple[datetime, datetime, str]] = []

    def load(w: Any, answer: str, coarsest: str = "day", **_: Any) -> list[window.Window]:
        asked.append((w.start, w.end, coarsest))
        raise CassandraUnavailableError(answer)

    monkeypatch.setattr(app.state.context, "load", load)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/api/v1/count?last=2h&end=2026-05-01T10:00:30Z")
        assert r.status_code == 503, r.text  # past the parameters: the views are what is missing here
        r = client.get("/api/v1/series?last=30d&end=2026-05-01T10:00Z&resolution=minute")
        assert r.status_code == 503, r.text  # 43,200 minutes: answered at the next coarser resolution
    assert asked == [
        (datetime(2026, 5, 1, 8, tzinfo=UTC), datetime(2026, 5, 1, 10, tzinfo=UTC), "day"),
        (datetime(2026, 4, 1, 10, tzinfo=UTC), datetime(2026, 5, 1, 10, tzinfo=UTC), "hour"),
    ]
