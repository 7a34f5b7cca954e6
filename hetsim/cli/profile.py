"""`hetsim profile`: measure a model zoo model's layers on this device, derive times for GPU types.

    hetsim profile --model vgg19 --batch 32 --device cpu --derive-for titan-v,rtx-2060 --out vgg19.yaml
    hetsim profile --model resnet152 --batch 32 --no-measure --derive-for all --out resnet152_b32.yaml
    hetsim profile --model gpt2-medium --batch 4 --no-measure --derive-for a100,v100 --precision tf32 --out g.yaml

Writes hetsim's YAML/JSON format, or PipeDream's graph.txt when --out ends in .txt (one device
type's times: --graph-gpu). Derived times are for training at --precision (hetsim.derive says which
math each precision implies). torch is imported only when this subcommand runs.
"""

from __future__ import annotations

import argparse
import difflib
import re
import warnings

from hetsim.cli.arguments import check_output_file, whole
from hetsim.errors import HetsimError, SpecError
from hetsim.plan import PRECISIONS

__all__ = ["add_arguments", "run", "split_by_kernel_class"]

# Layer kinds whose derived time is the sum of one roofline per kernel class of their work.
COMPOSITE_KINDS = ("Block",)
# Far beyond any model's training batch or input: larger values are typos (and tensors too big to build).
MAX_BATCH = 1 << 20
MAX_IMAGE_SIZE = 1 << 14


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a model zoo name, e.g. vgg19, resnet152, gpt2-small")
    p.add_argument("--batch", type=whole(1, MAX_BATCH), default=32, help="minibatch size (default 32)")
    p.add_argument("--device", default="cpu", help="where to measure: cpu or cuda[:N] (default cpu)")
    p.add_argument("--device-type", default=None, metavar="NAME",
                   help="key for the measured times (default: cpu, or the CUDA GPU's name)")
    p.add_argument("--no-measure", action="store_true",
                   help="measure nothing: count FLOPs/bytes on the meta device and only derive times")
    p.add_argument("--derive-for", default="", metavar="TYPES",
                   help="comma-separated GPU types (gpu_profiles/gpus) to derive roofline times for, or 'all'")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="training precision the derived times are for: fp32 (CUDA cores, TF32 off), tf32, "
                        "fp16 or bf16 (mixed precision on tensor cores); default %(default)s")
    p.add_argument("--repeats", type=whole(1), default=5, help="timed passes per layer (default 5; median)")
    p.add_argument("--warmup", type=whole(0), default=2, help="untimed passes first (default 2)")
    p.add_argument("--threads", type=whole(1), default=None, help="torch threads while measuring (default: torch's)")
    p.add_argument("--image-size", type=whole(1, MAX_IMAGE_SIZE), default=None,
                   help="input side for image models (default theirs)")
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
    _check_device(args.device)
    _check_graph_gpu(args, derive_for)
    check_output_file(args.out, "--out", (".yaml", ".yml", ".json", ".txt"))
    if args.graph_txt:
        check_output_file(args.graph_txt, "--graph-txt", (".txt",))
    import torch                                    # lazily: hetsim itself never needs torch
    from modelzoo import MODELS
    if args.model not in MODELS:
        close = difflib.get_close_matches(args.model, MODELS, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"known: {', '.join(sorted(MODELS))}"
        raise SpecError(f"--model: unknown model {args.model!r}; {hint}")
    if args.device.startswith("cuda") and not args.no_measure:
        index = int(args.device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise HetsimError(f"--device {args.device}: CUDA is not available here (torch {torch.__version__}, "
                              f"{torch.cuda.device_count()} CUDA devices); use --device cpu, or --no-measure "
                              "with --derive-for")
    profile = _profile(args, derive_for, gpus)
    _write(profile, args, derive_for)
    return 0


def _check_device(device: str) -> None:
    """cpu, cuda or cuda:N, checked before torch is asked (it answers other names with a traceback)."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise HetsimError(f"--device {device}: expected cpu, cuda or cuda:N")


def _check_graph_gpu(args, derive_for: list[str]) -> None:
    """graph.txt holds one device type's times: one this profile will have."""
    if args.graph_gpu is None or not (args.graph_txt or args.out.endswith(".txt")):
        return
    if args.no_measure:
        have = set(derive_for)
    elif args.device_type or args.device == "cpu":
        have = {*derive_for, args.device_type or "cpu"}
    else:
        return                                  # the CUDA GPU's name is known once torch is asked
    if args.graph_gpu not in have:
        raise HetsimError(f"--graph-gpu {args.graph_gpu}: the profile will have times for "
                          f"{', '.join(sorted(have))} only")


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
    try:                                    # on the meta device: shapes only, so only shapes can fail
        with warnings.catch_warnings():     # torch's warnings about odd shapes; the error says it all
            warnings.simplefilter("ignore")
            skeleton, costs = counted_profile(args.model, args.batch, **kwargs)
    except (TypeError, ValueError, RuntimeError) as exc:
        size = f" at --image-size {args.image_size}" if args.image_size else ""
        raise HetsimError(f"--model {args.model}: cannot be built or run{size} with --batch {args.batch} "
                          f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    base = skeleton
    if not args.no_measure:
        base = measure_profile(args.model, args.batch, device=args.device, device_type=_device_type(args),
                               repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                               progress=not args.no_progress, **kwargs)
    if not derive_for:
        return base
    chosen = [gpus[n] for n in derive_for]
    costs = split_by_kernel_class(args.model, args.batch, costs, **kwargs)
    return derive_profile(base, costs, chosen, load_efficiencies({g.name: g for g in chosen}),
                          precision=args.precision)


def split_by_kernel_class(model: str, batch: int, costs: list, **model_kwargs) -> list:
    """`costs` (modelzoo.counting's, same model and batch) with each COMPOSITE_KINDS layer's work split
    by kernel class (hetsim.derive.LayerCost.parts): counted per aten operation on the meta device,
    the way modelzoo.counting counts the layer (detached input, backward from a ones gradient)."""
    if not any(c.kind in COMPOSITE_KINDS for c in costs):
        return costs
    import torch
    from modelzoo import MODEL_INPUT, build, layer_graph
    module, example = build(model, batch=batch, device="meta", **model_kwargs)
    graph = layer_graph(module)
    graph.layers.train()
    outputs, split, out = {MODEL_INPUT: example}, {}, []
    for i, cost in enumerate(costs):
        inputs = [outputs[p] for p in graph.preds[i]]
        if cost.kind in COMPOSITE_KINDS:
            if cost not in split:                   # identical blocks are counted once
                split[cost] = _counted_by_op(graph.layers[i], inputs, cost.kind)
            cost = split[cost]
        with torch.no_grad():
            outputs[i] = graph.layers[i](*inputs)
        out.append(cost)
    return out


def _counted_by_op(layer, inputs: list, kind: str):
    import torch
    from hetsim.derive import cost_from_ops
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    fwd, y = _op_counts(lambda: layer(*leaves))
    grad = torch.ones_like(y)
    bwd, _ = _op_counts(lambda: torch.autograd.backward(y, grad))
    return cost_from_ops(kind, fwd, bwd)


def _op_counts(fn) -> tuple[dict[str, tuple[float, float]], object]:
    """(FLOPs, bytes) per aten operation name while `fn` runs, counted as modelzoo.counting counts."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    class BytesByOp(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if not func.is_view:
                tensors = [t for t in tree_flatten((args, kwargs, result))[0] if isinstance(t, torch.Tensor)]
                name = _op_name(func.overloadpacket)
                self.bytes[name] = self.bytes.get(name, 0) + sum(t.numel() * t.element_size() for t in tensors)
            return result

    flops, moved = FlopCounterMode(display=False), BytesByOp()
    with flops, moved:
        result = fn()
    counted = {_op_name(op): n for op, n in flops.get_flop_counts()["Global"].items()}
    ops = sorted(set(counted) | set(moved.bytes))
    return {op: (float(counted.get(op, 0)), float(moved.bytes.get(op, 0))) for op in ops}, result


def _op_name(packet) -> str:
    return str(packet).rsplit(".", 1)[-1]                 # "aten.addmm" -> "addmm"


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
