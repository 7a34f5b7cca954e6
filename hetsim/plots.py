"""Figures people would rather look at than read: a pipeline timeline and utilisation bars.

Both work from the shared formats (trace JSON, Report), so predictions and measurements plot alike.
matplotlib is imported here only, and only when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetsim.errors import HetsimError
from hetsim.report import Report
from hetsim.units import GIB

__all__ = ["plot_timeline", "plot_utilisation", "plot_report", "plot_sweep"]

_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "sync": "#C44E52", "wait": "#CCCCCC"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _rows(trace: dict[str, Any]) -> tuple[list[tuple[int, int]], dict[tuple[int, int], str]]:
    """Each row's label, its process (a node) before its thread ("gpu0 TYPE [...]"): two nodes' gpu0
    would otherwise read alike."""
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    process = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    if len({pid for pid, _ in names}) > 1:
        names = {(pid, tid): f"{process.get(pid, pid)}/{name}" for (pid, tid), name in names.items()}
    return list(names), names


def _colour(event: dict[str, Any]) -> str:
    if event.get("cat") in ("sync", "wait"):
        return _COLOURS[event["cat"]]
    return _COLOURS.get(event["name"][:1], "#55A868")


def plot_timeline(trace: dict[str, Any], path: str | Path, *, start_s: float = 0.0,
                  end_s: float | None = None, title: str = "") -> Path:
    """One row per GPU: forwards blue, backwards orange, sync red, waits grey."""
    plt = _pyplot()
    order, names = _rows(trace)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    if end_s is None:
        end_s = max((e["ts"] + e["dur"]) / 1e6 for e in spans) if spans else 1.0
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(order) + 1.5))
    for y, row in enumerate(order):
        mine = [e for e in spans if (e["pid"], e["tid"]) == row
                and e["ts"] / 1e6 < end_s and (e["ts"] + e["dur"]) / 1e6 > start_s]
        ax.broken_barh([(e["ts"] / 1e6, e["dur"] / 1e6) for e in mine], (y - 0.4, 0.8),
                       facecolors=[_colour(e) for e in mine], linewidth=0)
    ax.set_yticks(range(len(order)), [names[r] for r in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(start_s, end_s)
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"timeline ({trace.get('otherData', {}).get('kind', '')})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLOURS.values()]
    ax.legend(handles, ["forward", "backward", "sync", "wait"], loc="upper right", fontsize=7, ncols=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_utilisation(report: Report, path: str | Path) -> Path:
    """GPU busy fraction and memory (used vs capacity), and the busiest links."""
    plt = _pyplot()
    fig, (ax_busy, ax_mem, ax_link) = plt.subplots(3, 1, figsize=(12, 9))
    labels = [f"{g.id}\n{g.vw} s{g.stage}" for g in report.gpus]
    vws = sorted({g.vw for g in report.gpus})
    colours = [plt.cm.tab10(vws.index(g.vw) % 10) for g in report.gpus]
    ax_busy.bar(labels, [g.busy_fraction for g in report.gpus], color=colours)
    ax_busy.set_ylim(0, 1)
    ax_busy.set_ylabel("busy fraction")
    ax_mem.bar(labels, [g.memory_capacity_bytes / GIB for g in report.gpus], color="#DDDDDD", label="capacity")
    ax_mem.bar(labels, [g.memory_bytes / GIB for g in report.gpus], color=colours, label="peak use")
    ax_mem.set_ylabel("memory (GiB)")
    ax_mem.legend(fontsize=7)
    links = sorted(report.links, key=lambda l: -l.utilisation)[:16]
    ax_link.bar([l.id for l in links], [l.utilisation for l in links], color="#8172B2")
    ax_link.set_ylabel("link utilisation")
    for ax in (ax_busy, ax_mem, ax_link):
        ax.tick_params(axis="x", labelsize=6, rotation=90)
    fig.suptitle(f"{report.kind}: {report.plan.get('name', '')} on {report.cluster} — "
                 f"{report.throughput['samples_per_s']:.1f} samples/s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_report(report: Report, out_dir: str | Path) -> list[Path]:
    """timeline.png (a few waves of the steady state) and utilisation.png, in `out_dir` (made if need be)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HetsimError(f"figures folder {out}: cannot write there ({exc.strerror or exc})") from None
    paths = [plot_utilisation(report, out / "utilisation.png")]
    if report.trace is not None:
        start = report.window["start_s"]
        per_vw = max(v.minibatches_per_s for v in report.virtual_workers) or 1.0
        nm = report.plan.get("nm", 1)
        end = min(report.window["end_s"], start + 4 * nm / per_vw)
        paths.append(plot_timeline(report.trace.to_dict(), out / "timeline.png", start_s=start, end_s=end,
                                   title=f"{report.kind} timeline, 4 waves of steady state"))
    return paths


def plot_sweep(rows: list[dict[str, Any]], axes: list[str], path: str | Path, *,
               figure: str = "samples_per_s") -> Path:
    """`figure` against the first axis of a sweep, one line per value of the second (if any); points
    that failed are left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x_axis, series = axes[0], axes[1] if len(axes) > 1 else None
    keys = list(dict.fromkeys(r[series] for r in rows)) if series else [None]
    for key in keys:
        mine = [r for r in rows if not r["error"] and (series is None or r[series] == key)]
        ax.plot([r[x_axis] for r in mine], [r[figure] for r in mine], marker="o",
                label=f"{series}={key:g}" if series else None)
    ax.set_xlabel(x_axis)
    label = figure.replace("_per_s", "/s").replace("_", " ")
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    if series:
        ax.legend(fontsize=8)
    ax.set_title(f"sweep: {label} vs {' and '.join(axes)}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
