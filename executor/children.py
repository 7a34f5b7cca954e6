"""Results from helper processes the calibrations spawn, failing as soon as one of them dies."""

from __future__ import annotations

import queue
import time

__all__ = ["next_result"]


def next_result(out, procs, timeout_s: float, what: str):
    """The next item a child puts on `out`; a clear error as soon as a child dies without one (as
    spawned children do when the parent's __main__ cannot be imported), not after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=0.2)
        except queue.Empty:
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{what}: process {dead[0][0]} exited with code {dead[0][1]} "
                                   "before measuring (see its error above)")
    raise RuntimeError(f"{what}: no measurement within {timeout_s:.0f} s")
