"""The executor's loss curve: every loss with its wall-clock time, written as loss.csv."""

from __future__ import annotations

import csv

import executor
from exec_helpers import host, mlp_plan
from hetsim.plan import SyncSpec
from hetsim.report import LOSS_COLUMNS


def test_loss_csv_has_every_loss_at_increasing_times_within_the_run(tmp_path):
    plan = mlp_plan([[0, 4, 9], [0, 5, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="wsp", staleness_bound=1))
    report = executor.launch(plan, host(4), options=executor.ExecOptions(waves=4, warmup_waves=1), out=tmp_path)
    with open(tmp_path / "loss.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == LOSS_COLUMNS
    times = [float(r["t_s"]) for r in rows]
    assert times == sorted(times) and times[0] > 0
    assert times[-1] <= report.window["end_s"] + 5.0          # on the run's time axis, not epoch seconds
    # The same losses as the report's, each once: 2 VWs x 4 waves x Nm 2.
    assert sorted((int(r["vw"]), int(r["minibatch"]), float(r["loss"])) for r in rows) == \
        sorted(tuple(x) for x in report.training["losses"])
    assert len(rows) == 2 * 4 * 2
    for vw in (0, 1):                                          # a VW's minibatches finish in order
        mine = [int(r["minibatch"]) for r in rows if r["vw"] == str(vw)]
        assert mine == sorted(mine)
