"""How long a rank blocked in a gloo receive takes to run again once its message is sent, with the
host's cores busy and without: is the OS's hand-off what the simulator misses on plans whose ranks
outnumber the cores?

Two processes hand off as the executor's ranks do (gloo, one thread each): rank 1 computes 4 ms,
stamps the clock and sends; rank 0 is blocked in its receive, stamps on waking and computes 1 ms.
`busy` other processes spin throughout, as a plan's other ranks compute. The one-way delay is the
median, 90th percentile and mean over 40 hand-offs of (wake stamp - send stamp), both on CLOCK_MONOTONIC.

    python experiments/validation/wakeup.py            # writes results/wakeup.md
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROUNDS, COMPUTE_S = 40, 0.004


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _spin_until(stop) -> None:
    while not stop.is_set():
        _busy(0.001)


def _hand_offs(rank: int, path: str, out) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    buf, stamps = torch.zeros(2), []
    for k in range(ROUNDS + 1):                 # the first exchange sets up the pair
        if rank == 1:
            _busy(COMPUTE_S)
            stamp = time.monotonic()
            dist.send(buf, 0)
        else:
            dist.recv(buf, 1)
            stamp = time.monotonic()
            _busy(COMPUTE_S / 4)
        if k:
            stamps.append(stamp)
    out.put((rank, stamps))
    dist.destroy_process_group()


def one_way_delay(busy: int) -> tuple[float, float, float]:
    """Median, 90th percentile and mean seconds from a send to its blocked receiver running, with
    `busy` spinning processes."""
    fork, spawn = multiprocessing.get_context("fork"), multiprocessing.get_context("spawn")
    stop, out = fork.Event(), spawn.Queue()
    spinners = [fork.Process(target=_spin_until, args=(stop,)) for _ in range(busy)]
    with tempfile.TemporaryDirectory() as tmp:
        pair = [spawn.Process(target=_hand_offs, args=(r, f"{tmp}/store", out)) for r in range(2)]
        for p in spinners + pair:
            p.start()
        stamps = dict(out.get(timeout=120) for _ in pair)
        stop.set()
        for p in pair + spinners:
            p.join(timeout=10)
    delays = [woke - sent for sent, woke in zip(stamps[1], stamps[0])]
    return statistics.median(delays), statistics.quantiles(delays, n=10)[-1], statistics.fmean(delays)


def main() -> int:
    cores = os.cpu_count() or 1
    lines = ["# Wake-up of a blocked receiver", "", "```", "python experiments/validation/wakeup.py", "```", "",
             f"Host: {cores} cores. Busy processes besides the pair (the sender computes after each send, so "
             f"with {cores - 1} or more the cores are full when the receiver wakes). Three probes each.", "",
             "| busy processes | ranks in all | one-way delay, µs: median / 90th percentile / mean of 40 hand-offs |",
             "|---|---|---|"]
    for busy in range(cores + 1):
        delays = [" / ".join(f"{x * 1e6:.0f}" for x in one_way_delay(busy)) for _ in range(3)]
        print(f"busy {busy}: {delays} us", file=sys.stderr)
        lines.append(f"| {busy} | {busy + 2} | {', '.join(delays)} |")
    out = Path(__file__).parent / "results" / "wakeup.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
