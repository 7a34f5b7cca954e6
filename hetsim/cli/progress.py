"""Progress on stderr for commands that can run for more than a couple of seconds.

Shown only when stderr is a terminal and --quiet is not given, so pipes, logs and tests see nothing:

    with progress_bar("simulate", 12, quiet=args.quiet) as bar:   # a bar with update(n)
        ...
    with still_running("simulating 40,000 stage-minibatches", quiet=args.quiet):
        report = hetsim.simulate(...)                           # one call: a spinner while it runs
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["add_quiet", "shown", "progress_bar", "progress_factory", "still_running"]


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display on stderr")


def shown(quiet: bool) -> bool:
    """Whether to draw progress: never into a pipe or a file, never with --quiet."""
    return not quiet and sys.stderr.isatty()


def progress_bar(desc: str, total: int, *, quiet: bool = False, unit: str = "it"):
    """A tqdm bar on stderr (a context manager whose value has update(n)), or a silent stand-in."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, disable=not shown(quiet))


def progress_factory(quiet: bool, unit: str = "it") -> Callable[[str, int], object]:
    """progress_bar with `quiet` fixed: the (desc, total) -> bar callable the planner takes."""
    return lambda desc, total: progress_bar(desc, total, quiet=quiet, unit=unit)


@contextmanager
def still_running(message: str, *, quiet: bool = False) -> Iterator[None]:
    """A spinner, for one long call whose progress cannot be counted."""
    if not shown(quiet):
        yield
        return
    from rich.console import Console
    with Console(stderr=True).status(message):
        yield
