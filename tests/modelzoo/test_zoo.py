"""Every model in the zoo: traceable, cut anywhere into stages that reproduce the whole model."""

import pytest
import torch

from modelzoo import MODEL_INPUT, MODELS, build, layer_graph

# Small inputs keep the suite fast; each is the smallest size the model's pooling allows.
TEXT = {"n_layer": 2, "seq_len": 16, "vocab_size": 100}
SMALL = {"inception_v3": {"image_size": 75}, "mlp": {}, "gpt2-small": TEXT, "gpt2-medium": TEXT,
         "opt-350m": TEXT, "gpt-neo-2.7b": {**TEXT, "d_model": 64, "n_head": 4},
         "llama-3-8b": {**TEXT, "d_model": 64, "n_head": 8, "n_kv_head": 2, "d_ff": 96}}


def small(name: str) -> dict:
    return SMALL.get(name, {"image_size": 64})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stages_run_in_turn_equal_the_whole_model(name):
    torch.manual_seed(0)
    model, x = build(name, batch=2, **small(name))
    model.eval()
    graph = layer_graph(model)
    n = len(graph)
    cuts = sorted({0, 1, n // 3, n // 2, n - 1, n})
    boundary = {MODEL_INPUT: x}
    with torch.no_grad():
        for lo, hi in zip(cuts, cuts[1:]):
            boundary = graph.run(lo, hi, boundary)
        whole = model(x)
    assert torch.allclose(boundary[n - 1], whole, atol=1e-5)
    assert sum(graph.param_bytes(i) for i in range(n)) == 4 * sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,params", [
    ("alexnet", 61_100_840), ("squeezenet1_0", 1_248_424), ("densenet121", 7_978_856),
    ("inception_v3", 23_834_568),                 # torchvision, aux_logits=False
    ("resnet18", 11_689_512), ("resnet101", 44_549_160), ("resnext101", 88_791_336),
    # GPT-2 small is 124,439,808 with the head tied to the token embedding; untied adds 50257 x 768.
    ("gpt2-small", 124_439_808 + 50257 * 768),
    ("llama-3-8b", 8_030_261_248),                # HF meta-llama/Meta-Llama-3-8B, head untied there too
])
def test_parameter_counts_match_the_published_models(name, params):
    model = build(name, device="meta")[0]
    graph = layer_graph(model)
    assert sum(graph.param_bytes(i) for i in range(len(graph))) == params * 4


def gpt_params(n_layer: int, h: int, seq: int, vocab: int) -> int:
    """Token and position tables, 12h^2 + 13h per block (QKV, projection, 4h MLP, two LayerNorms, biases),
    the final LayerNorm and the untied head."""
    return vocab * h + seq * h + n_layer * (12 * h * h + 13 * h) + 2 * h + vocab * h


def test_sailors_gpt_models_count_what_their_shapes_give():
    def count(name):
        graph = layer_graph(build(name, device="meta")[0])
        return sum(graph.param_bytes(i) for i in range(len(graph))) // 4
    assert count("opt-350m") == gpt_params(24, 1024, 2048, 50272) == 355_887_104 + 50272 * 1024
    assert count("gpt-neo-2.7b") == gpt_params(32, 2560, 2048, 50257)
    # HF's GPT-Neo 2.7B: 2,651,307,520 tied, without Q/K/V biases (32 x 3 x 2560)
    assert count("gpt-neo-2.7b") == 2_651_307_520 + 32 * 3 * 2560 + 50257 * 2560


def test_llama_blocks_and_embeddings_stay_whole_layers_with_rotary_tables_as_buffers():
    model, x = build("llama-3-8b", batch=2, **SMALL["llama-3-8b"])
    graph = layer_graph(model)
    assert graph.kinds == ["Embeddings", "Block", "Block", "RMSNorm", "Linear"]
    assert model(x).shape == (2, 16, 100)
    assert {n for n, _ in graph.layers[1].named_buffers()} == {"cos", "sin"}
    assert not graph.layers[1].state_dict().keys() & {"cos", "sin"}           # not in checkpoints


def test_gpt_blocks_stay_whole_layers_and_take_token_ids():
    model, x = build("gpt2-medium", batch=3, n_layer=5, seq_len=8, vocab_size=50)
    graph = layer_graph(model)
    assert graph.kinds == ["Embeddings"] + ["Block"] * 5 + ["LayerNorm", "Linear"]
    assert x.dtype == torch.int64 and x.shape == (3, 8) and int(x.max()) < 50
    assert model(x).shape == (3, 8, 50)


def test_branchy_models_keep_their_dag():
    for name in ("inception_v3", "densenet121", "squeezenet1_0"):
        graph = layer_graph(build(name, device="meta")[0])
        widths = [len(graph.crossing(c)) for c in range(1, len(graph))]
        assert max(widths) > 1, name                     # some cut carries several tensors
        assert any(dst - src > 1 for src, dst in graph.edges), name


def test_unknown_model_names_suggest_close_ones():
    with pytest.raises(KeyError, match="did you mean 'resnet50'"):
        build("resnet05")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_models_build_and_run_on_cuda():
    model, x = build("resnet18", batch=2, device="cuda", image_size=64)
    assert model(x).is_cuda
