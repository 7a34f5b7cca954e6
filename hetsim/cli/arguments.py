"""Command-line values checked where they are read: argparse types that refuse nonsense in one line,
and output paths proven writable before any work starts (and leaving no trace while proving it).

    p.add_argument("--waves", type=whole(1), default=20)      # "argument --waves: must be >= 1, got 0"
    check_output_dir(args.out, "--out")                       # before the simulation, not after it
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

from hetsim.errors import HetsimError

__all__ = ["DEFAULT_JITTER", "OneLineParser", "whole", "real", "int_list", "existing_file", "existing_dir", "check_output_dir",
           "check_output_file"]


# Compute jitter (lognormal CV) that `hetsim simulate`, `sweep` and `plan` simulate with unless told:
# without any, identical virtual workers run in lockstep and meet on every shared link at the same
# instants, an unstable state (a CV of 1e-9 leaves it) that real runs do not hold.
DEFAULT_JITTER = 0.02


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (the usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [minimum, maximum]."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        _check_range(value, minimum, maximum)
        return value
    convert.__name__ = "whole number"
    return convert


def real(minimum: float, maximum: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number >= minimum (> minimum when `above`), <= maximum."""
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if above and not value > minimum:
            raise argparse.ArgumentTypeError(f"must be > {minimum:g}, got {text}")
        _check_range(value, minimum, maximum)
        return value
    convert.__name__ = "number"
    return convert


def int_list(text: str, option: str, minimum: int) -> tuple[int, ...]:
    """Comma-separated integers >= `minimum`, sorted and without repeats: `--tp 1,2,4`."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HetsimError(f"{option} {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not values:
        raise HetsimError(f"{option}: give at least one value")
    for v in values:
        if v < minimum:
            raise HetsimError(f"{option} {text!r}: every value must be >= {minimum}, got {v}")
    return tuple(sorted(set(values)))


def _check_range(value: float, minimum: float, maximum: float | None) -> None:
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise argparse.ArgumentTypeError(f"must be <= {maximum:g}, got {value:g}")


def existing_file(text: str) -> Path:
    """An argparse type: a file that exists and can be read."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'is a folder' if path.is_dir() else 'no such file'}")
    return path


def existing_dir(text: str) -> Path:
    """An argparse type: a folder that exists."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {'is a file' if path.exists() else 'no such folder'}")
    return path


def check_output_dir(path: str | Path, flag: str, given: str | Path | None = None,
                     names: tuple[str, ...] = ()) -> None:
    """Refuse, before any work, an output folder that cannot be created or written to (`given`: what
    the user named, if that was a file in it), or where a folder takes one of the file `names` the
    command will write. Proven by doing: the missing folders are made and a file written, then all of
    it is removed again."""
    path = Path(path)
    flag = f"{flag} {given if given is not None else path}"
    for name in names:
        if (path / name).is_dir():
            raise HetsimError(f"{flag}: {name} there is a folder, where this writes a file; move it or write "
                              "elsewhere")
    created: list[Path] = []
    try:
        for folder in [*reversed(path.parents), path]:
            if folder.is_dir():
                continue
            if folder.exists():
                raise HetsimError(f"{flag}: {folder} is a file, not a folder")
            folder.mkdir()
            created.append(folder)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise HetsimError(f"{flag}: cannot write there ({exc.strerror or exc})") from None
    finally:
        for folder in reversed(created):
            folder.rmdir()


def check_output_file(path: str | Path, flag: str, suffixes: tuple[str, ...] = ()) -> None:
    """Refuse, before any work, an output file that could not be written (or has a suffix that says
    nothing of its format); an existing file is left as it is."""
    path = Path(path)
    if suffixes and path.suffix not in suffixes:
        raise HetsimError(f"{flag} {path}: expected a {', '.join(suffixes)} file")
    if path.is_dir():
        raise HetsimError(f"{flag} {path}: is a folder, not a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise HetsimError(f"{flag} {path}: cannot write it (permission denied)")
        real = Path(os.path.realpath(path))
        # A file is replaced by one written beside it (hetsim.outputs), which its folder must allow.
        if real.is_file() and not os.access(real.parent, os.W_OK | os.X_OK):
            raise HetsimError(f"{flag} {path}: cannot replace it (its folder is not writable)")
        return
    check_output_dir(path.parent, flag, given=path)
