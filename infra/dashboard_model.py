"""Grafana's dashboard model and its JSON: the panel types the pipeline's dashboards are declared with, rendered.

:mod:`infra.dashboards` declares the panels; here is the shape every panel shares (data source, layout, thresholds,
the link to its docs section) and the variables (``datasource``, ``docs``, the label filters), written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

DOCS_URL = "http://127.0.0.1:8001"  # `make docs`; set the `docs` variable to where your docs site lives
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
SCHEMA_VERSION = 39  # Grafana 10.4 / 11
WIDTH, HEIGHT, PER_LINE = 8, 8, 3


# The docs pages a panel links to, and the title of the link.
DocsPage = Literal["alerts", "metrics"]
LINK_TITLES: dict[DocsPage, str] = {"alerts": "Alert: what to do", "metrics": "Metric: what it is"}


@dataclass(frozen=True)
class Target:
    """One query of a panel: a PromQL expression and the legend of its series."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A time series (or, ``stat=True``, a single-value) panel and the docs section that says what to do about it."""

    title: str
    description: str
    targets: tuple[Target, ...]
    anchor: str  # the id MkDocs gives the section's heading on ``page``
    unit: str = "short"
    red_from: float | None = None  # colour values from here on red (the alert's threshold, where one exists)
    stat: bool = False
    page: DocsPage = "alerts"  # the alert on this series (docs/alerts.md), else what the metric is (docs/metrics.md)


@dataclass(frozen=True)
class Row:
    """A titled row of panels."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Filter:
    """A multi-value label variable (``$name`` in the queries; "All" is every value, ``.*``)."""

    name: str
    label: str
    metric: str


@dataclass(frozen=True)
class Dashboard:
    """One dashboard: its uid (the file's name), rows of panels and its label filters."""

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    filters: tuple[Filter, ...] = field(default=())


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    thresholds: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if panel.red_from is not None:
        thresholds.append({"color": "red", "value": panel.red_from})
    options: dict[str, Any] = (
        {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
        if panel.stat
        else {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        }
    )
    return {
        "id": pid,
        "type": "stat" if panel.stat else "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": HEIGHT, "w": WIDTH, "x": x, "y": y},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend,
                "range": True,
            }
            for i, t in enumerate(panel.targets)
        ],
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "thresholds": {"mode": "absolute", "steps": thresholds}},
            "overrides": [],
        },
        "options": options,
        "links": [
            {"title": LINK_TITLES[panel.page], "url": f"${{docs}}/{panel.page}/#{panel.anchor}", "targetBlank": True}
        ],
    }


def _variables(dashboard: Dashboard) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        },
        {
            "type": "textbox",
            "name": "docs",
            "label": "Docs site (panel links)",
            "query": DOCS_URL,
            "current": {"text": DOCS_URL, "value": DOCS_URL},
            "hide": 2,
            "options": [{"selected": True, "text": DOCS_URL, "value": DOCS_URL}],
        },
    ]
    for f in dashboard.filters:
        query = f"label_values({f.metric}, {f.name})"
        out.append(
            {
                "type": "query",
                "name": f.name,
                "label": f.label,
                "datasource": DATASOURCE,
                "definition": query,
                "query": {"query": query, "refId": f"{f.name}-values"},
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "refresh": 2,
                "sort": 1,
                "hide": 0,
                "regex": "",
                "options": [],
            }
        )
    return out


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Return the Grafana dashboard JSON of a dashboard (rows laid out three panels to a line)."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in dashboard.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, panel in enumerate(row.panels):
            panels.append(_panel(panel, pid, (i % PER_LINE) * WIDTH, y + (i // PER_LINE) * HEIGHT))
            pid += 1
        y += -(-len(row.panels) // PER_LINE) * HEIGHT
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["trends"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "title": "trends dashboards",
                "tags": ["trends"],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
            },
            {"type": "link", "title": "Runbook", "url": "${docs}/runbook/", "targetBlank": True, "icon": "doc"},
        ],
        "templating": {"list": _variables(dashboard)},
        "panels": panels,
    }
