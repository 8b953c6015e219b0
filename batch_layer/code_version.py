"""The code version a batch run records in its lineage (the setting, else the installed package's version)."""

from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from infra.settings import Settings

PACKAGE_DIR = Path(__file__).resolve().parent


def package_version() -> str:
    """Return the installed package's version: from git at build time (e.g. ``0.2.1.dev3+g1a2b3c4``)."""
    try:
        return version("trends")
    except PackageNotFoundError:
        return "unknown"


def _checkout_commit() -> str:
    """Return the commit of a git checkout the code runs from (an editable install), else ''."""
    if not (PACKAGE_DIR.parent / ".git").exists():
        return ""  # an installed wheel: its version already names the commit it was built from
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH, optional
            cwd=PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def code_version(settings: Settings) -> str:
    """Return the code version recorded in the lineage: the setting, else the package's version.

    In a checkout (an editable install, whose version was fixed when it was installed) the current commit replaces
    the version's local part, so a run names the code it really ran.
    """
    if settings.batch.code_version:
        return settings.batch.code_version
    ver = package_version()
    sha = _checkout_commit()
    return f"{ver.split('+', 1)[0]}+g{sha}" if sha else ver
