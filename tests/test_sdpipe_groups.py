"""SDPipe's group scheduling rules (hetsim.sdpipe_groups), shared by the simulator and the executor:
literal arrival times in, groups out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetsim.plan import SyncSpec
from hetsim.sdpipe_groups import GroupFormer

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


def test_a_period_already_connected_by_a_pipeline_ahead_owes_no_second_connection():
    f = former(n_vw=2, spec=SyncSpec(mode="sdpipe", sdpipe_period=2))
    f.join(1, 0, now=0.0)
    assert f.expire(1.0).members == (1,)
    f.join(1, 1, now=2.0)                                         # vw1 ends its period: owes one
    assert f.expire(3.0) is None and f.blocked
    group = f.join(0, 0, now=4.0)
    assert group.members == (0, 1) and group.connected and f.connections == 1
    f.join(0, 1, now=5.0)                                         # vw0 ends its period one wave behind:
    assert f.expire(6.0).members == (0,)                          # that connection counts for it too
    f.join(1, 2, now=7.0)
    assert f.expire(8.0).members == (1,)
    f.join(1, 3, now=9.0)                                         # vw1's next period end owes again
    assert f.expire(10.0) is None and f.blocked


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
