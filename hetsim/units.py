"""Unit constants, in one place. hetsim computes in SI units (bytes, seconds, bytes per second) and
converts only where people read or write numbers (reports, CLI options, file formats)."""

__all__ = ["GIB"]

GIB = 1024**3                 # bytes in a GiB: GPU memory sizes and memory reports
