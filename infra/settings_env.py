"""The settings as ``TRENDS_*`` environment variables: what a child process is started with.

A child (a stack service, an Airflow task, a serving worker) builds ``Settings()`` from its environment: given
these variables it reads exactly the values its parent holds, whether those came from the environment, a ``.env``
file, a secrets folder or code.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, SecretStr

from infra.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings


def to_env(settings: Settings) -> dict[str, str]:
    """Return these settings as ``TRENDS_*`` variables, secrets revealed, for child processes.

    Airflow's tasks build ``Settings()`` from their environment: given these variables they read exactly the
    values the stack was started with, whether those came from the environment, a ``.env`` file or code.
    """
    out: dict[str, str] = {}
    _flatten(settings, (), out)
    return out


def secret_vars(settings: Settings) -> dict[str, str]:
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
