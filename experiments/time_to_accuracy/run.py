"""Time to accuracy: predicted vs measured time to a target loss, on this host's CPU ranks.

    python experiments/time_to_accuracy/run.py            # 12 plans, measure + fit + compare
    python experiments/time_to_accuracy/run.py --quick    # 3 plans (a pipeline check)
    python experiments/time_to_accuracy/run.py --compare  # no runs: refit and compare results/runs.json

Each plan runs as `hetsim validate` runs it (executor.validate.validate_plan: this host profiled just
before and after, the plan executed, the same plan simulated with that profile), but on the executor's
`teacher` task, so that its loss falls. Then:
1. fit.py fits the statistical-efficiency model (hetsim.convergence) on the FIT plans' measured runs
   (their update batch, measured staleness and minibatches to each target) and writes
   gpu_profiles/convergence.yaml;
2. for every plan, predicted time to target = the model's samples at the SIMULATED staleness / the
   SIMULATED samples per second, against the measured time the moving mean of the loss first reaches
   the target. Both clocks start at the run's first loss: process start-up (spawning, building the
   model) is not part of training and not simulated.
Results: results/runs.json (the measured curves), results/time_to_accuracy.{csv,md}. Goal: median
|error| <= 10 % over every plan and target. Wall-clock times need an otherwise idle host.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fit import FIT_ON, MODEL, MODEL_KWARGS, RUNS, SEEDS, TARGETS, dynamics, fit_entry, write_entry, write_fit_report  # noqa: E402

from hetsim.convergence import crossing, samples_to_target, vw_busy  # noqa: E402
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker  # noqa: E402

BATCH, CUTS = 128, (0, 3, 7)       # the mlp's 7 layers cut into 1.12 M and 1.06 M weights
LOPSIDED = (0, 1, 7)               # the first layer (66 k weights) alone, then the rest: a VW ~2x slower
PROFILE_REPEATS = 15               # passes per profile around a run, as the CPU validation suite takes
MEDIAN_TOL = 10.0


@dataclass(frozen=True, kw_only=True)
class Case:
    plan: Plan
    waves: int                                   # enough for the slowest to reach every target
    slowdown: dict[str, float] = field(default_factory=dict)
    quick: bool = False


def _plan(name: str, n_vw: int, nm: int, schedule: str, sync: SyncSpec = SyncSpec(),
          cuts: dict[int, tuple[int, ...]] | None = None) -> Plan:
    """`cuts`: VW index -> its cuts, where not CUTS."""
    gpus = iter(range(100))
    per_vw = [(cuts or {}).get(v, CUTS) for v in range(n_vw)]
    vws = tuple(VirtualWorker(name=f"vw{v}", stages=tuple(
        StageSpec(gpu=f"host/gpu{next(gpus)}", layers=(c[s], c[s + 1])) for s in range(len(c) - 1)))
        for v, c in enumerate(per_vw))
    return Plan(name=name, model=MODEL, minibatch_size=BATCH, nm=nm, schedule=schedule, sync=sync,
                virtual_workers=vws)


def cases() -> list[Case]:
    """Two-stage pipelines of the mlp: one VW (asynchronous 1F1B; GPipe's flush of 4), and two VWs under
    WSP with D in {0, 1, 2, 4}, WSP with one VW slowed 2x (a straggler, at D = 2 and D = 0), BSP, and
    WSP (D = 2) with one VW slowed by its cut instead, that cut in one VW alone, and one VW with one
    minibatch in flight (no staleness)."""
    wsp = lambda d: SyncSpec(mode="wsp", staleness_bound=d)
    return [
        Case(plan=_plan("vw1_1f1b_nm2", 1, 2, "1f1b"), waves=100, quick=True),
        Case(plan=_plan("vw1_gpipe_nm4", 1, 4, "gpipe"), waves=60),
        Case(plan=_plan("wsp_d0", 2, 2, "1f1b", wsp(0)), waves=150),
        Case(plan=_plan("wsp_d1", 2, 2, "1f1b", wsp(1)), waves=150),
        Case(plan=_plan("wsp_d2", 2, 2, "1f1b", wsp(2)), waves=150),
        Case(plan=_plan("wsp_d4", 2, 2, "1f1b", wsp(4)), waves=150, quick=True),
        Case(plan=_plan("wsp_d2_straggler", 2, 2, "1f1b", wsp(2)), waves=150, quick=True,
             slowdown={"host/gpu2": 2.0, "host/gpu3": 2.0}),
        Case(plan=_plan("bsp", 2, 2, "1f1b-flush", SyncSpec(mode="bsp")), waves=110),
        # Held back: VWs of unequal pace beyond the fitted straggler (V's pace weighting), a cut that
        # leaves the stale first stage few weights, and no staleness at all (local_staleness.py).
        Case(plan=_plan("wsp_d0_straggler", 2, 2, "1f1b", wsp(0)), waves=150,
             slowdown={"host/gpu2": 2.0, "host/gpu3": 2.0}),
        Case(plan=_plan("wsp_d2_lopsided", 2, 2, "1f1b", wsp(2), cuts={1: LOPSIDED}), waves=150),
        Case(plan=_plan("vw1_1f1b_nm2_lopsided", 1, 2, "1f1b", cuts={0: LOPSIDED}), waves=100),
        Case(plan=_plan("vw1_1f1b_nm1", 1, 1, "1f1b"), waves=200),     # one minibatch in flight: nothing stale
    ]


def measure(case: Case, waves: int, seed: int) -> dict:
    """One plan validated on the teacher task with one seed (the task's teacher, the data and the
    initial weights): the measured curve and staleness, the predicted rate and staleness."""
    from executor.validate import validate_plan
    prediction, measurement = validate_plan(case.plan, model_kwargs=MODEL_KWARGS, waves=waves,
                                            slowdown=case.slowdown, data="teacher", seed=seed,
                                            profile_repeats=PROFILE_REPEATS)
    return {"name": case.plan.name, "seed": seed, "plan": case.plan.to_dict(), "waves": waves,
            "slowdown": case.slowdown, "cluster": prediction.cluster,
            "cores_after": measurement.training.get("cores_available", {}).get("after"),
            "measured": {"samples_per_s": measurement.throughput["samples_per_s"],
                         "staleness": measurement.staleness, "busy": vw_busy(measurement.gpus),
                         "curve": [list(x) for x in measurement.losses]},
            "predicted": {"samples_per_s": prediction.throughput["samples_per_s"],
                          # hetsim validate's split: the simulator at the CPU work each rank did in the run
                          "samples_per_s_at_measured_work":
                              measurement.training.get("predicted_samples_s_at_measured_work"),
                          "staleness": prediction.staleness, "busy": vw_busy(prediction.gpus)}}


def compare(runs: list[dict], entry) -> list[dict]:
    """Per plan and target, over the plan's seeds: the median predicted and measured minibatches and
    seconds. Both clocks start at the loss that completes the first moving mean (entry.smoothing losses
    in): the one-off set-up of the first steps (~0.2 s on this host: the first backward and update
    allocate their state), which nothing simulates, lies before it."""
    rows = []
    start = entry.smoothing
    for name in dict.fromkeys(r["name"] for r in runs):
        seeds = [r for r in runs if r["name"] == name]
        pred = dynamics(seeds[0], "predicted")
        rate_pred = statistics.median(r["predicted"]["samples_per_s"] for r in seeds)
        rate_meas = statistics.median(r["measured"]["samples_per_s"] for r in seeds)
        both = [(dynamics(r, "predicted"), dynamics(r, "measured")) for r in seeds]
        staleness = [(p.staleness, m.staleness) for p, m in both]
        for fit in entry.targets:
            hits = [(crossing(r["measured"]["curve"], fit.loss, entry.smoothing), r) for r in seeds]
            reached = [(h, r) for h, r in hits if h is not None]
            samples = statistics.median(
                samples_to_target(fit, p.update_batch, p.staleness, p.async_vws) for p, _ in both)
            predicted_s = statistics.median(
                (samples - start * BATCH) / r["predicted"]["samples_per_s"] for r in seeds)
            measured_mb = statistics.median(h[0] for h, _ in reached) if len(reached) == len(seeds) else None
            measured_s = (statistics.median(h[1] - r["measured"]["curve"][start - 1][2] for h, r in reached)
                          if measured_mb is not None else None)
            row = {"plan": name, "role": "fit" if name in FIT_ON else "held back", "target": fit.loss,
                   "seeds": len(seeds), "update_batch": pred.update_batch,
                   "staleness pred/meas": (f"{statistics.median(p for p, _ in staleness):.2f}/"
                                           f"{statistics.median(m for _, m in staleness):.2f}"),
                   "samples_s pred/meas": f"{rate_pred:.0f}/{rate_meas:.0f}",
                   "minibatches_pred": round(samples / BATCH, 1), "minibatches_meas": measured_mb,
                   "seconds_pred": round(predicted_s, 2),
                   "seconds_meas": None if measured_s is None else round(measured_s, 2)}
            hit = measured_s is not None
            row["error_pct"] = round(100 * (predicted_s - measured_s) / measured_s, 1) if hit else None
            # The two sources of the error: the steps (hetsim.convergence) and the rate (the simulator).
            row["steps_error_pct"] = round(100 * (samples / BATCH - measured_mb) / measured_mb, 1) if hit else None
            row["rate_error_pct"] = round(100 * (rate_pred / rate_meas - 1), 1)
            row["rate_error_at_measured_work_pct"] = rate_at_measured_work(seeds)
            rows.append(row)
    return rows


def rate_at_measured_work(seeds: list[dict]) -> float | None:
    """The median over the seeds of the simulated samples/s at the work each rank measured in its run
    against their median measured samples/s (medians compared, as rate_error_pct compares them), in per
    cent: the simulator's share of the rate error. None unless every seed has that prediction (runs.json
    from before it was recorded; a hetpipe order it would change)."""
    at_work = [r["predicted"].get("samples_per_s_at_measured_work") for r in seeds]
    if not all(at_work):
        return None
    measured = statistics.median(r["measured"]["samples_per_s"] for r in seeds)
    return round(100 * (statistics.median(at_work) / measured - 1), 1)


def write_table(rows: list[dict], stem: Path, header: str) -> float | None:
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    median = statistics.median(errors) if errors else None
    held = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None and r["role"] == "held back"]
    lines = [header, "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in r.values()) + " |" for r in rows]
    steps = [abs(r["steps_error_pct"]) for r in rows if r["steps_error_pct"] is not None and r["role"] == "held back"]
    rates = [abs(r["rate_error_pct"]) for r in rows if r["role"] == "held back"]
    at_work = [abs(r["rate_error_at_measured_work_pct"]) for r in rows
               if r["role"] == "held back" and r.get("rate_error_at_measured_work_pct") is not None]
    lines += ["", f"median |error| {median:.1f} % over {len(errors)} (plan, target) pairs"
              + (f"; held-back plans only: {statistics.median(held):.1f} %" if held else "")
              + f" (goal <= {MEDIAN_TOL:g} %)" if median is not None else "no plan reached a target"]
    if steps:
        lines.append(f"held back, by source: steps (model) median |error| {statistics.median(steps):.1f} %, "
                     f"samples/s (simulation) median |error| {statistics.median(rates):.1f} %"
                     + (f" ({statistics.median(at_work):.1f} % at the work each rank measured)" if at_work else ""))
    missed = [f"{r['plan']}@{r['target']:g}" for r in rows if r["minibatches_meas"] is None]
    if missed:
        lines.append(f"never reached (raise the case's waves): {', '.join(missed)}")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return median


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 plans, to check the pipeline")
    p.add_argument("--compare", action="store_true", help="no runs: fit and compare results/runs.json")
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), metavar="SEED",
                   help=f"run every plan with each of these seeds (default {' '.join(map(str, SEEDS))})")
    p.add_argument("--only", nargs="+", default=None, metavar="PLAN",
                   help="run only these plans; the other plans' (and seeds') runs in results/runs.json are kept")
    args = p.parse_args(argv)
    chosen = [c for c in cases() if (not args.quick or c.quick) and (not args.only or c.plan.name in args.only)]
    started = time.time()
    if not args.compare:
        runs = []
        for seed in args.seeds:
            for case in chosen:
                t0 = time.time()
                runs.append(measure(case, case.waves, seed))
                print(f"{case.plan.name} seed {seed}: {len(runs[-1]['measured']['curve'])} losses, "
                      f"{time.time() - t0:.0f} s", flush=True)
        if (args.only or args.seeds != list(SEEDS)) and RUNS.exists():   # the other (plan, seed) runs stay
            done = {(x["name"], x["seed"]) for x in runs}
            runs = [r for r in json.loads(RUNS.read_text())["runs"] if (r["name"], r.get("seed", 0)) not in done] + runs
        order = [c.plan.name for c in cases()]
        runs.sort(key=lambda r: (order.index(r["name"]), r.get("seed", 0)))
        RUNS.parent.mkdir(parents=True, exist_ok=True)
        RUNS.write_text(json.dumps({"host": platform.node(), "runs": runs}) + "\n")
    runs = json.loads(RUNS.read_text())["runs"]
    entry = fit_entry(runs)
    write_entry(entry)
    write_fit_report(runs, entry)
    header = (f"# Time to accuracy: predicted vs measured ({MODEL} {MODEL_KWARGS}, minibatch {BATCH}, teacher task, "
              f"targets {', '.join(f'{t:g}' for t in TARGETS)}; moving mean of {entry.smoothing} losses)\n\n"
              f"Fitted on: {', '.join(dict.fromkeys(r['name'] for r in runs if r['name'] in FIT_ON))} "
              f"(seeds {', '.join(map(str, sorted({r.get('seed', 0) for r in runs})))}); "
              f"`python experiments/time_to_accuracy/run.py{' --quick' if args.quick else ''}"
              f"{' --compare' if args.compare else ''}{' --only ' + ' '.join(args.only) if args.only else ''}`, "
              f"{time.time() - started:.0f} s{' (the other plans: their runs.json entries, kept)' if args.only else ''}")
    median = write_table(compare(runs, entry), HERE / "results" / "time_to_accuracy", header)
    return 0 if median is not None and median <= MEDIAN_TOL else 1


if __name__ == "__main__":
    sys.exit(main())
