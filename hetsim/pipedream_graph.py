"""PipeDream's profile format (graph.txt), read and written.

    node4 -- Conv2d(64, 64, ...) -- forward_compute_time=46.201, backward_compute_time=113.330, activation_size=1644167168.000, parameter_size=147712.000
    	node3 -- node4

Times are milliseconds per minibatch; sizes are bytes for the whole minibatch. The file names neither
the GPU nor the batch size, so both are arguments here (gpu_profiles/pipedream/README.md).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path

from hetsim.errors import SpecError
from hetsim.fields import LARGEST, is_whole, read_text
from hetsim.outputs import write_text
from hetsim.profile import LayerProfile, ModelProfile, first_apart

__all__ = ["read_graph", "write_graph", "parse_graph"]

_METRIC = re.compile(r"(\w+)=(\[[^\]]*\]|[^,\s]+)")
_REQUIRED = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def read_graph(path: str | Path, *, gpu_type: str = "reference", batch_size: int | None = None,
               model: str | None = None) -> ModelProfile:
    path = Path(path)
    text = read_text(path, "a PipeDream graph.txt")
    return parse_graph(text, source_name=path.name, gpu_type=gpu_type,
                       batch_size=batch_size, model=model or path.stem)


def parse_graph(text: str, *, source_name: str, gpu_type: str = "reference",
                batch_size: int | None = None, model: str = "model") -> ModelProfile:
    if not isinstance(gpu_type, str) or not gpu_type:
        raise SpecError(f"{source_name}: gpu_type (--graph-gpu): expected a GPU type name, got {gpu_type!r}")
    if batch_size is not None and (not is_whole(batch_size) or batch_size < 1):
        raise SpecError(f"{source_name}: batch_size (--graph-batch): expected a whole number >= 1, got {batch_size!r}")
    nodes: dict[str, tuple[str, dict[str, float]]] = {}
    edges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("\t"):
            parts = [p.strip() for p in line.split(" -- ")]
            if len(parts) != 2:
                raise SpecError(f"{source_name}: line {lineno}: edge must read 'src -- dst'")
            if (parts[0], parts[1]) not in seen:      # PipeDream lists an edge once per use of a tensor
                seen.add((parts[0], parts[1]))
                edges.append((parts[0], parts[1]))
            continue
        try:
            name, rest = line.split(" -- ", 1)
            desc, metrics = rest.rsplit(" -- ", 1)
        except ValueError:
            raise SpecError(f"{source_name}: line {lineno}: node must read 'name -- description -- metrics'") from None
        if name.strip() in nodes:
            raise SpecError(f"{source_name}: line {lineno}: node {name.strip()} is listed twice")
        nodes[name.strip()] = (desc, _metrics(metrics, source_name, lineno))
    if not nodes:
        raise SpecError(f"{source_name}: no layers (expected lines 'name -- description -- metrics')")
    for src, dst in edges:
        for end in (src, dst):
            if end not in nodes:
                raise SpecError(f"{source_name}: edge {src} -- {dst}: no node {end!r}")
    names = list(nodes)
    at = {name: i for i, name in enumerate(names)}
    apart = first_apart(len(names), [(at[a], at[b]) for a, b in edges])
    if apart is not None:
        raise SpecError(f"{source_name}: node {names[apart]} is joined to node {names[0]} by no edge; a model's "
                        "layers form one graph")
    order = _topological(list(nodes), edges, source_name)
    index = {name: i for i, name in enumerate(order)}
    layers = tuple(_layer(name, *nodes[name], gpu_type) for name in order)
    inputs = [l.output_bytes for l in layers if l.kind.startswith("Input")]
    return ModelProfile(
        model=model, batch_size=batch_size or 1, layers=layers,
        edges=tuple(sorted((index[s], index[d]) for s, d in edges)),
        input_bytes=int(sum(inputs)),
        source=f"PipeDream graph.txt {source_name}, times for GPU type {gpu_type!r}",
    )


def _metrics(text: str, source_name: str, lineno: int) -> dict[str, float]:
    values = {}
    for key, raw in _METRIC.findall(text):
        if key not in _REQUIRED:
            continue
        try:
            if raw.startswith("["):
                value = sum(float(x) for x in raw.strip("[]").split(";") if x.strip())
            else:
                value = _seconds(raw) if key.endswith("_compute_time") else float(raw)
        except (ValueError, ArithmeticError):
            raise SpecError(f"{source_name}: line {lineno}: {key}={raw}: not a number") from None
        if not 0 <= value <= LARGEST:       # NaN fails both
            raise SpecError(f"{source_name}: line {lineno}: {key}={raw}: must be finite and >= 0")
        values[key] = value
    for key in _REQUIRED:
        if key not in values:
            raise SpecError(f"{source_name}: line {lineno}: {key}: missing")
    return values


def _layer(name: str, desc: str, m: dict[str, float], gpu_type: str) -> LayerProfile:
    return LayerProfile(name=name, kind=desc, param_bytes=int(m["parameter_size"]),
                        output_bytes=int(m["activation_size"]),
                        fwd_s={gpu_type: m["forward_compute_time"]},
                        bwd_s={gpu_type: m["backward_compute_time"]})


def _topological(names: list[str], edges: list[tuple[str, str]], source_name: str) -> list[str]:
    """Kahn's algorithm; ties break by the number in "nodeN" so the order is reproducible."""
    def key(name: str):
        digits = re.sub(r"\D", "", name)
        return (int(digits) if digits else math.inf, name)
    indegree = {n: 0 for n in names}
    succ: dict[str, list[str]] = {n: [] for n in names}
    for src, dst in edges:
        indegree[dst] += 1
        succ[src].append(dst)
    ready = sorted((n for n in names if indegree[n] == 0), key=key)
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m in succ[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
        ready.sort(key=key)
    if len(order) != len(names):
        raise SpecError(f"{source_name}: the layer graph has a cycle")
    return order


def _ms_text(seconds: float) -> str:
    """Milliseconds as decimal text: the shortest repr of `seconds` with the point moved three places,
    which `_seconds` reads back to exactly `seconds`."""
    return format(Decimal(repr(seconds)).scaleb(3).normalize(), "f")


def _seconds(ms_text: str) -> float:
    return float(Decimal(ms_text).scaleb(-3))


def write_graph(profile: ModelProfile, path: str | Path, *, gpu_type: str) -> None:
    """Write one GPU type's times in graph.txt form (names "nodeN" unless layers are named so)."""
    profile.require_gpu_type(gpu_type)
    names = [l.name if re.fullmatch(r"node\d+", l.name) else f"node{i}" for i, l in enumerate(profile.layers)]
    lines = []
    for name, l in zip(names, profile.layers):
        desc = (l.kind or l.name).replace(" -- ", " - ")
        lines.append(f"{name} -- {desc} -- forward_compute_time={_ms_text(l.fwd_s[gpu_type])}, "
                     f"backward_compute_time={_ms_text(l.bwd_s[gpu_type])}, "
                     f"activation_size={float(l.output_bytes)!r}, parameter_size={float(l.param_bytes)!r}")
    for src, dst in profile.edges:
        lines.append(f"\t{names[src]} -- {names[dst]}")
    write_text(path, "\n".join(lines) + "\n")
