"""executor.colocation's probes do the optimiser work of the plan's schedule (issue 16, item 10)."""

import pytest

from executor.colocation import _stage_step, probe_actions

SMALL = {"hidden": 64, "depth": 2}          # 5 layers


def test_asynchronous_schedules_update_once_per_minibatch():
    assert probe_actions("1f1b", 2) == ("forward", "update previous", "backward")
    assert probe_actions("hetpipe", 4) == ("forward", "update previous", "backward")
    assert probe_actions("1f1b", 1) == ("forward", "backward", "update")


def test_flush_schedules_accumulate_each_minibatch_and_step_once_per_wave():
    assert probe_actions("gpipe", 1) == ("forward", "backward", "accumulate", "step")
    assert probe_actions("1f1b-flush", 3) == ("forward", "backward", "accumulate") * 3 + ("step",)
    assert probe_actions("gpipe", 4).count("step") == 1


@pytest.mark.parametrize("schedule, nm, sync, versions", [
    ("1f1b", 2, "none", 5),            # one update per minibatch, the first step's has no predecessor
    ("1f1b", 1, "none", 6),
    ("gpipe", 3, "none", 6),           # 6 waves of 3 minibatches, one step each
    ("1f1b-flush", 2, "bsp", 6),
    ("1f1b", 2, "wsp", 5),
])
def test_a_probe_step_changes_the_weights_as_the_schedule_does(schedule, nm, sync, versions):
    step = _stage_step("mlp", 2, 5, 8, SMALL, schedule=schedule, nm=nm, sync=sync)
    for _ in range(6):
        step()
    stage = step.stage
    assert stage.version == versions
    assert stage.flat_grads == (sync == "bsp") and stage.track_deltas == (sync == "wsp")
    assert stage._acc is None                   # every wave's gradients were stepped


def test_a_flush_probe_step_is_a_wave_of_nm_minibatches():
    step = _stage_step("mlp", 0, 3, 8, SMALL, schedule="gpipe", nm=4)
    step()
    assert step.stage.version == 1 and not step.stage.inflight and not step.stage.grads
