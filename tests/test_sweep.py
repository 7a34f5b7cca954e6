"""`hetsim sweep`: rows equal to `hetsim simulate` bit for bit, on any number of workers, failing
points as rows, bad axes refused before any work."""

import csv
import json
from dataclasses import replace

import pytest

from hetsim.cli import main
from hetsim.data import DEFAULT_CLUSTER, resolve
from hetsim.errors import HetsimError
from hetsim.plan import load_plan, save_plan
from hetsim.report import Report
from hetsim.sweep import FIGURES, figures, grid, parse_axes

BASE = ["--waves", "6", "--jitter", "0.05", "--seed", "3"]


def _sweep(tmp_path, capsys, *args: str) -> list[dict[str, str]]:
    out = tmp_path / "sweep"
    assert main(["sweep", *BASE, "--out", str(out), "--quiet", *args]) == 0
    capsys.readouterr()
    with open(out / "sweep.csv", newline="") as f:
        return list(csv.DictReader(f))


def _simulated(capsys, *args: str) -> dict[str, str]:
    """The sweep row figures of what `hetsim simulate` reports, as the CSV writes them."""
    assert main(["simulate", *BASE, "--json", *args]) == 0
    report = Report.from_dict(json.loads(capsys.readouterr().out))
    return {k: str(v) for k, v in figures(report).items()}


def test_rows_equal_what_simulate_reports_for_edited_plans(tmp_path, capsys):
    rows = _sweep(tmp_path, capsys, "--vary", "nm=2,4", "--vary", "staleness=0,2", "--workers", "1")
    assert [(r["nm"], r["staleness"]) for r in rows] == [("2", "0"), ("2", "2"), ("4", "0"), ("4", "2")]
    plan = load_plan(resolve("plan", "hetpipe_vgg19_ed"))
    for row in (rows[1], rows[2]):
        edited = replace(plan, nm=int(row["nm"]), sync=replace(plan.sync, staleness_bound=int(row["staleness"])))
        save_plan(edited, tmp_path / "point.json")
        expected = _simulated(capsys, "--plan", str(tmp_path / "point.json"))
        assert {k: row[k] for k in FIGURES} == expected and row["error"] == ""
    assert rows[0]["samples_per_s"] != rows[2]["samples_per_s"]        # the axis changed something


def test_rows_equal_simulate_with_an_edited_cluster_and_whole_node_slowdown(tmp_path, capsys):
    rows = _sweep(tmp_path, capsys, "--vary", "network.bandwidth_gbit_s=10,56", "--vary", "slowdown.node2=1,2",
                  "--workers", "1")
    cluster = resolve("cluster", DEFAULT_CLUSTER).read_text()
    assert "bandwidth_gbit_s: 56" in cluster
    (tmp_path / "slow_net.yaml").write_text(cluster.replace("bandwidth_gbit_s: 56", "bandwidth_gbit_s: 10"))
    expected = _simulated(capsys, "--cluster", str(tmp_path / "slow_net.yaml"), "--slowdown", "node2=2")
    assert {k: rows[1][k] for k in FIGURES} == expected
    assert _simulated(capsys, "--slowdown", "node2=1") == {k: rows[2][k] for k in FIGURES}
    assert rows[0]["samples_per_s"] != rows[1]["samples_per_s"] != rows[3]["samples_per_s"]


def test_rows_are_the_same_on_a_running_dask_cluster_as_in_process(tmp_path, capsys):
    from distributed import LocalCluster
    axes = ["--vary", "seed=1,2", "--vary", "jitter=0,0.1"]
    inline = _sweep(tmp_path / "a", capsys, *axes, "--workers", "1")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        remote = _sweep(tmp_path / "b", capsys, *axes, "--scheduler", cluster.scheduler_address)
    assert remote == inline and len(inline) == 4


def test_rows_are_the_same_on_local_worker_processes_as_in_process(tmp_path, capsys):
    axes = ["--vary", "nm=2,4", "--vary", "jitter=0,0.1"]
    assert _sweep(tmp_path / "a", capsys, *axes, "--workers", "2") == _sweep(tmp_path / "b", capsys, *axes,
                                                                             "--workers", "1")


def test_a_failing_point_is_a_row_with_its_error_and_the_others_run(tmp_path, capsys):
    rows = _sweep(tmp_path, capsys, "--vary", "nm=2,64", "--workers", "1")
    assert rows[0]["error"] == "" and float(rows[0]["samples_per_s"]) > 0
    assert "lower Nm" in rows[1]["error"] and rows[1]["samples_per_s"] == ""


def test_a_sweep_whose_every_point_fails_is_refused_and_keeps_the_earlier_table(tmp_path, capsys):
    _sweep(tmp_path, capsys, "--vary", "nm=2", "--workers", "1")
    earlier = (tmp_path / "sweep" / "sweep.csv").read_text()
    code = main(["sweep", *BASE, "--vary", "nm=64,128", "--workers", "1", "--out", str(tmp_path / "sweep"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--vary: every one of the 2 points failed, e.g. nm=64: " in err and "lower Nm" in err
    assert (tmp_path / "sweep" / "sweep.csv").read_text() == earlier


def test_one_or_two_axes_are_plotted_and_three_are_not(tmp_path, capsys):
    _sweep(tmp_path / "one", capsys, "--vary", "seed=1,2", "--workers", "1")
    assert (tmp_path / "one" / "sweep" / "sweep.png").stat().st_size > 0
    _sweep(tmp_path / "three", capsys, "--vary", "seed=1", "--vary", "nm=2", "--vary", "jitter=0", "--workers", "1")
    assert not (tmp_path / "three" / "sweep" / "sweep.png").exists()


@pytest.mark.parametrize("vary, message", [
    ("speed=1,2", "--vary 'speed=1,2': unknown axis 'speed'"),
    ("nm=0,2", "axis nm: value '0': must be >= 1"),
    ("jitter=a", "axis jitter: value 'a': expected"),
    ("jitter=0,1e308", "axis jitter: value '1e308': must be <= 10"),
    ("network.bandwidth_gbit_s=0", "axis network.bandwidth_gbit_s: value '0': must be finite and > 0"),
    ("seed=", "axis seed: expected comma-separated values"),
    ("slowdown.node9=2", "--vary slowdown.node9: cluster hetpipe_4node has no GPU or node 'node9'"),
    ("slowdown.node1/gpu7=2", "no GPU or node 'node1/gpu7'"),
])
def test_a_bad_axis_is_one_line_naming_it_before_any_work(tmp_path, capsys, vary, message):
    code = main(["sweep", "--vary", vary, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_staleness_is_refused_for_a_plan_without_wsp(tmp_path, capsys):
    plan = load_plan(resolve("plan", "hetpipe_vgg19_ed"))
    save_plan(replace(plan, sync=replace(plan.sync, mode="none"), virtual_workers=plan.virtual_workers[:1]),
              tmp_path / "one_vw.json")
    code = main(["sweep", "--plan", str(tmp_path / "one_vw.json"), "--vary", "staleness=0,1",
                 "--out", str(tmp_path / "out")])
    assert code == 2 and "--vary staleness: plan" in capsys.readouterr().err


def test_a_network_axis_that_would_change_no_link_is_refused(tmp_path, capsys):
    import yaml
    doc = yaml.safe_load(resolve("cluster", "hetpipe_4node").read_text())
    for node in doc["nodes"]:
        node["network"] = {"kind": "infiniband", "bandwidth_gbit_s": 56, "latency_us": 5}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    code = main(["sweep", "--cluster", str(tmp_path / "c.yaml"), "--vary", "network.bandwidth_gbit_s=10,56",
                 "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "every node of cluster hetpipe_4node has a network of its own" in err


def test_the_grid_is_the_cartesian_product_with_the_last_axis_fastest():
    axes = parse_axes(["nm=1,2", "slowdown.node0/gpu1=1,1.5,2"])
    assert [tuple(p.values()) for p in grid(axes)] == [(1, 1.0), (1, 1.5), (1, 2.0), (2, 1.0), (2, 1.5), (2, 2.0)]
    assert grid(()) == [{}]


def test_a_scheduler_that_cannot_be_used_is_one_line(tmp_path, capsys, monkeypatch):
    import socket
    monkeypatch.setattr("hetsim.fanout.CONNECT_TIMEOUT_S", 1)
    with socket.socket() as s:                 # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address, message in (("nonsense", "--scheduler 'nonsense': missing port"),
                             (f"tcp://127.0.0.1:{port}", "cannot reach a Dask scheduler there")):
        code = main(["sweep", *BASE, "--vary", "seed=1", "--out", str(tmp_path), "--scheduler", address])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_grid_past_max_points_is_refused_before_any_point_runs(tmp_path, capsys):
    from hetsim.cli import main
    args = ["sweep", "--vary", "seed=" + ",".join(map(str, range(101))), "--vary",
            "jitter=" + ",".join(f"0.0{i}" for i in range(1, 10)) + ",0.1", "--out", str(tmp_path / "s"), "-q"]
    assert main(args + ["--max-points", "1000"]) == 2
    assert "101 x 10 = 1,010 points, more than --max-points 1,000" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_the_printed_table_keeps_distinct_axis_values_distinct():
    from hetsim.cli.sweep import format_rows
    rows = [{"seed": s, "jitter": 0.02, "samples_per_s": 1.0, "error": ""} for s in (1234567, 1234568)]
    table = format_rows(rows, ["seed", "jitter"])
    assert "1234567" in table and "1234568" in table


def test_a_figure_that_cannot_be_drawn_keeps_the_table_and_says_so(tmp_path, capsys, monkeypatch):
    import hetsim.plots

    def cannot(*args):                   # as matplotlib does for axis values it cannot lay out (1e308)
        raise ValueError("arange: cannot compute length")
    monkeypatch.setattr(hetsim.plots, "plot_sweep", cannot)
    out = tmp_path / "sweep"
    assert main(["sweep", *BASE, "--vary", "nm=2,4", "--out", str(out), "--quiet"]) == 0
    assert "warning: sweep.png not drawn (arange: cannot compute length)" in capsys.readouterr().err
    assert (out / "sweep.csv").is_file() and not (out / "sweep.png").exists()


def test_axes_must_be_a_list_of_strings_not_one_string():
    with pytest.raises(HetsimError, match="expected a list of 'NAME=V1,V2,...' strings"):
        parse_axes("nm=2")


def test_a_point_too_short_for_a_steady_state_carries_simulates_note_in_its_row(tmp_path, capsys):
    rows = _sweep(tmp_path, capsys, "--vary", "waves=2,12", "--workers", "1")
    assert "no wave to spare after warm-up" in rows[0]["notes"] and "no wave to spare" not in rows[1]["notes"]
