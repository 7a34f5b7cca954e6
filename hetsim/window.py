"""The steady-state window that a prediction and a measurement both count throughput over.

The window opens when the last virtual worker completes its warm-up minibatches and closes when the
first one completes its last counted one, so every VW is running throughout. Per-GPU times are taken
over it. A schedule that never flushes (1F1B, HetPipe) drains its pipeline only at the run's end: its
last wave's completions come without the forwards that interleave them in steady state (the first stage
only finishes backward passes), faster than steady state, so that wave is not counted (`drain`) where
the run has a wave to spare after its warm-up. Flush schedules drain in every wave alike.

Each VW's rate is timed from completion to completion over whole waves inside the window (or whole
repeats of its completions, where a simulated order repeats exactly every q minibatches and q does
not divide a wave), so periodic behaviour (a VW that completes in bursts, or at another phase than
the others, as under BSP) is measured exactly, and a VW that finished warming up early and then
waited for a late one (processes start at different times) is not timed over that wait. A run's tail, after the first VW has finished and
left the cores and links to the others (up to D waves of it under WSP), is not steady state and
would flatter the slower VWs of short runs, so it is left out.

Under WSP the staleness bound D holds every VW to the slowest one's pace in the long run: a faster VW
may lead by at most D clocks, so its lead is finite and adds nothing to the long-run rate. A finite
run counts that lead as rate (more so the shorter the run and the larger D), so a `locked` window
reports every VW at the slowest VW's rate; `free_rate` keeps what the window measured.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Sequence

__all__ = ["SteadyWindow", "steady_window", "window_opens", "window_closes", "counted", "default_warmup_waves"]


def default_warmup_waves(waves: int) -> int:
    """Warm-up waves left out when none are given: 2, or all but the last of a shorter run."""
    return max(0, min(2, waves - 1))


@dataclass(frozen=True)
class SteadyWindow:
    start: float
    end: float
    spans: tuple[tuple[float, float, int], ...]     # per VW: (first, last completion, minibatches)
    locked: bool = False                            # WSP: long-run rates are the slowest VW's
    whole_run: tuple[int, ...] = ()                 # VWs with no whole wave inside, timed over their run
    drain_counted: tuple[int, ...] = ()             # VWs whose final drain is counted: no wave to spare

    @property
    def duration(self) -> float:
        return self.end - self.start

    def minibatches(self, vw: int) -> int:
        return self.spans[vw][2]

    def free_rate(self, vw: int) -> float:
        """Minibatches per second of one VW inside the window."""
        t0, t1, n = self.spans[vw]
        return n / (t1 - t0)

    def rate(self, vw: int) -> float:
        """Steady minibatches per second of one VW: the slowest VW's rate when locked."""
        if self.locked:
            return min(self.free_rate(v) for v in range(len(self.spans)))
        return self.free_rate(vw)


def window_opens(completed: Sequence[int], warmup: int) -> bool:
    """Whether the window is open once VWs have completed `completed` minibatches each: the last VW
    has completed its warm-up. (A run's meters are read at this instant; `steady_window` finds the
    same instant in completion times.)"""
    return min(completed) >= warmup


def window_closes(completed: Sequence[int], total: int) -> bool:
    """Whether the window has closed: the first VW has completed all `total` of its counted minibatches
    (`counted`'s)."""
    return max(completed) >= total


def counted(total: int, warmup: int, drain: int) -> int:
    """How many of a VW's `total` completions the window counts: all but the last `drain` (a final
    drain that steady state never has), unless that would leave none after the `warmup` ones."""
    return total - drain if total - drain > warmup else total


def steady_window(completions: list[list[float]], warmup: int, origin: float = 0.0,
                  period: int = 1, locked: bool = False, drain: int = 0) -> SteadyWindow | None:
    """The window over per-VW completion times (seconds, increasing, after `origin`), or None when some
    VW completes nothing after its warm-up, or finishes before another has warmed up. `period` is the
    number of completions per wave (Nm): each VW is timed over whole waves inside the window. `locked`
    (WSP) reports each VW at the slowest one's rate. The last `drain` completions of each VW are left
    out where `counted` says so."""
    if not completions or any(len(times) <= warmup for times in completions):
        return None
    drained = tuple(vw for vw, times in enumerate(completions)
                    if drain and counted(len(times), warmup, drain) == len(times))
    completions = [times[:counted(len(times), warmup, drain)] for times in completions]
    start = max(times[warmup - 1] if warmup else origin for times in completions)
    end = min(times[-1] for times in completions)
    if end <= start:
        return None
    spans, whole_run = [], []
    for vw, times in enumerate(completions):
        t = [origin] + list(times)              # t[k]: when the VW had completed k minibatches
        # From its first completion at or after the window opens (a VW that warmed up early and then
        # waited for a late one is not timed over that wait), moved on to the same phase of a wave as
        # its last completion inside the window, so that it is timed over whole waves.
        first = max(bisect_left(t, start), warmup)
        last = bisect_right(t, end) - 1
        first += (last - first) % _whole(t[first:last + 1], period)
        if last <= first:
            # Nothing whole inside the window (a large staleness bound in a short run): time its
            # whole run after warm-up instead.
            first, last = warmup, len(t) - 1
            whole_run.append(vw)
        spans.append((t[first], t[last], last - first))
    return SteadyWindow(start, end, tuple(spans), locked, tuple(whole_run), drained)


def _whole(t: Sequence[float], period: int) -> int:
    """Completions per repeat of `t`'s pattern to time over: a wave of `period`, unless the gaps between
    completions repeat exactly every q (up to two waves), a q that does not divide a wave (a HetPipe
    order can complete in pairs with Nm = 3: timed over whole waves, its rate would carry the odd
    pair's gap), and then the least common multiple of the two where it fits, else q. The repeat is
    looked for in the last eight waves only, so that a long run costs no more than a short one.
    Measured completions never repeat exactly, so a measurement keeps whole waves."""
    tail = t[-(8 * period + 1):]
    gaps = [b - a for a, b in zip(tail, tail[1:])]
    for q in range(1, min(2 * period, len(gaps) // 2) + 1):
        if all(math.isclose(gaps[i], gaps[i + q], rel_tol=1e-9, abs_tol=1e-12) for i in range(len(gaps) - q)):
            if period % q == 0:
                return period
            both = math.lcm(period, q)
            return both if both < len(t) else q
    return period

