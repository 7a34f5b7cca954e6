"""Search: closed forms, the top-ranked plan holds up in simulation, determinism, "does not fit"."""

import pytest

from conftest import cluster, gpu_type
from hetsim.errors import PlanError
from hetsim.planner.estimate import vw_rate
from hetsim.planner.hetero import partition_vw
from hetsim.planner.search import SearchSpace, _simulate, search_plans
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.topology import Topology

FAST, SLOW = gpu_type("fast", memory_gib=2.0), gpu_type("slow", memory_gib=0.75)


def model(n=8, param_mib=20, act_mib=8):
    layers = tuple(LayerProfile(name=f"l{i}", kind="x", param_bytes=param_mib * 2**20,
                                output_bytes=act_mib * 2**20,
                                fwd_s={"fast": 0.010 + 0.002 * i, "slow": 0.025 + 0.004 * (i % 3)},
                                bwd_s={"fast": 0.020 + 0.004 * i, "slow": 0.050 + 0.008 * (i % 3)})
                   for i in range(n))
    return ModelProfile(model="toy", batch_size=8, layers=layers,
                        edges=tuple((i, i + 1) for i in range(n - 1)), input_bytes=act_mib * 2**20)


def small_cluster():
    return cluster([2, 2], types=[FAST, SLOW], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)


def test_single_vw_rate_is_littles_law_or_the_slowest_stage():
    c = small_cluster()
    part = partition_vw(model(), list(c.nodes[0].gpus), Topology(c), nm=1)
    assert vw_rate(part, 1) == pytest.approx(1 / part.roundtrip_s)
    assert vw_rate(part, 8) == pytest.approx(1 / part.bottleneck_s)


def test_top_ranked_plan_is_not_beaten_in_simulation_by_more_than_one_percent():
    c, p = small_cluster(), model()
    space = SearchSpace(policies=("auto",), nm_values=(1, 2, 4), staleness_values=(0, 2), top_k=3,
                        margin=0.0, waves=8, workers=1)
    result = search_plans(c, p, space)
    feasible = [x for x in result.candidates if x.feasible]
    assert len(feasible) > space.top_k + 3                  # the pruning had something to prune
    every = [_simulate((c, p, x.plan, space)).mb_s for x in feasible]
    assert result.best.simulated_mb_s >= 0.99 * max(every)


def test_ranking_is_the_same_with_one_or_two_processes():
    c, p = small_cluster(), model()
    runs = [search_plans(c, p, SearchSpace(policies=("NP", "ED", "HD"), nm_values=(1, 2), top_k=4,
                                           waves=6, workers=w)) for w in (1, 2)]
    assert [(x.policy, x.nm, x.staleness, x.simulated_mb_s) for x in runs[0].candidates] == \
        [(x.policy, x.nm, x.staleness, x.simulated_mb_s) for x in runs[1].candidates]


def test_whimpy_cluster_gets_a_multi_gpu_plan_that_simulates():
    # 8 x 64 MiB of weights (x4 with gradients, momentum, a stash) fits no 0.75 GiB GPU alone.
    c = cluster([4], types=[SLOW], intra_Bps=10e9)
    p = model(param_mib=64, act_mib=1)
    result = search_plans(c, p, SearchSpace(policies=("auto",), nm_values=(2,), top_k=2, waves=6, workers=1))
    assert result.best.feasible and len(result.best.partitions[0].gpus) > 1
    assert result.best.simulated_mb_s > 0
    assert any("does not fit" in x.reason for x in result.candidates if not x.feasible)


def test_a_model_no_virtual_worker_can_hold_is_a_clear_error():
    c = cluster([2], types=[SLOW])
    with pytest.raises(PlanError, match=r"toy \(minibatch 8\) does not fit: none of .* candidate plans"):
        search_plans(c, model(param_mib=400), SearchSpace(policies=("auto",), workers=1))


def test_horovod_uses_only_gpus_that_hold_the_model_alone():
    c = small_cluster()
    p = model(param_mib=40, act_mib=1)       # 0.94 GiB with one version: fits "fast" (2 GiB) only
    result = search_plans(c, p, SearchSpace(policies=("horovod",), top_k=1, waves=6, workers=1))
    (h,) = [x for x in result.candidates if x.policy == "horovod"]
    assert sorted(g for part in h.partitions for g in part.gpus) == ["node0/gpu0", "node0/gpu1"]
    assert h.plan.sync.mode == "bsp" and h.plan.schedule == "1f1b-flush"


def test_search_space_rejects_bad_values():
    with pytest.raises(PlanError, match="policy 'XP'"):
        SearchSpace(policies=("XP",))
    with pytest.raises(PlanError, match="Nm must be >= 1"):
        SearchSpace(nm_values=(0,))
    with pytest.raises(PlanError, match="precision 'fp8': choose from fp32, tf32, fp16, bf16"):
        SearchSpace(precision="fp8")
    with pytest.raises(PlanError, match="optimizer 'lamb'"):
        SearchSpace(optimizer="lamb")


@pytest.mark.parametrize("precision,optimizer,recompute,sync", [("bf16", "adam", False, "bsp"),
                                                                 ("fp32", "sgd", True, "bsp"),
                                                                 ("fp16", "adamw", False, "wsp")])
def test_plans_carry_how_they_train_and_the_partitioner_counts_the_memory_the_plan_check_does(
        precision, optimizer, recompute, sync):
    """Under a flush schedule the partitioner's memory is check_plan's; under hetpipe (wsp) it holds Nm
    minibatches on every stage, an upper bound of what the schedule reaches."""
    from hetsim.feasibility import check_plan
    c, p = small_cluster(), model()
    space = SearchSpace(policies=("NP", "ED"), nm_values=(1, 2), top_k=2, waves=6, workers=1, sync=sync,
                        schedule="1f1b-flush" if sync == "bsp" else "hetpipe", precision=precision,
                        optimizer=optimizer, recompute=recompute)
    feasible = [x for x in search_plans(c, p, space).candidates if x.feasible]
    assert feasible
    for x in feasible:
        assert (x.plan.precision, x.plan.optimizer, x.plan.recompute) == (precision, optimizer, recompute)
        checked = {g: m.total_bytes for g, m in check_plan(x.plan, c, p).items()}
        for part in x.partitions:
            planned = dict(zip(part.gpus, part.memory_bytes))
            if sync == "bsp":
                assert planned == {g: checked[g] for g in part.gpus}
            else:
                assert all(planned[g] >= checked[g] for g in part.gpus)


def test_adam_in_16_bit_needs_more_gpus_than_sgd_where_weights_dominate():
    # 8 layers of 64 MiB of FP32 weights on 0.75 GiB GPUs. In 16 bit SGD keeps 2.5 bytes per FP32
    # weight byte (160 MiB a layer: four fit a GPU), Adam 4.5 (288 MiB: two fit).
    c = cluster([8], types=[SLOW], intra_Bps=10e9)
    p = model(param_mib=64, act_mib=1)
    smallest = {}
    for optimizer in ("sgd", "adam"):
        space = SearchSpace(policies=("auto",), nm_values=(1,), top_k=1, waves=6, workers=1,
                            precision="bf16", optimizer=optimizer)
        fits = [x for x in search_plans(c, p, space).candidates if x.feasible]
        smallest[optimizer] = min(len(x.partitions[0].gpus) for x in fits)
    assert smallest == {"sgd": 2, "adam": 4}


def test_the_planner_imports_neither_simpy_nor_torch():
    import subprocess
    import sys
    code = ("import sys, hetsim.planner, hetsim.cli.plan; "
            "assert 'simpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


UNLIKE_NODES = """
name: small
network: {kind: ethernet, bandwidth_gbit_s: 10, latency_us: 5}
nodes:
  - {name: n0, gpus: [{type: v100, count: 2}], intra_link: {kind: nvlink, bandwidth_GBps: 150}}
  - {name: n1, gpus: [{type: t4, count: 2}], intra_link: {kind: pcie, gen: 3, lanes: 16}}
"""


def _tiny_on_unlike_nodes() -> ModelProfile:
    layers = [LayerProfile(name=f"l{i}", kind="Linear", param_bytes=10**6, output_bytes=10**5,
                           fwd_s={"v100": 0.001, "t4": 0.002}, bwd_s={"v100": 0.002, "t4": 0.004}) for i in range(3)]
    return ModelProfile(model="tiny", batch_size=8, input_bytes=1000, layers=tuple(layers), edges=((0, 1), (1, 2)))


def test_a_candidate_whose_run_has_no_steady_state_keeps_its_estimate_and_the_rest_are_ranked(tmp_path, capsys):
    """NP on a V100 node and a T4 node, 4 waves: the V100 VW ends before the T4 one has warmed up, so
    that simulation times nothing; the search lists it by its estimate, says why, ranks the others."""
    from hetsim.cli import main
    from hetsim.cluster import load_cluster
    (tmp_path / "c.yaml").write_text(UNLIKE_NODES)
    p = _tiny_on_unlike_nodes()
    result = search_plans(load_cluster(tmp_path / "c.yaml"), p, SearchSpace(waves=4, workers=1))
    timeless = [c for c in result.candidates if c.not_simulated]
    assert timeless and all(c.simulated_mb_s is None and c.feasible for c in timeless)
    assert "no steady-state window" in timeless[0].not_simulated
    assert result.simulated > 0 and result.best.simulated_mb_s is not None
    from hetsim.profile_files import save_profile
    save_profile(p, tmp_path / "p.yaml")
    assert main(["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "p.yaml"), "--jobs", "1",
                 "--waves", "4"]) == 0
    assert "listed by their estimate (~): their simulation had no steady state to time" in capsys.readouterr().out


def test_a_search_none_of_whose_simulations_has_a_steady_state_asks_for_more_waves(tmp_path):
    """NP with D = 8 in 4 waves: no candidate can be timed, so no ranking by simulation exists; the
    search says so rather than write a plan chosen by the estimate alone."""
    from hetsim.cluster import load_cluster
    (tmp_path / "c.yaml").write_text(UNLIKE_NODES)
    space = SearchSpace(policies=("NP",), staleness_values=(8,), waves=4, workers=1)
    with pytest.raises(PlanError, match=r"^none of the 4 simulated candidates had a steady state to time, e\.g\. NP "
                                        r"Nm \d D 8: no steady-state window: .*simulate more waves$"):
        search_plans(load_cluster(tmp_path / "c.yaml"), _tiny_on_unlike_nodes(), space)
