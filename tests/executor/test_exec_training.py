"""The executor trains the same model as plain single-process training, and stashes weights."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import executor
import modelzoo
from executor.data import SyntheticData
from modelzoo.tasks import task_of
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from exec_helpers import host, mlp_plan

LR, MOMENTUM, SEED, BATCH = 0.05, 0.9, 3, 16


OPTIMIZERS = {None: lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM),
              "sgd": lambda p: torch.optim.SGD(p, lr=LR), "adam": lambda p: torch.optim.Adam(p, lr=LR),
              "adamw": lambda p: torch.optim.AdamW(p, lr=LR)}


def reference_losses(n_minibatches: int, n_vw: int = 1, optimizer: str | None = None) -> list[float]:
    """Plain training: torch.optim.SGD with momentum (or the `optimizer` named) on the whole model;
    with several VWs, the mean loss of their minibatches (what BSP's averaged gradients compute)."""
    torch.manual_seed(SEED)
    model, example = modelzoo.build("mlp", batch=1)
    data = SyntheticData(task=task_of(model, example), mode="teacher", seed=SEED, batch=BATCH)
    opt = OPTIMIZERS[optimizer](model.parameters())
    losses = []
    for mb in range(n_minibatches):
        per_vw = [torch.nn.functional.cross_entropy(model(data.inputs(v, mb)), data.labels(v, mb))
                  for v in range(n_vw)]
        losses.append([float(l.detach()) for l in per_vw])
        opt.zero_grad()
        (sum(per_vw) / n_vw).backward()
        opt.step()
    return losses


def measured(plan, waves: int, **options):
    opts = executor.ExecOptions(waves=waves, warmup_waves=1, seed=SEED, lr=LR, momentum=MOMENTUM, **options)
    return executor.launch(plan, host(len(plan.gpus)), options=opts)


@pytest.mark.parametrize("schedule,sync", [("1f1b", SyncSpec()), ("gpipe", SyncSpec(mode="wsp"))])
def test_one_vw_nm1_matches_single_process_training(schedule, sync):
    plan = mlp_plan([[0, 3, 6, 9]], nm=1, schedule=schedule, sync=sync, batch=BATCH)
    report = measured(plan, waves=6)
    got = [loss for _, _, loss in report.training["losses"]]
    want = [l[0] for l in reference_losses(6)]
    assert got == pytest.approx(want, abs=1e-5)
    assert want[-1] < want[0]                      # the task is learnable: the comparison means something


def test_bsp_averages_gradients_like_one_process_on_both_minibatches():
    plan = mlp_plan([[0, 4, 9], [0, 4, 9]], nm=1, schedule="1f1b-flush", sync=SyncSpec(mode="bsp"), batch=BATCH)
    report = measured(plan, waves=4)
    want = reference_losses(4, n_vw=2)
    for vw, mb, loss in report.training["losses"]:
        assert loss == pytest.approx(want[mb][vw], abs=1e-5)
    # Its trace names each span's GPU and rank as the simulator's names its GPU.
    spans = [e for e in report.trace.events if e["ph"] == "X"]
    assert {e["args"]["gpu"] for e in spans} == set(plan.gpus)
    assert {e["args"]["rank"] for e in spans} == set(range(len(plan.gpus)))


def test_weight_stashing_backward_uses_the_forward_version():
    plan = mlp_plan([[0, 3, 6, 9]], nm=3, schedule="1f1b", batch=BATCH)
    report = measured(plan, waves=4)
    versions = report.training["weight_versions"]
    first = versions["rank 0 (vw0 stage 0 on host/gpu0)"]
    assert len(first) == 12
    for mb, at_forward, used, current in (v for rows in versions.values() for v in rows):
        assert used == at_forward, f"minibatch {mb}: forward saw version {at_forward}, backward used {used}"
    # On the first stage the weights moved on between a forward and its backward: stashing mattered.
    assert any(current > at_forward for _, at_forward, _, current in first)
    assert report.staleness["local"]["max"] == report.staleness["local_bound"] == 2
    assert report.gpus[0].memory_breakdown["stashed_weights_bytes"] > 0


def reference_wave_losses(waves: int, nm: int, n_vw: int = 1, optimizer: str | None = None) -> list[float]:
    """Plain flush training: every minibatch of a wave (of every VW, as BSP averages them) on the same
    weights, then one step with the mean gradient (GPipe / PipeDream-Flush semantics) of SGD with
    momentum or the `optimizer` named. Losses in (vw, minibatch) order."""
    torch.manual_seed(SEED)
    model, example = modelzoo.build("mlp", batch=1)
    data = SyntheticData(task=task_of(model, example), mode="teacher", seed=SEED, batch=BATCH)
    opt = OPTIMIZERS[optimizer](model.parameters())
    losses = {}
    for w in range(waves):
        opt.zero_grad()
        wave = {(v, mb): torch.nn.functional.cross_entropy(model(data.inputs(v, mb)), data.labels(v, mb))
                for v in range(n_vw) for mb in range(w * nm, (w + 1) * nm)}
        losses.update({key: float(l.detach()) for key, l in wave.items()})
        (sum(wave.values()) / (nm * n_vw)).backward()
        opt.step()
    return [losses[key] for key in sorted(losses)]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_plans_optimizer_trains_like_torch_optim(optimizer):
    """Per-minibatch updates (1F1B, Nm 1) and a BSP flush step over two VWs, each with the plan's
    optimizer, compute the losses torch.optim's computes in one process (sgd: no state; adamw: two
    buffers, bias correction by step count, decoupled decay; every rule against torch.optim in
    test_exec_optimizer.py)."""
    plan = replace(mlp_plan([[0, 3, 6, 9]], nm=1, schedule="1f1b", batch=BATCH), optimizer=optimizer)
    got = [loss for _, _, loss in measured(plan, waves=5).training["losses"]]
    assert got == pytest.approx([l[0] for l in reference_losses(5, optimizer=optimizer)], abs=1e-5)
    plan = replace(mlp_plan([[0, 4, 9]] * 2, nm=2, schedule="1f1b-flush", sync=SyncSpec(mode="bsp"), batch=BATCH),
                   optimizer=optimizer)
    report = measured(plan, waves=3)
    got = [loss for _, _, loss in sorted(report.training["losses"])]
    want = reference_wave_losses(3, 2, 2, optimizer)
    assert got == pytest.approx(want, abs=1e-5)
    assert report.settings["optimizer"] == optimizer


@pytest.mark.parametrize("n_vw,sync,cuts", [(1, SyncSpec(), [0, 4, 9]), (2, SyncSpec(mode="bsp"), [0, 4, 9]),
                                            (2, SyncSpec(mode="bsp"), [0, 1, 2, 9])],
                         ids=["none", "bsp", "bsp-weightless-stage"])
def test_zb_h1_split_backward_trains_like_one_process(n_vw, sync, cuts):
    """I (input gradients) then, deferred, W (weight gradients): the same gradients as one backward
    (layer 1, a ReLU alone, makes a stage with no weights and an empty all-reduce)."""
    plan = mlp_plan([cuts] * n_vw, nm=4, schedule="zb-h1", sync=sync, batch=BATCH)
    report = measured(plan, waves=3)
    got = [loss for _, _, loss in sorted(report.training["losses"])]
    want = reference_wave_losses(3, 4, n_vw)
    assert got == pytest.approx(want, abs=1e-5)
    assert want[-1] < want[0]


@pytest.mark.parametrize("n_vw,sync", [(1, SyncSpec()), (2, SyncSpec(mode="bsp"))], ids=["none", "bsp"])
def test_deepspeed_rendezvous_pipeline_trains_like_one_process(n_vw, sync):
    """DeepSpeed's lockstep order with blocking, paired transfers (three stages: a middle one sends and
    receives in both directions) runs without deadlock and computes plain training's losses."""
    plan = mlp_plan([[0, 3, 6, 9]] * n_vw, nm=4, schedule="1f1b-deepspeed", sync=sync, batch=BATCH)
    report = measured(plan, waves=3)
    got = [loss for _, _, loss in sorted(report.training["losses"])]
    assert got == pytest.approx(reference_wave_losses(3, 4, n_vw), abs=1e-5)


def interleaved_plan(n_vw: int, sync: SyncSpec) -> Plan:
    """Per VW two ranks, four virtual stages: the first rank runs layers [0, 2) and [4, 6), the second
    [2, 4) and [6, 9)."""
    cuts = [0, 2, 4, 6, 9]
    vws = tuple(VirtualWorker(name=f"vw{v}", stages=tuple(
        StageSpec(gpu=f"host/gpu{2 * v + i % 2}", layers=(cuts[i], cuts[i + 1])) for i in range(4)))
        for v in range(n_vw))
    return Plan(name="interleaved", model="mlp", minibatch_size=BATCH, nm=2, schedule="1f1b-interleaved",
                sync=sync, virtual_workers=vws)


@pytest.mark.parametrize("n_vw,sync", [(1, SyncSpec()), (2, SyncSpec(mode="bsp"))], ids=["none", "bsp"])
def test_interleaved_1f1b_two_chunks_per_rank_trains_like_one_process(n_vw, sync):
    report = measured(interleaved_plan(n_vw, sync), waves=3)
    got = [loss for _, _, loss in sorted(report.training["losses"])]
    assert got == pytest.approx(reference_wave_losses(3, 2, n_vw), abs=1e-5)
    assert len(report.gpus) == 2 * n_vw
    # A rank's passes are not named by chunk, so chunks of unequal size would read as variability.
    assert report.training["compute_work_cv"] == {}
