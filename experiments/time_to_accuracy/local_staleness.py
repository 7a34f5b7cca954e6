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
others, beside the shipped model and the shipped model's form refitted on the same five plans. Only
two-stage pipelines are handled: under 1F1B their last stage is never stale (it runs each
minibatch's backward right after its forward), so the first stage's mean is twice the pooled one
(GPipe and BSP plans have none). Nothing here changes hetsim; it is the evidence for a change.
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

from hetsim.convergence import Observation, crossing, fit_target, samples_to_target  # noqa: E402
from modelzoo.counting import counted_profile  # noqa: E402

FIT_HERE = FIT_ON + ("vw1_1f1b_nm1",)
TWIN = "vw1_1f1b_nm2_lopsided"      # nearly vw1_1f1b_nm1 (weighted staleness 0.03 vs 0): held back, but barely
_EPS = 0.01                         # a cost moves on log(cost + _EPS), so that one at 0 can leave it


def features(run: dict, weights: list[int]) -> tuple[float, float, float, float]:
    """(update batch, weighted local staleness, global staleness, asynchronous VWs) of a run's prediction."""
    d = dynamics(run, "predicted")
    vws = run["plan"]["virtual_workers"]
    if any(len(vw["stages"]) != 2 for vw in vws):
        raise ValueError(f"{run['name']}: only two-stage pipelines are handled here")
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

    def moved(x, i, d):
        y = list(x)
        y[i] = x[i] * math.exp(d) if i == 1 else max(0.0, (x[i] + _EPS) * math.exp(d) - _EPS)
        return y
    grid = itertools.product([16, 32, 64, 128, 256, 512, 1024, 4096], [0, 0.1, 0.3, 1, 3],
                             [0, 0.03, 0.1, 0.3, 1], [0, 0.3, 1, 3])
    err, x = min((at([1.0, *g]) for g in grid), key=lambda r: r[0])
    step = 0.3
    while step > 1e-6:
        best = min((at(moved(x, i, d)) for i in range(1, 5) for d in (step, -step)), key=lambda r: r[0])
        if best[0] < err - 1e-12:
            err, x = best
        else:
            step /= 2
    return x


def measured_minibatches(seeds: list[dict], target: float) -> float | None:
    """The median over the seeds, or None unless every seed reached the target."""
    hits = [crossing(r["measured"]["curve"], target, SMOOTHING) for r in seeds]
    return statistics.median(h[0] for h in hits) if all(hits) else None


def observations(runs: list[dict], target: float, weights: list[int]) -> tuple[list, list]:
    """(this model's, the shipped form's) observations of the FIT_HERE runs that reached `target`."""
    mine, shipped = [], []
    for r in runs:
        hit = crossing(r["measured"]["curve"], target, SMOOTHING)
        if r["name"] in FIT_HERE and hit:
            n = hit[0] * r["plan"]["minibatch_size"]
            d = dynamics(r, "predicted")
            mine.append((features(r, weights), n))
            shipped.append(Observation(update_batch=d.update_batch, staleness=d.staleness,
                                       async_vws=d.async_vws, samples=n))
    return mine, shipped


def main() -> int:
    runs = json.loads(RUNS.read_text())["runs"]
    weights = [l.param_bytes for l in counted_profile(MODEL, 128, **MODEL_KWARGS)[0].layers]
    shipped = fit_entry(runs)
    names = list(dict.fromkeys(r["name"] for r in runs))
    lines = ["# Local staleness per weight, with its own cost (`python experiments/time_to_accuracy/local_staleness.py`)",
             "", "Minibatches to each target: measured (median of the seeds); the shipped model (fit.py, fitted on "
             f"{', '.join(FIT_ON)}); the shipped model's form refitted on those and vw1_1f1b_nm1; and the "
             "alternative, fitted on the same five.", "",
             "| target | samples_min | noise_batch | local_cost | global_cost | async_cost |", "|---|---|---|---|---|---|"]
    rows, errors = [], {"shipped": [], "shipped form, same five plans": [], "alternative": []}
    for target in TARGETS:
        mine, theirs = observations(runs, target, weights)
        x, refit = fit(mine), fit_target(target, theirs)
        lines.append(f"| {target:g} | {x[0]:.0f} | {x[1]:.1f} | {x[2]:.3f} | {x[3]:.3f} | {x[4]:.3f} |")
        for name in names:
            seeds = [r for r in runs if r["name"] == name]
            measured = measured_minibatches(seeds, target)
            if measured is None:
                continue
            batch, d, f = seeds[0]["plan"]["minibatch_size"], dynamics(seeds[0], "predicted"), features(seeds[0], weights)
            models = [samples_to_target(shipped.at(target), d.update_batch, d.staleness, d.async_vws),
                      samples_to_target(refit, d.update_batch, d.staleness, d.async_vws), samples(x, f)]
            cells = []
            for (which, errs), predicted in zip(errors.items(), models):
                e = 100 * (predicted / batch / measured - 1)
                if name not in FIT_HERE:
                    errs.append((name, abs(e)))
                cells.append(f"{predicted / batch:.1f} ({e:+.1f})")
            rows.append(f"| {name} | {'fit' if name in FIT_HERE else 'held back'} | {target:g} | {f[1]:.2f} | "
                        f"{f[2]:.2f} | {f[3]:.2f} | {measured:g} | " + " | ".join(cells) + " |")
    lines += ["", "| plan | role (the last two) | target | s_w | s_g | V | measured | shipped (error %) | "
              "shipped form, same five plans | alternative |", "|---|---|---|---|---|---|---|---|---|---|"] + rows
    lines += ["", "Held back from the last two (the shipped model's fit holds back vw1_1f1b_nm1 too), median / max "
              f"|error|, over every held-back (plan, target) pair and without {TWIN}:", ""]
    for which, errs in errors.items():
        every, apart = [e for _, e in errs], [e for n, e in errs if n != TWIN]
        lines.append(f"- {which}: {statistics.median(every):.1f} % / {max(every):.1f} % over {len(every)}; "
                     f"{statistics.median(apart):.1f} % / {max(apart):.1f} % over {len(apart)}")
    (HERE / "results" / "local_staleness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
