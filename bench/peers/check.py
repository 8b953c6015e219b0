"""Exact before fast: a system's output rows against the generator's truth.

The truth is kept per (minute, slice) while the bench produces the events (duplicates not counted). A system is
exact when every minute's count is right (so the global slice totals every event), distinct users and quantiles
are within the sketches' bounds, and its top items' counts within theirs. Bounds are statistical for HLL and KLL:
an estimate outside its 2-sigma (HLL) or 99 % (KLL) bound is expected now and then, so a system fails those checks
only when more than 10 % of the cells are outside or any one is outside twice the bound; counts and the frequent
items' bounds are deterministic and must hold everywhere.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import summary

logger = logging.getLogger(__name__)


@dataclass
class Cell:
    """What one (minute, slice) truly holds."""

    count: int = 0
    users: set[str] = field(default_factory=set)
    values: list[float] = field(default_factory=list)
    items: Counter[str] = field(default_factory=Counter)


@dataclass
class Truth:
    """The generator's truth: every cell, and the number of distinct events."""

    cells: dict[tuple[int, str], Cell] = field(default_factory=dict)
    total: int = 0

    def add(self, event: dict[str, Any]) -> None:
        """Count one (original, not duplicated) event in its minute's cells."""
        ts = datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))
        bucket = int(ts.timestamp()) // 60 * 60
        self.total += 1
        for name in summary.slices(event.get("dims", {}).get("origin")):
            cell = self.cells.get((bucket, name))
            if cell is None:
                cell = self.cells[bucket, name] = Cell()
            cell.count += 1
            cell.users.add(event["user"])
            if event.get("value") is not None:
                cell.values.append(float(event["value"]))
            cell.items[event["item"]] += 1


@dataclass
class Result:
    """A system's exactness: lost (or extra) events and what else failed."""

    lost: int = 0
    extra: int = 0
    cells: int = 0
    wrong_counts: int = 0
    users_out: int = 0
    users_far: int = 0
    quantiles_out: int = 0
    quantiles_far: int = 0
    quantile_checks: int = 0
    items_out: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Tell whether the output passes every check."""
        tolerance = max(1, self.cells // 10)
        return (
            self.lost == 0
            and self.extra == 0
            and self.wrong_counts == 0
            and self.users_out <= tolerance
            and self.users_far == 0
            and self.quantiles_out <= max(1, self.quantile_checks // 10)
            and self.quantiles_far == 0
            and self.items_out == 0
        )

    def line(self) -> str:
        """Return the one-line verdict printed beside the system's figure."""
        if self.exact:
            return (
                f"exact ({self.cells} cells; users outside 2 sigma {self.users_out}, quantiles outside rank error "
                f"{self.quantiles_out}/{self.quantile_checks})"
            )
        return (
            f"NOT exact: lost {self.lost:,} events, extra {self.extra:,}, {self.wrong_counts} wrong minute counts, "
            f"users out {self.users_out} (far {self.users_far}), quantiles out {self.quantiles_out} "
            f"(far {self.quantiles_far}), items out {self.items_out}"
        )


def global_total(rows: list[dict[str, Any]], truth: Truth) -> int:
    """Return the events a system counted in the global slice over the truth's minutes."""
    return sum(
        r["events"] for r in rows if r["slice"] == summary.GLOBAL_SLICE and (r["bucket"], r["slice"]) in truth.cells
    )


def check(rows: list[dict[str, Any]], truth: Truth) -> Result:
    """Check a system's summarized rows against the truth."""
    result = Result(cells=len(truth.cells))
    got = {(r["bucket"], r["slice"]): r for r in rows}
    for key, cell in sorted(truth.cells.items()):
        row = got.get(key)
        if row is None:
            result.lost += cell.count if key[1] == summary.GLOBAL_SLICE else 0
            result.wrong_counts += 1
            result.notes.append(f"{key}: missing ({cell.count} events)")
            continue
        if row["events"] != cell.count:
            result.wrong_counts += 1
            if key[1] == summary.GLOBAL_SLICE:
                diff = cell.count - row["events"]
                result.lost += max(0, diff)
                result.extra += max(0, -diff)
            result.notes.append(f"{key}: {row['events']} events, truly {cell.count}")
            continue
        _users(row, cell, result, key)
        _quantiles(row, cell, result, key)
        _items(row, cell, result, key)
    return result


def _users(row: dict[str, Any], cell: Cell, result: Result, key: tuple[int, str]) -> None:
    users, true = row["users"], len(cell.users)
    if "exact" in users:
        if users["exact"] != true:
            result.users_far += 1
            result.notes.append(f"{key}: {users['exact']} users, truly {true}")
        return
    if not users["lower2"] <= true <= users["upper2"]:
        result.users_out += 1
    if abs(users["estimate"] - true) > 4 * users["rse"] * true:
        result.users_far += 1
        result.notes.append(f"{key}: ~{users['estimate']:.0f} users, truly {true}")


def _quantiles(row: dict[str, Any], cell: Cell, result: Result, key: tuple[int, str]) -> None:
    values = sorted(cell.values)
    n = len(values)
    for q_text, answer in row["quantiles"].items():
        q, value = float(q_text), answer["value"]
        # the ranks the value can stand at: [values below it, values up to it] / n
        low, high = bisect.bisect_left(values, value) / n, bisect.bisect_right(values, value) / n
        eps = answer["rank_error"] or 1 / n  # an exact percentile interpolates between neighbours
        off = max(0.0, low - q, q - high)
        result.quantile_checks += 1
        if off > eps:
            result.quantiles_out += 1
        if off > 2 * eps:
            result.quantiles_far += 1
            result.notes.append(f"{key}: q{q} = {value} stands at rank {low:.4f}-{high:.4f}")


def _items(row: dict[str, Any], cell: Cell, result: Result, key: tuple[int, str]) -> None:
    top = row["top"]
    listed = {i["item"]: i for i in top["items"]}
    for item in top["items"]:
        if not item["lower"] <= cell.items[item["item"]] <= item["upper"]:
            result.items_out += 1
            result.notes.append(
                f"{key}: {item['item']} counted {item['lower']}-{item['upper']}, truly {cell.items[item['item']]}"
            )
    # a heavy item must be listed, unless the list is full of items at least as heavy (ties at the cut are fine)
    floor = min((i["upper"] for i in top["items"]), default=0) if len(top["items"]) >= summary.TOP_LISTED else 0
    for item, count in cell.items.most_common(5):
        if item not in listed and count > top["max_error"] and count > floor:
            result.items_out += 1
            result.notes.append(f"{key}: {item} ({count}) not among the top items")
