"""Cells and tables of the markdown summary (and of any scenario's ``render``)."""

from __future__ import annotations

from typing import Any

Row = list[str]


def fmt(value: float | int | None, digits: int = 1, suffix: str = "") -> str:
    """A number for a table cell; '-' for missing."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value}{suffix}"
    return f"{value:.{digits}f}{suffix}"


def mib(n: float | None) -> str:
    """Bytes as MiB with one decimal; '-' for missing."""
    return "-" if n is None else f"{n / 2**20:.1f}"


def table(header: list[str], rows: list[Row]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "NOT met"


def dig(d: Any, *keys: Any) -> Any:
    """``d[k1][k2]...`` with every key as a string; None where a level is missing."""
    for k in keys:
        if not isinstance(d, dict) or str(k) not in d:
            return None
        d = d[str(k)]
    return d
