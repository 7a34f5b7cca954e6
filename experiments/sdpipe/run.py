"""SDPipe's headline: throughput of semi-decentralised sync vs all-reduce and a parameter server as
pipelines are added, with and without SDPipe's straggler injection.

    python experiments/sdpipe/run.py            # ~1-2 minutes on 2 cores -> experiments/sdpipe/results/
    python experiments/sdpipe/run.py --quick    # 2 and 4 pipelines, fewer waves -> results/quick/

ResNet-50 (the shipped resnet50_b32 profile at minibatch 256 per pipeline) on gpu_profiles/clusters/
sdpipe_16x4.yaml: N pipelines of 4 stages, pipeline i on server i (the partition is hetsim's best for
four V100s), asynchronous 1F1B with weight stashing (Nm = 4) in every case; the cases differ only in
how pipelines synchronise each wave:
  SDPipe P=10   group scheduling, a connection of all pipelines every 10 waves (the artifact's P);
  all-reduce    SDPipe with P = 1: every wave averages the weights of all N pipelines;
  PS (WSP D=0)  HetPipe-style parameter servers on every server, staleness bound 0.
Stragglers as the paper injects them: each worker sleeps X = 0.1 s before a step with probability 0.1.
See README.md beside this file.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import hetsim
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.planner.hetero import partition_vw
from hetsim.topology import Topology

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from report_table import experiment_config, markdown_table, pyplot, save_figure, write_results  # noqa: E402

MODES = {"SDPipe P=10": SyncSpec(mode="sdpipe", sdpipe_period=10),
         "all-reduce": SyncSpec(mode="sdpipe", sdpipe_period=1),
         "PS (WSP D=0)": SyncSpec(mode="wsp", staleness_bound=0)}


@dataclass(frozen=True, kw_only=True)
class Config:
    cluster: str = "sdpipe_16x4"
    profile: str = "resnet50_b32"
    batches: tuple[int, ...] = (256, 32)      # minibatch per pipeline: the paper's 256, and the profile's 32
    pipelines: tuple[int, ...] = (2, 4, 8, 16)
    nm: int = 4
    waves: int = 16
    straggler_prob: float = 0.1
    straggler_delay_s: float = 0.1
    seed: int = 1
    out: Path = HERE / "results"


def quick(config: Config) -> Config:
    return replace(config, batches=(32,), pipelines=(2, 4), waves=10, out=config.out / "quick")


def plans(config: Config, cluster, profile, batch: int) -> dict[tuple[str, int], Plan]:
    node0 = [g for g in cluster.gpus if g.node == "node0"]
    part = partition_vw(profile, node0, Topology(cluster), nm=config.nm, schedule="1f1b")
    index = [g.index for g in (cluster.gpu(i) for i in part.gpus)]
    out = {}
    for n in config.pipelines:
        vws = tuple(VirtualWorker(name=f"vw{v}", stages=tuple(
            StageSpec(gpu=f"node{v}/gpu{k}", layers=layers) for k, layers in zip(index, part.layers)))
            for v in range(n))
        for label, sync in MODES.items():
            out[label, n] = Plan(name=f"{label}-{n}", model=profile.model, minibatch_size=batch,
                                 nm=config.nm, schedule="1f1b", sync=sync, virtual_workers=vws)
    return out


def run(config: Config) -> list[dict]:
    cluster = hetsim.load_cluster(config.cluster)
    rows = []
    for batch in config.batches:
        profile = hetsim.load_profile(config.profile).scaled_to_batch(batch)
        rows += [_row(config, cluster, profile, batch, label, n, plan)
                 for (label, n), plan in plans(config, cluster, profile, batch).items()]
    return rows


def _row(config: Config, cluster, profile, batch: int, label: str, n: int, plan: Plan) -> dict:
    row = {"batch": batch, "pipelines": n, "gpus": 4 * n, "sync": label}
    for name, prob in (("no_stragglers", 0.0), ("stragglers", config.straggler_prob)):
        report = hetsim.simulate(cluster, profile, plan, waves=config.waves, warmup_waves=2, seed=config.seed,
                                 straggler_prob=prob, straggler_delay_s=config.straggler_delay_s, trace=False)
        row[f"{name}_samples_per_s"] = round(report.throughput["samples_per_s"], 1)
        if plan.sync.mode == "sdpipe" and prob:
            row["mean_group_size"] = round(report.sync["group_size"]["mean"], 2)
    return row


def write(rows: list[dict], out: Path) -> str:
    header = ["minibatch per pipeline", "pipelines", "GPUs", "sync", "samples/s, no stragglers",
              "samples/s, stragglers (p 0.1, 0.1 s)", "vs all-reduce (stragglers)", "mean group size"]
    cells = ([r["batch"], r["pipelines"], r["gpus"], r["sync"], r["no_stragglers_samples_per_s"],
              r["stragglers_samples_per_s"],
              f"{r['stragglers_samples_per_s'] / _all_reduce(rows, r)['stragglers_samples_per_s']:.2f}",
              r.get("mean_group_size", "-")] for r in rows)
    return write_results(rows, out, "throughput", markdown_table(header, cells))


def _all_reduce(rows: list[dict], r: dict) -> dict:
    """The all-reduce row with the same minibatch and pipeline count as `r`: the baseline it is read against."""
    return next(b for b in rows if (b["batch"], b["pipelines"], b["sync"]) == (r["batch"], r["pipelines"],
                                                                              "all-reduce"))


def plot(rows: list[dict], out: Path) -> None:
    plt = pyplot()
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    fig, axes = plt.subplots(len(batches), 2, figsize=(11, 4 * len(batches)), squeeze=False)
    for row_axes, batch in zip(axes, batches):
        for ax, key, title in zip(row_axes, ("no_stragglers", "stragglers"),
                                  ("no stragglers", "stragglers: p = 0.1, X = 0.1 s")):
            for label in MODES:
                mine = [r for r in rows if r["sync"] == label and r["batch"] == batch]
                ax.plot([r["pipelines"] for r in mine], [r[f"{key}_samples_per_s"] for r in mine], "o-",
                        label=label)
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(dict.fromkeys(r["pipelines"] for r in rows)),
                          [str(n) for n in dict.fromkeys(r["pipelines"] for r in rows)])
            ax.set_xlabel("pipelines (4 GPUs each)")
            ax.set_ylabel("samples/s (simulated)")
            ax.set_title(f"ResNet-50, minibatch {batch} per pipeline, {title}", fontsize=9)
        row_axes[0].legend(fontsize=8)
    save_figure(fig, out / "throughput.png")


def main(argv: list[str] | None = None) -> int:
    config = experiment_config(Config(), quick, argv, description=__doc__.splitlines()[0],
                               quick_help="the profile's minibatch only, 2 and 4 pipelines, 10 waves")
    rows = run(config)
    table = write(rows, config.out)
    plot(rows, config.out)
    print(table, end="")
    # The experiment's own check: identical pipelines without stragglers reach the scheduler together,
    # so SDPipe forms one group of all every wave and runs exactly as all-reduce does.
    for r in rows:
        if r["sync"] == "SDPipe P=10":
            base = _all_reduce(rows, r)
            assert r["no_stragglers_samples_per_s"] == base["no_stragglers_samples_per_s"], (r, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
