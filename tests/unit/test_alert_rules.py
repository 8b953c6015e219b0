"""The shipped alert rules: promtool checks them and runs their unit tests; every alert is tested both ways.

promtool is the one built into the cache by ``make`` (``stack.gotools``; built here if it is missing). Besides
promtool's own verdicts, these tests hold the rules to the house rules: each alert has a ``for:``, a severity and
the three annotations, a section of docs/alerts.md, a firing and a quiet case in ``trends.rules.test.yml``, and only
metrics that some process of the pipeline exports; and the promtool tests fail when an alert can no longer fire.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.settings import Settings
from stack import gotools
from stack.services.prometheus import RULES_FILE, RULES_TESTS, render_config
from tests.helpers import ALERTS, doc_anchors, exported_metric_names


@pytest.fixture(scope="module")
def promtool() -> Path:
    return gotools.binary(Settings(), "promtool")


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def test_promtool_checks_the_rules(promtool: Path) -> None:
    proc = _run(promtool, "check", "rules", RULES_FILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_promtool_unit_tests_of_the_rules_pass(promtool: Path) -> None:
    proc = _run(promtool, "test", "rules", RULES_TESTS.name, cwd=RULES_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_for_severity_annotations_and_a_docs_section() -> None:
    headings = doc_anchors(ALERTS)
    alerts = _alerts()
    assert len(alerts) >= 12
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: no for:"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        ann = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(ann), name
        page, _, anchor = ann["runbook_url"].partition("#")
        assert page == "docs/alerts.md" and anchor == name.lower(), name
        assert anchor in headings, f"{name}: docs/alerts.md has no section '{name}'"


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    cases: dict[str, dict[str, int]] = {}
    for group in yaml.safe_load(RULES_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            kind = "firing" if case.get("exp_alerts") else "quiet"
            counts = cases.setdefault(case["alertname"], {"firing": 0, "quiet": 0})
            counts[kind] += 1
    for rule in _alerts():
        got = cases.get(rule["alert"], {})
        assert got.get("firing") and got.get("quiet"), f"{rule['alert']} needs a firing and a quiet case: {got}"


def test_the_rules_use_only_metrics_the_pipeline_exports() -> None:
    recorded = {r["record"] for r in _rules() if "record" in r}
    exported = exported_metric_names()
    for rule in _rules():
        expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # label values are not metrics
        for name in re.findall(r"\btrends[_:][a-zA-Z0-9_:]+", expr):
            assert name in exported or name in recorded, f"{rule.get('alert') or rule['record']} uses unknown {name}"


def test_the_promtool_tests_fail_when_an_alert_cannot_fire(promtool: Path, tmp_path: Path) -> None:
    # One copy of the rules per alert, that alert made never true; one promtool run over all of them.
    names = [r["alert"] for r in _alerts()]
    for alert in names:
        doc = yaml.safe_load(RULES_FILE.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == alert:
                    rule["expr"] = "vector(1) > 2"
        folder = tmp_path / alert
        folder.mkdir()
        (folder / RULES_FILE.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        tests = yaml.safe_load(RULES_TESTS.read_text())
        tests["tests"] = [g for g in tests["tests"] if any(c["alertname"] == alert for c in g["alert_rule_test"])]
        (folder / RULES_TESTS.name).write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [str(promtool), "test", "rules", *(f"{a}/{RULES_TESTS.name}" for a in names)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: each file's verdict follows its name
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    report = re.split(r"^Processing test file: ", proc.stdout, flags=re.M)[1:]
    verdicts = {part.split("/", 1)[0]: part for part in report}
    assert set(verdicts) == set(names)
    for alert, text in verdicts.items():
        assert "FAILED" in text and f"alertname: {alert}," in text, f"no promtool case notices that {alert} never fires"


def test_the_local_prometheus_config_is_valid(promtool: Path, tmp_path: Path) -> None:
    settings = Settings().model_copy(
        update={"metrics": Settings().metrics.model_copy(update={"ingest_port": 9111, "scrape_interval_s": 1.0})}
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(render_config(settings, extra_targets={"trends-extra": ["127.0.0.1:1"]}))
    proc = _run(promtool, "check", "config", config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = config.read_text()
    assert "scrape_interval: 1000ms" in text and "scrape_timeout: 1000ms" in text
    assert "job_name: trends-ingest" in text and "127.0.0.1:9111" in text and "job_name: trends-extra" in text
