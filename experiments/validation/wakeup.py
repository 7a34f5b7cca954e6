"""How long a rank blocked in a gloo receive takes to run again once its message is sent, with the
host's cores busy and without: is the OS's hand-off what the simulator misses on plans whose ranks
outnumber the cores?

Two processes hand off as the executor's ranks do (gloo, one thread each): rank 1 computes 4 ms,
stamps the clock and sends; rank 0 is blocked in its receive, stamps on waking and computes 1 ms.
`busy` other processes spin throughout, as a plan's other ranks compute. The one-way delay is the
median, 90th percentile and mean over 40 hand-offs of (wake stamp - send stamp), both on CLOCK_MONOTONIC
(executor.calibrate.wake_delays, the probe `hetsim validate` takes the mean of as its hand-off delay).

    python experiments/validation/wakeup.py            # writes results/wakeup.md
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

from executor.calibrate import wake_delays


def one_way_delay(busy: int) -> tuple[float, float, float]:
    """Median, 90th percentile and mean seconds from a send to its blocked receiver running, with
    `busy` spinning processes."""
    delays = wake_delays(busy, 40, 0.004)
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
