import gc

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
