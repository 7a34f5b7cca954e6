"""The schedule IR: per device, the ordered actions that the simulator and the executor both replay;
the registry names every schedule and what its consumers need to know about it."""

from hetsim.schedule.generate import build_schedule, warmup_forwards
from hetsim.schedule.ir import Action, Schedule
from hetsim.schedule.registry import REGISTRY, ScheduleKind, schedule_kind
from hetsim.schedule.validate import format_grid, validate_schedule

__all__ = ["Action", "Schedule", "build_schedule", "warmup_forwards", "validate_schedule", "format_grid",
           "REGISTRY", "ScheduleKind", "schedule_kind"]
