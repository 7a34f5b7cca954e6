"""Which rank does what: (virtual worker, stage) ranks first, VW-major, a tensor-parallel stage's
members one after another from its lead, then parameter-server ranks, then SDPipe's group scheduler.
Under a schedule with virtual stages a rank is a device: it runs every chunk (stage j mod p) of its GPU.

Pure functions of the plan and cluster, so every rank (and the launcher) derives the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.plan import Plan

__all__ = ["Role", "RankLayout", "rank_layout", "shard_indices"]


@dataclass(frozen=True, kw_only=True)
class Role:
    rank: int
    kind: str                    # "stage", "ps" or "scheduler"
    vw: int = -1
    stage: int = -1
    gpu: str = ""                # cluster GPU id the stage runs as (its emulated device)
    layers: tuple[int, int] = (0, 0)
    tp: int = 1                  # the stage's tensor-parallel degree
    tp_rank: int = 0             # this rank's member index in it (0: the lead)
    ps_index: int = -1           # which parameter-server shard (ps ranks only)


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    roles: tuple[Role, ...]
    devices: tuple[int, ...] = ()         # per VW, its pipeline devices (stage j runs on device j mod p)

    @property
    def world_size(self) -> int:
        return len(self.roles)

    @property
    def stage_ranks(self) -> tuple[Role, ...]:
        return tuple(r for r in self.roles if r.kind == "stage")

    @property
    def ps_ranks(self) -> tuple[Role, ...]:
        return tuple(r for r in self.roles if r.kind == "ps")

    @property
    def scheduler_rank(self) -> int:
        for r in self.roles:
            if r.kind == "scheduler":
                return r.rank
        raise KeyError("no sdpipe scheduler rank (the plan's sync is not sdpipe)")

    def stage_rank(self, vw: int, stage: int) -> int:
        """The rank of the stage, or of its lead: the one that talks to the neighbouring stages."""
        return self.member_ranks(vw, stage)[0]

    def member_ranks(self, vw: int, stage: int) -> list[int]:
        """The ranks of the stage, lead first (one unless the stage is tensor-parallel)."""
        stage = stage % self.devices[vw] if self.devices else stage
        ranks = [r.rank for r in self.roles if r.kind == "stage" and r.vw == vw and r.stage == stage]
        if not ranks:
            raise KeyError(f"no rank for vw {vw} stage {stage}")
        return ranks

    def describe(self, rank: int) -> str:
        r = self.roles[rank]
        if r.kind == "ps":
            return f"rank {rank} (parameter server {r.ps_index})"
        if r.kind == "scheduler":
            return f"rank {rank} (sdpipe group scheduler)"
        tp = f" tp{r.tp_rank}/{r.tp}" if r.tp > 1 else ""
        return f"rank {rank} (vw{r.vw} stage {r.stage}{tp} on {r.gpu})"


def rank_layout(plan: Plan, n_shards: int) -> RankLayout:
    """Stage ranks in plan order (a tensor-parallel stage's members in its order, lead first); WSP
    adds one parameter-server rank per shard (hetsim.parameter_servers.ps_shards: one per PS node, or
    one per stage with local placement); SDPipe adds one group-scheduler rank that serves every stage
    index."""
    roles: list[Role] = []
    for v, vw in enumerate(plan.virtual_workers):
        for s, spec in enumerate(vw.stages[:vw.n_devices]):
            for k, gpu in enumerate(spec.members):
                roles.append(Role(rank=len(roles), kind="stage", vw=v, stage=s, gpu=gpu, layers=spec.layers,
                                  tp=spec.tp, tp_rank=k))
    if plan.sync.mode == "wsp":
        for j in range(n_shards):
            roles.append(Role(rank=len(roles), kind="ps", ps_index=j))
    if plan.sync.mode == "sdpipe":
        roles.append(Role(rank=len(roles), kind="scheduler"))
    return RankLayout(roles=tuple(roles), devices=tuple(vw.n_devices for vw in plan.virtual_workers))


def shard_indices(layer_numel: list[int], shards: list[tuple[tuple[int, int], float]], j: int,
                  lo: int, hi: int) -> list[tuple[int, int]]:
    """Index ranges [a, b) of stage [lo, hi)'s flat parameter vector that shard j holds.

    `shards[j]` = (layers, fraction) as hetsim.parameter_servers.ps_shards gives them: a shard with
    fraction 1/n holds the j'th of n equal chunks of each of its layers (default placement), a shard
    with fraction 1 holds its layers whole (local placement).

    >>> shard_indices([4, 6], [((0, 2), 0.5), ((0, 2), 0.5)], 1, 0, 2)
    [(2, 4), (7, 10)]
    """
    (a, b), fraction = shards[j]
    peers = [i for i, (layers, f) in enumerate(shards) if layers == (a, b) and f == fraction]
    n, pos = len(peers), peers.index(j)
    out, offset = [], 0
    for layer in range(lo, hi):
        numel = layer_numel[layer]
        if a <= layer < b and numel:
            start = offset + (numel * pos) // n
            end = offset + (numel * (pos + 1)) // n
            if end > start:
                out.append((start, end))
        offset += numel
    return out
