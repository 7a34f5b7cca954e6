"""The executor's optimiser work per minibatch, measured on this host, so a profile can carry it.

hetsim's simulator runs UPDATE and STEP in no time; the executor spends real CPU on them (SGD with
momentum touches every weight two or three times, Adam several more, flush schedules add each
minibatch's gradients, WSP computes each update's change and adds it to its wave's sum).
`optimizer_seconds` times that work with the executor's own StageModel over the whole model and
spreads it over the layers by parameter count (the work is elementwise). It is timed in thread CPU
seconds, the unit of work the simulator shares among a node's cores; on CUDA, in wall seconds up to a
synchronisation.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import deque

import torch

import modelzoo
from modelzoo.allocator import steady_allocator
from executor.children import die_with_parent, next_result
from executor.stage import StageModel
from executor.wsp import WspClient
from hetsim.plan import ASYNC_SCHEDULES

__all__ = ["optimizer_seconds", "link_speed", "collective_call", "collective_latency", "handoff_delay",
           "wake_delays", "busy_wait"]


def optimizer_seconds(model: str, *, schedule: str, nm: int, wsp: bool, bsp: bool = False, repeats: int = 9,
                      model_kwargs: dict | None = None, device: str = "cpu",
                      optimizer: str = "momentum") -> list[float]:
    """Seconds per minibatch of `optimizer`'s work on each layer (asynchronous: one update per
    minibatch; flush: one gradient accumulation per minibatch plus 1/nm of a step). `wsp` includes
    computing and summing each update's weight change; `bsp` accumulates into the flat vector the
    all-reduce uses."""
    steady_allocator()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # as every rank runs; several threads would spin-wait
    try:
        return _measure(model, schedule, nm, wsp, bsp, repeats, model_kwargs or {}, device, optimizer)
    finally:
        torch.set_num_threads(threads)


def _measure(model: str, schedule: str, nm: int, wsp: bool, bsp: bool, repeats: int,
             model_kwargs: dict, device: str = "cpu", optimizer: str = "momentum") -> list[float]:
    """Real forwards and backwards of minibatch size 2 (cheap beside the optimiser's pass over every
    weight; the smallest a batch norm over a 1x1 map trains on), so each update gets fresh gradient
    tensors from autograd as in the executor (reusing one set of gradients timed 15% less); under an
    asynchronous schedule with Nm > 1 the next minibatch's forward is in flight at each update, so
    its stash makes the update write new weight tensors, as it does in the executor. Only the
    optimiser's work is timed."""
    from executor.emulation import Emulation
    from executor.placement import staged
    from modelzoo.tasks import task_of

    clock = Emulation(1.0, staged(device)).clock
    torch.manual_seed(0)
    net, example = modelzoo.build(model, batch=1, **model_kwargs)
    graph = modelzoo.layer_graph(net)
    numel = [sum(p.numel() for p in graph.layers[i].parameters()) for i in range(len(graph))]
    example, labels = task_of(net, example).random_batch(2, torch.Generator().manual_seed(0))
    example, labels = example.to(device), labels.to(device)
    stage = StageModel(graph, 0, len(graph), is_last=True, lr=0.01, momentum=0.9, device=device,
                       optimizer=optimizer)
    stage.track_deltas, stage.flat_grads = wsp, bsp
    client = WspClient(vw=0, stage=0, ps_ranks=[], shard_ranges=[], device=device) if wsp else None
    minibatches = itertools.count()

    def forward() -> int:
        k = next(minibatches)
        stage.forward(k, (example,), labels)
        return k

    def timed(change) -> float:
        t0 = clock()                         # CPU seconds: preemption by other load is not work
        deltas = change()
        if client is not None and deltas is not None:    # the runner adds each change to the wave's update
            client.record(0, deltas)
        return clock() - t0

    samples = []
    in_flight = deque(forward() for _ in range(2 if nm > 1 else 1))
    for r in range(repeats + 1):
        if schedule in ASYNC_SCHEDULES:
            k = in_flight.popleft()
            stage.backward(k, None, need_input_grads=False)
            seconds = timed(lambda: stage.update(k))
            in_flight.append(forward())
        else:
            seconds = 0.0
            for _ in range(nm):
                k = forward()
                stage.backward(k, None, need_input_grads=False)
                # The executor adds inside the backward (sum_in_backward); the adds, timed apart here.
                seconds += timed(lambda: stage.accumulate(k))
            seconds = (seconds + timed(stage.step)) / nm
        if r:                                   # the first allocates the optimizer's state
            samples.append(seconds)
    total, per = sum(numel), statistics.median(samples)
    return [per * n / total if total else 0.0 for n in numel]


def _ping(rank: int, path: str, small: int, large: int, nbytes: int, device: str, nccl: bool, out) -> None:
    import torch.distributed as dist
    from executor.placement import CPU, Placement
    die_with_parent()
    steady_allocator()                          # as every executor rank
    torch.set_num_threads(1)
    if device == "cpu":
        placement = CPU
    else:
        gpu = torch.device("cuda", rank if nccl else 0)
        torch.cuda.set_device(gpu)
        placement = Placement(gpu, gpu if nccl else torch.device("cpu"))
    dist.init_process_group("cpu:gloo,cuda:nccl" if nccl else "gloo", init_method=f"file://{path}", rank=rank,
                            world_size=2)           # both ranks have a GPU here: one group of both kinds
    peer = 1 - rank
    rtts, seconds = [], []
    exchange = _exchange_host if device == "cpu" else _exchange_device
    for size, count, times in ((2, small, rtts), (nbytes // 4, large, seconds)):
        exchange(rank, peer, size, count, times, placement)
    if rank == 0:
        latency = statistics.fmean(rtts) / 2
        out.put((latency, nbytes / max(statistics.median(seconds) / 2 - latency, 1e-9)))
    dist.destroy_process_group()


def _exchange_host(rank: int, peer: int, size: int, count: int, times: list, _placement) -> None:
    """Ping-pong of host tensors, each large message into a fresh buffer (as the executor receives:
    writing into new memory faults its pages in, which a reused buffer never does; 4 MiB here: about
    1.7 GB/s fresh against 2.3-3.1 GB/s reused). The suite's accuracy rests on this exact loop: one
    that sent written memory instead read 2.2-3.4 GB/s (median 2.8) against 2.0-2.9 (median 2.3)
    and made every plan's prediction optimistic (experiments/validation/README.md, "What is left")."""
    import torch.distributed as dist
    buf = torch.zeros(size)
    for k in range(count + 1):
        if size > 2:
            buf = torch.empty(size)
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        if k:                                   # the first exchange sets up the pair
            times.append(time.perf_counter() - t0)


def _exchange_device(rank: int, peer: int, size: int, count: int, times: list, placement) -> None:
    """Ping-pong of GPU tensors as the executor moves them (executor.placement): over NCCL, or
    copied to the host, sent over gloo into a fresh buffer and copied onto the GPU."""
    import torch.distributed as dist
    buf = torch.zeros(size, device=placement.compute)
    for k in range(count + 1):
        into = placement.empty(size)
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(placement.to_wire(buf), peer)
        dist.recv(into, peer)
        buf = placement.from_wire(into)
        placement.synchronize()
        if rank == 1:
            dist.send(placement.to_wire(buf), peer)
        if k:
            times.append(time.perf_counter() - t0)


def link_speed(small: int = 200, large: int = 30, nbytes: int = 4 << 20, *, device: str = "cpu",
               nccl: bool = False) -> tuple[float, float]:
    """(latency_s, bandwidth_Bps) of one gloo message between two processes on this host, measured
    by ping-pong now, each large message received into fresh memory as the executor's are. The
    latency includes the wake-up of a process blocked in recv, which on a host with more busy
    processes than cores is the scheduler's delay: what every pipeline hand-off costs.
    On CUDA the message goes from GPU to GPU as the executor's do (executor.placement): over NCCL
    between GPUs 0 and 1 (`nccl`), else through host memory over gloo, both ends on GPU 0."""
    return _group_results(_ping, 2, (small, large, nbytes, device, nccl), "link_speed: ping-pong")[0]


def collective_call(nbytes: int, ranks: int = 2, *, device: str = "cpu", nccl: bool = False, calls: int = 40,
                    busy_s: float = 0.005, spinners: int = 0) -> float:
    """Mean seconds of one all-reduce of `nbytes` among `ranks` processes on this host, entered as a
    tensor-parallel stage's are: by every member at once, straight from `busy_s` of compute, through
    the executor's own call (modelzoo.tp.TPComm: on CUDA through host memory over gloo, or over NCCL
    with a GPU each). On CPU such a call costs several times its bytes' time
    (experiments/validation/results/collective_gap.md), spread from 0.6 to 6 ms at 384 KiB on the
    2-core host: the mean, what many calls add up to, is steadier than the median (2.5-3.0 ms against
    1.3-2.9 in three probes). On CUDA the time starts once the GPU is idle, as the simulator's
    all-reduces start after the pass's compute. `spinners` processes stand for the
    plan's other ranks computing meanwhile: on a host with fewer cores than ranks a member woken by
    the call waits for a core, as in the run (see handoff_delay)."""
    return _group_results(_collective_calls, ranks, (ranks, nbytes, calls, busy_s, device, nccl),
                          "collective_call: all-reduces", spinners=spinners)[0]


def _group_results(target, ranks: int, args: tuple, what: str, results: int = 1, spinners: int = 0) -> list:
    """Run target(rank, store path, *args, queue) in `ranks` spawned processes (one process group, met
    through a file store), with `spinners` other processes keeping cores busy meanwhile (the plan's
    other ranks computing), and return the first `results` results they put on the queue."""
    import multiprocessing
    import tempfile

    import torch.multiprocessing as mp
    fork = multiprocessing.get_context("fork")
    stop = fork.Event()
    busy = [fork.Process(target=_spin_until, args=(stop,)) for _ in range(spinners)]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=target, args=(r, f"{tmp}/store", *args, out)) for r in range(ranks)]
        for p in busy + procs:
            p.start()
        try:
            return [next_result(out, procs, 120.0, what) for _ in range(results)]
        finally:
            stop.set()
            for p in procs + busy:
                p.join(timeout=5.0)
                if p.is_alive():
                    p.kill()


def collective_latency(per_call_s: float, nbytes: int, ranks: int, latency_s: float, bandwidth_Bps: float) -> float:
    """A link's collective_latency_s from one measured call: what the call took beyond its ring's
    2(n - 1) steps of the link's latency and nbytes/n each (hetsim.topology.Topology.tp_pass_s)."""
    ring = 2 * (ranks - 1) * (latency_s + nbytes / ranks / bandwidth_Bps)
    return max(0.0, per_call_s - ring)


def _collective_calls(rank: int, path: str, ranks: int, nbytes: int, calls: int, busy_s: float, device: str,
                      nccl: bool, out) -> None:
    import torch.distributed as dist
    from modelzoo.tp import TPComm
    die_with_parent()
    steady_allocator()
    torch.set_num_threads(1)
    gpu = device != "cpu"
    if gpu:
        torch.cuda.set_device(torch.device("cuda", rank if nccl else 0))
    compute = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"file://{path}", rank=rank, world_size=ranks)
    comm = TPComm(rank, ranks, dist.group.WORLD, compute if nccl else "cpu")
    x = torch.ones(nbytes // 4, device=compute)
    work = torch.ones(512, 512, device=compute)
    times = []
    for k in range(calls + 3):                  # the first calls set up the group's connections
        dist.barrier()
        _busy(work, busy_s)
        t0 = time.perf_counter()
        y = comm.all_reduce(x)
        if gpu:
            torch.cuda.synchronize()
        if k >= 3:
            times.append(time.perf_counter() - t0)
        del y
    if rank == 0:
        out.put(statistics.fmean(times))
    dist.destroy_process_group()


def _busy(work: torch.Tensor, seconds: float) -> None:
    """Compute for `seconds` in matrix products (on a GPU each waited for, so none is left queued)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work @ work
        if work.is_cuda:
            torch.cuda.synchronize()


def handoff_delay(ranks: int, cores: float, *, rounds: int = 100, compute_s: float = 0.004) -> float:
    """Mean seconds a rank blocked in a receive waits, once its message is sent, before it runs on a
    host whose `cores` are busy with the plan's other `ranks`, beyond the same wait with a core free
    for it (which link_speed's latency holds). 0 unless the sender and the other ranks can fill the
    cores when a receiver wakes (`ranks` - 1 >= `cores`; `cores` may be fractional, as measured).

    A pipeline's receiver wakes while its neighbours compute. With the cores full, most wake-ups
    are as quick as on an idle core, but some wait a scheduler tick (experiments/validation/
    results/wakeup.md), which the simulator's fluid share of the cores does not model. Measured as
    the executor's ranks hand off: gloo, one thread each, the sender computing after each send,
    `ranks` - 2 other processes spinning throughout (experiments/validation/wakeup.py's probe)."""
    if ranks - 1 < cores:
        return 0.0
    loaded, free = (statistics.fmean(wake_delays(busy, rounds, compute_s)) for busy in (ranks - 2, 0))
    return max(0.0, loaded - free)


def wake_delays(spinners: int, rounds: int = 40, compute_s: float = 0.004) -> list[float]:
    """Seconds from each of `rounds` gloo sends to its blocked receiver running again, with
    `spinners` other processes busy throughout (see handoff_delay)."""
    stamps = dict(_group_results(_hand_offs, 2, (rounds, compute_s), "handoff_delay: hand-offs", results=2,
                                 spinners=spinners))
    return [woke - sent for sent, woke in zip(stamps[1], stamps[0])]


def busy_wait(seconds: float) -> None:
    """Keep this thread's core busy for `seconds` (a rank computing, in the probes)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _spin_until(stop) -> None:
    while not stop.is_set():
        busy_wait(0.001)


def _hand_offs(rank: int, path: str, rounds: int, compute_s: float, out) -> None:
    """Rank 1 computes, stamps and sends, `rounds` times; rank 0 receives, stamps and computes a
    quarter as long, so that it is blocked in its receive when each message is sent."""
    import torch.distributed as dist
    die_with_parent()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    buf, stamps = torch.zeros(2), []
    for k in range(rounds + 1):                 # the first exchange sets up the pair
        if rank == 1:
            busy_wait(compute_s)
            stamp = time.monotonic()
            dist.send(buf, 0)
        else:
            dist.recv(buf, 1)
            stamp = time.monotonic()
            busy_wait(compute_s / 4)
        if k:
            stamps.append(stamp)
    out.put((rank, stamps))
    dist.destroy_process_group()
