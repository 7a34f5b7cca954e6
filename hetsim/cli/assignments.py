"""Repeatable NAME=VALUE command-line arguments (--slowdown GPU=FACTOR, --model-arg NAME=INT)."""

from __future__ import annotations

from typing import Callable

from hetsim.errors import HetsimError

__all__ = ["assignments"]


def assignments(items: list[str], flag: str, convert: Callable[[str], object], example: str) -> dict:
    """{NAME: convert(VALUE)} of every item; a malformed one is a one-line error naming the flag."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name in out:
            raise HetsimError(f"{flag} {item!r}: {name} is given twice (which value did you mean?)")
        try:
            out[name] = convert(value)
        except ValueError:
            raise HetsimError(f"{flag} {item!r}: expected {example}") from None
    return out
