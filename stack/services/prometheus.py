"""Monitoring in the local stack: the batch exporter and a Prometheus server that scrapes the pipeline.

``batch-exporter`` runs ``trends batch exporter`` in the background (as a command, never imported: infra stays below
the layers). ``prometheus`` runs the server built from Go modules into the cache (:mod:`stack.gotools`) with a
config rendered from ``stack/conf/prometheus.yml`` and the shipped rules (``trends.rules.yml``), on loopback,
its data under ``<data_dir>/prometheus/data``.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from typing_extensions import override

from infra.settings import Settings
from infra.settings_env import env_var
from stack import gotools
from stack.process import http_ok, write_private
from stack.services.base import LoopbackProcess
from stack.services.pipeline import PipelineService

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "infra" / "prometheus"  # the rules ship with what they watch
RULES_FILE = PROMETHEUS_DIR / "trends.rules.yml"
RULES_TESTS = PROMETHEUS_DIR / "trends.rules.test.yml"
CONFIG_TEMPLATE = Path(__file__).resolve().parent.parent / "conf" / "prometheus.yml"


def _reach(host: str) -> str:
    """Return where a process bound to ``host`` is reached locally (a wildcard bind is reached on loopback)."""
    return "127.0.0.1" if host in {"0.0.0.0", "::", ""} else host  # noqa: S104 - not a bind: a wildcard's address


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def render_config(
    settings: Settings, *, rules_file: Path = RULES_FILE, extra_targets: dict[str, list[str]] | None = None
) -> str:
    """Return the Prometheus configuration of these settings.

    :arg rules_file: the rules to evaluate (tests pass a copy with shorter ``for:`` durations).
    :arg extra_targets: more scrape jobs, job name -> host:port targets.
    """
    m = settings.metrics
    extra = dict(extra_targets or {})
    if m.ingest_port:
        extra.setdefault("trends-ingest", [f"{_reach(m.host)}:{m.ingest_port}"])
    blocks = [
        f"  - job_name: {job}\n    static_configs:\n      - targets: [{', '.join(f'{t!r}' for t in targets)}]"
        for job, targets in extra.items()
    ]
    return Template(CONFIG_TEMPLATE.read_text()).substitute(
        scrape_interval=_duration(m.scrape_interval_s),
        scrape_timeout=_duration(min(m.scrape_interval_s, 10.0)),
        evaluation_interval=_duration(m.evaluation_interval_s),
        rules_file=str(rules_file),
        batch_exporter=f"{_reach(m.host)}:{m.batch_exporter_port}",
        speed=f"{_reach(m.host)}:{settings.metrics.speed_port}",
        api=f"{_reach(settings.serving.host)}:{settings.serving.port}",
        extra_scrape_configs="\n".join(blocks),
    )


class BatchExporterService(PipelineService):
    """``trends batch exporter`` in the background: ready once its /metrics answers."""

    name = "batch-exporter"
    args = ("batch", "exporter")
    secret_sections = ("cassandra", "airflow")  # it reads the views and asks Airflow's REST API

    @property
    @override
    def host(self) -> str:
        return _reach(self.settings.metrics.host)

    @property
    @override
    def client_port(self) -> int:
        return self.settings.metrics.batch_exporter_port

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.client_port, "metrics", env_var("metrics.batch_exporter_port"))]

    @override
    def accepts_clients(self) -> bool:
        return http_ok(f"http://{self.host}:{self.client_port}/metrics")


class PrometheusService(LoopbackProcess):
    """A Prometheus server on loopback scraping the pipeline and evaluating the shipped alert rules."""

    name = "prometheus"
    bundle = None
    needs_java = False

    def __init__(self, settings: Settings, *, rules_file: Path = RULES_FILE) -> None:
        super().__init__(settings)
        self.rules_file = rules_file
        self.extra_targets: dict[str, list[str]] = {}

    @property
    @override
    def client_port(self) -> int:
        return self.settings.metrics.prometheus_port

    @property
    def url(self) -> str:
        """Return the server's base URL (UI and HTTP API)."""
        return f"http://{self.host}:{self.client_port}"

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.client_port, "HTTP", env_var("metrics.prometheus_port"))]

    @override
    def render_config(self) -> Path:
        target = self.conf_dir / "prometheus.yml"
        text = render_config(self.settings, rules_file=self.rules_file, extra_targets=self.extra_targets)
        write_private(target, text)
        return target

    @override
    def command(self, java: str, config: Path) -> list[str]:
        return [
            str(gotools.binary(self.settings, "prometheus")),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.home / 'data'}",
            f"--web.listen-address={self.host}:{self.client_port}",
            "--storage.tsdb.retention.time=15d",
        ]

    @override
    def accepts_clients(self) -> bool:
        return http_ok(f"{self.url}/-/ready")
