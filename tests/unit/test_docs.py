"""The manual's own checks: the MkDocs hook that ``make docs-check`` runs, and the metrics reference.

``docs/hooks/manual.py`` warns (and ``mkdocs build --strict`` fails) on a page citing an issue or a work session and
on a page of the nav over its word bound; these tests hold the hook to both, without building the site.
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from tests.helpers import DOCS, METRICS, exported_metric_names


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook_manual", DOCS / "hooks" / "manual.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "text",
    ["See issue 12.", "measured in session 4/6/8", "as the issue's table says", "(stop 40)", "this session's changes"],
)
def test_a_citation_of_an_issue_or_a_session_is_a_problem(hook: ModuleType, text: str) -> None:
    assert hook.problems(f"# Page\n\n{text}\n", in_nav=True)


@pytest.mark.parametrize(
    "text",
    [
        "a Spark session factory",
        "Cassandra stopped for 30 s",
        "the session fixture",
        "a stop 30 s long",
        "it stops 3 times",
    ],
)
def test_ordinary_words_are_not_citations(hook: ModuleType, text: str) -> None:
    assert hook.problems(f"# Page\n\n{text}\n", in_nav=True) == []


def test_a_page_of_the_nav_over_the_bound_is_a_problem_but_code_does_not_count(hook: ModuleType) -> None:
    long = "# Page\n\n" + "word " * (hook.MAX_WORDS + 100)
    assert hook.problems(long, in_nav=True)
    assert hook.problems(long, in_nav=False) == []  # the history appendix is outside the nav
    code = "# Page\n\n```\n" + "word " * (hook.MAX_WORDS + 100) + "\n```\n"
    assert hook.problems(code, in_nav=True) == []


def test_every_page_is_free_of_citations(hook: ModuleType) -> None:
    for page in sorted(DOCS.rglob("*.md")):
        assert hook.problems(page.read_text(), in_nav=False) == [], page


def test_the_metrics_reference_names_every_exported_metric() -> None:
    text = METRICS.read_text()
    # A histogram is documented once, by its name (its _bucket, _sum and _count series follow).
    names = {re.sub(r"_(bucket|sum|count)$", "", name) for name in exported_metric_names()}
    missing = sorted(name for name in names if f"`{name}`" not in text and f"`{name}{{" not in text)
    assert missing == [], "docs/metrics.md lacks these exported metrics"
