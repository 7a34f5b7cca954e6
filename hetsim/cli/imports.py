"""`hetsim import sailor`: turn a plan that Sailor's authors ran on real GPUs into the cluster, profile
and plan files that `hetsim simulate` takes, so its measurement can be checked against a prediction."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import yaml

from hetsim.cli.arguments import check_output_dir, existing_dir, existing_file

__all__ = ["add_arguments", "run", "write_import", "derived_times"]


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
                 derived: bool = False, precision: str = "tf32") -> dict[str, Path]:
    """Import one Sailor plan and write its files to `out`; return their paths by role."""
    from hetsim.profile import save_profile
    from hetsim.sailor import import_run
    imported = import_run(plan_path, data, training_config, measured_times=not derived)
    cluster, profile, run = imported.cluster, imported.profile, imported.run
    if derived:
        profile = derived_times(profile, imported.shape, cluster, precision, {g.tp for g in run.groups})
    plan = replace(imported.plan, precision=precision)
    out = Path(out)
    check_output_dir(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    paths = {"cluster": out / "cluster.yaml", "profile": out / "profile.yaml", "plan": out / "plan.json",
             "measured": out / "measured.json"}
    paths["cluster"].write_text(yaml.safe_dump(cluster, sort_keys=False, width=120))
    save_profile(profile, paths["profile"])
    paths["plan"].write_text(plan.to_json())
    paths["measured"].write_text(json.dumps({"plan": run.name, "iteration_s": run.measured_iter_s,
                                             "max_memory_bytes": run.measured_mem_bytes,
                                             "grad_reduce_s": run.measured_grad_reduce_s}, indent=1) + "\n")
    return paths


def derived_times(profile, shape, cluster: dict, precision: str, tp_degrees: set[int] = frozenset({1})):
    """Layer times for the cluster's GPU types from datasheet peaks (no measurement used): the model
    zoo's decoder at the training config's shape is counted on the meta device (torch needed), each
    block split by kernel class, and timed by hetsim.derive at `precision`. For each tensor-parallel
    degree t > 1, times keyed TYPE@tpt: each rank does 1/t of the matrix products, attention and
    pointwise work (Megatron splits heads and the MLP width) but whole norms and the whole per-layer
    fixed cost; the all-reduces are left to the simulator."""
    from hetsim.cli.profile import split_by_kernel_class
    from hetsim.profile import tp_key
    from hetsim.derive import LayerCost, derive_profile, load_efficiencies
    from hetsim.gpu import load_gpu_types
    from modelzoo.counting import count_model
    model, kwargs = _zoo_model(shape)
    counted = count_model(model, batch=profile.batch_size, **kwargs)
    split = split_by_kernel_class(model, profile.batch_size, counted, **kwargs)
    tail = split[1 + shape.n_layer:]
    if shape.tail_layers == 1:          # the zoo's final norm and head are one layer in the config
        tail = [LayerCost(kind="Head", **{f: sum(getattr(c, f) for c in tail)
                                          for f in ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd")})]
    gpus = load_gpu_types()
    chosen = [gpus[n] for n in sorted({g["type"] for n in cluster["nodes"] for g in n["gpus"]})]
    costs, effs = [*split[:1 + shape.n_layer], *tail], load_efficiencies(gpus)
    out = derive_profile(profile, costs, chosen, effs, precision=precision)
    for t in sorted(tp_degrees - {1}):
        shard = derive_profile(profile, [_tp_share(c, t) for c in costs], chosen, effs, precision=precision)
        layers = [replace(l, fwd_s={**l.fwd_s, **{tp_key(g.name, t): d.fwd_s[g.name] for g in chosen}},
                          bwd_s={**l.bwd_s, **{tp_key(g.name, t): d.bwd_s[g.name] for g in chosen}})
                  for l, d in zip(out.layers, shard.layers)]
        out = replace(out, layers=tuple(layers))
    return replace(out, tp_times_include_allreduce=False)


def _tp_share(cost, t: int):
    """One TP rank's share of a layer's work: norms whole, everything else 1/t."""
    from hetsim.derive import kernel_class
    def part(c):
        if kernel_class(c.kind) == "norm":
            return c
        return replace(c, flops_fwd=c.flops_fwd / t, flops_bwd=c.flops_bwd / t, bytes_fwd=c.bytes_fwd / t,
                       bytes_bwd=c.bytes_bwd / t)
    if not cost.parts:
        return part(cost)
    parts = tuple(part(c) for c in cost.parts)
    return replace(cost, parts=parts, **{f: sum(getattr(c, f) for c in parts)
                                         for f in ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd")})


def _zoo_model(shape) -> tuple[str, dict]:
    """The zoo constructor and overrides that build a decoder of this shape."""
    common = {"n_layer": shape.n_layer, "d_model": shape.hidden, "n_head": shape.heads,
              "seq_len": shape.seq_len, "vocab_size": shape.vocab}
    if shape.gated_mlp:
        return "llama-3-8b", {**common, "n_kv_head": shape.kv, "d_ff": shape.ffn_width}
    return "gpt2-small", common


def run(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")          # before the import's work, not after it
    paths = write_import(args.plan, args.data, args.training_config, args.out, derived=args.derived,
                         precision=args.precision)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    print(f"predict it: hetsim simulate --cluster {paths['cluster']} --profile {paths['profile']} "
          f"--plan {paths['plan']} --waves 3 --warmup-waves 1")
    return 0
