"""The shipped Grafana dashboards (``infra/grafana/``), without Grafana: they are the generator's output, every
panel's PromQL parses (promtool), links to a docs section that exists (its alert, else its metric), and names only
metrics the code exports.

Whether the panels show data on a real Prometheus scraping a running pipeline is ``tests/services/test_dashboards.py``
(``make test-alerting``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra import dashboards
from infra.settings import Settings
from stack import gotools
from tests.helpers import DOCS, dashboard_metrics, dashboard_panels, doc_anchors, exported_metric_names

RATE_INTERVAL = "1m"  # what $__rate_interval becomes (any valid range parses alike)


@pytest.fixture(scope="module")
def promtool() -> Path:
    return gotools.binary(Settings(), "promtool")


def test_the_committed_dashboards_are_the_generators_output() -> None:
    committed = {p.name: p.read_text() for p in dashboards.GRAFANA_DIR.glob("*.json")}
    assert committed == dashboards.files(), "run `python -m infra.dashboards` and commit infra/grafana/"


def test_four_dashboards_with_panels_of_every_layer() -> None:
    panels = dashboard_panels()
    by_dashboard = {d: sum(p.dashboard == d for p in panels) for d in {p.dashboard for p in panels}}
    assert set(by_dashboard) == {"trends / speed layer", "trends / batch layer", "trends / ingestion", "trends / API"}
    assert all(n >= 4 for n in by_dashboard.values()), by_dashboard
    assert len({p.name for p in panels}) == len(panels), "two panels of a dashboard share a title"


def test_promtool_parses_every_panel_query(promtool: Path, tmp_path: Path) -> None:
    # One group per panel (its name in promtool's error), one recording rule per query, variables substituted.
    panels = dashboard_panels()
    groups = [
        {
            "name": p.name,
            "rules": [
                {"record": f"dashboard:panel{i}:query{j}", "expr": q} for j, q in enumerate(p.queries(RATE_INTERVAL))
            ],
        }
        for i, p in enumerate(panels)
    ]
    rules = tmp_path / "panels.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    queries = sum(len(p.exprs) for p in panels)
    assert f"SUCCESS: {queries} rules found" in proc.stdout


def test_every_panel_links_to_its_docs_section() -> None:
    anchors = {page: doc_anchors(DOCS / f"{page}.md") for page in ("alerts", "metrics")}
    for panel in dashboard_panels():
        assert len(panel.links) == 1, f"{panel.name}: {panel.links}"
        found = re.fullmatch(r"\$\{docs\}/(alerts|metrics)/#([a-z0-9-]+)", panel.links[0])
        assert found, f"{panel.name}: {panel.links[0]} is not a section of the alerts or the metrics page"
        page, anchor = found.groups()
        assert anchor in anchors[page], f"{panel.name}: docs/{page}.md has no section #{anchor}"


def test_every_metric_a_panel_uses_is_exported_by_the_pipeline() -> None:
    used = dashboard_metrics()
    unknown = {name: sorted(where) for name, where in used.items() if name not in exported_metric_names()}
    assert unknown == {}
    for panel in dashboard_panels():
        assert all(re.search(r"\btrends_", e) for e in panel.exprs), f"{panel.name}: a query names no trends metric"


def test_rates_use_grafanas_rate_interval() -> None:
    for panel in dashboard_panels():
        for expr in panel.exprs:
            unquoted = re.sub(r'"[^"]*"', '""', expr)  # a label regex is not a range
            for window in re.findall(r"\b(?:rate|irate)\([^\[]*\[([^\]]+)\]", unquoted):
                assert window == "$__rate_interval", f"{panel.name}: rate over [{window}]"
