"""Measured layer profiles: forward and backward seconds of every layer of a LayerGraph on this device.

    from modelzoo.profiler import measure_profile
    profile = measure_profile("resnet50", batch=8, device="cpu", threads=2)   # hetsim.profile.ModelProfile

Method. Each pass runs one forward of every layer in layer order (training mode, autograd recording),
then one backward of every layer in reverse order, timing each layer's call on its own:
- every layer's input is its predecessors' outputs *detached* into leaves that require gradients
  (as at a pipeline stage boundary), so `torch.autograd.backward(output, grad)` of one layer computes
  exactly that layer's input and weight gradients and stops; the output gradient is ones (its values
  do not change the cost). The model's own input needs no gradient, as in training.
- parameter gradients are None before the backward (as `zero_grad()` leaves them), so a backward
  writes them rather than adding.
- running the layers in order, each once per pass, keeps caches and the allocator as in a real
  training step (timing one layer many times in a row flatters small layers by ~25% on CPU).
- given the model's task (modelzoo.tasks, as measure_profile does), a language model's profile
  gives its tokens per sample, and with `loss` (the default) the last layer's forward includes the
  loss against random labels and its backward starts from it, as in the executor's last stage: for a
  language model that is a softmax over the vocabulary at every position.
- `precision` (hetsim.plan.PRECISIONS) sets the math as hetsim.derive models it: fp32 turns TF32 off
  for matrix products and convolutions, tf32 turns it on (restored after), and fp16/bf16 run the whole
  model in that dtype (`model.to(dtype)`: weights, activations, norms, softmax and loss in 16 bit; the
  FP32 master weights live in the optimizer, which is not a layer time). None (the default) leaves
  PyTorch's switches as they are, so that `hetsim validate` times what the executor's ranks run.
  Byte counts stay at FP32 (4 per floating element) whatever the precision, as profiles hold them.
`warmup` untimed passes, then the median (or min) of `repeats` passes per layer. CPU calls are timed with
time.perf_counter; CUDA calls with a pair of CUDA events each, read after one synchronisation at
the end of the pass. Layer i of the profile is layer i of `layer_graph(model)`, with the same edges.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from hetsim.plan import PRECISIONS
from hetsim.profile import LayerProfile, ModelProfile
from modelzoo import MODEL_INPUT, LayerGraph, build, layer_graph
from modelzoo.allocator import steady_allocator
from modelzoo.graph import fp32_nbytes
from modelzoo.tasks import Task, task_of
from modelzoo.tasks import loss as task_loss

__all__ = ["measure_profile", "measure_graph_profile", "whole_model_forward_s", "math_mode"]


def measure_profile(model: str, batch: int, *, device: str = "cpu", device_type: str = "cpu",
                    repeats: int = 5, warmup: int = 2, threads: int | None = None,
                    progress: bool = False, statistic: str = "median", loss: bool = True,
                    precision: str | None = None, **model_kwargs) -> ModelProfile:
    """Measure a modelzoo model (see module docstring) at `precision`; times are keyed by `device_type`.
    With `loss` the last layer's times include the model's loss (modelzoo.tasks), as in training."""
    _check_precision(precision)
    module, example = build(model, batch=batch, device=device, **model_kwargs)
    task = task_of(module, example)
    if precision in _HALF:
        module.to(_HALF[precision])
        example = example.to(_HALF[precision]) if example.is_floating_point() else example
    graph = layer_graph(module)
    return measure_graph_profile(graph, example, model=model, device_type=device_type, repeats=repeats,
                                 warmup=warmup, threads=threads, progress=progress, statistic=statistic,
                                 task=task, loss=loss, precision=precision)


def measure_graph_profile(graph: LayerGraph, example: torch.Tensor, *, model: str = "model",
                          device_type: str = "cpu", repeats: int = 5, warmup: int = 2,
                          threads: int | None = None, progress: bool = False,
                          statistic: str = "median", task: Task | None = None,
                          loss: bool = True, precision: str | None = None) -> ModelProfile:
    """Measure every layer of `graph` fed with `example` (a whole minibatch) on example's device.
    `statistic` "min" instead of "median" estimates the uncontended time on a shared machine. Given
    the model's `task`, the last layer's forward and backward include its loss (unless `loss` is
    False) and a language model's profile says its tokens per sample. At fp16/bf16 the graph and
    example must already be in that dtype (measure_profile casts them)."""
    _check_precision(precision)
    wrong = {p.dtype for p in graph.layers.parameters() if p.is_floating_point()} - {_DTYPE[precision or "fp32"]}
    if precision is not None and wrong:
        raise ValueError(f"precision {precision}: the graph's weights are {', '.join(map(str, wrong))}, "
                         f"not {_DTYPE[precision]}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(_STATISTICS)}, got {statistic!r}")
    pick = _STATISTICS[statistic]
    labels = None
    if task is not None and loss:
        labels = task.random_batch(int(example.shape[0]), torch.Generator().manual_seed(0))[1].to(example.device)
    steady_allocator()                    # time the steady state a training process reaches
    with _threads(threads), math_mode(precision):
        graph.layers.train()
        fwd, bwd, outputs = _passes(graph, example, labels, repeats, warmup,
                                    f"profiling {model}" if progress else None)
        source = (f"measured by modelzoo.profiler on {_device_name(example.device)} "
                  f"(torch {torch.__version__}, {f'{precision}, ' if precision else ''}{torch.get_num_threads()} threads, "
                  f"{statistic} of {repeats} passes after {warmup} warm-up"
                  f"{f', {task.kind} loss in the last layer' if labels is not None else ''})")
    layers = tuple(LayerProfile(name=graph.names[i], kind=graph.kinds[i], param_bytes=graph.param_bytes(i),
                                output_bytes=_nbytes(outputs[i]), fwd_s={device_type: pick(fwd[i])},
                                bwd_s={device_type: pick(bwd[i])}) for i in range(len(graph)))
    return ModelProfile(model=model, batch_size=int(example.shape[0]), layers=layers,
                        edges=tuple(graph.edges), input_bytes=_nbytes(example), source=source,
                        tokens_per_sample=task.tokens_per_sample if task is not None else None,
                        precision=precision)


_STATISTICS = {"median": statistics.median, "min": min}
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, **_HALF}


def _check_precision(precision: str | None) -> None:
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


@contextmanager
def math_mode(precision: str | None) -> Iterator[None]:
    """TF32 for matrix products and convolutions on (tf32) or off (any other precision) while measuring,
    then as before; None changes nothing. Torch 2.9 on has a new switch that refuses to be mixed with
    the old one once set, so the new one is used where it exists."""
    if precision is None:
        yield
        return
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        switches = [(matmul, "fp32_precision"), (conv, "fp32_precision")]
        value = "tf32" if precision == "tf32" else "ieee"
    else:
        switches, value = [(matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")], precision == "tf32"
    previous = [getattr(owner, name) for owner, name in switches]
    for owner, name in switches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name), old in zip(switches, previous):
            setattr(owner, name, old)


def _passes(graph: LayerGraph, example: torch.Tensor, labels: torch.Tensor | None, repeats: int, warmup: int,
            desc: str | None):
    """Per-layer forward and backward samples of `repeats` passes after `warmup`, and the outputs."""
    n = len(graph)
    fwd: list[list[float]] = [[] for _ in range(n)]
    bwd: list[list[float]] = [[] for _ in range(n)]
    bar = None
    if desc:
        from tqdm import tqdm               # counts layers; advanced between passes, never inside timing
        bar = tqdm(total=n * (warmup + repeats), desc=desc, unit="layer")
    for k in range(warmup + repeats):
        f, b, outputs = _one_pass(graph, example, labels)
        if k >= warmup:
            for i in range(n):
                fwd[i].append(f[i])
                bwd[i].append(b[i])
        if bar is not None:
            bar.update(n)
    if bar is not None:
        bar.close()
    return fwd, bwd, outputs


def _one_pass(graph: LayerGraph, example: torch.Tensor, labels: torch.Tensor | None
              ) -> tuple[list[float], list[float], list]:
    """One forward over the layers in order, then one backward in reverse order, each layer timed
    alone; every layer's input is a detached leaf, so a backward stops at its own layer. With
    `labels` the last layer's forward computes the loss too, and its backward starts there."""
    clock = _Clock(example.device)
    n = len(graph)
    leaves: dict[int, torch.Tensor] = {MODEL_INPUT: example}
    outputs: list = [None] * n
    roots: list = [None] * n          # what each layer's backward starts from
    for i in range(n):
        inputs = [leaves[p] for p in graph.preds[i]]
        if i == n - 1 and labels is not None:
            outputs[i], roots[i] = clock.time(i, lambda: _scored(graph.layers[i](*inputs), labels))
        else:
            outputs[i] = roots[i] = clock.time(i, lambda: graph.layers[i](*inputs))
        out = outputs[i].detach()
        leaves[i] = out.requires_grad_(True) if out.is_floating_point() else out
    fwd = clock.seconds(n)
    for p in graph.layers.parameters():
        p.grad = None                 # as zero_grad() leaves them: the backward writes, not adds
    clock = _Clock(example.device)
    for i in reversed(range(n)):
        root = roots[i]
        if isinstance(root, torch.Tensor) and root.requires_grad:
            grad = torch.ones_like(root)
            clock.time(i, lambda: torch.autograd.backward(root, grad))
    return fwd, clock.seconds(n), outputs


def _scored(output: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return output, task_loss(output, labels)


class _Clock:
    """Per-layer timings: perf_counter on CPU; on CUDA, event pairs read after one final sync, so
    timing adds no synchronisation between layers."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[int, tuple] = {}

    def time(self, i: int, fn: Callable[[], object]):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            self.marks[i] = (start, end)
            return result
        t0 = time.perf_counter()
        result = fn()
        self.marks[i] = (t0, time.perf_counter())
        return result

    def seconds(self, n: int) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [self.marks[i][0].elapsed_time(self.marks[i][1]) / 1000.0 if i in self.marks else 0.0
                    for i in range(n)]
        return [self.marks[i][1] - self.marks[i][0] if i in self.marks else 0.0 for i in range(n)]


def whole_model_forward_s(graph: LayerGraph, example: torch.Tensor, *, repeats: int = 5, warmup: int = 2,
                          threads: int | None = None, statistic: str = "median") -> float:
    """Median (or min) seconds of one forward of the whole graph (training mode, autograd recording),
    timed as one call: what the per-layer forward times should add up to."""
    samples = []
    steady_allocator()
    with _threads(threads):
        graph.layers.train()
        for k in range(warmup + repeats):
            clock = _Clock(example.device)
            clock.time(0, lambda: graph.run(0, len(graph), {MODEL_INPUT: example}))
            if k >= warmup:
                samples.append(clock.seconds(1)[0])
    return _STATISTICS[statistic](samples)


def _nbytes(x) -> int:
    """fp32_nbytes of a tensor, or of the tensors of a (nested) list or tuple."""
    if isinstance(x, torch.Tensor):
        return fp32_nbytes(x)
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.backends.cpu.get_cpu_capability()})"


@contextmanager
def _threads(threads: int | None) -> Iterator[None]:
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
