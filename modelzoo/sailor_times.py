"""Layer times for a decoder imported from Sailor (hetsim.sailor), derived from GPU datasheets:
`hetsim import sailor --derived` calls `derived_times` by name (hetsim.cli.torch_side)."""

from __future__ import annotations

from dataclasses import replace

from hetsim.derive import LayerCost, derive_profile, load_efficiencies, with_tp_times
from hetsim.gpu import load_gpu_types
from modelzoo.counting import count_model
from modelzoo.kernel_classes import split_by_kernel_class

__all__ = ["derived_times"]


ATTENTION = "materialized"         # as the kernel-class factors were fitted (see derived_times)


def derived_times(profile, shape, cluster: dict, precision: str, tp_degrees: set[int] = frozenset({1}),
                  efficiency=None):
    """Layer times for the cluster's GPU types from datasheet peaks (no measurement used): the model
    zoo's decoder at the training config's shape is counted on the meta device (torch needed), each
    block split by kernel class, and timed by hetsim.derive at `precision`. For each tensor-parallel
    degree t > 1, times keyed TYPE@tpt: each rank does 1/t of the matrix products, attention and
    pointwise work (Megatron splits heads and the MLP width) but whole norms and the whole per-layer
    fixed cost, and each pass at least the type's TP floor; the all-reduces are left to the simulator.
    Attention is counted materialized (modelzoo.attention), as the kernel-class factors were fitted to
    these runs (Megatron-LM's default; the runs' block times fit fused counting as well once refitted).
    `efficiency`: another efficiency.yaml than gpu_profiles' (a check with other factors)."""
    model, kwargs = _zoo_model(shape)
    counted = count_model(model, batch=profile.batch_size, attention=ATTENTION, **kwargs)
    split = split_by_kernel_class(model, profile.batch_size, counted, attention=ATTENTION, **kwargs)
    tail = split[1 + shape.n_layer:]
    if shape.tail_layers == 1:          # the zoo's final norm and head are one layer in the config
        tail = [LayerCost(kind="Head", **{f: sum(getattr(c, f) for c in tail)
                                          for f in ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd")})]
    gpus = load_gpu_types()
    chosen = [gpus[n] for n in sorted({g["type"] for n in cluster["nodes"] for g in n["gpus"]})]
    costs, effs = [*split[:1 + shape.n_layer], *tail], load_efficiencies(gpus, efficiency)
    out = derive_profile(profile, costs, chosen, effs, precision=precision)
    return replace(with_tp_times(out, costs, chosen, effs, tp_degrees, precision=precision),
                   tp_times_include_allreduce=False)


def _zoo_model(shape) -> tuple[str, dict]:
    """The zoo constructor and overrides that build a decoder of this shape."""
    common = {"n_layer": shape.n_layer, "d_model": shape.hidden, "n_head": shape.heads,
              "seq_len": shape.seq_len, "vocab_size": shape.vocab}
    if shape.gated_mlp:
        return "llama-3-8b", {**common, "n_kv_head": shape.kv, "d_ff": shape.ffn_width}
    return "gpt2-small", common
