"""The validation suite's plans: functions returning data (a plan, its emulated slowdowns).

Model: modelzoo's mlp with 8 hidden layers of 1024 (17 layers: Linear/ReLU pairs and the classifier),
minibatch 256 (about 90 ms of forward and backward per minibatch on one core of the 2-core CI host), on this host's CPU ranks (host/gpu0..), balanced cuts between Linear/ReLU pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker

__all__ = ["Case", "cases", "MODEL", "MODEL_KWARGS", "BATCH", "CUDA_MODEL_KWARGS", "CUDA_BATCH"]

MODEL, MODEL_KWARGS, BATCH = "mlp", {"hidden": 1024, "depth": 8}, 256
# On a GPU the same layers would be launch-bound: 2048 wide and minibatch 4096 make each hidden Linear
# about 34 GFLOP forward (under a millisecond in fp32 on an H100) with 134 MB of weights in all, so a
# WSP push of the whole model stays within a few minibatches' compute, as on the CPU host.
CUDA_MODEL_KWARGS, CUDA_BATCH = {"hidden": 2048, "depth": 8}, 4096
CUTS = {1: [0, 17], 2: [0, 8, 17], 3: [0, 6, 12, 17], 4: [0, 4, 8, 12, 17]}


@dataclass(frozen=True, kw_only=True)
class Case:
    plan: Plan
    slowdown: dict[str, float] = field(default_factory=dict)
    quick: bool = False                   # part of the --quick subset

    @property
    def name(self) -> str:
        return self.plan.name


def _plan_of(name: str, n_vw: int, n_stages: int, nm: int, schedule: str, sync: SyncSpec, batch: int) -> Plan:
    cuts = CUTS[n_stages]
    vws = tuple(VirtualWorker(name=f"vw{v}", stages=tuple(
        StageSpec(gpu=f"host/gpu{v * n_stages + s}", layers=(cuts[s], cuts[s + 1])) for s in range(n_stages)))
        for v in range(n_vw))
    return Plan(name=name, model=MODEL, minibatch_size=batch, nm=nm, schedule=schedule, sync=sync,
                virtual_workers=vws)


def cases(batch: int = BATCH) -> list[Case]:
    none, bsp = SyncSpec(), SyncSpec(mode="bsp")
    wsp = lambda d, **kw: SyncSpec(mode="wsp", staleness_bound=d, **kw)
    _plan = lambda *args: _plan_of(*args, batch)
    return [
        Case(plan=_plan("s1_nm1_gpipe", 1, 1, 1, "gpipe", none), quick=True),
        Case(plan=_plan("s2_nm2_1f1b", 1, 2, 2, "1f1b", none), quick=True),
        Case(plan=_plan("s2_nm4_gpipe", 1, 2, 4, "gpipe", none)),
        Case(plan=_plan("s3_nm3_1f1b-flush", 1, 3, 3, "1f1b-flush", none)),
        Case(plan=_plan("s4_nm4_1f1b", 1, 4, 4, "1f1b", none), quick=True),
        Case(plan=_plan("s2_nm2_1f1b_slow2", 1, 2, 2, "1f1b", none), slowdown={"host/gpu1": 2.0}),
        Case(plan=_plan("s3_nm3_hetpipe_slow1.5", 1, 3, 3, "hetpipe", none), slowdown={"host/gpu1": 1.5}),
        Case(plan=_plan("vw2_s1_nm1_bsp", 2, 1, 1, "gpipe", bsp)),
        Case(plan=_plan("vw2_s2_nm2_bsp", 2, 2, 2, "1f1b-flush", bsp), quick=True),
        Case(plan=_plan("vw3_s1_nm2_bsp", 3, 1, 2, "1f1b-flush", bsp)),
        Case(plan=_plan("vw2_s2_nm2_wsp_d0", 2, 2, 2, "1f1b", wsp(0))),
        Case(plan=_plan("vw2_s2_nm3_hetpipe_wsp_d2_slow2", 2, 2, 3, "hetpipe", wsp(2)),
             slowdown={"host/gpu2": 2.0, "host/gpu3": 2.0}, quick=True),
        Case(plan=_plan("vw3_s1_nm1_wsp_d4_slow1.5", 3, 1, 1, "gpipe", wsp(4)), slowdown={"host/gpu2": 1.5}),
        Case(plan=_plan("vw2_s2_nm4_wsp_d1_local", 2, 2, 4, "1f1b", wsp(1, ps_placement="local"))),
    ]
