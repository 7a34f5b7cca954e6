"""The executor's optimiser work per minibatch, measured on this host, so a profile can carry it.

hetsim's simulator runs UPDATE and STEP in no time; the executor spends real CPU on them (SGD with
momentum touches every weight two or three times, WSP records the change, flush schedules add each
minibatch's gradients). `optimizer_seconds` times that work with the executor's own StageModel over
the whole model and spreads it over the layers by parameter count (the work is elementwise). It is
timed in thread CPU seconds, the unit of work the simulator shares among a node's cores.
"""

from __future__ import annotations

import statistics
import time

import torch

import modelzoo
from executor.stage import StageModel
from hetsim.plan import ASYNC_SCHEDULES

__all__ = ["optimizer_seconds"]


def optimizer_seconds(model: str, *, schedule: str, nm: int, wsp: bool, repeats: int = 9,
                      model_kwargs: dict | None = None) -> list[float]:
    """Seconds per minibatch of optimiser work on each layer (asynchronous: one update per minibatch;
    flush: one gradient accumulation per minibatch plus 1/nm of a step). Setting `track_deltas`
    under WSP includes the recording of each update's weight change."""
    torch.manual_seed(0)
    net, _ = modelzoo.build(model, batch=1, **(model_kwargs or {}))
    graph = modelzoo.layer_graph(net)
    numel = [sum(p.numel() for p in graph.layers[i].parameters()) for i in range(len(graph))]
    stage = StageModel(graph, 0, len(graph), is_last=True, lr=0.01, momentum=0.9)
    stage.track_deltas = wsp
    grads = [torch.randn_like(w) for w in stage.weights]
    samples = []
    for k in range(repeats + 1):
        t0 = time.thread_time()              # CPU seconds: preemption by other load is not work
        if schedule in ASYNC_SCHEDULES:
            stage.grads[k] = grads
            stage.update(k)
        else:
            for _ in range(nm):
                stage.grads[k] = grads
                stage.accumulate(k)
            stage.step()
        if k:                                   # the first call allocates momentum buffers
            samples.append((time.thread_time() - t0) / (1 if schedule in ASYNC_SCHEDULES else nm))
    total, per = sum(numel), statistics.median(samples)
    return [per * n / total if total else 0.0 for n in numel]
