"""hetsim: what-if simulation of pipeline + data parallel training on heterogeneous GPU clusters.

    import hetsim
    report = hetsim.simulate()                       # the built-in HetPipe example
    print(report.throughput["samples_per_s"])
    report.write("out/")                             # report.json, CSV tables, trace.json
    from hetsim.plots import plot_report
    plot_report(report, "out/")                      # timeline.png, utilisation.png

The simulator (and simpy) load only when `simulate` is called, so the executor can import hetsim's
data model without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from hetsim.cluster import Cluster, load_cluster
from hetsim.data import DEFAULT_CLUSTER, DEFAULT_PLAN, DEFAULT_PROFILE, loaded
from hetsim.errors import HetsimError, PlanError, ScheduleError, SimulationError, SpecError
from hetsim.plan import Plan, load_plan
from hetsim.profile import ModelProfile
from hetsim.profile_files import load_profile
from hetsim.report import Report

__version__ = "0.1.0"
__all__ = ["simulate", "load_cluster", "load_profile", "load_plan", "Cluster", "ModelProfile", "Plan",
           "Report", "HetsimError", "SpecError", "PlanError", "ScheduleError", "SimulationError"]


def simulate(cluster: Cluster | str | Path = DEFAULT_CLUSTER,
             profile: ModelProfile | str | Path = DEFAULT_PROFILE,
             plan: Plan | str | Path = DEFAULT_PLAN, *, waves: int = 20, warmup_waves: int | None = None,
             seed: int = 0, jitter_cv: float = 0.0, slowdown: Mapping[str, float] | None = None,
             straggler_prob: float = 0.0, straggler_delay_s: float = 0.0, trace: bool = True) -> Report:
    """Predict throughput, utilisation, memory and staleness of `plan` on `cluster`.

    Each of cluster, profile and plan may be an object, a file path or a shipped name; `slowdown` names
    GPUs ("node2/gpu1") or whole nodes ("node2"), as `hetsim simulate --slowdown` does. `warmup_waves`
    left out: 2, or waves - 1 for a shorter run, as the CLI's.
    """
    from hetsim.sim import SimOptions, run_simulation
    cluster = loaded("cluster", cluster, Cluster, load_cluster)
    profile = loaded("profile", profile, ModelProfile, load_profile)
    plan = loaded("plan", plan, Plan, load_plan)
    if slowdown is not None and not isinstance(slowdown, Mapping):
        raise HetsimError(f"slowdown: expected a mapping of GPU or node names to factors, got {slowdown!r}")
    from hetsim.slowdown import gpu_factors
    if warmup_waves is None and isinstance(waves, int) and not isinstance(waves, bool):
        from hetsim.window import default_warmup_waves
        warmup_waves = default_warmup_waves(waves)
    options = SimOptions(waves=waves, warmup_waves=warmup_waves, seed=seed, jitter_cv=jitter_cv,
                         slowdown=gpu_factors(cluster, slowdown or {}, "slowdown"), straggler_prob=straggler_prob,
                         straggler_delay_s=straggler_delay_s, trace=trace)
    return run_simulation(cluster, profile, plan, options)
