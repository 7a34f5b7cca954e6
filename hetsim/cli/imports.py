"""`hetsim import sailor`: turn a plan that Sailor's authors ran on real GPUs into the cluster, profile
and plan files that `hetsim simulate` takes, so its measurement can be checked against a prediction."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from hetsim.errors import HetsimError

__all__ = ["add_arguments", "run", "write_import", "derived_times"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    s = sub.add_parser("sailor", help="a Sailor (SOSP'25) plan_config_*.json with its measured time and memory",
                       description="Write cluster.yaml, profile.yaml, plan.json (and measured.json) for one "
                       "Sailor plan; then: hetsim simulate --cluster OUT/cluster.yaml --profile "
                       "OUT/profile.yaml --plan OUT/plan.json")
    s.add_argument("plan", metavar="PLAN.json", help="Sailor plan file")
    s.add_argument("--data", required=True, metavar="DIR",
                   help="folder with profiles_tmp.json and network/ (e.g. experiments/peers/sailor/data)")
    s.add_argument("--training-config", required=True, metavar="FILE", help="Sailor training_config_*.json")
    s.add_argument("--out", required=True, metavar="OUTDIR", help="folder to write the files to")
    s.add_argument("--derived", action="store_true",
                   help="no measured layer times: derive them from GPU datasheets (hetsim.derive)")
    s.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16", "bf16"),
                   help="training precision of the run (Sailor's runs: fp32; default %(default)s)")


def write_import(plan_path: str | Path, data: str | Path, training_config: str | Path, out: str | Path, *,
                 derived: bool = False, precision: str = "fp32") -> dict[str, Path]:
    """Import one Sailor plan and write its files to `out`; return their paths by role."""
    from dataclasses import replace

    from hetsim.profile import save_profile
    from hetsim.sailor import import_run
    imported = import_run(plan_path, data, training_config, measured_times=not derived)
    cluster, profile, run = imported.cluster, imported.profile, imported.run
    if derived:
        profile = derived_times(profile, imported.shape, cluster, precision)
    plan = replace(imported.plan, precision=precision)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HetsimError(f"--out {out}: cannot create it ({exc.strerror})") from None
    paths = {"cluster": out / "cluster.yaml", "profile": out / "profile.yaml", "plan": out / "plan.json",
             "measured": out / "measured.json"}
    paths["cluster"].write_text(yaml.safe_dump(cluster, sort_keys=False, width=120))
    save_profile(profile, paths["profile"])
    paths["plan"].write_text(plan.to_json())
    paths["measured"].write_text(json.dumps({"plan": run.name, "iteration_s": run.measured_iter_s,
                                             "max_memory_bytes": run.measured_mem_bytes,
                                             "grad_reduce_s": run.measured_grad_reduce_s}, indent=1) + "\n")
    return paths


def derived_times(profile, shape, cluster: dict, precision: str):
    """Layer times for the cluster's GPU types from datasheet peaks (no measurement used)."""
    from hetsim.derive import derive_profile, load_efficiencies
    from hetsim.gpu import load_gpu_types
    from hetsim.transformer import transformer_costs
    gpus = load_gpu_types()
    names = sorted({g["type"] for n in cluster["nodes"] for g in n["gpus"]})
    return derive_profile(profile, transformer_costs(shape, profile.batch_size), [gpus[n] for n in names],
                          load_efficiencies(gpus))


def run(args: argparse.Namespace) -> int:
    paths = write_import(args.plan, args.data, args.training_config, args.out, derived=args.derived,
                         precision=args.precision)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    print(f"predict it: hetsim simulate --cluster {paths['cluster']} --profile {paths['profile']} "
          f"--plan {paths['plan']} --waves 3 --warmup-waves 1")
    return 0
