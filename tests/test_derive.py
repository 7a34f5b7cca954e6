"""Derived (roofline) profiles: counts on the meta device, times from efficiency data, ordering."""

import itertools

import pytest

from hetsim.derive import Efficiency, LayerCost, calibrate, derive_profile, load_efficiencies, pass_time_s
from hetsim.gpu import load_gpu_types
from hetsim.profile import LayerProfile, ModelProfile, load_profile

from conftest import gpu_type

HETPIPE = ["titan-rtx", "titan-v", "rtx-2060", "quadro-p4000"]   # fastest first by datasheet peak FP32


def test_roofline_takes_the_slower_of_compute_and_memory_plus_overhead():
    gpu = gpu_type()                                              # 10 TFLOP/s, 1 TB/s
    eff = Efficiency(factors={"compute": 0.5, "memory": 0.25, "overhead_s": 1e-6, "compute.Conv2d.bwd": 1.0})
    conv = LayerCost(kind="Conv2d", flops_fwd=1e10, flops_bwd=2e10, bytes_fwd=1e6, bytes_bwd=1e9)
    assert pass_time_s(conv, "fwd", gpu, eff) == pytest.approx(1e10 / 5e12 + 1e-6)
    assert pass_time_s(conv, "bwd", gpu, eff) == pytest.approx(max(2e10 / 1e13, 1e9 / 2.5e11) + 1e-6)


def test_efficiency_lookup_goes_from_specific_to_general_then_to_the_base():
    base = Efficiency(factors={"compute": 0.5, "compute.Linear": 0.7})
    eff = Efficiency(factors={"compute.Linear.bwd": 0.9}, base=base)
    assert [eff.get("compute", "Linear", p) for p in ("fwd", "bwd")] == [0.7, 0.9]
    assert eff.get("compute", "ReLU", "fwd") == 0.5


@pytest.mark.parametrize("name", ["vgg19_b32", "resnet152_b32"])
def test_shipped_profiles_order_hetpipe_gpus_as_their_datasheets(name):
    p = load_profile(name)
    total = [sum(p.stage_times(t, 0, p.n_layers)) for t in HETPIPE]
    assert total == sorted(total)
    assert p.batch_size == 32 and set(HETPIPE) <= p.gpu_types


def test_a_gpu_better_on_both_peak_and_bandwidth_is_never_slower_on_any_layer():
    gpus = load_gpu_types()
    p = load_profile("resnet152_b32")
    for a, b in itertools.permutations(gpus.values(), 2):
        if a.peak_fp32_flops >= b.peak_fp32_flops and a.memory_bandwidth_Bps >= b.memory_bandwidth_Bps:
            assert all(l.fwd_s[a.name] <= l.fwd_s[b.name] and l.bwd_s[a.name] <= l.bwd_s[b.name]
                       for l in p.layers), (a.name, b.name)


def test_calibration_recovers_the_factors_that_generated_the_times():
    device = gpu_type()
    costs = [LayerCost(kind=k, flops_fwd=f, flops_bwd=2 * f, bytes_fwd=by, bytes_bwd=2 * by)
             for k, f, by in [("Conv2d", 4e10, 1e7), ("Conv2d", 1e10, 1e6), ("ReLU", 0, 1e8), ("Flatten", 0, 0)]]
    truth = Efficiency(factors={"compute": 1.0, "memory": 1.0, "overhead_s": 2e-5,
                                "compute.Conv2d": 0.6, "memory.ReLU.fwd": 0.5, "memory.ReLU.bwd": 0.4})
    base = ModelProfile(model="m", batch_size=1, edges=(), input_bytes=0, layers=tuple(
        LayerProfile(name=f"l{i}", kind=c.kind, param_bytes=0, output_bytes=0, fwd_s={}, bwd_s={})
        for i, c in enumerate(costs)))
    measured = derive_profile(base, costs, [device], {device.name: truth})
    fitted = calibrate([measured], [costs], device, device.name)
    assert fitted["overhead_s"] == pytest.approx(2e-5)
    assert fitted["compute.Conv2d.fwd"] == pytest.approx(0.6, rel=1e-3)
    assert fitted["memory.ReLU.bwd"] == pytest.approx(0.4, rel=1e-3)


def test_every_shipped_gpu_type_gets_efficiencies_from_the_data_file():
    effs = load_efficiencies(load_gpu_types())
    assert all(0 < e.get("compute", "Conv2d", "fwd") <= 1 for e in effs.values())
