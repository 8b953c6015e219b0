"""The one typed settings tree of the pipeline.

Every knob lives here, read from ``TRENDS_*`` environment variables (nested sections joined with ``__``, e.g.
``TRENDS_KAFKA__BOOTSTRAP_SERVERS``) or an optional ``.env`` file. Defaults describe the single-machine stack that
``trends stack up`` runs on loopback; none of the code assumes them: point the same settings at real clusters.
The settings reference (docs/reference/settings.md) is generated from the field descriptions below
(``trends config --update-docs docs/reference/settings.md``).
"""

from __future__ import annotations

import logging
import os
import typing
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NestedSecretsSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from infra.ingest_settings import BridgeSettings, CollectorSettings, IngestSettings
from infra.pipeline_settings import (
    BatchSettings,
    DedupeBy,
    MetricsSettings,
    PrivacySettings,
    ServingSettings,
    SpeedSettings,
    StackSettings,
    ViewSettings,
)
from infra.security import MASK, has_userinfo, is_secret_key
from infra.service_settings import (
    AirflowSettings,
    CassandraSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    SparkSettings,
)
from infra.settings_env import ENV_NESTED_DELIMITER, ENV_PREFIX, env_var

__all__ = [
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "RESTARTS_ENV",
    "SECRETS_DIR_ENV",
    "BatchSettings",
    "BridgeSettings",
    "CollectorSettings",
    "DedupeBy",
    "IngestSettings",
    "MetricsSettings",
    "PrivacySettings",
    "ServingSettings",
    "Settings",
    "SpeedSettings",
    "StackSettings",
    "ViewSettings",
    "get_settings",
]

logger = logging.getLogger(__name__)

SECRETS_DIR_ENV = env_var("secrets_dir")
# How many times the stack's supervisor restarted a command so far (the speed job exports it as a metric); not a
# setting (the supervisor sets it for its child), so named with the prefix rather than by env_var.
RESTARTS_ENV = ENV_PREFIX + "SUPERVISED_RESTARTS"
# Old name -> new name of settings moved between sections (the old one still works, with a deprecation warning).
RENAMED = {("speed", "metrics_port"): ("metrics", "speed_port")}


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return (Path(base) if base else Path.home() / fallback) / "trends"


class Settings(BaseSettings):
    """Root of the settings tree."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        secrets_nested_delimiter=ENV_NESTED_DELIMITER,
        secrets_dir_missing="error",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read code, then the environment, then ``.env``, then the secrets folder (nested names like the env)."""
        return init_settings, env_settings, dotenv_settings, NestedSecretsSettingsSource(file_secret_settings)

    def __init__(self, **values: Any) -> None:
        # Secrets from files (Docker and Kubernetes secrets): one file per setting, named like its variable
        # (TRENDS_KAFKA__SASL_PASSWORD), in the folder TRENDS_SECRETS_DIR names. The environment wins over a file.
        folder = os.environ.get(SECRETS_DIR_ENV, "").strip()
        if folder and "_secrets_dir" not in values:
            values["_secrets_dir"] = folder
        try:
            super().__init__(**values)
        except ValidationError as exc:
            # Pydantic's message repeats each offending input; for a secret field that is the secret itself.
            raise _without_secret_inputs(exc) from None

    data_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_DATA_HOME", ".local/share"),
        description="Server data, logs, pid files and checkpoints of the local stack. Default: ~/.local/share/trends.",
    )
    cache_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache"),
        description="Fetched jars (one folder per server) — outside git, shared by clones. Default: ~/.cache/trends.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Python log level.")
    secrets_dir: Path | None = Field(
        None,
        description="Folder of secret files, one per secret setting named like its variable (e.g. "
        "TRENDS_KAFKA__SASL_PASSWORD), as Docker and Kubernetes mount secrets; the environment wins over a file. "
        "Child processes of the stack get a private folder with only the secrets of the services they talk to.",
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    cassandra: CassandraSettings = Field(default_factory=CassandraSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    stack: StackSettings = Field(default_factory=StackSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    bridge: BridgeSettings = Field(default_factory=BridgeSettings)
    registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    views: ViewSettings = Field(default_factory=ViewSettings)
    speed: SpeedSettings = Field(default_factory=SpeedSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    airflow: AirflowSettings = Field(default_factory=AirflowSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    privacy: PrivacySettings = Field(default_factory=PrivacySettings)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        # Settings renamed keep their old names working, with a warning, until their users have moved.
        if not isinstance(data, dict):
            return data
        for (old_section, old_name), (new_section, new_name) in RENAMED.items():
            section = data.get(old_section)
            if not isinstance(section, dict) or old_name not in section:
                continue
            old, new = f"{old_section}.{old_name}", f"{new_section}.{new_name}"
            msg = f"the setting {old} is deprecated: use {new} ({env_var(new)})"
            warnings.warn(msg, DeprecationWarning, stacklevel=2)
            logger.warning("%s", msg)
            data = {**data, old_section: {k: v for k, v in section.items() if k != old_name}}
            target = data.get(new_section)
            data[new_section] = {new_name: section[old_name], **(target if isinstance(target, dict) else {})}
        return data

    @field_validator("data_dir", "cache_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @model_validator(mode="after")
    def _stack_tls_defaults(self) -> Settings:
        # With the local stack on TLS, its clients trust its CA and encrypt to Cassandra unless told otherwise.
        if self.stack.tls:
            ca = self.tls_dir / "ca.pem"
            if self.kafka.ssl_ca_file is None:
                self.kafka.ssl_ca_file = ca
            if self.kafka.security_protocol == "SSL" and self.kafka.ssl_certificate_file is None:
                # The stack's SSL listeners authenticate clients by certificate: use the stack's client certificate.
                self.kafka.ssl_certificate_file = self.tls_dir / "client.pem"
                self.kafka.ssl_key_file = self.tls_dir / "client-key.pem"
            if "ssl" not in self.cassandra.model_fields_set:
                self.cassandra.ssl = True
            if self.cassandra.ssl_ca_file is None:
                self.cassandra.ssl_ca_file = ca
        return self

    @property
    def tls_dir(self) -> Path:
        """Return the folder of the local stack's CA, server and client certificates (``stack.tls``)."""
        return self.data_dir / "tls"

    @property
    def jars_dir(self) -> Path:
        """Return the folder of fetched jars, one subfolder per bundle."""
        return self.cache_dir / "jars"

    @property
    def subject_key_path(self) -> Path:
        """Return the file of the secret that keys the hash of user ids (``privacy.subject_key_file``)."""
        return self.privacy.subject_key_file or self.data_dir / "privacy" / "subject.key"

    @property
    def checkpoint_root(self) -> str:
        """Return the root of streaming checkpoints (a local path or a URI)."""
        return self.spark.checkpoint_root or str(self.data_dir / "checkpoints")


def _is_secret_field(loc: tuple[int | str, ...]) -> bool:
    """Tell whether an error location lies in a secret: a SecretStr field, a secret-like name, a free-form map."""
    model: type[BaseModel] = Settings
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return False
        if is_secret_key(str(part)) or "SecretStr" in str(field.annotation):
            return True
        if typing.get_origin(field.annotation) is dict or field.annotation is dict:
            return True  # spark.conf, airflow.config: any value may be a key or a connection URI
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return False
        model = field.annotation
    return False


def _without_secret_inputs(exc: ValidationError) -> ValidationError:
    """Return the same validation error with the input of every secret field (or URI with a password) masked."""
    details: list[Any] = []
    for error in exc.errors(include_url=False):
        value = error.get("input")
        if _is_secret_field(tuple(error["loc"])) or (isinstance(value, str) and has_userinfo(value)):
            error["input"] = MASK
        details.append({k: error[k] for k in ("type", "loc", "input", "ctx") if k in error})
    return ValidationError.from_exception_data(exc.title, details)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process-wide settings, read once from the environment."""
    return Settings()
