"""The steady-state window that a prediction and a measurement both count throughput over.

The window opens when the last virtual worker completes its warm-up minibatches and closes when the
first one completes its last, so every VW is running throughout. Per-GPU times are taken over it.

Each VW's rate is timed from completion to completion, so periodic behaviour (a VW that completes in
bursts, or at another phase than the others, as under BSP) is measured exactly: from the end of its
warm-up to its last completion inside the window. A run's tail, after the first VW has finished and
left the cores and links to the others (up to D waves of it under WSP), is not steady state and
would flatter the slower VWs of short runs, so it is left out.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["SteadyWindow", "steady_window"]


@dataclass(frozen=True)
class SteadyWindow:
    start: float
    end: float
    spans: tuple[tuple[float, float, int], ...]     # per VW: (first, last completion, minibatches)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def minibatches(self, vw: int) -> int:
        return self.spans[vw][2]

    def rate(self, vw: int) -> float:
        """Minibatches per second of one VW."""
        t0, t1, n = self.spans[vw]
        return n / (t1 - t0)


def steady_window(completions: list[list[float]], warmup: int, origin: float = 0.0) -> SteadyWindow | None:
    """The window over per-VW completion times (seconds, increasing, after `origin`), or None when some
    VW completes nothing after its warm-up, or finishes before another has warmed up."""
    if not completions or any(len(times) <= warmup for times in completions):
        return None
    firsts = [times[warmup - 1] if warmup else origin for times in completions]
    start, end = max(firsts), min(times[-1] for times in completions)
    if end <= start:
        return None
    spans = []
    for t0, times in zip(firsts, completions):
        last = bisect_right(times, end)         # completions at or before the window's end
        if last <= warmup:
            # Its first minibatch after warm-up completes after another VW has finished them all
            # (a large staleness bound in a short run): time its whole run after warm-up instead.
            last = len(times)
        spans.append((t0, times[last - 1], last - warmup))
    return SteadyWindow(start, end, tuple(spans))
