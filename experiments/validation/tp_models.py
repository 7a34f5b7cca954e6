"""The tensor-parallel validation runs of results/tp_cpu/ predicted again from their saved inputs four
ways: as validated (each all-reduce call paying the link's collective latency), with the profile's
counts recounted by this checkout's modelzoo (each pass's own all-reduces: the lookup's forward only,
the head's backward, the loss's), without the collective latency, and by the simulator of an earlier
commit (each pass's all-reduces as one ring of their bytes), against the measured throughput. Needs a
git checkout (the earlier simulator runs from a temporary worktree).

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


def throughput(inputs: Path, code: Path, strip: tuple[str, ...] = (), recount: dict | None = None) -> float:
    """samples/s predicted by the run's own command (inputs/command.txt) with the hetsim at `code`, the
    named fields removed from its cluster and profile files first; with `recount` (the zoo model's
    arguments) the profile's saved and all-reduce counts counted again by this checkout's modelzoo."""
    command = shlex.split((inputs / "command.txt").read_text().splitlines()[-1])[1:]     # after "hetsim"
    with tempfile.TemporaryDirectory() as tmp:
        for f in inputs.iterdir():
            text = f.read_text()
            for field in strip:
                text = re.sub(rf"\n\s*{field}: .*", "", text)
            Path(tmp, f.name).write_text(text)
        if recount is not None:
            _recount(Path(tmp, "profile.yaml"), recount)
        out = subprocess.run([sys.executable, "-m", "hetsim", *command, "--json"], cwd=tmp,
                             env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True,
                             check=True).stdout
    return json.loads(out)["throughput"]["samples_per_s"]


def _recount(path: Path, model_kwargs: dict) -> None:
    from hetsim.profile_files import load_profile, save_profile
    from modelzoo.counting import counted_profile, with_counts
    profile = load_profile(path)
    save_profile(with_counts(profile, counted_profile(profile.model, profile.batch_size, **model_kwargs)[0]), path)


def row(run: Path, earlier: Path, model_kwargs: dict) -> str:
    measured = json.loads((run / "measurement.json").read_text())
    training, meas = measured["training"], measured["throughput"]["samples_per_s"]
    err = lambda x: f"{100 * (x / meas - 1):+.1f} %"
    # Seconds in the window's all-reduces over the minibatches the member's VW ran in that window.
    rate = {v["name"]: v["minibatches_per_s"] * measured["window"]["duration_s"] for v in measured["virtual_workers"]}
    vw = {g["id"]: g["vw"] for g in measured["gpus"]}
    per_mb = ", ".join(f"{s / rate[vw[g]] * 1e3:.1f}" for g, s in training["tp_allreduce_s"].items())
    inputs = run / "inputs"
    return (f"| {run.name} | {training['tp_allreduce_call_s'] * 1e3:.2f} ms | {err(throughput(inputs, ROOT))} | "
            f"{err(throughput(inputs, ROOT, recount=model_kwargs))} | "
            f"{err(throughput(inputs, ROOT, ('collective_latency_us',)))} | "
            f"{err(throughput(inputs, earlier, ('collective_latency_us', 'tp_allreduce_calls')))} | {per_mb} | "
            f"{training['cpu_work_drift']['max_abs_error_pct']} % | {training['colocated_work']} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=str(ROOT / "experiments/validation/results/tp_cpu"))
    p.add_argument("--earlier", default="aaa2ba7", help="commit whose simulator predicts the 'earlier' column")
    p.add_argument("--model-arg", action="append", metavar="NAME=VALUE",
                   help="the runs' zoo model arguments, for the recounted column (default: the README's "
                        "n_layer=2 seq_len=32)")
    args = p.parse_args(argv)
    model_kwargs = {k: int(v) for k, v in (a.split("=", 1) for a in args.model_arg or ["n_layer=2", "seq_len=32"])}
    earlier = Path(tempfile.mkdtemp()) / "earlier"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(earlier), args.earlier],
                   check=True, capture_output=True)
    try:
        print("| run | one call, probe | error | recounted: each pass's own calls | without the collective latency | "
              "earlier model | TP all-reduce ms a minibatch in the run, per member | CPU work drift | co-located work |")
        print("|---|---|---|---|---|---|---|---|---|")
        for run in sorted(d for d in Path(args.runs).iterdir() if (d / "inputs").is_dir()):
            print(row(run, earlier, model_kwargs))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(earlier)], capture_output=True)
        shutil.rmtree(earlier.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
