"""The shipped data: PipeDream's profiles travel with the package, and every data file is package data."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from hetsim.data import data_root, pipedream_profile, pipedream_profiles
from hetsim.errors import SpecError
from hetsim.pipedream_graph import read_graph

ROOT = Path(__file__).resolve().parents[1]
ANTICHAIN_TABLE_1 = ("alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "resnext50", "resnext101",
                     "inception_v3", "densenet121", "squeezenet1_0", "nasnetamobile", "nasnetalarge",
                     "gnmt", "gnmt_large")


@pytest.mark.parametrize("model", ANTICHAIN_TABLE_1)
def test_every_pipedream_profile_is_shipped_and_reads_as_a_dag(model):
    profile = read_graph(pipedream_profile(model))
    assert profile.n_layers > 1 and len(profile.edges) >= profile.n_layers - 1


def test_pipedream_profiles_ship_with_their_mit_licence():
    assert "MIT License" in (pipedream_profiles() / "LICENSE.txt").read_text()


def test_an_unknown_pipedream_model_is_named_with_the_shipped_ones():
    with pytest.raises(SpecError, match=r"vgg17: no shipped PipeDream profile .*vgg16"):
        pipedream_profile("vgg17")
    with pytest.raises(SpecError, match="LICENSE: no shipped"):
        pipedream_profile("LICENSE")


def test_every_file_under_gpu_profiles_is_package_data():
    """A file the globs miss is present in a checkout but absent from an installed wheel."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    root = data_root()
    files = [p.relative_to(root).as_posix() for p in root.rglob("*")
             if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
    missed = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs["gpu_profiles"])]
    assert "pipedream/vgg16.txt" in files and not missed, missed
