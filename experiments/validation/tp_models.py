"""The tensor-parallel validation runs of results/tp_cpu/ predicted again from their saved inputs three
ways: as validated (each all-reduce call paying the link's collective latency), without that latency,
and by the simulator of an earlier commit (each pass's all-reduces as one ring of their bytes), against
the measured throughput. Needs a git checkout (the earlier simulator runs from a temporary worktree).

    python experiments/validation/tp_models.py [--runs experiments/validation/results/tp_cpu] [--earlier aaa2ba7]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def throughput(inputs: Path, code: Path, strip: tuple[str, ...] = ()) -> float:
    """samples/s predicted by the run's own command (inputs/command.txt) with the hetsim at `code`, the
    named fields removed from its cluster and profile files first."""
    command = shlex.split((inputs / "command.txt").read_text().splitlines()[-1])[1:]     # after "hetsim"
    with tempfile.TemporaryDirectory() as tmp:
        for f in inputs.iterdir():
            text = f.read_text()
            for field in strip:
                text = re.sub(rf"\n\s*{field}: .*", "", text)
            Path(tmp, f.name).write_text(text)
        out = subprocess.run([sys.executable, "-m", "hetsim", *command, "--json"], cwd=tmp,
                             env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True,
                             check=True).stdout
    return json.loads(out)["throughput"]["samples_per_s"]


def row(run: Path, earlier: Path) -> str:
    measured = json.loads((run / "measurement.json").read_text())
    training, meas = measured["training"], measured["throughput"]["samples_per_s"]
    err = lambda x: f"{100 * (x / meas - 1):+.1f} %"
    # Seconds in the window's all-reduces over the minibatches the member's VW ran in that window.
    rate = {v["name"]: v["minibatches_per_s"] * measured["window"]["duration_s"] for v in measured["virtual_workers"]}
    vw = {g["id"]: g["vw"] for g in measured["gpus"]}
    per_mb = ", ".join(f"{s / rate[vw[g]] * 1e3:.1f}" for g, s in training["tp_allreduce_s"].items())
    inputs = run / "inputs"
    return (f"| {run.name} | {training['tp_allreduce_call_s'] * 1e3:.2f} ms | {err(throughput(inputs, ROOT))} | "
            f"{err(throughput(inputs, ROOT, ('collective_latency_us',)))} | "
            f"{err(throughput(inputs, earlier, ('collective_latency_us', 'tp_allreduce_calls')))} | {per_mb} | "
            f"{training['cpu_work_drift']['max_abs_error_pct']} % | {training['colocated_work']} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=str(ROOT / "experiments/validation/results/tp_cpu"))
    p.add_argument("--earlier", default="aaa2ba7", help="commit whose simulator predicts the 'earlier' column")
    args = p.parse_args(argv)
    earlier = Path(tempfile.mkdtemp()) / "earlier"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(earlier), args.earlier],
                   check=True, capture_output=True)
    try:
        print("| run | one call, probe | error | without the collective latency | earlier model | "
              "TP all-reduce ms a minibatch in the run, per member | CPU work drift | co-located work |")
        print("|---|---|---|---|---|---|---|---|")
        for run in sorted(d for d in Path(args.runs).iterdir() if (d / "inputs").is_dir()):
            print(row(run, earlier))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(earlier)], capture_output=True)
        shutil.rmtree(earlier.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
