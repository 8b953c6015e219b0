"""The schema registry client, and the two subject calls the events topic in Avro needs: register and list.

confluent-kafka's :class:`~confluent_kafka.schema_registry.SchemaRegistryClient` over the Confluent-compatible REST
API (Confluent Schema Registry, Apicurio Registry's ``/apis/ccompat/v7``), built from ``registry.*``. It needs
confluent-kafka's ``schemaregistry`` extra (the ``trends[sources]`` install). What a schema means is not known
here: the Kafka bridge decodes source topics with it (:mod:`ingestion.wire`), and :mod:`views.event_avro` registers
and reads the event contract's versions.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from infra.errors import TrendsError
from infra.service_settings import SchemaRegistrySettings

logger = logging.getLogger(__name__)


class RegistryError(TrendsError):
    """The schema registry refused a request or did not answer (the message says which, and where)."""


def registry_client(settings: SchemaRegistrySettings) -> Any:
    """Return confluent-kafka's registry client for the settings (it caches schemas by id); no retries of its own."""
    from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: PLC0415

    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one INFO line per schema fetched is noise
    return SchemaRegistryClient(settings.client_config())


def value_subject(topic: str) -> str:
    """Return the subject of a topic's values under Confluent's TopicNameStrategy (``<topic>-value``)."""
    return f"{topic}-value"


def register(client: Any, subject: str, schema: dict[str, Any]) -> int:
    """Register an Avro schema under a subject and return its id (the id it already has, if registered before).

    :raises RegistryError: when the registry refuses it (an incompatible change) or does not answer.
    """
    from confluent_kafka.schema_registry import Schema  # noqa: PLC0415

    try:
        return int(client.register_schema(subject, Schema(json.dumps(schema), "AVRO")))
    except Exception as exc:  # the client's HTTP errors, refusals (409: incompatible) and timeouts alike
        msg = f"cannot register the Avro schema of subject {subject}: {type(exc).__name__}: {exc}"
        raise RegistryError(msg) from exc


def subject_schemas(client: Any, subject: str) -> dict[int, str]:
    """Return every registered version of a subject as schema id -> Avro schema text (an unknown subject: none).

    Versions of another schema type (a subject shared with JSON Schema or Protobuf) are left out.

    :raises RegistryError: when the registry does not answer or refuses the request.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: PLC0415

    out: dict[int, str] = {}
    try:
        versions = client.get_versions(subject)
        for version in versions:
            registered = client.get_version(subject, version)
            schema = registered.schema
            if (schema.schema_type or "AVRO").upper() != "AVRO":
                logger.warning("subject %s version %s is a %s schema: not read", subject, version, schema.schema_type)
                continue
            out[int(registered.schema_id)] = schema.schema_str
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404 and not out:
            return {}  # no version registered yet
        msg = f"the schema registry answered {exc} for subject {subject}"
        raise RegistryError(msg) from exc
    except Exception as exc:  # connection errors and timeouts: the registry did not answer
        msg = f"the schema registry did not answer for subject {subject}: {type(exc).__name__}: {exc}"
        raise RegistryError(msg) from exc
    return out


def schema_text(client: Any, schema_id: int) -> str | None:
    """Return the Avro schema text of a registered id, or None when the registry says it has no such id.

    :raises RegistryError: when the registry does not answer, or the id names a schema that is not Avro.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: PLC0415

    try:
        schema = client.get_schema(schema_id)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            return None
        msg = f"the schema registry answered {exc} for schema id {schema_id}"
        raise RegistryError(msg) from exc
    except Exception as exc:
        msg = f"the schema registry did not answer for schema id {schema_id}: {type(exc).__name__}: {exc}"
        raise RegistryError(msg) from exc
    kind = (schema.schema_type or "AVRO").upper()
    if kind != "AVRO":
        msg = f"schema id {schema_id} is a {kind} schema, not Avro"
        raise RegistryError(msg)
    return str(schema.schema_str)
