"""Profile files: hetsim's own YAML/JSON, or PipeDream's graph.txt, told apart by suffix.

hetsim.profile holds the profile itself and hetsim.pipedream_graph the graph.txt format; loading
lives here so that neither of those two needs the other's module.
"""

from __future__ import annotations

import json
from pathlib import Path

from hetsim.data import resolve
from hetsim.errors import SpecError
from hetsim.fields import Fields, dump_yaml
from hetsim.outputs import write_text
from hetsim.pipedream_graph import read_graph
from hetsim.profile import ModelProfile, profile_from_dict

__all__ = ["load_profile", "save_profile"]


def load_profile(path: str | Path, *, graph_gpu_type: str = "reference",
                 graph_batch_size: int | None = None) -> ModelProfile:
    """Load hetsim's YAML/JSON profile, or PipeDream's graph.txt, whose times then belong to
    `graph_gpu_type` and whose sizes to `graph_batch_size` (the file states neither)."""
    path = resolve("profile", path)
    if path.suffix == ".txt":
        return read_graph(path, gpu_type=graph_gpu_type, batch_size=graph_batch_size)
    f = Fields.load(path)
    return profile_from_dict(f.data, path.name)


def save_profile(profile: ModelProfile, path: str | Path) -> None:
    """YAML, or JSON for a .json path; not .txt, which load_profile reads as PipeDream's graph.txt."""
    path = Path(path)
    if path.suffix == ".txt":
        raise SpecError(f"{path}: a .txt profile is read as PipeDream's graph.txt; save as .yaml or .json, or "
                        "write graph.txt with hetsim.pipedream_graph.write_graph (one GPU type's times)")
    doc = profile.to_dict()
    if path.suffix == ".json":
        write_text(path, json.dumps(doc, indent=1) + "\n")
    else:
        write_text(path, dump_yaml(doc, sort_keys=False, width=120))
