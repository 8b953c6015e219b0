"""``trends collect`` (also ``trends ingest collect``): serve the HTTP collector of :mod:`ingestion.collector`."""

from __future__ import annotations

import logging
import time

import click

from infra.security import listen_options
from infra.settings import Settings
from infra.settings_env import env_var, with_env_vars
from ingestion.cli_options import scoped, topic_options

logger = logging.getLogger(__name__)

COLLECT_EXAMPLES = """\b
Examples:
  trends collect
  curl -s -H 'Content-Type: application/json' -d '[{"ts": "2026-11-27T10:00:00Z", "item": "#a", "user": "u1"}]' \\
      http://127.0.0.1:8010/api/v1/events
  gzip -c events.jsonl | curl -s -H 'Content-Type: application/x-ndjson' -H 'Content-Encoding: gzip' \\
      --data-binary @- http://127.0.0.1:8010/api/v1/events
"""


@click.command(epilog=COLLECT_EXAMPLES)
@listen_options("collector")
@topic_options
@click.pass_obj
@with_env_vars
def collect(
    settings: Settings,
    *,
    host: str | None,
    port: int | None,
    insecure: bool,
    topic: str | None,
    dlq_topic: str | None,
    key_field: str | None,
) -> None:
    """Serve the HTTP collector: POST /api/v1/events puts a batch of events into Kafka.

    The body is a JSON array of events (application/json) or JSON lines (application/x-ndjson), gzip allowed;
    each record is validated as `trends ingest file` does. The answer comes once Kafka acknowledged every record:
    200 with the accepted and rejected counts (rejects go to the dead-letter topic with their reason), or 503 with
    Retry-After. Requests need ${serving.api_token} when it is set; off loopback it must be set.
    `trends collect` and `trends ingest collect` are the same command.
    """
    from infra.errors import TrendsError
    from infra.security import refuse_exposure
    from ingestion.producer import EventProducer

    settings = scoped(settings, topic, dlq_topic, key_field)
    host = host if host is not None else settings.collector.host
    port = port if port is not None else settings.collector.port
    refuse_exposure(
        "the collector",
        host,
        settings.serving.api_token,
        host_var=f"--host/{env_var('collector.host')}",
        insecure=insecure,
        risk="write events",
    )
    # Missing topics are a set-up error, found now (after a short wait: topics just created may not be in the
    # broker's metadata yet); an unreachable broker is not: requests get 503 until it is back.
    probe = EventProducer(settings)
    deadline = time.monotonic() + settings.collector.delivery_timeout_s
    try:
        while True:
            try:
                probe.check_topics(timeout_s=settings.collector.delivery_timeout_s)
                break
            except TrendsError as exc:
                if "do not exist" not in str(exc):
                    logger.warning("starting without Kafka (%s): requests get 503 until it answers", exc)
                    break
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        probe.close(5, raise_on_failure=False)

    import uvicorn

    from ingestion.collector import EVENTS_PATH, create_app

    click.echo(f"collector http://{host}:{port}{EVENTS_PATH}  metrics http://{host}:{port}/metrics", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level.lower(), access_log=False)
