"""How much more CPU work a plan's stages do when their processes share the host at once.

A profile times each layer in a process alone on the host. The executor runs one process per rank,
and processes sharing a machine evict each other's weights and activations from the per-core caches
and share its memory bandwidth, so the same forward and backward cost more CPU seconds (measured
here: four stages of an 8-layer MLP 1024 wide, 4 processes on 2 cores, 7.5-12% more; two whole-model
processes, within 2%). Time-slicing cannot hide that cost: it is work, not waiting.

`colocation_factor` measures it for one plan's stages: one process per stage rank, each looping
its stage's forward, backward and the optimiser work its schedule does (the executor's own
StageModel: under 1F1B and HetPipe an update per minibatch, into fresh tensors while the next
minibatch is in flight; under a flush schedule, BSP included, a gradient accumulation per minibatch
and one step per wave of Nm, `probe_actions`. An update touches every weight and suffers more from
sharing the caches than a forward does, so timing one per minibatch under a flush schedule charged
a BSP plan with a slowed rank about 10% more compute than it did); a rank with an emulated
slowdown spins after each step as the executor's does, and a spinning rank evicts little), first
each alone in turn and then all at once, twice over; the factor is the CPU seconds of the loops
together over the same loops alone. A member of a tensor-parallel stage loops its share of the
layers (modelzoo.tp) without its all-reduces: its work, not its waits. The host's speed drifts by a
few percent over seconds, so the two rounds' phases interleave and the factor is their mean. hetsim's
simulator multiplies compute on a node's shared cores by it (`Node.colocated_work`). It is measured
like the profile, before the run it predicts, and never from the run itself.

On CUDA the ranks' processes share GPUs rather than cores, and what matters is how much work a
shared GPU sustains at once: `gpu_concurrency` runs the same probes on the GPU (steps timed on the
wall clock, up to a synchronisation) and sums each stage's speed together over its speed alone. A
GPU that runs one rank's large kernels at a time gives about 1 (time-slicing); small, launch-bound
stages overlap and give up to the number of stages. hetsim's simulator shares the node's capacity
among busy ranks with that many `shared_cores`.
"""

from __future__ import annotations

import itertools
import statistics
import time

import torch

from executor.children import die_with_parent, next_result, reap
from hetsim.plan import ASYNC_SCHEDULES

__all__ = ["colocation_factor", "gpu_concurrency", "probe_actions"]


def probe_actions(schedule: str, nm: int) -> tuple[str, ...]:
    """The actions of one probe step of a stage rank under `schedule` with `nm` minibatches a wave:
    as the executor's runner does them, one minibatch in flight besides the one computed."""
    if schedule in ASYNC_SCHEDULES:
        # With Nm > 1 the next forward runs before the previous update (its weights are stashed).
        return ("forward", "update previous", "backward") if nm > 1 else ("forward", "backward", "update")
    return ("forward", "backward", "accumulate") * nm + ("step",)


def colocation_factor(model: str, stages: list[tuple[int, int]], *, batch: int, model_kwargs: dict | None = None,
                      slowdowns: list[float] | None = None, seconds: float = 0.6, rounds: int = 2,
                      tp: list[tuple[int, int]] | None = None, schedule: str = "1f1b", nm: int = 2,
                      sync: str = "none", optimizer: str = "momentum") -> float:
    """CPU work of `stages` ([lo, hi) layer ranges, one process each, with their emulated
    `slowdowns`; `tp` gives each its (member index, tensor-parallel degree), default (0, 1)) run
    together over run alone, each doing the `optimizer`'s work as `schedule`, `nm` and `sync` mode
    have it done.
    Takes about rounds x (len(stages) + 2) x `seconds` plus process start-up; 1.0 for one stage."""
    if len(stages) < 2:
        return 1.0
    results = _probes(model, stages, batch, model_kwargs, slowdowns or [1.0] * len(stages), seconds, rounds, "cpu",
                      wall=False, tp=tp, updates=(schedule, nm, sync, optimizer))
    ratios = [sum(r[k][1] for r in results) / sum(r[k][0] for r in results) for k in range(rounds)]
    return statistics.fmean(ratios)


def gpu_concurrency(model: str, stages: list[tuple[int, int]], *, batch: int, device: str = "cuda",
                    model_kwargs: dict | None = None, seconds: float = 0.6, rounds: int = 2,
                    tp: list[tuple[int, int]] | None = None, schedule: str = "1f1b", nm: int = 2,
                    sync: str = "none", optimizer: str = "momentum") -> float:
    """How many of `stages` (one process each, all on `device`; `tp`, `schedule`, `nm`, `sync` and
    `optimizer` as in colocation_factor) a GPU runs at full speed at once: the sum over stages of step time alone
    over step time together, between 1 and len(stages)."""
    if len(stages) < 2:
        return 1.0
    results = _probes(model, stages, batch, model_kwargs, [1.0] * len(stages), seconds, rounds, device, wall=True,
                      tp=tp, updates=(schedule, nm, sync, optimizer))
    sums = [sum(r[k][0] / r[k][1] for r in results) for k in range(rounds)]
    return min(max(statistics.fmean(sums), 1.0), float(len(stages)))


def _probes(model, stages, batch, model_kwargs, slowdowns, seconds, rounds, device, wall: bool, tp=None,
            updates=("1f1b", 2, "none", "momentum")) -> list:
    """Each probe's [(alone, together)] per round: a step's work (`wall` False), or its wall time."""
    if seconds <= 0 or rounds < 1:
        raise ValueError(f"seconds must be > 0 and rounds >= 1, got {seconds} and {rounds}")
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(stages)), ctx.Queue()
    tp = tp or [(0, 1)] * len(stages)
    procs = [ctx.Process(target=_probe, args=(i, model, lo, hi, batch, dict(model_kwargs or {}), slowdowns[i],
                                              seconds, rounds, barrier, out, device, wall, tp[i], updates))
             for i, (lo, hi) in enumerate(stages)]
    try:
        for p in procs:
            p.start()
        results = [next_result(out, procs, 300.0, "colocation: probe") for _ in procs]
    except BaseException:
        reap(procs)
        raise
    for p in procs:
        p.join()
    return results


def _probe(i: int, model: str, lo: int, hi: int, batch: int, model_kwargs: dict, slowdown: float,
           seconds: float, rounds: int, barrier, out, device: str = "cpu", wall: bool = False,
           tp: tuple[int, int] = (0, 1), updates: tuple[str, int, str, str] = ("1f1b", 2, "none", "momentum")
           ) -> None:
    from executor.emulation import Emulation
    from executor.placement import staged
    from modelzoo.allocator import steady_allocator
    die_with_parent()
    steady_allocator()                        # as every executor rank
    torch.set_num_threads(1)
    step = _stage_step(model, lo, hi, batch, model_kwargs, device, tp, *updates)
    emulation = Emulation(slowdown, staged(device))
    _work_per_step(step, emulation, 0.2, wall)       # warm: first passes fault in memory later ones reuse
    results = []
    for _ in range(rounds):
        alone = None
        for turn in range(barrier.parties):   # each alone in turn, the others waiting
            barrier.wait()
            if turn == i:
                alone = _work_per_step(step, emulation, seconds, wall)
        barrier.wait()
        results.append((alone, _work_per_step(step, emulation, 2 * seconds, wall)))
        barrier.wait()
    out.put(results)


def _stage_step(model: str, lo: int, hi: int, batch: int, model_kwargs: dict, device: str = "cpu",
                tp: tuple[int, int] = (0, 1), schedule: str = "1f1b", nm: int = 2, sync: str = "none",
                optimizer: str = "momentum"):
    """A function doing `probe_actions(schedule, nm)` of the stage as an executor rank does them
    (one minibatch under an asynchronous schedule, one wave under a flush one; under BSP into the
    flat gradient vector the all-reduce uses, under WSP into fresh weights, as worker.py sets up).
    With `tp` (k, t), t > 1: member k's share of the layers, its all-reduces left out."""
    import modelzoo
    from executor.stage import StageModel
    from executor.worker import layer_values
    from modelzoo.tasks import task_of
    from modelzoo.tp import TPComm, split_stage, stage_loss
    torch.manual_seed(0)
    net, example = modelzoo.build(model, batch=1, **model_kwargs)
    graph = modelzoo.layer_graph(net)
    values = layer_values(graph, example)
    shaped = lambda cut: [torch.randn(batch, *values[k].shape[1:], device=device) for k in graph.crossing(cut)]
    last = hi >= len(graph)
    first_inputs, labels = task_of(net, example).random_batch(batch, torch.Generator().manual_seed(0))
    inputs = (first_inputs.to(device),) if lo == 0 else tuple(shaped(lo))     # token ids for a language model
    grads = None if last else tuple(shaped(hi))
    labels = labels.to(device) if last else None
    if tp[1] > 1:
        split_stage(graph, lo, hi, TPComm(*tp, group=None, wire=device))
    stage = StageModel(graph, lo, hi, is_last=last, lr=0.01, momentum=0.9, device=device,
                       loss_fn=stage_loss(graph, hi), optimizer=optimizer)
    stage.track_deltas, stage.flat_grads = sync == "wsp", sync == "bsp"
    actions = probe_actions(schedule, nm)
    stage.sum_in_backward = "accumulate" in actions          # as the executor runs flush schedules
    minibatches = itertools.count()
    k = -1
    do = {"forward": lambda: stage.forward(k, inputs, labels),
          "backward": lambda: stage.backward(k, grads, need_input_grads=lo > 0),
          "update previous": lambda: k and stage.update(k - 1), "update": lambda: stage.update(k),
          "accumulate": lambda: stage.accumulate(k), "step": stage.step}

    def step() -> None:
        nonlocal k
        for action in actions:
            if action == "forward":
                k = next(minibatches)
            do[action]()
    step.stage = stage                        # for tests: what the steps did to the weights
    return step


def _work_per_step(step, emulation, seconds: float, wall: bool) -> float:
    """Seconds of one step (not its emulated spin) over `seconds` of wall time (at least 3 steps):
    the median by emulation.clock (thread CPU seconds on CPU, wall seconds up to a synchronisation
    on CUDA), or with `wall` the mean by the wall clock after a synchronisation (a rate: under
    time-slicing most steps run whole and a few wait for a slice, which a median would miss)."""
    clock = (lambda: (emulation.clock(), time.perf_counter())[1]) if wall else emulation.clock
    samples, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(samples) < 3:
        t0, work0 = clock(), emulation.start()
        step()
        samples.append(clock() - t0)
        emulation.stretch(work0)
    return statistics.fmean(samples) if wall else statistics.median(samples)
