import json

import pytest

from conftest import cluster, gpu_type, plan, profile
from hetsim.errors import PlanError, SpecError
from hetsim.feasibility import check_plan
from hetsim.plan import SyncSpec, load_plan, plan_from_dict, save_plan


def test_shipped_plan_round_trips_through_json(tmp_path):
    p = load_plan("hetpipe_vgg19_ed")
    save_plan(p, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == p
    assert json.loads(p.to_json())["virtual_workers"][0]["stages"][0]["layers"] == [0, 14]


@pytest.mark.parametrize("edit,message", [
    ({"schedule": "zigzag"}, "plan.json: schedule: 'zigzag' is not one of"),
    ({"nm": 0}, "plan.json: nm: must be > 0"),
    ({"sync": {"mode": "wsp", "staleness": 1}}, "plan.json: sync.staleness: unknown field"),
    ({"virtual_workers": [{"name": "a", "stages": [{"gpu": "node0/gpu0", "layers": [3, 1]}]}]},
     r"plan.json: virtual_workers\[0\].stages\[0\].layers: \[3, 1\] must satisfy"),
])
def test_malformed_plans_name_the_field(edit, message):
    doc = json.loads(load_plan("hetpipe_vgg19_ed").to_json())
    with pytest.raises(SpecError, match=message):
        plan_from_dict({**doc, **edit}, "plan.json")


def test_plan_naming_a_missing_gpu_is_rejected():
    with pytest.raises(PlanError, match="no GPU 'node0/gpu9'"):
        check_plan(plan([["node0/gpu0", "node0/gpu9"]], [0, 1, 2], nm=1), cluster([2]), profile(2, 1, 1))


def test_stages_must_tile_the_layers():
    doc = json.loads(plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 3], nm=1).to_json())
    doc["virtual_workers"][0]["stages"][1]["layers"] = [2, 3]
    with pytest.raises(PlanError, match=r"vw0 stage 1: layers \[2, 3\) must start at 1"):
        check_plan(plan_from_dict(doc), cluster([2]), profile(3, 1, 1))


def test_a_gpu_used_twice_is_rejected():
    with pytest.raises(PlanError, match="already used by vw0 stage 0"):
        check_plan(plan([["node0/gpu0", "node0/gpu0"]], [0, 1, 2], nm=1), cluster([1]), profile(2, 1, 1))


def test_memory_overflow_names_stage_gpu_and_bytes():
    gib = 1024**3
    p = profile(2, 0.1, 0.1, param_bytes=gib, out_bytes=gib // 2)
    # Stage 0 keeps 2 minibatches in flight: weights 1 + gradients 1 + optimizer 1 + 1 stashed
    # version 1 + activations 2 x (0.5 input + 0.5 output) = 6 GiB, on a 4 GiB GPU.
    small = cluster([2], types=[gpu_type(memory_gib=4)])
    with pytest.raises(PlanError) as err:
        check_plan(plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=2), small, p)
    text = str(err.value)
    assert text.startswith("plan: stage 0 of vw0 on node0/gpu0 (test-gpu, 4.0 GiB) needs 6.00 GiB")
    assert "1 stashed versions 1.00" in text and text.endswith("lower Nm, add a stage or raise tensor parallelism")
    assert "\n" not in text
    check_plan(plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=2), cluster([2]), p)   # fits 16 GiB


def test_bsp_needs_a_flush_schedule_and_equal_partitions():
    c, p = cluster([4]), profile(2, 1, 1)
    with pytest.raises(PlanError, match="needs a flush schedule"):
        check_plan(plan([["node0/gpu0"], ["node0/gpu1"]], [0, 2], nm=1, sync=SyncSpec(mode="bsp")), c, p)


def test_async_wsp_with_no_slack_is_rejected_before_it_deadlocks():
    with pytest.raises(PlanError, match="pull_offset >= 1"):
        check_plan(plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=2, schedule="hetpipe",
                        sync=SyncSpec(mode="wsp", pull_offset=0)), cluster([2]), profile(2, 1, 1))


def test_sdpipe_waits_must_read_min_init_max():
    doc = json.loads(plan([["n0/gpu0"]], [0, 1], nm=1).to_json())
    doc["sync"] |= {"sdpipe_wait_min_s": 0.1, "sdpipe_wait_init_s": 0.01}
    with pytest.raises(SpecError, match=r"^p.json: sync.sdpipe_wait_init_s: the waits must read min <= init <= max"):
        plan_from_dict(doc, "p.json")


def test_a_tensor_parallel_degree_must_divide_the_heads_in_plans_and_in_the_search(tmp_path):
    """Megatron splits whole attention heads: a counted profile carries their common divisor
    (gpt2-small at 4 heads: 4), which survives a round trip, and a TP-3 stage is refused by the plan
    check and by the search, each naming it."""
    import hetsim
    from hetsim.cli import main
    from hetsim.cluster import load_cluster
    from hetsim.feasibility import check_plan
    from hetsim.planner.search import SearchSpace, search_plans
    from hetsim.plan import Plan, StageSpec, VirtualWorker
    out = tmp_path / "g.yaml"
    assert main(["profile", "--model", "gpt2-small", "--model-arg", "n_layer=1", "--model-arg", "n_head=4",
                 "--model-arg", "seq_len=32", "--batch", "2", "--no-measure", "--derive-for", "all",
                 "--out", str(out)]) == 0
    profile = hetsim.load_profile(out)
    assert profile.tp_divisor == 4
    cluster = load_cluster("hetpipe_4node")
    stage = lambda k: StageSpec(gpu="node0/gpu0", tp_gpus=tuple(f"node0/gpu{i}" for i in range(1, k)),
                                layers=(0, profile.n_layers))
    tp_plan = lambda k: Plan(name="tp", model="gpt2-small", minibatch_size=2, nm=1, schedule="gpipe",
                             sync=SyncSpec(), virtual_workers=(VirtualWorker(name="vw0", stages=(stage(k),)),))
    check_plan(tp_plan(4), cluster, profile)
    with pytest.raises(PlanError, match=r"stages\[0\]: 3 tensor-parallel GPUs cannot split gpt2-small's attention "
                                        r"heads; a degree must divide 4"):
        check_plan(tp_plan(3), cluster, profile)
    with pytest.raises(PlanError, match="split only into degrees dividing 4, not 3"):
        search_plans(cluster, profile, SearchSpace(tp_values=(1, 3)))
