"""The executor's optimiser work per minibatch, measured on this host, so a profile can carry it.

hetsim's simulator runs UPDATE and STEP in no time; the executor spends real CPU on them (SGD with
momentum touches every weight two or three times, flush schedules add each minibatch's gradients,
WSP computes each update's change and adds it to its wave's sum). `optimizer_seconds` times that work
with the executor's own StageModel over the whole model and spreads it over the layers by parameter
count (the work is elementwise). It is timed in thread CPU seconds, the unit of work the simulator
shares among a node's cores.
"""

from __future__ import annotations

import statistics
import time

import torch

import modelzoo
from modelzoo.allocator import steady_allocator
from executor.stage import StageModel
from executor.wsp import WspClient
from hetsim.plan import ASYNC_SCHEDULES

__all__ = ["optimizer_seconds", "link_speed"]


def optimizer_seconds(model: str, *, schedule: str, nm: int, wsp: bool, bsp: bool = False, repeats: int = 9,
                      model_kwargs: dict | None = None) -> list[float]:
    """Seconds per minibatch of optimiser work on each layer (asynchronous: one update per minibatch;
    flush: one gradient accumulation per minibatch plus 1/nm of a step). `wsp` includes computing and
    summing each update's weight change; `bsp` accumulates into the flat vector the all-reduce uses."""
    steady_allocator()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # as every rank runs; several threads would spin-wait
    try:
        return _measure(model, schedule, nm, wsp, bsp, repeats, model_kwargs or {})
    finally:
        torch.set_num_threads(threads)


def _measure(model: str, schedule: str, nm: int, wsp: bool, bsp: bool, repeats: int,
             model_kwargs: dict) -> list[float]:
    torch.manual_seed(0)
    net, _ = modelzoo.build(model, batch=1, **model_kwargs)
    graph = modelzoo.layer_graph(net)
    numel = [sum(p.numel() for p in graph.layers[i].parameters()) for i in range(len(graph))]
    stage = StageModel(graph, 0, len(graph), is_last=True, lr=0.01, momentum=0.9)
    stage.track_deltas, stage.flat_grads = wsp, bsp
    client = WspClient(vw=0, stage=0, ps_ranks=[], shard_ranges=[]) if wsp else None
    grads = [torch.randn_like(w) for w in stage.weights]
    samples = []
    for k in range(repeats + 1):
        t0 = time.thread_time()              # CPU seconds: preemption by other load is not work
        if schedule in ASYNC_SCHEDULES:
            stage.grads[k] = grads
            deltas = stage.update(k)
        else:
            for _ in range(nm):
                stage.grads[k] = grads
                stage.accumulate(k)
            deltas = stage.step()
        if client is not None:                  # the runner adds each change to its wave's update
            client.record(0, deltas)
        if k:                                   # the first call allocates momentum buffers
            samples.append((time.thread_time() - t0) / (1 if schedule in ASYNC_SCHEDULES else nm))
    total, per = sum(numel), statistics.median(samples)
    return [per * n / total if total else 0.0 for n in numel]


def _ping(rank: int, path: str, small: int, large: int, nbytes: int, out) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    peer = 1 - rank
    rtts, seconds = [], []
    for size, count, times in ((2, small, rtts), (nbytes // 4, large, seconds)):
        buf = torch.zeros(size)
        for k in range(count + 1):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            if k:                                   # the first exchange sets up the pair
                times.append(time.perf_counter() - t0)
    if rank == 0:
        latency = statistics.fmean(rtts) / 2
        out.put((latency, nbytes / max(statistics.median(seconds) / 2 - latency, 1e-9)))
    dist.destroy_process_group()


def link_speed(small: int = 200, large: int = 10, nbytes: int = 4 << 20) -> tuple[float, float]:
    """(latency_s, bandwidth_Bps) of one gloo message between two processes on this host, measured
    by ping-pong now. The latency includes the wake-up of a process blocked in recv, which on a host
    with more busy processes than cores is the scheduler's delay: what every pipeline hand-off costs."""
    import tempfile

    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_ping, args=(r, f"{tmp}/store", small, large, nbytes, out)) for r in range(2)]
        for p in procs:
            p.start()
        result = out.get(timeout=120)
        for p in procs:
            p.join()
    return result
