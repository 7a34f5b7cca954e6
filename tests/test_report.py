"""A report reads back with everything written beside it, and writing one leaves no file of another."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import hetsim
from hetsim.compare import compare_reports
from hetsim.data import DEFAULT_PLAN
from hetsim.errors import HetsimError
from hetsim.plots import plot_report
from hetsim.report import Report

ARGS = dict(waves=4, seed=1, jitter_cv=0.1)


def test_load_then_write_loses_no_record_and_no_trace(tmp_path):
    report = hetsim.simulate(**ARGS)
    report.write(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = Report.load(tmp_path / "report.json")
    assert again.staleness_local == report.staleness_local and again.staleness_global == report.staleness_global
    again.write(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_untraced_report_written_over_a_traced_one_leaves_no_trace_of_it(tmp_path):
    hetsim.simulate(**ARGS).write(tmp_path)
    assert (tmp_path / "trace.json").is_file()
    hetsim.simulate(**{**ARGS, "seed": 2}, trace=False).write(tmp_path)
    assert not (tmp_path / "trace.json").exists() and (tmp_path / "report.json").is_file()


def test_figures_go_only_when_the_writer_says_it_draws_none(tmp_path):
    report = hetsim.simulate(**ARGS)
    (tmp_path / "timeline.png").write_bytes(b"an earlier prediction's figure")
    report.write(tmp_path)
    assert (tmp_path / "timeline.png").exists()            # the Python habit: write, then plot_report
    report.write(tmp_path, drop_figures=True)              # the executor's: its report draws none
    assert not (tmp_path / "timeline.png").exists()


def _file(folder, text):
    (folder / "x.json").write_text(text)
    return folder / "x.json"


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "none.json", "cannot read"),
    (lambda d: d, "cannot read"),
    (lambda d: _file(d, "{"), "not JSON"),
    (lambda d: _file(d, json.dumps({"kind": "prediction"})), "not a hetsim report"),
    (lambda d: _file(d, hetsim.load_plan(DEFAULT_PLAN).to_json()), "not a hetsim report"),
])
def test_a_file_that_is_no_report_is_one_line_naming_it(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(HetsimError, match=message) as info:
        Report.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_reports_of_different_plans_are_not_compared():
    a = hetsim.simulate(waves=4)
    b = replace(hetsim.simulate(waves=4, seed=1), kind="measurement")
    plan = hetsim.load_plan(DEFAULT_PLAN)
    fewer = hetsim.simulate(plan=replace(plan, virtual_workers=plan.virtual_workers[:2]), waves=4)
    with pytest.raises(HetsimError, match="place different GPUs"):
        compare_reports(a, fewer)
    with pytest.raises(HetsimError, match="expected a Report"):
        compare_reports(a, None)
    assert compare_reports(a, b)


def test_figures_are_drawn_into_a_folder_made_for_them(tmp_path):
    paths = plot_report(hetsim.simulate(**ARGS), tmp_path / "new" / "figures")
    assert paths and all(p.is_file() for p in paths)


def test_only_report_json_takes_the_tables_beside_it_and_a_bad_trace_is_one_line(tmp_path):
    report = hetsim.simulate(**ARGS)
    report.write(tmp_path)
    (tmp_path / "prediction.json").write_text(report.to_json())       # validate-style names share a folder
    assert Report.load(tmp_path / "prediction.json").staleness_global == []
    (tmp_path / "trace.json").write_text("{")
    with pytest.raises(HetsimError, match=r"trace.json: not a trace hetsim wrote"):
        Report.load(tmp_path / "report.json")
    (tmp_path / "trace.json").unlink()
    (tmp_path / "staleness_local.csv").write_text("a,b\n1,2\n")
    with pytest.raises(HetsimError, match=r"staleness_local.csv: not the table a report writes"):
        Report.load(tmp_path / "report.json")
