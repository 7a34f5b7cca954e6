"""The shipped derived profiles: regenerated bit for bit, and consistent with PipeDream's published ones."""

import pytest

from conftest import PIPEDREAM_PROFILES
from hetsim.pipedream_graph import read_graph
from hetsim.profile_files import load_profile
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


@pytest.mark.parametrize("model", ["alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "resnext50",
                                   "densenet121", "squeezenet1_0"])
def test_parameter_bytes_equal_pipedreams_published_profiles(model):
    # PipeDream's resnext101 is the 32x4d variant and its inception_v3 has the auxiliary head.
    theirs = read_graph(PIPEDREAM_PROFILES / f"{model}.txt")
    assert load_profile(f"{model}_b32").param_bytes == theirs.param_bytes


def test_pipedream_batch_is_read_from_the_input_node_and_efficiencies_are_anchored_at_conv_forward():
    from hetsim.derive import load_efficiencies
    from hetsim.gpu import load_gpu_types
    from modelzoo.pipedream_fit import CONV_FWD, _published
    totals, batch = _published(PIPEDREAM_PROFILES / "vgg16.txt")
    assert batch == 128                                  # as PipeDream's notes say for VGG-16
    assert totals[("Conv2d", "fwd")] > totals[("ReLU", "fwd")] > 0
    eff = load_efficiencies(load_gpu_types())["titan-v"]
    assert eff.get("compute", "Conv2d", "fwd") == CONV_FWD
