import gc

import pytest

import simpy

from hetsim.sim.world import CountingEnvironment


def ticks(env, n):
    for _ in range(n):
        yield env.timeout(1.0)


def test_run_counts_every_step_as_stepping_one_event_at_a_time_does():
    counted = CountingEnvironment()
    counted.process(ticks(counted, 5))
    counted.run()
    stepped = CountingEnvironment()
    stepped.process(ticks(stepped, 5))
    try:
        while True:
            stepped.step()
    except simpy.core.EmptySchedule:
        pass
    assert counted.events_processed == stepped.events_processed
    assert counted.now == stepped.now == 5.0


def test_run_until_a_time_stops_there_and_counts_its_steps():
    env = CountingEnvironment()
    env.process(ticks(env, 10))
    env.run(until=3.5)
    assert env.now == 3.5
    assert env.events_processed > 0


def test_run_leaves_the_garbage_collector_thresholds_as_it_found_them():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)                   # CPython's defaults
    before = gc.get_threshold()
    env = CountingEnvironment()
    seen = []

    def look():
        seen.append(gc.get_threshold()[0])
        yield env.timeout(1.0)

    env.process(look())
    try:
        env.run()
        after = gc.get_threshold()
    finally:
        gc.set_threshold(*saved)
    assert seen[0] > before[0]                      # collected less often during the run
    assert after == before


def _busy_node(copy_cores):
    """A rank computing 1 s on a node of one shared core while a message of 1 s worth of bytes
    moves between two other ranks: (compute done, delivered) times."""
    import numpy as np

    from hetsim.sim.world import Device, World
    from tests.conftest import cluster
    world = World(cluster([3], intra_Bps=1e9, shared_cores=1, copy_cores=copy_cores))
    device = Device(world, world.cluster.gpu("node0/gpu0"), slowdown=1.0, jitter_cv=0.0, straggler_prob=0.0,
                    straggler_delay_s=0.0, rng=np.random.default_rng(0))
    done = {}

    def record(name, event):
        yield event
        done[name] = world.env.now
    world.env.process(record("compute", device.run(1.0)))
    world.env.process(record("message", world.transfer("node0/gpu1", "node0/gpu2", 1e9)))
    world.env.run()
    return done["compute"], done["message"]


def test_message_copies_take_the_shared_cores_unless_the_node_names_copy_cores():
    # One core, shared fairly by the compute and the message's two copies (1 core-second each).
    assert _busy_node(None) == (pytest.approx(3.0), pytest.approx(3.0))
    # Copies on the host's cores (ranks sharing a GPU): neither waits for the other.
    assert _busy_node(4) == (pytest.approx(1.0), pytest.approx(1.0))
