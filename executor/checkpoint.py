"""Per-wave checkpoints of every stage's training state, and finding where to resume.

A flush schedule (gpipe, 1f1b-flush) has a consistent cut after each wave's STEP: no minibatch is in
flight, so a stage's weights, optimizer state and counters are its whole state, and the data is a function
of (seed, vw, minibatch). The executor saves each stage after STEP w and resumes every stage after
the last wave all of them saved. Files live in one directory that every rank can reach, with
`fingerprint.json`: a hash of the plan and the model that wrote them. A resume refuses checkpoints of
another partition or model (their weights would load into the wrong layers: a loss of 0.65 became 4.74).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from hetsim.errors import HetsimError

__all__ = ["save_stage", "load_stage", "last_common_wave", "fingerprint", "start_checkpoints"]

_FINGERPRINT = "fingerprint.json"
# Plan fields that shape a stage's saved state; a plan's name and notes do not.
_SHAPING = ("model", "minibatch_size", "nm", "schedule", "sync", "virtual_workers", "optimizer",
            "optimizer_state_copies", "precision")


def fingerprint(plan_doc: dict, model: str, model_kwargs: dict) -> dict:
    """What identifies the training state: the plan's partition and settings, the model and its
    arguments; `digest` hashes them, `stages` describes the partition for error messages."""
    shaping = {k: plan_doc.get(k) for k in _SHAPING}
    key = json.dumps({"plan": shaping, "model": model, "model_kwargs": model_kwargs}, sort_keys=True)
    stages = "; ".join(f"{vw['name']} " + " ".join(f"[{s['layers'][0]}, {s['layers'][1]})" for s in vw["stages"])
                       for vw in plan_doc["virtual_workers"])
    return {"digest": hashlib.sha256(key.encode()).hexdigest()[:16], "plan": plan_doc.get("name", ""),
            "model": model, "model_kwargs": model_kwargs, "stages": stages}


def start_checkpoints(directory: str, mine: dict, resume: bool) -> None:
    """Before any rank starts. Resuming: refuse checkpoints another plan or model wrote (or that carry
    no fingerprint). Starting afresh: refuse a directory that already holds checkpoints, so that
    nothing written earlier is lost and a later resume cannot pick up a stale wave of another run."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise HetsimError(f"checkpoint_dir: {directory} is a file, not a folder")
    path = folder / _FINGERPRINT
    existing = any(folder.glob("rank*_wave*.pt"))
    theirs = json.loads(path.read_text()) if path.exists() else None
    if resume and existing:
        if theirs is None or theirs.get("digest") != mine["digest"]:
            raise HetsimError(f"resume: the checkpoints in {directory} were written by {_describe(theirs)}, "
                              f"not by this run's {_describe(mine)}; resume with the plan and model that "
                              "wrote them, or start afresh without resume")
        return
    if existing:
        raise HetsimError(f"checkpoint_dir: {directory} already holds checkpoints of {_describe(theirs)}; "
                          "resume them, or give an empty directory (a fresh run does not overwrite them)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HetsimError(f"checkpoint_dir: {directory}: cannot write there ({exc.strerror or exc})") from None
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(mine, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _describe(doc: dict | None) -> str:
    if doc is None:
        return "an unknown run (no fingerprint.json)"
    args = ", ".join(f"{k}={v}" for k, v in sorted(doc["model_kwargs"].items()))
    return f"plan {doc['plan']!r} (model {doc['model']}{f'({args})' if args else ''}, stages {doc['stages']})"


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
