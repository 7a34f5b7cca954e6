"""What autograd saves for backward: the meta count against torch's own record on CPU, and against the
closed form of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", section 4.2) for the zoo's blocks.

The closed form: one layer keeps 34sbh + 5as^2b bytes at 16 bits (s sequence, b batch, h width, a
heads); 5as^2b are the softmax's input to dropout, its mask and output (s x s per head). The zoo's
attention is F.scaled_dot_product_attention. On CPU and CUDA it runs a fused kernel that keeps no s x s
tensor but a logsumexp of a x s x b in FP32; on meta it runs the math path, which keeps the
probabilities, so counting runs it as the fused kernel. At FP32 with 1-byte dropout masks (CUDA's),
the 32 sbh of 16-bit activations double and the two masks stay: 66sbh, plus the logsumexp 4asb and
the two LayerNorms' mean and 1/std, 16sb. Of those, the norms' inputs, the inputs of the QKV and the
first MLP product and the two masks stay whole in a tensor-parallel group: 10sbh at 16 bits, 18sbh
+ 16sb here.
"""

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from modelzoo import build, layer_graph
from modelzoo.counting import counted_profile
from modelzoo.saved import count_saved, layer_saved

S, B = 32, 2
GPT = {"n_layer": 1, "seq_len": S, "d_model": 64, "n_head": 4, "vocab_size": 100}
LLAMA = {"n_layer": 1, "seq_len": S, "d_model": 64, "n_head": 8, "n_kv_head": 2, "d_ff": 160,
         "vocab_size": 100}


def gpt_block_closed_form(s: int, b: int, h: int, a: int) -> tuple[int, int]:
    """(saved, replicated) bytes of one block at FP32 with a fused attention kernel (see above)."""
    return 66 * s * b * h + 16 * s * b + 4 * a * s * b, 18 * s * b * h + 16 * s * b


def block(name: str, device: str, config: dict):
    torch.manual_seed(0)
    model, _ = build(name, batch=B, device=device, **config)
    graph = layer_graph(model)
    graph.layers.train()
    x = torch.randn(B, S, config["d_model"], device=device, requires_grad=True)
    return graph.layers[1], x


def autograd_saved_bytes(out: torch.Tensor, module: torch.nn.Module) -> int:
    """torch's own record: the storages every node of `out`'s autograd graph holds, weights aside."""
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    storages = {}
    for node in autograd_nodes(out):
        held = [getattr(node, a) for a in dir(node) if a.startswith("_saved_")]
        held += list(getattr(node, "saved_tensors", ()))           # custom autograd Functions
        for t in tree_flatten(held)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in own:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def autograd_nodes(out: torch.Tensor) -> list:
    seen, stack = [], [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.append(node)
            stack += [n for n, _ in node.next_functions]
    return seen


def node_names(out: torch.Tensor) -> set[str]:
    return {type(node).__name__ for node in autograd_nodes(out)}


@pytest.mark.parametrize("name,config", [("gpt2-small", GPT), ("llama-3-8b", LLAMA)])
def test_meta_count_equals_what_the_autograd_graph_of_a_real_cpu_run_holds(name, config):
    meta_block, meta_x = block(name, "meta", config)
    meta, _ = layer_saved(meta_block, [meta_x])
    module, x = block(name, "cpu", config)
    cpu, out = layer_saved(module, [x])
    assert meta == cpu
    assert cpu.saved_bytes == autograd_saved_bytes(out, module)


@pytest.mark.parametrize("name,config", [("gpt2-small", GPT), ("llama-3-8b", LLAMA)])
def test_counting_as_on_cuda_computes_what_torch_computes(name, config):
    module, x = block(name, "cpu", config)
    torch.manual_seed(1)
    _, out = layer_saved(module, [x])
    (out * out).sum().backward()
    grads = [x.grad] + [p.grad for p in module.parameters()]
    module.zero_grad()
    x.grad = None
    torch.manual_seed(1)                   # same dropout draws: native_dropout and F.dropout agree on CPU
    plain = module(x)
    (plain * plain).sum().backward()
    assert torch.allclose(out, plain, atol=1e-5)
    for a, b in zip(grads, [x.grad] + [p.grad for p in module.parameters()]):
        assert torch.allclose(a, b, atol=1e-4)


def test_attention_runs_the_math_path_on_meta_and_flash_on_cpu_and_is_counted_as_the_fused_kernel():
    flash = "ScaledDotProductFlashAttentionForCpuBackward0"
    meta_block, meta_x = block("gpt2-small", "meta", GPT)
    assert "SafeSoftmaxBackward0" in node_names(meta_block(meta_x))          # keeps s x s probabilities
    assert flash in node_names(layer_saved(meta_block, [meta_x])[1])
    cpu_block, cpu_x = block("gpt2-small", "cpu", GPT)
    assert flash in node_names(cpu_block(cpu_x))


def test_cpu_eager_keeps_float_dropout_masks_where_cuda_keeps_bytes():
    module, x = block("gpt2-small", "cpu", GPT)
    counted, _ = layer_saved(module, [x])
    eager = autograd_saved_bytes(module(x), module)
    assert eager - counted.saved_bytes == 2 * S * B * GPT["d_model"] * (4 - 1)


def test_cpu_eager_rms_norm_also_keeps_the_normalised_input_where_cudas_fused_kernel_does_not():
    module, x = block("llama-3-8b", "cpu", LLAMA)
    counted, _ = layer_saved(module, [x])
    eager = autograd_saved_bytes(module(x), module)
    assert eager - counted.saved_bytes == 2 * S * B * LLAMA["d_model"] * 4


def test_gpt_block_saves_korthikantis_closed_form_with_a_fused_attention_kernel():
    # opt-350m's block at its own width, heads and sequence (2048), batch 1, FP32.
    profile, _ = counted_profile("opt-350m", 1, n_layer=2)
    saved, replicated = gpt_block_closed_form(2048, 1, 1024, 16)
    for layer in profile.layers[1:3]:
        assert (layer.saved_bytes, layer.saved_replicated_bytes) == (saved, replicated)
        assert saved == 138_575_872
        assert layer.tp_allreduce_bytes == 2 * layer.output_bytes
        assert layer.tp_allreduce_calls == 2        # after attention's output projection and the MLP's
        assert (layer.tp_bwd_bytes, layer.tp_bwd_calls) == (2 * layer.output_bytes, 2)  # QKV's and fc1's inputs
    embed, norm, head = profile.layers[0], profile.layers[-2], profile.layers[-1]
    assert embed.tp_allreduce_bytes == embed.output_bytes and embed.tp_allreduce_calls == 1
    assert embed.tp_bwd_bytes == embed.tp_bwd_calls == 0            # ids have no gradient
    assert norm.tp_allreduce_bytes == norm.tp_bwd_bytes == 0
    # The vocabulary-parallel loss: each token's maximum, then its exponential sum and target (FP32).
    assert (head.tp_allreduce_bytes, head.tp_calls) == (3 * 2048 * 4, 2)
    assert (head.tp_bwd_bytes, head.tp_bwd_calls) == (norm.output_bytes, 1)
    # token and position ids (int64) and the dropout mask; all whole in a TP group
    assert embed.saved_bytes == embed.saved_replicated_bytes == 8 * 2048 + 8 * 2048 + 2048 * 1024


def test_materialized_attention_keeps_the_probabilities_where_the_fused_kernel_keeps_a_logsumexp():
    """Counted materialized (`hetsim profile --attention materialized`), a block keeps the softmax's
    s x s probabilities per head (Megatron's core attention at attention dropout 0) and the scaled Q
    and transposed K apart from the QKV product, and not the fused kernel's logsumexp: exactly
    4as^2b + 2 x 4sbh - 4asb bytes more, the same in every TP member's split share."""
    s, b, h, a = 2048, 1, 1024, 16
    counted = {att: counted_profile("opt-350m", b, attention=att, n_layer=2)[0] for att in ("fused", "materialized")}
    for fused, materialized in zip(counted["fused"].layers[1:3], counted["materialized"].layers[1:3]):
        assert materialized.saved_bytes - fused.saved_bytes == 4 * a * s * s * b + 2 * 4 * s * b * h - 4 * a * s * b
        assert materialized.saved_replicated_bytes == fused.saved_replicated_bytes


def test_llama_block_keeps_the_gqa_swiglu_form():
    # x and both norms' outputs, Q, K and V after rotation (K, V at kv/a width), attention output, the
    # residual, and four d_ff-wide SwiGLU tensors: FP32; each norm's 1/rms; the logsumexp.
    s, b, h, a, kv, f = S, B, LLAMA["d_model"], LLAMA["n_head"], LLAMA["n_kv_head"], LLAMA["d_ff"]
    profile, _ = counted_profile("llama-3-8b", b, **LLAMA)
    layer = profile.layers[1]
    whole = 4 * s * b * h * 4 + 2 * s * b * 4
    split = (2 * s * b * h + 2 * s * b * h * kv // a + 4 * s * b * f) * 4 + 4 * a * s * b
    assert layer.saved_bytes == whole + split
    assert layer.saved_replicated_bytes == whole
    assert layer.tp_allreduce_bytes == 2 * layer.output_bytes
    # Q, K and V (and SwiGLU's gate and up) take one normalised input: one gradient all-reduce each
    assert (layer.tp_bwd_bytes, layer.tp_bwd_calls) == (2 * layer.output_bytes, 2)


def test_a_column_row_pair_all_reduces_once_each_way_and_a_model_input_sends_no_gradient():
    pair = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))       # Megatron's MLP split
    x = torch.zeros(4, 16, device="meta")
    inner, _ = layer_saved(pair.to("meta"), [x.requires_grad_(True)])
    assert (inner.tp_allreduce_bytes, inner.tp_allreduce_calls) == (4 * 16 * 4, 1)       # g after the row product
    assert (inner.tp_allreduce_bwd_bytes, inner.tp_allreduce_bwd_calls) == (4 * 16 * 4, 1)  # f before the column one
    first, _ = layer_saved(pair, [torch.zeros(4, 16, device="meta")])                # the model's input: no grad
    assert (first.tp_allreduce_bwd_bytes, first.tp_allreduce_bwd_calls) == (0, 0)


def test_a_linear_whose_output_stays_split_all_reduces_nothing():
    # mlp's layers are lone Linears and ReLUs: only the last, a vocabulary-parallel head, communicates.
    profile, _ = counted_profile("mlp", 2)
    assert all(l.tp_allreduce_bytes == l.tp_bwd_bytes == 0 for l in profile.layers[:-1])
    assert (profile.layers[-1].tp_calls, profile.layers[-1].tp_bwd_calls) == (2, 1)


def test_saved_bytes_scale_linearly_with_batch():
    one, _ = counted_profile("llama-3-8b", 1, **LLAMA)
    three, _ = counted_profile("llama-3-8b", 3, **LLAMA)
    for a, b in zip(one.layers, three.layers):
        assert (b.saved_bytes, b.saved_replicated_bytes, b.tp_allreduce_bytes) == \
            (3 * a.saved_bytes, 3 * a.saved_replicated_bytes, 3 * a.tp_allreduce_bytes)


def test_layers_without_weight_products_keep_all_saved_bytes_whole():
    profile, _ = counted_profile("resnet18", 2, image_size=32)
    assert all(l.saved_bytes == l.saved_replicated_bytes for l in profile.layers[:-1])
    # The last layer's count includes its loss's log-softmax (2 x 1000 fp32) and labels (2 int64),
    # counted split under TP as a vocabulary-parallel loss splits its softmax (the labels, a few
    # bytes, each member keeps whole).
    head = profile.layers[-1]
    assert head.saved_bytes - head.saved_replicated_bytes == 2 * 1000 * 4 + 2 * 8
    # Only the last Linear splits (column-parallel), and its loss is then vocabulary-parallel.
    assert all(l.tp_allreduce_bytes == l.tp_bwd_bytes == 0 for l in profile.layers[:-1])
    assert (head.tp_allreduce_bytes, head.tp_calls) == (3 * 2 * 4, 2)
    assert (head.tp_bwd_bytes, head.tp_bwd_calls) == (2 * 512 * 4, 1)
    relu = next(l for l in profile.layers if l.kind == "ReLU")
    assert relu.saved_bytes == relu.output_bytes                       # threshold_backward keeps the result


def test_count_saved_gives_one_count_per_layer_and_excludes_weights():
    model, x = build("mlp", batch=8, device="meta", hidden=32, depth=2, in_features=16)
    counts = count_saved(layer_graph(model), x)
    assert [c.saved_bytes for c in counts][:2] == [8 * 16 * 4, 8 * 32 * 4]    # a Linear keeps its input


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", ["gpt2-small", "llama-3-8b"])
def test_meta_count_is_what_a_cuda_forward_leaves_allocated(name):
    config = {**(GPT if name == "gpt2-small" else LLAMA), "seq_len": 256, "d_model": 512}
    model, _ = build(name, batch=B, device="cuda", **config)
    module = layer_graph(model).layers[1].train()
    x = torch.randn(B, 256, 512, device="cuda", requires_grad=True)
    meta_model, _ = build(name, batch=B, device="meta", **config)
    counted, _ = layer_saved(layer_graph(meta_model).layers[1], [x.detach().to("meta").requires_grad_()])
    module(x)                                                    # warm-up: cuBLAS workspaces and the like
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = module(x)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before               # saved tensors but x, and the output
    assert kept - out.nbytes + x.nbytes == pytest.approx(counted.saved_bytes, rel=0.02)


def test_a_whole_model_keeps_the_per_layer_counts_less_what_consecutive_layers_share():
    """torch's own count: every distinct storage autograd holds after one real CPU forward of the whole
    model (mlp: Linear/ReLU pairs, each ReLU output also saved by the next Linear)."""
    model, example = build("mlp", batch=8, hidden=64, depth=3)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            held[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(example.requires_grad_(True))
    meta_model, meta_example = build("mlp", batch=8, device="meta", hidden=64, depth=3)
    counts = count_saved(layer_graph(meta_model), meta_example)
    assert sum(c.shared_bytes for c in counts) > 0
    assert sum(c.saved_bytes - c.shared_bytes for c in counts) == sum(held.values())


def test_only_what_a_layer_saves_of_the_one_before_counts_as_shared_and_every_count_is_the_same():
    """A GPT block's output is not saved by the block (a residual add keeps nothing), so no layer
    shares with the one before. Storages are keyed by address: one freed while the next layer is
    counted could be reused at the same address and read as shared (it was, in some runs)."""
    from modelzoo.counting import counted_profile
    runs = [tuple((l.saved_bytes, l.saved_shared_bytes) for l in counted_profile(
        "gpt2-small", 4, n_layer=2, seq_len=64, vocab_size=256)[0].layers) for _ in range(6)]
    assert all(r == runs[0] for r in runs)
    assert all(shared == 0 for _, shared in runs[0])


def real_saved_bytes(model: nn.Module, example: torch.Tensor, lo: int, hi: int, dtype=torch.float32) -> int:
    """torch's own count for a stage of layers [lo, hi): every distinct storage autograd holds after a
    real CPU forward of those layers, each fed its predecessors' outputs as the stage receives them
    (dropout keeping a byte mask, as on CUDA)."""
    from modelzoo.saved import _AsOnCuda
    graph = layer_graph(model.to(dtype))
    graph.layers.train()
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    held: dict[int, torch.UntypedStorage] = {}
    values = {-1: example.to(dtype)}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            held[storage.data_ptr()] = storage
        return t

    with torch.no_grad():                        # layers before the stage: their outputs only
        for i in range(lo):
            values[i] = graph.layers[i](*[values[p] for p in graph.preds[i]])
    values = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in values.items()}
    with _AsOnCuda(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for i in range(lo, hi):
            values[i] = graph.layers[i](*[values[p] for p in graph.preds[i]])
    return sum(s.nbytes() for s in held.values())


@pytest.mark.parametrize("name,stages", [
    ("resnet18", [(0, None), (3, 20), (18, 40)]),       # a block input its first conv and downsample both save
    ("squeezenet1_0", [(0, None), (5, 30)]),            # a fire module's squeeze output, saved by both expands
])
def test_a_tensor_that_layers_further_apart_save_is_kept_once_per_stage(name, stages):
    from hetsim.memory import MemorySettings, stage_memory
    model, example = build(name, batch=2, image_size=64, num_classes=10)
    profile, _ = counted_profile(name, 2, image_size=64, num_classes=10)
    assert any(l.saved_shared_earlier for l in profile.layers)
    for lo, hi in stages:
        hi = hi or profile.n_layers - 1                  # the loss is counted with the last layer; leave it
        m = stage_memory(profile, lo, hi, in_flight=1, asynchronous=False, settings=MemorySettings())
        assert m.activation_bytes == real_saved_bytes(model, example, lo, hi), (lo, hi)


def test_integer_and_boolean_saved_tensors_keep_their_size_at_16_bits():
    """VGG's max-pool indices (int64) and dropout masks (bytes, as CUDA keeps them) do not halve."""
    from hetsim.memory import MemorySettings, stage_memory
    model, example = build("vgg11", batch=2, image_size=64, num_classes=10)
    profile, _ = counted_profile("vgg11", 2, image_size=64, num_classes=10)
    assert sum(l.saved_nonfloat_bytes for l in profile.layers) > 0
    hi = profile.n_layers - 1
    real = real_saved_bytes(model, example, 0, hi, torch.bfloat16)
    m = stage_memory(profile, 0, hi, in_flight=1, asynchronous=False, settings=MemorySettings(precision="bf16"))
    assert m.activation_bytes == real
