"""The tensor-parallel validation runs of results/tp_cpu/ as a table, each predicted again from its saved
inputs three ways: as validated (each all-reduce call paying the link's collective latency), at the
work each member measured in the run (executor.validate.measured_work_slowdown: what is left is the
simulator's share of the error; unlike validate, this does not check that a hetpipe schedule keeps
its order at those work figures), and without the collective latency (what the call model is worth).

    python experiments/validation/tp_models.py [--runs experiments/validation/results/tp_cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from executor.validate import measured_work_slowdown  # noqa: E402
from hetsim.compare import percent_error  # noqa: E402
from hetsim.report import Report  # noqa: E402


def throughput(inputs: Path, strip: tuple[str, ...] = (), slowdown: dict[str, float] | None = None) -> float:
    """samples/s predicted by the run's own command (inputs/command.txt), the named fields removed from
    its cluster and profile files first, with per-rank `slowdown` factors added."""
    command = shlex.split((inputs / "command.txt").read_text().splitlines()[-1])[1:]     # after "hetsim"
    if slowdown:                # they replace the run's emulated ones, which they include
        emulated = {i + 1 for i, arg in enumerate(command) if arg == "--slowdown"}
        command = [arg for i, arg in enumerate(command) if arg != "--slowdown" and i not in emulated]
        for gpu, factor in slowdown.items():
            command += ["--slowdown", f"{gpu}={factor!r}"]
    with tempfile.TemporaryDirectory() as tmp:
        for f in inputs.iterdir():
            text = f.read_text()
            for field in strip:
                text = re.sub(rf"\n\s*{field}: .*", "", text)
            Path(tmp, f.name).write_text(text)
        out = subprocess.run([sys.executable, "-m", "hetsim", *command, "--json"], cwd=tmp,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                             check=True).stdout
    return json.loads(out)["throughput"]["samples_per_s"]


def row(run: Path) -> str:
    measurement = Report.load(run / "measurement.json")
    training, meas = measurement.training, measurement.throughput["samples_per_s"]
    err = lambda x: f"{percent_error(x, meas):+.1f} %"
    # Seconds in the window's all-reduces over the minibatches the member's VW ran in that window.
    rate = {v.name: v.minibatches_per_s * measurement.window["duration_s"] for v in measurement.virtual_workers}
    vw = {g.id: g.vw for g in measurement.gpus}
    per_mb = ", ".join(f"{s / rate[vw[g]] * 1e3:.1f}" for g, s in training["tp_allreduce_s"].items())
    at_work = measured_work_slowdown(measurement, measurement.settings.get("slowdown"))
    inputs = run / "inputs"
    return (f"| {run.name} | {training['tp_allreduce_call_s'] * 1e3:.2f} ms | {err(throughput(inputs))} | "
            f"{err(throughput(inputs, slowdown=at_work)) if at_work else '-'} | "
            f"{err(throughput(inputs, ('collective_latency_us',)))} | {per_mb} | "
            f"{training['cpu_work_drift']['max_abs_error_pct']} % | {training['colocated_work']} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=str(ROOT / "experiments/validation/results/tp_cpu"))
    args = p.parse_args(argv)
    print("| run | one call, probe | error | at measured work | without the collective latency | "
          "TP all-reduce ms a minibatch in the run, per member | CPU work drift | co-located work |")
    print("|---|---|---|---|---|---|---|---|")
    for run in sorted(d for d in Path(args.runs).iterdir() if (d / "inputs").is_dir()):
        print(row(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
