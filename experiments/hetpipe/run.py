"""HetPipe's allocation question on its own cluster: NP vs ED vs HD at several D, and Horovod.

    python experiments/hetpipe/run.py            # full run -> experiments/hetpipe/results/
    python experiments/hetpipe/run.py --quick    # CI-size run -> experiments/hetpipe/results/quick/

For each model and policy the planner (`hetsim.planner.search_plans`) picks the GPU order, the
partition and Nm; each D is simulated with compute jitter (without jitter every D gives the same
steady state, see ../shared/reference/hetpipe.md). Horovod is BSP data parallelism with one minibatch
per step on the GPUs whose memory holds the whole model. See README.md beside this file.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import hetsim
from hetsim.errors import HetsimError
from hetsim.planner import SearchSpace, search_plans
from hetsim.planner.allocation import node_speed

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from report_table import experiment_config, markdown_table, pyplot, save_figure, write_results  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Config:
    cluster: str = "hetpipe_4node"
    # model -> profile names to try in order: a calibrated profile first, the analytic one as fallback
    models: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("VGG-19", ("vgg19_b32", "vgg19_b32_analytic")),
        ("ResNet-152", ("resnet152_b32",)),
    )
    batch: int = 32
    policies: tuple[str, ...] = ("NP", "ED", "HD")
    staleness: tuple[int, ...] = (0, 1, 4, 16)
    nm_values: tuple[int, ...] = (1, 2, 4, 6, 8)
    waves: int = 40
    jitter_cv: float = 0.1
    seed: int = 1
    out: Path = HERE / "results"


def quick(config: Config) -> Config:
    return replace(config, staleness=(0, 4), nm_values=(2, 4), waves=8, out=config.out / "quick")


def resolve_profile(names: tuple[str, ...]):
    for name in names:
        try:
            return name, hetsim.load_profile(name)
        except HetsimError:
            continue
    return None, None


def run_model(config: Config, cluster, label: str, profile_name: str, profile) -> list[dict]:
    profile = profile.scaled_to_batch(config.batch)
    rows = []
    for policy in config.policies:
        for d in config.staleness:
            space = SearchSpace(policies=(policy,), nm_values=config.nm_values, staleness_values=(d,),
                                top_k=len(config.nm_values), waves=config.waves, jitter_cv=config.jitter_cv,
                                seed=config.seed)
            rows.append(_row(label, profile_name, policy, d, search_plans(cluster, profile, space).best,
                             config.batch))
    rows += whimpy_rows(config, cluster, label, profile_name, profile)
    space = SearchSpace(policies=("horovod",), top_k=1, waves=config.waves, jitter_cv=config.jitter_cv,
                        seed=config.seed)
    try:
        rows.append(_row(label, profile_name, "Horovod (BSP)", 0, search_plans(cluster, profile, space).best,
                         config.batch))
    except HetsimError as exc:
        print(f"{label}: Horovod: {exc}", file=sys.stderr)
    return rows


def whimpy_rows(config: Config, cluster, label: str, profile_name: str, profile) -> list[dict]:
    """What the slow GPUs buy: ED on the cluster without its slowest node(s), at the smallest D."""
    rows = []
    ranked = sorted(cluster.nodes, key=node_speed)
    for dropped in range(1, len(ranked) - 1):
        gone = {n.name for n in ranked[:dropped]}
        kept = replace(cluster, nodes=tuple(n for n in cluster.nodes if n.name not in gone),
                       ps_nodes=tuple(n for n in cluster.ps_nodes if n not in gone))
        space = SearchSpace(policies=("ED",), nm_values=config.nm_values, staleness_values=config.staleness[:1],
                            top_k=len(config.nm_values), waves=config.waves, jitter_cv=config.jitter_cv,
                            seed=config.seed)
        try:
            best = search_plans(kept, profile, space).best
        except HetsimError as exc:
            print(f"{label}: ED without {', '.join(sorted(gone))}: {exc}", file=sys.stderr)
            continue
        rows.append(_row(label, profile_name, f"ED without {'+'.join(sorted(gone))}", config.staleness[0],
                         best, config.batch))
    return rows


def _row(label, profile_name, policy, d, best, batch) -> dict:
    gpus = sum(len(p.gpus) for p in best.partitions)
    return {"model": label, "profile": profile_name, "policy": policy, "D": d, "Nm": best.nm,
            "virtual_workers": len(best.partitions), "gpus": gpus,
            "samples_per_s": round(best.simulated_mb_s * batch, 1),
            "estimate_samples_per_s": round(best.estimate.minibatches_per_s * batch, 1),
            "partition_vw0": " ".join(f"{g}:{lo}-{hi}" for g, (lo, hi) in
                                      zip(best.partitions[0].gpus, best.partitions[0].layers))}


def write_table(rows: list[dict], out: Path) -> str:
    header = ["model", "policy", "D", "Nm", "VWs", "GPUs", "samples/s (simulated)", "closed-form estimate"]
    cells = ([r["model"], r["policy"], r["D"], r["Nm"], r["virtual_workers"], r["gpus"], r["samples_per_s"],
              r["estimate_samples_per_s"]] for r in rows)
    return write_results(rows, out, "throughput", markdown_table(header, cells))


def plot(rows: list[dict], out: Path) -> None:
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        policies = [p for p in dict.fromkeys(r["policy"] for r in mine) if p in ("NP", "ED", "HD")]
        ds = sorted({r["D"] for r in mine if r["policy"] in policies})
        width = 0.8 / len(ds)
        for k, d in enumerate(ds):
            values = [next(r["samples_per_s"] for r in mine if r["policy"] == p and r["D"] == d) for p in policies]
            ax.bar([i + k * width for i in range(len(policies))], values, width, label=f"D = {d}")
        for r in mine:
            if r["policy"] == "Horovod (BSP)":
                ax.axhline(r["samples_per_s"], color="k", ls="--", label=f"Horovod, {r['gpus']} GPUs")
            elif r["policy"].startswith("ED without"):
                ax.axhline(r["samples_per_s"], color="grey", ls=":", lw=1)
                ax.annotate(f"{r['policy']} ({r['gpus']} GPUs)", (len(policies) - 0.5, r["samples_per_s"]),
                            fontsize=7, ha="right", va="bottom", color="grey")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(policies))], policies)
        ax.set_ylabel("samples/s (simulated)")
        ax.set_title(f"{model} on HetPipe's 16 GPUs ({mine[0]['profile']})")
        ax.legend(fontsize=8)
    save_figure(fig, out / "throughput.png")


def main(argv: list[str] | None = None) -> int:
    config = experiment_config(Config(), quick, argv, description=__doc__.splitlines()[0],
                               quick_help="a CI-size run (fewer D, Nm and waves)")
    cluster = hetsim.load_cluster(config.cluster)
    rows = []
    for label, names in config.models:
        name, profile = resolve_profile(names)
        if profile is None:
            print(f"{label}: no profile among {', '.join(names)}; skipped", file=sys.stderr)
            continue
        print(f"{label}: profile {name}", file=sys.stderr)
        rows += run_model(config, cluster, label, name, profile)
    if not rows:
        raise SystemExit("no model profile found")
    table = write_table(rows, config.out)
    plot(rows, config.out)
    print(table, end="")
    # The experiment's own check: every policy produced a runnable, simulated plan per D.
    assert all(r["samples_per_s"] > 0 for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
