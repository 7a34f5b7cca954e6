"""What every paper-experiment script shares: its `--quick`/`--out` command line, and writing its
result table twice, as CSV (every column, for scripts) and as Markdown (the table its README shows).

The scripts run as `python experiments/NAME/run.py`, so they put this folder on sys.path and import
this module by name; it is not part of the installed hetsim package.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

__all__ = ["experiment_config", "write_results", "markdown_table", "pyplot", "save_figure"]

C = TypeVar("C")


def experiment_config(default: C, quick: Callable[[C], C], argv: list[str] | None, *,
                      description: str, quick_help: str) -> C:
    """The script's config: `default`, or `quick(default)` with --quick; --out replaces its `out`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: results/ here)")
    args = parser.parse_args(argv)
    config = quick(default) if args.quick else default
    return config if args.out is None else replace(config, out=args.out)


def markdown_table(header: list[str], cells: Iterable[Iterable[Any]]) -> str:
    """A Markdown table: one line of titles, the separator, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict], out: Path, stem: str, markdown: str) -> str:
    """Write `out/STEM.csv` (every key of every row; a row lacking one leaves it empty) and
    `out/STEM.md`; return the Markdown so the script can print it."""
    out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.md").write_text(markdown)
    return markdown


def pyplot():
    """matplotlib.pyplot drawing to files only (Agg), imported when a script plots, not before."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path) -> None:
    """Write `fig` as the experiments' PNGs are written (tight layout, 120 dpi) and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
