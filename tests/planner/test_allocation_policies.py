"""HetPipe's allocation policies on its 4-node cluster, as literal tables."""

import pytest

import hetsim
from hetsim.errors import PlanError
from hetsim.planner.allocation import allocate


@pytest.fixture(scope="module")
def hetpipe():
    return hetsim.load_cluster("hetpipe_4node")


def test_np_gives_each_node_one_virtual_worker(hetpipe):
    (alloc,) = allocate(hetpipe, "NP")
    assert alloc.groups == tuple(tuple(f"node{n}/gpu{g}" for g in range(4)) for n in range(4))


def test_ed_gives_each_virtual_worker_one_gpu_of_every_node(hetpipe):
    (alloc,) = allocate(hetpipe, "ED")
    assert alloc.groups == tuple(tuple(f"node{n}/gpu{v}" for n in range(4)) for v in range(4))


def test_hd_pairs_the_fastest_node_with_the_slowest(hetpipe):
    # Peak FP32: TITAN RTX (node1) > TITAN V (node0) > RTX 2060 (node2) > Quadro P4000 (node3).
    (alloc,) = allocate(hetpipe, "HD")
    assert alloc.groups == (
        ("node1/gpu0", "node1/gpu1", "node3/gpu0", "node3/gpu1"),
        ("node1/gpu2", "node1/gpu3", "node3/gpu2", "node3/gpu3"),
        ("node0/gpu0", "node0/gpu1", "node2/gpu0", "node2/gpu1"),
        ("node0/gpu2", "node0/gpu3", "node2/gpu2", "node2/gpu3"),
    )


def test_auto_contains_the_named_policies_once_each_and_node_subsets(hetpipe):
    allocs = allocate(hetpipe, "auto")
    groups = [a.groups for a in allocs]
    assert len(set(groups)) == len(groups)
    for policy in ("NP", "ED", "HD"):
        assert allocate(hetpipe, policy)[0].groups in groups
    assert any(a.policy == "DP" and a.n_gpus == 16 for a in allocs)
    assert any(a.policy == "ED-node3" and a.n_gpus == 12 for a in allocs)


def test_unknown_policy_is_an_error(hetpipe):
    with pytest.raises(PlanError, match="policy 'XX'"):
        allocate(hetpipe, "XX")
