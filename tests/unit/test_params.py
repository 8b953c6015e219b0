"""The CLI's parameter types: one parser of user times for every group, with clear usage errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest
from click.testing import CliRunner

from infra.user_time import UTC_TIME, parse_utc

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_times_in_every_accepted_form_become_utc() -> None:
    assert parse_utc("now", NOW) == NOW
    assert parse_utc("-365d", NOW) == NOW - timedelta(days=365)
    assert parse_utc("+2h", NOW) == NOW + timedelta(hours=2)
    assert parse_utc("-1.5h", NOW) == NOW - timedelta(minutes=90)
    assert parse_utc("2025-11-22", NOW) == datetime(2025, 11, 22, tzinfo=UTC)
    assert parse_utc("2025-11-22T10:00", NOW) == datetime(2025, 11, 22, 10, tzinfo=UTC)  # no offset: UTC
    assert parse_utc(" 2025-11-22T10:00:00+02:00 ", NOW) == datetime(2025, 11, 22, 8, tzinfo=UTC)
    assert parse_utc("2026-05-01T10:00Z").tzinfo is UTC


@pytest.mark.parametrize("text", ["last week", "", "1h", "2025-13-01", "-99999999999w"])
def test_anything_else_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a time .*ISO-8601.*`now`.*-2h"):
        parse_utc(text, NOW)


@click.command()
@click.option("--start", type=UTC_TIME)
@click.option("--end", type=UTC_TIME)
def _window(start: datetime | None, end: datetime | None) -> None:
    click.echo(f"{start.isoformat() if start else '-'} {end.isoformat() if end else '-'}")


def test_the_param_type_gives_utc_and_one_now_per_command() -> None:
    result = CliRunner().invoke(_window, ["--start", "2026-05-01T10:00+02:00", "--end", "2026-05-01"])
    assert result.output == "2026-05-01T08:00:00+00:00 2026-05-01T00:00:00+00:00\n"
    start, end = CliRunner().invoke(_window, ["--start", "-2h", "--end", "now"]).output.split()
    assert datetime.fromisoformat(end) - datetime.fromisoformat(start) == timedelta(hours=2)


@pytest.mark.parametrize(
    ("value", "message"),
    [("yesterday", "'yesterday' is not a time (ISO-8601"), ("1969-12-31T23:00Z", "before 1970-01-01")],
)
def test_the_param_type_fails_with_a_usage_error(value: str, message: str) -> None:
    result = CliRunner().invoke(_window, ["--start", value])
    assert result.exit_code == 2
    assert "Invalid value for '--start'" in result.output
    assert message in result.output
