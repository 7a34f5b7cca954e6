"""The schedule IR: per stage, the ordered actions that the simulator and the executor both replay."""

from hetsim.schedule.generate import build_schedule, warmup_forwards
from hetsim.schedule.ir import Action, Schedule
from hetsim.schedule.validate import format_grid, validate_schedule

__all__ = ["Action", "Schedule", "build_schedule", "warmup_forwards", "validate_schedule", "format_grid"]
