"""Bad input of every kind gets one clear answer: exit status 2, one line on stderr naming the file and
field (or the flag), no traceback, nothing written to --out; mutations that leave an input valid run.

The corpus is generated from the shipped inputs: every field of a cluster, a GPU type (inline in a
cluster), a plan and a profile missing, of the wrong type, negative, zero, NaN, huge or an unknown name,
and an unknown field beside them; then bad values of every flag of simulate, plan, profile
(--no-measure) and import. All of it runs in-process through `hetsim.cli.main`. Last, property-based
tests feed the loaders arbitrary documents.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from hetsim.cli import main
from hetsim.cluster import load_cluster
from hetsim.data import data_root
from hetsim.errors import PlanError, SpecError
from hetsim.fields import Fields, parse_document, read_document
from hetsim.gpu import gpu_type_from_fields
from hetsim.plan import plan_from_dict
from hetsim.profile import profile_from_dict

SHIPPED = data_root()
SAILOR = Path(__file__).resolve().parents[1] / "experiments" / "peers" / "sailor" / "data"
MISSING = object()
# Time mappings have one entry per GPU type: mutate the entry of a type the cluster uses.
TIME_KEYS = {"fwd_s": "titan-v", "bwd_s": "titan-v"}
NUMBER_MUTATIONS = {"wrong type": "text", "negative": -1, "zero": 0, "NaN": math.nan, "huge": 1e300,
                    "large": 10**20}


# ---- mutations of a document ----------------------------------------------------------------------

def fields(doc: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) of every field: each key of a mapping, the first item of a list."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if path and TIME_KEYS.get(path[-1], key) != key:
                continue
            yield (*path, key), value
            yield from fields(value, (*path, key))
    elif isinstance(doc, list) and doc:
        yield (*path, 0), doc[0]
        yield from fields(doc[0], (*path, 0))


def variants(value: Any) -> Iterator[tuple[str, Any]]:
    """(mutation, replacement or MISSING) for a field holding `value`."""
    yield "missing", MISSING
    if isinstance(value, bool):
        yield "wrong type", "yes"
    elif isinstance(value, (int, float)):
        yield from NUMBER_MUTATIONS.items()
    elif isinstance(value, str):
        yield from (("wrong type", 7), ("unknown name", "no-such-name"))
    elif isinstance(value, list):
        yield from (("wrong type", "text"), ("empty", []))
    elif isinstance(value, dict):
        yield from (("wrong type", ["text"]), ("unknown field", {**value, "no_such_field": 1}))


def mutated(doc: Any, path: tuple, value: Any) -> Any:
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is MISSING:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


def where(path: tuple) -> str:
    """The field path as hetsim's errors write it: nodes[0].gpus[0].count."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else f".{key}" if text else str(key)
    return text


def field_name(path: tuple, mutation: str) -> str:
    """What a refusal must name: the unknown field, else the field (a list item: its list)."""
    if mutation == "unknown field":
        return "no_such_field"
    names = [k for k in path if isinstance(k, str)]
    return names[-1]


# ---- the inputs -----------------------------------------------------------------------------------

def shipped(kind: str, name: str) -> Any:
    return read_document(SHIPPED / kind / name)


CPU_PROFILE = {"model": "tiny", "batch_size": 4, "input_bytes": 4096, "layers": [
    {"name": f"l{i}", "kind": "Linear", "param_bytes": 65536, "output_bytes": 4096,
     "fwd_s": {"cpu": 1e-3}, "bwd_s": {"cpu": 2e-3}} for i in range(4)]}
CPU_PLAN = {"name": "cpu2", "minibatch_size": 4, "nm": 2, "schedule": "1f1b-flush", "sync": {"mode": "none"},
            "virtual_workers": [{"name": "vw0", "stages": [{"gpu": "host/gpu0", "layers": [0, 2]},
                                                           {"gpu": "host/gpu1", "layers": [2, 4]}]}]}
HETPIPE = {"cluster": ("cluster.yaml", shipped("clusters", "hetpipe_4node.yaml")),
           "profile": ("profile.json", shipped("models", "vgg19_b32_analytic.yaml")),
           "plan": ("plan.json", shipped("plans", "hetpipe_vgg19_ed.json"))}
CPU = {"cluster": ("cluster.yaml", shipped("clusters", "cpu_host.yaml")),
       "profile": ("profile.json", CPU_PROFILE), "plan": ("plan.json", CPU_PLAN)}


@dataclass(frozen=True)
class Case:
    id: str
    files: dict[str, Any]           # file name -> document, written to the test's folder
    argv: tuple[str, ...]           # "{tmp}" stands for that folder
    names: tuple[str, ...]          # what the one-line refusal must contain


def simulate_argv(inputs: dict) -> tuple[str, ...]:
    return ("simulate", "--cluster", "{tmp}/" + inputs["cluster"][0], "--profile", "{tmp}/" + inputs["profile"][0],
            "--plan", "{tmp}/" + inputs["plan"][0], "--waves", "2", "--out", "{tmp}/out", "--no-plots")


def file_cases(label: str, inputs: dict, role: str, prefix: tuple = ()) -> Iterator[Case]:
    """Every mutation of one input (`role` of `inputs`), or of the part of it at `prefix`."""
    name, doc = inputs[role]
    part = doc
    for key in prefix:
        part = part[key]
    for path, value in fields(part):
        for mutation, new in variants(value):
            files = {n: d for n, d in inputs.values()} | {name: mutated(doc, (*prefix, *path), new)}
            yield Case(f"{label} {where(path)}: {mutation}", files, simulate_argv(inputs),
                       (name, field_name(path, mutation)))


def document_cases() -> Iterator[Case]:
    yield from file_cases("hetpipe_4node.yaml", HETPIPE, "cluster")
    yield from file_cases("cpu_host.yaml", CPU, "cluster")
    yield from file_cases("hetpipe_vgg19_ed.json", HETPIPE, "plan")
    yield from file_cases("vgg19_b32_analytic.yaml", HETPIPE, "profile")
    inline = copy.deepcopy(HETPIPE["cluster"][1]) | {"gpu_types": [shipped("gpus", "rtx-2060.yaml")]}
    yield from file_cases("rtx-2060.yaml", HETPIPE | {"cluster": ("cluster.yaml", inline)}, "cluster",
                          ("gpu_types", 0))
    yield from plan_structure_cases("hetpipe_vgg19_ed.json", HETPIPE, simulate_argv(HETPIPE))
    twice = mutated(HETPIPE["cluster"][1], ("parameter_servers",), ["node0", "node0"])
    yield Case("hetpipe_4node.yaml parameter_servers: a node twice",
               {n: d for n, d in HETPIPE.values()} | {"cluster.yaml": twice}, simulate_argv(HETPIPE),
               ("cluster.yaml", "parameter_servers"))
    # A link's bandwidth given twice: one field would silently win over the other.
    for path, extra, field in ((("network",), {"bandwidth_GBps": 50}, "bandwidth_gbit_s"),
                               (("nodes", 0, "intra_link"), {"bandwidth_GBps": 1}, "gen"),
                               (("nodes", 0, "intra_link"), {"kind": "nvlink", "bandwidth_GBps": 1, "gen": None},
                                "lanes")):
        link = {k: v for k, v in {**_at(HETPIPE["cluster"][1], path), **extra}.items() if v is not None}
        yield Case(f"hetpipe_4node.yaml {'.'.join(map(str, path))}: bandwidth set twice ({field})",
                   {n: d for n, d in HETPIPE.values()} | {"cluster.yaml": mutated(HETPIPE["cluster"][1], path, link)},
                   simulate_argv(HETPIPE), ("cluster.yaml", field))


def _at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def plan_structure_cases(label: str, inputs: dict, argv: tuple[str, ...]) -> Iterator[Case]:
    """Plans that load but break a rule of check_structure, which every command shares: one stops
    short of the model's last layer (once trained silently by the executor, and no answer from
    validate within 90 s), one uses a GPU twice."""
    name, doc = inputs["plan"]
    stages = doc["virtual_workers"][0]["stages"]
    short = mutated(doc, ("virtual_workers", 0, "stages", len(stages) - 1, "layers", 1), stages[-1]["layers"][1] - 1)
    twice = mutated(doc, ("virtual_workers", 0, "stages", 1, "gpu"), stages[0]["gpu"])
    files = {n: d for n, d in inputs.values()}
    yield Case(f"{label}: the last stage stops short of the last layer", files | {name: short}, argv,
               (name, "virtual_workers[0].stages", "layers"))
    yield Case(f"{label}: a GPU used twice", files | {name: twice}, argv,
               (name, "virtual_workers[0].stages[1].gpu", "already used"))


# ---- bad flags ------------------------------------------------------------------------------------

SIMULATE_FLAGS = [
    ("--waves", "0"), ("--waves", "-1"), ("--waves", "x"), ("--waves", "1.5"), ("--waves", "nan"),
    ("--waves", "100000"), ("--warmup-waves", "-1"), ("--warmup-waves", "x"), ("--warmup-waves", "2"),
    ("--seed", "-1"), ("--seed", "x"), ("--seed", "0.5"), ("--jitter", "-0.1"), ("--jitter", "nan"),
    ("--jitter", "inf"), ("--jitter", "x"), ("--jitter", "1e300"), ("--slowdown", "node0/gpu0=0"),
    ("--slowdown", "node0/gpu0=-1"), ("--slowdown", "node0/gpu0=nan"), ("--slowdown", "node0/gpu0=inf"),
    ("--slowdown", "node0/gpu0=fast"), ("--slowdown", "node9/gpu0=2"), ("--slowdown", "node0/gpu0"),
    ("--straggler", "x"), ("--straggler", "2:1"), ("--straggler", "-0.1:1"), ("--straggler", "0.5:-1"),
    ("--straggler", "0.5:nan"), ("--straggler", "0.5:inf"), ("--straggler", "0.5"), ("--graph-batch", "0"),
    ("--graph-batch", "x"), ("--out", "/dev/null/out"), ("--out", "{tmp}/plan.json/out"), ("--bogus", "1"),
    # Extreme but valid: they run.
    ("--waves", "1"), ("--warmup-waves", "0"), ("--straggler", "1:1e6"), ("--straggler", "0.5:1e12"),
    ("--seed", str(2**64)), ("--jitter", "1"), ("--slowdown", "node0/gpu0=1.5"),
]
SIMULATE_FILES = [("--cluster", "{tmp}/nope.yaml", "nope.yaml"), ("--cluster", "{tmp}", "a folder, not a cluster file"),
                  ("--cluster", "no-such-cluster", "no-such-cluster"), ("--profile", "{tmp}/nope.yaml", "nope.yaml"),
                  ("--plan", "{tmp}/nope.json", "nope.json"), ("--plan", "{tmp}/cluster.yaml", "cluster.yaml")]
PLAN_FLAGS = [
    ("--jobs", "0"), ("--jobs", "-1"), ("--jobs", "x"), ("--nm", "0"), ("--nm", "-1"), ("--nm", "x"), ("--nm", ""),
    ("--nm", "1,x"), ("--nm", "100000"), ("--staleness", "-1"), ("--staleness", "x"), ("--policies", ""),
    ("--policies", "XX"), ("--schedule", "x"), ("--top", "0"), ("--top", "x"), ("--margin", "-0.1"),
    ("--margin", "2"), ("--margin", "nan"), ("--waves", "0"), ("--waves", "1000000"), ("--jitter", "-1"),
    ("--jitter", "nan"), ("--seed", "-1"), ("--show", "-1"), ("--batch", "0"), ("--batch", "-1"), ("--batch", "x"),
    ("--graph-batch", "0"), ("--out", "/dev/null/plan.json"), ("--out", "{tmp}"),
]
PROFILE_FLAGS = [
    ("--model", "x"), ("--batch", "0"), ("--batch", "-1"), ("--batch", "x"), ("--batch", str(2**40)),
    ("--device", "tpu"), ("--device", "cuda:x"), ("--device", ""), ("--derive-for", "x"), ("--derive-for", ""),
    ("--precision", "x"), ("--repeats", "0"), ("--warmup", "-1"), ("--threads", "0"), ("--image-size", "0"),
    ("--image-size", "x"), ("--image-size", "7"), ("--out", "{tmp}/out/p.csv"), ("--out", "/dev/null/p.yaml"),
    ("--out", "{tmp}/out"), ("--graph-txt", "{tmp}/out/g.yaml"), ("--graph-txt", "/dev/null/g.txt"),
]
SAILOR_PLAN = SAILOR / "plans" / "gh200-opt350" / "plan_config_N16_D4.json"
SAILOR_CONFIG = SAILOR / "configs" / "training_config_opt_350.json"
IMPORT_ARGS = {"plan": str(SAILOR_PLAN), "--data": str(SAILOR), "--training-config": str(SAILOR_CONFIG),
               "--out": "{tmp}/out"}
IMPORT_FLAGS = [
    ("plan", "{tmp}/nope.json", "PLAN.json"), ("plan", "{tmp}", "PLAN.json"),
    ("plan", str(SAILOR_CONFIG), "pipeline_list"), ("--data", "{tmp}/nope", "--data"),
    ("--data", str(SAILOR_PLAN), "--data"), ("--data", "{tmp}", "profiles_tmp.json"),
    ("--training-config", "{tmp}/nope.json", "--training-config"), ("--training-config", "{tmp}", "--training-config"),
    ("--training-config", str(SAILOR_PLAN), "num_layers"), ("--out", "/dev/null/out", "--out"),
    ("--precision", "x", "--precision"),
]


# validate refuses these before it measures anything (a minute of probes and profiles).
VALIDATE_PLAN = {"name": "mlp2", "model": "mlp", "minibatch_size": 16, "nm": 2, "schedule": "1f1b",
                 "sync": {"mode": "none"},
                 "virtual_workers": [{"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 4]},
                                                                {"gpu": "node0/gpu1", "layers": [4, 9]}]}]}
VALIDATE = {"plan": ("plan.json", VALIDATE_PLAN)}
VALIDATE_FLAGS = [
    ("--waves", "0", "--waves"), ("--waves", "x", "--waves"), ("--warmup-waves", "-1", "--warmup-waves"),
    ("--warmup-waves", "30", "--warmup-waves"), ("--cores", "0", "--cores"), ("--cores", "nan", "--cores"),
    ("--colocated-work", "0", "--colocated-work"), ("--link-GBps", "-1", "--link-GBps"),
    ("--latency-us", "-1", "--latency-us"), ("--latency-us", "1e300", "--latency-us"),
    ("--link-GBps", "1e300", "--link-GBps"), ("--cores", "1e300", "--cores"), ("--seed", "-1", "--seed"), ("--device", "tpu", "--device"),
    ("--slowdown", "node0/gpu9=2", "--slowdown"), ("--slowdown", "node0/gpu0=0", "--slowdown"),
    ("--model", "nosuch", "--model: unknown model 'nosuch'"), ("--model-arg", "hidden=x", "--model-arg"), ("--model-arg", "nosuch=3", "nosuch"),
    ("--model-arg", "hidden=0", "--model-arg"), ("--model-arg", "hidden=-5", "--model-arg"),
    ("--out", "/dev/null/out", "--out"), ("--plan", "{tmp}/nope.json", "nope.json"),
    # 64 GiB of weights a stage: over this host's memory, told in the plan file's GPU names.
    ("--model-arg", "hidden=65536", "plan.json: stage 0 of vw0 on node0/gpu0 (CPU rank"),
]


def with_flag(argv: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    """argv with `flag` set to `value` (replaced where present, else added)."""
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
        return tuple(argv)
    return (*argv, flag, value)


def flag_cases() -> Iterator[Case]:
    files = {n: d for n, d in HETPIPE.values()}
    base = simulate_argv(HETPIPE)
    for flag, value in SIMULATE_FLAGS:
        argv = with_flag(base, flag, value)
        yield Case(f"simulate {flag} {value}", files, argv, (flag,))
    for flag, value, named in SIMULATE_FILES:
        yield Case(f"simulate {flag} {value}", files, with_flag(base, flag, value), (named,))
    plan = ("plan", "--cluster", "{tmp}/cluster.yaml", "--model", "{tmp}/profile.json", "--jobs", "1",
            "--waves", "2", "--nm", "1", "--policies", "NP", "--out", "{tmp}/out/plan.json")
    for flag, value in PLAN_FLAGS:
        yield Case(f"plan {flag} {value}", files, with_flag(plan, flag, value), (flag,))
    profile = ("profile", "--model", "mlp", "--batch", "4", "--no-measure", "--derive-for", "v100",
               "--out", "{tmp}/out/p.yaml")
    for flag, value in PROFILE_FLAGS:
        yield Case(f"profile {flag} {value}", {}, with_flag(profile, flag, value), (flag,))
    yield Case("profile --graph-gpu a100 (not derived)", {},
               (*profile, "--graph-txt", "{tmp}/out/g.txt", "--graph-gpu", "a100"), ("--graph-gpu",))
    validate = ("validate", "--plan", "{tmp}/plan.json", "--waves", "30", "--out", "{tmp}/out")
    for flag, value, named in VALIDATE_FLAGS:
        yield Case(f"validate {flag} {value}", {"plan.json": VALIDATE_PLAN}, with_flag(validate, flag, value), (named,))
    yield from plan_structure_cases("validate plan.json", VALIDATE, validate)
    for flag, value, named in IMPORT_FLAGS:
        args = IMPORT_ARGS | {flag: value}
        argv = ("import", "sailor", args.pop("plan"), *(x for item in args.items() for x in item))
        yield Case(f"import {flag} {value}", {}, argv, (named,))


# ---- running a case -------------------------------------------------------------------------------

# Mutations that leave the input valid: each must run (exit 0, a report written), not be refused.
VALID = {
    # Optional fields left out take their defaults; free text (names, descriptions, notes, sources,
    # a GPU's architecture and host link) may be anything. A plan may run on a cluster other than the
    # one it names (what-if), and with one virtual worker fewer.
    *(f"hetpipe_4node.yaml {field}" for field in (
        "name: unknown name", "description: missing", "description: unknown name", "network.latency_us: missing",
        "network.latency_us: zero", "nodes[0].intra_link.lanes: missing", "nodes[0].intra_link.latency_us: missing",
        "nodes[0].intra_link.latency_us: zero", "parameter_servers: missing", "parameter_servers[0]: missing")),
    *(f"cpu_host.yaml {field}" for field in (
        "name: unknown name", "description: missing", "description: unknown name",
        "gpu_types[0].display_name: unknown name", "gpu_types[0].sources[0]: unknown name",
        "network.latency_us: missing", "network.latency_us: zero", "nodes[0].intra_link.latency_us: missing",
        "nodes[0].intra_link.latency_us: zero", "nodes[0].shared_cores: missing")),
    *(f"hetpipe_vgg19_ed.json {field}" for field in (
        "name: missing", "name: unknown name", "model: missing", "cluster: missing", "cluster: unknown name",
        "sync.staleness_bound: missing", "sync.staleness_bound: zero", "notes: missing", "notes: unknown name",
        "virtual_workers[0]: missing", "virtual_workers[0].name: unknown name",
        "virtual_workers[0].stages[0].layers[0]: zero")),
    # A layer may take no time (a flatten), hold no weights or pass on nothing; input may be local.
    *(f"vgg19_b32_analytic.yaml {field}" for field in (
        "source: missing", "source: unknown name", "flop_convention: missing", "flop_convention: unknown name",
        "input_bytes: zero", "layers[0].name: unknown name", "layers[0].kind: missing", "layers[0].kind: unknown name",
        "layers[0].param_bytes: zero", "layers[0].output_bytes: zero", "layers[0].fwd_s.titan-v: zero",
        "layers[0].bwd_s.titan-v: zero", "layers[0].flops_fwd: missing", "layers[0].flops_fwd: zero")),
    # Renamed, the inline type is a new type and the cluster keeps the shipped rtx-2060.
    *(f"rtx-2060.yaml {field}" for field in (
        "name: unknown name", "display_name: unknown name", "architecture: missing", "architecture: unknown name",
        "tensor_cores: missing", "host_link: missing", "host_link: unknown name", "sources[0]: missing",
        "sources[0]: unknown name")),
    # Absurd but computable magnitudes run: a 1e20 Gbit/s link, a layer of 1e20 seconds (the link model
    # stays exact at such clock values), a GPU of 1e20 GiB.
    *(f"{field}: large" for field in (
        "hetpipe_4node.yaml network.bandwidth_gbit_s", "hetpipe_4node.yaml network.latency_us",
        "hetpipe_4node.yaml nodes[0].intra_link.lanes", "hetpipe_4node.yaml nodes[0].intra_link.latency_us",
        "cpu_host.yaml gpu_types[0].memory_gib", "cpu_host.yaml gpu_types[0].memory_bandwidth_GBps",
        "cpu_host.yaml gpu_types[0].peak_fp32_tflops", "cpu_host.yaml gpu_types[0].peak_fp16_tflops",
        "cpu_host.yaml network.bandwidth_GBps", "cpu_host.yaml network.latency_us",
        "cpu_host.yaml nodes[0].intra_link.bandwidth_GBps", "cpu_host.yaml nodes[0].intra_link.latency_us",
        "cpu_host.yaml nodes[0].shared_cores", "hetpipe_vgg19_ed.json sync.staleness_bound",
        "vgg19_b32_analytic.yaml batch_size", "vgg19_b32_analytic.yaml layers[0].fwd_s.titan-v",
        "vgg19_b32_analytic.yaml layers[0].bwd_s.titan-v", "vgg19_b32_analytic.yaml layers[0].flops_fwd",
        "rtx-2060.yaml memory_gib", "rtx-2060.yaml memory_bandwidth_GBps", "rtx-2060.yaml peak_fp32_tflops",
        "rtx-2060.yaml peak_fp16_tflops")),
    *(f"simulate {flag}" for flag in ("--waves 1", "--warmup-waves 0", "--straggler 1:1e6", "--straggler 0.5:1e12",
                                       f"--seed {2**64}", "--jitter 1", "--slowdown node0/gpu0=1.5")),
}
# Mutations whose refusal is about a consequence elsewhere, and names that instead.
CONSEQUENCES = {
    "hetpipe_4node.yaml nodes[0]: missing": ("cluster.yaml", "parameter_servers[0]", "node0"),
    "hetpipe_4node.yaml nodes[0].gpus[0].count: missing": ("plan.json", "node0/gpu1"),   # one GPU by default
    "cpu_host.yaml gpu_types: missing": ("cluster.yaml", "nodes[0].gpus[0].type", "'cpu'"),
    "cpu_host.yaml nodes[0].name: unknown name": ("plan.json", "host/gpu0"),
    "cpu_host.yaml nodes[0].gpus[0].count: missing": ("plan.json", "host/gpu1"),
    "vgg19_b32_analytic.yaml layers[0]: missing": ("plan.json", "has 43 layers"),
    # Memory that does not fit: the plan's first stage is named, with the GiB it needs.
    **{f"{field}: large": ("plan.json", "stage 0 of vw0", "GiB") for field in (
        "hetpipe_vgg19_ed.json minibatch_size", "vgg19_b32_analytic.yaml input_bytes",
        "vgg19_b32_analytic.yaml layers[0].param_bytes", "vgg19_b32_analytic.yaml layers[0].output_bytes")},
    "hetpipe_vgg19_ed.json nm: large": ("--waves", "plan.json's nm", "simulate fewer"),
}
CASES = [*document_cases(), *flag_cases()]


@pytest.fixture
def deadline():
    """A case that hangs fails after 30 s instead of stopping the test run."""
    def expire(_signum, _frame):
        raise TimeoutError("no answer within 30 s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def run_case(case: Case, tmp: Path, capsys) -> tuple[int, str, str]:
    for name, doc in case.files.items():
        text = json.dumps(doc, indent=1) if name.endswith(".json") else yaml.safe_dump(doc, sort_keys=False)
        (tmp / name).write_text(text)
    code = main([arg.replace("{tmp}", str(tmp)) for arg in case.argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_corpus_is_large_and_its_names_are_unique():
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
    assert VALID | set(CONSEQUENCES) <= {c.id for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_refused_in_one_line_and_valid_mutations_run(case, tmp_path, capsys, deadline):
    code, out, err = run_case(case, tmp_path, capsys)
    if case.id in VALID:
        assert code == 0, f"a valid input was refused: {err}"
        assert err == "" and json.loads((tmp_path / "out" / "report.json").read_text())["kind"] == "prediction"
        return
    assert code == 2, f"exit {code}, stderr {err!r}"
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetsim") and " error: " in lines[0], err
    for name in CONSEQUENCES.get(case.id, case.names):
        assert name in lines[0], f"{name!r} not named in {lines[0]!r}"
    assert not (tmp_path / "out").exists(), "a refused run wrote to --out"


# ---- the loaders on arbitrary documents -----------------------------------------------------------

FIELD_NAMES = sorted({str(k) for doc in (*(d for _, d in HETPIPE.values()), shipped("clusters", "cpu_host.yaml"),
                                         shipped("gpus", "rtx-2060.yaml"))
                      for path, _ in fields(doc) for k in path if isinstance(k, str)})
scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats()
           | st.text(max_size=8) | st.sampled_from(["node0", "titan-v", "hetpipe", "wsp", "pcie", "node0/gpu0"]))
keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=6)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
                         max_leaves=30)
edge_values = st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 0.5, 1e300, 10**30, 2**70, "", True, None, [], {}])


TMP = tempfile.TemporaryDirectory()


def load_cluster_doc(doc: Any) -> None:
    path = Path(TMP.name) / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    load_cluster(path)


LOADERS = {"cluster": load_cluster_doc, "plan": lambda doc: plan_from_dict(doc, "p.json"),
           "profile": lambda doc: profile_from_dict(doc, "m.yaml"),
           "gpu": lambda doc: gpu_type_from_fields(Fields(doc, "g.yaml"))}
BASES = {"cluster": HETPIPE["cluster"][1], "plan": HETPIPE["plan"][1], "gpu": shipped("gpus", "rtx-2060.yaml"),
         "profile": {**CPU_PROFILE, "layers": CPU_PROFILE["layers"][:2]}}


def refuses_in_one_line(load, doc: Any) -> None:
    """`load(doc)` accepts it or raises a one-line SpecError/PlanError; nothing else escapes."""
    try:
        load(doc)
    except (SpecError, PlanError) as exc:
        assert "\n" not in str(exc) and str(exc)


@pytest.mark.parametrize("kind", sorted(LOADERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents)
def test_loaders_refuse_arbitrary_documents_with_a_spec_error_only(kind, doc):
    refuses_in_one_line(LOADERS[kind], doc)


@pytest.mark.parametrize("kind", sorted(LOADERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=edge_values | documents | st.just(MISSING))
def test_loaders_refuse_a_shipped_document_with_any_field_replaced(kind, data, value):
    base = BASES[kind]
    path = data.draw(st.sampled_from([p for p, _ in fields(base)]))
    refuses_in_one_line(LOADERS[kind], mutated(base, path, value))


# Deep nesting, an integer too long to convert, unsafe tags, recursive aliases, NaN, overflow, a list key.
NASTY_TEXT = ["[" * 5000, "{a: " * 3000, "1" * 5000, "--- !!python/object:os.system\n", "a: &x [*x]", "NaN",
              "1e999", "? [a]\n: 1"]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60) | st.sampled_from(NASTY_TEXT), suffix=st.sampled_from([".yaml", ".json", ""]))
def test_parsing_any_text_gives_a_document_or_a_spec_error(text, suffix):
    try:
        parse_document(text, f"x{suffix}")
    except SpecError as exc:
        assert "\n" not in str(exc)


# ---- valid but extreme inputs: an answer, never a hang -------------------------------------------

ONE_GPU = mutated(shipped("clusters", "cpu_host.yaml"), ("nodes", 0, "gpus", 0, "count"), 1)
ONE_STAGE = CPU_PLAN | {"virtual_workers": [{"name": "vw0", "stages": [{"gpu": "host/gpu0", "layers": [0, 4]}]}]}
CPU_FILES = {"cluster.yaml": CPU["cluster"][1], "profile.json": CPU_PROFILE, "plan.json": CPU_PLAN}
CPU_SIM = ("simulate", "--cluster", "{tmp}/cluster.yaml", "--profile", "{tmp}/profile.json", "--plan",
           "{tmp}/plan.json", "--waves", "3", "--no-plots")
EXTREME = {   # id: (files over CPU_FILES, argv, exit status, what a refusal names)
    "a straggler 1e6 times slower": ({}, (*CPU_SIM, "--straggler", "1:1e6"), 0, ""),
    "one wave, no warm-up": ({}, with_flag(with_flag(CPU_SIM, "--waves", "1"), "--warmup-waves", "0"), 0, ""),
    "1e6 minibatches a wave": ({"plan.json": CPU_PLAN | {"nm": 10**6}}, CPU_SIM, 2, "nm"),
    "1e6 waves": ({}, with_flag(CPU_SIM, "--waves", str(10**6)), 2, "--waves"),
    "a 1-GPU cluster": ({"cluster.yaml": ONE_GPU, "plan.json": ONE_STAGE}, CPU_SIM, 0, ""),
    "a 1-GPU cluster, a 2-GPU plan": ({"cluster.yaml": ONE_GPU}, CPU_SIM, 2, "host/gpu1"),
    "planning for a 1-GPU cluster": ({"cluster.yaml": ONE_GPU}, (
        "plan", "--cluster", "{tmp}/cluster.yaml", "--model", "{tmp}/profile.json", "--jobs", "1", "--waves", "2",
        "--nm", "1", "--policies", "NP", "--out", "{tmp}/best.json"), 0, ""),
}


@pytest.mark.parametrize("case", sorted(EXTREME))
def test_extreme_but_valid_input_runs_or_is_refused_in_one_line_within_a_minute(case, tmp_path):
    files, argv, status, named = EXTREME[case]
    for name, doc in (CPU_FILES | files).items():
        (tmp_path / name).write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    command = [sys.executable, "-m", "hetsim", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)   # a hang fails here
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    if status:
        assert len(done.stderr.splitlines()) == 1 and named in done.stderr, done.stderr


def test_simulate_json_prints_nothing_but_json_on_stdout(tmp_path):
    for name, doc in CPU_FILES.items():
        (tmp_path / name).write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in (*CPU_SIM, "--json", "--out", "{tmp}/out")]
    done = subprocess.run([sys.executable, "-m", "hetsim", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kind"] == "prediction"


@pytest.mark.parametrize("name, text, message", [
    ("c.yaml", "name: a\nnodes: []\nname: b\n", "c.yaml: line 3: key 'name' is given twice"),
    ("c.yaml", "nodes:\n  - {name: n0, gpus: [], name: n1}\n", "c.yaml: line 2: key 'name' is given twice"),
    ("p.json", '{"nm": 4, "name": "x", "nm": 8}', "p.json: key 'nm' is given twice"),
])
def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(SpecError, match=f"/{message}"):
        read_document(tmp_path / name)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    (tmp_path / "c.yaml").write_text("base: &b {bandwidth_GBps: 10, kind: pcie}\nlink:\n  <<: *b\n  bandwidth_GBps: 20\n")
    assert read_document(tmp_path / "c.yaml")["link"] == {"bandwidth_GBps": 20, "kind": "pcie"}


@pytest.mark.parametrize("text, suffix", [("a: 1e-3\nb: -2E+5\nc: 1.5e3\nd: 7\ne: '1e3'\n", ".yaml"),
                                          ('{"a": 1e-3, "b": -2E+5, "c": 1.5e3, "d": 7, "e": "1e3"}', ""),
                                          ('{"a": 1e-3, "b": -2E+5, "c": 1.5e3, "d": 7, "e": "1e3"}', ".yml"),
                                          ('{"a": 1e-3, "b": -2E+5, "c": 1.5e3, "d": 7, "e": "1e3"}', ".JSON")])
def test_numbers_in_exponent_notation_are_numbers_in_any_file(text, suffix):
    """YAML 1.2 and JSON read 1e-3 as a number (PyYAML's YAML 1.1 wants a dot); a JSON document is
    read as JSON whatever its file is called (a plan saved as `best`)."""
    assert parse_document(text, f"x{suffix}") == {"a": 1e-3, "b": -2e5, "c": 1500.0, "d": 7, "e": "1e3"}


def test_a_plan_saved_under_any_name_loads_back(tmp_path, capsys):
    """hetsim plan --out NAME writes JSON (with numbers like 1e-05); simulate reads it back as written."""
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(ONE_GPU))
    (tmp_path / "profile.json").write_text(json.dumps(CPU_PROFILE))
    plan = ["plan", "--cluster", str(tmp_path / "cluster.yaml"), "--model", str(tmp_path / "profile.json"),
            "--jobs", "1", "--waves", "4", "--nm", "1", "--policies", "NP"]
    for name in ("best", "best.yaml", "best.JSON"):
        assert main([*plan, "--out", str(tmp_path / name)]) == 0
        capsys.readouterr()
        assert "1e-05" in (tmp_path / name).read_text()
        assert main(["simulate", "--cluster", str(tmp_path / "cluster.yaml"), "--profile", str(tmp_path / "profile.json"),
                     "--plan", str(tmp_path / name), "--waves", "4", "--no-plots"]) == 0, capsys.readouterr().err


def test_a_graph_txt_that_is_not_text_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "graph.txt").write_bytes(b"\x00\xff\xfe")
    assert main(["plan", "--cluster", "cpu_host", "--model", str(tmp_path / "graph.txt"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "graph.txt: not a text file" in err


def test_planning_a_profile_whose_layers_take_no_time_is_refused_naming_the_type(tmp_path, capsys):
    zero = CPU_PROFILE | {"layers": [layer | {"fwd_s": {"cpu": 0}, "bwd_s": {"cpu": 0.0}} for layer in CPU_PROFILE["layers"]]}
    (tmp_path / "profile.json").write_text(json.dumps(zero))
    assert main(["plan", "--cluster", "cpu_host", "--model", str(tmp_path / "profile.json"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every layer takes 0 s on cpu" in err


def test_text_that_reads_as_a_number_is_written_quoted_and_reads_back_as_text(tmp_path):
    """A cluster named 1e5 (text) is saved and loaded as named, now that 1e5 unquoted is a number."""
    from dataclasses import replace
    from hetsim.cluster import save_cluster
    cluster = replace(load_cluster(SHIPPED / "clusters" / "cpu_host.yaml"), name="1e5")
    save_cluster(cluster, tmp_path / "c.yaml")
    assert "name: '1e5'" in (tmp_path / "c.yaml").read_text()
    assert load_cluster(tmp_path / "c.yaml").name == "1e5"
