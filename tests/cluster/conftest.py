"""The Spark standalone cluster the cluster tests submit to: started once per session by the stack's own services."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from infra.settings import Settings
from stack import control
from stack.services.spark import SparkMaster


@pytest.fixture(scope="session")
def spark_cluster(stack_up: Settings) -> Iterator[str]:
    """Yield the master's URL (``spark://``); stop what this fixture started unless TRENDS_TEST_KEEP_STACK."""
    results = control.up(stack_up, control.SPARK_CLUSTER)
    yield SparkMaster(stack_up).url
    started = [r.name for r in results if not r.already_running]
    if started and not os.environ.get("TRENDS_TEST_KEEP_STACK"):
        control.down(stack_up, started)
