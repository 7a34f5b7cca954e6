"""Stage memory: bytes per parameter by optimizer and precision, TP splits, recompute, reserve, 1F1B."""

from dataclasses import replace

import pytest

from conftest import cluster, profile
from hetsim.feasibility import plan_memory
from hetsim.memory import MemorySettings, stage_memory
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker

P = 1_000_000          # FP32 parameter bytes per layer


def layers(saved=400, replicated=100):
    base = profile(2, 0.01, 0.02, param_bytes=P, out_bytes=50)
    return replace(base, layers=tuple(replace(l, saved_bytes=saved, saved_replicated_bytes=replicated)
                                      for l in base.layers))


@pytest.mark.parametrize("optimizer,precision,per_param", [
    ("sgd", "fp32", 4 + 4), ("momentum", "fp32", 4 + 4 + 4), ("adam", "fp32", 4 + 4 + 8),
    ("adamw", "tf32", 4 + 4 + 8), ("adam", "bf16", 2 + 4 + 4 + 8), ("sgd", "fp16", 2 + 4 + 4)])
def test_bytes_per_parameter_follow_optimizer_and_precision(optimizer, precision, per_param):
    m = stage_memory(layers(saved=0, replicated=0), 0, 2, in_flight=1, asynchronous=False,
                     settings=MemorySettings(optimizer=optimizer, precision=precision))
    assert m.weights_bytes + m.gradient_bytes + m.optimizer_bytes == 2 * P // 4 * per_param


def test_tensor_parallel_member_keeps_the_replicated_part_whole_and_a_share_of_the_rest():
    m = stage_memory(layers(saved=400, replicated=100), 0, 2, in_flight=3, asynchronous=False, tp=4,
                     settings=MemorySettings(optimizer="adam"))
    assert m.activation_bytes == 3 * 2 * (100 + 300 / 4)
    assert m.weights_bytes == 2 * P / 4


def test_recompute_keeps_layer_inputs_and_one_layer_being_recomputed():
    full = stage_memory(layers(), 0, 2, in_flight=2, asynchronous=False, settings=MemorySettings())
    again = stage_memory(layers(), 0, 2, in_flight=2, asynchronous=False,
                         settings=MemorySettings(recompute=True))
    assert full.activation_bytes == 2 * 800
    assert again.activation_bytes == 2 * (50 + 50) + 400     # inputs of both layers, then one layer's set


def test_16_bit_precisions_halve_saved_activations():
    fp32 = stage_memory(layers(), 0, 2, in_flight=1, asynchronous=False, settings=MemorySettings())
    bf16 = stage_memory(layers(), 0, 2, in_flight=1, asynchronous=False, settings=MemorySettings(precision="bf16"))
    assert bf16.activation_bytes * 2 == fp32.activation_bytes


def test_1f1b_stage_s_of_S_holds_S_minus_s_minibatches_and_each_gpu_its_reserve():
    S = 4
    c = cluster([S])
    gpu = c.nodes[0].gpus[0].type
    c = replace(c, nodes=(replace(c.nodes[0], gpus=tuple(replace(g, type=replace(gpu, framework_reserve_bytes=123))
                                                          for g in c.nodes[0].gpus)),))
    p = replace(layers(), layers=layers().layers * 2)
    pl = Plan(name="m", model="synthetic", minibatch_size=1, nm=8, schedule="1f1b-flush", sync=SyncSpec(),
              optimizer="sgd", virtual_workers=(VirtualWorker(name="vw0", stages=tuple(
                  StageSpec(gpu=f"node0/gpu{s}", layers=(s, s + 1)) for s in range(S))),))
    memory = plan_memory(pl, c, p)
    for s in range(S):
        m = memory[f"node0/gpu{s}"]
        assert (m.in_flight, m.activation_bytes, m.reserve_bytes) == (S - s, (S - s) * 400, 123)


def test_scaling_a_profile_to_another_batch_scales_saved_and_all_reduced_bytes():
    base = layers(saved=400, replicated=100)
    base = replace(base, layers=tuple(replace(l, tp_allreduce_bytes=60) for l in base.layers))
    big = base.scaled_to_batch(3)
    assert [(l.saved_bytes, l.saved_replicated_bytes, l.tp_allreduce_bytes) for l in big.layers] == [(1200, 300, 180)] * 2


def test_a_tensor_two_layers_of_one_stage_both_save_is_kept_once():
    p = layers(saved=400, replicated=0)
    p = replace(p, layers=(p.layers[0], replace(p.layers[1], saved_shared_bytes=150)))
    both = stage_memory(p, 0, 2, in_flight=1, asynchronous=False, settings=MemorySettings())
    second = stage_memory(p, 1, 2, in_flight=1, asynchronous=False, settings=MemorySettings())
    assert (both.activation_bytes, second.activation_bytes) == (800 - 150, 400)


def test_a_note_names_the_gpu_types_without_a_framework_reserve_and_only_those():
    from hetsim.cluster import load_cluster
    from hetsim.memory import unreserved_note
    hetpipe = load_cluster("hetpipe_4node")
    note = unreserved_note(hetpipe)
    assert note.startswith("memory: quadro-p4000, rtx-2060, titan-rtx, titan-v name no framework_reserve_gib")
    assert unreserved_note(hetpipe, ["node0/gpu0"]).startswith("memory: titan-v name")
    assert unreserved_note(load_cluster("cpu_host")) is None          # ranks sharing cores: no GPU process


def test_whether_a_plan_fits_is_the_steady_states_not_a_short_schedules():
    """HetPipe's order is shaped by the stages' costs and fills over several waves: a 1-wave schedule
    of Nm = 16 holds 10 minibatches at stage 0, a 2-wave one 14. The memory is the steady state's."""
    import hetsim
    from hetsim.cluster import load_cluster
    from hetsim.data import resolve
    from hetsim.feasibility import _plan_memory
    from hetsim.plan import load_plan
    plan = replace(load_plan(resolve("plan", "hetpipe_vgg19_ed")), nm=16)
    c = load_cluster(resolve("cluster", "hetpipe_4node"))
    p = hetsim.load_profile(resolve("profile", "vgg19_b32_analytic")).scaled_to_batch(plan.minibatch_size)
    first = plan.virtual_workers[0].stages[0].gpu
    by_waves = {w: _plan_memory(plan, c, p, w)[first] for w in (1, 2, 64)}
    assert {w: m.in_flight for w, m in by_waves.items()} == {1: 10, 2: 14, 64: 16}
    assert plan_memory(plan, c, p)[first] == by_waves[64]


def test_a_tensor_a_layer_further_back_saves_too_is_kept_once_only_when_both_are_in_the_stage():
    p = profile(4, 0.01, 0.02, param_bytes=P, out_bytes=50)
    p = replace(p, layers=tuple(replace(l, saved_bytes=400) for l in p.layers))
    p = replace(p, layers=(*p.layers[:3], replace(p.layers[3], saved_shared_earlier=((1, 120),))))
    held = lambda lo, hi: stage_memory(p, lo, hi, in_flight=1, asynchronous=False).activation_bytes
    assert (held(0, 4), held(1, 4), held(2, 4)) == (1600 - 120, 1200 - 120, 800)


def test_integer_and_boolean_saved_bytes_keep_their_size_at_16_bits():
    p = replace(layers(saved=400, replicated=100), layers=tuple(
        replace(l, saved_nonfloat_bytes=40) for l in layers().layers))
    bf16 = stage_memory(p, 0, 2, in_flight=1, asynchronous=False, settings=MemorySettings(precision="bf16"))
    fp32 = stage_memory(p, 0, 2, in_flight=1, asynchronous=False, settings=MemorySettings())
    assert (fp32.activation_bytes, bf16.activation_bytes) == (800, 2 * (360 / 2 + 40))


def test_a_split_backward_holds_weighted_layers_output_gradients_between_i_and_w():
    p = replace(layers(saved=400), layers=(layers().layers[0], replace(layers().layers[1], param_bytes=0)))
    plain = stage_memory(p, 0, 2, in_flight=3, asynchronous=False)
    split = stage_memory(p, 0, 2, in_flight=3, asynchronous=False, deferred=2)
    half = stage_memory(p, 0, 2, in_flight=3, asynchronous=False, deferred=2,
                        settings=MemorySettings(precision="bf16"))
    # Layer 0 has weights, layer 1 none: W needs only layer 0's output gradient (50 bytes).
    assert split.activation_bytes - plain.activation_bytes == 2 * 50
    assert half.activation_bytes == 3 * 800 / 2 + 2 * 50 / 2
    assert "output gradients of 2 awaiting W" in split.describe()


def test_zb_h1_stages_hold_their_deferred_output_gradients_in_the_plan_check():
    k = 3
    pl = Plan(name="m", model="synthetic", minibatch_size=1, nm=4, schedule="zb-h1", sync=SyncSpec(),
              optimizer="sgd", virtual_workers=(VirtualWorker(name="vw0", stages=tuple(
                  StageSpec(gpu=f"node0/gpu{s}", layers=(2 * s, 2 * s + 2)) for s in range(k))),))
    p = replace(layers(), layers=layers().layers * k)
    memory = plan_memory(pl, cluster([k]), p)
    for s in range(k):
        m = memory[f"node0/gpu{s}"]
        assert (m.in_flight, m.deferred) == (k, s + 1)         # the registry rule, reached on every stage
        # Two weighted layers a stage, 50 output bytes each; the model's last layer keeps no output
        # gradient (its W starts from the loss).
        assert m.activation_bytes == k * 800 + (s + 1) * (2 if s < k - 1 else 1) * 50
