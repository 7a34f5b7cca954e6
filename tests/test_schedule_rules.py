"""The plan check's schedule rules, read from the registry: virtual-stage layouts, sync modes, memory."""

import pytest

from conftest import cluster, plan, profile
from hetsim.errors import PlanError
from hetsim.feasibility import check_plan
from hetsim.plan import SyncSpec

GPUS = ["node0/gpu0", "node0/gpu1"]


def test_interleaved_plan_repeats_its_gpus_round_robin():
    memory = check_plan(plan([GPUS * 2], [0, 1, 2, 3, 4], nm=2, schedule="1f1b-interleaved"), cluster([2]),
                        profile(4, 0.01, 0.02))
    assert sorted(memory) == GPUS              # two GPUs, each holding two of the four stages


def test_interleaved_plan_in_another_gpu_order_is_refused_naming_the_stages():
    with pytest.raises(PlanError, match=r"virtual_workers\[0\]\.stages.*round-robin"):
        check_plan(plan([GPUS + GPUS[::-1]], [0, 1, 2, 3, 4], nm=2, schedule="1f1b-interleaved"),
                   cluster([2]), profile(4, 0.01, 0.02))


@pytest.mark.parametrize("schedule", ["1f1b-flush", "zb-h1"])
def test_other_schedules_still_run_one_stage_per_gpu(schedule):
    with pytest.raises(PlanError, match="already used"):
        check_plan(plan([GPUS * 2], [0, 1, 2, 3, 4], nm=2, schedule=schedule), cluster([2]), profile(4, 0.01, 0.02))


def test_interleaved_nm_must_be_a_multiple_of_the_devices():
    with pytest.raises(PlanError, match="plan: nm"):
        check_plan(plan([GPUS * 2], [0, 1, 2, 3, 4], nm=3, schedule="1f1b-interleaved"), cluster([2]),
                   profile(4, 0.01, 0.02))


def test_sync_modes_a_schedule_does_not_support_are_refused():
    with pytest.raises(PlanError, match="sync.mode: wsp is not supported by schedule zb-h1"):
        check_plan(plan([GPUS, ["node1/gpu0", "node1/gpu1"]], [0, 1, 2], nm=2, schedule="zb-h1",
                        sync=SyncSpec(mode="wsp")), cluster([2, 2]), profile(2, 0.01, 0.02))


def test_an_interleaved_gpu_holds_the_weights_of_all_its_chunks_and_their_activations_at_its_peak():
    p = profile(4, 0.01, 0.02, param_bytes=1000, out_bytes=100)
    memory = check_plan(plan([GPUS * 2], [0, 1, 2, 3, 4], nm=2, schedule="1f1b-interleaved"), cluster([2]), p)
    one_chunk = check_plan(plan([GPUS], [0, 2, 4], nm=2, schedule="1f1b-flush"), cluster([2]), p)
    assert memory["node0/gpu0"].weights_bytes == one_chunk["node0/gpu0"].weights_bytes == 2000
    # Device 0 of p = 2, v = 2, Nm = 2 holds all 2 x 2 chunk-minibatches at its peak (Megatron: vp + p - 1 = 5,
    # capped by the v Nm = 4 of a wave).
    assert memory["node0/gpu0"].in_flight == 4
