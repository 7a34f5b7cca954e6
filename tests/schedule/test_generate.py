import pytest

from hetsim.schedule import build_schedule, format_grid, validate_schedule, warmup_forwards
from hetsim.schedule.generate import compute_order, greedy_orders
from hetsim.schedule.ir import Action, Schedule


def compute(schedule: Schedule, stage: int) -> str:
    return " ".join(str(a) for a in schedule.stages[stage] if a.kind in ("F", "B", "STEP"))


def test_pipedream_1f1b_literal_table():
    s = build_schedule("1f1b", 3, 3, 2)
    assert compute(s, 0) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
    assert compute(s, 1) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"
    assert compute(s, 2) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


def test_gpipe_literal_table_flushes_every_wave():
    s = build_schedule("gpipe", 2, 2, 2)
    assert compute(s, 0) == "F0 F1 B0 B1 STEP0 F2 F3 B2 B3 STEP1"
    assert compute(s, 1) == compute(s, 0)


def test_pipedream_flush_literal_table():
    s = build_schedule("1f1b-flush", 2, 3, 1)
    assert compute(s, 0) == "F0 F1 B0 F2 B1 B2 STEP0"
    assert compute(s, 1) == "F0 B0 F1 B1 F2 B2 STEP0"


def test_hetpipe_order_follows_arrivals_when_fewer_minibatches_than_stages():
    orders = greedy_orders(2, 6, ((1.0, 2.0, 0.0),) * 4)
    as_text = [" ".join(f"{k}{i}" for k, i in o) for o in orders]
    assert as_text[0] == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"
    assert as_text[1] == "F0 F1 B0 B1 F2 F3 B2 B3 F4 F5 B4 B5"   # a train of Nm: not 1F1B
    assert as_text[3] == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


@pytest.mark.parametrize("name", ["gpipe", "1f1b-flush", "1f1b", "hetpipe"])
@pytest.mark.parametrize("k,nm", [(1, 1), (2, 1), (3, 2), (4, 4), (4, 6)])
def test_every_schedule_is_valid_and_keeps_at_most_nm_in_flight(name, k, nm):
    for sync in ("none", "wsp", "bsp", "sdpipe"):
        s = build_schedule(name, k, nm, 3, sync)
        validate_schedule(s)
        assert all(s.in_flight(stage) <= nm for stage in range(k))


def test_wsp_pushes_once_per_wave_and_pulls_before_every_later_wave():
    s = build_schedule("hetpipe", 3, 2, 4, "wsp")
    for actions in s.stages:
        assert [a.index for a in actions if a.kind == "PUSH"] == [0, 1, 2, 3]
        assert [a.index for a in actions if a.kind == "PULL"] == [1, 2, 3]
        pulls = [i for i, a in enumerate(actions) if a.kind == "PULL"]
        assert all(actions[i + 1 + (actions[i + 1].kind == "RECV_F")].kind == "F" for i in pulls)


def test_bsp_allreduces_before_the_step():
    s = build_schedule("gpipe", 1, 2, 1, "bsp")
    assert [str(a) for a in s.stages[0]] == ["F0", "F1", "B0", "B1", "ALLREDUCE0", "STEP0"]


def test_warmup_matches_pipedream():
    assert [warmup_forwards("1f1b", 4, 4, s) for s in range(4)] == [4, 3, 2, 1]
    assert [warmup_forwards("1f1b", 4, 2, s) for s in range(4)] == [2, 2, 2, 1]


def test_csv_round_trip():
    s = build_schedule("1f1b", 3, 2, 2, "wsp")
    back = Schedule.from_csv(s.to_csv(), name=s.name, nm=s.nm)
    assert back.stages == s.stages and back.n_minibatches == s.n_minibatches


def test_action_text_round_trip():
    for text in ["F3", "SEND_B12", "PUSH0", "GROUP_SYNC7", "RECV_F1"]:
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError):
        Action.parse("X3")


def test_compute_order_marks_flushes():
    assert compute_order("gpipe", 2, 1, 0, 2) == [("F", 0), ("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1)]
