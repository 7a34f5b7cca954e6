"""The import graph runs one way: hetsim (the simulator core) imports no torch, executor or model zoo
code, no package or module imports itself back through others, and simpy and matplotlib stay in the
one place each belongs (hetsim.sim, hetsim.plots).

Read from the source (every import statement, function-level ones included), not from what a test
run happens to load, so an import on a rarely taken path counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hetsim", "executor", "modelzoo")
TORCH_SIDE = ("torch", "executor", "modelzoo")


def _module_files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _module_files()


def imported_names(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(dotted name, line) of everything `source` imports, at any depth; `from a import b` names a.b
    when that is a module of ours, else a; relative imports are resolved against `module`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[:None if is_package else -1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out += [(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base, node.lineno)
                    for alias in node.names]
    return out


def _ours(name: str) -> str | None:
    """The longest prefix of `name` that is one of our modules."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def _graph() -> tuple[nx.DiGraph, list[tuple[str, int, str]]]:
    """Module import graph (edges carry the line) and every (module, line, name) imported."""
    graph, imports = nx.DiGraph(), []
    for module, path in MODULES.items():
        graph.add_node(module)
        for name, line in imported_names(module, path.read_text(), path.name == "__init__.py"):
            imports.append((module, line, name))
            target = _ours(name)
            if target and target != module:
                graph.add_edge(module, target, line=line)
    return graph, imports


GRAPH, IMPORTS = _graph()


def _where(graph: nx.DiGraph, cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph.edges[a, b]['line']})" for a, b in zip(cycle, cycle[1:] + cycle[:1]))


def test_the_graph_sees_function_level_and_relative_imports():
    source = "import os\nfrom . import plan\ndef f():\n    from executor.launch import launch\n    import torch.nn\n"
    names = [n for n, _ in imported_names("hetsim.cli.simulate", source)]
    assert names == ["os", "hetsim.cli.plan", "executor.launch", "torch.nn"]
    assert imported_names("hetsim.sim", "from . import engine\n", is_package=True) == [("hetsim.sim.engine", 1)]
    assert imported_names("hetsim.sim.wsp", "from ..plan import Plan\n") == [("hetsim.plan", 1)]
    assert len(MODULES) > 50 and GRAPH.number_of_edges() > 100


def test_the_simulator_core_imports_no_torch_executor_or_model_zoo():
    bad = [f"{m} line {line}: {name}" for m, line, name in IMPORTS
           if m.split(".")[0] == "hetsim" and name.split(".")[0] in TORCH_SIDE]
    assert not bad, "hetsim must not import the torch side:\n" + "\n".join(bad)


def test_only_the_simulator_imports_simpy_and_only_plots_import_matplotlib():
    owners = {"simpy": "hetsim.sim", "matplotlib": "hetsim.plots"}
    bad = [f"{m} line {line}: {name}" for m, line, name in IMPORTS
           if name.split(".")[0] in owners and not (m + ".").startswith(owners[name.split(".")[0]] + ".")]
    assert not bad, "\n".join(bad)


def test_packages_import_one_way():
    packages = nx.DiGraph()
    packages.add_nodes_from(PACKAGES)
    for a, b, data in GRAPH.edges(data=True):
        pa, pb = a.split(".")[0], b.split(".")[0]
        if pa != pb:
            packages.add_edge(pa, pb, line=data["line"], edge=f"{a} -> {b}")
    cycles = list(nx.simple_cycles(packages))
    assert not cycles, "package cycles: " + "; ".join(
        " / ".join(packages.edges[a, b]["edge"] + f" (line {packages.edges[a, b]['line']})"
                   for a, b in zip(c, c[1:] + c[:1])) for c in cycles)


def test_no_module_imports_itself_back_through_others():
    circles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    shown = [_where(GRAPH, [a for a, _ in nx.find_cycle(GRAPH.subgraph(c))]) for c in circles]
    assert not circles, "import circles:\n" + "\n".join(shown)


@pytest.mark.parametrize("name", ["validate", "profile", "sailor_derived_times"])
def test_every_torch_side_entry_resolves_to_a_callable(name):
    pytest.importorskip("torch")
    from hetsim.cli.torch_side import TORCH_SIDE, torch_side
    assert set(TORCH_SIDE) == {"validate", "profile", "sailor_derived_times"}
    assert callable(torch_side(name))


def test_without_torch_hetsim_simulates_and_the_torch_side_commands_say_what_is_missing(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"          # as if torch were not installed
            "from hetsim.cli import main\n"
            "codes = [main(['validate', '--plan', 'hetpipe_vgg19_ed']),\n"
            "         main(['profile', '--model', 'mlp', '--no-measure', '--derive-for', 'titan-v', '--out', 'x.yaml']),\n"
            "         main(['--help']), main(['simulate', '--waves', '4', '--quiet'])]\n"
            "assert codes == [2, 2, 0, 0], codes\n")
    # In a scratch folder: were the profile command to get past its check, x.yaml lands there.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    needs = "needs torch, which is not installed here; pip install -e '.[executor]'"
    assert done.stderr.splitlines() == [f"hetsim: error: validate: {needs}", f"hetsim: error: profile: {needs}"]
