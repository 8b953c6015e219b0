"""The reliability suite's result table: a row per case, printed at the end, written to ``artifacts/reliability.md``."""

from __future__ import annotations

from pathlib import Path

ROWS: list[tuple[str, int, int, str]] = []


def record(case: str, events_in: int, accounted: int, ok: bool, note: str = "") -> None:
    """Add a row to the table (before the case's assertions, so a failure shows its figures too)."""
    ROWS.append((case, events_in, accounted, ("PASS" if ok else "FAIL") + (f" ({note})" if note else "")))


def lines() -> list[str]:
    """Return the table as markdown lines (empty when no case ran)."""
    if not ROWS:
        return []
    out = ["| case | events in | events accounted for | result |", "|---|---:|---:|---|"]
    return out + [f"| {c} | {n:,} | {a:,} | {r} |" for c, n, a, r in ROWS]


def write() -> None:
    """Write the table to ``artifacts/reliability.md``."""
    artifacts = Path(__file__).resolve().parents[2] / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "reliability.md").write_text("\n".join(lines()) + "\n")
