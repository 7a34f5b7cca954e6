"""What one rank measures; the launcher gathers every rank's record and builds the Report from them."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

__all__ = ["RankRecord"]


@dataclass
class RankRecord:
    rank: int
    # perf_counter and wall clock read together once, so ranks on one host share a time axis.
    perf0: float = field(default_factory=time.perf_counter)
    wall0: float = field(default_factory=time.time)
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)   # name, cat, t0, t1
    completions: list[float] = field(default_factory=list)     # stage 0: each minibatch's backward end
    staleness_local: list[tuple] = field(default_factory=list)
    staleness_global: list[tuple] = field(default_factory=list)
    gates: list[tuple] = field(default_factory=list)           # (vw, stage, wave, wait_s, global clock)
    losses: list[tuple[int, int, float]] = field(default_factory=list)
    versions: list[tuple[int, int, int, int]] = field(default_factory=list)
    weights_bytes: int = 0
    stash_peak_versions: int = 1
    peak_rss_bytes: int = 0
    position: str = "start"              # the action being run, and since when (wall clock)
    since: float = field(default_factory=time.time)
    waiting_on: list[int] = field(default_factory=list)   # peers a blocking call waits for
    final_weights: str = ""              # digest of a stage's flat weights at the end
    groups: list[tuple] = field(default_factory=list)     # sdpipe scheduler: (stage, number, members, waves)
    connections: list[int] = field(default_factory=list)  # sdpipe scheduler: per stage index

    cpu: list[tuple[float, str, float]] = field(default_factory=list)   # (end time, action, CPU seconds)

    def at(self, position: str) -> None:
        self.position, self.since = position, time.time()

    def span(self, name: str, cat: str, t0: float, t1: float) -> None:
        self.spans.append((name, cat, t0, t1))

    def wall(self, t: float) -> float:
        """A perf_counter reading on the common (wall-clock) axis."""
        return self.wall0 + (t - self.perf0)

    def finish(self) -> None:
        self.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
