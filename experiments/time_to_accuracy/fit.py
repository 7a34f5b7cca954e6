"""Fit the statistical-efficiency model (hetsim.convergence) of the mlp on the teacher task from the
executor runs in results/runs.json (written by run.py), and write its entry in
gpu_profiles/convergence.yaml.

    python experiments/time_to_accuracy/fit.py

Fitted on the runs of FIT_ON (one VW asynchronous and flushed, two WSP VWs level and with a straggler:
every axis of the model varies among them): their update batch, staleness and measured minibatches to each target;
the others are held back: the model's minibatches against the minibatches they took, in results/fit.md.
The staleness is by default the SIMULATED one of the same plan (`--staleness predicted`), the figure
the model is later applied to: the executor's WSP staleness also holds drift that the host's load puts
between symmetric VWs (3.6 measured vs 1.5 simulated for D = 4 on a shared host), and a cost fitted to
it would be applied to figures without it. `--staleness measured` fits the executor's own figures.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

from hetsim.convergence import (ConvergenceModel, Observation, crossing, dynamics_of, fit_target,
                                samples_to_target)
from hetsim.data import data_root
from hetsim.fields import dump_yaml
from modelzoo.counting import counted_profile

HERE = Path(__file__).resolve().parent
RUNS = HERE / "results" / "runs.json"
MODEL, MODEL_KWARGS, TASK = "mlp", {"hidden": 1024, "depth": 3}, "teacher"
TARGETS, DEFAULT_TARGET = (1.6, 1.2, 0.9), 1.2
SMOOTHING = 16                     # losses in the moving mean (over every VW, in time order)
LR, MOMENTUM = 0.05, 0.9           # the executor's defaults (executor.options)
FIT_ON = ("vw1_1f1b_nm2", "vw1_gpipe_nm4", "wsp_d0", "wsp_d2_straggler")
SEEDS = (0, 1, 2, 3, 4)            # each plan runs with each: a crossing moves by tens of minibatches between seeds


def dynamics(run: dict, side: str):
    """A run's update batch, staleness and asynchronous VWs as its `side` (predicted or measured) saw them."""
    return dynamics_of(run["plan"], run[side]["staleness"], run[side].get("busy"))


def observations(runs: list[dict], target: float, staleness: str = "predicted") -> list[Observation]:
    out = []
    for run in runs:
        hit = crossing(run["measured"]["curve"], target, SMOOTHING)
        if hit is None:
            continue
        d = dynamics(run, staleness)
        out.append(Observation(update_batch=d.update_batch, staleness=d.staleness, async_vws=d.async_vws,
                               samples=hit[0] * run["plan"]["minibatch_size"]))
    return out


def fit_entry(runs: list[dict], staleness: str = "predicted") -> ConvergenceModel:
    fitted = [r for r in runs if r["name"] in FIT_ON]
    batch = fitted[0]["plan"]["minibatch_size"]
    batches = [dynamics(r, staleness).update_batch for r in fitted]
    return ConvergenceModel(
        model=MODEL, task=TASK, minibatch_size=batch, smoothing=SMOOTHING, default_target=DEFAULT_TARGET,
        targets=tuple(fit_target(t, observations(fitted, t, staleness)) for t in TARGETS),
        trained_with={"model_kwargs": MODEL_KWARGS, "lr": LR, "momentum": MOMENTUM, "optimizer": "momentum",
                      "data": f"teacher (executor.data), seeds {sorted({r.get('seed', 0) for r in fitted})}"},
        source=(f"experiments/time_to_accuracy/fit.py from executor runs of {', '.join(r['name'] for r in fitted)} "
                f"(minibatches measured, staleness {staleness})"),
        param_bytes=counted_profile(MODEL, batch, **MODEL_KWARGS)[0].param_bytes,
        update_batches=(min(batches), max(batches)))


def write_entry(model: ConvergenceModel, path: Path | None = None) -> Path:
    """Replace (or add) this model+task's entry, keeping the file's others."""
    path = path or data_root() / "convergence.yaml"
    doc = yaml.safe_load(path.read_text()) if path.exists() else None
    entries = [e for e in (doc or {}).get("entries", []) if (e["model"], e["task"]) != (model.model, model.task)]
    entries.append({
        "model": model.model, "task": model.task, "minibatch_size": model.minibatch_size,
        "smoothing": model.smoothing, "default_target": model.default_target, "trained_with": model.trained_with,
        "param_bytes": model.param_bytes, "update_batches": list(model.update_batches), "source": model.source,
        "targets": [{"loss": t.loss, "samples_min": round(t.samples_min, 1),
                     "noise_batch": None if t.noise_batch is None else round(t.noise_batch, 1),
                     "staleness_cost": round(t.staleness_cost, 4), "async_cost": round(t.async_cost, 4)}
                    for t in model.targets]})
    path.write_text(_HEADER + dump_yaml({"entries": entries}, sort_keys=False))
    return path


_HEADER = """\
# Statistical efficiency per model and task (hetsim.convergence): samples to reach each target loss,
#   samples = samples_min * (1 + update_batch / noise_batch) * (1 + staleness_cost * effective_staleness)
#             * (1 + async_cost * (asynchronous VWs - 1))
# (noise_batch null: no batch effect fitted). Written by experiments/time_to_accuracy/fit.py from
# executor runs; `smoothing` is the moving mean of losses whose first crossing of a target counts.
"""


def held_back_check(runs: list[dict], model: ConvergenceModel, staleness: str = "predicted") -> list[str]:
    """Minibatches to each target of the plans not fitted on: the model's (at their `staleness`) against
    the median over the plan's seeds."""
    lines = ["| plan | target | update batch | staleness | minibatches model | measured (median of seeds) | error % |",
             "|---|---|---|---|---|---|---|"]
    errors = []
    held = [r for r in runs if r["name"] not in FIT_ON]
    for name in dict.fromkeys(r["name"] for r in held):
        seeds = [r for r in held if r["name"] == name]
        d = dynamics(seeds[0], staleness)
        s = statistics.median(dynamics(r, staleness).staleness for r in seeds)
        for fit in model.targets:
            hits = [crossing(r["measured"]["curve"], fit.loss, model.smoothing) for r in seeds]
            got = statistics.median(h[0] for h in hits) if all(hits) else None
            want = samples_to_target(fit, d.update_batch, s, d.async_vws) / seeds[0]["plan"]["minibatch_size"]
            err = 100 * (want - got) / got if got else None
            errors += [abs(err)] if err is not None else []
            lines.append(f"| {name} | {fit.loss:g} | {d.update_batch} | {s:.2f} | {want:.1f} | "
                         f"{'not reached' if got is None else f'{got:g}'} | {'' if err is None else f'{err:+.1f}'} |")
    if errors:
        lines.append(f"\nheld back: median |error| {statistics.median(errors):.1f} %, max {max(errors):.1f} % "
                     f"over {len(errors)} (plan, target) pairs")
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--staleness", choices=("predicted", "measured"), default="predicted",
                   help="whose staleness figures the fit uses (default: the simulation's)")
    args = p.parse_args(argv)
    runs = json.loads(RUNS.read_text())["runs"]
    model = fit_entry(runs, args.staleness)
    path = write_entry(model)
    print(write_fit_report(runs, model, args.staleness) + f"\nwrote {path}")
    return 0


def write_fit_report(runs: list[dict], model: ConvergenceModel, staleness: str = "predicted") -> str:
    """results/fit.md: the constants and the held-back check; returns its text."""
    lines = [f"# Fit of {MODEL}/{TASK} (hetsim.convergence) from {RUNS.name}", "",
             "| target | samples_min | noise_batch | staleness_cost | async_cost |", "|---|---|---|---|---|"]
    lines += [f"| {t.loss:g} | {t.samples_min:.0f} | {'-' if t.noise_batch is None else round(t.noise_batch)} "
              f"| {t.staleness_cost:.3f} | {t.async_cost:.3f} |" for t in model.targets]
    lines += ["", f"## Held back (model at {staleness} staleness vs measured minibatches)", ""]
    lines += held_back_check(runs, model, staleness)
    (HERE / "results" / "fit.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
