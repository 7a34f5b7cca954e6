"""Repeatable NAME=VALUE command-line arguments (--slowdown GPU=FACTOR, --model-arg NAME=INT)."""

from __future__ import annotations

from typing import Callable

from hetsim.errors import HetsimError

__all__ = ["assignments", "model_kwargs"]


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


def model_kwargs(items: list[str], example: str = "hidden=1024") -> dict[str, int]:
    """--model-arg NAME=INT items as a model's constructor arguments."""
    return assignments(items, "--model-arg", _size, f"NAME=INT >= 1, e.g. {example}")


def _size(text: str) -> int:
    """A model's sizes (widths, depths, lengths, vocabularies) are whole numbers of at least one."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value
