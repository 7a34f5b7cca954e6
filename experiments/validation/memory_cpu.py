"""hetsim's memory model against what the executor's stage allocates, on CPU.

One process runs a whole model as one stage of the executor (executor.stage.StageModel with the
case's optimizer, gradients summed inside the backward) through flush waves of Nm minibatches: Nm
forwards, then Nm backwards, then a step (GPipe's order: Nm minibatches in flight). The measured peak
is the weights and the optimizer's state plus the most bytes alive at once during the second wave,
from torch's CPU allocation records (torch.profiler, profile_memory). The prediction is
hetsim.memory's for the same stage: the model counted on the meta device (modelzoo.counting), the
same optimizer, fp32, Nm in flight, no framework reserve (none on CPU).

    python experiments/validation/memory_cpu.py [--out experiments/validation/results/memory_cpu.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import modelzoo
from executor.stage import StageModel
from hetsim.memory import MemorySettings, stage_memory
from modelzoo.counting import counted_profile
from modelzoo.cpu_memory import peak_bytes_during
from modelzoo.tasks import task_of
from modelzoo.tp import stage_loss

MLP = ("mlp", {"hidden": 1024, "depth": 8}, 256)
SMALL_GPT = ("gpt2-small", {"n_layer": 2, "seq_len": 64, "vocab_size": 1024}, 4)
CASES = [(*MLP, nm, "momentum") for nm in (1, 2, 4)] + \
        [(*SMALL_GPT, nm, "momentum") for nm in (1, 2, 4)] + \
        [("gpt2-small", {"n_layer": 2, "seq_len": 64}, 4, nm, "momentum") for nm in (1, 2, 4)] + \
        [(*case, 2, optimizer) for case in (MLP, SMALL_GPT) for optimizer in ("sgd", "adam")]


def measured_peak_bytes(model: str, kwargs: dict, batch: int, nm: int, optimizer: str = "momentum") -> int:
    """Weights and the optimizer's state, plus the most bytes alive at once in a steady flush wave."""
    torch.manual_seed(0)
    net, example = modelzoo.build(model, batch=batch, **kwargs)
    graph = modelzoo.layer_graph(net)
    x, y = task_of(net, example).random_batch(batch, torch.Generator().manual_seed(0))
    n = len(graph)
    stage = StageModel(graph, 0, n, is_last=True, lr=0.01, momentum=0.9, loss_fn=stage_loss(graph, n),
                       optimizer=optimizer)
    stage.sum_in_backward = True

    def wave() -> None:
        for k in range(nm):
            stage.forward(k, (x,), y)
        for k in range(nm):
            stage.backward(k, None, need_input_grads=False)
            stage.accumulate(k)
        stage.step()
    wave()                                     # the optimizer's state exists from here on
    top = peak_bytes_during(wave)
    state = [t for kept in stage.rule.state if kept is not None for t in kept]
    held = sum(t.numel() * t.element_size() for t in stage.weights + state)
    return held + top


def predicted(model: str, kwargs: dict, batch: int, nm: int, optimizer: str = "momentum"):
    profile, _ = counted_profile(model, batch, **kwargs)
    return stage_memory(profile, 0, profile.n_layers, in_flight=nm, asynchronous=False,
                        settings=MemorySettings(optimizer=optimizer))


def rows() -> list[dict]:
    out = []
    for model, kwargs, batch, nm, optimizer in CASES:
        want = predicted(model, kwargs, batch, nm, optimizer)
        got = measured_peak_bytes(model, kwargs, batch, nm, optimizer)
        out.append({"model": model + "".join(f" {k}={v}" for k, v in kwargs.items()), "batch": batch, "nm": nm,
                    "optimizer": optimizer,
                    "measured_MB": got / 1e6, "predicted_MB": want.total_bytes / 1e6,
                    "error_pct": 100 * (want.total_bytes - got) / got, "predicted_parts": want.describe()})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the table here (markdown) as well as printing it")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["| model | batch | Nm | optimizer | measured MB | predicted MB | error | predicted (GiB) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows():
        lines.append(f"| {r['model']} | {r['batch']} | {r['nm']} | {r['optimizer']} | {r['measured_MB']:.1f} | "
                     f"{r['predicted_MB']:.1f} | "
                     f"{r['error_pct']:+.1f} % | {r['predicted_parts']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        command = "python experiments/validation/memory_cpu.py --out " + args.out
        Path(args.out).write_text(f"# Memory: hetsim's model against the executor's allocations on CPU\n\n"
                                  f"```\n{command}\n```\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
