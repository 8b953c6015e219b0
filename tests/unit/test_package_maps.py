"""The maps stay true: every package's docstring names each of its modules, and names no module that is gone.

A newcomer finds where a thing lives from the package docstrings and the README's layout; a module added, moved or
renamed without its map fails here, as a setting without its documentation fails the settings page's test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = ["app", "batch_layer", "dags", "infra", "ingestion", "privacy", "serving", "speed_layer", "stack", "views"]
PACKAGES = sorted(
    init.parent.relative_to(ROOT)
    for top in TOP
    for init in (ROOT / top).rglob("__init__.py")
    if "__pycache__" not in init.parts
)
# ``name`` or :mod:`pkg.name` / :func:`pkg.name.f` in a docstring
NAMED = re.compile(r"``([a-z_][a-z0-9_]*)``|:(?:mod|func|class):`~?([a-z_][a-z0-9_.]*)`")


def _docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""


def _members(package: Path) -> set[str]:
    folder = ROOT / package
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    subpackages = {p.parent.name for p in folder.glob("*/__init__.py")}
    return modules | subpackages


@pytest.mark.parametrize("package", PACKAGES, ids=str)
def test_the_package_docstring_names_every_module(package: Path) -> None:
    doc = _docstring(package)
    named = {m.group(1) or m.group(2).split(".")[-1] for m in NAMED.finditer(doc)}
    named |= {m.group(2).split(".")[len(package.parts)] for m in NAMED.finditer(doc) if m.group(2) and
              m.group(2).startswith(".".join(package.parts) + ".")}  # fmt: skip
    missing = sorted(_members(package) - named)
    assert not missing, f"{package}/__init__.py does not name {missing}: say what each one is for"


@pytest.mark.parametrize("package", PACKAGES, ids=str)
def test_every_module_a_package_docstring_references_exists(package: Path) -> None:
    for match in NAMED.finditer(_docstring(package)):
        dotted = match.group(2)
        if not dotted or dotted.split(".")[0] not in TOP:
            continue
        parts = dotted.split(".")
        # the longest prefix that is a module or package; the rest are attributes
        for n in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:n])
            if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
                break
        else:
            pytest.fail(f"{package}/__init__.py names {dotted}, which does not exist")
        assert n >= min(len(parts), 2), f"{package}/__init__.py names {dotted}: no such module"


def test_the_readme_layout_names_every_top_level_package() -> None:
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("##", 1)[0]
    for top in TOP:
        assert re.search(rf"^{top}/\s", layout, re.M), f"the README's layout lacks {top}/"
