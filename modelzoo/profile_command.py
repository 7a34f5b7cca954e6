"""`hetsim profile`'s measuring and deriving (hetsim.cli.profile holds and checks its arguments, then
calls `run` here by name, through hetsim.cli.torch_side)."""

from __future__ import annotations

import argparse
import difflib
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from hetsim.derive import bf16_note, derive_profile, floorless, load_efficiencies, with_tp_times
from hetsim.errors import HetsimError, SpecError
from hetsim.gpu import GpuType
from hetsim.pipedream_graph import write_graph
from hetsim.profile import tp_divides
from hetsim.profile_files import save_profile
from modelzoo import MODELS
from modelzoo.counting import counted_profile, with_counts
from modelzoo.kernel_classes import split_by_kernel_class
from modelzoo.profiler import measure_profile

__all__ = ["run", "derive_times"]


def run(args: argparse.Namespace, derive_for: list[GpuType]) -> int:
    """Measure (unless --no-measure) and derive times for `derive_for`; write --out (and --graph-txt).
    `args` as hetsim.cli.profile.run leaves them: its checks add `model_kwargs` and `tp_degrees`."""
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
    if not args.no_measure and not args.device.startswith("cuda") and args.precision == "tf32":
        # TF32 is a tensor-core format; on a CPU the switch changes nothing, so say what was measured.
        print("hetsim profile: warning: --precision tf32 has no effect on --device cpu; its layers are measured "
              "in FP32", file=sys.stderr)
    profile = _profile(args, derive_for)
    _write(profile, args, [g.name for g in derive_for])
    for note in _notes(args, derive_for):
        print(f"hetsim profile: warning: {note}", file=sys.stderr)
    return 0


def _profile(args, derive_for: list[GpuType]):
    kwargs = {**args.model_kwargs, **({"image_size": args.image_size} if args.image_size else {})}
    try:                                    # on the meta device: shapes only, so only shapes can fail
        with warnings.catch_warnings():     # torch's warnings about odd shapes; the error says it all
            warnings.simplefilter("ignore")
            skeleton, costs = counted_profile(args.model, args.batch, attention=args.attention, **kwargs)
    except (TypeError, ValueError, RuntimeError) as exc:
        given = ([f"--image-size {args.image_size}"] if args.image_size else []) + [
            f"--model-arg {k}={v}" for k, v in args.model_kwargs.items()] + [f"--batch {args.batch}"]
        raise HetsimError(f"--model {args.model}: cannot be built or run with {', '.join(given)} "
                          f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    _check_tp(args, skeleton)
    base = skeleton
    if not args.no_measure:
        measured = measure_profile(args.model, args.batch, device=args.device, device_type=_device_type(args),
                                   repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                                   progress=not args.no_progress, precision=args.precision, **kwargs)
        base = with_counts(measured, skeleton)
    if not derive_for:
        return base
    derived = derive_times(args.model, args.batch, base, costs, derive_for, precision=args.precision,
                           attention=args.attention, tp_degrees=args.tp_degrees, **kwargs)
    key = _measured_type(args)
    return _measured_kept(derived, base, key) if key in {g.name for g in derive_for} else derived


def _measured_kept(derived, measured, key: str):
    """`derived` with the measured device's own times put back: --derive-for naming the measured type
    (as `all` does) adds what measuring cannot (its TP times), never replaces a measurement."""
    layers = tuple(replace(d, fwd_s={**d.fwd_s, key: m.fwd_s[key]}, bwd_s={**d.bwd_s, key: m.bwd_s[key]},
                           update_s={**d.update_s, **({key: m.update_s[key]} if key in m.update_s else {})})
                   for d, m in zip(derived.layers, measured.layers))
    return replace(derived, layers=layers, source=f"{derived.source}; {key}: its measured times kept")


def _check_tp(args, skeleton) -> None:
    """TP degrees the model's layers split into (Megatron-style: transformer blocks), before measuring."""
    degrees = [t for t in args.tp_degrees if t > 1]
    if not degrees:
        return
    if skeleton.tp_divisor is None:
        raise SpecError(f"--tp {args.tp}: {args.model} has no tensor-parallel split (hetsim splits transformer "
                        "blocks' heads and MLP, Megatron-style)")
    unsplit = [t for t in degrees if not tp_divides(skeleton, t)]
    if unsplit:
        raise SpecError(f"--tp {args.tp}: {args.model}'s layers split into tensor-parallel degrees dividing "
                        f"{skeleton.tp_divisor} (its attention heads), not {', '.join(map(str, unsplit))}")


def derive_times(model: str, batch: int, base, costs: list, gpus: list[GpuType], *, precision: str,
                 attention: str, tp_degrees=(1,), **model_kwargs):
    """`base` (counted or measured) with times derived for `gpus` from `costs` (modelzoo.counting's, with
    `attention`), blocks split by kernel class, and for each tensor-parallel degree in `tp_degrees` above 1
    one rank's times: what `hetsim profile --derive-for ... --tp ...` writes."""
    costs = split_by_kernel_class(model, batch, costs, attention=attention, **model_kwargs)
    note = f", attention counted {attention}" if any(c.kind == "Block" for c in costs) else ""
    effs = load_efficiencies({g.name: g for g in gpus})
    derived = derive_profile(base, costs, gpus, effs, precision=precision, note=note)
    return with_tp_times(derived, costs, gpus, effs, tp_degrees, precision=precision)


def _measured_type(args) -> str | None:
    return None if args.no_measure else _device_type(args)


def _notes(args, derive_for: list[GpuType]) -> list[str]:
    notes = [bf16_note(derive_for, args.precision)]
    measured = _measured_type(args)
    if measured in {g.name for g in derive_for} and any(t > 1 for t in args.tp_degrees):
        notes.append(f"{measured}: its single-GPU times are measured and its tensor-parallel ones derived, two "
                     "footings a plan search weighs against each other; derive both (--no-measure) to compare them")
    if any(t > 1 for t in args.tp_degrees):
        missing = floorless(derive_for, load_efficiencies({g.name: g for g in derive_for}))
        if missing:
            notes.append(f"TP host floor: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} none "
                         "fitted (no tensor-parallel measurement), so a rank's small share there is derived without "
                         "one and may be rated fast (gpu_profiles/efficiency.yaml `gpus:`, docs/profiles.md)")
    return [n for n in notes if n]


def _device_type(args) -> str:
    if args.device_type:
        return args.device_type
    if args.device.startswith("cuda"):
        return torch.cuda.get_device_name(args.device).lower().replace("nvidia ", "").replace(" ", "-")
    return "cpu"


def _write(profile, args, derive_for: list[str]) -> None:
    graph_gpu = args.graph_gpu or (_device_type(args) if not args.no_measure else derive_for[0])
    out = Path(args.out)
    if out.suffix == ".txt":
        write_graph(profile, out, gpu_type=graph_gpu)
    else:
        save_profile(profile, out)
    if args.graph_txt:
        write_graph(profile, args.graph_txt, gpu_type=graph_gpu)
    types = ", ".join(sorted(profile.gpu_types))
    degrees = sorted({int(k.partition("@tp")[2]) for k in profile.time_keys if "@tp" in k})
    tp = f" (and one rank's at TP {', '.join(map(str, degrees))})" if degrees else ""
    print(f"wrote {out}: {profile.model} at batch {profile.batch_size}, {profile.n_layers} layers, "
          f"times for {types}{tp}" + (f"; graph.txt: {args.graph_txt}" if args.graph_txt else ""))
