"""hetsim.slowdown: node names stand for their GPUs, GPUs keep their own factors, and the planner's
view of a slowed GPU is a type whose times are the factor times the original."""

import json

import pytest

import hetsim
from hetsim.cli import main
from hetsim.errors import HetsimError
from hetsim.slowdown import gpu_factors, slowed_types


@pytest.fixture(scope="module")
def cluster():
    return hetsim.load_cluster("hetpipe_4node")


def test_a_node_means_each_of_its_gpus_and_a_named_gpu_keeps_its_own_factor(cluster):
    assert gpu_factors(cluster, {"node2": 1.5, "node2/gpu3": 3.0, "node0/gpu1": 2.0}) == {
        "node0/gpu1": 2.0, "node2/gpu0": 1.5, "node2/gpu1": 1.5, "node2/gpu2": 1.5, "node2/gpu3": 3.0}


def test_an_unknown_gpu_or_node_is_named(cluster):
    with pytest.raises(HetsimError, match="--slowdown 'node7=2': cluster hetpipe_4node has no GPU or node 'node7'"):
        gpu_factors(cluster, {"node7": 2.0})


def test_slowed_gpus_become_types_with_scaled_times_and_the_rest_stay(cluster):
    profile = hetsim.load_profile("vgg19_b32_analytic")
    slowed, scaled = slowed_types(cluster, profile, {"node1/gpu0": 2.0})
    assert slowed.gpu("node1/gpu0").type.name == "titan-rtx(x2)"
    assert slowed.gpu("node1/gpu1").type == cluster.gpu("node1/gpu1").type
    fwd, bwd = scaled.stage_times("titan-rtx(x2)", 0, 44)
    assert (fwd, bwd) == pytest.approx(tuple(2 * t for t in profile.stage_times("titan-rtx", 0, 44)), rel=1e-12)
    assert scaled.stage_times("titan-rtx", 3, 9) == profile.stage_times("titan-rtx", 3, 9)
    assert slowed_types(cluster, profile, {}) == (cluster, profile)


def test_simulate_slowdown_of_a_node_equals_slowing_each_of_its_gpus(capsys):
    reports = []
    for args in (["--slowdown", "node2=1.5"], [a for i in range(4) for a in ("--slowdown", f"node2/gpu{i}=1.5")]):
        assert main(["simulate", "--waves", "6", "--json", *args]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0] == reports[1]
    assert reports[0]["settings"]["slowdown"] == {f"node2/gpu{i}": 1.5 for i in range(4)}


def test_the_python_api_takes_a_node_name_as_the_command_line_does():
    import hetsim
    by_node = hetsim.simulate(waves=4, slowdown={"node1": 2}, trace=False)
    by_gpu = hetsim.simulate(waves=4, slowdown={f"node1/gpu{i}": 2 for i in range(4)}, trace=False)
    assert by_node.throughput == by_gpu.throughput and by_node.settings["slowdown"] == by_gpu.settings["slowdown"]
    with pytest.raises(HetsimError, match="slowdown 'node9=2': cluster hetpipe_4node has no GPU or node 'node9'"):
        hetsim.simulate(waves=4, slowdown={"node9": 2})
