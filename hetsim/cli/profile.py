"""`hetsim profile`: measure a model zoo model's layers on this device, derive times for GPU types.

    hetsim profile --model vgg19 --batch 32 --device cpu --derive-for titan-v,rtx-2060 --out vgg19.yaml
    hetsim profile --model resnet152 --batch 32 --no-measure --derive-for all --out resnet152_b32.yaml

Writes hetsim's YAML/JSON format, or PipeDream's graph.txt when --out ends in .txt (one device
type's times: --graph-gpu). torch is imported only when this subcommand runs.
"""

from __future__ import annotations

import argparse
import difflib

from hetsim.errors import HetsimError, SpecError

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a model zoo name, e.g. vgg19, resnet152, gpt2-small")
    p.add_argument("--batch", type=int, default=32, help="minibatch size (default 32)")
    p.add_argument("--device", default="cpu", help="where to measure: cpu or cuda[:N] (default cpu)")
    p.add_argument("--device-type", default=None, metavar="NAME",
                   help="key for the measured times (default: cpu, or the CUDA GPU's name)")
    p.add_argument("--no-measure", action="store_true",
                   help="measure nothing: count FLOPs/bytes on the meta device and only derive times")
    p.add_argument("--derive-for", default="", metavar="TYPES",
                   help="comma-separated GPU types (gpu_profiles/gpus) to derive roofline times for, or 'all'")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per layer (default 5; median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes first (default 2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads while measuring (default: torch's)")
    p.add_argument("--image-size", type=int, default=None, help="input side for image models (default theirs)")
    p.add_argument("--out", required=True, metavar="FILE", help="profile .yaml/.json, or PipeDream graph .txt")
    p.add_argument("--graph-txt", default=None, metavar="FILE", help="also write PipeDream's graph.txt here")
    p.add_argument("--graph-gpu", default=None, metavar="TYPE",
                   help="whose times go into graph.txt (default: the measured device, else the first derived)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from hetsim.gpu import load_gpu_types
    gpus = load_gpu_types()
    derive_for = _gpu_names(args.derive_for, gpus)
    if args.no_measure and not derive_for:
        raise SpecError("--no-measure needs --derive-for: otherwise the profile would have no times")
    import torch                                    # lazily: hetsim itself never needs torch
    from modelzoo import MODELS
    if args.model not in MODELS:
        close = difflib.get_close_matches(args.model, MODELS, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"known: {', '.join(sorted(MODELS))}"
        raise SpecError(f"--model: unknown model {args.model!r}; {hint}")
    if args.batch < 1:
        raise SpecError(f"--batch: must be at least 1, got {args.batch}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise HetsimError(f"--device {args.device}: CUDA is not available here (torch {torch.__version__}); "
                          "use --device cpu, or --no-measure with --derive-for")
    profile = _profile(args, derive_for, gpus)
    _write(profile, args, derive_for)
    return 0


def _gpu_names(text: str, gpus: dict) -> list[str]:
    if not text:
        return []
    if text == "all":
        return sorted(gpus)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in gpus:
            close = difflib.get_close_matches(n, gpus, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; shipped: {', '.join(sorted(gpus))}"
            raise SpecError(f"--derive-for: unknown GPU type {n!r}{hint}")
    return names


def _profile(args, derive_for: list[str], gpus: dict):
    from hetsim.derive import derive_profile, load_efficiencies
    from modelzoo.counting import counted_profile
    from modelzoo.profiler import measure_profile
    kwargs = {"image_size": args.image_size} if args.image_size else {}
    skeleton, costs = counted_profile(args.model, args.batch, **kwargs)
    base = skeleton
    if not args.no_measure:
        base = measure_profile(args.model, args.batch, device=args.device, device_type=_device_type(args),
                               repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                               progress=not args.no_progress, **kwargs)
    if not derive_for:
        return base
    chosen = [gpus[n] for n in derive_for]
    return derive_profile(base, costs, chosen, load_efficiencies({g.name: g for g in chosen}))


def _device_type(args) -> str:
    if args.device_type:
        return args.device_type
    if args.device.startswith("cuda"):
        import torch
        return torch.cuda.get_device_name(args.device).lower().replace("nvidia ", "").replace(" ", "-")
    return "cpu"


def _write(profile, args, derive_for: list[str]) -> None:
    from pathlib import Path

    from hetsim.pipedream_graph import write_graph
    from hetsim.profile import save_profile
    graph_gpu = args.graph_gpu or (_device_type(args) if not args.no_measure else derive_for[0])
    out = Path(args.out)
    if out.suffix == ".txt":
        write_graph(profile, out, gpu_type=graph_gpu)
    else:
        save_profile(profile, out)
    if args.graph_txt:
        write_graph(profile, args.graph_txt, gpu_type=graph_gpu)
    types = ", ".join(sorted(profile.gpu_types))
    print(f"wrote {out}: {profile.model} at batch {profile.batch_size}, {profile.n_layers} layers, "
          f"times for {types}" + (f"; graph.txt: {args.graph_txt}" if args.graph_txt else ""))
