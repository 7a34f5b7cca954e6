"""Sailor's formats (Strati et al., SOSP'25) read into hetsim's cluster, profile and plan.

Sailor ships plans its authors ran on real GPUs with the measured iteration time and peak memory, its
measured per-layer times and its fitted network bandwidths. A Sailor plan is one pipeline of
`num_stages` stages; stage s has `dp[s]` data-parallel replicas, each a tensor-parallel group
`[[[gpu_type, gpus_per_node, zone]], tp]`; training is synchronous 1F1B with a flush per iteration,
gradients all-reduced across replicas, and gbs / (mbs x dp) micro-batches per pipeline. In hetsim
terms: a micro-batch is a minibatch, a replica is a virtual worker, the schedule is 1f1b-deepspeed with
blocking_p2p and the sync mode bsp.

Where the data lives (`--data DIR`): profiles_tmp.json (`[model][gpu][mbs][tp][layer] = [fwd_s, bwd_s,
update_s]`; the update_s Sailor ships is the same in every layer, the whole model's step, which the
importer spreads over the layers by their parameters), network/intra_node_bandwidths.json and
network/multizone_bandwidths_het.json (per GPU type and GPU count `[[polynomial], plateau bytes/s]`;
hetsim takes the plateau, the rate of the large messages that dominate training traffic; a node's
figures are its zone's, the third field of each replica, and a one-node plan needs none) and
configs/basic_cluster_config.json (each GPU type's node size, which a replica's gpus_per_node may not
exceed).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hetsim.errors import SpecError
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.profile import ModelProfile, tp_key
from hetsim.transformer import TransformerShape, transformer_layers

__all__ = ["SailorRun", "Imported", "GPU_TYPES", "NVLINK_TYPES", "read_plan", "read_shape", "to_cluster",
           "to_profile", "to_plan", "import_run"]

# Sailor's GPU names -> hetsim's GPU files. Sailor's "RTX-2080" has 11 GiB: an RTX 2080 Ti.
GPU_TYPES = {"GH-96": "gh200", "A100-40": "a100", "A100-80": "a100-80", "V100-16": "v100",
             "Titan-RTX": "titan-rtx", "RTX-2080": "rtx-2080-ti", "RTX-3090": "rtx-3090"}
NVLINK_TYPES = {"GH-96", "A100-40", "A100-80", "V100-16"}   # their GPUs in a node share NVLink
_OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "sgd": "sgd"}


@dataclass(frozen=True)
class Group:
    """One stage replica: a tensor-parallel group of `tp` GPUs of one type."""

    stage: int
    replica: int
    gpu_type: str                 # Sailor's name
    gpus_per_node: int
    tp: int
    zone: str = "us-central1-a"   # the key of its node's bandwidths in Sailor's network file


@dataclass(frozen=True)
class SailorRun:
    name: str
    mbs: int
    gbs: int
    nodes: int
    layers: tuple[tuple[int, ...], ...]           # per stage
    groups: tuple[Group, ...]
    measured_iter_s: float | None
    measured_mem_bytes: int | None
    measured_grad_reduce_s: float | None
    file: str = ""                                # the plan file's name, for errors

    @property
    def where(self) -> str:
        return self.file or self.name

    @property
    def stages(self) -> int:
        return len(self.layers)

    def replicas(self, stage: int) -> list[Group]:
        return [g for g in self.groups if g.stage == stage]


def _load(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{Path(path).name}: not valid JSON ({exc.msg}, line {exc.lineno})") from None


def _field(doc: dict, key: str, where: str) -> Any:
    if not isinstance(doc, dict) or key not in doc:
        raise SpecError(f"{where}: {key}: missing")
    return doc[key]


def read_plan(path: str | Path) -> SailorRun:
    path = Path(path)
    try:
        run = _read_plan(path)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SpecError(f"{path.name}: not a Sailor plan as hetsim reads it ({exc}); see hetsim.sailor for "
                        "the format") from None
    for name, value in (("mbs", run.mbs), ("gbs", run.gbs)):
        if value < 1:
            raise SpecError(f"{path.name}: {name}: must be a positive integer, got {value}")
    for g in run.groups:
        if g.tp < 1 or g.gpus_per_node < 1:
            raise SpecError(f"{path.name}: pipeline_list[0].tmp_per_stage[{g.stage}][{g.replica}]: tensor-parallel "
                            f"degree and GPUs per node must be positive, got {g.tp} and {g.gpus_per_node}")
        if g.gpu_type not in GPU_TYPES:
            raise SpecError(f"{path.name}: pipeline_list[0].tmp_per_stage[{g.stage}][{g.replica}]: Sailor GPU type "
                            f"{g.gpu_type!r} has no hetsim GPU file (known: {', '.join(GPU_TYPES)})")
    empty = [s for s in range(run.stages) if not run.layers[s] or not run.replicas(s)]
    if not run.layers or empty:
        raise SpecError(f"{path.name}: pipeline_list[0]: stage(s) {empty or '(none)'} have no layers or no replicas")
    _check_stages_tile(run, path.name)
    return run


def _check_stages_tile(run: SailorRun, where: str) -> None:
    """Each stage a run of consecutive layers starting where the one before ended, the first at 0."""
    start = 0
    for s, layers in enumerate(run.layers):
        wrong = next(((got, start + j) for j, got in enumerate(layers) if got != start + j), None)
        if wrong is not None:
            raise SpecError(f"{where}: pipeline_list[0].layers_per_stage[{s}]: layer {wrong[0]} where {wrong[1]} "
                            "was expected (a stage's layers are consecutive, "
                            + (f"from where stage {s - 1} ended)" if s else "from 0)"))
        start += len(layers)


def _read_plan(path: Path) -> SailorRun:
    doc, where = _load(path), path.name
    pipelines = _field(doc, "pipeline_list", where)
    if not isinstance(pipelines, list) or len(pipelines) != 1:
        raise SpecError(f"{where}: pipeline_list: expected one pipeline, got {len(pipelines) if isinstance(pipelines, list) else pipelines!r}")
    p, at = pipelines[0], f"{where}: pipeline_list[0]"
    stages = _field(p, "layers_per_stage", at)
    if not isinstance(stages, list) or not all(isinstance(st, list) and all(_whole(i) for i in st) for st in stages):
        raise SpecError(f"{at}.layers_per_stage: expected a list of stages, each a list of layer indices, "
                        f"got {stages!r}")
    layers = tuple(tuple(stage) for stage in stages)
    replicas = _field(p, "tmp_per_stage", at)
    if not isinstance(replicas, list) or len(replicas) != len(layers):
        raise SpecError(f"{at}.tmp_per_stage: {len(replicas) if isinstance(replicas, list) else replicas!r} stages, "
                        f"but layers_per_stage has {len(layers)}")
    groups = []
    for s, stage in enumerate(replicas):
        for r, item in enumerate(stage):
            try:
                (gpu_type, per_node, zone), tp = item[0][0], item[1]
            except (TypeError, IndexError, ValueError, KeyError):
                raise SpecError(f"{at}.tmp_per_stage[{s}][{r}]: expected "
                                f"[[[gpu_type, gpus_per_node, zone]], tp], got {item!r}") from None
            if len(item[0]) != 1:
                raise SpecError(f"{at}.tmp_per_stage[{s}][{r}]: a tensor-parallel group over {len(item[0])} "
                                "machines (Metis's form); hetsim's tensor-parallel groups lie in one node")
            if not (_whole(per_node) and _whole(tp)):
                raise SpecError(f"{at}.tmp_per_stage[{s}][{r}]: gpus_per_node and tp must be whole numbers, "
                                f"got {per_node!r} and {tp!r}")
            if not isinstance(zone, str) or not zone:
                raise SpecError(f"{at}.tmp_per_stage[{s}][{r}]: zone: expected a zone name such as "
                                f"'us-central1-a', got {zone!r}")
            groups.append(Group(s, r, str(gpu_type), per_node, tp, zone))
    _check_declared(p, at, layers, replicas)
    fields = {name: _field(doc, name, where) for name in ("mbs", "gbs")} | {"N": doc.get("N", 0)}
    for name, value in fields.items():
        if not _whole(value):
            raise SpecError(f"{where}: {name}: expected a whole number, got {value!r}")
    return SailorRun(name=path.stem, mbs=fields["mbs"], gbs=fields["gbs"], nodes=fields["N"], layers=layers,
                     groups=tuple(groups), measured_iter_s=_measured(doc, "real", where, float),
                     measured_mem_bytes=_measured(doc, "max_mem", where, int),
                     measured_grad_reduce_s=_measured(doc, "red_grads", where, float, zero=True), file=path.name)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_declared(pipeline: dict, at: str, layers: tuple, replicas: list) -> None:
    """Sailor's own counts beside the lists they count, where given, agree with them."""
    declared = pipeline.get("num_stages", len(layers))
    if declared != len(layers):
        raise SpecError(f"{at}.num_stages: {declared!r}, but layers_per_stage lists {len(layers)} stages")
    dp = pipeline.get("dp", [len(r) for r in replicas])
    if not isinstance(dp, list) or dp != [len(r) for r in replicas]:
        raise SpecError(f"{at}.dp: {dp!r}, but tmp_per_stage lists {[len(r) for r in replicas]} replicas per stage")


def _measured(doc: dict, key: str, where: str, kind: type, zero: bool = False) -> Any:
    """A measured figure of the run (None where the plan has none): finite, and positive."""
    value = doc.get(key)
    if value is None or (key == "max_mem" and value == 0):      # Sailor writes 0 where it read none
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero):
        raise SpecError(f"{where}: {key}: expected a measured {'figure >= 0' if zero else 'figure > 0'}, got {value!r}")
    return kind(value)


def read_shape(training_config: str | Path) -> tuple[str, TransformerShape, str]:
    """(Sailor's model name, the shape, hetsim's optimizer name) from a training_config_*.json."""
    path = Path(training_config)
    try:
        model, shape, optimizer = _read_shape(path)
    except SpecError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"{path.name}: not a Sailor training config as hetsim reads it ({exc})") from None
    for name, key in (("n_layer", "num_layers"), ("hidden", "hidden_size"), ("heads", "heads"),
                      ("seq_len", "sequence_length"), ("vocab", "vocab_size")):
        if getattr(shape, name) < 1:
            raise SpecError(f"{path.name}: {key}: must be a positive integer, got {getattr(shape, name)}")
    if shape.hidden % shape.heads:
        raise SpecError(f"{path.name}: hidden_size {shape.hidden} is not a multiple of heads {shape.heads}")
    return model, shape, optimizer


def _read_shape(path: Path) -> tuple[str, TransformerShape, str]:
    doc, where = _load(path), path.name
    count = lambda key, default=None: _count(doc, key, where, default)
    n_layer = count("num_layers")
    tail = count("num_all_layers", n_layer + 2) - n_layer - 1
    if tail not in (1, 2):
        raise SpecError(f"{where}: num_all_layers: {doc.get('num_all_layers')} leaves {tail} layers after "
                        f"the embedding and {n_layer} blocks; hetsim reads 1 (norm + head) or 2")
    llama = "llama" in str(doc.get("model", "")).lower()
    shape = TransformerShape(
        n_layer=n_layer, hidden=count("hidden_size"), heads=count("heads"), seq_len=count("sequence_length"),
        vocab=count("vocab_size"), ffn=count("ffn_hidden_size", 14336 if llama else 0),
        kv_heads=count("num_kv_heads", 8 if llama else 0), gated_mlp=llama,
        learned_positions=not llama, tail_layers=tail)
    optimizer = _OPTIMIZERS.get(str(doc.get("optimizer", "adam")).lower())
    if optimizer is None:
        raise SpecError(f"{where}: optimizer: {doc.get('optimizer')!r} unknown (known: Adam, AdamW, SGD)")
    return str(_field(doc, "model", where)), shape, optimizer


def _count(doc: dict, key: str, where: str, default: int | None = None) -> int:
    """A whole-number field of a training config (1024 or 1024.0; not "1024", 32.9 or true)."""
    value = _field(doc, key, where) if default is None else doc.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _whole(value):
        raise SpecError(f"{where}: {key}: expected a whole number, got {value!r}")
    return value


def _hetsim_type(gpu_type: str) -> str:
    if gpu_type not in GPU_TYPES:
        raise SpecError(f"Sailor GPU type {gpu_type!r} has no hetsim GPU file (known: {', '.join(GPU_TYPES)})")
    return GPU_TYPES[gpu_type]


def _node_name(i: int) -> str:
    return f"n{i}"


def _placement(run: SailorRun) -> tuple[list[tuple[str, int, str]], dict[Group, list[str]]]:
    """Nodes (Sailor type, GPU count, zone) and each group's GPU ids. A group takes whole GPUs of one
    node of its type and zone: a fresh node when the plan has one node per group (as Sailor's runs do),
    else the first such node with enough free GPUs."""
    nodes: list[tuple[str, int, str]] = []
    free: list[int] = []
    ids: dict[Group, list[str]] = {}
    fresh = run.nodes == len(run.groups) or run.nodes == 0
    for g in run.groups:
        if g.tp > g.gpus_per_node:
            raise SpecError(f"{run.where}: stage {g.stage} replica {g.replica}: tensor-parallel degree {g.tp} "
                            f"exceeds the {g.gpus_per_node} GPUs of a {g.gpu_type} node")
        slot = None if fresh else next((i for i, (t, _n, z) in enumerate(nodes)
                                        if (t, z) == (g.gpu_type, g.zone) and free[i] >= g.tp), None)
        if slot is None:
            nodes.append((g.gpu_type, g.gpus_per_node, g.zone))
            free.append(g.gpus_per_node)
            slot = len(nodes) - 1
        first = nodes[slot][1] - free[slot]
        ids[g] = [f"{_node_name(slot)}/gpu{first + k}" for k in range(g.tp)]
        free[slot] -= g.tp
    if run.nodes and len(nodes) > run.nodes:
        raise SpecError(f"{run.where}: N: {run.nodes} nodes, but the plan's groups take {len(nodes)} "
                        f"(one per group where N equals the number of groups, else packed by GPU type)")
    return nodes, ids


def _check_node_sizes(run: SailorRun, data: Path, where: str) -> None:
    """A group's gpus_per_node against the node size configs/basic_cluster_config.json gives its type
    (where the data folder has that file)."""
    path = data / "configs" / "basic_cluster_config.json"
    if not path.is_file():
        return
    sizes = _load(path)
    for g in run.groups:
        entry = sizes.get(g.gpu_type) if isinstance(sizes, dict) else None
        size = entry.get("gpus_per_node") if isinstance(entry, dict) else None
        if _whole(size) and g.gpus_per_node > size:
            raise SpecError(f"{where}: pipeline_list[0].tmp_per_stage[{g.stage}][{g.replica}]: {g.gpus_per_node} "
                            f"GPUs per {g.gpu_type} node, but {path.name} gives {g.gpu_type} nodes {size}")


def _plateau(table: dict, *keys: str) -> float | None:
    for key in keys:
        if not isinstance(table, dict) or key not in table:
            return None
        table = table[key]
    try:
        return float(table[1])
    except (TypeError, ValueError, IndexError, KeyError):
        raise SpecError(f"network file: {'/'.join(keys)}: expected [[polynomial], plateau bytes/s], "
                        f"got {table!r}") from None


def to_cluster(run: SailorRun, data: Path) -> dict:
    """A hetsim cluster document: a node per Sailor node, its GPU links and network interface from
    Sailor's fitted bandwidths (looked up in each node's zone), and a slower path between two nodes
    where Sailor measured one. A one-node plan needs no bandwidth between nodes."""
    nodes, _ids = _placement(run)
    intra = _load(data / "network" / "intra_node_bandwidths.json")
    inter = _load(data / "network" / "multizone_bandwidths_het.json")
    docs = []
    for i, (gtype, count, zone) in enumerate(nodes):
        _hetsim_type(gtype)                   # an unknown type is named before any bandwidth lookup
        fabric = _plateau(intra, gtype, str(count))
        if fabric is None:                     # one GPU per node: nothing to measure inside
            fabric = max((v[1] for v in intra.get(gtype, {}).values()), default=16e9)
        node = {"name": _node_name(i), "gpus": [{"type": _hetsim_type(gtype), "count": count}],
                "intra_link": {"kind": "nvlink" if gtype in NVLINK_TYPES else "pcie",
                               "bandwidth_GBps": round(fabric / 1e9, 4)}}
        if len(nodes) > 1:
            node.update(_interface(run, inter, gtype, count, zone))
        docs.append(node)
    doc = {"name": f"sailor-{run.name}", "description": f"imported from Sailor plan {run.name}",
           "network": {"kind": "ethernet", "bandwidth_GBps": max(d["network"]["bandwidth_GBps"] for d in docs)}
           if len(nodes) > 1 else {"kind": "ethernet", "bandwidth_GBps": docs[0]["intra_link"]["bandwidth_GBps"]},
           "nodes": docs}
    if len(nodes) == 1:
        doc["description"] += " (one node: its network is not used, and is set to the node's own link)"
    paths = _slow_paths(nodes, docs, inter)
    if paths:
        doc["paths"] = paths
    return doc


def _interface(run: SailorRun, inter: dict, gtype: str, count: int, zone: str) -> dict:
    """A node's network interface: Sailor's bandwidth between two such nodes in its zone. A node whose
    bandwidth grows with the GPUs talking (n GPUs: ~n x one GPU's) has an interface per GPU; one whose
    bandwidth does not shares a single interface."""
    if zone not in inter:
        where = next(f"tmp_per_stage[{g.stage}][{g.replica}]" for g in run.groups if g.zone == zone)
        raise SpecError(f"{run.where}: pipeline_list[0].{where}: zone {zone!r} is not in "
                        f"multizone_bandwidths_het.json (it has {', '.join(sorted(inter))})")
    nic = _plateau(inter, zone, gtype, str(count), zone, gtype, str(count))
    if nic is None:
        raise SpecError(f"multizone_bandwidths_het.json: no bandwidth between two {gtype} nodes of {count} GPUs "
                        f"in {zone}, which {run.name}'s nodes talk over")
    single = _plateau(inter, zone, gtype, "1", zone, gtype, "1")
    rails = count > 1 and single is not None and nic >= 0.9 * count * single
    out: dict = {"network": {"kind": "ethernet", "bandwidth_GBps": round((single if rails else nic) / 1e9, 4)}}
    if rails:
        out["nic_per_gpu"] = True
    return out


def _slow_paths(nodes: list[tuple[str, int, str]], docs: list[dict], inter: dict) -> list[dict]:
    """A path between two nodes where Sailor measured the pair slower than both interfaces."""
    paths = []
    for a in range(len(nodes)):
        for b in range(a + 1, len(nodes)):
            (ta, na, za), (tb, nb, zb) = nodes[a], nodes[b]
            pair = _plateau(inter, za, ta, str(na), zb, tb, str(nb))
            if pair is not None and pair < 0.9 * min(_node_Bps(docs[a]), _node_Bps(docs[b])):
                paths.append({"nodes": [_node_name(a), _node_name(b)], "bandwidth_GBps": round(pair / 1e9, 4)})
    return paths


def _node_Bps(node: dict) -> float:
    """All of a node's network bandwidth, summed over its interfaces."""
    per = node["network"]["bandwidth_GBps"] * 1e9
    return per * node["gpus"][0]["count"] if node.get("nic_per_gpu") else per


def to_profile(run: SailorRun, model: str, shape: TransformerShape, data: Path | None) -> ModelProfile:
    """Counted layers (hetsim.transformer) at the plan's micro-batch, with Sailor's measured times for
    every (GPU type, TP degree) the plan uses when `data` has them; with `data` None, no times (derive
    them, e.g. `hetsim.derive`)."""
    layers = transformer_layers(shape, run.mbs)
    if data is not None:
        measured = _load(data / "profiles_tmp.json")
        times: list[dict[str, dict[str, float]]] = [{"fwd": {}, "bwd": {}, "upd": {}} for _ in layers]
        for gtype, tp in sorted({(g.gpu_type, g.tp) for g in run.groups}):
            rows = _measured_rows(measured, model, gtype, run.mbs, tp, len(layers))
            key = tp_key(_hetsim_type(gtype), tp)
            updates = _layer_updates([r[2] for r in rows], [l.param_bytes for l in layers])
            for i, ((f, b, _u), u) in enumerate(zip(rows, updates)):
                times[i]["fwd"][key], times[i]["bwd"][key], times[i]["upd"][key] = f, b, u
        layers = [replace(l, fwd_s=t["fwd"], bwd_s=t["bwd"], update_s=t["upd"]) for l, t in zip(layers, times)]
    source = (f"{model} ({shape.n_layer} blocks, hidden {shape.hidden}, seq {shape.seq_len}): layers counted "
              f"by hetsim.transformer" + ("; times measured by Sailor (profiles_tmp.json)" if data else ""))
    return ModelProfile(model=model, batch_size=run.mbs, layers=tuple(layers),
                        edges=tuple((i, i + 1) for i in range(len(layers) - 1)),
                        input_bytes=8 * shape.seq_len * run.mbs, source=source,
                        tokens_per_sample=shape.seq_len, tp_divisor=shape.tp_divisor,
                        precision="tf32" if data is not None else None)    # Sailor's "FP32" runs, TF32 products


def _layer_updates(column: list[float], param_bytes: list[int]) -> list[float]:
    """Per-layer optimizer-step seconds from Sailor's third column. Where every layer carries the same
    figure (all 213 tables Sailor ships), it is the whole model's step on one GPU of the TP group: at
    the GPUs' datasheet memory bandwidth it moves 11-19 bytes per parameter of the model's TP shard (a
    memory-bound Adam step), against 26 times that if it were each layer's own. The step is then
    spread over the layers by their parameters, which it reads and writes; a column that varies is
    per layer."""
    if len(set(column)) > 1 or not sum(param_bytes):
        return column
    total = sum(param_bytes)
    return [column[0] * b / total for b in param_bytes]


def _measured_rows(measured: dict, model: str, gtype: str, mbs: int, tp: int, n: int) -> list[list[float]]:
    if not isinstance(measured, dict) or model not in measured:
        have = ", ".join(sorted(measured)) if isinstance(measured, dict) else "none"
        raise SpecError(f"profiles_tmp.json: no times for model {model!r}, the training config's `model` (it has "
                        f"{have}); run with --derived to predict without measured times")
    try:
        table = measured[model][gtype][str(mbs)][str(tp)]
    except (KeyError, TypeError):
        have = sorted(measured.get(model, {}).get(gtype, {}), key=int)
        raise SpecError(f"profiles_tmp.json: no times for {model} on {gtype} at micro-batch {mbs}, "
                        f"tensor-parallel {tp} (micro-batches measured on {gtype}: {', '.join(have) or 'none'}); "
                        "run with --derived to predict without measured times") from None
    if len(table) != n:
        raise SpecError(f"profiles_tmp.json: {model}/{gtype}/{mbs}/{tp} has {len(table)} layers, the "
                        f"training config gives {n}")
    try:
        rows = [[float(x) for x in table[str(i)]] for i in range(n)]
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"profiles_tmp.json: {model}/{gtype}/{mbs}/{tp}: expected layers 0..{n - 1} of "
                        f"[fwd_s, bwd_s, update_s] ({type(exc).__name__}: {exc})") from None
    if any(len(r) != 3 for r in rows):
        raise SpecError(f"profiles_tmp.json: {model}/{gtype}/{mbs}/{tp}: each layer needs [fwd_s, bwd_s, update_s]")
    bad = next((i for i, r in enumerate(rows) if not all(math.isfinite(x) and x >= 0 for x in r)), None)
    if bad is not None:
        raise SpecError(f"profiles_tmp.json: {model}/{gtype}/{mbs}/{tp}/{bad}: times must be finite and >= 0, "
                        f"got {rows[bad]}")
    return rows


def to_plan(run: SailorRun, model: str, optimizer: str) -> Plan:
    """Replica r of every stage forms virtual worker r: DeepSpeed's pipeline schedule (Sailor ran
    Megatron-DeepSpeed, whose pipelines run on DeepSpeed's engine: lockstep 1F1B steps) with blocking
    sends (a send holds its sender until delivered, a receive waits only for the data), BSP all-reduce
    per stage. Blocking sends rather than gloo's rendezvous, which holds both ends, is a choice checked
    against Sailor's measured runs (experiments/peers/sailor/README.md), not a verified NCCL property."""
    _nodes, ids = _placement(run)
    dp = {len(run.replicas(s)) for s in range(run.stages)}
    if len(dp) != 1:
        raise SpecError(f"{run.where}: stages have different data-parallel degrees {sorted(dp)}; hetsim's "
                        "virtual workers need the same number of replicas in every stage")
    n_dp = dp.pop()
    if run.gbs % (run.mbs * n_dp):
        raise SpecError(f"{run.where}: gbs {run.gbs} is not a multiple of mbs x dp = {run.mbs * n_dp}")
    bounds = [(min(l), max(l) + 1) for l in run.layers]
    vws = []
    for r in range(n_dp):
        stages = []
        for s in range(run.stages):
            group = ids[run.replicas(s)[r]]
            stages.append(StageSpec(gpu=group[0], tp_gpus=tuple(group[1:]), layers=bounds[s]))
        vws.append(VirtualWorker(name=f"dp{r}", stages=tuple(stages)))
    return Plan(name=run.name, model=model, minibatch_size=run.mbs, nm=run.gbs // (run.mbs * n_dp),
                schedule="1f1b-deepspeed", blocking_p2p=True, sync=SyncSpec(mode="bsp" if n_dp > 1 else "none"),
                virtual_workers=tuple(vws), cluster=f"sailor-{run.name}", optimizer=optimizer,
                notes=f"imported from Sailor plan {run.name} (gbs {run.gbs}, mbs {run.mbs}, dp {n_dp})")


@dataclass(frozen=True)
class Imported:
    cluster: dict                  # a cluster document (hetsim.cluster reads it)
    profile: ModelProfile
    plan: Plan
    run: SailorRun
    shape: TransformerShape


def import_run(plan_path: str | Path, data: str | Path, training_config: str | Path, *,
               measured_times: bool = True) -> Imported:
    """Everything `hetsim simulate` needs for one Sailor plan, and what was measured."""
    data = Path(data)
    needed = (["profiles_tmp.json"] if measured_times else []) + [
        "network/intra_node_bandwidths.json", "network/multizone_bandwidths_het.json"]
    missing = [n for n in needed if not (data / n).is_file()]
    if missing:
        raise SpecError(f"--data {data}: no {', '.join(missing)} there (a Sailor data folder has "
                        "profiles_tmp.json and network/)")
    run = read_plan(plan_path)
    model, shape, optimizer = read_shape(training_config)
    if max(run.layers[-1]) + 1 != shape.n_layers:
        raise SpecError(f"{Path(plan_path).name}: pipeline_list[0].layers_per_stage: the stages cover "
                        f"{max(run.layers[-1]) + 1} layers, the training config {shape.n_layers}")
    divisor = shape.tp_divisor
    for g in run.groups:
        if divisor % g.tp:
            raise SpecError(f"{Path(plan_path).name}: pipeline_list[0].tmp_per_stage[{g.stage}][{g.replica}]: "
                            f"tensor-parallel degree {g.tp} cannot split {model}'s {shape.heads} attention heads "
                            f"({shape.kv} key/value heads); a degree must divide {divisor}")
    _check_node_sizes(run, data, Path(plan_path).name)
    cluster = to_cluster(run, data)           # names an unknown GPU type before looking for its times
    profile = to_profile(run, model, shape, data if measured_times else None)
    return Imported(cluster, profile, to_plan(run, model, optimizer), run, shape)
