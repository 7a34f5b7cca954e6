"""How many bytes torch allocates on the CPU at most while some code runs.

torch keeps no allocator statistics for CPU tensors, but its profiler records every CPU allocation
and free with its size (profile_memory). Summed in time order, they give the bytes alive at each
moment beyond those alive when the profile began (frees of older blocks are not recorded).
"""

from __future__ import annotations

from typing import Callable

__all__ = ["peak_bytes_during"]


def peak_bytes_during(run: Callable[[], object]) -> int | None:
    """The most bytes alive at once while `run()` runs, beyond those alive when it began; None where
    this torch's profiler gives no allocation records."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = getattr(getattr(prof.profiler, "kineto_results", None), "events", None)
    if events is None:
        return None
    live = top = 0
    for e in sorted((e for e in events() if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        live += e.nbytes()
        top = max(top, live)
    return top
