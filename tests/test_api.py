"""The Python API takes what the CLI takes, with the CLI's defaults, and says in one line what it refuses."""

from __future__ import annotations

import pytest

import hetsim
from hetsim.data import DEFAULT_PLAN, pipedream_profile
from hetsim.errors import HetsimError, PlanError, SpecError
from hetsim.planner import SearchSpace
from hetsim.profile_files import load_profile, save_profile


@pytest.mark.parametrize("waves", [1, 2])
def test_a_short_run_gets_the_clis_warm_up_not_an_error(waves):
    report = hetsim.simulate(waves=waves, trace=False)
    assert report.settings["warmup_waves"] == waves - 1


def test_a_run_whose_only_counted_wave_is_its_drain_says_so():
    noted = lambda r: any("final drain" in n for n in r.notes)
    assert noted(hetsim.simulate(waves=3, warmup_waves=2, trace=False))
    assert not noted(hetsim.simulate(waves=4, warmup_waves=2, trace=False))


@pytest.mark.parametrize("kwargs, message", [
    ({"straggler_prob": 2.0}, "straggler_prob: must be in [0, 1], got 2.0"),
    ({"straggler_delay_s": float("inf")}, "straggler_delay_s: must be finite and >= 0, got inf"),
    ({"jitter_cv": 1e308}, "jitter_cv: must be in [0, 10], got 1e+308"),
    ({"slowdown": {"node9/gpu0": "1.5"}}, "slowdown"),
    ({"slowdown": {"node2": None}}, "slowdown"),
])
def test_bad_options_are_one_line_naming_the_field(kwargs, message):
    with pytest.raises(HetsimError) as info:
        hetsim.simulate(waves=4, **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("load", [hetsim.load_cluster, hetsim.load_plan, hetsim.load_profile])
@pytest.mark.parametrize("value", [None, 3, ""])
def test_a_loader_given_no_path_says_what_it_expected(load, value):
    with pytest.raises(SpecError, match="expected a file path or a shipped name"):
        load(value)


def test_a_folder_named_like_a_shipped_file_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_PLAN).mkdir()                      # e.g. `hetsim simulate --out hetpipe_vgg19_ed`
    assert hetsim.load_plan(DEFAULT_PLAN).name == hetsim.simulate(waves=3, trace=False).plan["name"]
    (tmp_path / "mine").mkdir()
    with pytest.raises(SpecError, match="mine: a folder, not a plan file"):
        hetsim.load_plan("mine")


@pytest.mark.parametrize("field, value", [("top_k", "5"), ("margin", "x"), ("workers", "2"), ("keep", None),
                                          ("jitter_cv", float("nan")), ("waves", 2.5)])
def test_a_search_space_field_of_the_wrong_type_is_named(field, value):
    with pytest.raises(PlanError, match=f"search: {field}: expected"):
        SearchSpace(**{field: value})


@pytest.mark.parametrize("batch", [-1, 0, 2.5, float("nan"), "32", True])
def test_a_graph_txt_batch_size_must_be_a_whole_number_of_samples(batch):
    with pytest.raises(SpecError, match=r"batch_size \(--graph-batch\): expected a whole number >= 1"):
        load_profile(pipedream_profile("vgg16"), graph_batch_size=batch)


def test_a_graph_txt_needs_a_gpu_type_name():
    with pytest.raises(SpecError, match=r"gpu_type \(--graph-gpu\)"):
        load_profile(pipedream_profile("vgg16"), graph_gpu_type=None)


def test_a_profile_is_not_saved_where_it_would_read_back_as_graph_txt(tmp_path):
    with pytest.raises(SpecError, match="read as PipeDream's graph.txt"):
        save_profile(hetsim.load_profile(hetsim.data.DEFAULT_PROFILE), tmp_path / "m.txt")
    assert not (tmp_path / "m.txt").exists()
