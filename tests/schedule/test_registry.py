"""The schedule registry: the one list of schedule names, each entry consistent with the IR it builds."""

import json
import subprocess
import sys

import pytest

from hetsim.errors import PlanError, SpecError
from hetsim.plan import ASYNC_SCHEDULES, SCHEDULES, plan_from_dict
from hetsim.schedule import REGISTRY, build_schedule, schedule_kind, validate_schedule


def test_unknown_schedule_is_refused_with_the_known_names():
    with pytest.raises(PlanError) as err:
        build_schedule("1f1b-interleavd", 2, 2, 1)
    message = str(err.value)
    assert "\n" not in message and "'1f1b-interleavd'" in message
    assert all(name in message for name in REGISTRY)


def test_plan_with_unknown_schedule_names_the_field_and_the_choices():
    doc = {"name": "p", "minibatch_size": 1, "nm": 1, "schedule": "zb-h9",
           "virtual_workers": [{"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 1]}]}]}
    with pytest.raises(SpecError) as err:
        plan_from_dict(doc)
    assert "schedule" in str(err.value) and all(name in str(err.value) for name in REGISTRY)


def test_cli_refuses_an_unknown_schedule_with_exit_code_2():
    out = subprocess.run([sys.executable, "-m", "hetsim", "plan", "--schedule", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "nope" in out.stderr and all(name in out.stderr for name in REGISTRY)


def test_plan_constants_are_read_from_the_registry():
    assert SCHEDULES == tuple(REGISTRY)
    assert set(ASYNC_SCHEDULES) == {n for n, k in REGISTRY.items() if k.asynchronous} == {"1f1b", "hetpipe"}


@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize("k,nm", [(1, 1), (2, 2), (3, 3), (4, 8)])
def test_every_entry_builds_valid_schedules_within_its_in_flight_rule(name, k, nm):
    kind = schedule_kind(name)
    chunks = 2 if kind.virtual_stages else 1
    if kind.virtual_stages and nm % k:
        nm = k
    for sync in kind.sync_modes:
        s = build_schedule(name, k, nm, 2, sync, chunks=chunks)
        validate_schedule(s)
        assert s.n_stages == k and s.chunks == chunks
        for stage in range(k):
            assert s.in_flight(stage) <= kind.in_flight(k, stage, nm, chunks)
            assert sum(s.deferred_at_peak(stage)) <= kind.deferred(k, stage, nm, chunks)
        assert any(s.in_flight(stage) == kind.in_flight(k, stage, nm, chunks) for stage in range(k))
        # Only a split backward holds output gradients between I and W, and its rule is reached.
        assert any(sum(s.deferred_at_peak(stage)) == kind.deferred(k, stage, nm, chunks) > 0
                   for stage in range(k)) == kind.split_backward
        assert kind.description and not kind.description.endswith(".")


def test_a_schedule_refuses_sync_modes_its_entry_does_not_list():
    with pytest.raises(PlanError, match="sync wsp"):
        build_schedule("zb-h1", 2, 2, 1, "wsp")


def test_interleaved_needs_nm_a_multiple_of_the_devices():
    with pytest.raises(PlanError, match="multiple"):
        build_schedule("1f1b-interleaved", 3, 4, 1, chunks=2)
