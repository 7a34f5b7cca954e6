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

from typing import Callable

import torch
from torch import nn

from modelzoo.graph import MODEL_INPUT, LayerGraph, layer_graph
from modelzoo.mlp import mlp
from modelzoo.resnet import SPECS as RESNETS
from modelzoo.resnet import resnet
from modelzoo.vgg import CONFIGS as VGGS
from modelzoo.vgg import vgg

__all__ = ["build", "MODELS", "LayerGraph", "layer_graph", "MODEL_INPUT"]

# name -> (constructor, per-sample input shape)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    **{name: (lambda n=name: vgg(n), (3, 224, 224)) for name in VGGS},
    **{name: (lambda n=name: resnet(n), (3, 224, 224)) for name in RESNETS},
    "mlp": (mlp, (64,)),
}


def build(name: str, batch: int = 1, device: str | torch.device = "cpu") -> tuple[nn.Module, torch.Tensor]:
    """The model and an example input batch (random, seeded) on `device`."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    make, shape = MODELS[name]
    with torch.device(device):
        model = make()
    generator = torch.Generator().manual_seed(0)
    example = torch.randn((batch, *shape), generator=generator).to(device)
    return model, example
