"""Plain-text tables for the command line and the benchmark report."""
from __future__ import annotations

from typing import Any, Sequence


def _numeric(cell: str) -> bool:
    try:
        float(cell.rstrip("x%"))
        return True
    except ValueError:
        return cell in ("", "-", "err", "n/a")


def format_table(headers: Sequence[str], lines: Sequence[Sequence[Any]]) -> str:
    """Plain-text table: numeric columns right-aligned, text columns left-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in line] for line in lines]
    ncol = len(headers)
    widths = [max(len(row[i]) for row in cells) for i in range(ncol)]
    right = [all(_numeric(row[i]) for row in cells[1:]) and any(row[i] for row in cells[1:])
             for i in range(ncol)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(row, widths, right)).rstrip()

    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


__all__ = ["format_table"]
