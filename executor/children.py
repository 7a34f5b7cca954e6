"""Helper processes the executor and its calibrations spawn: they die with the process that started
them (no orphans when `hetsim validate` or a launcher is killed), and their results arrive with a
clear error as soon as one of them dies."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import time

__all__ = ["next_result", "die_with_parent", "reap"]

_PR_SET_PDEATHSIG = 1          # linux/prctl.h


def die_with_parent() -> None:
    """Call first thing in a spawned child: the kernel sends it SIGKILL when its parent exits, however
    the parent ends (SIGKILL included, which no handler or atexit in the parent sees). A stopped
    (SIGSTOP) child is killed too. Linux ties this to the thread that started the child, so start
    children from a thread that outlives them (every caller here waits for its children). Elsewhere
    than Linux, the executor's watchdog (executor.health) still ends a rank whose launcher is gone."""
    parent = multiprocessing.parent_process()
    if not sys.platform.startswith("linux") or parent is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent.pid:             # the parent died before the prctl took effect
        os._exit(1)


def reap(procs) -> None:
    """Kill and join whichever of `procs` still run (after an error or an interrupt in the parent: an
    exception must not leave children behind, nor make the interpreter's exit wait on them)."""
    started = [p for p in procs if p.pid is not None]      # an interrupt may come between two starts
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join()


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
