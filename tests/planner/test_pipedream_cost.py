"""PipeDream's cost model: closed forms first, then the configurations it picks on literal models."""

from __future__ import annotations

import numpy as np
import sys

import pytest

import hetsim
from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.errors import PlanError
from hetsim.gpu import GpuType
from hetsim.planner.chain import stage_time
from hetsim.planner.hetero import VwPartition
from hetsim.planner.pipedream_cost import (candidate_estimate, cluster_levels, cut_s, pipedream_config,
                                           stage_s, sync_s, without_input_time)
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.topology import Topology

GPU = GpuType(name="g", display_name="g", memory_bytes=2**40, memory_bandwidth_Bps=1e12,
              peak_fp32_flops=1e13, peak_fp16_flops=1e13, sources=("test",))


def cluster(servers: int, per_server: int, intra_Bps: float, inter_Bps: float, gpu: GpuType = GPU) -> Cluster:
    nodes = tuple(Node(name=f"n{s}", gpus=tuple(GpuSlot(id=f"n{s}/gpu{i}", node=f"n{s}", index=i, type=gpu)
                                                for i in range(per_server)),
                       intra_link=LinkSpec(kind="pcie", bandwidth_Bps=intra_Bps, latency_s=0.0))
                  for s in range(servers))
    return Cluster(name="t", nodes=nodes, network=LinkSpec(kind="ethernet", bandwidth_Bps=inter_Bps, latency_s=0.0),
                   ps_nodes=("n0",))


def chain_profile(compute_s: list[float], param_bytes: list[int], out_bytes: list[int]) -> ModelProfile:
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=w, output_bytes=a,
                                fwd_s={"g": c / 3}, bwd_s={"g": 2 * c / 3})
                   for i, (c, w, a) in enumerate(zip(compute_s, param_bytes, out_bytes)))
    return ModelProfile(model="chain", batch_size=1, layers=layers,
                        edges=tuple((i, i + 1) for i in range(len(layers) - 1)), input_bytes=0)


def test_sync_is_four_times_the_ring_share_of_the_weights_over_the_bandwidth():
    assert sync_s(4e9, 1, 1e9) == 0.0
    assert sync_s(4e9, 2, 1e9) == pytest.approx(8.0)          # 4 * 1 * 4e9 / (2 * 1e9)
    assert sync_s(4e9, 4, 1e9) == pytest.approx(12.0)         # 4 * 3 * 4e9 / (4 * 1e9)


def test_stage_time_is_the_larger_of_compute_and_sync_over_the_replicas():
    assert stage_s(8.0, 4e9, 4, 1e9) == pytest.approx(12.0 / 4)     # sync-bound
    assert stage_s(20.0, 4e9, 4, 1e9) == pytest.approx(20.0 / 4)    # compute-bound
    compute, weights = np.array([1.0, 5.0, 0.2]), np.array([1e8, 3e9, 0.0])
    for r in (1, 2, 3, 8):
        np.testing.assert_allclose(stage_s(compute, weights, r, 2e9), stage_time(compute, weights, r, 2e9))


def test_a_cut_costs_activations_and_gradients():
    assert cut_s(1e9, 1e9) == pytest.approx(2.0)


def test_levels_of_pipedreams_clusters():
    a = cluster_levels(hetsim.load_cluster("pipedream_cluster_a"))
    b = cluster_levels(hetsim.load_cluster("pipedream_cluster_b"))
    assert a == [(4, pytest.approx(15.76e9)), (4, pytest.approx(10e9 / 8))]
    assert b == [(8, pytest.approx(150e9)), (2, pytest.approx(25e9 / 8))]
    assert cluster_levels(cluster(1, 4, 1e9, 1e9)) == [(4, 1e9)]


def test_mixed_gpu_types_are_refused_by_name():
    with pytest.raises(PlanError, match="one GPU type.*hetpipe|rtx"):
        cluster_levels(hetsim.load_cluster("hetpipe_4node"))


def test_weightless_front_is_replicated_and_heavy_tail_kept_whole():
    # Layer 0: 3 s, no weights; layer 1: 1 s with weights too heavy to replicate; 4 GPUs in one server.
    profile = chain_profile([3.0, 1.0], [0, 10**12], [0, 0])
    config = pipedream_config(profile, cluster(1, 4, 1e9, 1e9))
    assert config.label == "3-1"
    assert [s.layers for s in config.stages] == [(0,), (1,)]
    assert config.bottleneck_s == pytest.approx(1.0)


def test_heavy_weights_everywhere_give_a_straight_pipeline():
    profile = chain_profile([1.0, 1.0], [10**12, 10**12], [0, 0])
    config = pipedream_config(profile, cluster(1, 2, 1e9, 1e9))
    assert config.label == "straight" and config.bottleneck_s == pytest.approx(1.0)


def test_pipedreams_optimum_sends_16_bit_activations_at_half_the_bytes():
    # Weights too heavy to replicate. At FP32 the cut (activation and gradient of 1 GB at 1 GB/s) takes
    # 2 s, as long as the whole model on one GPU; in 16 bit 1 s, and the straight pipeline wins.
    from hetsim.planner.pipedream_cost import optimum_line
    profile = chain_profile([1.0, 1.0], [10**12, 10**12], [10**9, 0])
    fp32, half = (optimum_line(profile, cluster(1, 2, 1e9, 1e9), scale) for scale in (1.0, 0.5))
    assert " 0.5 samples/s" in fp32 and "straight over 2 GPUs, 1.0 samples/s" in half, (fp32, half)


def test_weightless_model_is_plain_data_parallelism_over_every_gpu():
    # A cut costs 4 GB / 1 GB/s = 4 s inside a server, more across: replicate the whole model.
    profile = chain_profile([2.0, 2.0], [0, 0], [2 * 10**9, 0])
    config = pipedream_config(profile, cluster(2, 2, 1e9, 1e8))
    assert config.label == "4" and config.bottleneck_s == pytest.approx(1.0)


def test_hierarchy_multiplies_inner_replicas_by_the_servers_of_the_outer_stage():
    # Tiny weights and fast links: data parallelism over 4 GPUs (1 s per minibatch) is the optimum.
    profile = chain_profile([3.0, 1.0], [1, 1], [10**9, 0])
    config = pipedream_config(profile, cluster(2, 2, 1e12, 1e12))
    assert config.label == "4"
    assert config.bottleneck_s == pytest.approx(1.0, rel=1e-6)
    # Weights too heavy to all-reduce inside a server (1 GB/s) but not across servers (1 TB/s): each
    # server runs the straight pipeline 1-1, and the one outer stage replicates it over both: 2-2.
    heavy = pipedream_config(chain_profile([1.0, 1.0], [10**10, 10**10], [0, 0]), cluster(2, 2, 1e9, 1e12))
    assert heavy.label == "2-2"
    assert heavy.bottleneck_s == pytest.approx(max(1.0, 4 * 2e10 / (2 * 1e12)) / 2)


def test_input_node_time_is_left_out_as_pipedream_does():
    profile = chain_profile([5.0, 1.0], [0, 0], [0, 0])
    profile = type(profile)(**{**profile.__dict__, "layers": (
        LayerProfile(name="in", kind="Input0", param_bytes=0, output_bytes=0, fwd_s={"g": 5.0}, bwd_s={"g": 0.0}),
        profile.layers[1])})
    assert without_input_time(profile).layers[0].fwd_s == {"g": 0.0}
    assert without_input_time(profile).layers[1] == profile.layers[1]


def vw(gpus, compute, weights, transfer_bytes) -> VwPartition:
    n = len(gpus)
    return VwPartition(gpus=tuple(gpus), boundaries=tuple(range(n + 1)), compute_s=tuple(compute),
                       transfer_s=tuple(0.0 for _ in transfer_bytes), transfer_bytes=tuple(transfer_bytes),
                       param_bytes=tuple(weights), stage_s=tuple(compute), memory_bytes=tuple(0 for _ in gpus))


def test_candidate_estimate_of_two_pipelines_closed_form():
    c = cluster(1, 4, 1e9, 1e9)
    topo = Topology(c)
    parts = [vw(["n0/gpu0", "n0/gpu1"], [0.4, 0.2], [10**8, 10**9], [10**8]),
             vw(["n0/gpu2", "n0/gpu3"], [0.5, 0.2], [10**8, 10**9], [10**8])]
    est = candidate_estimate(parts, topo)
    # stage 0: max(0.5, 4*1*1e8/(2e9) = 0.2) / 2 = 0.25; stage 1: max(0.2, 4e9/2e9 = 2.0) / 2 = 1.0;
    # cut 0: 2e8 / 1e9 / 2 = 0.1. The sync of stage 1 is the bottleneck.
    assert est.minibatches_per_s == pytest.approx(1.0)
    assert est.bottleneck == "sync stage 1"
    one = candidate_estimate(parts[:1], topo)
    assert one.minibatches_per_s == pytest.approx(1 / 0.4) and one.bottleneck == "stage 0"


def test_plan_with_pipedreams_cost_model_ranks_by_its_formulas_without_simulating(capsys):
    from hetsim.cli import main
    from hetsim.data import pipedream_profile
    assert main(["plan", "--cluster", "pipedream_cluster_a", "--model", str(pipedream_profile("vgg16")),
                 "--graph-gpu", "v100", "--graph-batch", "128", "--policies", "ED,horovod", "--nm", "1,2",
                 "--cost-model", "pipedream", "--jobs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "PipeDream's optimizer on pipedream_cluster_a: 12-1-1 over 14 GPUs" in out
    rows = [line for line in out.splitlines() if line.strip()[:2].strip().isdigit()]
    assert "0 simulated" in out and rows and all("*" not in r for r in rows)     # estimates only
    assert rows[0].split()[1] == "horovod"          # the flat ring all-reduce beats ED's 10 Gbit/s cuts


def _experiment(name: str):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "experiments" / name / "run.py"
    spec = importlib.util.spec_from_file_location(f"{name}_experiment", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_pipedream_experiment_quick_reproduces_vgg16_15_1_flat_on_cluster_a(tmp_path, capsys):
    assert _experiment("pipedream").main(["--quick", "--out", str(tmp_path)]) == 0
    row = next(line for line in (tmp_path / "configurations.md").read_text().splitlines() if "| A | vgg16" in line)
    assert "| 15-1 | 12-1-1 (14 GPUs) |" in row and "| 15-1 (16 GPUs) |" in row


def test_antichain_experiment_quick_writes_table1_with_paper_times(tmp_path, capsys):
    assert _experiment("antichain").main(["--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table1.md").read_text()
    assert "| vgg16 | 4 | 41 | 42 (all) |" in table and "| 0.01 |" in table
