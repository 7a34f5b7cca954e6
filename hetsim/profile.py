"""Model profiles: per layer, forward/backward seconds on each GPU type, parameter and activation bytes.

Layers are listed in a topological order of the layer DAG; a pipeline stage is a contiguous range
[lo, hi) of that order. Times are keyed by GPU type; a key "TYPE@tpN" holds times measured on a
tensor-parallel group of N GPUs of that type, which a TP stage of degree N uses: its all-reduces
are inside them, unless the profile says `tp_times_include_allreduce: false` (derived times), and
then simulated on the node's links (`tp_allreduce_bytes` forward, `tp_allreduce_bwd_bytes` backward).
Without such a key, a TP stage takes the type's own time / N and its all-reduces are simulated. This
module holds the profile and reads hetsim's document form (`profile_from_dict`); hetsim.profile_files
loads and saves files of either format (hetsim's YAML/JSON, or PipeDream's graph.txt through
hetsim.pipedream_graph).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Iterable

import numpy as np

from hetsim.errors import PlanError
from hetsim.fields import Fields, is_whole
from hetsim.plan import PRECISIONS

__all__ = ["LayerProfile", "ModelProfile", "StageTimes", "profile_from_dict", "tp_key", "tp_divides", "precision_note",
           "tp_note", "tp_split_note", "update_note"]


def tp_key(gpu_type: str, tp: int) -> str:
    """The time key of a GPU type in a tensor-parallel group of `tp` (the type itself at tp 1)."""
    return gpu_type if tp == 1 else f"{gpu_type}@tp{tp}"


@dataclass(frozen=True)
class StageTimes:
    """A stage's seconds per minibatch on one replica; `measured_tp` when its TP all-reduces are
    inside the times (measured on a TP group) rather than left to the simulator. With activation
    recomputation the backward runs the forward again first: `bwd_s` includes it, `recompute_s`."""

    fwd_s: float
    bwd_s: float
    update_s: float
    measured_tp: bool
    recompute_s: float = 0.0

    def recomputed(self) -> "StageTimes":
        return replace(self, bwd_s=self.bwd_s + self.fwd_s, recompute_s=self.fwd_s)


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """One layer. Times and activation bytes are for a whole minibatch of the profile's batch size."""

    name: str
    kind: str
    param_bytes: int
    output_bytes: int
    fwd_s: dict[str, float] = field(hash=False)
    bwd_s: dict[str, float] = field(hash=False)
    flops_fwd: float | None = None
    # Optimizer step seconds for this layer's weights (once per step, not per minibatch), by time key.
    update_s: dict[str, float] = field(default_factory=dict, hash=False)
    # Bytes autograd keeps for backward per minibatch (None: unknown, fall back to output bytes), and
    # the part of them that every member of a tensor-parallel group keeps whole (norm inputs, masks).
    saved_bytes: int | None = None
    saved_replicated_bytes: int = 0
    # Of saved_bytes, what the layer before it saves too (a ReLU output the next convolution keeps as
    # its input): a stage holding both layers keeps it once.
    saved_shared_bytes: int = 0
    # Of saved_bytes, what an earlier layer than the one before saves too, as (that layer's index, bytes),
    # the nearest earlier layer that saves it (a branch's input that each branch's first convolution
    # keeps): a stage holding both keeps it once.
    saved_shared_earlier: tuple[tuple[int, int], ...] = ()
    # Of saved_bytes, integer and boolean tensors (max-pool indices, dropout masks) that a tensor-parallel
    # member keeps whole: their size is the same at every precision.
    saved_nonfloat_bytes: int = 0
    # Bytes each forward all-reduces inside a tensor-parallel group, and in how many calls (0: one,
    # where there are bytes): each call pays the link's fixed collective cost. The backward's own
    # (Megatron: a lookup all-reduces only forward, a head only backward) where they differ; None: the
    # same as the forward's.
    tp_allreduce_bytes: int = 0
    tp_allreduce_calls: int = 0
    tp_allreduce_bwd_bytes: int | None = None
    tp_allreduce_bwd_calls: int | None = None

    def __post_init__(self) -> None:
        # One form for a backward like the forward, so that a profile equals itself saved and loaded.
        if self.tp_allreduce_bwd_bytes is None:
            object.__setattr__(self, "tp_allreduce_bwd_calls", None)
        elif (self.tp_bwd_bytes, self.tp_bwd_calls) == (self.tp_allreduce_bytes, self.tp_calls):
            object.__setattr__(self, "tp_allreduce_bwd_bytes", None)
            object.__setattr__(self, "tp_allreduce_bwd_calls", None)
        elif self.tp_allreduce_bwd_calls is None:
            object.__setattr__(self, "tp_allreduce_bwd_calls", 0)

    @property
    def tp_calls(self) -> int:
        """All-reduce calls a forward of this layer makes in a tensor-parallel group."""
        return self.tp_allreduce_calls or (1 if self.tp_allreduce_bytes else 0)

    @property
    def tp_bwd_bytes(self) -> int:
        """Bytes a backward of this layer all-reduces in a tensor-parallel group."""
        return self.tp_allreduce_bytes if self.tp_allreduce_bwd_bytes is None else self.tp_allreduce_bwd_bytes

    @property
    def tp_bwd_calls(self) -> int:
        """All-reduce calls a backward of this layer makes in a tensor-parallel group."""
        if self.tp_allreduce_bwd_bytes is None:
            return self.tp_calls
        return self.tp_allreduce_bwd_calls or (1 if self.tp_allreduce_bwd_bytes else 0)


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    model: str
    batch_size: int
    layers: tuple[LayerProfile, ...]
    edges: tuple[tuple[int, int], ...]
    input_bytes: int
    source: str = ""
    flop_convention: str = "FLOPs count a multiply-add as 2 (torch.utils.flop_counter)"
    tokens_per_sample: int | None = None     # sequence models: tokens in one sample (reports tokens/s)
    tp_times_include_allreduce: bool = True  # False: the simulator adds the TP all-reduces to @tp times
    # Transformers: a tensor-parallel degree must divide this (the attention heads and key/value heads a
    # block splits whole among its members, as Megatron-LM requires); None: any degree.
    tp_divisor: int | None = None
    # The training precision its times were measured or derived at (hetsim.plan.PRECISIONS); None: not said.
    precision: str | None = None

    @cached_property
    def time_keys(self) -> frozenset[str]:
        keys = set(self.layers[0].fwd_s)
        for layer in self.layers[1:]:
            keys &= set(layer.fwd_s)
        return frozenset(keys)

    def time_key(self, gpu_type: str, tp: int) -> tuple[str, int]:
        """The times a stage of `tp` GPUs of `gpu_type` takes, and what it divides them by: the profile's
        TYPE@tpT times as they are, else the single-GPU times divided by `tp`."""
        key = tp_key(gpu_type, tp)
        return (key, 1) if key in self.time_keys else (gpu_type, tp)

    @property
    def gpu_types(self) -> set[str]:
        return {k.split("@")[0] for k in self.time_keys}

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def param_bytes(self) -> int:
        return int(sum(l.param_bytes for l in self.layers))

    def require_gpu_type(self, gpu_type: str) -> None:
        if gpu_type not in self.gpu_types:
            raise PlanError(f"profile {self.model}: no layer times for GPU type {gpu_type!r} "
                            f"(it has: {', '.join(sorted(self.gpu_types))}); derive them with "
                            f"`hetsim profile --derive-for {gpu_type}`, with --cluster FILE where a cluster file "
                            "defines the type")

    def _prefix(self, values) -> np.ndarray:
        return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))

    @cached_property
    def _time_prefix(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return {t: (self._prefix([l.fwd_s[t] for l in self.layers]),
                    self._prefix([l.bwd_s[t] for l in self.layers]),
                    self._prefix([l.update_s.get(t, 0.0) for l in self.layers])) for t in self.time_keys}

    @cached_property
    def _tp_prefix(self) -> dict[bool, tuple[np.ndarray, np.ndarray]]:
        """(bytes, calls) prefix sums of the forward's (False) and the backward's (True) all-reduces."""
        return {False: (self._prefix([l.tp_allreduce_bytes for l in self.layers]),
                        self._prefix([l.tp_calls for l in self.layers])),
                True: (self._prefix([l.tp_bwd_bytes for l in self.layers]),
                       self._prefix([l.tp_bwd_calls for l in self.layers]))}

    @cached_property
    def _param_prefix(self) -> np.ndarray:
        return self._prefix([l.param_bytes for l in self.layers])

    @cached_property
    def _act_prefix(self) -> np.ndarray:
        return self._prefix([l.output_bytes for l in self.layers])

    def stage_times(self, gpu_type: str, lo: int, hi: int) -> tuple[float, float]:
        """(forward, backward) seconds of layers [lo, hi) on one GPU type."""
        t = self.stage_times_tp(gpu_type, lo, hi, 1)
        return t.fwd_s, t.bwd_s

    def stage_times_tp(self, gpu_type: str, lo: int, hi: int, tp: int, recompute: bool = False) -> StageTimes:
        """Seconds of layers [lo, hi) on one replica: a GPU, or a tensor-parallel group of `tp`;
        with `recompute`, each backward runs the forward again first (full activation recomputation)."""
        times = self._stage_times(gpu_type, lo, hi, tp)
        return times.recomputed() if recompute else times

    def _stage_times(self, gpu_type: str, lo: int, hi: int, tp: int) -> StageTimes:
        self.require_gpu_type(gpu_type)
        key, divide = self.time_key(gpu_type, tp)
        if key not in self._time_prefix:
            measured = sorted(k for k in self.time_keys if k.split("@")[0] == gpu_type)
            raise PlanError(f"profile {self.model}: no times for {gpu_type} at tensor-parallel degree {tp} "
                            f"(it has {', '.join(measured)}) and no single-GPU times to divide")
        fwd, bwd, upd = self._time_prefix[key]
        return StageTimes(float(fwd[hi] - fwd[lo]) / divide, float(bwd[hi] - bwd[lo]) / divide,
                          float(upd[hi] - upd[lo]) / divide,
                          measured_tp=divide == 1 and tp > 1 and self.tp_times_include_allreduce)

    def stage_tp_allreduce_bytes(self, lo: int, hi: int, backward: bool = False, recompute: bool = False) -> int:
        """Bytes a forward (or backward) of layers [lo, hi) all-reduces in a tensor-parallel group; a
        backward with `recompute` makes the forward's all-reduces again too."""
        nbytes = self._tp_prefix[backward][0]
        again = self.stage_tp_allreduce_bytes(lo, hi) if backward and recompute else 0
        return int(nbytes[hi] - nbytes[lo]) + again

    def stage_tp_allreduce_calls(self, lo: int, hi: int, backward: bool = False, recompute: bool = False) -> int:
        """All-reduce calls of a forward (or backward, with `recompute` the forward's again too) of
        layers [lo, hi) in a tensor-parallel group."""
        calls = self._tp_prefix[backward][1]
        again = self.stage_tp_allreduce_calls(lo, hi) if backward and recompute else 0
        return int(calls[hi] - calls[lo]) + again

    def stage_param_bytes(self, lo: int, hi: int) -> int:
        return int(self._param_prefix[hi] - self._param_prefix[lo])

    def stage_output_bytes_sum(self, lo: int, hi: int) -> int:
        """Bytes of every layer output in [lo, hi): what a stage keeps per in-flight minibatch."""
        return int(self._act_prefix[hi] - self._act_prefix[lo])

    def cut_bytes(self, cut: int) -> int:
        """Activation bytes crossing the boundary before layer `cut` (0 = the model's input)."""
        if cut <= 0:
            return self.input_bytes
        if cut >= self.n_layers:
            return 0
        return self._cut_bytes[cut]

    @cached_property
    def _cut_bytes(self) -> list[int]:
        # A layer's output crosses every cut between it and its last consumer.
        last_use = list(range(self.n_layers))
        for src, dst in self.edges:
            last_use[src] = max(last_use[src], dst)
        delta = [0] * (self.n_layers + 1)
        for i, layer in enumerate(self.layers):
            if last_use[i] > i:
                delta[i + 1] += layer.output_bytes
                delta[last_use[i] + 1] -= layer.output_bytes
        out, running = [], 0
        for d in delta:
            running += d
            out.append(running)
        return out

    def scaled_to_batch(self, batch_size: int) -> "ModelProfile":
        """Times and activations scaled linearly to another batch size (an approximation). Refused for a
        profile with times at tensor-parallel degrees: a TP rank's pass has a host floor and all-reduces
        that do not scale with the batch."""
        if batch_size == self.batch_size:
            return self
        tp_keys = sorted(k for k in self.time_keys if "@" in k)
        if tp_keys:
            raise PlanError(f"profile {self.model}: times at tensor-parallel degrees ({', '.join(tp_keys)}) do not "
                            f"scale from minibatch {self.batch_size} to {batch_size} (a TP rank's host floor and "
                            f"all-reduces do not); derive or measure the profile at minibatch {batch_size}")
        r = batch_size / self.batch_size
        scale = lambda b: int(round(b * r))
        layers = tuple(replace(l, output_bytes=scale(l.output_bytes),
                               fwd_s={k: v * r for k, v in l.fwd_s.items()},
                               bwd_s={k: v * r for k, v in l.bwd_s.items()},
                               flops_fwd=None if l.flops_fwd is None else l.flops_fwd * r,
                               saved_bytes=None if l.saved_bytes is None else scale(l.saved_bytes),
                               saved_replicated_bytes=scale(l.saved_replicated_bytes),
                               saved_shared_bytes=scale(l.saved_shared_bytes),
                               saved_shared_earlier=tuple((j, scale(b)) for j, b in l.saved_shared_earlier),
                               saved_nonfloat_bytes=scale(l.saved_nonfloat_bytes),
                               tp_allreduce_bytes=scale(l.tp_allreduce_bytes),
                               tp_allreduce_bwd_bytes=None if l.tp_allreduce_bwd_bytes is None
                               else scale(l.tp_allreduce_bwd_bytes))
                       for l in self.layers)
        return replace(self, batch_size=batch_size, layers=layers,
                       input_bytes=int(round(self.input_bytes * r)),
                       source=f"{self.source} (scaled linearly from batch {self.batch_size})")

    def to_dict(self) -> dict[str, Any]:
        layers = []
        for l in self.layers:
            item = {"name": l.name, "kind": l.kind, "param_bytes": l.param_bytes,
                    "output_bytes": l.output_bytes, "fwd_s": dict(sorted(l.fwd_s.items())),
                    "bwd_s": dict(sorted(l.bwd_s.items()))}
            if l.flops_fwd is not None:
                item["flops_fwd"] = l.flops_fwd
            if l.update_s:
                item["update_s"] = dict(sorted(l.update_s.items()))
            if l.saved_bytes is not None:
                item["saved_bytes"] = l.saved_bytes
            if l.saved_replicated_bytes:
                item["saved_replicated_bytes"] = l.saved_replicated_bytes
            if l.saved_shared_bytes:
                item["saved_shared_bytes"] = l.saved_shared_bytes
            if l.saved_shared_earlier:
                item["saved_shared_earlier"] = [[j, b] for j, b in l.saved_shared_earlier]
            if l.saved_nonfloat_bytes:
                item["saved_nonfloat_bytes"] = l.saved_nonfloat_bytes
            if l.tp_allreduce_bytes:
                item["tp_allreduce_bytes"] = l.tp_allreduce_bytes
            if l.tp_allreduce_calls:
                item["tp_allreduce_calls"] = l.tp_allreduce_calls
            if l.tp_allreduce_bwd_bytes is not None:
                item["tp_allreduce_bwd_bytes"] = l.tp_allreduce_bwd_bytes
                if l.tp_allreduce_bwd_calls:
                    item["tp_allreduce_bwd_calls"] = l.tp_allreduce_bwd_calls
            layers.append(item)
        chain = all(self.edges[i] == (i, i + 1) for i in range(len(self.edges))) and \
            len(self.edges) == self.n_layers - 1
        doc = {"model": self.model, "batch_size": self.batch_size, "source": self.source,
               "flop_convention": self.flop_convention, "input_bytes": self.input_bytes,
               "layers": layers}
        if not chain:
            doc["edges"] = [list(e) for e in self.edges]
        if self.tokens_per_sample is not None:
            doc["tokens_per_sample"] = self.tokens_per_sample
        if not self.tp_times_include_allreduce:
            doc["tp_times_include_allreduce"] = False
        if self.tp_divisor is not None:
            doc["tp_divisor"] = self.tp_divisor
        if self.precision is not None:
            doc["precision"] = self.precision
        return doc


def first_apart(n: int, edges: Iterable[tuple[int, int]]) -> int | None:
    """The first of layers 0..n-1 that no chain of edges (either way) joins to layer 0, or None."""
    group = list(range(n))

    def root(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i
    for src, dst in edges:
        group[root(src)] = root(dst)
    return next((i for i in range(1, n) if root(i) != root(0)), None)


def profile_from_dict(data: Any, source_name: str) -> ModelProfile:
    f = Fields(data, source_name)
    f.reject_unknown({"model", "batch_size", "source", "flop_convention", "input_bytes", "layers", "edges",
                      "tokens_per_sample", "tp_times_include_allreduce", "tp_divisor", "precision"})
    layers = tuple(_layer(l) for l in f.records("layers"))
    n = len(layers)
    raw_edges = f.list("edges", [[i, i + 1] for i in range(n - 1)])
    edges = []
    for i, e in enumerate(raw_edges):
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, int) for x in e)):
            raise f.error(f"edges[{i}]", f"expected [src, dst] layer indices, got {e!r}")
        src, dst = e
        if not 0 <= src < dst < n:
            raise f.error(f"edges[{i}]", f"[{src}, {dst}] must satisfy 0 <= src < dst < {n} "
                          "(layers are listed in topological order)")
        edges.append((src, dst))
    apart = first_apart(n, edges)
    if apart is not None:
        raise f.error("edges", f"layer {apart} is joined to layer 0 by no edge; a model's layers form one graph "
                               "(leave edges out for a chain)")
    for i, layer in enumerate(layers):
        for k, (j, _) in enumerate(layer.saved_shared_earlier):
            if not j < i - 1:
                raise f.error(f"layers[{i}].saved_shared_earlier[{k}]", f"layer {j} is not earlier than the "
                              f"layer before layer {i} (sharing with that one is saved_shared_bytes)")
    types = {k for layer in layers for k in (*layer.fwd_s, *layer.bwd_s)}
    for i, layer in enumerate(layers):
        for key in ("fwd_s", "bwd_s"):
            missing = types - set(getattr(layer, key))
            if missing:
                raise f.error(f"layers[{i}].{key}", f"missing {', '.join(sorted(missing))}: every layer needs "
                              f"forward and backward times for every GPU type the profile names "
                              f"({', '.join(sorted(types))})")
    return ModelProfile(model=f.text("model"), batch_size=f.number("batch_size", positive=True, integer=True),
                        layers=layers, edges=tuple(edges), source=f.text("source", ""),
                        flop_convention=f.text("flop_convention", ModelProfile.flop_convention),
                        input_bytes=f.number("input_bytes", nonnegative=True, integer=True),
                        tokens_per_sample=f.number("tokens_per_sample", None, positive=True, integer=True),
                        tp_times_include_allreduce=f.flag("tp_times_include_allreduce", True),
                        tp_divisor=f.number("tp_divisor", None, positive=True, integer=True),
                        precision=f.text("precision", None, choices=PRECISIONS))



def _layer(f: Fields) -> LayerProfile:
    f.reject_unknown({"name", "kind", "param_bytes", "output_bytes", "fwd_s", "bwd_s", "flops_fwd",
                      "update_s", "saved_bytes", "saved_replicated_bytes", "saved_shared_bytes",
                      "saved_shared_earlier", "saved_nonfloat_bytes",
                      "tp_allreduce_bytes", "tp_allreduce_calls", "tp_allreduce_bwd_bytes",
                      "tp_allreduce_bwd_calls"})
    times = {}
    for key in ("fwd_s", "bwd_s", "update_s"):
        sub = f.sub(key) if key != "update_s" or f.has(key) else Fields({}, f.source)
        if not sub.data and key != "update_s":
            raise f.error(key, "must list seconds for at least one GPU type")
        times[key] = {str(t): sub.number(t, nonnegative=True) for t in sub.data}
    if f.number("tp_allreduce_calls", 0, nonnegative=True, integer=True) and \
            not f.number("tp_allreduce_bytes", 0, nonnegative=True, integer=True):
        raise f.error("tp_allreduce_calls", "calls of no bytes: give tp_allreduce_bytes, or leave the calls out")
    bwd_bytes = f.number("tp_allreduce_bwd_bytes", None, nonnegative=True, integer=True)
    bwd_calls = f.number("tp_allreduce_bwd_calls", 0, nonnegative=True, integer=True)
    if bwd_calls and not bwd_bytes:
        raise f.error("tp_allreduce_bwd_calls", "calls of no bytes: give tp_allreduce_bwd_bytes, or leave the "
                                                "calls out")
    return LayerProfile(name=f.text("name"), kind=f.text("kind", ""),
                        param_bytes=f.number("param_bytes", nonnegative=True, integer=True),
                        output_bytes=f.number("output_bytes", nonnegative=True, integer=True),
                        fwd_s=times["fwd_s"], bwd_s=times["bwd_s"], update_s=times["update_s"],
                        flops_fwd=f.number("flops_fwd", None, nonnegative=True),
                        saved_bytes=f.number("saved_bytes", None, nonnegative=True, integer=True),
                        saved_replicated_bytes=f.number("saved_replicated_bytes", 0, nonnegative=True,
                                                        integer=True),
                        saved_shared_bytes=f.number("saved_shared_bytes", 0, nonnegative=True, integer=True),
                        saved_shared_earlier=_shared_earlier(f),
                        saved_nonfloat_bytes=f.number("saved_nonfloat_bytes", 0, nonnegative=True, integer=True),
                        tp_allreduce_bytes=f.number("tp_allreduce_bytes", 0, nonnegative=True, integer=True),
                        tp_allreduce_calls=f.number("tp_allreduce_calls", 0, nonnegative=True, integer=True),
                        tp_allreduce_bwd_bytes=bwd_bytes, tp_allreduce_bwd_calls=bwd_calls)


def _shared_earlier(f: Fields) -> tuple[tuple[int, int], ...]:
    pairs = f.list("saved_shared_earlier", [])
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(is_whole(x) and x >= 0 for x in pair)):
            raise f.error(f"saved_shared_earlier[{k}]", f"expected [layer index, bytes], two whole numbers >= 0, "
                                                        f"got {pair!r}")
    return tuple((int(j), int(b)) for j, b in pairs)


def tp_divides(profile: ModelProfile, tp: int) -> bool:
    """Whether `tp` GPUs can split every layer of `profile` (see ModelProfile.tp_divisor)."""
    return profile.tp_divisor is None or profile.tp_divisor % tp == 0


def precision_note(profile: ModelProfile, precision: str) -> str | None:
    """A note where `profile`'s times were taken at another precision than the plan trains at (the
    times stay as profiled; memory and link bytes follow the plan's precision); None otherwise."""
    if profile.precision is None or profile.precision == precision:
        return None
    return (f"precision: the profile's times are at {profile.precision}, the plan trains at {precision}: times "
            f"as profiled, memory and transfers at {precision} (derive or measure the profile at {precision})")


def tp_note(profile: ModelProfile, groups) -> str | None:
    """A note naming the (GPU type, tensor-parallel degree) pairs of `groups` that `profile` has no times
    for, so that their stages take the type's single-GPU times divided by the degree: no host floor and
    no whole norms, which rates a small micro-batch's high degrees too fast; None where none is missing.
    Only shipped GPU types of a transformer profile (one with a `tp_divisor`), which `hetsim profile --tp`
    can derive: a measured host (the CPU validation's `cpu`) is modelled so on purpose."""
    from hetsim.gpu import shipped_type_names
    if profile.tp_divisor is None:
        return None                     # no split to derive times for: tp_split_note says so
    degrees: dict[str, set[int]] = {}
    for g, t in groups:
        if g in profile.time_keys and profile.time_key(g, t)[1] > 1 and g in shipped_type_names():
            degrees.setdefault(g, set()).add(t)
    if not degrees:
        return None
    by_degrees: dict[tuple[int, ...], list[str]] = {}
    for g in sorted(degrees):
        by_degrees.setdefault(tuple(sorted(degrees[g])), []).append(g)
    named = "; ".join(f"{', '.join(gs)} at TP {', '.join(map(str, ts))}" for ts, gs in sorted(by_degrees.items()))
    return (f"tensor parallelism: the profile has no times for {named}; those stages take single-GPU times "
            "divided by the degree, without the host floor that slows a rank's small share (derive them with "
            "`hetsim profile --derive-for TYPE --tp T`)")


def tp_split_note(profile: ModelProfile, degrees) -> str | None:
    """A note where tensor-parallel degrees above 1 meet a profile that records no tensor-parallel split
    (no `tp_divisor`: not a transformer counted by hetsim, e.g. a CNN): its layers are divided by the
    degree with only the all-reduces it counts, which makes a convolution's split free; None otherwise."""
    if profile.tp_divisor is not None or not any(t > 1 for t in degrees):
        return None
    return (f"tensor parallelism: profile {profile.model} records no tensor-parallel split (tp_divisor), so a TP "
            "stage divides its layers' times by the degree and adds only the all-reduces the profile counts; "
            "hetsim's split (and its executor's) is Megatron's, of transformer blocks")


def update_note(profile: ModelProfile, groups) -> str | None:
    """A note naming the GPU types of `groups` ((type, TP degree) pairs) whose times in `profile` carry no
    optimizer step (`update_s`: derived and analytic profiles have none), so that every step is charged
    nothing, which flatters schedules that step each minibatch; None where each has one."""
    free = set()
    for g, t in groups:
        key, _ = profile.time_key(g, t)
        if key in profile.time_keys and not any(l.update_s.get(key, 0.0) > 0 for l in profile.layers):
            free.add(g)
    if not free:
        return None
    return (f"optimizer step: the profile gives {', '.join(sorted(free))} no update_s, so each step is charged no "
            "time (measured profiles and Sailor imports carry it; derived and analytic ones do not)")
