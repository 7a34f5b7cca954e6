"""Collective operations as SimPy generators over the shared links (ring all-reduce, as NCCL and
Horovod run it for large messages)."""

from __future__ import annotations

from hetsim.sim.world import World

__all__ = ["ring_allreduce", "parallel_rings"]


def ring_allreduce(world: World, gpus: list[str], nbytes: float, calls: int = 1):
    """2(n-1) steps; in each, every member sends nbytes/n to its ring successor at the same time.
    `calls` all-reduces of nbytes/calls each (a TP pass makes one per row-parallel product) run as
    one ring of the whole after what the further calls add alone (Topology.collective_overhead_s):
    the same time on idle links, in 2(n-1) transfers instead of 2(n-1) x calls. (Where a node's cores
    copy the messages, CPU ranks, the merged ring's copies share the cores a little differently:
    on tp2_gpt's validation cluster 5 calls take 17.21 ms merged, 16.77 ms one after another.)"""
    n = len(gpus)
    if n < 2 or nbytes <= 0:
        return
    fixed = world.topology.collective_overhead_s(gpus, calls)
    if fixed:
        yield world.env.timeout(fixed)
    chunk = nbytes / n
    for _ in range(2 * (n - 1)):
        yield world.env.all_of([world.transfer(gpus[i], gpus[(i + 1) % n], chunk) for i in range(n)])


def parallel_rings(world: World, groups: list[tuple[str, ...]], nbytes: float):
    """Data-parallel all-reduce of replicas that are tensor-parallel groups: member k of every replica
    joins ring k and reduces its 1/t shard (t the widest group), all rings at once on shared links.
    Replicas of one GPU each form the one ring of the whole `nbytes`."""
    width = max(len(g) for g in groups)
    rings = [[g[k % len(g)] for g in groups] for k in range(width)]
    procs = [world.env.process(ring_allreduce(world, ring, nbytes / width)) for ring in rings]
    yield world.env.all_of(procs)
