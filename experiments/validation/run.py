"""Run the validation suite: predict each plan with a profile measured on this host, execute it,
and write a table and a predicted-vs-measured plot under experiments/results/.

    python experiments/validation/run.py            # every plan (38; about 25 minutes on 2 cores)
    python experiments/validation/run.py --quick    # five plans, fewer waves
    python experiments/validation/run.py --repeats 3  # each plan run 3 times, the median kept (~75 minutes)
    python experiments/validation/run.py --only s3_nm3_1f1b_slowlast2 ... --stem NAME
        # some plans, written to experiments/results/NAME.*; --merge joins such parts into one table

Around every run of a plan, as `hetsim validate` does, the model is profiled (per-layer CPU seconds,
15 passes, about 1.5 s, just before and just after the run; the prediction uses their mean) and the
cores our processes get (the host's, minus other load), the stages' co-located work and gloo's
latency and bandwidth are measured before it, so the prediction describes the host as that run
finds it: this VM's speed drifts by up to 10% over minutes, and one profile for the whole suite once
made most plans up to 12 points more optimistic.
Target: median |throughput error| <= 3%, max <= 8%. The script reports whether it was met and exits
1 if not, after writing its results. Timings depend on the host being otherwise idle. A run is flagged
(a warning, and `work_drift` in the table) when a rank's measured CPU work per minibatch differs from
the profile's prediction by more than executor.validate.WORK_DRIFT_PCT.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import BATCH, CUDA_BATCH, CUDA_MODEL_KWARGS, MODEL_KWARGS, cases  # noqa: E402

from executor.validate import (WAVES, WORK_DRIFT_PCT, default_warmup, load_changed, validate_plan,  # noqa: E402
                                 work_drift, work_rows, write_inputs)
from hetsim.compare import compare_reports, percent_error  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
MEDIAN_TOL, MAX_TOL = 3.0, 8.0
MINIBATCHES = 60                  # per VW and run, at least


def case_waves(nm: int, quick: bool) -> int:
    """Waves per run: WAVES, or more for small Nm, so that each VW times at least 3/5 of MINIBATCHES
    minibatches after warm-up (18 of Nm = 1 left a single VW's rate to a handful of completions)."""
    if quick:
        return 10
    return max(WAVES, -(-MINIBATCHES // nm))


def row(case, prediction, measurement) -> dict:
    comp = {c.metric: c for c in compare_reports(prediction, measurement)}
    tp = comp["throughput samples/s"]
    out = {"plan": case.name, "schedule": case.plan.schedule, "sync": case.plan.sync.mode,
           "vws": len(case.plan.virtual_workers), "stages": len(case.plan.virtual_workers[0].stages),
           "nm": case.plan.nm, "D": case.plan.sync.staleness_bound if case.plan.sync.mode == "wsp" else "",
           "waves": measurement.settings["waves"], "warmup_waves": measurement.settings["warmup_waves"],
           "slowdown": " ".join(f"{g}x{f}" for g, f in sorted(case.slowdown.items())),
           "cores_available": prediction.cluster.split("_")[2],
           "latency_us": prediction.cluster.split("_")[4][:-2],
           "handoff_us": round(measurement.training.get("handoff_s", 0.0) * 1e6),
           "colocated_work": measurement.training["colocated_work"],
           "cores_after": measurement.training.get("cores_available", {}).get("after", ""),
           "predicted_samples_s": round(tp.predicted, 1), "measured_samples_s": round(tp.measured, 1),
           "error_pct": round(tp.error_pct, 1),
           # The run's error had the prediction left out the scheduler's hand-off delay, and had it
           # charged each rank the work it measured (the simulator's own share); "" where not made.
           "error_without_handoff_pct": _error_of(measurement, "predicted_samples_s_without_handoff", tp.measured),
           "error_at_measured_work_pct": _error_of(measurement, "predicted_samples_s_at_measured_work", tp.measured),
           # ... and with the simulator's jitter at the pass-to-pass variability of the run's work.
           "work_cv": measurement.training.get("work_cv", ""),
           "error_at_measured_work_and_cv_pct": _error_of(measurement, "predicted_samples_s_at_measured_work_and_cv",
                                                          tp.measured)}
    work = work_rows(measurement)
    errors = [abs(w.error_pct) for w in work if w.error_pct is not None]
    out["cpu_work_max_abs_error_pct"] = round(max(errors), 1) if errors else ""
    out["work_drift"] = "yes" if errors and max(errors) > WORK_DRIFT_PCT else ""    # flagged, see work_drift
    if "global staleness max" in comp:
        out["global_staleness_max pred/meas"] = (f"{comp['global staleness max'].predicted}/"
                                                 f"{comp['global staleness max'].measured}")
    return out


def _error_of(measurement, key: str, measured: float):
    """The run's error for the other prediction validate recorded under `key` ("" where it made none)."""
    other = measurement.training.get(key)
    return round(percent_error(other, measured), 1) if other else ""


def _median_run(runs: list[tuple[dict, str | None]]) -> dict:
    """Of several runs of one plan, the one whose error is the median, with the range of all errors."""
    ordered = sorted((r for r, _ in runs), key=lambda r: r["error_pct"])
    out = dict(ordered[(len(ordered) - 1) // 2])      # of an even number, the lower middle one
    if len(ordered) > 1:
        out["error_range_pct"] = f"{ordered[0]['error_pct']:+.1f}..{ordered[-1]['error_pct']:+.1f}"
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 5))
    xs = [r["measured_samples_s"] for r in rows]
    ys = [r["predicted_samples_s"] for r in rows]
    hi = max(xs + ys) * 1.1
    ax.plot([0, hi], [0, hi], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([0, hi], [0, 0.9 * hi], [0, 1.1 * hi], color="0.9", label="±10%")
    ax.scatter(xs, ys, s=18, zorder=3)
    for r in rows:
        ax.annotate(r["plan"], (r["measured_samples_s"], r["predicted_samples_s"]), fontsize=5,
                    xytext=(3, 2), textcoords="offset points")
    ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="measured samples/s (executor)", ylabel="predicted samples/s (hetsim)",
           title="hetsim prediction vs executor measurement")
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="five plans, 10 waves, 4 of them warm-up")
    p.add_argument("--waves", type=int, default=None,
                   help=f"waves per run (default: max({WAVES}, {MINIBATCHES} / Nm), 10 with --quick)")
    p.add_argument("--warmup-waves", type=int, default=None)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each plan; the table keeps the run with the median error and its range")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: the GPU suite uses a wider model "
                   f"({CUDA_MODEL_KWARGS}) and minibatch {CUDA_BATCH}, and writes validation_cuda.*")
    p.add_argument("--only", nargs="+", default=None, metavar="PLAN",
                   help="run these plans of the suite only (writes STEM_part.*; see --merge)")
    p.add_argument("--merge", nargs="+", default=None, metavar="CSV",
                   help="run nothing: join the tables of runs of parts of the suite (their CSVs) into one, "
                        "named after --device")
    p.add_argument("--inputs", default=None, metavar="DIR",
                   help="also write each run's prediction inputs (plan, cluster, profile, the simulate command) "
                        "under DIR/PLAN (DIR/PLAN_runK with --repeats)")
    p.add_argument("--stem", default=None, help="name of the files written (default: validation, with _cuda, "
                   "_quick and _part as chosen)")
    args = p.parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out), args.stem or "validation" + ("_cuda" if args.device != "cpu" else ""))
    cuda = args.device != "cpu"
    chosen = [c for c in cases(CUDA_BATCH if cuda else BATCH) if c.quick or not args.quick]
    if args.only:
        unknown = set(args.only) - {c.name for c in chosen}
        if unknown:
            p.error(f"--only: no such plan in the suite: {', '.join(sorted(unknown))}")
        chosen = [c for c in chosen if c.name in args.only]
    from tqdm import tqdm
    rows, load = [], [os.getloadavg()[0]]
    for case in tqdm(chosen, desc="validation", unit="plan"):
        runs = []
        waves = args.waves or case_waves(case.plan.nm, args.quick)
        warmup = default_warmup(waves) if args.warmup_waves is None else args.warmup_waves
        for k in range(args.repeats):
            kwargs = case.model_kwargs if case.model_kwargs is not None else (
                CUDA_MODEL_KWARGS if cuda else MODEL_KWARGS)
            inputs: dict = {}
            prediction, measurement = validate_plan(case.plan, model_kwargs=kwargs,
                                                    waves=waves, warmup_waves=warmup, slowdown=case.slowdown,
                                                    profile_repeats=15, device=args.device, inputs=inputs)
            if args.inputs:
                write_inputs(inputs, os.path.join(args.inputs, case.name + (f"_run{k + 1}" if args.repeats > 1 else "")))
            runs.append((row(case, prediction, measurement),
                         [w for w in (load_changed(measurement), work_drift(measurement)) if w]))
            load.append(os.getloadavg()[0])
        rows.append(_median_run(runs))
        tqdm.write(f"{case.name}: predicted {rows[-1]['predicted_samples_s']} measured "
                   f"{rows[-1]['measured_samples_s']} samples/s ({rows[-1]['error_pct']:+.1f}%)")
        for _, warnings in runs:
            for warning in warnings:
                tqdm.write(f"  warning: {warning}")
    summary = summarise(rows, {
        "waves": args.waves or f"max({WAVES}, {MINIBATCHES} / Nm)", "repeats": args.repeats,
        "host": {"cores": os.cpu_count(), "machine": platform.machine(), "cpu": _cpu_model(), "load_avg_1min": load},
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "warmup_waves": args.warmup_waves if args.warmup_waves is not None else "default_warmup(waves)",
        "quick": args.quick, "device": _device_name(args.device), "only": args.only})
    stem = args.stem or ("validation" + ("_cuda" if cuda else "") + ("_quick" if args.quick else "")
                         + ("_part" if args.only else ""))
    write(rows, summary, Path(args.out), stem)
    print(f"1-min load average during the run {min(load):.1f}..{max(load):.1f} on {os.cpu_count()} cores")
    return verdict(summary)


def _cpu_model() -> str:
    """The host's CPU as /proc/cpuinfo names it (family and model numbers where the name is generic)."""
    try:
        info = {key.strip(): value for key, value in (line.split(":", 1) for line in
                open("/proc/cpuinfo").read().split("\n\n")[0].splitlines() if ":" in line)}
    except OSError:
        return platform.processor()
    get = lambda key: info.get(key, "").strip()
    return f"{get('model name')} (family {get('cpu family')}, model {get('model')})"


def summarise(rows: list[dict], extra: dict) -> dict:
    errors = [abs(r["error_pct"]) for r in rows]
    replays = {}
    for key in ("at_measured_work", "at_measured_work_and_cv"):
        replayed = [abs(r[f"error_{key}_pct"]) for r in rows if r.get(f"error_{key}_pct") not in ("", None)]
        if replayed:
            replays[key] = {"median_abs_error_pct": statistics.median(replayed), "max_abs_error_pct": max(replayed)}
    return {"plans": len(rows), "median_abs_error_pct": statistics.median(errors), "max_abs_error_pct": max(errors),
            "targets": {"median": MEDIAN_TOL, "max": MAX_TOL}, **replays, **extra}


def verdict(summary: dict) -> int:
    ok = summary["median_abs_error_pct"] <= MEDIAN_TOL and summary["max_abs_error_pct"] <= MAX_TOL
    print(f"median |error| {summary['median_abs_error_pct']:.1f}% (target {MEDIAN_TOL}%), max "
          f"{summary['max_abs_error_pct']:.1f}% (target {MAX_TOL}%): {'met' if ok else 'NOT met'}")
    for key, what in (("at_measured_work", "at the work each rank measured (the simulator's share)"),
                      ("at_measured_work_and_cv", "... with their passes varying as in the run too")):
        if key in summary:
            print(f"{what}: median |error| {summary[key]['median_abs_error_pct']:.1f}%, max "
                  f"{summary[key]['max_abs_error_pct']:.1f}%")
    return 0 if ok else 1


def merge(csvs: list[str], out: Path, stem: str) -> int:
    """One table, plot and summary from the CSVs of runs of parts of the suite (each beside its
    _summary.json), in the suite's plan order; a plan in several of them keeps the last one's row
    (a part run again)."""
    by_plan, parts = {}, []
    for path in map(Path, csvs):
        with open(path, newline="") as f:
            by_plan.update((r["plan"], {k: _number(v) for k, v in r.items()}) for r in csv.DictReader(f))
        parts.append(json.loads(path.with_name(path.stem + "_summary.json").read_text()))
    order = {c.name: i for i, c in enumerate(cases())}
    rows = sorted(by_plan.values(), key=lambda r: order.get(r["plan"], len(order)))
    summary = summarise(rows, {"merged_from": [Path(c).name for c in csvs], "parts": parts})
    write(rows, summary, out, stem)
    return verdict(summary)


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _device_name(device: str) -> str:
    if device == "cpu":
        return f"cpu ({platform.processor() or platform.machine()})"
    import torch
    return f"{device} ({torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__})"


def write(rows: list[dict], summary: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (out / f"{stem}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(rows, out / f"{stem}.png")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
