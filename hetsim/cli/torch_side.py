"""The way from hetsim's CLI to the work that needs torch (executor/, modelzoo/), without importing it.

hetsim (specs, schedules, simulator, planner, reports) imports no torch, executor or model zoo code;
they import hetsim (tests/test_layers.py checks both). The commands that measure or run models name
their torch-side code in TORCH_SIDE and load it only when they run, so `hetsim --help` and every
simulator command work without torch. A table rather than package entry points: it needs no
reinstall when it changes, and a stale build's metadata cannot hide a command.
"""

from __future__ import annotations

import importlib
from typing import Callable

from hetsim.errors import HetsimError

__all__ = ["TORCH_SIDE", "torch_side"]

# name -> "module:attribute" on the torch side, and who calls it.
TORCH_SIDE = {
    "validate": "executor.validate:run",                        # `hetsim validate`
    "profile": "modelzoo.profile_command:run",                  # `hetsim profile`, once its arguments check out
    "sailor_derived_times": "modelzoo.sailor_times:derived_times",  # `hetsim import sailor --derived`
}


def torch_side(name: str) -> Callable:
    """The torch-side callable registered as `name`, imported now; a HetsimError when torch is missing."""
    module, _, attribute = TORCH_SIDE[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in ("torch", module.split(".")[0]):
            raise                                   # a bug on the torch side, not a missing install
        raise HetsimError(f"{name}: needs {missing}, which is not installed here; "
                          "pip install -e '.[executor]'") from None
