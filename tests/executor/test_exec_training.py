"""The executor trains the same model as plain single-process training, and stashes weights."""

from __future__ import annotations

import pytest
import torch

import executor
import modelzoo
from executor.data import SyntheticData
from modelzoo.tasks import task_of
from hetsim.plan import SyncSpec
from exec_helpers import host, mlp_plan

LR, MOMENTUM, SEED, BATCH = 0.05, 0.9, 3, 16


def reference_losses(n_minibatches: int, n_vw: int = 1) -> list[float]:
    """Plain training: torch.optim.SGD on the whole model; with several VWs, the mean loss of their
    minibatches (what BSP's averaged gradients compute)."""
    torch.manual_seed(SEED)
    model, example = modelzoo.build("mlp", batch=1)
    data = SyntheticData(task=task_of(model, example), mode="teacher", seed=SEED, batch=BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
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
