import pytest

from hetsim.errors import ScheduleError
from hetsim.schedule import build_schedule, validate_schedule
from hetsim.schedule.ir import Action, Schedule


def edited(schedule: Schedule, stage: int, actions) -> Schedule:
    stages = list(schedule.stages)
    stages[stage] = tuple(actions)
    return Schedule(name="edited", nm=schedule.nm, n_minibatches=schedule.n_minibatches, stages=tuple(stages))


def test_swapped_receive_order_deadlocks_and_the_grid_marks_the_stuck_cells():
    s = build_schedule("1f1b", 2, 2, 1)
    a = list(s.stages[1])
    # Stage 1 waits for minibatch 1's activations before running minibatch 0's backward ...
    a = [Action("RECV_F", 0), Action("F", 0), Action("RECV_F", 1), Action("F", 1),
         Action("B", 0), Action("SEND_B", 0), Action("UPDATE", 0), Action("B", 1), Action("SEND_B", 1),
         Action("UPDATE", 1)]
    validate_schedule(edited(s, 1, a))        # ... which is fine: stage 0 sends F1 before waiting.
    b = list(s.stages[0])
    b.remove(Action("SEND_F", 1))
    b.insert(b.index(Action("B", 1)) + 1, Action("SEND_F", 1))   # now F1 is sent only after B1
    with pytest.raises(ScheduleError) as err:
        validate_schedule(edited(edited(s, 1, a), 0, b))
    assert "deadlock" in str(err.value)
    assert ">RECV_B0<" in err.value.grid and ">RECV_F1<" in err.value.grid


def test_backward_before_forward_is_rejected():
    s = build_schedule("gpipe", 1, 2, 1)
    bad = [Action("B", 0), Action("F", 0), Action("F", 1), Action("B", 1), Action("STEP", 0)]
    with pytest.raises(ScheduleError, match="runs B0 before F0"):
        validate_schedule(edited(s, 0, bad))


def test_missing_backward_is_rejected():
    s = build_schedule("gpipe", 1, 2, 1)
    with pytest.raises(ScheduleError, match="never runs B1"):
        validate_schedule(edited(s, 0, [Action("F", 0), Action("F", 1), Action("B", 0)]))


def test_receive_without_matching_send_is_rejected():
    s = build_schedule("gpipe", 2, 1, 1)
    with pytest.raises(ScheduleError, match="no matching SEND_F0"):
        validate_schedule(edited(s, 0, [a for a in s.stages[0] if a.kind != "SEND_F"]))


def test_pull_offset_zero_deadlocks_an_asynchronous_pipeline():
    s = build_schedule("hetpipe", 2, 2, 3, "wsp")
    with pytest.raises(ScheduleError, match="PULL1"):
        validate_schedule(s, pull_offset=0)
    validate_schedule(s, pull_offset=1)
