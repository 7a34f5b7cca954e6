"""Every pipeline schedule hetsim knows, by name: one entry holds what the plan check, the simulator,
the executor and the planner need, so adding a schedule is an order generator and one entry here.

An unknown name is refused (`schedule_kind`) with the list of known ones, never run as another schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hetsim.errors import PlanError
from hetsim.schedule import orders
from hetsim.schedule.ir import Action

__all__ = ["ScheduleKind", "REGISTRY", "SCHEDULES", "ASYNC_SCHEDULES", "FLUSH_SCHEDULES", "schedule_kind",
           "WEIGHT_GRAD_FRACTION"]

# Zero-bubble schedules split a backward into input and weight gradients. For a GEMM layer
# Y = X W the two are GEMMs of equal FLOPs (dX = dY W^T, dW = X^T dY), so without a measured split
# the weight gradient is taken as this fraction of the profiled backward (Qi et al. §2 use T_B = T_W).
WEIGHT_GRAD_FRACTION = 0.5

_ALL_SYNC = ("none", "wsp", "bsp", "sdpipe")


@dataclass(frozen=True, kw_only=True)
class ScheduleKind:
    name: str
    description: str
    orders: Callable[[orders.OrderRequest], list[list[Action]]]
    asynchronous: bool = False      # weight stashing, an update per minibatch, no flush between waves
    sync_modes: tuple[str, ...] = _ALL_SYNC
    # Upper bound of the minibatch-chunks stage s of k holds at once (what the IR's in_flight reaches),
    # given (k, s, nm, chunks): the planner's memory rule before any IR exists.
    in_flight: Callable[[int, int, int, int], int] = lambda k, s, nm, v: nm
    # Of those, an upper bound of the minibatches between a split backward's I and W at once (what the
    # IR's deferred_at_peak reaches): each holds its output gradients for W.
    deferred: Callable[[int, int, int, int], int] = lambda k, s, nm, v: 0
    needs_costs: bool = False       # the order is shaped by the stages' nominal costs (hetpipe)
    virtual_stages: bool = False    # a plan lists p x v stages, GPU of stage j = GPU of stage j mod p
    split_backward: bool = False    # backward runs as I (input gradient) then W (weight gradient)
    # The order lists its own sends and receives (where the runtime puts them), and each transfer is a
    # rendezvous: it starts once sender and receiver have both reached it, and holds both until done
    # (a plan's blocking_p2p makes each send hold its sender alone; the deadlock check stays strict).
    explicit_p2p: bool = False

    @property
    def one_gpu_stages(self) -> bool:
        """Its stages run on one GPU each: virtual stages and split backwards have no tensor-parallel form."""
        return self.virtual_stages or self.split_backward


def _one_f_one_b_rule(k: int, s: int, nm: int, v: int) -> int:
    return min(nm, k - s)


def _hetpipe_rule(k: int, s: int, nm: int, v: int) -> int:
    # The last stage's backward is ready the instant its forward ends and runs first (backward wins ties).
    return 1 if s == k - 1 else nm


def _interleaved_rule(k: int, s: int, nm: int, v: int) -> int:
    # Megatron: warm-up 2(p - s - 1) + (v - 1)p chunk forwards plus the one of the first 1F1B step.
    return min(nm * v, 2 * (k - s - 1) + (v - 1) * k + 1)


def _zero_bubble_rule(k: int, s: int, nm: int, v: int) -> int:
    # k - s forwards not yet backwarded plus up to s deferred weight gradients: k on every stage.
    return min(nm, k)


def _zero_bubble_deferred(k: int, s: int, nm: int, v: int) -> int:
    # Stage s defers up to s weight gradients, and holds one more between each I and the W after it.
    return min(nm, s + 1)


REGISTRY: dict[str, ScheduleKind] = {kind.name: kind for kind in (
    ScheduleKind(name="gpipe", description="GPipe: all forwards of a wave, then all backwards; flush",
                 orders=orders.gpipe),
    ScheduleKind(name="1f1b-flush", description="PipeDream-Flush: 1F1B within a wave; flush",
                 orders=orders.one_f_one_b_flush, in_flight=_one_f_one_b_rule),
    ScheduleKind(name="1f1b", description="PipeDream: asynchronous 1F1B with weight stashing",
                 orders=orders.one_f_one_b, asynchronous=True, in_flight=_one_f_one_b_rule),
    ScheduleKind(name="hetpipe", description="HetPipe: Nm in flight, cost-ordered, asynchronous updates",
                 orders=orders.hetpipe, asynchronous=True, in_flight=_hetpipe_rule, needs_costs=True),
    ScheduleKind(name="1f1b-interleaved",
                 description="Megatron interleaved 1F1B: v model chunks (virtual stages) per device; flush",
                 orders=orders.interleaved, sync_modes=("none", "bsp"), in_flight=_interleaved_rule,
                 virtual_stages=True),
    ScheduleKind(name="zb-h1",
                 description="ZB-H1 zero bubble: backward split into input and weight gradients; flush",
                 orders=orders.zero_bubble_h1, sync_modes=("none", "bsp"), in_flight=_zero_bubble_rule,
                 deferred=_zero_bubble_deferred, split_backward=True),
    ScheduleKind(name="1f1b-deepspeed",
                 description="DeepSpeed's pipeline engine: lockstep 1F1B steps, each transfer a blocking "
                             "rendezvous with the neighbour (blocking_p2p: a send holds its sender alone); "
                             "flush",
                 orders=orders.deepspeed, sync_modes=("none", "bsp"), in_flight=_one_f_one_b_rule,
                 explicit_p2p=True),
)}

SCHEDULES = tuple(REGISTRY)
ASYNC_SCHEDULES = tuple(name for name, kind in REGISTRY.items() if kind.asynchronous)
FLUSH_SCHEDULES = tuple(name for name, kind in REGISTRY.items() if not kind.asynchronous)


def schedule_kind(name: str) -> ScheduleKind:
    """The registry entry of `name`; PlanError naming the known schedules if there is none."""
    kind = REGISTRY.get(name)
    if kind is None:
        raise PlanError(f"schedule: unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    return kind
