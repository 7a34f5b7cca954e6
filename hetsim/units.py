"""Unit constants, in one place. hetsim computes in SI units (bytes, seconds, bytes per second) and
converts only where people read or write numbers (reports, CLI options, file formats)."""

import math

__all__ = ["GIB", "MAX_JITTER_CV", "in_units"]

GIB = 1024**3                 # bytes in a GiB: GPU memory sizes and memory reports
# The largest compute-jitter CV the API, `simulate`, `plan` and `sweep` take: far beyond any real
# device's, and below where lognormal draws overflow a float.
MAX_JITTER_CV = 10.0


def in_units(value: float, scale: float) -> float:
    """`value` / `scale`, nudged to the float whose product with `scale` (as file loaders compute it)
    gives `value` back exactly where one of the nearest few does, so that a written file reads back
    bit for bit: 5e-05 s is written as 50 us, and 50 * 1e-6 must be 5e-05 again."""
    guess = value / scale
    candidates = [guess]
    up = down = guess
    for _ in range(4):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    return next((c for c in candidates if c * scale == value), guess)
