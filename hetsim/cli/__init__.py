"""The `hetsim` command: subcommands live in modules of this package, loaded on demand.

    hetsim                      # simulate the built-in example
    hetsim simulate --cluster C --profile P --plan PLAN [--waves N] [--seed S] [--out DIR]
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from hetsim.cli.arguments import OneLineParser
from hetsim.errors import HetsimError

__all__ = ["main"]

# name -> one-line help; each module hetsim.cli.<name> has add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = {
    "simulate": "predict throughput, utilisation, memory and staleness of a plan",
    "profile": "measure a model's layers on this device and derive layer times for GPU types",
    "plan": "search allocations, partitions, Nm and D; rank whole plans and write the best",
    "validate": "profile this host, predict a plan, run it with the executor, compare (needs torch)",
    "sweep": "simulate a grid of what-ifs (--vary NAME=V1,V2,...) on Dask workers; write sweep.csv and a plot",
    "import": "turn plans others ran on real GPUs (Sailor) into cluster, profile and plan files",
}
# Subcommands whose module name differs from the command (a module cannot be called `import`).
_MODULES = {"import": "imports"}


def _module(name: str):
    return importlib.import_module(f"hetsim.cli.{_MODULES.get(name, name)}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="hetsim", description="Simulate, plan and validate pipeline + data parallel training on "
        "heterogeneous GPU clusters. With no subcommand, simulates the built-in example.")
    parser.add_argument("--version", action="version", version="hetsim 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        module = _module(name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; every refusal is one line on stderr and exit status 2, never a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1)
        print(f"hetsim: error: unknown command {argv[0]!r}{f'; did you mean {close[0]!r}?' if close else ''} "
              f"(commands: {', '.join(SUBCOMMANDS)}; with options only, hetsim simulates)", file=sys.stderr)
        return 2
    if not argv or argv[0] not in (*SUBCOMMANDS, "-h", "--help", "--version"):
        argv = ["simulate", *argv]           # `hetsim [options]` simulates
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:                # --help, --version, or a usage error (printed, one line)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return _module(args.command).run(args)
    except HetsimError as exc:
        print(f"hetsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:                  # `hetsim ... | head`: the reader has gone, stop quietly
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        print("hetsim: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):            # not a real file (e.g. captured by a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
