"""hetsim.outputs: whole files or none, and a command's several files together."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetsim.errors import HetsimError
from hetsim.outputs import staged, write_text


def test_write_text_makes_the_folders_and_gives_the_file_the_umasks_mode(tmp_path):
    path = tmp_path / "a" / "b" / "plan.json"
    old = os.umask(0o022)
    try:
        write_text(path, "{}\n")
    finally:
        os.umask(old)
    assert path.read_text() == "{}\n" and path.stat().st_mode & 0o777 == 0o644
    write_text(path, "[]\n")                                     # replaced whole
    assert path.read_text() == "[]\n" and os.listdir(path.parent) == ["plan.json"]


def test_write_text_refuses_a_folder_in_the_way_in_one_line_leaving_nothing_beside_it(tmp_path):
    (tmp_path / "p.yaml").mkdir()
    with pytest.raises(HetsimError, match=r"p.yaml: cannot write it \(.*\)$"):
        write_text(tmp_path / "p.yaml", "x")
    (tmp_path / "f.txt").write_text("kept")
    with pytest.raises(HetsimError, match=r"y.yaml: cannot write it"):
        write_text(tmp_path / "f.txt" / "y.yaml", "x")               # a file where a folder must go
    assert sorted(os.listdir(tmp_path)) == ["f.txt", "p.yaml"] and os.listdir(tmp_path / "p.yaml") == []
    assert (tmp_path / "f.txt").read_text() == "kept"


def test_staged_files_arrive_together_replacing_older_ones(tmp_path):
    (tmp_path / "report.json").write_text("old")
    with staged(tmp_path) as stage:
        (stage / "report.json").write_text("new")
        (stage / "gpus.csv").write_text("a,b\n")
        assert not (tmp_path / "gpus.csv").exists()           # not yet
    assert (tmp_path / "report.json").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["gpus.csv",
                                                                                               "report.json"]


def test_an_earlier_runs_file_this_one_owns_but_does_not_write_goes_and_others_stay(tmp_path):
    for name in ("timeline.png", "notes.txt"):
        (tmp_path / name).write_text("old")
    with staged(tmp_path, owns=("report.json", "timeline.png")) as stage:
        (stage / "report.json").write_text("new")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "report.json"]


def test_simulate_and_sweep_leave_no_figure_of_an_earlier_run(tmp_path, capsys):
    from hetsim.cli import main
    out = tmp_path / "o"
    assert main(["simulate", "--waves", "4", "--out", str(out), "-q"]) == 0
    assert {"utilisation.png", "timeline.png"} <= set(os.listdir(out))
    assert main(["simulate", "--waves", "4", "--no-plots", "--out", str(out), "-q"]) == 0
    assert not any(name.endswith(".png") for name in os.listdir(out))
    assert main(["sweep", "--vary", "nm=2,4", "--waves", "3", "--workers", "1", "--out", str(out), "-q"]) == 0
    assert (out / "sweep.png").exists()
    assert main(["sweep", "--vary", "nm=2,4", "--vary", "seed=0,1", "--vary", "jitter=0,0.1", "--waves", "3",
                 "--workers", "1", "--out", str(out), "-q"]) == 0
    assert not (out / "sweep.png").exists() and (out / "report.json").exists()      # three axes: no figure


def test_staged_refuses_a_folder_in_the_way_before_moving_any_file(tmp_path):
    (tmp_path / "report.json").write_text("earlier run")
    (tmp_path / "timeline.png").mkdir()
    with pytest.raises(HetsimError, match=r"^--out .*: timeline.png there is a folder, .* \(nothing was written\)$"):
        with staged(tmp_path) as stage:
            (stage / "report.json").write_text("new")
            (stage / "timeline.png").write_text("png")
    assert (tmp_path / "report.json").read_text() == "earlier run"
    assert sorted(os.listdir(tmp_path)) == ["report.json", "timeline.png"]


def test_a_block_that_fails_leaves_out_untouched(tmp_path):
    with pytest.raises(RuntimeError):
        with staged(tmp_path / "new") as stage:
            (stage / "report.json").write_text("half")
            raise RuntimeError("the plots failed")
    assert not (tmp_path / "new").exists()


def test_an_existing_file_keeps_its_mode_a_link_is_followed_and_a_device_written_into(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    path.chmod(0o600)
    write_text(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o600
    (tmp_path / "link.json").symlink_to(path)
    write_text(tmp_path / "link.json", "through the link")
    assert (tmp_path / "link.json").is_symlink() and path.read_text() == "through the link"
    write_text("/dev/null", "nothing")
    assert Path("/dev/null").is_char_device()


def test_a_staging_error_names_the_output_folder_and_a_folder_made_for_nothing_is_removed(tmp_path):
    with pytest.raises(HetsimError) as err:
        with staged(tmp_path / "new") as stage:
            (stage / "profile.yaml").mkdir()
            write_text(stage / "profile.yaml", "x")
    assert ".hetsim-staging" not in str(err.value) and str(tmp_path / "new" / "profile.yaml") in str(err.value)
    assert not (tmp_path / "new").exists()
