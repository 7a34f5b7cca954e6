"""Predict plans that Sailor's authors ran on real GPUs and compare with what they measured.

    python experiments/peers/sailor/run.py \
        --data experiments/peers/sailor/data \
        --training-config experiments/peers/sailor/data/configs/training_config_opt_350.json \
        --plans experiments/peers/sailor/data/plans/gh200-opt350 experiments/peers/sailor/data/plans/mit-opt350 \
        --out experiments/peers/sailor/results/imported.csv

Each plan goes through `hetsim import sailor` and `hetsim simulate` as a user would run them. One row
per plan: measured and predicted iteration time and peak memory (the fullest GPU), their errors,
Sailor's own prediction where sailor_predictions.csv (in --data) has one, and the gradient all-reduce
against the plan's measured `red_grads` (`grad_reduce`). Prints mean/max error and
Spearman rank correlation per plan directory. `--derived` predicts without Sailor's measured layer
times (datasheet peaks, hetsim.derive). `--fit-reserve` prints the framework reserve per GPU type that
would make the memory errors' median zero (how the GPU files' framework_reserve_gib were set), instead
of a table; `--reserve-gib X` puts X on every GPU instead (the leave-one-set-out check).
`--network-latency-us X` gives every message between nodes X microseconds of latency (a what-if: what a
fixed cost per transfer would do to each plan; the imported clusters carry none).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

import hetsim
from hetsim.cli.arguments import check_output_file
from hetsim.cli.imports import write_import
from hetsim.cluster import Cluster, load_cluster
from hetsim.errors import HetsimError
from hetsim.memory import GIB
from hetsim.outputs import write_text
from hetsim.sailor import read_shape

COLUMNS = ["set", "plan", "measured_iter_s", "predicted_iter_s", "time_err_pct", "measured_mem_bytes",
           "predicted_mem_bytes", "mem_err_pct", "sailor_iter_s", "sailor_time_err_pct", "sailor_mem_bytes",
           "sailor_mem_err_pct", "measured_grad_reduce_s", "predicted_grad_reduce_s", "grad_reduce_err_pct",
           "predicted_grad_reduce_min_s", "predicted_grad_reduce_max_s", "fullest_gpu_type", "reserve_bytes", "error"]


def predict(plan_path: Path, args: argparse.Namespace, workdir: Path) -> dict:
    files = write_import(plan_path, args.data, args.training_config, workdir / plan_path.stem,
                         derived=args.derived, precision=args.precision, efficiency=args.efficiency)
    cluster = load_cluster(files["cluster"])
    if args.network_latency_us is not None:
        cluster = with_network_latency(cluster, args.network_latency_us * 1e-6)
    report = hetsim.simulate(cluster, hetsim.load_profile(files["profile"]), files["plan"],
                             waves=args.waves, warmup_waves=1, jitter_cv=args.jitter, trace=True)
    measured = pd.read_json(files["measured"], typ="series")
    reserve = lambda g: (g.memory_breakdown.get("reserve_bytes", 0) if args.reserve_gib is None
                         else int(args.reserve_gib * GIB))    # the leave-one-set-out check: another set's
    memory = lambda g: g.memory_bytes - g.memory_breakdown.get("reserve_bytes", 0) + reserve(g)
    fullest = max(report.gpus, key=memory)
    row = {"plan": plan_path.stem, "measured_iter_s": measured["iteration_s"],
           "predicted_iter_s": report.throughput["iteration_s"],
           "measured_mem_bytes": measured["max_memory_bytes"], "predicted_mem_bytes": memory(fullest),
           "fullest_gpu_type": fullest.type, "reserve_bytes": reserve(fullest)}
    row["time_err_pct"] = _err(row["predicted_iter_s"], row["measured_iter_s"])
    row["mem_err_pct"] = _err(row["predicted_mem_bytes"], row["measured_mem_bytes"])
    row.update(grad_reduce(report, measured.get("grad_reduce_s")))
    return row


def grad_reduce(report, measured_s: float | None) -> dict:
    """Seconds the last iteration's gradient all-reduce holds a GPU, from its reaching it to the end (so
    with the wait for slower replicas), against Sailor's `red_grads`. Which rank Sailor timed is not
    recorded; the compared one is global rank 0 as Megatron numbers ranks (TP rank 0 of the first
    replica's first stage), with the spread over every replica's stages beside it (their TP rank 0s,
    which the simulator times). A plan with one replica per stage reduces nothing and predicts 0 s."""
    spans = _last_reduce_spans(report.trace)
    first = next(g.id for g in report.gpus if g.vw == report.gpus[0].vw and g.stage == 0)
    rank0 = spans.get(first, 0.0)
    return {"measured_grad_reduce_s": measured_s, "predicted_grad_reduce_s": rank0,
            "grad_reduce_err_pct": _err(rank0, measured_s) if rank0 else None,
            "predicted_grad_reduce_min_s": min(spans.values(), default=0.0),
            "predicted_grad_reduce_max_s": max(spans.values(), default=0.0)}


def _last_reduce_spans(trace) -> dict[str, float]:
    """GPU id -> duration of its last `allreduce` span."""
    last = {}
    for e in trace.events:
        if e["ph"] == "X" and e["name"].startswith("allreduce"):
            gpu = e["args"]["gpu"]
            if gpu not in last or e["ts"] > last[gpu]["ts"]:
                last[gpu] = e
    return {gpu: e["dur"] / 1e6 for gpu, e in last.items()}


def with_network_latency(cluster: Cluster, seconds: float) -> Cluster:
    """`cluster` with `seconds` of latency on the network and on every node's own interface."""
    nodes = tuple(replace(n, nic=replace(n.nic, latency_s=seconds)) if n.nic else n for n in cluster.nodes)
    return replace(cluster, network=replace(cluster.network, latency_s=seconds), nodes=nodes)


def _seconds(value) -> str:
    return "not" if value is None or pd.isna(value) else f"{value:.4g} s"


def _err(predicted, measured) -> float | None:
    if measured is None or pd.isna(measured) or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def sailor_rows(data: Path) -> pd.DataFrame:
    path = data / "sailor_predictions.csv"
    if not path.exists():
        return pd.DataFrame(columns=["set", "plan"])
    theirs = pd.read_csv(path)
    return theirs.rename(columns={"sailor_max_mem_bytes": "sailor_mem_bytes"})[
        ["set", "plan", "sailor_iter_s", "sailor_time_err_pct", "sailor_mem_bytes", "sailor_mem_err_pct"]]


def run_all(args: argparse.Namespace) -> pd.DataFrame:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in args.plans:
            if not Path(folder).is_dir():
                raise HetsimError(f"--plans {folder}: {'is a file' if Path(folder).exists() else 'no such folder'}; "
                                  "give folders of Sailor plan *.json files")
            plans = sorted(Path(folder).glob("*.json"))
            if not plans:
                raise HetsimError(f"--plans {folder}: no plan *.json files there")
            for plan_path in plans:
                try:
                    row = predict(plan_path, args, Path(tmp))
                except HetsimError as exc:
                    row = {"plan": plan_path.stem, "error": str(exc)}
                rows.append({"set": Path(folder).name, **row})
                print(f"{row['plan']}: " + (f"{row['predicted_iter_s']:.4g} s predicted, "
                                            f"{_seconds(row['measured_iter_s'])} measured" if "error" not in row
                                            else row["error"]), file=sys.stderr)
    table = pd.DataFrame(rows)
    table = table.merge(sailor_rows(Path(args.data)), on=["set", "plan"], how="left")
    return table.reindex(columns=COLUMNS)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per set and predictor: mean and max absolute error, Spearman rank correlation of times."""
    out = []
    for name, rows in table.groupby("set", sort=False):
        for who, pred, terr, merr in (("hetsim", "predicted_iter_s", "time_err_pct", "mem_err_pct"),
                                      ("sailor", "sailor_iter_s", "sailor_time_err_pct", "sailor_mem_err_pct")):
            ok = rows.dropna(subset=[pred, "measured_iter_s"])
            if ok.empty:
                continue
            mem = ok[merr].dropna().abs()
            out.append({"set": name, "predictor": who, "plans": len(ok),
                        "time_err_mean_pct": ok[terr].abs().mean(), "time_err_max_pct": ok[terr].abs().max(),
                        "spearman": ok[pred].rank().corr(ok["measured_iter_s"].rank()),
                        "mem_err_mean_pct": mem.mean() if len(mem) else None,
                        "mem_err_max_pct": mem.max() if len(mem) else None,
                        **(_reduce_stats(ok) if who == "hetsim" else {})})
    return pd.DataFrame(out)


def _reduce_stats(rows: pd.DataFrame) -> dict:
    """Gradient all-reduce against Sailor's `red_grads`, over the plans with more than one replica."""
    err = rows["grad_reduce_err_pct"].dropna().abs() if "grad_reduce_err_pct" in rows else pd.Series(dtype=float)
    return {"reduce_plans": len(err), "reduce_err_median_pct": err.median() if len(err) else None}


def fitted_reserves(table: pd.DataFrame) -> pd.Series:
    """Per GPU type: median of measured - (predicted without the reserve) over the plans whose fullest
    GPU is of that type, in GiB."""
    ok = table.dropna(subset=["measured_mem_bytes", "predicted_mem_bytes"])
    gap = (ok["measured_mem_bytes"] - (ok["predicted_mem_bytes"] - ok["reserve_bytes"])) / GIB
    per_type = gap.groupby(ok["fullest_gpu_type"]).median()
    return pd.concat([per_type, pd.Series({"(every GPU type)": gap.median()})]).round(2)


def markdown(frame: pd.DataFrame) -> str:
    cell = lambda v: "" if v is None or (isinstance(v, float) and pd.isna(v)) else (
        f"{v:.4g}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (m, p, s, unit, scale) in zip(axes, (
            ("measured_iter_s", "predicted_iter_s", "sailor_iter_s", "iteration time (s)", 1.0),
            ("measured_mem_bytes", "predicted_mem_bytes", "sailor_mem_bytes", "peak memory (GiB)", GIB))):
        shown = table[(table[m] > 0) & (table[p] > 0)]        # a log axis: measured and predicted rows only
        if shown.empty:
            ax.set_title(f"no plan with a measured and a predicted {unit}", fontsize=9)
            continue
        for (name, rows), marker in zip(shown.groupby("set", sort=False), "os^D"):
            ax.scatter(rows[m] / scale, rows[p] / scale, marker=marker, label=f"hetsim, {name}")
            if rows[s].notna().any():
                ax.scatter(rows[m] / scale, rows[s] / scale, marker=marker, facecolors="none",
                           edgecolors="grey", label=f"Sailor, {name}")
        lo = min(shown[m].min(), shown[p].min()) / scale * 0.8
        hi = max(shown[m].max(), shown[p].max()) / scale * 1.25
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel=f"measured {unit}", ylabel=f"predicted {unit}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=7)
    _plot_reduce(axes[2], table)
    fig.suptitle("Sailor's real GPU runs: predicted vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_reduce(ax, table: pd.DataFrame) -> None:
    """Gradient all-reduce per iteration: rank 0's prediction, with the range over the stages' lead GPUs as a bar."""
    import matplotlib.ticker
    shown = table[(table["measured_grad_reduce_s"] > 0) & (table["predicted_grad_reduce_s"] > 0)]
    if shown.empty:
        ax.set_title("no plan with a measured and a predicted gradient all-reduce", fontsize=9)
        return
    for (name, rows), marker in zip(shown.groupby("set", sort=False), "os^D"):
        dots = ax.scatter(rows["measured_grad_reduce_s"], rows["predicted_grad_reduce_s"], marker=marker,
                          label=f"hetsim, {name} (rank 0; bar: every stage replica)")
        ax.vlines(rows["measured_grad_reduce_s"], rows["predicted_grad_reduce_min_s"],
                  rows["predicted_grad_reduce_max_s"], colors=dots.get_facecolor(), lw=1)
    values = pd.concat([shown["measured_grad_reduce_s"], shown["predicted_grad_reduce_min_s"],
                        shown["predicted_grad_reduce_max_s"]])
    lo, hi = values.min() * 0.8, values.max() * 1.25
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured gradient all-reduce (s, Sailor's red_grads)",
           ylabel="predicted gradient all-reduce (s)")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)


def _check_arguments(args: argparse.Namespace) -> None:
    """What applies to the whole run, refused before the first plan rather than once per plan."""
    if args.waves < 2:
        raise HetsimError(f"--waves {args.waves}: at least 2 (the first is left out)")
    if not 0 <= args.jitter < 1:
        raise HetsimError(f"--jitter {args.jitter}: a coefficient of variation in [0, 1)")
    if args.reserve_gib is not None and not 0 <= args.reserve_gib <= 1e6:
        raise HetsimError(f"--reserve-gib {args.reserve_gib}: a reserve is a finite number of GiB >= 0")
    if args.network_latency_us is not None and not 0 <= args.network_latency_us <= 1e9:
        raise HetsimError(f"--network-latency-us {args.network_latency_us}: a finite number of microseconds >= 0")
    for flag, path in (("--data", args.data), ("--training-config", args.training_config),
                       ("--efficiency", args.efficiency)):
        if path is not None and not path.exists():
            raise HetsimError(f"{flag} {path}: no such {'folder' if flag == '--data' else 'file'}")
    read_shape(args.training_config)                 # a config that cannot be read, named once
    if args.out:
        check_output_file(args.out, "--out", (".csv",))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, type=Path, help="folder with profiles_tmp.json, network/, configs/")
    p.add_argument("--training-config", required=True, type=Path)
    p.add_argument("--plans", required=True, nargs="+", type=Path, help="folders of plan_config_*.json")
    p.add_argument("--out", type=Path, help="CSV to write (a .md summary and a .png plot go beside it)")
    p.add_argument("--derived", action="store_true", help="derive layer times instead of Sailor's measured ones")
    p.add_argument("--efficiency", type=Path, default=None, metavar="YAML",
                   help="with --derived: efficiency factors from this file instead of gpu_profiles/efficiency.yaml "
                        "(e.g. experiments/profiles/tp_floors.py --held-back-yaml's)")
    p.add_argument("--precision", default="tf32", choices=("fp32", "tf32", "fp16", "bf16"),
                   help="the runs' precision (default tf32: FP32 tensors, TF32 matrix products)")
    p.add_argument("--waves", type=int, default=3, help="iterations simulated, the first left out (default 3)")
    p.add_argument("--jitter", type=float, default=0.0, metavar="CV",
                   help="pass-to-pass variation of compute times, as hetsim simulate's --jitter (default 0: "
                        "the tables; the simulate command's own default is 0.02)")
    p.add_argument("--fit-reserve", action="store_true", help="print the fitted reserve per GPU type and stop")
    p.add_argument("--reserve-gib", type=float, default=None, metavar="GIB",
                   help="use this framework reserve on every GPU instead of the GPU files' (to test a "
                        "reserve fitted on another set)")
    p.add_argument("--network-latency-us", type=float, default=None, metavar="US",
                   help="latency of every message between nodes (a what-if; default: none, as imported)")
    args = p.parse_args(argv)
    try:
        _check_arguments(args)
        table = run_all(args)
        if table["error"].notna().all():
            raise HetsimError(f"every plan failed, e.g. {table['plan'].iloc[0]}: {table['error'].iloc[0]} "
                              "(nothing written)")
    except HetsimError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2
    if args.fit_reserve:
        print(fitted_reserves(table).to_string())
        return 0
    stats = summary(table)
    print(stats.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if args.out:
        write_text(args.out, table.to_csv(index=False, float_format="%.6g"))
        md = args.out.with_suffix(".md")
        write_text(md, f"# {args.out.stem}\n\n```\npython {' '.join(sys.argv)}\n```\n\n"
                   + markdown(stats) + "\n\n" + markdown(table.drop(columns=["reserve_bytes"])) + "\n")
        plot(table, args.out.with_suffix(".png"))
        print(f"wrote {args.out}, {md.name}, {args.out.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
