"""The executor on CUDA: where ranks compute and how their messages travel (executor.placement).

The choices are checked here on any host; the runs themselves need a GPU and skip without one.
"""

from __future__ import annotations

import time

import pytest
import torch

import executor
from executor.placement import CPU, Placement, uses_nccl
from hetsim.errors import HetsimError, PlanError
from hetsim.plan import SyncSpec
from exec_helpers import host, mlp_plan

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("device,backend,stages,gpus,want", [
    ("cpu", "auto", 2, 0, False),
    ("cuda", "auto", 4, 1, False),        # a 4-stage plan on a one-GPU machine: through the host
    ("cuda", "auto", 2, 2, True),         # a GPU per stage rank: NCCL
    ("cuda", "auto", 1, 1, True),
    ("cuda:0", "auto", 2, 2, False),      # every rank on GPU 0
    ("cuda", "gloo", 2, 2, False),
    ("cuda", "nccl", 2, 2, True),
])
def test_nccl_only_when_every_stage_rank_has_its_own_gpu(device, backend, stages, gpus, want, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert uses_nccl(device, backend, stages, n_gpus=gpus) is want


def test_torchrun_counts_the_ranks_on_this_host(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")         # 2 stages + a parameter server here
    assert not uses_nccl("cuda", "auto", 2, n_gpus=2)
    assert uses_nccl("cuda", "auto", 2, n_gpus=4)


def test_cpu_placement_moves_nothing():
    assert CPU.to_wire(t := torch.ones(3)) is t and CPU.from_wire(t) is t
    assert CPU.empty((2, 3)).device.type == "cpu" and not CPU.cuda


@pytest.mark.parametrize("kwargs,field", [({"device": "gpu"}, "device"), ({"device": "cuda:x"}, "device"),
                                          ({"backend": "mpi"}, "backend"), ({"backend": "nccl"}, "backend")])
def test_bad_device_or_backend_is_named(kwargs, field):
    with pytest.raises(HetsimError, match=f"^{field}:"):
        executor.ExecOptions(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error():
    plan = mlp_plan([[0, 9]], nm=1, schedule="1f1b")
    with pytest.raises(PlanError, match="sees no CUDA device"):
        executor.make_job(plan, host(1), options=executor.ExecOptions(device="cuda"))


# --- on a GPU --------------------------------------------------------------------------------------

def _run(plan, waves=4, **options):
    opts = executor.ExecOptions(waves=waves, warmup_waves=1, seed=3, lr=0.05, momentum=0.9, device="cuda",
                                **options)
    return executor.launch(plan, host(len(plan.gpus)), options=opts)


@needs_cuda
def test_a_pipeline_on_cuda_trains_as_on_cpu():
    plan = mlp_plan([[0, 3, 6, 9]], nm=2, schedule="1f1b")
    on_gpu = _run(plan)
    on_cpu = executor.launch(plan, host(3), options=executor.ExecOptions(waves=4, warmup_waves=1, seed=3,
                                                                          lr=0.05, momentum=0.9))
    got = [loss for *_, loss in on_gpu.training["losses"]]
    want = [loss for *_, loss in on_cpu.training["losses"]]
    assert got == pytest.approx(want, abs=1e-4)
    assert all(d.startswith("cuda") for d in on_gpu.training["devices"].values())
    assert "cuda_peak_allocated_bytes" in on_gpu.gpus[0].memory_breakdown
    assert on_gpu.gpus[0].memory_bytes > 0


@needs_cuda
@pytest.mark.parametrize("sync", [SyncSpec(mode="wsp", staleness_bound=1), SyncSpec(mode="bsp"),
                                  SyncSpec(mode="sdpipe", sdpipe_period=2)])
def test_data_parallel_sync_runs_on_cuda(sync):
    schedule = "1f1b-flush" if sync.mode == "bsp" else "1f1b"
    report = _run(mlp_plan([[0, 5, 9], [0, 5, 9]], nm=2, schedule=schedule, sync=sync), waves=5)
    assert len(report.training["losses"]) == 2 * 5 * 2
    if sync.mode == "wsp":
        assert report.sync["max_clock_gap"] <= 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between stages needs two GPUs")
def test_a_gpu_per_stage_rank_sends_over_nccl_and_trains_as_through_the_host():
    plan = mlp_plan([[0, 5, 9]], nm=2, schedule="1f1b")
    direct, staged = _run(plan), _run(plan, backend="gloo")
    assert "nccl" in direct.settings["backend"] and "nccl" not in staged.settings["backend"]
    assert [x[-1] for x in direct.training["losses"]] == pytest.approx([x[-1] for x in staged.training["losses"]],
                                                                     abs=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="checks the error on a one-GPU host")
def test_nccl_with_two_stage_ranks_on_one_gpu_is_a_clear_error():
    plan = mlp_plan([[0, 5, 9]], nm=1, schedule="1f1b")
    with pytest.raises(PlanError, match="NCCL refuses two ranks on one GPU"):
        executor.make_job(plan, host(2), options=executor.ExecOptions(device="cuda", backend="nccl"))


@needs_cuda
def test_emulated_slowdown_keeps_the_gpu_busy_that_much_longer():
    from executor.emulation import Emulation
    placement = Placement(torch.device("cuda"), torch.device("cpu"))
    a = torch.randn(2048, 2048, device="cuda")
    work = lambda: [a @ a for _ in range(20)]
    emu = Emulation(3.0, placement)
    work()
    placement.synchronize()
    w0 = emu.start()
    work()
    w1 = emu.clock()
    emu.stretch(w0)
    total = time.perf_counter() - w0
    assert total == pytest.approx(3 * (w1 - w0), rel=0.15)
