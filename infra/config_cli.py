"""``trends config``: show the effective settings, or the table of every setting for the docs' settings page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from infra.security import MASK, escape_json, mask_uri, mask_value
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
        elif isinstance(field.default, SecretStr):
            default = MASK  # the description says what it is
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


def _markdown_text(text: str) -> str:
    """Return a description fit for a table cell: no ``|``, and ``<name>`` outside code spans kept as text, not HTML."""
    parts = text.replace("|", "/").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def markdown_table() -> str:
    """Return the table of every setting: the body of the docs' settings page."""
    lines = ["| Environment variable | Default | Meaning |", "|---|---|---|"]
    for env, default, description in settings_rows():
        shown = f"`{default}`" if default else "(unset)"
        lines.append(f"| `{env}` | {shown} | {_markdown_text(description)} |")
    return "\n".join(lines)


TABLE_START = "<!-- settings-table:start -->"
TABLE_END = "<!-- settings-table:end -->"


def write_settings_table(path: Path) -> bool:
    """Replace the settings table between the markers of a docs page; return whether it changed.

    The prose around the markers stays hand-written; only the table is generated, so it cannot drift from the model.
    """
    text = path.read_text(encoding="utf-8")
    head, sep, rest = text.partition(TABLE_START)
    _, sep2, tail = rest.partition(TABLE_END)
    if not sep or not sep2:
        msg = f"{path} has no {TABLE_START} … {TABLE_END} markers"
        raise click.ClickException(msg)
    new = f"{head}{TABLE_START}\n{markdown_table()}\n{TABLE_END}{tail}"
    path.write_text(new, encoding="utf-8")
    return new != text


def masked_settings(model: BaseModel) -> dict[str, Any]:
    """Return the settings as JSON-able values with every secret masked.

    Masked: secret fields (``SecretStr``), the values of free-form maps (``spark.conf``, ``airflow.config``) whose
    keys look secret (password, secret, token, key, credentials, connections) and the userinfo of any URI
    (``postgresql://user:pw@host`` becomes ``postgresql://**********@host``).
    """
    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out[name] = masked_settings(value)
        elif isinstance(value, SecretStr):
            out[name] = MASK
        elif isinstance(value, dict):
            out[name] = {str(k): mask_value(str(k), v) for k, v in value.items()}
        elif isinstance(value, list):
            out[name] = [mask_uri(v) if isinstance(v, str) else v for v in value]
        elif isinstance(value, str):
            out[name] = mask_uri(value)
        elif isinstance(value, Path):
            out[name] = str(value)
        else:
            out[name] = value
    return out


@click.command()
@click.option("--markdown", is_flag=True, help="Print the table of every setting, env var and default.")
@click.option(
    "--update-docs",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Rewrite the settings table inside this docs page (docs/reference/settings.md).",
)
@click.pass_obj
def config(settings: Settings, markdown: bool, update_docs: Path | None) -> None:
    """Show the effective settings (secrets masked) as JSON."""
    if update_docs is not None:
        changed = write_settings_table(update_docs)
        click.echo(f"{update_docs}: {'updated' if changed else 'already current'}")
        return
    if markdown:
        click.echo(markdown_table())
        return
    click.echo(escape_json(json.dumps(masked_settings(settings), indent=2, default=str, ensure_ascii=False)))
