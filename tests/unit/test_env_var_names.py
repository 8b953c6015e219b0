"""Messages name ``TRENDS_*`` variables through the settings model, never by hand.

A variable typed into a message outlives a renamed or moved setting and sends the operator to a name nothing reads.
``infra.settings_env.env_var`` derives it from the setting's path; this test holds the package to it and checks every
literal path given to it (and every ``${section.field}`` of a command's help) against the model.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from infra.settings import Settings
from infra.settings_env import env_var, setting_exists, with_env_vars

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "batch_layer", "dags", "infra", "ingestion", "privacy", "serving", "speed_layer", "stack", "views")
# A variable name: a section's setting (TRENDS_KAFKA__SASL_PASSWORD) or one of the root's (TRENDS_SECRETS_DIR).
HAND_TYPED = re.compile(r"TRENDS_(?:[A-Z]+__[A-Z0-9_*]+|SECRETS_DIR|CACHE_DIR|DATA_DIR|LOG_LEVEL)")
# Where a hand-typed name stays, and why.
ALLOWED = {
    # The settings model's own field description: written before the model exists, so env_var cannot check it.
    "infra/settings.py",
}
PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_no_message_types_a_variable_name() -> None:
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and HAND_TYPED.search(node.value)
            ):
                found.append(f"{rel}:{node.lineno}: {HAND_TYPED.search(node.value).group(0)}")  # type: ignore[union-attr]
    assert not found, "name these with infra.settings_env.env_var:\n" + "\n".join(found)


def test_every_named_setting_exists() -> None:
    paths = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "env_var"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                paths.append(node.args[0].value)
        for func in ast.walk(tree):
            decorated = isinstance(func, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "with_env_vars" for d in func.decorator_list
            )
            if decorated:
                paths += PLACEHOLDER.findall(ast.get_docstring(func) or "")
    assert len(paths) > 50
    assert sum(1 for p in paths if p in {"serving.api_token", "cache_dir", "airflow.config"}) >= 4
    missing = sorted({p for p in paths if not setting_exists(Settings, p)})
    assert not missing, f"settings named in messages that the model does not hold: {missing}"


def test_env_var_follows_the_model() -> None:
    assert env_var("kafka.sasl_password") == "TRENDS_KAFKA__SASL_PASSWORD"
    assert env_var("secrets_dir") == "TRENDS_SECRETS_DIR"
    assert env_var("views.*") == "TRENDS_VIEWS__*"
    for right in ("kafka.sasl_password", "secrets_dir", "views.*"):
        assert setting_exists(Settings, right)
    for wrong in ("kafka.no_such_setting", "no_such_section.port", "log_level.x", "*", "kafka.*.x"):
        assert not setting_exists(Settings, wrong)


def test_with_env_vars_fills_a_docstring() -> None:
    def command() -> None:
        """Needs ${serving.api_token}; see ${views.*}."""

    assert with_env_vars(command).__doc__ == "Needs TRENDS_SERVING__API_TOKEN; see TRENDS_VIEWS__*."
