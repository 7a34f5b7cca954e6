"""SDPipe in the executor: the group scheduler's window and connectivity rule (pure), and runs in
which groups average weights with a point-to-point ring among their members only."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

import executor
import modelzoo
from exec_helpers import host, mlp_plan
from executor.data import SyntheticData
from executor.health import ExecutorError
from executor.launch import layout_of
from executor.sdpipe_groups import GroupFormer
from hetsim.compare import compare_reports
from hetsim.errors import HetsimError
from hetsim.plan import SyncSpec

LR, MOMENTUM, SEED, BATCH = 0.05, 0.9, 3, 16
SPEC = SyncSpec(mode="sdpipe", sdpipe_period=10, sdpipe_wait_init_s=1e-3, sdpipe_wait_min_s=5e-4,
                sdpipe_wait_max_s=4e-3)


def former(n_vw: int = 3, waves: int = 100, spec: SyncSpec = SPEC) -> GroupFormer:
    return GroupFormer(stage=0, n_vw=n_vw, spec=spec, waves=waves)


# the pure scheduler ------------------------------------------------------------------------------

def test_the_first_arrival_opens_a_window_and_the_group_is_whoever_is_ready_when_it_closes():
    f = former()
    assert f.join(0, 0, now=10.0) is None and f.deadline == pytest.approx(10.001)
    assert f.join(2, 0, now=10.0005) is None and f.deadline == pytest.approx(10.001)  # not reopened
    assert f.expire(10.0009) is None
    group = f.expire(10.001)
    assert (group.members, group.waves, group.number) == ((0, 2), (0, 0), 0)
    assert f.deadline is None and f.ready == {}
    assert f.wait_s == pytest.approx(0.9e-3)                      # a real group shrinks the window


def test_everyone_ready_closes_at_once_without_waiting_out_the_window():
    f = former()
    f.join(1, 0, now=0.0)
    f.join(0, 0, now=0.0001)
    group = f.join(2, 0, now=0.0002)
    assert group.members == (0, 1, 2) and group.connected and f.connections == 1


def test_the_window_doubles_after_a_group_of_one_up_to_the_maximum_and_shrinks_down_to_the_minimum():
    f, t, waits = former(spec=replace(SPEC, sdpipe_period=1000)), 0.0, []     # no period ends here
    for wave in range(4):                                         # alone every time
        f.join(0, wave, now=t)
        assert f.expire(t + f.wait_s).members == (0,)
        t += 1.0
        waits.append(f.wait_s)
    assert waits == pytest.approx([2e-3, 4e-3, 4e-3, 4e-3])
    for wave in range(4, 12):                                     # always a pair
        f.join(0, wave, now=t)
        f.join(1, wave, now=t)
        f.expire(t + f.wait_s)
        t += 1.0
    assert f.wait_s == pytest.approx(max(4e-3 * 0.9 ** 8, 5e-4))
    for wave in range(12, 40):
        f.join(0, wave, now=t)
        f.join(1, wave, now=t)
        f.expire(t + 1.0)
        t += 2.0
    assert f.wait_s == 5e-4


def test_a_period_end_group_waits_until_it_connects_every_pipeline():
    f = former(spec=SyncSpec(mode="sdpipe", sdpipe_period=2))
    f.join(0, 0, now=0.0)
    f.join(1, 0, now=0.0)
    assert f.expire(1.0).members == (0, 1)                        # links {0, 1}; 2 is apart
    f.join(2, 0, now=2.0)
    assert f.expire(3.0).members == (2,)
    f.join(0, 1, now=4.0)                                         # wave 1 ends a period of 2
    assert f.expire(5.0) is None and f.blocked                    # {0} alone would not link 2
    assert f.join(1, 1, now=6.0) is None                          # {0, 1}: still not
    group = f.join(2, 1, now=7.0)
    assert group.members == (0, 1, 2) and group.connected and f.connections == 1


def test_a_group_that_completes_the_links_counts_as_a_connection_and_resets_them():
    f = former(spec=SyncSpec(mode="sdpipe", sdpipe_period=4))
    closes = []
    for joins in [[(0, 0), (1, 0)], [(1, 1), (2, 0)], [(0, 1)], [(0, 2), (2, 1)]]:   # (vw, wave)
        for vw, wave in joins:
            f.join(vw, wave, now=float(len(closes)))
        closes.append(f.expire(float(len(closes)) + 1.0))
    assert [g.connected for g in closes] == [False, True, False, False]
    assert f.connections == 1                                     # {0, 2} after the reset links only two


def test_a_pipeline_that_ran_its_last_wave_leaves_so_the_others_finish():
    f = former(waves=1, spec=SyncSpec(mode="sdpipe", sdpipe_period=1))
    f.join(0, 0, now=0.0)
    assert f.expire(1.0) is None and f.blocked                    # P = 1: all of them, or wait
    f.join(1, 0, now=2.0)
    assert f.join(2, 0, now=3.0).members == (0, 1, 2)
    assert f.active == set()
    g = former(n_vw=2, waves=2, spec=SyncSpec(mode="sdpipe", sdpipe_period=5))
    g.join(0, 1, now=0.0)                                         # vw0's last wave, alone
    assert g.expire(1.0).members == (0,) and g.active == {1}
    assert g.join(1, 0, now=2.0).members == (1,)                  # now everyone active is ready


def test_a_pipeline_cannot_join_twice_without_being_grouped():
    f = former()
    f.join(0, 0, now=0.0)
    with pytest.raises(ValueError, match="vw0 joined wave 1 while already waiting"):
        f.join(0, 1, now=0.1)


# runs --------------------------------------------------------------------------------------------

def run(plan, waves: int, timeout_s: float = 20.0, **options):
    opts = executor.ExecOptions(waves=waves, warmup_waves=1, seed=SEED, lr=LR, momentum=MOMENTUM,
                                timeout_s=timeout_s, **options)
    return executor.launch(plan, host(len(plan.gpus)), options=opts)


def model_averaging_losses(n_minibatches: int, n_vw: int) -> list[list[float]]:
    """Plain local SGD: each VW steps its own copy (its own momentum) on its own minibatch, then the
    copies' weights are replaced by their mean, as a group of everyone does after every wave."""
    torch.manual_seed(SEED)
    model, example = modelzoo.build("mlp", batch=1)
    models = [model] + [modelzoo.build("mlp", batch=1)[0] for _ in range(n_vw - 1)]
    for m in models[1:]:
        m.load_state_dict(model.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM) for m in models]
    data = SyntheticData(mode="teacher", seed=SEED, batch=BATCH, input_shape=tuple(example.shape[1:]),
                         num_classes=10)
    losses = []
    for mb in range(n_minibatches):
        row = []
        for v, (m, opt) in enumerate(zip(models, opts)):
            loss = torch.nn.functional.cross_entropy(m(data.inputs(v, mb)), data.labels(v, mb))
            row.append(float(loss.detach()))
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(row)
        with torch.no_grad():
            for params in zip(*(m.parameters() for m in models)):
                mean = sum(params) / n_vw
                for p in params:
                    p.copy_(mean)
    return losses


def test_period_one_groups_everyone_and_averages_weights_like_local_sgd_with_averaging():
    plan = mlp_plan([[0, 4, 9], [0, 4, 9]], nm=1, schedule="1f1b-flush", batch=BATCH,
                    sync=SyncSpec(mode="sdpipe", sdpipe_period=1))
    report = run(plan, waves=4)
    want = model_averaging_losses(4, n_vw=2)
    assert want[-1] != pytest.approx(want[0], abs=1e-3)            # training moved the weights
    for vw, mb, loss in report.training["losses"]:
        assert loss == pytest.approx(want[mb][vw], abs=1e-5)
    groups = report.training["sdpipe_groups"]
    assert groups == {f"stage {s}": [[[0, 1], [w, w]] for w in range(4)] for s in (0, 1)}
    digests = report.training["final_weights"]
    for s in (0, 1):                                              # bit-identical after the last group
        assert digests[f"rank {s} (vw0 stage {s} on host/gpu{s})"] == \
            digests[f"rank {2 + s} (vw1 stage {s} on host/gpu{2 + s})"]
    assert report.sync["group_size"]["histogram"] == {"2": 8} and report.sync["connections"] == [4, 4]
    rows = {r.metric: r for r in compare_reports(replace(report, kind="prediction"), report)}
    assert rows["sdpipe mean group size"].measured == 2.0 and rows["sdpipe connections"].measured == 8


def test_under_a_straggler_fast_pipelines_group_without_it_yet_every_period_connects_all():
    n_vw, waves, period = 3, 10, 2
    plan = mlp_plan([[0, 9]] * n_vw, nm=2, schedule="1f1b", batch=BATCH,
                    sync=SyncSpec(mode="sdpipe", sdpipe_period=period))
    report = run(plan, waves=waves, slowdown={"host/gpu0": 20.0})
    groups = report.training["sdpipe_groups"]["stage 0"]
    for v in range(n_vw):                                         # each wave grouped once, in order
        assert [w for members, ws in groups for m, w in zip(members, ws) if m == v] == list(range(waves))
    assert min(len(members) for members, _ in groups) < n_vw     # the straggler was left out sometimes
    # The rule, replayed from the record: links since the last connection; a group in which a member
    # ends a period leaves every pipeline still running connected.
    labels, active, connections = list(range(n_vw)), set(range(n_vw)), 0
    for members, ws in groups:
        joined = {labels[m] for m in members}
        labels = [labels[members[0]] if label in joined else label for label in labels]
        connected = len({labels[v] for v in active}) == 1
        if any((w + 1) % period == 0 for w in ws):
            assert connected, f"group {members} at waves {ws} left {active} unconnected"
        if connected:
            labels, connections = list(range(n_vw)), connections + 1
        active -= {m for m, w in zip(members, ws) if w == waves - 1}
    assert report.sync["connections"] == [connections] and connections >= waves // period
    assert report.sync["groups"] == len(groups)


@pytest.mark.parametrize("kind,word", [("die", "died"), ("hang", "hung")])
def test_a_dead_or_hung_stage_rank_is_named_by_the_scheduler_and_the_other_pipeline(kind, word):
    """vw0 waits for its group (P = 1: for vw1) on the scheduler, not on vw1 itself; neither it nor
    the scheduler may blame the other."""
    plan = mlp_plan([[0, 9], [0, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="sdpipe", sdpipe_period=1))
    start = time.monotonic()
    with pytest.raises(ExecutorError) as info:
        run(plan, waves=4, timeout_s=4.0, fault=f"1:F3:{kind}")
    message = str(info.value)
    culprit = "rank 1 (vw1 stage 0 on host/gpu1)"
    assert f"{culprit} {word}" in message
    for other in ("rank 0 ", "rank 2 (sdpipe group scheduler)"):
        line = next(l for l in message.splitlines() if l.strip().startswith(other))
        assert culprit in line and "killed" not in line
    assert time.monotonic() - start < 4.0 + 15


def test_an_sdpipe_plan_is_accepted_with_one_scheduler_rank_after_the_stages(tmp_path):
    plan = mlp_plan([[0, 4, 9], [0, 4, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="sdpipe"))
    job = executor.make_job(plan, host(4))
    layout = layout_of(job)
    assert [r.kind for r in layout.roles] == ["stage"] * 4 + ["scheduler"]
    assert layout.scheduler_rank == 4 and layout.describe(4) == "rank 4 (sdpipe group scheduler)"
    with pytest.raises(HetsimError, match="checkpoints need a flush schedule"):
        executor.make_job(mlp_plan([[0, 9], [0, 9]], nm=1, schedule="1f1b-flush", sync=SyncSpec(mode="sdpipe")),
                          host(2), options=executor.ExecOptions(checkpoint_dir=str(tmp_path)))
