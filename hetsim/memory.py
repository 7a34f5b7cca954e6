"""What a stage keeps in GPU memory: weights, gradients, optimizer state, stashed weight versions, what
autograd saves for the backward pass of every minibatch in flight (PipeDream weight stashing; HetPipe's
Nm; 1F1B stage s of S holds S - s), and the framework's own reserve on that GPU type.

Bytes per parameter by precision and optimizer (profiles count parameters in FP32, 4 bytes each):

| precision | weights | gradients | master copy | optimizer state            |
|-----------|---------|-----------|-------------|----------------------------|
| fp32/tf32 | 4       | 4         | -           | sgd 0, momentum 4, adam 8  |
| fp16/bf16 | 2       | 4 (FP32 main grads, as Megatron keeps them) | 4 | same, in FP32 |

Activations: a profile layer's `saved_bytes` (what autograd keeps, counted at FP32) when known, less what
an earlier layer of the stage keeps too (`saved_shared_bytes`: the layer before; `saved_shared_earlier`:
one further back, as where a DAG's branches each save their common input), else its output bytes plus
the stage's input (the older upper bound). Under tensor parallelism of degree t a member
keeps the layer's `saved_replicated_bytes` whole and 1/t of the rest. 16-bit precisions halve the
floating-point ones; `saved_nonfloat_bytes` (max-pool indices, dropout masks kept whole) keep their
size. A mask that TP splits (attention dropout's) is halved with the rest, an approximation.
With activation recomputation a stage keeps only each layer's input per minibatch in flight, plus one
layer's full saved set while that layer's backward recomputes it. A split backward (zero bubble) also
keeps, for each minibatch between its input gradient (I) and its weight gradient (W), the gradient of
every weighted layer's output, which W multiplies with that layer's saved input; but the model's last
layer, whose W starts from the loss (as the executor's does), keeps none, so the logits' gradient is
not held. (The executor also keeps each weighted layer's output from F to W, which the count takes as
saved by the layer after it: true of a linear or convolution before a norm, not before a ReLU.)
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.plan import activation_scale
from hetsim.profile import ModelProfile
from hetsim.units import GIB

__all__ = ["StageMemory", "MemorySettings", "stage_memory", "unreserved_note", "GIB"]


_HALF = ("fp16", "bf16")
_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True, kw_only=True)
class MemorySettings:
    """How training is set up, as far as memory goes (a Plan's optimizer, precision, recompute)."""

    optimizer: str | None = None          # None: `optimizer_state_copies` FP32 copies (older plans)
    optimizer_state_copies: int = 1
    precision: str = "fp32"
    recompute: bool = False

    @classmethod
    def of(cls, plan) -> "MemorySettings":
        return cls(optimizer=plan.optimizer, optimizer_state_copies=plan.optimizer_state_copies,
                   precision=plan.precision, recompute=plan.recompute)

    @property
    def activation_scale(self) -> float:
        """As `Plan.activation_scale`: activations move at the precision's element size."""
        return activation_scale(self.precision)


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    weights_bytes: int
    gradient_bytes: int
    optimizer_bytes: int                  # optimizer state, and the FP32 master weights if mixed precision
    stash_bytes: int
    activation_bytes: int
    versions: int                         # weight versions held (1 + stashed)
    in_flight: int
    deferred: int = 0                     # split backward: minibatches between I and W (in activation_bytes)
    reserve_bytes: int = 0                # the GPU type's framework_reserve (CUDA context, workspaces)
    tp: int = 1

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradient_bytes + self.optimizer_bytes + self.stash_bytes
                + self.activation_bytes + self.reserve_bytes)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.2f}"
        parts = [f"weights {g(self.weights_bytes)}", f"gradients {g(self.gradient_bytes)}"]
        if self.optimizer_bytes:
            parts.append(f"optimizer {g(self.optimizer_bytes)}")
        if self.stash_bytes:
            parts.append(f"{self.versions - 1} stashed versions {g(self.stash_bytes)}")
        held = f" (output gradients of {self.deferred} awaiting W among them)" if self.deferred else ""
        parts.append(f"activations of {self.in_flight} minibatches{held} {g(self.activation_bytes)}")
        if self.reserve_bytes:
            parts.append(f"framework reserve {g(self.reserve_bytes)}")
        return " + ".join(parts)


def stage_memory(profile: ModelProfile, lo: int, hi: int, *, in_flight: int, asynchronous: bool,
                 optimizer_state_copies: int = 1, settings: MemorySettings | None = None, tp: int = 1,
                 reserve_bytes: int = 0, deferred: int = 0) -> StageMemory:
    """Peak bytes on one GPU of a stage running layers [lo, hi) with `in_flight` minibatches at once
    (one member of a tensor-parallel group of `tp`), `deferred` of them between a split backward's I
    and W. Asynchronous schedules stash one weight version per in-flight minibatch; flush schedules hold
    one version."""
    settings = settings or MemorySettings(optimizer_state_copies=optimizer_state_copies)
    params = profile.stage_param_bytes(lo, hi) / tp             # FP32 bytes of this member's shard
    half = settings.precision in _HALF
    weights = params / 2 if half else params
    if settings.optimizer is None:
        state = params * settings.optimizer_state_copies
    else:
        state = params * _STATE_COPIES[settings.optimizer]
    if half:
        state += params                                          # FP32 master weights
    versions = max(1, in_flight) if asynchronous else 1
    per_minibatch = _saved_per_minibatch(profile, lo, hi, tp, settings.recompute, half)
    head = profile.n_layers - 1
    output_grads = sum(profile.layers[i].output_bytes for i in range(lo, hi)
                       if profile.layers[i].param_bytes and i != head) / (2 if half else 1)
    activations = (per_minibatch * in_flight + _recompute_peak(profile, lo, hi, tp, settings, in_flight)
                   + output_grads * deferred)
    return StageMemory(weights_bytes=int(weights), gradient_bytes=int(params),
                       optimizer_bytes=int(state), stash_bytes=int(weights * (versions - 1)),
                       activation_bytes=int(activations), versions=versions, in_flight=in_flight,
                       deferred=deferred, reserve_bytes=reserve_bytes, tp=tp)


def _layer_saved(layer, tp: int) -> float:
    replicated = min(layer.saved_replicated_bytes, layer.saved_bytes)
    return replicated + (layer.saved_bytes - replicated) / tp


def _nonfloat(layer) -> int:
    return min(layer.saved_nonfloat_bytes, layer.saved_bytes or 0)


def _saved_per_minibatch(profile: ModelProfile, lo: int, hi: int, tp: int, recompute: bool, half: bool) -> float:
    layers = profile.layers[lo:hi]
    scale = 0.5 if half else 1.0
    if recompute:
        # Only each layer's input stays; the layer's own saved set is rebuilt in its backward.
        return scale * sum(profile.cut_bytes(i) if i == lo else profile.layers[i - 1].output_bytes
                           for i in range(lo, hi))
    if all(l.saved_bytes is not None for l in layers):
        # A tensor that several layers of the stage save is kept once (split like the rest under TP:
        # the counted sharing is of activations, which TP splits).
        shared = (sum(min(l.saved_shared_bytes, l.saved_bytes) for l in layers[1:])
                  + sum(b for l in layers for j, b in l.saved_shared_earlier if j >= lo)) / tp
        kept = max(0.0, float(sum(_layer_saved(l, tp) for l in layers) - shared))
        # At 16 bits the floating-point part halves; the integer and boolean part keeps its size.
        return scale * kept + (scale * sum(_nonfloat(l) for l in layers) if half else 0.0)
    return scale * (profile.stage_output_bytes_sum(lo, hi) + profile.cut_bytes(lo))


def _recompute_peak(profile: ModelProfile, lo: int, hi: int, tp: int, settings: MemorySettings,
                    in_flight: int) -> float:
    if not settings.recompute or in_flight == 0:
        return 0.0
    layers = profile.layers[lo:hi]
    half = settings.precision in _HALF
    full = [(_layer_saved(l, tp) + (_nonfloat(l) if half else 0) if l.saved_bytes is not None else l.output_bytes)
            for l in layers]
    return max(full, default=0.0) / (2 if half else 1)


def unreserved_note(cluster, gpus=None) -> str | None:
    """A note naming the GPU types (of `gpus`, default every GPU of `cluster`; not ranks sharing a
    node's cores) whose file gives no framework_reserve_gib, so that a plan near the memory limit
    is not read as one that fits; None where every type has one."""
    wanted = None if gpus is None else set(gpus)
    names = sorted({g.type.name for n in cluster.nodes if not n.shared_cores for g in n.gpus
                    if (wanted is None or g.id in wanted) and not g.type.framework_reserve_bytes})
    if not names:
        return None
    verb = "names" if len(names) == 1 else "name"
    return (f"memory: {', '.join(names)} {verb} no framework_reserve_gib (none measured), so their memory counts "
            "the run's tensors only; a training process also holds its CUDA context and workspaces, a few GiB "
            "where measured (docs/formats.md)")
