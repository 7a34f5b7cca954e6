"""PipeDream's chosen configurations on its two clusters, beside the paper's, and hetsim's plans there.

    python experiments/pipedream/run.py            # ~1-2 minutes on 2 cores -> experiments/pipedream/results/
    python experiments/pipedream/run.py --quick    # VGG-16 only, no simulation -> results/quick/

Profiles: PipeDream's published graph.txt files (gpu_profiles/pipedream/, profiled on V100; the batch
is read off the Input node's bytes at 3x224x224 fp32). Clusters: gpu_profiles/clusters/
pipedream_cluster_{a,b}.yaml. PipeDream's configuration comes from its own formulas
(hetsim.planner.pipedream_cost: hierarchical DP, and flat over all 16 GPUs at the slowest bandwidth);
hetsim's comes from `hetsim plan`'s search, simulated. See README.md beside this file.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import hetsim
from hetsim.data import pipedream_profile
from hetsim.errors import HetsimError
from hetsim.pipedream_graph import read_graph
from hetsim.planner import SearchSpace, search_plans
from hetsim.planner.antichain import antichain_states
from hetsim.planner.pipedream_cost import cluster_levels, pipedream_config, stage_s, without_input_time

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from report_table import experiment_config, markdown_table, write_results  # noqa: E402

IMAGE_BYTES = 3 * 224 * 224 * 4

# PipeDream's configurations as ../shared/reference/pipedream.md gives them (the repository's chosen
# splits for Cluster-A's 4 servers x 4 GPUs); "n/g": not given in the summary we hold.
PAPER = {("vgg16", "pipedream_cluster_a"): "15-1", ("alexnet", "pipedream_cluster_a"): "15-1",
         ("resnet50", "pipedream_cluster_a"): "16 (data parallel)"}
PAPER_SPEEDUP = {("vgg16", "pipedream_cluster_a"): "up to 5.3 (time to accuracy)"}


@dataclass(frozen=True, kw_only=True)
class Config:
    clusters: tuple[str, ...] = ("pipedream_cluster_a", "pipedream_cluster_b")
    models: tuple[str, ...] = ("vgg16", "alexnet", "resnet50", "resnet18", "resnet101", "resnext50",
                               "squeezenet1_0", "densenet121", "inception_v3")
    simulate: tuple[str, ...] = ("vgg16", "alexnet", "resnet50")     # also run hetsim's search
    policies: tuple[str, ...] = ("NP", "ED", "horovod")
    nm_values: tuple[int, ...] = (1, 2, 4)
    waves: int = 8
    seed: int = 0
    # The hierarchical DP solves every sub-range (states^3): beyond this many states only the flat one.
    max_hierarchical_states: int = 250
    out: Path = HERE / "results"


def quick(config: Config) -> Config:
    return replace(config, models=("vgg16",), simulate=(), out=config.out / "quick")


def load(model: str):
    profile = read_graph(pipedream_profile(model), gpu_type="v100", model=model)
    return replace(profile, batch_size=max(1, round(profile.input_bytes / IMAGE_BYTES)))


def dp_seconds(profile, cluster, *, flat: bool = False) -> float:
    """Data parallelism over every GPU by PipeDream's formulas: an all-reduce inside each server, then
    across servers (or, `flat`, one all-reduce over all GPUs at the slowest bandwidth)."""
    levels = cluster_levels(cluster)
    if flat:
        levels = [(len(cluster.gpus), min(b for _, b in levels))]
    t = sum(l.fwd_s["v100"] + l.bwd_s["v100"] for l in without_input_time(profile).layers)
    for workers, bandwidth in levels:
        t = float(stage_s(t, profile.param_bytes, workers, bandwidth))
    return t


def hetsim_best(config: Config, cluster, profile) -> dict:
    """hetsim plan's rank 1 and its data-parallel (Horovod) candidate, both simulated."""
    space = SearchSpace(policies=config.policies, nm_values=config.nm_values, top_k=3, waves=config.waves,
                        warmup_waves=2, seed=config.seed, workers=1)
    best = search_plans(cluster, profile, space).best
    try:
        dp = search_plans(cluster, profile, replace(space, policies=("horovod",), top_k=1)).best
        dp_rate = round(dp.simulated_mb_s * profile.batch_size, 1)
    except HetsimError:                  # no GPU holds the whole model at this batch
        dp_rate = "does not fit"
    return {"hetsim_plan": f"{best.policy} x{len(best.partitions)} Nm={best.nm}",
            "hetsim_samples_per_s": round(best.simulated_mb_s * profile.batch_size, 1),
            "hetsim_dp_samples_per_s": dp_rate}


def row(config: Config, cluster_name: str, model: str) -> dict:
    cluster, profile = hetsim.load_cluster(cluster_name), load(model)
    out = {"cluster": cluster_name, "model": model, "batch": profile.batch_size,
           "paper_config": PAPER.get((model, cluster_name), "n/g")}
    try:
        flat = pipedream_config(profile, cluster, flat=True)
        small = len(antichain_states(profile).masks) <= config.max_hierarchical_states
        hier = pipedream_config(profile, cluster) if small else None
    except HetsimError as exc:
        print(f"{cluster_name} {model}: {exc}", file=sys.stderr)
        return {}
    dp, flat_dp = dp_seconds(profile, cluster), dp_seconds(profile, cluster, flat=True)
    out.update(states=flat.n_states, pipedream_config=hier.label if hier else "-",
               pipedream_gpus=hier.gpus if hier else "-",
               pipedream_samples_per_s=round(profile.batch_size / hier.bottleneck_s, 1) if hier else "-",
               flat_config=flat.label, flat_gpus=flat.gpus,
               flat_samples_per_s=round(profile.batch_size / flat.bottleneck_s, 1),
               dp_samples_per_s=round(profile.batch_size / dp, 1),
               speedup_over_dp=round(dp / hier.bottleneck_s, 2) if hier else "-",
               flat_dp_samples_per_s=round(profile.batch_size / flat_dp, 1),
               flat_speedup_over_dp=round(flat_dp / flat.bottleneck_s, 2),
               paper_speedup=PAPER_SPEEDUP.get((model, cluster_name), "n/g"))
    if model in config.simulate:
        try:
            out.update(hetsim_best(config, cluster, profile))
        except HetsimError as exc:       # e.g. no data-parallel replica holds the model at this batch
            print(f"{cluster_name} {model}: hetsim: {exc}", file=sys.stderr)
            out.update(hetsim_plan="does not fit", hetsim_samples_per_s="-", hetsim_dp_samples_per_s="-")
    return out


def write(rows: list[dict], out: Path) -> str:
    header = ["cluster", "model", "batch", "states", "paper", "PipeDream, hierarchical", "samples/s", "over its DP",
              "PipeDream, flat", "samples/s", "over its DP", "paper speedup", "hetsim rank 1 (simulated)",
              "samples/s", "hetsim DP samples/s"]
    return write_results(rows, out, "configurations", markdown_table(header, (_cells(r) for r in rows)))


def _cells(r: dict) -> list:
    hier = f"{r['pipedream_config']} ({r['pipedream_gpus']} GPUs)" if r["pipedream_config"] != "-" else "-"
    return [r["cluster"][-1].upper(), r["model"], r["batch"], r["states"], r["paper_config"], hier,
            r["pipedream_samples_per_s"], r["speedup_over_dp"], f"{r['flat_config']} ({r['flat_gpus']} GPUs)",
            r["flat_samples_per_s"], r["flat_speedup_over_dp"], r["paper_speedup"], r.get("hetsim_plan", "-"),
            r.get("hetsim_samples_per_s", "-"), r.get("hetsim_dp_samples_per_s", "-")]


def main(argv: list[str] | None = None) -> int:
    config = experiment_config(Config(), quick, argv, description=__doc__.splitlines()[0],
                               quick_help="VGG-16 only, formulas only")
    rows = [r for c in config.clusters for m in config.models if (r := row(config, c, m))]
    print(write(rows, config.out), end="")
    # The experiment's own checks: every configuration uses at most the cluster's GPUs and beats
    # nobody's formulas by accident (its own optimum is never slower than data parallelism).
    assert all(r["flat_gpus"] <= 16 and r["flat_speedup_over_dp"] >= 1.0 - 1e-9 for r in rows)
    assert all(r["speedup_over_dp"] >= 1.0 - 1e-9 for r in rows if r["speedup_over_dp"] != "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
