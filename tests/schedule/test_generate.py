import pytest

from hetsim.schedule import build_schedule, validate_schedule, warmup_forwards
from hetsim.schedule.generate import greedy_orders
from hetsim.errors import ScheduleError
from hetsim.schedule.ir import Action, Schedule
from hetsim.schedule.orders import OrderRequest, gpipe


def compute(schedule: Schedule, stage: int) -> str:
    return " ".join(str(a) for a in schedule.stages[stage] if a.kind in ("F", "B", "I", "W", "STEP"))


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
    as_text = [" ".join(str(a) for a in o) for o in orders]
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
    for text in ["F3", "SEND_B12", "PUSH0", "GROUP_SYNC7", "RECV_F1", "F3c1", "I2", "W0c2"]:
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError):
        Action.parse("X3")


def test_flush_orders_mark_the_end_of_every_wave():
    assert [str(a) for a in gpipe(OrderRequest(2, 1, 2))[0]] == ["F0", "B0", "FLUSH0", "F1", "B1", "FLUSH1"]


def test_zb_h1_literal_table_defers_s_weight_gradients_on_stage_s():
    s = build_schedule("zb-h1", 3, 4, 1)
    assert compute(s, 0) == "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3 STEP0"
    assert compute(s, 1) == "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3 STEP0"
    assert compute(s, 2) == "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3 STEP0"


def test_interleaved_literal_table_follows_megatron():
    # p = 2 devices, v = 2 chunks, Nm = 4: warm-up 2(p - d - 1) + (v - 1)p chunk forwards, then 1F1B.
    s = build_schedule("1f1b-interleaved", 2, 4, 1, chunks=2)
    assert compute(s, 0) == ("F0 F1 F0c1 F1c1 F2 B0c1 F3 B1c1 F2c1 B0 F3c1 B1 B2c1 B3c1 B2 B3 "
                             "STEP0 STEP0c1")
    assert compute(s, 1) == ("F0 F1 F0c1 B0c1 F1c1 B1c1 F2 B0 F3 B1 F2c1 B2c1 F3c1 B3c1 B2 B3 "
                             "STEP0 STEP0c1")


def test_interleaved_sends_cross_from_the_last_device_to_the_next_chunk_of_the_first():
    s = build_schedule("1f1b-interleaved", 2, 2, 1, chunks=2)
    assert Action("SEND_F", 0, 0) in s.stages[1] and Action("RECV_F", 0, 1) in s.stages[0]
    assert Action("SEND_F", 0, 1) not in s.stages[1]           # the last virtual stage sends nothing on
    assert Action("RECV_F", 0, 0) not in s.stages[0]


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 2, 9)])
def test_interleaved_first_device_holds_what_megatron_states(p, v, m):
    """Korthikanti et al. (2022) §4.2.3: the first device holds p (1 + (p - 1) / (p v)) microbatches'
    worth of activations, i.e. v p + p - 1 chunk activations of 1/v each."""
    s = build_schedule("1f1b-interleaved", p, m, 2, chunks=v)
    validate_schedule(s)
    assert s.in_flight(0) == v * p + p - 1
    assert s.in_flight(0) / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert [s.in_flight(d) for d in range(p)] == [2 * (p - d - 1) + (v - 1) * p + 1 for d in range(p)]


@pytest.mark.parametrize("k,nm", [(1, 1), (2, 2), (3, 4), (4, 8)])
def test_zb_h1_holds_p_minibatches_like_1f1b_first_stage(k, nm):
    zb, flush = build_schedule("zb-h1", k, nm, 2, "bsp"), build_schedule("1f1b-flush", k, nm, 2, "bsp")
    validate_schedule(zb)
    assert max(zb.in_flight(s) for s in range(k)) == max(flush.in_flight(s) for s in range(k)) == min(nm, k)


def test_csv_round_trip_keeps_chunks():
    s = build_schedule("1f1b-interleaved", 2, 2, 2, "bsp", chunks=3)
    back = Schedule.from_csv(s.to_csv(), name=s.name, nm=s.nm)
    assert back == s


def test_deepspeed_literal_table_follows_its_lockstep_steps():
    """DeepSpeed's TrainSchedule (its releases since early 2023), worked by hand for 2 stages and 2
    minibatches: the first stage sends an activation one step after computing it, after receiving the
    gradient that step's backward needs; the last returns a gradient one step after its backward,
    before receiving the next activation."""
    s = build_schedule("1f1b-deepspeed", 2, 2, 1)
    text = lambda d: " ".join(str(a) for a in s.stages[d])
    assert text(0) == "F0 SEND_F0 F1 RECV_B0 SEND_F1 B0 RECV_B1 B1 STEP0"
    assert text(1) == "RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1 STEP0"


def test_a_rendezvous_check_finds_the_deadlock_eager_sends_hide():
    """1F1B's order (a send right after its compute) deadlocks when every send waits for its receive;
    DeepSpeed's order does not, for any depth."""
    eager = build_schedule("1f1b-flush", 3, 4, 1)
    as_rendezvous = Schedule(name="1f1b-deepspeed", nm=4, n_minibatches=4, stages=eager.stages)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate_schedule(as_rendezvous)
    for k in range(1, 7):
        validate_schedule(build_schedule("1f1b-deepspeed", k, 5, 2, "bsp"))
