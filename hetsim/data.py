"""Where the shipped data lives, and how names like "hetpipe_4node" resolve to files."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hetsim.errors import SpecError

__all__ = ["data_root", "resolve", "DEFAULT_CLUSTER", "DEFAULT_PROFILE", "DEFAULT_PLAN"]

DEFAULT_CLUSTER = "hetpipe_4node"
DEFAULT_PROFILE = "vgg19_b32_analytic"
DEFAULT_PLAN = "hetpipe_vgg19_ed"

_KIND_DIRS = {"gpu": "gpus", "cluster": "clusters", "profile": "models", "plan": "plans"}


def data_root() -> Path:
    """The gpu_profiles/ folder, from a checkout or an installed wheel alike."""
    return Path(str(resources.files("gpu_profiles")))


def resolve(kind: str, name_or_path: str | Path) -> Path:
    """A path as given if it exists, else a shipped file of that kind named `name_or_path`."""
    path = Path(name_or_path)
    if path.exists():
        return path
    folder = data_root() / _KIND_DIRS[kind]
    for suffix in (".yaml", ".yml", ".json", ".txt"):
        candidate = folder / f"{name_or_path}{suffix}"
        if candidate.exists():
            return candidate
    shipped = sorted(p.stem for p in folder.iterdir() if p.suffix in {".yaml", ".json"})
    raise SpecError(f"{name_or_path}: no such {kind} file, and no shipped {kind} of that name "
                    f"(shipped: {', '.join(shipped)})")
