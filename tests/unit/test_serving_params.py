"""Query parameter validation shared by the CLI and the API: every refusal names its parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from infra.settings import Settings
from serving import params

NOW = datetime(2026, 5, 1, 10, 17, 42, tzinfo=UTC)


@pytest.fixture
def settings() -> Settings:
    s = Settings()
    return s.model_copy(update={"views": s.views.model_copy(update={"slice_dims": ["origin"]})})


def test_last_ends_at_the_end_of_the_current_minute(settings: Settings) -> None:
    assert params.window(settings, "1h", None, None, now=NOW) == (
        datetime(2026, 5, 1, 9, 18, tzinfo=UTC),
        datetime(2026, 5, 1, 10, 18, tzinfo=UTC),
    )


def test_absolute_windows_are_floored_to_minutes(settings: Settings) -> None:
    start, end = params.window(settings, None, NOW, NOW + timedelta(hours=2))
    assert (start.second, end.second, end - start) == (0, 0, timedelta(hours=2))


@pytest.mark.parametrize(
    ("last", "start", "end", "param", "fragment"),
    [
        ("1h", NOW, None, "last", "not both"),
        ("15x", None, None, "last", "15m"),
        ("0h", None, None, "last", "not a duration"),
        (None, NOW, None, "end", "both start and end"),
        (None, None, None, "start", "both start and end"),
        (None, NOW, NOW - timedelta(hours=1), "end", "reversed"),
        (None, NOW, NOW + timedelta(seconds=10), "end", "empty"),
        (None, NOW, NOW + timedelta(days=32), "end", "longer than 31 days"),
    ],
)
def test_bad_windows(
    settings: Settings, last: str | None, start: datetime | None, end: datetime | None, param: str, fragment: str
) -> None:
    with pytest.raises(params.BadQueryError, match=fragment) as exc:
        params.window(settings, last, start, end, now=NOW)
    assert exc.value.param == param


def test_times_need_an_offset() -> None:
    assert params.parse_time("start", "2026-05-01T10:00+02:00") == datetime(2026, 5, 1, 8, tzinfo=UTC)
    assert params.parse_time("start", "2026-05-01T10:00Z") == datetime(2026, 5, 1, 10, tzinfo=UTC)
    with pytest.raises(params.BadQueryError, match="no time zone"):
        params.parse_time("start", "2026-05-01T10:00")
    with pytest.raises(params.BadQueryError, match="not an ISO-8601 time"):
        params.parse_time("end", "yesterday")


def test_slices(settings: Settings) -> None:
    assert params.slice_name(settings, "*") == "*"
    assert params.slice_name(settings, "origin=JFK") == "origin=JFK"
    with pytest.raises(params.BadQueryError, match="unknown slice dimension 'carrier'"):
        params.slice_name(settings, "carrier=AA")
    with pytest.raises(params.BadQueryError, match="is not `\\*` or a slice"):
        params.slice_name(settings, "JFK")


def test_limits_and_ranks(settings: Settings) -> None:
    assert params.limit(settings, "limit", 200) == 200
    with pytest.raises(params.BadQueryError, match="between 1 and 200"):
        params.limit(settings, "limit", 201)
    assert params.ranks([]) == (0.5, 0.9, 0.99)
    assert params.ranks([0.0, 1.0]) == (0.0, 1.0)
    with pytest.raises(params.BadQueryError, match="between 0 and 1"):
        params.ranks([1.5])
    with pytest.raises(params.BadQueryError, match="31 days"):
        params.duration(settings, "baseline", "40d")


def test_row_cache_is_a_bounded_lru_that_keeps_empty_reads() -> None:
    from datetime import UTC, datetime

    from serving.store import ROW_OVERHEAD_BYTES as O
    from serving.store import Bucket, RowCache

    row = Bucket(datetime(2026, 1, 1, tzinfo=UTC), "hour", "batch", 1, b"h" * 100, b"", b"f" * 100)
    one = O + (O + 200)  # an entry of one row: entry overhead + row overhead + its sketch bytes
    cache = RowCache(max_bytes=3 * one - 1)
    cache.put("a", (row, row))
    cache.put("empty", ())  # an hour without rows is worth remembering too
    assert cache.get("a") == (row, row) and cache.get("empty") == () and cache.bytes == one + (O + 200) + O
    cache.put("b", (row,))  # over the bound: evicts the least recently used, "a" ("empty" was used after it)
    assert cache.get("a") is None and cache.get("empty") == () and cache.get("b") == (row,)
    assert cache.bytes == O + one
    cache.put("huge", (row,) * 4)  # larger than the whole cache: not kept
    assert cache.get("huge") is None and (cache.hits, cache.misses) == (4, 2)


def test_row_cache_only_with_read_your_writes() -> None:
    from infra.settings import Settings
    from serving.store import rows_cacheable

    assert rows_cacheable(Settings())  # LOCAL_QUORUM reads and writes
    one = {"read_consistency": "ONE", "replication_factor": 3}
    assert not rows_cacheable(Settings(cassandra=one))
    assert rows_cacheable(Settings(cassandra={"read_consistency": "ONE", "replication_factor": 1}))
    assert not rows_cacheable(Settings(serving={"cache_mb": 0}))
