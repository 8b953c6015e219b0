"""The reliability suite's fixtures: a private pipeline per case (:mod:`tests.pipeline`) and the result table.

Each case runs the real pipeline on a fresh topic and keyspace, injects its fault, and ends by asking the serving
layer for the window. Every case adds a row (case, events in, events accounted for, result) to the table
(:mod:`tests.reliability.table`) printed at the end and written to ``artifacts/reliability.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.settings import Settings
from tests.pipeline import Pipeline, private_pipeline
from tests.reliability import table


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not table.ROWS:
        return
    terminalreporter.write_sep("=", "reliability")
    for line in table.lines():
        terminalreporter.write_line(line)
    table.write()


@pytest.fixture
def pipeline(stack_up: Settings, tmp_path: Path) -> Iterator[Pipeline]:
    """A private pipeline whose final answer is recorded in the suite's table."""
    with private_pipeline(stack_up, tmp_path, on_result=table.record) as p:
        yield p
