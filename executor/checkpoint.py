"""Per-wave checkpoints of every stage's training state, and finding where to resume.

A flush schedule (gpipe, 1f1b-flush) has a consistent cut after each wave's STEP: no minibatch is in
flight, so a stage's weights, momentum and counters are its whole state, and the data is a function
of (seed, vw, minibatch). The executor saves each stage after STEP w and resumes every stage after
the last wave all of them saved. Files live in one directory that every rank can reach.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["save_stage", "load_stage", "last_common_wave"]


def _path(directory: str, rank: int, wave: int) -> Path:
    return Path(directory) / f"rank{rank}_wave{wave}.pt"


def save_stage(directory: str, rank: int, wave: int, state: dict) -> None:
    """Write atomically (rename), then drop this rank's checkpoints older than the previous wave."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    final = _path(directory, rank, wave)
    tmp = final.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, final)
    old = _path(directory, rank, wave - 2)
    if old.exists():
        old.unlink()


def load_stage(directory: str, rank: int, wave: int, device: torch.device | str = "cpu") -> dict:
    """A saved state with its tensors on `device` (the rank's now, whichever device saved them)."""
    return torch.load(_path(directory, rank, wave), weights_only=False, map_location=device)


def last_common_wave(directory: str, ranks: list[int]) -> int | None:
    """The last wave every one of `ranks` has a checkpoint of, or None."""
    folder = Path(directory)
    if not folder.is_dir():
        return None
    waves = None
    for rank in ranks:
        mine = {int(p.stem.split("_wave")[1]) for p in folder.glob(f"rank{rank}_wave*.pt")}
        waves = mine if waves is None else waves & mine
    return max(waves) if waves else None
