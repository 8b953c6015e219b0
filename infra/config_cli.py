"""``trends config``: show the effective settings, or the table of every setting for the README."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from infra.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings

DEFAULT_NOTES = {"data_dir": "~/.local/share/trends", "cache_dir": "~/.cache/trends"}


def settings_rows(model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, str, str]]:
    """Yield (env var, default, description) for every leaf setting, sections flattened."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from settings_rows(annotation, (*prefix, name))
            continue
        env = ENV_PREFIX + ENV_NESTED_DELIMITER.join((*prefix, name)).upper()
        if name in DEFAULT_NOTES and not prefix:
            default = DEFAULT_NOTES[name]
        elif field.default is not PydanticUndefined:
            default = (
                ""
                if field.default is None
                else json.dumps(field.default)
                if not isinstance(field.default, str)
                else field.default
            )
        elif field.default_factory is not None:
            default = json.dumps(field.default_factory())  # type: ignore[call-arg]
        else:
            default = ""
        yield env, default, field.description or ""


def markdown_table() -> str:
    """Return the configuration table of the README."""
    lines = ["| Environment variable | Default | Meaning |", "|---|---|---|"]
    for env, default, description in settings_rows():
        shown = f"`{default}`" if default else "(unset)"
        lines.append(f"| `{env}` | {shown} | {description.replace('|', '/')} |")
    return "\n".join(lines)


def _masked(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return "**********"
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    return value


@click.command()
@click.option("--markdown", is_flag=True, help="Print the table of every setting, env var and default.")
@click.pass_obj
def config(settings: Settings, markdown: bool) -> None:
    """Show the effective settings (secrets masked) as JSON."""
    if markdown:
        click.echo(markdown_table())
        return
    dumped = settings.model_dump(mode="python")
    masked = {k: _masked(v) for k, v in dumped.items()}
    click.echo(json.dumps(masked, indent=2, default=str))
