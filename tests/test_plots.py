"""Figures: what the timeline's rows are called."""

from hetsim.plots import _rows
from hetsim.trace import TraceWriter


def test_timeline_rows_name_the_node_where_two_nodes_have_a_gpu0():
    trace = TraceWriter("prediction")
    trace.row("node0", "gpu0 TITAN RTX [vw0 s0]")
    trace.row("node1", "gpu0 TITAN RTX [vw0 s1]")
    order, names = _rows(trace.to_dict())
    assert [names[r] for r in order] == ["node0/gpu0 TITAN RTX [vw0 s0]", "node1/gpu0 TITAN RTX [vw0 s1]"]
    one = TraceWriter("prediction")
    one.row("node0", "gpu0 TITAN RTX [vw0 s0]")
    order, names = _rows(one.to_dict())
    assert [names[r] for r in order] == ["gpu0 TITAN RTX [vw0 s0]"]
