"""Where the shipped data lives, and how names like "hetpipe_4node" resolve to files."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from hetsim.errors import HetsimError, SpecError

__all__ = ["data_root", "resolve", "loaded", "pipedream_profiles", "pipedream_profile",
           "DEFAULT_CLUSTER", "DEFAULT_PROFILE", "DEFAULT_PLAN"]

DEFAULT_CLUSTER = "hetpipe_4node"
DEFAULT_PROFILE = "vgg19_b32_analytic"
DEFAULT_PLAN = "hetpipe_vgg19_ed"

_KIND_DIRS = {"gpu": "gpus", "cluster": "clusters", "profile": "models", "plan": "plans"}


def data_root() -> Path:
    """The gpu_profiles/ folder, from a checkout or an installed wheel alike."""
    return Path(str(resources.files("gpu_profiles")))


def pipedream_profiles() -> Path:
    """The folder of PipeDream's published graph.txt profiles (MIT; LICENSE.txt beside them)."""
    return data_root() / "pipedream"


def pipedream_profile(model: str) -> Path:
    """The shipped PipeDream graph.txt of `model` (e.g. "vgg16"), or a SpecError listing those shipped."""
    path = pipedream_profiles() / f"{model}.txt"
    if model == "LICENSE" or not path.is_file():
        shipped = sorted(p.stem for p in pipedream_profiles().glob("*.txt") if p.stem != "LICENSE")
        raise SpecError(f"{model}: no shipped PipeDream profile of that name (shipped: {', '.join(shipped)})")
    return path


def resolve(kind: str, name_or_path: str | Path) -> Path:
    """A path as given if it is a file, else a shipped file of that kind named `name_or_path` (a folder
    of that name, say an output folder named after the plan, does not hide the shipped file)."""
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path):
        raise SpecError(f"{kind}: expected a file path or a shipped name, got "
                        f"{type(name_or_path).__name__} {name_or_path!r}"[:200])
    path = Path(name_or_path)
    if path.is_file():
        return path
    folder = data_root() / _KIND_DIRS[kind]
    for suffix in (".yaml", ".yml", ".json", ".txt"):
        candidate = folder / f"{name_or_path}{suffix}"
        if candidate.is_file():
            return candidate
    if path.is_dir():
        raise SpecError(f"{name_or_path}: a folder, not a {kind} file, and no shipped {kind} of that name")
    if path.exists():
        return path                      # not a regular file (a pipe, /dev/stdin): the reader says what it is
    shipped = sorted(p.stem for p in folder.iterdir() if p.suffix in {".yaml", ".json"})
    raise SpecError(f"{name_or_path}: no such {kind} file, and no shipped {kind} of that name "
                    f"(shipped: {', '.join(shipped)})")


def loaded(name: str, value: Any, kind: type, load: Callable[[Any], Any]) -> Any:
    """`value` as a `kind`: itself, or `load(value)` for a file path or a shipped name; anything else
    is refused naming the argument `name` (a swapped or missing argument would fail deep inside)."""
    if isinstance(value, kind):
        return value
    if isinstance(value, (str, os.PathLike)) and str(value):
        return load(value)
    raise HetsimError(f"{name}: expected a {kind.__name__}, a file path or a shipped name, got "
                      f"{type(value).__name__} {value!r}"[:200])
