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
        ("15x", None, None, "last", "15m"),
        ("0h", None, None, "last", "not a duration"),
        ("32d", None, None, "last", "longer than 31 days"),
        (None, None, None, "last", "give last"),
    ],
)
def test_bad_windows(
    settings: Settings, last: str | None, start: datetime | None, end: datetime | None, param: str, fragment: str
) -> None:
    with pytest.raises(params.BadQueryError, match=fragment) as exc:
        params.window(settings, last, start, end, now=NOW)
    assert exc.value.param == param


def test_last_with_end_is_the_last_n_ending_at_end(settings: Settings) -> None:
    """As Prometheus' range queries and Grafana read it (issue 29: a schema-valid request is answered)."""
    end = datetime(2026, 5, 1, 8, 0, 30, tzinfo=UTC)
    assert params.window(settings, "2h", None, end, now=NOW) == (
        datetime(2026, 5, 1, 6, tzinfo=UTC),
        datetime(2026, 5, 1, 8, tzinfo=UTC),
    )


M = timedelta(minutes=1)
T = datetime(2026, 5, 1, 8, tzinfo=UTC)


@pytest.mark.parametrize(
    ("last", "start", "end", "window"),
    [
        (None, T, None, (T, T + timedelta(hours=1))),  # start alone: the default length from it
        (None, None, T, (T - timedelta(hours=1), T)),  # end alone: the default length up to it
        ("30m", T, None, (T, T + 30 * M)),  # last from start
        ("30m", T - timedelta(hours=2), T, (T - 30 * M, T)),  # last keeps the end of [start, end)
        ("3h", T - timedelta(hours=2), T, (T - timedelta(hours=2), T)),  # ... never more than [start, end)
        (None, T, T - timedelta(hours=1), (T - timedelta(hours=1), T)),  # backwards: the same window
        (None, T, T + timedelta(seconds=10), (T, T + M)),  # within one minute: that minute
        (None, T - timedelta(days=40), T, (T - timedelta(days=31), T)),  # too long: its last 31 days
    ],
)
def test_every_combination_has_a_meaning(
    settings: Settings,
    last: str | None,
    start: datetime | None,
    end: datetime | None,
    window: tuple[datetime, datetime],
) -> None:
    assert params.window(settings, last, start, end, now=NOW) == window


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

    from serving.lru import ROW_OVERHEAD_BYTES as O
    from serving.lru import RowCache
    from serving.served_row import ServedRow

    row = ServedRow(datetime(2026, 1, 1, tzinfo=UTC), "hour", "batch", 1, b"h" * 100, b"", b"f" * 100)
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
    from serving.reader import rows_cacheable

    assert rows_cacheable(Settings())  # LOCAL_QUORUM reads and writes
    one = {"read_consistency": "ONE", "replication_factor": 3}
    assert not rows_cacheable(Settings(cassandra=one))
    assert rows_cacheable(Settings(cassandra={"read_consistency": "ONE", "replication_factor": 1}))
    assert not rows_cacheable(Settings(serving={"cache_mb": 0}))


@pytest.mark.parametrize(
    ("param", "text"),
    [
        ("start", "0001-01-01T00:00+14:00"),  # was an OverflowError (HTTP 500)
        ("end", "9999-12-31T23:59Z"),  # was an OverflowError once a minute was added
        ("start", "1969-12-31T23:59Z"),
        ("start", "3000-01-01T00:00Z"),
        ("start", "2026-02-29T00:00Z"),
        ("start", "2026-04-31T00:00Z"),
        ("start", "2026-05-01T10:00Z\n"),
        ("start", "2026-05-01T10:00:00+0100"),
        ("start", "20260501T1000Z"),
        ("start", ""),
    ],
)
def test_times_outside_the_documented_pattern_are_refused(param: str, text: str) -> None:
    with pytest.raises(params.BadQueryError, match="not an ISO-8601 time") as exc:
        params.parse_time(param, text)
    assert exc.value.param == param


def test_times_inside_the_pattern_parse_without_overflow() -> None:
    assert params.parse_time("start", "1970-01-01T00:00+14:00") == datetime(1969, 12, 31, 10, tzinfo=UTC)
    assert params.parse_time("end", "2999-12-31T23:59:59.5-23:59") == datetime(
        3000, 1, 1, 23, 58, 59, 500000, tzinfo=UTC
    )
    assert params.parse_time("start", "2024-02-29T00:00Z") == datetime(2024, 2, 29, tzinfo=UTC)
    assert params.parse_time("start", "2000-02-29T12:30:15.000001Z").microsecond == 1


def test_leap_days_of_the_pattern_are_the_calendars() -> None:
    import calendar
    import re

    pattern = re.compile(params.TIME_PATTERN)
    assert [y for y in range(1970, 3000) if pattern.fullmatch(f"{y}-02-29T00:00Z")] == [
        y for y in range(1970, 3000) if calendar.isleap(y)
    ]


@pytest.mark.parametrize("text", ["999999999d", "99999999999d", "1000000000m"])
def test_huge_durations_are_a_bad_query_not_an_overflow(settings: Settings, text: str) -> None:
    with pytest.raises(params.BadQueryError) as exc:  # was an OverflowError (HTTP 500)
        params.window(settings, text, None, None, now=NOW)
    assert exc.value.param == "last"
    with pytest.raises(params.BadQueryError, match="baseline"):
        params.duration(settings, "baseline", text)


@pytest.mark.parametrize("max_days", [1, 7, 31, 365, 3660])
def test_the_duration_pattern_accepts_exactly_the_windows_allowed(settings: Settings, max_days: int) -> None:
    import re

    pattern = re.compile(params.duration_pattern(max_days))
    s = settings.model_copy(update={"serving": settings.serving.model_copy(update={"max_window_days": max_days})})
    limits = {"m": max_days * 1440, "h": max_days * 24, "d": max_days}
    for unit, top in limits.items():
        candidates = {*range(0, 130), *range(top - 130, top + 130), top * 10, top * 10 + 1}
        for n in sorted(c for c in candidates if c >= 0):
            for text in (f"{n}{unit}", f"0{n}{unit}"):
                try:
                    params.window(s, text, None, None, now=NOW)
                    accepted = True
                except params.BadQueryError:
                    accepted = False
                assert bool(pattern.fullmatch(text)) == accepted, text
                assert accepted == (text[0] != "0" and 1 <= n <= top), text


def test_the_slice_pattern_accepts_exactly_the_slices_allowed(settings: Settings) -> None:
    import re

    pattern = re.compile(params.slice_pattern(settings))
    for text in ["*", "origin=JFK", "origin=é ✈", "origin=" + "x" * 256, "origin=" + "x" * 257, "origin=", "*x",
                 "carrier=AA", "origin=A\x1b[31m", "JFK", "", "origin=JFK\n"]:  # fmt: skip
        try:
            params.slice_name(settings, text)
            accepted = True
        except params.BadQueryError:
            accepted = False
        assert bool(pattern.fullmatch(text)) == accepted, repr(text)
    no_dims = settings.model_copy(update={"views": settings.views.model_copy(update={"slice_dims": []})})
    assert params.slice_pattern(no_dims) == r"^\*$"


def test_an_empty_last_is_refused_not_ignored(settings: Settings) -> None:
    with pytest.raises(params.BadQueryError) as exc:
        params.window(settings, "", NOW, NOW + timedelta(hours=1))
    assert exc.value.param == "last"
