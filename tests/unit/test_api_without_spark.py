"""The API and the batch exporter run without Spark: neither imports pyspark (nor starts a JVM).

A deployment's API replicas and exporter are small Python processes; pyspark alone adds ~8 MiB and a second of
imports to each, and an accidental import of the views' Spark aggregation is one line away (it happened through a
constant). Checked in a fresh interpreter, since this test session has pyspark loaded already.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# The modules `trends serve` (the app factory and its CLI) and `trends batch exporter` load.
API_MODULES = [
    "app.cli",
    "app.api",
    "serving.cli",
    "serving.api",
    "serving.routes",
    "privacy.api",
    "batch_layer.exporter",
]


@pytest.mark.parametrize("module", API_MODULES)
def test_module_does_not_import_pyspark(module: str) -> None:
    code = (
        f"import {module}, sys; "
        "print(sorted(m for m in sys.modules if m == 'pyspark' or m.startswith(('pyspark.', 'py4j'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_the_app_factory_builds_without_pyspark() -> None:
    """Build the API's app (routes, OpenAPI document) as `trends serve` does, still without pyspark."""
    code = (
        "import sys; from infra.settings import Settings; from app.api import create_app; "
        "app = create_app(Settings()); app.openapi(); "
        "print('pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False"
