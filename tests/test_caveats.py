"""hetsim.caveats: the notes a report and hetsim plan's ranking share name only the GPUs they are given."""

import hetsim
from hetsim.caveats import caveats


def test_the_memory_and_bf16_notes_name_the_types_of_the_gpus_given_or_of_the_whole_cluster():
    cluster, profile = hetsim.load_cluster("hetpipe_4node"), hetsim.load_profile("vgg19_b32_analytic")
    node0 = [g.id for g in cluster.gpus if g.node == "node0"]
    one = caveats(profile, cluster, {(cluster.gpu(node0[0]).type.name, 1)}, "bf16", node0)
    every = caveats(profile, cluster, {(cluster.gpu(node0[0]).type.name, 1)}, "bf16")
    kind = cluster.gpu(node0[0]).type.name
    assert any(n.startswith(f"bf16: {kind} has no BF16 units") for n in one)
    assert any(n.startswith("bf16: quadro-p4000, rtx-2060, titan-rtx, titan-v have no BF16 units") for n in every)
    assert any(n.startswith(f"memory: {kind} names no framework_reserve_gib") for n in one)
    assert not any(n.startswith("bf16") for n in caveats(profile, cluster, {(kind, 1)}, "fp32"))
