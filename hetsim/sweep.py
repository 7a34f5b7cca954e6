"""Sweeps: a grid of what-ifs around one simulation, one row of figures per point.

    axes = parse_axes(["nm=2,4", "slowdown.node2=1,1.5"])      # cartesian product, first axis outermost
    base = SweepBase(cluster=c, profile=p, plan=plan, waves=20)
    rows = [run_point((base, point)) for point in grid(axes)]

A point changes the plan (staleness, nm), the options (waves, jitter, seed, slowdown.X) or the
cluster (network.*) exactly as the edited file or option would for `hetsim simulate`, so every row
equals what `simulate` reports for that point. A point that cannot run becomes a row with its error.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from hetsim.cluster import Cluster
from hetsim.errors import HetsimError
from hetsim.plan import Plan
from hetsim.profile import ModelProfile
from hetsim.report import Report
from hetsim.slowdown import gpu_factors
from hetsim.units import GIB, MAX_JITTER_CV
from hetsim.window import default_warmup_waves

__all__ = ["Axis", "SweepBase", "AXES", "FIGURES", "parse_axes", "check_axes", "grid", "run_point", "figures"]


def _count(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value
    return convert


def _number(positive: bool, at_most: float = math.inf) -> Callable[[str], float]:
    def convert(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise ValueError("must be finite and > 0" if positive else "must be finite and >= 0")
        if value > at_most:
            raise ValueError(f"must be <= {at_most:g}")
        return value
    return convert


# name -> (value parser, what a value is); slowdown.X takes a GPU id or a node name for X.
AXES: dict[str, tuple[Callable[[str], Any], str]] = {
    "staleness": (_count(0), "a whole number >= 0 (WSP bound D)"),
    "nm": (_count(1), "a whole number >= 1"),
    "waves": (_count(1), "a whole number >= 1"),
    "jitter": (_number(False, MAX_JITTER_CV), f"a coefficient of variation in [0, {MAX_JITTER_CV:g}]"),
    "seed": (_count(0), "a whole number >= 0"),
    "network.bandwidth_gbit_s": (_number(True), "Gbit/s > 0"),
    "network.latency_us": (_number(False), "microseconds >= 0"),
    "slowdown.GPU": (_number(True), "a factor > 0 (GPU: an id like node1/gpu0, or a node like node2)"),
}

FIGURES = ("samples_per_s", "minibatches_per_s", "tokens_per_s", "iteration_s", "window_s", "busy_max",
           "busy_min", "memory_max_gib", "sync_wait_s", "staleness_local_max", "staleness_global_max",
           "staleness_global_mean", "busiest_link", "busiest_link_utilisation", "events", "notes")


@dataclass(frozen=True)
class Axis:
    name: str                     # e.g. "nm", "slowdown.node2"
    values: tuple[Any, ...]


@dataclass(frozen=True, kw_only=True)
class SweepBase:
    """The simulation every point starts from: `hetsim simulate`'s inputs and options."""

    cluster: Cluster
    profile: ModelProfile
    plan: Plan
    waves: int = 20
    warmup_waves: int | None = None        # None: 2, or waves - 1 if fewer (as simulate)
    seed: int = 0
    jitter_cv: float = 0.0
    slowdown: Mapping[str, float] = field(default_factory=dict)   # by GPU id or node name
    straggler_prob: float = 0.0
    straggler_delay_s: float = 0.0


def parse_axes(items: list[str]) -> tuple[Axis, ...]:
    """Axes from `NAME=V1,V2,...` strings; a bad name or value is a one-line error naming the axis."""
    if isinstance(items, str) or not all(isinstance(i, str) for i in items):
        raise HetsimError(f"--vary: expected a list of 'NAME=V1,V2,...' strings, got {items!r}"[:200])
    axes: list[Axis] = []
    for item in items:
        name, eq, text = item.partition("=")
        name = name.strip()
        kind = "slowdown.GPU" if name.startswith("slowdown.") and len(name) > len("slowdown.") else name
        if not eq or kind not in AXES:
            raise HetsimError(f"--vary {item!r}: unknown axis {name!r}; expected NAME=V1,V2,... with NAME one of "
                              f"{', '.join(AXES)}")
        if any(a.name == name for a in axes):
            raise HetsimError(f"--vary {item!r}: axis {name!r} is given twice; list all its values once")
        axes.append(Axis(name, _values(name, text, *AXES[kind])))
    return tuple(axes)


def _values(name: str, text: str, convert: Callable[[str], Any], what: str) -> tuple[Any, ...]:
    parts = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(parts):
        raise HetsimError(f"--vary {name}={text}: axis {name}: expected comma-separated values, each {what}")
    values = []
    for part in parts:
        try:
            values.append(convert(part))
        except ValueError as exc:
            reason = str(exc) if str(exc).startswith("must") else f"expected {what}"
            raise HetsimError(f"--vary {name}={text}: axis {name}: value {part!r}: {reason}") from None
    return tuple(values)


def check_axes(axes: tuple[Axis, ...], base: SweepBase) -> None:
    """Refuse, before any point runs, axes that cannot apply to this cluster and plan."""
    for axis in axes:
        target = axis.name.removeprefix("slowdown.")
        if axis.name.startswith("slowdown.") and target not in _slowable(base.cluster):
            c = base.cluster
            raise HetsimError(f"--vary {axis.name}: cluster {c.name} has no GPU or node {target!r} "
                              f"(name a GPU like {c.gpus[0].id} or a node like {c.nodes[0].name})")
        if axis.name.startswith("network.") and all(n.nic is not None for n in base.cluster.nodes):
            raise HetsimError(f"--vary {axis.name}: every node of cluster {base.cluster.name} has a network of its "
                              "own, which the cluster's network field (this axis) does not change; edit the "
                              "nodes' network fields instead")
        if axis.name == "staleness" and base.plan.sync.mode != "wsp":
            raise HetsimError(f"--vary staleness: plan {base.plan.name} syncs by {base.plan.sync.mode}, and "
                              "the staleness bound D applies to wsp plans only")


def _slowable(cluster: Cluster) -> set[str]:
    return {g.id for g in cluster.gpus} | {n.name for n in cluster.nodes}


def grid(axes: tuple[Axis, ...]) -> list[dict[str, Any]]:
    """Every combination of the axes' values (the last axis varies fastest); one empty point if none."""
    return [dict(zip((a.name for a in axes), combo)) for combo in itertools.product(*(a.values for a in axes))]


def run_point(job: tuple[SweepBase, dict[str, Any]]) -> dict[str, Any]:
    """The row of one point: its axis values, then FIGURES, then `error` (empty when it ran)."""
    from hetsim.sim import run_simulation
    base, point = job
    row: dict[str, Any] = dict(point)
    try:
        cluster, plan, options = _apply(base, point)
        report = run_simulation(cluster, base.profile, plan, options)
    except HetsimError as exc:
        return {**row, **{k: "" for k in FIGURES}, "error": str(exc)}
    except (ArithmeticError, ValueError) as exc:      # values no check foresaw: this point's row, not the sweep
        return {**row, **{k: "" for k in FIGURES}, "error": f"{type(exc).__name__}: {exc}"}
    return {**row, **figures(report), "error": ""}


def _apply(base: SweepBase, point: Mapping[str, Any]):
    """Cluster, plan and SimOptions of one point, built as simulate builds them from files and flags."""
    from hetsim.sim import SimOptions
    plan, cluster = base.plan, base.cluster
    if "nm" in point:
        plan = replace(plan, nm=point["nm"])
    if "staleness" in point:
        plan = replace(plan, sync=replace(plan.sync, staleness_bound=point["staleness"]))
    # The cluster's `network`, as editing that field of its file would: a node with a network of its own keeps it.
    network = cluster.network
    if "network.bandwidth_gbit_s" in point:
        network = replace(network, bandwidth_Bps=point["network.bandwidth_gbit_s"] * 1e9 / 8)
    if "network.latency_us" in point:
        network = replace(network, latency_s=point["network.latency_us"] * 1e-6)
    cluster = replace(cluster, network=network)
    waves = point.get("waves", base.waves)
    warmup = base.warmup_waves if base.warmup_waves is not None else default_warmup_waves(waves)
    named = {**base.slowdown, **{k.removeprefix("slowdown."): v for k, v in point.items() if k.startswith("slowdown.")}}
    options = SimOptions(waves=waves, warmup_waves=warmup, seed=point.get("seed", base.seed),
                         jitter_cv=point.get("jitter", base.jitter_cv), slowdown=gpu_factors(cluster, named),
                         straggler_prob=base.straggler_prob, straggler_delay_s=base.straggler_delay_s, trace=False)
    return cluster, plan, options


def figures(report: Report) -> dict[str, Any]:
    """The headline figures of a report, in FIGURES order ('' where the report has none)."""
    t, s = report.throughput, report.staleness
    busy = [g.busy_fraction for g in report.gpus]
    busiest = max(report.links, key=lambda l: l.utilisation, default=None)
    glob = s.get("global", {})
    values = {
        "samples_per_s": t["samples_per_s"], "minibatches_per_s": t["minibatches_per_s"],
        "tokens_per_s": t.get("tokens_per_s", ""), "iteration_s": t.get("iteration_s", ""),
        "window_s": report.window["duration_s"], "busy_max": max(busy, default=""),
        "busy_min": min(busy, default=""),
        "memory_max_gib": max((g.memory_bytes for g in report.gpus), default=0) / GIB,
        "sync_wait_s": sum(v.sync_wait_s for v in report.virtual_workers),
        "staleness_local_max": s["local"]["max"], "staleness_global_max": glob.get("max", ""),
        "staleness_global_mean": glob.get("mean", ""),
        "busiest_link": busiest.id if busiest else "",
        "busiest_link_utilisation": busiest.utilisation if busiest else "",
        "events": report.settings.get("events", ""),
        # What simulate prints beside its figures (a rate that is no steady state's, say), one cell.
        "notes": " | ".join(report.notes),
    }
    return {k: ("" if values[k] is None else values[k]) for k in FIGURES}

