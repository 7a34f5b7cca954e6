"""SDPipe's group scheduling for one stage index as pure state (PVLDB 16(9), 2023, §4): arrivals
and clock readings in, groups out. The simulator (hetsim.sim.sdpipe) feeds it simulated times, the
executor's scheduler rank (executor.sdpipe) wall-clock times, tests literal ones:

- the first ready VW opens a waiting window of `wait_s`; the group is whoever is ready when it
  closes, or everyone still active as soon as all of them are ready;
- the window doubles after a group of one (up to sdpipe_wait_max_s), else shrinks x0.9 (down to
  sdpipe_wait_min_s);
- connectivity rule: every VW must have been connected with all active VWs (over the groups since
  the previous connection) at least once per period of P of its waves. A group in which some member
  ends a period with no connection since its previous period end must make one; until it would, the
  group waits for more arrivals. P = 1 is plain all-reduce. (A stricter reading, that any period end
  needs a fresh connection, makes a VW that is one wave behind demand a second connection from one
  that has already made its own; with one scheduler per stage index that can deadlock the pipelines:
  8 pipelines of 4 stages with stragglers did in hetsim's simulator.);
- a VW whose last wave has been grouped leaves the active set, so the others can finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.plan import SyncSpec

__all__ = ["Group", "GroupFormer"]


@dataclass(frozen=True, kw_only=True)
class Group:
    stage: int
    number: int                       # per stage index, counting from 0
    members: tuple[int, ...]          # VW indices, ascending
    waves: tuple[int, ...]            # each member's wave, in the same order
    connected: bool                   # this group completed a connection of all active VWs


class GroupFormer:
    def __init__(self, *, stage: int, n_vw: int, spec: SyncSpec, waves: int):
        self.stage, self.n_vw, self.spec, self.waves = stage, n_vw, spec, waves
        self.active = set(range(n_vw))
        self.wait_s = spec.sdpipe_wait_init_s
        self.ready: dict[int, int] = {}           # vw -> the wave it finished
        self.deadline: float | None = None        # when the open window closes; None when none is open
        self.blocked = False                      # closing waits for arrivals that connect everyone
        self.connections = 0
        self._period_connections = [0] * n_vw     # connections when each VW last ended a period
        self.groups: list[Group] = []
        self._labels = list(range(n_vw))          # component of each VW since the last connection

    def join(self, vw: int, wave: int, now: float) -> Group | None:
        """VW `vw` finished `wave` at time `now`; returns the group this arrival closes, if any."""
        if vw in self.ready or vw not in self.active:
            raise ValueError(f"stage {self.stage}: vw{vw} joined wave {wave} while "
                             f"{'already waiting' if vw in self.ready else 'finished'}")
        self.ready[vw] = wave
        if len(self.ready) == len(self.active) or self.blocked:
            return self._close()
        if self.deadline is None:
            self.deadline = now + self.wait_s
        return None

    def expire(self, now: float) -> Group | None:
        """The clock reads `now`: closes the open window if it has run out."""
        if self.deadline is None or now < self.deadline:
            return None
        return self._close()

    def _close(self) -> Group | None:
        vws = sorted(self.ready)
        enders = [v for v in vws if (self.ready[v] + 1) % self.spec.sdpipe_period == 0]
        owed = any(self._period_connections[v] == self.connections for v in enders)
        linked = _linked(self._labels, vws)
        if owed and len(vws) < len(self.active) and not self._connects(linked):
            self.blocked, self.deadline = True, None
            return None
        if len(vws) < 2:
            self.wait_s = min(2 * self.wait_s, self.spec.sdpipe_wait_max_s)
        else:
            self.wait_s = max(0.9 * self.wait_s, self.spec.sdpipe_wait_min_s)
        connected = self._connects(linked)
        self._labels = list(range(self.n_vw)) if connected else linked
        self.connections += connected
        for v in enders:
            self._period_connections[v] = self.connections
        group = Group(stage=self.stage, number=len(self.groups), members=tuple(vws),
                      waves=tuple(self.ready[v] for v in vws), connected=connected)
        self.active -= {v for v in vws if self.ready[v] == self.waves - 1}
        self.ready, self.deadline, self.blocked = {}, None, False
        self.groups.append(group)
        return group

    def _connects(self, labels: list[int]) -> bool:
        return len({labels[v] for v in self.active}) <= 1


def _linked(labels: list[int], members: list[int]) -> list[int]:
    """Component labels after the members of a group are linked (a union over a few VWs).

    >>> _linked([0, 1, 2, 2], [1, 2])
    [0, 1, 1, 1]
    """
    joined = {labels[m] for m in members}
    target = labels[members[0]]
    return [target if label in joined else label for label in labels]
