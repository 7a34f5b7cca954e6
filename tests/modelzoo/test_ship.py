"""The shipped derived profiles: regenerated bit for bit, and consistent with PipeDream's published ones."""

import pytest

from conftest import PIPEDREAM_PROFILES, needs_pipedream_profiles
from hetsim.pipedream_graph import read_graph
from hetsim.profile import load_profile
from modelzoo.ship import SHIPPED, ship


def test_regenerating_a_shipped_profile_gives_the_same_file(tmp_path):
    from hetsim.data import data_root
    path = ship("alexnet", 32, tmp_path)
    assert path.read_text() == (data_root() / "models" / "alexnet_b32.yaml").read_text()


@pytest.mark.parametrize("model,batch", SHIPPED)
def test_shipped_profiles_cover_the_hetpipe_gpus_and_state_their_flop_convention(model, batch):
    p = load_profile(f"{model}_b{batch}")
    assert {"titan-v", "titan-rtx", "rtx-2060", "quadro-p4000"} <= p.gpu_types
    assert "multiply-add as 2" in p.flop_convention and "ESTIMATES" in p.source


@needs_pipedream_profiles()
@pytest.mark.parametrize("model", ["alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "resnext50",
                                   "densenet121", "squeezenet1_0"])
def test_parameter_bytes_equal_pipedreams_published_profiles(model):
    # PipeDream's resnext101 is the 32x4d variant and its inception_v3 has the auxiliary head.
    theirs = read_graph(PIPEDREAM_PROFILES / f"{model}.txt")
    assert load_profile(f"{model}_b32").param_bytes == theirs.param_bytes
