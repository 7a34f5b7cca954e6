"""A rank that dies or hangs stops the whole run within a bounded time, with errors naming it;
training resumes from the last per-wave checkpoint with the same losses."""

from __future__ import annotations

import time

import pytest

import executor
from exec_helpers import host, mlp_plan
from executor.health import ExecutorError
from hetsim.errors import HetsimError

TIMEOUT_S = 4.0


def run(plan, **options):
    opts = executor.ExecOptions(warmup_waves=1, seed=5, timeout_s=TIMEOUT_S, **options)
    return executor.launch(plan, host(len(plan.gpus)), options=opts)


@pytest.mark.parametrize("kind,word", [("die", "died"), ("hang", "hung")])
def test_a_dead_or_hung_rank_is_named_by_every_other_rank(kind, word):
    plan = mlp_plan([[0, 3, 6, 9]], nm=2, schedule="1f1b")
    start = time.monotonic()
    with pytest.raises(ExecutorError) as info:
        run(plan, waves=4, fault=f"1:F3:{kind}")
    elapsed = time.monotonic() - start
    message = str(info.value)
    culprit = "rank 1 (vw0 stage 1 on host/gpu1)"
    assert f"{culprit} {word}" in message
    for other in (0, 2):                           # each survivor exited on its own, naming rank 1
        line = next(l for l in message.splitlines() if l.strip().startswith(f"rank {other} "))
        assert culprit in line and "killed" not in line
    assert elapsed < TIMEOUT_S + 15


def test_resume_from_the_last_wave_checkpoint_gives_the_same_losses(tmp_path):
    plan = mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush")
    want = {mb: loss for _, mb, loss in run(plan, waves=5).training["losses"]}
    with pytest.raises(ExecutorError, match="rank 1"):
        run(plan, waves=5, checkpoint_dir=str(tmp_path), fault="1:F5:die")    # dies in wave 2
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "rank0_wave0.pt", "rank0_wave1.pt", "rank1_wave0.pt", "rank1_wave1.pt"]
    resumed = run(plan, waves=5, checkpoint_dir=str(tmp_path), resume=True)
    got = {mb: loss for _, mb, loss in resumed.training["losses"]}
    assert sorted(got) == [4, 5, 6, 7, 8, 9]                                   # waves 2, 3, 4
    assert got == pytest.approx({mb: want[mb] for mb in got}, abs=1e-6)


def test_checkpoints_refuse_asynchronous_schedules(tmp_path):
    plan = mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b")
    with pytest.raises(HetsimError, match="flush schedule"):
        run(plan, waves=3, checkpoint_dir=str(tmp_path))
