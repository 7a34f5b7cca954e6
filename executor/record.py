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
    loss_times: list[float] = field(default_factory=list)      # perf_counter of each loss, as `losses`
    versions: list[tuple[int, int, int, int]] = field(default_factory=list)
    weights_bytes: int = 0
    stash_peak_versions: int = 1
    peak_memory_bytes: int = 0
    memory_kind: str = "rss_peak_bytes"     # or "cuda_peak_allocated_bytes" for a stage rank on CUDA
    backend: str = ""                      # the process group's backend
    device: str = "cpu"                    # where the rank computed (and how its messages travel)
    position: str = "start"              # the action being run, and since when (wall clock)
    since: float = field(default_factory=time.time)
    waiting_on: list[int] = field(default_factory=list)   # peers a blocking call waits for
    final_weights: str = ""              # digest of a stage's flat weights at the end
    tokens_per_sample: int | None = None  # a stage rank of a language model (modelzoo.tasks): its seq_len
    groups: list[tuple] = field(default_factory=list)     # sdpipe scheduler: (stage, number, members, waves)
    connections: list[int] = field(default_factory=list)  # sdpipe scheduler: per stage index

    # (end time, action, seconds of work: thread CPU time on CPU, GPU wall time on CUDA)
    work: list[tuple[float, str, float]] = field(default_factory=list)

    def at(self, position: str) -> None:
        self.position, self.since = position, time.time()

    def span(self, name: str, cat: str, t0: float, t1: float) -> None:
        self.spans.append((name, cat, t0, t1))

    def wall(self, t: float) -> float:
        """A perf_counter reading on the common (wall-clock) axis."""
        return self.wall0 + (t - self.perf0)

    def finish(self, cuda_peak_bytes: int | None = None) -> None:
        if cuda_peak_bytes is not None:
            self.peak_memory_bytes, self.memory_kind = cuda_peak_bytes, "cuda_peak_allocated_bytes"
        else:
            self.peak_memory_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
