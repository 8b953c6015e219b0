from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from app.cli import cli
from infra.config_cli import markdown_table

SETTINGS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"


def _walk(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        if isinstance(cmd, click.Group):
            found += _walk(cmd, ctx, (*path, name))
        else:
            found.append((*path, name))
    return found


def test_every_subcommand_has_help() -> None:
    runner = CliRunner()
    commands = _walk(cli, click.Context(cli))
    assert ("stack", "up") in commands and ("demo",) in commands
    for path in commands:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output
        assert len(result.output.splitlines()) > 3, path


def test_reset_without_yes_asks_and_aborts_on_no(monkeypatch: pytest.MonkeyPatch) -> None:
    import stack.control

    called: list[object] = []
    monkeypatch.setattr(stack.control, "reset", lambda *a, **k: called.append(a) or [])
    result = CliRunner().invoke(cli, ["stack", "reset"], input="n\n")
    assert result.exit_code == 1
    assert "Delete all data" in result.output
    assert called == []


def test_unknown_service_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["stack", "up", "zookeeper"])
    assert result.exit_code == 2
    assert "zookeeper" in result.output


def test_settings_page_table_is_current() -> None:
    text = SETTINGS_PAGE.read_text()
    match = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", text, re.S)
    assert match, "docs/reference/settings.md lacks the generated settings table markers"
    assert match.group(1).strip() == markdown_table().strip(), (
        "run: trends config --update-docs docs/reference/settings.md"
    )


def test_every_setting_is_documented() -> None:
    for line in markdown_table().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2], f"setting without description: {cells[0]}"
