"""The network suite's result table: link, fault, what the component did, time to recover, counts after, result.

Printed at the end of the run and written to ``artifacts/network.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    """One case of the table."""

    link: str
    fault: str
    behaviour: str
    recovery: str
    counts: str
    ok: bool


ROWS: list[Row] = []


def record(link: str, fault: str, behaviour: str, recovery_s: float | None, counts: str, ok: bool) -> None:
    """Add a row to the table (before the case's assertions, so a failure shows its figures too)."""
    recovery = "never" if recovery_s is None else f"{recovery_s:.1f} s"
    ROWS.append(Row(link, fault, behaviour, recovery, counts, ok))


def lines() -> list[str]:
    """Return the table as markdown lines (empty when no case ran)."""
    if not ROWS:
        return []
    lines = [
        "| link | fault | what the component did | recovery after healing | counts after | result |",
        "|---|---|---|---:|---|---|",
    ]
    lines += [
        f"| {r.link} | {r.fault} | {r.behaviour} | {r.recovery} | {r.counts} | {'PASS' if r.ok else 'FAIL'} |"
        for r in ROWS
    ]
    return lines


def write() -> None:
    """Write the table to ``artifacts/network.md``."""
    out = Path(__file__).resolve().parents[2] / "artifacts"
    out.mkdir(exist_ok=True)
    (out / "network.md").write_text("\n".join(lines()) + "\n")
