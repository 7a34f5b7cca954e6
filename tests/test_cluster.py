from pathlib import Path

import pytest

from hetsim.cluster import load_cluster
from hetsim.errors import PlanError, SpecError
from hetsim.gpu import load_gpu_types
from hetsim.topology import Topology

GOOD = """
name: tiny
network: {kind: ethernet, bandwidth_gbit_s: 10, latency_us: 20}
nodes:
  - name: a
    gpus: [{type: titan-v, count: 2}]
    intra_link: {kind: pcie, gen: 3, lanes: 16}
  - name: b
    gpus: [{type: rtx-2060}]
    intra_link: {kind: nvlink, bandwidth_GBps: 25}
"""


def write(tmp_path, text, name="cluster.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_gpu_types_cite_sources_and_cover_the_hetpipe_cluster():
    types = load_gpu_types()
    for name in ["titan-v", "titan-rtx", "rtx-2060", "quadro-p4000", "p100", "v100", "t4",
                 "rtx-3090", "a100", "h100"]:
        assert types[name].sources
    assert types["titan-v"].peak_fp32_flops == 14.9e12
    assert types["rtx-2060"].memory_gib == 6


def test_hetpipe_cluster_has_four_nodes_of_four_gpus():
    c = load_cluster("hetpipe_4node")
    assert [n.gpus[0].type.name for n in c.nodes] == ["titan-v", "titan-rtx", "rtx-2060", "quadro-p4000"]
    assert len(c.gpus) == 16 and c.network.bandwidth_Bps == 56e9 / 8
    assert c.nodes[0].intra_link.bandwidth_Bps == pytest.approx(15.76e9)


def test_units_are_converted_once_at_load(tmp_path):
    c = load_cluster(write(tmp_path, GOOD))
    assert c.network.bandwidth_Bps == 1.25e9 and c.network.latency_s == pytest.approx(20e-6)
    assert c.node("b").intra_link.bandwidth_Bps == 25e9
    assert [g.id for g in c.gpus] == ["a/gpu0", "a/gpu1", "b/gpu0"]


@pytest.mark.parametrize("edit,message", [
    (("network: {kind: ethernet, bandwidth_gbit_s: 10, latency_us: 20}\n", ""), "cluster.yaml: network: missing"),
    (("bandwidth_gbit_s: 10", "bandwidth_gbit_s: -10"), "cluster.yaml: network.bandwidth_gbit_s: must be > 0, got -10"),
    (("type: rtx-2060", "type: rtx-2070"), "cluster.yaml: nodes[1].gpus[0].type: unknown GPU type 'rtx-2070'; did you mean 'rtx-2060'?"),
    (("gen: 3", "gen: 9"), "cluster.yaml: nodes[0].intra_link.gen: PCIe generation 9 unknown (1-6)"),
    (("count: 2", "count: two"), "cluster.yaml: nodes[0].gpus[0].count: expected a number, got text 'two'"),
    (("lanes: 16", "lanes: 16, speed: 3"), "cluster.yaml: nodes[0].intra_link.speed: unknown field"),
    (("name: b", "name: ' '"), "cluster.yaml: nodes[1].name: ' ': a node's name is some text without '/'"),
    (("name: tiny\n", "name: tiny\ngpu_types:\n" + 2 * (
        "  - {name: x, display_name: X, memory_gib: 8, memory_bandwidth_GBps: 400, peak_fp32_tflops: 10,"
        " peak_fp16_tflops: 20, sources: [datasheet]}\n")),
     "cluster.yaml: gpu_types[1].name: 'x' is defined twice in this file"),
    (("name: tiny\n", "name: tiny\ngpu_types:\n"
      "  - {name: x, display_name: X, memory_gib: 8, memory_bandwidth_GBps: 400, peak_fp32_tflops: 10,"
      " peak_fp16_tflops: 20, sources: [datasheet], efficiency: {compte: 0.5}}\n"),
     "cluster.yaml: gpu_types[0].efficiency.compte: unknown factor; a key is one of compute, memory"),
])
def test_bad_cluster_files_name_the_file_and_field(tmp_path, edit, message):
    old, new = edit
    with pytest.raises(SpecError) as err:
        load_cluster(write(tmp_path, GOOD.replace(old, new)))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_colocated_work_is_read_for_nodes_sharing_cores(tmp_path):
    text = GOOD.replace("    intra_link: {kind: nvlink", "    shared_cores: 2\n    colocated_work: 1.1\n    intra_link: {kind: nvlink")
    c = load_cluster(write(tmp_path, text))
    assert c.node("b").colocated_work == 1.1 and c.node("a").colocated_work == 1.0
    with pytest.raises(SpecError, match=r"nodes\[1\]\.colocated_work: must be > 0, got 0"):
        load_cluster(write(tmp_path, text.replace("colocated_work: 1.1", "colocated_work: 0")))
    with pytest.raises(SpecError, match=r"nodes\[1\]\.colocated_work: applies to processes sharing cores"):
        load_cluster(write(tmp_path, text.replace("    shared_cores: 2\n", "")))


def test_copy_cores_are_read_for_nodes_sharing_cores(tmp_path):
    text = GOOD.replace("    intra_link: {kind: nvlink", "    shared_cores: 1\n    copy_cores: 16\n    intra_link: {kind: nvlink")
    c = load_cluster(write(tmp_path, text))
    assert c.node("b").copy_cores == 16 and c.node("a").copy_cores is None
    with pytest.raises(SpecError, match=r"nodes\[1\]\.copy_cores: applies to processes sharing cores"):
        load_cluster(write(tmp_path, text.replace("    shared_cores: 1\n", "")))


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(SpecError, match=r"cluster.yaml: line \d+"):
        load_cluster(write(tmp_path, "name: [unclosed\n"))


def test_unknown_gpu_id_suggests_the_nearest(tmp_path):
    c = load_cluster(write(tmp_path, GOOD))
    with pytest.raises(PlanError, match="did you mean 'a/gpu1'"):
        c.gpu("a/gpu11")


def test_routes_cross_the_links_a_transfer_really_uses(tmp_path):
    t = Topology(load_cluster(write(tmp_path, GOOD)))
    assert t.route("a/gpu0", "a/gpu1").links == ("a/gpu0:out", "a/gpu1:in")
    assert t.route("a/gpu0", "b/gpu0").links == ("a/gpu0:out", "a:nic:out", "b:nic:in", "b/gpu0:in")
    assert t.route("a/host", "b/gpu0").links == ("a:nic:out", "b:nic:in", "b/gpu0:in")
    assert t.route("a/gpu0", "b/gpu0").latency_s == pytest.approx(20e-6)
    assert t.bottleneck_Bps("a/gpu0", "b/gpu0") == 1.25e9


@pytest.mark.parametrize("name", ["hetpipe_4node", "cpu_host", "sdpipe_16x4", "pipedream_cluster_a"])
def test_a_cluster_written_as_a_document_reads_back_equal(tmp_path, name):
    import yaml

    from hetsim.cluster import cluster_document
    cluster = load_cluster(name)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster_document(cluster)))
    assert load_cluster(path, gpu_types={}) == cluster          # its GPU types travel inline


def test_every_field_of_a_cluster_with_measured_figures_reads_back_bit_for_bit(tmp_path):
    import yaml
    from dataclasses import replace

    from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node, NodePath, cluster_document
    from hetsim.gpu import gpu_type_document, load_gpu_types
    h100 = replace(load_gpu_types()["h100"], display_name="an H100 measured here", peak_fp32_flops=61.37e12,
                   memory_bandwidth_Bps=3.0123456789e12, framework_reserve_bytes=1234567891,
                   efficiency={"compute": 0.61})
    odd = LinkSpec(kind="loopback", bandwidth_Bps=2220008047.3229337, latency_s=2.93e-4,
                   collective_latency_s=2.7183e-3)
    nodes = (Node(name="a", gpus=tuple(GpuSlot(id=f"a/gpu{i}", node="a", index=i, type=h100) for i in range(2)),
                  intra_link=odd, shared_cores=1.75, colocated_work=1.037, copy_cores=16,
                  nic=LinkSpec(kind="ethernet", bandwidth_Bps=1.25e9, latency_s=5e-5), nic_per_gpu=True),
             Node(name="b", gpus=(GpuSlot(id="b/gpu0", node="b", index=0, type=h100),), intra_link=odd))
    cluster = Cluster(name="measured", nodes=nodes, network=LinkSpec(kind="ethernet", bandwidth_Bps=1e9, latency_s=1e-5),
                      ps_nodes=("b",), description="every field",
                      paths=(NodePath(nodes=("a", "b"), link=LinkSpec(kind="ethernet", bandwidth_Bps=3.3e8, latency_s=2e-3)),))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster_document(cluster)))
    back = load_cluster(path)                 # the inline h100 wins over the shipped one of that name
    assert back == cluster
    assert gpu_type_document(back.gpus[0].type) == gpu_type_document(h100)      # efficiency included


def test_two_gpu_types_of_one_name_cannot_be_written(tmp_path):
    from dataclasses import replace

    from hetsim.cluster import cluster_document
    cluster = load_cluster("hetpipe_4node")
    first = cluster.nodes[0]
    other = replace(first.gpus[0].type, peak_fp32_flops=1.0)
    node = replace(first, gpus=(first.gpus[0], replace(first.gpus[1], type=other)))
    with pytest.raises(SpecError, match="two different GPU types are named"):
        cluster_document(replace(cluster, nodes=(node, *cluster.nodes[1:])))


def test_a_node_sharing_a_fraction_of_the_cores_reads_back_with_its_copy_cores(tmp_path):
    import yaml
    from dataclasses import replace

    from hetsim.cluster import cluster_document
    cluster = load_cluster("cpu_host")
    node = replace(cluster.nodes[0], shared_cores=1.75, copy_cores=16, colocated_work=1.04)
    cluster = replace(cluster, nodes=(node,))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster_document(cluster)))
    back = load_cluster(path).nodes[0]
    assert (back.shared_cores, back.copy_cores, back.colocated_work) == (1.75, 16, 1.04)


def test_every_shipped_cluster_loads_and_names_its_nodes_gpus():
    shipped = sorted((Path(__file__).resolve().parents[1] / "gpu_profiles" / "clusters").glob("*.yaml"))
    assert len(shipped) >= 6
    for path in shipped:
        cluster = load_cluster(path)
        assert cluster.gpus and all(g.node in {n.name for n in cluster.nodes} for g in cluster.gpus), path.name
