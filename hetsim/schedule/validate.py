"""Reject malformed schedules before anything runs them, showing the stage x step grid.

Checks: every minibatch forwarded and backwarded once per stage, in that order; every send has its
receive on the neighbouring stage; and an abstract run (receives wait for their sends, a WSP pull
waits for the pushes it needs) finishes without deadlock.
"""

from __future__ import annotations

from collections import Counter

from hetsim.errors import ScheduleError
from hetsim.schedule.ir import Action, Schedule

__all__ = ["validate_schedule", "format_grid"]

_SHOWN = ("F", "B", "STEP", "PUSH", "PULL", "ALLREDUCE", "GROUP_SYNC")
_PEER = {"RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", +1)}


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
    k = schedule.n_stages
    for s, actions in enumerate(schedule.stages):
        done_f: set[int] = set()
        done_b: set[int] = set()
        for pos, (kind, i) in enumerate(actions):
            if kind in ("SEND_F", "RECV_B") and s == k - 1 or kind in ("RECV_F", "SEND_B") and s == 0:
                raise _fail(schedule, f"stage {s} has no neighbour for {kind}{i}", {s: pos})
            if kind == "F":
                if i in done_f:
                    raise _fail(schedule, f"stage {s} runs F{i} twice", {s: pos})
                done_f.add(i)
            elif kind == "B":
                if i not in done_f:
                    raise _fail(schedule, f"stage {s} runs B{i} before F{i}", {s: pos})
                if i in done_b:
                    raise _fail(schedule, f"stage {s} runs B{i} twice", {s: pos})
                done_b.add(i)
        missing = set(range(schedule.n_minibatches)) - done_b
        if missing or done_f != done_b:
            mb = min(missing | (done_f ^ done_b))
            raise _fail(schedule, f"stage {s} never runs {'F' if mb not in done_f else 'B'}{mb}",
                        {s: len(actions) - 1})


def _check_pairs(schedule: Schedule) -> None:
    counts = [Counter(a for a in actions if a.kind.startswith(("SEND", "RECV")))
              for actions in schedule.stages]
    for s, actions in enumerate(schedule.stages):
        for pos, action in enumerate(actions):
            if action.kind in _PEER:
                send_kind, step = _PEER[action.kind]
                if counts[s + step][Action(send_kind, action.index)] != 1:
                    raise _fail(schedule, f"stage {s} {action} has no matching {send_kind}{action.index} "
                                f"on stage {s + step}", {s: pos})


def _check_runs(schedule: Schedule, pull_offset: int | None) -> None:
    """Advance every stage as far as it can until all finish, or none can move (deadlock)."""
    pos = [0] * schedule.n_stages
    sent: set[tuple[int, Action]] = set()
    pushes: Counter[int] = Counter()
    progress = True
    while progress:
        progress = False
        for s, actions in enumerate(schedule.stages):
            while pos[s] < len(actions):
                action = actions[pos[s]]
                if not _runnable(s, action, sent, pushes, schedule.n_stages, pull_offset):
                    break
                if action.kind.startswith("SEND"):
                    sent.add((s, action))
                elif action.kind == "PUSH":
                    pushes[action.index] += 1
                pos[s] += 1
                progress = True
    stuck = {s: p for s, p in enumerate(pos) if p < len(schedule.stages[s])}
    if stuck:
        waits = ", ".join(f"stage {s} at {schedule.stages[s][p]}" for s, p in stuck.items())
        raise _fail(schedule, f"deadlock: {waits} can never proceed", stuck)


def _runnable(s: int, action: Action, sent: set, pushes: Counter, k: int, pull_offset: int | None) -> bool:
    if action.kind in _PEER:
        send_kind, step = _PEER[action.kind]
        return (s + step, Action(send_kind, action.index)) in sent
    if action.kind == "PULL" and pull_offset is not None:
        needed = action.index - pull_offset - 1
        return needed < 0 or pushes[needed] == k
    return True
