"""Derived (roofline) profiles: counts on the meta device, times from efficiency data, ordering,
precision and kernel classes, and the factors fitted to Sailor's measured layer times."""

import importlib.util
import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hetsim.data import data_root
from hetsim.derive import (Efficiency, LayerCost, calibrate, cost_from_ops, derive_profile, load_efficiencies,
                           pass_time_s, tp_share, with_tp_times)
from hetsim.errors import SpecError
from hetsim.gpu import GpuType, load_gpu_type, load_gpu_types
from hetsim.plan import PRECISIONS
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.profile_files import load_profile

from conftest import gpu_type

HETPIPE = ["titan-rtx", "titan-v", "rtx-2060", "quadro-p4000"]   # fastest first by datasheet peak FP32


def test_roofline_takes_the_slower_of_compute_and_memory_plus_overhead():
    gpu = gpu_type()                                              # 10 TFLOP/s, 1 TB/s
    eff = Efficiency(factors={"compute": 0.5, "memory": 0.25, "overhead_s": 1e-6, "compute.Conv2d.bwd": 1.0})
    conv = LayerCost(kind="Conv2d", flops_fwd=1e10, flops_bwd=2e10, bytes_fwd=1e6, bytes_bwd=1e9)
    assert pass_time_s(conv, "fwd", gpu, eff) == pytest.approx(1e10 / 5e12 + 1e-6)
    assert pass_time_s(conv, "bwd", gpu, eff) == pytest.approx(max(2e10 / 1e13, 1e9 / 2.5e11) + 1e-6)


def test_a_tensor_parallel_pass_takes_at_least_its_host_floor_and_a_floor_never_slows_a_pass_above_it():
    gpu = gpu_type()
    eff = Efficiency(factors={"compute": 0.5, "memory": 0.5, "overhead_s": 1e-5, "floor_s.Block.fwd": 2e-3,
                              "floor_s": 1.0})                   # a bare key is no floor: it would name no kind
    small = LayerCost(kind="Block", flops_fwd=1e9, flops_bwd=2e9, bytes_fwd=1e6, bytes_bwd=2e6)
    big = replace(small, flops_fwd=1e11)
    roofline = 1e9 / 5e12 + 1e-5                                               # 0.21 ms of work
    assert pass_time_s(small, "fwd", gpu, eff, tp=4) == 2e-3                   # a TP rank's share: floored
    assert pass_time_s(small, "fwd", gpu, eff) == pytest.approx(roofline)      # one GPU: no collectives, no floor
    assert pass_time_s(big, "fwd", gpu, eff, tp=4) == pytest.approx(1e11 / 5e12 + 1e-5)  # 20 ms: above it
    assert pass_time_s(small, "bwd", gpu, eff, tp=4) == pytest.approx(2e9 / 5e12 + 1e-5)  # no bwd floor given
    assert pass_time_s(replace(small, kind="Linear"), "fwd", gpu, eff, tp=4) == pytest.approx(roofline)


def test_tp_times_are_one_ranks_share_with_norms_whole_and_at_least_the_floor():
    gpu = gpu_type()                                              # 10 TFLOP/s, 1 TB/s
    eff = Efficiency(factors={"compute": 0.5, "memory": 0.5, "overhead_s": 1e-5, "floor_s.Block.fwd": 2e-3})
    norm = LayerCost(kind="norm", flops_fwd=0, flops_bwd=0, bytes_fwd=4e8, bytes_bwd=8e8)
    gemm = LayerCost(kind="gemm", flops_fwd=4e10, flops_bwd=8e10, bytes_fwd=1e6, bytes_bwd=2e6)
    block = LayerCost(kind="Block", parts=(gemm, norm), **{f: getattr(gemm, f) + getattr(norm, f) for f in
                                                           ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd")})
    share = tp_share(block, 4)
    assert share.parts[1] == norm and share.flops_fwd == 1e10 and share.bytes_fwd == 1e6 / 4 + 4e8
    base = ModelProfile(model="m", batch_size=1, edges=(), input_bytes=0,
                        layers=(LayerProfile(name="b", kind="Block", fwd_s={}, bwd_s={}, param_bytes=0,
                                             output_bytes=0),))
    one = derive_profile(base, [block], [gpu], {gpu.name: eff})
    out = with_tp_times(one, [block], [gpu], {gpu.name: eff}, (1, 4, 16))
    layer = out.layers[0]
    # fwd: the rank's GEMM share (1e10 FLOPs at 5 TFLOP/s) and the whole norm (4e8 B at 0.5 TB/s), or the floor
    assert layer.fwd_s[f"{gpu.name}@tp4"] == pytest.approx(max(1e10 / 5e12 + 4e8 / 5e11 + 1e-5, 2e-3))
    assert layer.fwd_s[f"{gpu.name}@tp16"] == pytest.approx(max(2.5e9 / 5e12 + 4e8 / 5e11 + 1e-5, 2e-3))
    assert layer.fwd_s[f"{gpu.name}@tp16"] == 2e-3 < layer.fwd_s[f"{gpu.name}@tp4"]
    assert layer.bwd_s[f"{gpu.name}@tp4"] == pytest.approx(2e10 / 5e12 + 8e8 / 5e11 + 1e-5)   # no bwd floor
    assert layer.fwd_s[gpu.name] == one.layers[0].fwd_s[gpu.name]
    assert not out.tp_times_include_allreduce and "TP 4, 16" in out.source
    assert with_tp_times(one, [block], [gpu], {gpu.name: eff}, (1,)) is one      # nothing to add
    measured = replace(one, layers=(replace(one.layers[0], fwd_s={**layer.fwd_s}, bwd_s={**layer.bwd_s}),),
                       tp_times_include_allreduce=True)
    with pytest.raises(SpecError, match="has measured TP times, all-reduces inside"):
        with_tp_times(measured, [block], [gpu], {gpu.name: eff}, (2,))


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


# Precision and kernel classes --------------------------------------------------------------------

def ampere_like() -> GpuType:
    """10 TFLOP/s FP32, tensor cores at 50 TF32 / 100 FP16 and BF16, 1 TB/s."""
    return replace(gpu_type(), peak_tf32_flops=5e13, peak_bf16_flops=1e14, tensor_cores=True)


FLAT = Efficiency(factors={"compute": 0.5, "memory": 1.0, "overhead_s": 0.0, "tensor.gemm": 0.8})
GEMM = LayerCost(kind="gemm", flops_fwd=1e12, flops_bwd=2e12, bytes_fwd=1e6, bytes_bwd=2e6)
POINTWISE = LayerCost(kind="elementwise", flops_fwd=0.0, flops_bwd=0.0, bytes_fwd=1e9, bytes_bwd=2e9)


def test_gemms_run_at_the_tensor_core_peak_under_tf32_fp16_bf16_and_on_cuda_cores_under_fp32():
    gpu = ampere_like()
    assert [gpu.peak_flops(p, "gemm") for p in PRECISIONS] == [1e13, 5e13, 1e14, 1e14]
    assert [gpu.peak_flops(p, "elementwise") for p in PRECISIONS] == [1e13] * 4
    assert pass_time_s(GEMM, "fwd", gpu, FLAT, "fp32") == pytest.approx(1e12 / (1e13 * 0.5))
    for precision, peak in (("tf32", 5e13), ("fp16", 1e14), ("bf16", 1e14)):
        assert pass_time_s(GEMM, "fwd", gpu, FLAT, precision) == pytest.approx(1e12 / (peak * 0.8))
    assert pass_time_s(LayerCost(kind="Linear", flops_fwd=1e12, flops_bwd=0, bytes_fwd=0, bytes_bwd=0),
                       "fwd", gpu, FLAT, "tf32") == pytest.approx(1e12 / (5e13 * 0.5))   # no tensor.Linear: compute


def test_a_gpu_without_tf32_or_bf16_runs_those_gemms_in_fp32_on_cuda_cores():
    types = load_gpu_types()
    for name in ("v100", "titan-rtx", "rtx-2080-ti", "t4"):
        gpu = types[name]
        assert gpu.peak_flops("tf32") == gpu.peak_flops("bf16") == gpu.peak_fp32_flops
        assert gpu.uses_tensor_cores("fp16", "gemm") and not gpu.uses_tensor_cores("tf32", "gemm")
        assert pass_time_s(GEMM, "fwd", gpu, FLAT, "tf32") == pass_time_s(GEMM, "fwd", gpu, FLAT, "fp32")
    assert types["p100"].peak_flops("fp16") == 18.7e12 and not types["p100"].uses_tensor_cores("fp16", "gemm")
    assert types["quadro-p4000"].peak_flops("fp16") == 5.3e12             # FP32 beats its 1/64-rate FP16
    assert types["a100"].peak_flops("tf32") == 156e12 and types["a100"].uses_tensor_cores("tf32", "attention")


def test_sixteen_bit_precisions_halve_the_memory_term():
    gpu = ampere_like()
    fp32 = pass_time_s(POINTWISE, "bwd", gpu, FLAT, "fp32")
    assert fp32 == pytest.approx(2e9 / 1e12) == pass_time_s(POINTWISE, "bwd", gpu, FLAT, "tf32")
    assert pass_time_s(POINTWISE, "bwd", gpu, FLAT, "fp16") == pass_time_s(POINTWISE, "bwd", gpu, FLAT, "bf16") \
        == pytest.approx(fp32 / 2)


def test_a_layer_with_parts_takes_one_roofline_per_kernel_class_and_its_overhead_once():
    eff = Efficiency(factors={**FLAT.factors, "overhead_s.Block": 1e-4})
    block = LayerCost(kind="Block", flops_fwd=1e12, flops_bwd=2e12, bytes_fwd=1e9 + 1e6, bytes_bwd=2e9 + 2e6,
                      parts=(GEMM, POINTWISE))
    assert pass_time_s(block, "fwd", ampere_like(), eff, "tf32") == pytest.approx(1e12 / 4e13 + 1e9 / 1e12 + 1e-4)


def test_aten_operations_are_summed_by_kernel_class():
    fwd = {"addmm": (10.0, 1.0), "bmm": (4.0, 2.0), "_safe_softmax": (0.0, 3.0), "native_layer_norm": (0.0, 5.0),
           "gelu": (0.0, 7.0), "some_new_matmul": (3.0, 0.0)}
    cost = cost_from_ops("Block", fwd, {"mm": (20.0, 2.0), "native_layer_norm_backward": (0.0, 8.0)})
    assert [(p.kind, p.flops_fwd, p.flops_bwd, p.bytes_fwd, p.bytes_bwd) for p in cost.parts] == [
        ("gemm", 13.0, 20.0, 1.0, 2.0), ("attention", 4.0, 0.0, 2.0, 0.0),
        ("elementwise", 0.0, 0.0, 10.0, 0.0), ("norm", 0.0, 0.0, 5.0, 8.0)]
    assert (cost.kind, cost.flops_fwd, cost.bytes_fwd, cost.bytes_bwd) == ("Block", 17.0, 18.0, 10.0)


def test_a_tf32_or_bf16_peak_without_tensor_cores_is_a_one_line_error(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\ndisplay_name: X\nmemory_gib: 8\nmemory_bandwidth_GBps: 100\npeak_fp32_tflops: 1\n"
                    "peak_fp16_tflops: 2\npeak_tf32_tflops: 4\nsources: [datasheet]\n")
    with pytest.raises(SpecError, match=r"x.yaml: peak_tf32_tflops: .*tensor_cores: true"):
        load_gpu_type(path)


def test_only_ampere_and_later_gpu_files_have_tf32_and_bf16_peaks():
    for gpu in load_gpu_types().values():
        ampere_on = gpu.architecture.split()[0] in ("Ampere", "Hopper")
        assert (gpu.peak_tf32_flops is not None) == (gpu.peak_bf16_flops is not None) == ampere_on, gpu.name
        assert gpu.tensor_cores == (gpu.architecture.split()[0] != "Pascal"), gpu.name


# Factors fitted to Sailor's measured layer times (experiments/profiles/sailor_layers.py) ----------

SAILOR_SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "profiles" / "sailor_layers.py"


def _script(path: Path):
    """An experiments/profiles script loaded as a module (they are not a package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernel_class_factors_are_fit_a_and_predict_held_back_gpu_types_within_tolerance():
    script = _script(SAILOR_SCRIPT)
    rows = script.measured(script.default_data())
    shipped = yaml.safe_load((data_root() / "efficiency.yaml").read_text())["kernel_classes"]["factors"]
    assert script.fit(rows, script.FIT_A) == shipped                      # fitted once, on FIT_A only
    ratios = script.ratios(rows, shipped)
    held_back = {k: v for k, v in ratios.items() if k[0] not in script.FIT_A}
    assert {g for g, _ in held_back} == {"v100", "rtx-3090", "rtx-2080-ti", "a100-80"}
    assert all(abs(v - 1) <= script.TOLERANCE for v in held_back.values()), held_back
    assert all(abs(v - 1) <= script.GOAL[g] for (g, _), v in ratios.items() if g in script.GOAL)


TP_FLOORS = SAILOR_SCRIPT.with_name("tp_floors.py")


def test_host_floors_are_the_shipped_fit_and_fitted_on_tp_2_they_predict_gh200_tp4_blocks():
    script = _script(TP_FLOORS)
    rows = script.entries(script.default_data())
    shipped = yaml.safe_load((data_root() / "efficiency.yaml").read_text())["gpus"]
    fitted = script.fit(rows)
    assert set(fitted) == {"gh200", "a100", "a100-80", "v100"}             # NVLink types only
    assert all({k: v for k, v in shipped[g].items() if k.startswith("floor_s.")} == f for g, f in fitted.items())
    held_back = [r for r in rows if r["gpu"] == "gh200" and r["tp"] == 4 and r["mbs"] <= 2]
    without, with_floor = script.errors(held_back, {}), script.errors(held_back, script.fit(rows, max_tp=2))
    assert len(held_back) == 2 and all(e < -0.2 for e in without)            # 25-50 % fast with no floor
    assert all(abs(e) < 0.10 for e in with_floor), with_floor
