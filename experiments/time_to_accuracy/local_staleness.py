"""What-if for the statistical-efficiency model: count a pipeline's own (local) staleness per weight,
with a cost of its own, and see whether the held-back plans of results/runs.json come out closer.

    python experiments/time_to_accuracy/local_staleness.py      # writes results/local_staleness.md

hetsim.convergence counts local staleness per update: the mean over every stage's updates. Two runs
say that is not what costs steps. A one-VW 1F1B pipeline with Nm = 2 whose stale stage (the first)
holds only the first layer (66 k of 2.2 M weights) reaches each target in as few minibatches as the
same pipeline with one minibatch in flight (nothing stale), while the even cut, whose stale stage holds
half the weights, takes up to twice as many; both cuts have the same per-update mean (0.5).

The alternative here, per target loss:

    samples = samples_min * (1 + G / noise_batch) * (1 + local_cost * s_w) * (1 + global_cost * s_g)
              * (1 + async_cost * (V - 1))

s_w: each stage's mean local staleness weighted by the stage's share of its VW's weights, averaged
over the VWs; s_g: hetsim.convergence's effective staleness less its local part (under WSP the other
VWs' missing updates); G and V as hetsim.convergence has them. It is fitted, as fit.py fits the shipped
model, on FIT_ON plus the Nm = 1 pipeline (a fifth constant needs a fifth plan) and checked on the
others. Only the runs' two-stage 1F1B pipelines are handled: their last stage is never stale (it runs
each minibatch's backward right after its forward), so the first stage's mean is twice the pooled one.
Nothing here changes hetsim; it is the evidence for a change.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fit import FIT_ON, MODEL, MODEL_KWARGS, RUNS, SMOOTHING, TARGETS, dynamics, fit_entry  # noqa: E402

from hetsim.convergence import crossing, samples_to_target  # noqa: E402
from modelzoo.counting import counted_profile  # noqa: E402

FIT_HERE = FIT_ON + ("vw1_1f1b_nm1",)


def features(run: dict, weights: list[int]) -> tuple[float, float, float, float]:
    """(update batch, weighted local staleness, global staleness, asynchronous VWs) of a run's prediction."""
    d = dynamics(run, "predicted")
    vws = run["plan"]["virtual_workers"]
    if any(len(vw["stages"]) != 2 for vw in vws) or run["plan"]["schedule"] not in ("1f1b", "gpipe", "1f1b-flush"):
        raise SystemExit(f"{run['name']}: only two-stage 1F1B/GPipe pipelines are handled here")
    local = run["predicted"]["staleness"]["local"]["mean"] or 0.0
    first = [sum(weights[slice(*vw["stages"][0]["layers"])]) / sum(weights) for vw in vws]
    return d.update_batch, 2 * local * statistics.mean(first), d.staleness - local, d.async_vws


def samples(x: list[float], f: tuple[float, float, float, float]) -> float:
    smin, noise_batch, local_cost, global_cost, async_cost = x
    batch, s_w, s_g, vws = f
    return (smin * (1 + batch / noise_batch) * (1 + local_cost * s_w) * (1 + global_cost * s_g)
            * (1 + async_cost * (vws - 1)))


def fit(observations: list[tuple[tuple, float]]) -> list[float]:
    """Least squares in log samples: a coarse grid, then a pattern search (samples_min in closed form)."""
    def at(x):
        logs = [math.log(s) - math.log(samples([1.0, *x[1:]], f)) for f, s in observations]
        mean = sum(logs) / len(logs)
        return sum((v - mean) ** 2 for v in logs), [math.exp(mean), *x[1:]]
    grid = itertools.product([16, 32, 64, 128, 256, 512, 1024, 4096], [0, 0.1, 0.3, 1, 3],
                             [0, 0.03, 0.1, 0.3, 1], [0, 0.3, 1, 3])
    err, x = min((at([1.0, *g]) for g in grid), key=lambda r: r[0])
    step = 0.3
    while step > 1e-6:
        moves = [at([v * math.exp(d) if j == i else v for j, v in enumerate(x)])
                 for i in range(1, 5) if x[i] for d in (step, -step)]
        best = min(moves, key=lambda r: r[0], default=(err, x))
        if best[0] < err - 1e-12:
            err, x = best
        else:
            step /= 2
    return x


def main() -> int:
    runs = json.loads(RUNS.read_text())["runs"]
    weights = [l.param_bytes for l in counted_profile(MODEL, 128, **MODEL_KWARGS)[0].layers]
    shipped = fit_entry(runs)
    names = list(dict.fromkeys(r["name"] for r in runs))
    lines = ["# Local staleness per weight, with its own cost (`python experiments/time_to_accuracy/local_staleness.py`)",
             "", "Minibatches to each target: measured (median of the seeds), the shipped model (fit.py, fitted on "
             f"{', '.join(FIT_ON)}) and the alternative (fitted on those and vw1_1f1b_nm1).", "",
             "| target | samples_min | noise_batch | local_cost | global_cost | async_cost |", "|---|---|---|---|---|---|"]
    rows, errors = [], {"shipped": [], "alternative": []}
    for target in TARGETS:
        obs = [(features(r, weights), crossing(r["measured"]["curve"], target, SMOOTHING)[0] * r["plan"]["minibatch_size"])
               for r in runs if r["name"] in FIT_HERE]
        x = fit(obs)
        lines.append(f"| {target:g} | {x[0]:.0f} | {x[1]:.1f} | {x[2]:.3f} | {x[3]:.3f} | {x[4]:.3f} |")
        for name in names:
            seeds = [r for r in runs if r["name"] == name]
            batch = seeds[0]["plan"]["minibatch_size"]
            measured = statistics.median(crossing(r["measured"]["curve"], target, SMOOTHING)[0] for r in seeds)
            d = dynamics(seeds[0], "predicted")
            old = samples_to_target(shipped.at(target), d.update_batch, d.staleness, d.async_vws) / batch
            f = features(seeds[0], weights)
            new = samples(x, f) / batch
            e_old, e_new = 100 * (old / measured - 1), 100 * (new / measured - 1)
            if name not in FIT_HERE:
                errors["alternative"].append(abs(e_new))
            if name not in FIT_ON and name not in FIT_HERE:
                errors["shipped"].append(abs(e_old))
            role = "fit" if name in FIT_HERE else "held back"
            rows.append(f"| {name} | {role} | {target:g} | {f[1]:.2f} | {f[2]:.2f} | {f[3]:.2f} | {measured:g} | "
                        f"{old:.1f} ({e_old:+.1f}) | {new:.1f} ({e_new:+.1f}) |")
    lines += ["", "| plan | role (alternative) | target | s_w | s_g | V | measured | shipped model (error %) | "
              "alternative (error %) |", "|---|---|---|---|---|---|---|---|---|"] + rows
    for which, errs in errors.items():
        lines.append(f"\n{which}: held-back median |error| {statistics.median(errs):.1f} %, max {max(errs):.1f} % "
                     f"over {len(errs)} (plan, target) pairs")
    (HERE / "results" / "local_staleness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
