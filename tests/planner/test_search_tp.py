"""Tensor-parallel degree as a search dimension: a stage may be a TP group of t GPUs of one node."""

import pytest

from conftest import cluster, gpu_type
from hetsim.errors import PlanError
from hetsim.feasibility import check_plan
from hetsim.planner.search import SearchSpace, _simulate, search_plans
from hetsim.planner.tp_groups import tp_view
from hetsim.profile import LayerProfile, ModelProfile

# 1 GiB: one layer with its gradients and optimizer state needs a little more; half of it fits.
SMALL = gpu_type("small", 1.0)


def wide_model(n_layers: int = 1) -> ModelProfile:
    layers = tuple(LayerProfile(name=f"l{i}", kind="x", param_bytes=340 * 2**20, output_bytes=8 * 2**20,
                                fwd_s={"small": 0.02}, bwd_s={"small": 0.04}) for i in range(n_layers))
    return ModelProfile(model="wide", batch_size=8, layers=layers,
                        edges=tuple((i, i + 1) for i in range(n_layers - 1)), input_bytes=8 * 2**20)


def test_tp_view_keeps_one_lead_per_group_of_one_type_in_a_node():
    c = cluster([4, 3], types=[SMALL, SMALL], intra_Bps=10e9, net_Bps=1.25e9)
    view, members = tp_view(c, 2)
    assert [[g.id for g in n.gpus] for n in view.nodes] == [["node0/gpu0", "node0/gpu2"], ["node1/gpu0"]]
    assert members == {"node0/gpu0": ("node0/gpu0", "node0/gpu1"), "node0/gpu2": ("node0/gpu2", "node0/gpu3"),
                       "node1/gpu0": ("node1/gpu0", "node1/gpu1")}


def test_a_model_too_big_for_one_gpu_is_planned_on_a_tp_pair_that_checks_and_simulates():
    c, model = cluster([2], types=[SMALL], intra_Bps=10e9, net_Bps=1.25e9), wide_model()
    with pytest.raises(PlanError, match="does not fit"):
        search_plans(c, model, SearchSpace(policies=("auto",), nm_values=(1, 2), workers=1))
    space = SearchSpace(policies=("auto",), nm_values=(1, 2), tp_values=(1, 2), waves=6, workers=1)
    result = search_plans(c, model, space)
    best = result.best
    assert best.feasible and best.policy.endswith("+TP2")
    stage = best.plan.virtual_workers[0].stages[0]
    assert stage.tp == 2 and stage.members == ("node0/gpu0", "node0/gpu1")
    memory = check_plan(best.plan, c, model)
    assert max(m.total_bytes for m in memory.values()) <= SMALL.memory_bytes
    assert best.simulated_mb_s == _simulate((c, model, best.plan, space)).mb_s > 0


def test_tp_stages_in_a_pipeline_of_two_nodes_run_under_bsp():
    c, model = cluster([2, 2], types=[SMALL, SMALL], intra_Bps=10e9, net_Bps=1.25e9), wide_model(2)
    space = SearchSpace(policies=("auto",), nm_values=(2,), tp_values=(2,), sync="bsp", schedule="1f1b-flush",
                        waves=6, workers=1)
    plans = [c_.plan for c_ in search_plans(c, model, space).candidates if c_.feasible]
    assert plans and all(s.tp == 2 for p in plans for vw in p.virtual_workers for s in vw.stages)
    for p in plans:
        check_plan(p, c, model)


def test_a_tp_degree_below_one_is_refused_naming_the_field():
    with pytest.raises(PlanError, match="tp_values"):
        SearchSpace(tp_values=(0,))


def test_a_tp_degree_no_node_can_hold_is_refused_naming_the_largest_group():
    c = cluster([4, 3], types=[SMALL, SMALL], intra_Bps=10e9, net_Bps=1.25e9)
    with pytest.raises(PlanError, match=r"^search: tensor-parallel degrees \(--tp, tp_values\) 8: .* no node of cluster .* has that many "
                                        r"\(the most is 4\)$"):
        search_plans(c, wide_model(), SearchSpace(policies=("auto",), nm_values=(1,), tp_values=(8,), workers=1))


def test_the_shape_bound_takes_a_profiles_tp_times_so_it_stays_above_what_the_partitioner_charges():
    """Measured TP times may beat a single GPU's / t; the level-0 bound must not fall below them."""
    from dataclasses import replace

    from hetsim.planner.bounds import shape_bound
    model = wide_model(3)
    fast = replace(model, layers=tuple(replace(l, fwd_s={**l.fwd_s, "small@tp2": 0.004},
                                               bwd_s={**l.bwd_s, "small@tp2": 0.008}) for l in model.layers))
    assert shape_bound(model, ("small",), 4, {}, 2) == pytest.approx(1 / (3 * 0.06 / 2))   # one stage: 1 / total
    assert shape_bound(fast, ("small",), 4, {}, 2) == pytest.approx(1 / (3 * 0.012))
    assert fast.stage_times_tp("small", 0, 3, 2).fwd_s == pytest.approx(3 * 0.004)


def test_tp_degrees_that_build_nothing_or_fewer_plans_say_why():
    c, model = cluster([2, 2], types=[SMALL, SMALL], intra_Bps=10e9, net_Bps=1.25e9), wide_model(2)
    bsp = search_plans(c, model, SearchSpace(policies=("ED",), nm_values=(2,), tp_values=(1, 2, 8), sync="bsp",
                                             schedule="1f1b-flush", waves=4, workers=1))
    assert bsp.skipped == ("TP 8: no node has 8 GPUs of one type",)
    wsp = search_plans(c, model, SearchSpace(policies=("ED", "NP"), nm_values=(2,), tp_values=(1, 2), waves=4,
                                             workers=1))
    assert len(wsp.skipped) == 1 and wsp.skipped[0].startswith("TP 2: ") and "--sync bsp" in wsp.skipped[0]
    four = cluster([4, 4], types=[SMALL, SMALL], intra_Bps=10e9, net_Bps=1.25e9)      # ED: two VWs of TP pairs
    with pytest.raises(PlanError, match=r"built no candidate plan on this cluster \(TP 2: .* under --sync bsp"):
        search_plans(four, model, SearchSpace(policies=("ED",), nm_values=(2,), tp_values=(2,), waves=4, workers=1))
