"""`hetsim import sailor`: turn a plan that Sailor's authors ran on real GPUs into the cluster, profile
and plan files that `hetsim simulate` takes, so its measurement can be checked against a prediction."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from hetsim.cli.arguments import check_output_dir, existing_dir, existing_file
from hetsim.cli.torch_side import torch_side
from hetsim.errors import HetsimError
from hetsim.fields import dump_yaml

__all__ = ["add_arguments", "run", "write_import"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    s = sub.add_parser("sailor", help="a Sailor (SOSP'25) plan_config_*.json with its measured time and memory",
                       description="Write cluster.yaml, profile.yaml, plan.json (and measured.json) for one "
                       "Sailor plan; then: hetsim simulate --cluster OUT/cluster.yaml --profile "
                       "OUT/profile.yaml --plan OUT/plan.json")
    s.add_argument("plan", metavar="PLAN.json", type=existing_file, help="Sailor plan file")
    s.add_argument("--data", required=True, metavar="DIR", type=existing_dir,
                   help="folder with profiles_tmp.json and network/ (e.g. experiments/peers/sailor/data)")
    s.add_argument("--training-config", required=True, metavar="FILE", type=existing_file,
                   help="Sailor training_config_*.json")
    s.add_argument("--out", required=True, metavar="OUTDIR", help="folder to write the files to")
    s.add_argument("--derived", action="store_true",
                   help="no measured layer times: derive them from GPU datasheets (hetsim.derive)")
    s.add_argument("--precision", default="tf32", choices=("fp32", "tf32", "fp16", "bf16"),
                   help="training precision of the run (default %(default)s: Sailor's 'FP32' runs kept FP32 "
                        "tensors and ran matrix products in TF32, see experiments/profiles/sailor_layers.md)")


def write_import(plan_path: str | Path, data: str | Path, training_config: str | Path, out: str | Path, *,
                 derived: bool = False, precision: str = "tf32", efficiency: str | Path | None = None
                 ) -> dict[str, Path]:
    """Import one Sailor plan and write its files to `out`; return their paths by role."""
    from hetsim.outputs import staged, write_text
    from hetsim.plan import save_plan
    from hetsim.profile_files import save_profile
    from hetsim.sailor import import_run
    if not derived and precision not in ("fp32", "tf32"):
        # Memory and link bytes would follow the precision while the measured times stay FP32's.
        raise HetsimError(f"--precision {precision}: Sailor's measured layer times are of FP32 runs (TF32 matrix "
                          f"products); add --derived to plan the run at {precision}")
    imported = import_run(plan_path, data, training_config, measured_times=not derived)
    cluster, profile, run = imported.cluster, imported.profile, imported.run
    if derived:
        derived_times = torch_side("sailor_derived_times")    # counts the zoo's decoder: needs torch
        profile = derived_times(profile, imported.shape, cluster, precision, {g.tp for g in run.groups},
                                efficiency)
    plan = replace(imported.plan, precision=precision)
    out = Path(out)
    check_output_dir(out, "--out")
    names = {"cluster": "cluster.yaml", "profile": "profile.yaml", "plan": "plan.json", "measured": "measured.json"}
    with staged(out) as stage:                     # the four files together, or none
        write_text(stage / names["cluster"], dump_yaml(cluster, sort_keys=False, width=120))
        save_profile(profile, stage / names["profile"])
        save_plan(plan, stage / names["plan"])
        write_text(stage / names["measured"], json.dumps({"plan": run.name, "iteration_s": run.measured_iter_s,
                                                          "max_memory_bytes": run.measured_mem_bytes,
                                                          "grad_reduce_s": run.measured_grad_reduce_s},
                                                         indent=1) + "\n")
    return {role: out / name for role, name in names.items()}


def run(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")          # before the import's work, not after it
    paths = write_import(args.plan, args.data, args.training_config, args.out, derived=args.derived,
                         precision=args.precision)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    if args.derived and args.precision == "bf16":
        from hetsim.cluster import load_cluster
        from hetsim.derive import bf16_note
        note = bf16_note(list(load_cluster(paths["cluster"]).gpu_types.values()), args.precision)
        if note:
            print(f"hetsim import sailor: warning: {note}", file=sys.stderr)
    print("predict it: " + shlex.join(["hetsim", "simulate", "--cluster", str(paths["cluster"]), "--profile",
                                       str(paths["profile"]), "--plan", str(paths["plan"]), "--waves", "3",
                                       "--warmup-waves", "1", "--jitter", "0"]))
    return 0
