"""The model zoo (torch): models defined here, traced into layer DAGs that profiles and plans cut.

    from modelzoo import build, layer_graph
    model, example = build("resnet50", batch=2)
    graph = layer_graph(model)              # layers in topological order, with the DAG
    out = graph.run(0, len(graph), {MODEL_INPUT: example})

hetsim itself never imports torch; this package is what the executor and the profiler use.
ReLUs are not in-place: a stage may begin at one, and its received input must stay intact for
autograd.
"""

from __future__ import annotations

import difflib
from typing import Callable

import torch
from torch import nn

from modelzoo.alexnet import alexnet
from modelzoo.densenet import CONFIGS as DENSENETS
from modelzoo.densenet import densenet
from modelzoo.gpt import PRESETS as GPTS
from modelzoo.gpt import gpt
from modelzoo.graph import MODEL_INPUT, LayerGraph, layer_graph
from modelzoo.inception import inception_v3
from modelzoo.llama import PRESETS as LLAMAS
from modelzoo.llama import llama
from modelzoo.mlp import mlp
from modelzoo.squeezenet import squeezenet
from modelzoo.resnet import SPECS as RESNETS
from modelzoo.resnet import resnet
from modelzoo.vgg import CONFIGS as VGGS
from modelzoo.vgg import vgg

__all__ = ["build", "MODELS", "LayerGraph", "layer_graph", "MODEL_INPUT"]

# name -> (constructor, per-sample input shape)
MODELS: dict[str, tuple[Callable[..., nn.Module], tuple[int, ...]]] = {
    **{name: (lambda n=name, **kw: vgg(n, **kw), (3, 224, 224)) for name in VGGS},
    **{name: (lambda n=name, **kw: resnet(n, **kw), (3, 224, 224)) for name in RESNETS},
    **{name: (lambda n=name, **kw: densenet(n, **kw), (3, 224, 224)) for name in DENSENETS},
    **{name: (lambda n=name, **kw: gpt(n, **kw), (1024,)) for name in GPTS},
    **{name: (lambda n=name, **kw: llama(n, **kw), (8192,)) for name in LLAMAS},
    "alexnet": (alexnet, (3, 224, 224)),
    "inception_v3": (inception_v3, (3, 299, 299)),
    "squeezenet1_0": (squeezenet, (3, 224, 224)),
    "mlp": (mlp, (64,)),
}


def build(name: str, batch: int = 1, device: str | torch.device = "cpu",
          **model_kwargs) -> tuple[nn.Module, torch.Tensor]:
    """The model and an example input batch (random, seeded) on `device`. `model_kwargs` go to the
    constructor (e.g. hidden=, depth= for "mlp"; image_size= for image models; n_layer=, seq_len= for
    the GPTs and Llamas)."""
    if name not in MODELS:
        close = difflib.get_close_matches(name, MODELS, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else f"; known: {', '.join(sorted(MODELS))}"
        raise KeyError(f"unknown model {name!r}{hint}")
    make, shape = MODELS[name]
    with torch.device(device):
        model = make(**model_kwargs)
    generator = torch.Generator().manual_seed(0)
    example = _example(model, shape, batch, generator).to(device)
    return model, example


def _example(model: nn.Module, default_shape: tuple[int, ...], batch: int, generator) -> torch.Tensor:
    """Random input for a model: token ids when the model says `vocab_size`, else a float tensor of
    the model's `input_shape` (set by constructors whose input size is a parameter) or the default."""
    shape = getattr(model, "input_shape", default_shape)
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None:
        return torch.randint(0, vocab, (batch, *shape), generator=generator)
    return torch.randn((batch, *shape), generator=generator)
