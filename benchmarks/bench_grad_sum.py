"""A flush schedule's gradient sum: added after each backward vs added by autograd inside it.

executor.stage.StageModel with `sum_in_backward` presets the wave's sum as each weight's `.grad`,
so autograd's AccumulateGrad adds every weight's gradient in place as it comes; without it a
backward returns the minibatch's whole gradient set and `accumulate` adds it afterwards. Same
arithmetic in the same order (the weights come out bit for bit equal); what differs is how much
is alive at once and where the adds run.

One process, one torch thread, the validation suite's model (modelzoo mlp, 8 hidden layers of 1024,
minibatch 256) as one stage; each case runs a wave of Nm forward/backward/accumulate and one step,
the two ways alternately. Time: thread CPU seconds per minibatch (median over the timed waves).
Peak: the most bytes alive beyond what was alive before the wave's second backward began, from
torch's CPU allocation records (torch.profiler, profile_memory).

    python benchmarks/bench_grad_sum.py [--waves 12] [--warmup 2] [--nm 1 4]

Prints a table; asserts nothing. Timings on a shared host are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import modelzoo
from executor.stage import StageModel
from modelzoo.cpu_memory import peak_bytes_during
from modelzoo.allocator import steady_allocator

KWARGS, BATCH = {"hidden": 1024, "depth": 8}, 256


def _stage(inside: bool, flat: bool) -> StageModel:
    torch.manual_seed(0)
    graph = modelzoo.layer_graph(modelzoo.build("mlp", batch=1, **KWARGS)[0])
    stage = StageModel(graph, 0, len(graph), is_last=True, lr=0.01, momentum=0.9)
    stage.sum_in_backward, stage.flat_grads = inside, flat
    return stage


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 64, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def _wave(stage: StageModel, nm: int, x, y) -> float:
    t0 = time.thread_time()
    for k in range(nm):
        stage.forward(k, (x,), y)
        stage.backward(k, None, need_input_grads=False)
        stage.accumulate(k)
    stage.step()
    return (time.thread_time() - t0) / nm


def _peak_bytes(inside: bool, flat: bool) -> int:
    """Most bytes alive at once during a wave's second backward and its accumulate, beyond those
    alive when it began."""
    stage, (x, y) = _stage(inside, flat), _batch()
    stage.forward(0, (x,), y), stage.backward(0, None, False), stage.accumulate(0)
    stage.forward(1, (x,), y)
    return peak_bytes_during(lambda: (stage.backward(1, None, False), stage.accumulate(1)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--waves", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nm", type=int, nargs="+", default=[1, 4])
    args = p.parse_args()
    steady_allocator()
    torch.set_num_threads(1)
    x, y = _batch()
    grads_mb = 4 * sum(w.numel() for w in _stage(False, False).weights) / 1e6
    print(f"mlp {KWARGS}, minibatch {BATCH}: one gradient set is {grads_mb:.1f} MB\n")
    print("| nm | sum | after backward ms/mb | inside backward ms/mb | ratio | peak after MB | peak inside MB |")
    print("|---|---|---|---|---|---|---|")
    for nm in args.nm:
        for flat in (False, True):
            stages = {inside: _stage(inside, flat) for inside in (False, True)}
            times = {False: [], True: []}
            for w in range(args.warmup + args.waves):
                for inside, stage in stages.items():
                    seconds = _wave(stage, nm, x, y)
                    if w >= args.warmup:
                        times[inside].append(seconds)
            after, inside = (statistics.median(times[k]) * 1e3 for k in (False, True))
            peaks = [_peak_bytes(k, flat) / 1e6 for k in (False, True)]
            print(f"| {nm} | {'BSP flat vector' if flat else 'per tensor'} | {after:.2f} | {inside:.2f} | "
                  f"{inside / after:.3f} | {peaks[0]:.1f} | {peaks[1]:.1f} |")


if __name__ == "__main__":
    main()
