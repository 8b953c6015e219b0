"""MkDocs hook: the manual cites no issue or work session, and no page of the nav grows past ``MAX_WORDS`` words.

The docs are a manual: a page states what holds and what to do, and a reader cannot open the issues or the work
sessions that produced it, so "issue 23", "session 4/6/8", "the issue's" or "stop 40" have no place on a page (the
story of a figure belongs on ``history.md``, which is outside the nav). A page of the nav with more than
``MAX_WORDS`` words of prose (outside fenced code blocks: commands and sample output do not make a notebook) is a
lab notebook again: split it by reader. The generated references under ``reference/`` (every setting, every
command) are as long as what they list, so the bound leaves them out.

Each finding is a warning on MkDocs' logger, so ``mkdocs build --strict`` (``make docs-check``) fails on it, with the
page and line; ``mkdocs serve`` shows it. Enabled by ``hooks:`` in ``mkdocs.yml``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger("mkdocs.hooks.manual")

MAX_WORDS = 4000
CITATION = re.compile(
    r"""
    \b(?:issues?|sessions?)\s*\#?\d+                                   # issue 23, issue #12, session 4/6/8
    | \bstop\s+\#?\d+\b(?!\s*(?:s|ms|min|minutes|seconds|times|%)\b)       # stop 40 (not "stop 30 s")
    | \bthe\s+issues?(?:'s)?\b                                          # the issue, the issue's, the issues
    | \b(?:this|that|same|previous|next|earlier|later|quiet)\s+session  # this session's changes, a quiet session
    """,
    re.IGNORECASE | re.VERBOSE,
)

FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
GENERATED = "reference/"  # the settings and CLI references, generated from the code

_in_nav: set[str] = set()


def on_nav(nav: Any, config: Any, files: Any) -> Any:
    """Remember which hand-written pages the nav lists (the size bound applies to them only)."""
    _in_nav.clear()
    _in_nav.update(page.file.src_uri for page in nav.pages if not page.file.src_uri.startswith(GENERATED))
    return nav


def problems(markdown: str, *, in_nav: bool) -> list[str]:
    """Return what is wrong with a page's Markdown: each citation with its line, and its size when over the bound.

    :arg markdown: the page's source.
    :arg in_nav: whether the page is a hand-written page of the nav (only those are bounded in size).
    :returns: one message per finding, empty when the page is fine.
    """
    found = [
        f"line {number}: cites an issue or a work session ({match.group(0)!r}); state the fact, or move the story "
        "to history.md"
        for number, line in enumerate(markdown.splitlines(), 1)
        for match in CITATION.finditer(line)
    ]
    words = len(FENCED.sub("", markdown).split())
    if in_nav and words > MAX_WORDS:
        found.append(f"{words:,} words of prose, over the {MAX_WORDS:,} a page of the nav may have; split it by reader")
    return found


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Warn about each problem of the page (``--strict`` turns the warnings into a failed build)."""
    src = page.file.src_uri
    for problem in problems(markdown, in_nav=src in _in_nav):
        log.warning("%s: %s", src, problem)
    return markdown
