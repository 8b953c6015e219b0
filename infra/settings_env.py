"""The settings as ``TRENDS_*`` environment variables: their names, and what a child process is started with.

A child (a stack service, an Airflow task, a serving worker) builds ``Settings()`` from its environment: given
these variables it reads exactly the values its parent holds, whether those came from the environment, a ``.env``
file, a secrets folder or code. A message that tells a user which variable to set names it with :func:`env_var`,
so a renamed or moved setting cannot leave a message pointing at a variable nothing reads.

The prefix and the delimiter live here, not in ``infra.settings``, and nothing here imports ``infra.settings``
(:func:`to_env` takes any settings model, in practice ``infra.settings.Settings``): the section models
(``infra.service_settings``, ``infra.ingest_settings``, ``infra.pipeline_settings``), which ``infra.settings`` imports,
name variables too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, SecretStr

ENV_PREFIX = "TRENDS_"
ENV_NESTED_DELIMITER = "__"

_PLACEHOLDER = re.compile(r"\$\{([a-z_]+(?:\.(?:[a-z_0-9]+|\*))?)\}")
F = TypeVar("F", bound=Callable[..., object])


def env_var(path: str) -> str:
    """Return the environment variable of the setting at ``path``: how pydantic-settings names it.

    ``"kafka.sasl_password"`` -> ``TRENDS_KAFKA__SASL_PASSWORD``; ``"views.*"`` -> ``TRENDS_VIEWS__*`` (every
    setting of a section). It only formats: the section models call it, and ``infra.settings`` imports them, so it
    cannot look the model up without an import cycle. ``tests/unit/test_env_var_names.py`` checks every path given
    to it in the package against the model (:func:`setting_exists`), so a message cannot name a variable nothing
    reads.

    :arg path: the setting's dotted path in the settings tree (``section.field``, or ``field`` for the root's).
    :returns: the variable's name.
    """
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(path.split(".")).upper()


def setting_exists(root: type[BaseModel], path: str) -> bool:
    """Tell whether the settings model ``root`` holds the setting (or, for ``section.*``, the section) at ``path``."""
    model = root
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part == "*":
            return i == len(parts) - 1 and i > 0
        field = model.model_fields.get(part)
        if field is None:
            return False
        if i < len(parts) - 1:
            sub = field.annotation
            if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
                return False
            model = sub
    return True


def with_env_vars(fn: F) -> F:
    """Put the variable of each ``${section.field}`` of ``fn``'s docstring in its place (a click command's help).

    A command's help is read by users as much as an error is; with this under ``@click.command`` its docstring
    names settings by path and the help shows their variables, checked like :func:`env_var`'s.
    """
    if fn.__doc__:
        fn.__doc__ = _PLACEHOLDER.sub(lambda m: env_var(m.group(1)), fn.__doc__)
    return fn


def to_env(settings: BaseModel) -> dict[str, str]:
    """Return these settings as ``TRENDS_*`` variables, secrets revealed, for child processes.

    Airflow's tasks build ``Settings()`` from their environment: given these variables they read exactly the
    values the stack was started with, whether those came from the environment, a ``.env`` file or code.
    """
    out: dict[str, str] = {}
    _flatten(settings, (), out)
    return out


def secret_vars(settings: BaseModel) -> dict[str, str]:
    """Return the variable of every secret setting (``SecretStr``) and the section it belongs to.

    E.g. ``TRENDS_KAFKA__SASL_PASSWORD`` -> ``kafka``: a child process is given the secrets of the sections
    (services) it talks to only (:func:`stack.process.child_env`).
    """
    out: dict[str, str] = {}
    for section, field in type(settings).model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name, sub in model.model_fields.items():
            if "SecretStr" in str(sub.annotation):
                out[ENV_PREFIX + f"{section}{ENV_NESTED_DELIMITER}{name}".upper()] = section
    return out


def _flatten(model: BaseModel, prefix: tuple[str, ...], out: dict[str, str]) -> None:
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            _flatten(value, (*prefix, name), out)
            continue
        key = ENV_PREFIX + ENV_NESTED_DELIMITER.join((*prefix, name)).upper()
        if value is None:
            if field.default is not None:  # e.g. spark.local_ip: "empty" is how the env says "unset"
                out[key] = ""
            continue
        if isinstance(value, SecretStr):
            out[key] = value.get_secret_value()
        elif isinstance(value, str | Path):
            out[key] = str(value)
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, int | float):
            out[key] = str(value)
        else:  # lists and maps: JSON, as pydantic-settings parses complex values
            out[key] = json.dumps(value)
