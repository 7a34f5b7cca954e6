"""Slowdowns: which GPUs a name stands for, and a cluster whose slowed GPUs are types of their own.

A slowdown is named by GPU (`node2/gpu1=1.5`) or by node (`node2=1.5`: every GPU of node2); a GPU
named itself keeps its own factor over its node's. The simulator takes per-GPU factors; the planner,
which partitions by GPU type, takes `slowed_types`: each slowed GPU becomes a type of its own whose
layer times are the original ones times the factor, so the search sees it as the slower GPU it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from hetsim.cluster import Cluster
from hetsim.errors import HetsimError
from hetsim.fields import is_real
from hetsim.profile import LayerProfile, ModelProfile

__all__ = ["gpu_factors", "slowed_types"]


def gpu_factors(cluster: Cluster, named: Mapping[str, float], flag: str = "--slowdown") -> dict[str, float]:
    """{GPU id: factor} of slowdowns named by GPU id or node name; an unknown name is an error."""
    gpus = {g.id for g in cluster.gpus}
    nodes = {n.name: n for n in cluster.nodes}
    out: dict[str, float] = {}
    for name, factor in named.items():
        if not is_real(factor):
            raise HetsimError(f"{flag} {name!r}: expected a number as its factor, got {factor!r}")
        if name in nodes:
            for slot in nodes[name].gpus:
                out.setdefault(slot.id, factor)
        elif name not in gpus:
            raise HetsimError(f"{flag} '{name}={factor:g}': cluster {cluster.name} has no GPU or node {name!r} "
                              f"(name a GPU like {cluster.gpus[0].id} or a node like {cluster.nodes[0].name})")
    out.update({name: factor for name, factor in named.items() if name in gpus})
    return dict(sorted(out.items()))


def slowed_types(cluster: Cluster, profile: ModelProfile,
                 factors: Mapping[str, float]) -> tuple[Cluster, ModelProfile]:
    """The cluster with every slowed GPU on a type `TYPE(xFACTOR)`, and the profile with its times."""
    if not factors:
        return cluster, profile
    renamed: dict[tuple[str, float], str] = {}
    nodes = []
    for node in cluster.nodes:
        slots = []
        for slot in node.gpus:
            factor = factors.get(slot.id, 1.0)
            if factor != 1.0:
                name = renamed.setdefault((slot.type.name, factor), f"{slot.type.name}(x{factor:g})")
                slot = replace(slot, type=replace(slot.type, name=name,
                                                  display_name=f"{slot.type.display_name} x{factor:g}"))
            slots.append(slot)
        nodes.append(replace(node, gpus=tuple(slots)))
    layers = tuple(_with_slowed_times(layer, renamed) for layer in profile.layers)
    return replace(cluster, nodes=tuple(nodes)), replace(profile, layers=layers)


def _with_slowed_times(layer: LayerProfile, renamed: Mapping[tuple[str, float], str]) -> LayerProfile:
    """Every time key of an original type (TP keys `TYPE@tpN` too) copied to its slowed names."""
    times = {}
    for field in ("fwd_s", "bwd_s", "update_s"):
        table = dict(getattr(layer, field))
        for key, seconds in getattr(layer, field).items():
            base, at, tp = key.partition("@")
            for (original, factor), name in renamed.items():
                if base == original:
                    table[f"{name}{at}{tp}"] = seconds * factor
        times[field] = table
    return replace(layer, **times)
