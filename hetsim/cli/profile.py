"""`hetsim profile`: measure a model zoo model's layers on this device, derive times for GPU types.

    hetsim profile --model vgg19 --batch 32 --device cpu --derive-for titan-v,rtx-2060 --out vgg19.yaml
    hetsim profile --model resnet152 --batch 32 --no-measure --derive-for all --out resnet152_b32.yaml
    hetsim profile --model gpt2-medium --batch 4 --no-measure --derive-for a100,v100 --precision tf32 --out g.yaml
    hetsim profile --model opt-350m --batch 1 --no-measure --derive-for gh200 --tp 2,4 --out opt.yaml

Writes hetsim's YAML/JSON format, or PipeDream's graph.txt when --out ends in .txt (one device
type's times: --graph-gpu). Measured and derived times are both for training at --precision
(hetsim.derive says which math each precision implies; modelzoo.profiler measures in that math),
derived transformer blocks with attention counted as --attention says (modelzoo.attention), and with
--tp, derived times for one rank of each tensor-parallel degree (hetsim.derive.with_tp_times). This
module holds the command's arguments and checks them; measuring needs torch and lives with the model
zoo (modelzoo.profile_command), found by name in hetsim.cli.torch_side's table: torch loads only when
this command runs.
"""

from __future__ import annotations

import argparse
import difflib
import re

from hetsim.cli.arguments import check_output_file, int_list, whole
from hetsim.cli.assignments import model_kwargs
from hetsim.cli.torch_side import torch_side
from hetsim.errors import HetsimError, SpecError
from hetsim.plan import PRECISIONS

__all__ = ["add_arguments", "run"]

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
    p.add_argument("--cluster", default=None, metavar="FILE",
                   help="a cluster file whose own gpu_types --derive-for may name too (and 'all' includes)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="training precision to measure at and derive for: fp32 (CUDA cores, TF32 off), tf32, "
                        "fp16 or bf16 (the model in 16 bit on tensor cores); default %(default)s")
    p.add_argument("--attention", default="fused", choices=("fused", "materialized"),
                   help="how derived times count attention: fused (one flash / memory-efficient kernel, as "
                        "PyTorch runs the zoo's transformers on a GPU) or materialized (the s x s scores through "
                        "memory, as Megatron-LM's core attention); default %(default)s")
    p.add_argument("--tp", default="1", metavar="T,...",
                   help="tensor-parallel degrees to derive times for besides single GPUs: one rank's share of "
                   "each layer, at least the GPU type's TP host floor where it has one (default 1: single GPUs "
                   "only; needs --derive-for)")
    p.add_argument("--repeats", type=whole(1), default=5, help="timed passes per layer (default 5; median)")
    p.add_argument("--warmup", type=whole(0), default=2, help="untimed passes first (default 2)")
    p.add_argument("--threads", type=whole(1), default=None, help="torch threads while measuring (default: torch's)")
    p.add_argument("--image-size", type=whole(1, MAX_IMAGE_SIZE), default=None,
                   help="input side for image models (default theirs)")
    p.add_argument("--model-arg", action="append", default=[], metavar="NAME=INT",
                   help="model constructor argument, e.g. seq_len=4096 or n_layer=4 (repeatable)")
    p.add_argument("--out", required=True, metavar="FILE", help="profile .yaml/.json, or PipeDream graph .txt")
    p.add_argument("--graph-txt", default=None, metavar="FILE", help="also write PipeDream's graph.txt here")
    p.add_argument("--graph-gpu", default=None, metavar="TYPE",
                   help="whose times go into graph.txt (default: the measured device, else the first derived)")
    p.add_argument("--no-progress", "--quiet", "-q", dest="no_progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Check the arguments here, then measure and derive with modelzoo.profile_command.run."""
    from hetsim.gpu import load_gpu_types
    gpus = load_gpu_types()
    if args.cluster:
        from hetsim.cluster import load_cluster
        from hetsim.data import resolve
        gpus |= load_cluster(resolve("cluster", args.cluster)).gpu_types
    derive_for = _gpu_names(args.derive_for, gpus)
    if args.no_measure and not derive_for:
        raise SpecError("--no-measure needs --derive-for: otherwise the profile would have no times")
    args.tp_degrees = int_list(args.tp, "--tp", 1)
    if args.tp_degrees != (1,) and not derive_for:
        raise SpecError(f"--tp {args.tp}: needs --derive-for (tensor-parallel times are derived, not measured)")
    if args.tp_degrees != (1,) and args.out.endswith(".txt"):
        raise SpecError(f"--tp {args.tp}: a graph.txt --out holds one type's single-GPU times; write .yaml or .json")
    _check_device(args.device)
    _check_graph_gpu(args, derive_for)
    args.model_kwargs = model_kwargs(args.model_arg, "seq_len=4096")
    check_output_file(args.out, "--out", (".yaml", ".yml", ".json", ".txt"))
    if args.graph_txt:
        check_output_file(args.graph_txt, "--graph-txt", (".txt",))
    return torch_side("profile")(args, [gpus[n] for n in derive_for])


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
            hint = (f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(gpus))}"
                    " (a type a cluster file defines needs --cluster FILE)")
            raise SpecError(f"--derive-for: unknown GPU type {n!r}{hint}")
    return names

