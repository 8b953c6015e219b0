"""The code version a batch run records in its lineage (the setting, else the package version and git commit)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from infra.settings import Settings


def code_version(settings: Settings) -> str:
    """Return the code version recorded in the lineage: the setting, else package version + git commit."""
    if settings.batch.code_version:
        return settings.batch.code_version
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        ver = version("trends")
    except PackageNotFoundError:
        ver = "unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH, optional
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{ver}+{sha}" if sha else ver
