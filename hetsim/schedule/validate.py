"""Reject malformed schedules before anything runs them, showing the stage x step grid.

Checks: every minibatch forwarded and backwarded once per stage, in that order; every send has its
receive on the neighbouring stage; and an abstract run (receives wait for their sends, a WSP pull
waits for the pushes it needs; under a rendezvous schedule a send also waits for its receive)
finishes without deadlock.
"""

from __future__ import annotations

from collections import Counter

from hetsim.errors import ScheduleError
from hetsim.schedule.ir import Action, Schedule
from hetsim.schedule.registry import REGISTRY
from hetsim.wsp_clock import WaveClocks

__all__ = ["validate_schedule", "format_grid"]

_SHOWN = ("F", "B", "I", "W", "STEP", "PUSH", "PULL", "ALLREDUCE", "GROUP_SYNC")
_PEER = {"RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", +1)}
# Compute kinds, each with the kind that must come first for the same minibatch.
_BEFORE = {"F": None, "B": "F", "I": "F", "W": "I"}


def format_grid(schedule: Schedule, marks: dict[int, int] | None = None, width: int = 14) -> str:
    """Stage x step table of the compute and sync actions; `marks` maps stage -> action position to flag."""
    marks = marks or {}
    rows, centre = [], 0
    for s, actions in enumerate(schedule.stages):
        cells = []
        for pos, action in enumerate(actions):
            if action.kind in _SHOWN or marks.get(s) == pos:
                flagged = marks.get(s) == pos
                if flagged:
                    centre = max(centre, len(cells))
                cells.append(f">{action}<" if flagged else str(action))
        rows.append(cells)
    lo = max(0, centre - width // 2)
    hi = lo + width
    cell_w = max((len(c) for r in rows for c in r[lo:hi]), default=2) + 1
    header = "stage | " + "".join(f"{'step ' + str(i) if i == lo else '':<{cell_w}}" for i in range(lo, hi))
    lines = [header.rstrip()]
    for s, cells in enumerate(rows):
        more = " ..." if len(cells) > hi else ""
        lines.append(f"{s:>5} | " + "".join(f"{c:<{cell_w}}" for c in cells[lo:hi]) + more)
    return "\n".join(lines)


def _fail(schedule: Schedule, message: str, marks: dict[int, int]) -> ScheduleError:
    grid = format_grid(schedule, marks)
    return ScheduleError(f"schedule {schedule.name}: {message}\n{grid}", grid)


def validate_schedule(schedule: Schedule, *, pull_offset: int | None = None) -> None:
    """Raise ScheduleError (with the grid, bad cells marked '>F3<') if the schedule is not runnable.

    `pull_offset`, when given, makes PULL w wait for every stage's PUSH of waves < w - pull_offset,
    as WSP does for one virtual worker with staleness bound 0.
    """
    _check_each_stage(schedule)
    _check_pairs(schedule)
    _check_runs(schedule, pull_offset)


def _check_each_stage(schedule: Schedule) -> None:
    """Per virtual stage (a device's chunk): every minibatch forwarded once, then backwarded once
    (B, or I then W when the backward is split)."""
    k = schedule.n_virtual
    for d, actions in enumerate(schedule.stages):
        done: dict[tuple[str, int], set[int]] = {}
        for pos, (kind, i, chunk) in enumerate(actions):
            s = schedule.virtual_stage(d, chunk)
            if kind in ("SEND_F", "RECV_B") and s == k - 1 or kind in ("RECV_F", "SEND_B") and s == 0:
                raise _fail(schedule, f"stage {s} has no neighbour for {kind}{i}", {d: pos})
            if kind in _BEFORE:
                seen = done.setdefault((kind, chunk), set())
                if _BEFORE[kind] and i not in done.get((_BEFORE[kind], chunk), set()):
                    raise _fail(schedule, f"stage {s} runs {kind}{i} before {_BEFORE[kind]}{i}", {d: pos})
                if i in seen:
                    raise _fail(schedule, f"stage {s} runs {kind}{i} twice", {d: pos})
                seen.add(i)
        kinds = ("F", "I", "W") if any(a.kind == "I" for a in actions) else ("F", "B")
        for chunk in range(schedule.chunks):
            for kind in kinds:
                missing = set(range(schedule.n_minibatches)) - done.get((kind, chunk), set())
                if missing:
                    raise _fail(schedule, f"stage {schedule.virtual_stage(d, chunk)} never runs "
                                f"{kind}{min(missing)}", {d: len(actions) - 1})


def _peer(schedule: Schedule, d: int, action: Action) -> tuple[int, Action]:
    """The virtual stage that must run the send matching a receive, and that send."""
    send_kind, step = _PEER[action.kind]
    return schedule.virtual_stage(d, action.chunk) + step, Action(send_kind, action.index)


def _check_pairs(schedule: Schedule) -> None:
    counts = Counter((schedule.virtual_stage(d, a.chunk), Action(a.kind, a.index))
                     for d, actions in enumerate(schedule.stages) for a in actions if a.kind.startswith("SEND"))
    for d, actions in enumerate(schedule.stages):
        for pos, action in enumerate(actions):
            if action.kind in _PEER:
                peer, send = _peer(schedule, d, action)
                if counts[(peer, send)] != 1:
                    raise _fail(schedule, f"stage {schedule.virtual_stage(d, action.chunk)} {action} has no "
                                f"matching {send} on stage {peer}", {d: pos})


def _check_runs(schedule: Schedule, pull_offset: int | None) -> None:
    """Advance every stage as far as it can until all finish, or none can move (deadlock)."""
    pos = [0] * schedule.n_stages
    sent: set[tuple[int, Action]] = set()
    kind = REGISTRY.get(schedule.name)
    rendezvous = kind is not None and kind.explicit_p2p
    # WSP's clock rule (hetsim.wsp_clock) for one virtual worker with staleness bound 0.
    clocks = WaveClocks([schedule.n_stages], staleness_bound=0, pull_offset=pull_offset or 0)
    progress = True
    while progress:
        progress = False
        for s, actions in enumerate(schedule.stages):
            while pos[s] < len(actions):
                action = actions[pos[s]]
                if not _runnable(schedule, s, action, sent, clocks if pull_offset is not None else None):
                    break
                if rendezvous and action.kind.startswith("SEND") and not _receiver_waits(schedule, pos, s, action):
                    break
                if action.kind.startswith("SEND"):
                    sent.add((schedule.virtual_stage(s, action.chunk), Action(action.kind, action.index)))
                elif action.kind == "PUSH":
                    clocks.landed(0, action.index)
                pos[s] += 1
                progress = True
    stuck = {s: p for s, p in enumerate(pos) if p < len(schedule.stages[s])}
    if stuck:
        waits = ", ".join(f"stage {s} at {schedule.stages[s][p]}" for s, p in stuck.items())
        raise _fail(schedule, f"deadlock: {waits} can never proceed", stuck)


def _receiver_waits(schedule: Schedule, pos: list[int], d: int, send: Action) -> bool:
    """Under a rendezvous: is the neighbour standing at the receive this send pairs with? (Pipeline
    schedules with one chunk per device, as the rendezvous ones are.)"""
    peer = d + (1 if send.kind == "SEND_F" else -1)
    want = Action("RECV_F" if send.kind == "SEND_F" else "RECV_B", send.index, send.chunk)
    actions = schedule.stages[peer]
    return pos[peer] < len(actions) and actions[pos[peer]] == want


def _runnable(schedule: Schedule, d: int, action: Action, sent: set, clocks: WaveClocks | None) -> bool:
    if action.kind in _PEER:
        return _peer(schedule, d, action) in sent
    if action.kind == "PULL" and clocks is not None:
        return clocks.may_pull(action.index)
    return True
