"""Wave Synchronous Parallel through parameter-server ranks (HetPipe, ATC'20 §5), the protocol
hetsim.sim.wsp models: each stage pushes its wave's aggregated update once per wave to every shard;
each shard keeps the clocks and answers pulls by hetsim.wsp_clock's rule (a VW's clock advances when
all its stages' pushes of a wave have arrived, in wave order; the pull before wave w is answered once
the global clock is >= w - pull_offset - D).

Weights after a pull are the global weights plus this stage's own updates the server has not
received yet (it tells how many pushes it holds), so no local update is lost or counted twice.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from executor.pending import PendingSends
from hetsim.wsp_clock import WaveClocks

__all__ = ["ParameterServer", "WspClient", "Span", "PUSH", "PULL"]

PUSH, PULL = 0, 1
_HEADER, _PAYLOAD, _REPLY, _WEIGHTS = 1, 2, 3, 4


class Span:
    """Ranges [a, b) of a flat parameter vector, adjacent ones merged. Shards hold a few large
    contiguous pieces of each stage, so slices do the work that index tensors would do several times
    slower (a gather or scatter of millions of indices per push and pull)."""

    def __init__(self, ranges: list[tuple[int, int]], base: int = 0):
        merged: list[list[int]] = []
        for a, b in ranges:
            if merged and merged[-1][1] == base + a:
                merged[-1][1] = base + b
            else:
                merged.append([base + a, base + b])
        self.ranges = [(a, b) for a, b in merged]
        self.numel = sum(b - a for a, b in self.ranges)

    def covers(self, numel: int) -> bool:
        return self.ranges == [(0, numel)]

    def gather(self, flat: torch.Tensor) -> torch.Tensor:
        """These elements of `flat` as one contiguous tensor (a view when there is one range)."""
        if len(self.ranges) == 1:
            a, b = self.ranges[0]
            return flat[a:b]
        return torch.cat([flat[a:b] for a, b in self.ranges]) if self.ranges else flat.new_zeros(0)

    def add_(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        for piece, value in self._pieces(flat, values):
            piece.add_(value)

    def copy_(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        for piece, value in self._pieces(flat, values):
            piece.copy_(value)

    def _pieces(self, flat: torch.Tensor, values: torch.Tensor):
        """(slice of `flat`, the matching slice of `values`, which holds this span's elements in order)."""
        offset = 0
        for a, b in self.ranges:
            yield flat[a:b], values[offset:offset + b - a]
            offset += b - a


class ParameterServer:
    """One shard's server loop. `stage_index[(vw, s)]` = (rank, that stage's Span of the global flat vector)."""

    def __init__(self, *, global_flat: torch.Tensor, stage_index: dict[tuple[int, int], tuple[int, Span]],
                 n_stages: list[int], waves: int, staleness_bound: int, pull_offset: int):
        self.weights = global_flat.clone()
        self.stage_index = stage_index
        self.by_rank = {rank: key for key, (rank, _) in stage_index.items()}
        self.waves = waves
        self.clocks = WaveClocks(n_stages, staleness_bound, pull_offset)
        self.pushes = {key: 0 for key in stage_index}
        # One receive buffer, reused: a fresh one per push (a stage's whole update, often above
        # malloc's mmap threshold) would be mapped and faulted in anew every wave.
        self._inbox = torch.empty(max((span.numel for _, span in stage_index.values()), default=0))

    def serve(self) -> None:
        expected = sum(self.waves + (self.waves - 1) for _ in self.stage_index)
        header = torch.zeros(4, dtype=torch.long)
        for _ in range(expected):
            src = dist.recv(header, tag=_HEADER)
            kind, vw, stage, wave = (int(x) for x in header)
            if kind == PUSH:
                self._push(src, vw, stage, wave)
            else:
                self.clocks.wait(wave, (src, wave))
            self._answer_ready()
        if self.clocks.waiting:
            raise RuntimeError(f"parameter server: pulls (rank, wave) never answered: {self.clocks.waiting}")

    def _push(self, src: int, vw: int, stage: int, wave: int) -> None:
        _, span = self.stage_index[(vw, stage)]
        if span.numel:
            update = self._inbox[:span.numel]
            dist.recv(update, src=src, tag=_PAYLOAD)
            span.add_(self.weights, update)
        self.pushes[(vw, stage)] += 1
        self.clocks.landed(vw, wave)

    def _answer_ready(self) -> None:
        for rank, _wave in self.clocks.released():
            key = self.by_rank[rank]
            _, span = self.stage_index[key]
            reply = torch.tensor([self.clocks.c_global, self.pushes[key]], dtype=torch.long)
            dist.send(reply, rank, tag=_REPLY)
            if span.numel:                   # a blocking send: the weights cannot change under it
                dist.send(span.gather(self.weights), rank, tag=_WEIGHTS)


class WspClient:
    """A stage's side: keeps its own per-wave updates until every server has received them."""

    def __init__(self, *, vw: int, stage: int, ps_ranks: list[int], shard_ranges: list[list[tuple[int, int]]],
                 device: torch.device | str = "cpu"):
        self.vw, self.stage = vw, stage
        self.device = torch.device(device)     # the stage's; the servers' messages are host tensors
        self.ps_ranks = ps_ranks
        self.spans = [Span(r) for r in shard_ranges]
        self.updates: dict[int, torch.Tensor] = {}          # wave -> sum of own weight deltas (flat)
        self.version = 0                                     # global clock of the last pulled weights
        self._pending = PendingSends()

    def record(self, wave: int, deltas: list[torch.Tensor]) -> None:
        """Add one update's weight changes to its wave's flat sum, which a push then sends as it is
        (summing into the flat vector costs what a copy would, and the push copies nothing)."""
        flat = self.updates.get(wave)
        if flat is None:
            self.updates[wave] = (torch.cat([d.reshape(-1) for d in deltas]) if deltas
                                  else torch.zeros(0, device=self.device))
            return
        offset = 0
        for d in deltas:
            flat[offset:offset + d.numel()].add_(d.reshape(-1))
            offset += d.numel()

    def push(self, wave: int) -> None:
        """Send the wave's aggregated update to every shard; does not wait (as in the simulator)."""
        update = self.updates.get(wave)
        for rank, span in zip(self.ps_ranks, self.spans):
            self._pending.add(dist.isend(torch.tensor([PUSH, self.vw, self.stage, wave]), rank, tag=_HEADER))
            if span.numel:                   # the wave is complete: nothing adds to `update` any more
                payload = span.gather(update).cpu() if update is not None else torch.zeros(span.numel)
                self._pending.add(dist.isend(payload, rank, tag=_PAYLOAD))

    def pull(self, wave: int, current: Callable[[], torch.Tensor], numel: int) -> tuple[torch.Tensor, int, float]:
        """Blocks until every shard answers; returns the new flat weights (a fresh tensor), the
        global clock, and the seconds spent waiting for the shards' answers (the staleness bound's
        hold, as the simulator's gates count it; receiving the weights after an answer is not part
        of it). `current()` gives the stage's flat weights, read only for parts no shard holds."""
        for rank in self.ps_ranks:
            self._pending.add(dist.isend(torch.tensor([PULL, self.vw, self.stage, wave]), rank, tag=_HEADER))
        whole = len(self.spans) == 1 and self.spans[0].covers(numel)
        new = None if whole else current()
        clocks, held, waited = [], [], 0.0
        for rank, span in zip(self.ps_ranks, self.spans):
            reply = torch.zeros(2, dtype=torch.long)
            t0 = time.perf_counter()
            dist.recv(reply, src=rank, tag=_REPLY)
            waited += time.perf_counter() - t0
            clock, included = int(reply[0]), int(reply[1])
            clocks.append(clock)
            held.append(included)
            if span.numel:
                weights = torch.empty(span.numel)
                dist.recv(weights, src=rank, tag=_WEIGHTS)
                weights = weights.to(self.device)
                for u, delta in self.updates.items():
                    if u >= included:
                        weights += span.gather(delta)
                if whole:
                    new = weights
                else:
                    span.copy_(new, weights)
        for u in [u for u in self.updates if u < min(held)]:
            del self.updates[u]
        self.version = min(clocks)
        return (new if new is not None else torch.zeros(numel, device=self.device)), self.version, waited

    def finish(self) -> None:
        self._pending.wait_all()
