"""`hetsim validate`: profile this machine, predict a plan with that profile, run it for real with
the executor, and print predicted vs measured throughput, per-stage times and staleness.

This module holds the command's arguments only; the work needs torch and lives with the executor
(executor.validate), found by name in hetsim.cli.torch_side's table, so torch loads only when this
command runs and hetsim imports no executor code.
"""

from __future__ import annotations

import argparse

from hetsim.cli.progress import add_quiet
from hetsim.cli.arguments import real, whole
from hetsim.cli.torch_side import torch_side

__all__ = ["add_arguments", "run", "WAVES", "WARMUP_WAVES"]

# A measured window after the ranks' memory has settled: with 2 warm-up waves of 14, the first touches of
# the heap's pages still cost up to 15% more CPU per minibatch than the profile's steady state.
WAVES, WARMUP_WAVES = 30, 12


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="plan JSON (or a shipped name); its GPUs map onto this host's ranks")
    p.add_argument("--model", default=None, help="modelzoo model (default: the plan's model)")
    p.add_argument("--model-arg", action="append", default=[], metavar="NAME=INT",
                   help="model constructor argument, e.g. hidden=1024 (repeatable)")
    p.add_argument("--waves", type=whole(1), default=WAVES,
                   help=f"waves per VW, simulated and executed (default {WAVES})")
    p.add_argument("--warmup-waves", type=whole(0), default=None,
                   help=f"waves left out of the window (default {WARMUP_WAVES}, capped at 2/5 of --waves: a fresh "
                        "rank spends its first waves faulting in memory its later waves reuse, which the profile "
                        "does not time)")
    p.add_argument("--slowdown", action="append", default=[], metavar="GPU=FACTOR",
                   help="EMULATED slowdown of a plan GPU, simulated and executed (busy-wait), repeatable")
    # Upper bounds: far beyond any host, and within what a cluster file may hold (hetsim.fields.LARGEST).
    p.add_argument("--cores", type=real(0, 65536, above=True), default=None,
                   help="cores the ranks share (default: measured, the host's cores minus other load); "
                        "with --device cuda, how many stage ranks a shared GPU runs at once (default: measured)")
    p.add_argument("--colocated-work", type=real(0, 1000, above=True), default=None, metavar="FACTOR",
                   help="CPU work of the stages run together over run alone (default: measured, "
                        "executor.colocation; 1.0 for one stage rank)")
    p.add_argument("--link-GBps", type=real(0, 1e6, above=True), default=None,
                   help="gloo loopback bandwidth (default: measured)")
    p.add_argument("--latency-us", type=real(0, 1e9), default=None,
                   help="gloo message latency, taken whole (default: measured, plus the scheduler's hand-off "
                        "delay where the plan's other ranks can fill the cores)")
    p.add_argument("--seed", type=whole(0), default=0)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the ranks compute")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write prediction/ and measurement/ reports here, and inputs/: the plan, cluster and "
                        "profile the prediction was made from, with command.txt that predicts it again")
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    """Run executor.validate.run, looked up in hetsim.cli.torch_side (torch loads here, not at import)."""
    return torch_side("validate")(args)
