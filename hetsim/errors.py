"""The errors hetsim raises for bad input: each prints as one line that names where and what."""

__all__ = ["HetsimError", "SpecError", "PlanError", "ScheduleError", "SimulationError", "NoSteadyStateError"]


class HetsimError(Exception):
    """Base of every user-facing error; the CLI prints it as one line and exits non-zero."""


class SpecError(HetsimError, ValueError):
    """A malformed or inconsistent input file: the message names the file and the field path."""


class PlanError(HetsimError, ValueError):
    """A plan that is well-formed but cannot run on the cluster (unknown GPU, memory overflow, ...)."""


class ScheduleError(HetsimError, ValueError):
    """A schedule that would deadlock or is missing actions; `grid` shows the stage x step table."""

    def __init__(self, message: str, grid: str = ""):
        super().__init__(message)
        self.grid = grid


class SimulationError(HetsimError, RuntimeError):
    """The simulation could not produce a result (e.g. it deadlocked or measured an empty window)."""


class NoSteadyStateError(SimulationError):
    """The run ended before it had a steady state to time: too few waves for how far apart the
    virtual workers' paces are. Not a fault of the plan; more waves time it."""
