"""The validation suite's plans: functions returning data (a plan, its emulated slowdowns, its model).

Model: modelzoo's mlp with 8 hidden layers of 1024 (17 layers: Linear/ReLU pairs and the classifier),
minibatch 256 (about 90 ms of forward and backward per minibatch on one core of the 2-core CI host), on this host's CPU ranks (host/gpu0..), balanced cuts between Linear/ReLU pairs.
The extended cases (issue 16, item 10; not --quick) leave that mould: unequal cuts, three stages with
a slowed last stage, BSP with one slowed rank, WSP with other cuts in each virtual worker, and one
small plan of every other zoo family, each at a minibatch of 40-230 ms of CPU work (`zoo_cases`; the
GPT's ~620 ms), cut where the profile's work reaches half (a third, two thirds for three stages;
the decoders after their blocks, as experiments/validation/plans/tp2_gpt.json's GPT). Three more
train with Adam, AdamW and plain SGD (`optimizer_cases`) where the rest use SGD with momentum.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker

__all__ = ["Case", "cases", "schedule_cases", "zoo_cases", "MODEL", "MODEL_KWARGS", "BATCH", "CUDA_MODEL_KWARGS",
           "CUDA_BATCH"]

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
    model_kwargs: dict | None = None      # None: the suite's mlp (MODEL_KWARGS, or CUDA_MODEL_KWARGS)

    @property
    def name(self) -> str:
        return self.plan.name


def _plan_of(name: str, n_vw: int, n_stages: int, nm: int, schedule: str, sync: SyncSpec, batch: int,
             cuts: list | None = None, model: str = MODEL) -> Plan:
    """`cuts`: one list for every VW (default the balanced CUTS), or a list of lists, one per VW."""
    cuts = cuts or CUTS[n_stages]
    per_vw = cuts if isinstance(cuts[0], list) else [cuts] * n_vw
    gpus = itertools.count()
    vws = tuple(VirtualWorker(name=f"vw{v}", stages=tuple(
        StageSpec(gpu=f"host/gpu{next(gpus)}", layers=(c[s], c[s + 1])) for s in range(len(c) - 1)))
        for v, c in enumerate(per_vw[:n_vw]))
    return Plan(name=name, model=model, minibatch_size=batch, nm=nm, schedule=schedule, sync=sync,
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
        # SDPipe (plans/sdpipe_2vw_mlp1024.json and sdpipe_2vw_p1_mlp1024.json): a slowed pipeline that
        # the other groups without except every P = 4 waves, and P = 1, every wave a group of both.
        Case(plan=_plan("sdpipe_2vw_mlp1024", 2, 2, 2, "1f1b", SyncSpec(mode="sdpipe", sdpipe_period=4)),
             slowdown={"host/gpu2": 2.0, "host/gpu3": 2.0}),
        Case(plan=_plan("sdpipe_2vw_p1_mlp1024", 2, 2, 2, "1f1b", SyncSpec(mode="sdpipe", sdpipe_period=1))),
        *shape_cases(batch),
        *schedule_cases(batch),
        *zoo_cases(),
        *optimizer_cases(batch),
    ]


def shape_cases(batch: int = BATCH) -> list[Case]:
    """The mlp's plans unlike the balanced ones above: unequal cuts, a slowed last of three stages,
    BSP with one slowed rank, WSP with other cuts in each VW."""
    bsp, wsp = SyncSpec(mode="bsp"), SyncSpec(mode="wsp", staleness_bound=1)
    _plan = lambda name, n_vw, n_stages, nm, schedule, sync, cuts=None: _plan_of(
        name, n_vw, n_stages, nm, schedule, sync, batch, cuts)
    return [
        Case(plan=_plan("s2_nm2_1f1b_cut4", 1, 2, 2, "1f1b", SyncSpec(), [0, 4, 17])),
        Case(plan=_plan("s2_nm3_gpipe_cut12", 1, 2, 3, "gpipe", SyncSpec(), [0, 12, 17])),
        Case(plan=_plan("s3_nm3_1f1b_cut2-10_slowlast1.5", 1, 3, 3, "1f1b", SyncSpec(), [0, 2, 10, 17]),
             slowdown={"host/gpu2": 1.5}),
        Case(plan=_plan("s3_nm3_1f1b_slowlast2", 1, 3, 3, "1f1b", SyncSpec()), slowdown={"host/gpu2": 2.0}),
        Case(plan=_plan("vw2_s1_nm2_bsp_slow1.5", 2, 1, 2, "gpipe", bsp), slowdown={"host/gpu1": 1.5}),
        Case(plan=_plan("vw2_s2_nm2_bsp_slow2", 2, 2, 2, "1f1b-flush", bsp), slowdown={"host/gpu3": 2.0}),
        Case(plan=_plan("vw2_s2_nm2_wsp_d1_cuts4-12", 2, 2, 2, "1f1b", wsp, [[0, 4, 17], [0, 12, 17]])),
        Case(plan=_plan("vw2_s2_nm3_hetpipe_wsp_d2_cuts6-10", 2, 2, 3, "hetpipe",
                        SyncSpec(mode="wsp", staleness_bound=2), [[0, 6, 17], [0, 10, 17]])),
    ]


def schedule_cases(batch: int = BATCH) -> list[Case]:
    """The schedules added with the registry: ZB-H1 on two stages, interleaved 1F1B with two chunks on
    each of two ranks (four virtual stages; plans/s2_nm4_zb-h1.json and
    plans/s2v2_nm4_1f1b-interleaved.json), and DeepSpeed's rendezvous pipeline on three stages."""
    cuts = CUTS[4]
    interleaved = Plan(name="s2v2_nm4_1f1b-interleaved", model=MODEL, minibatch_size=batch, nm=4,
                       schedule="1f1b-interleaved", sync=SyncSpec(), virtual_workers=(VirtualWorker(
                           name="vw0", stages=tuple(StageSpec(gpu=f"host/gpu{j % 2}", layers=(cuts[j], cuts[j + 1]))
                                                    for j in range(4))),))
    return [
        Case(plan=_plan_of("s2_nm4_zb-h1", 1, 2, 4, "zb-h1", SyncSpec(), batch)),
        Case(plan=interleaved),
        Case(plan=_plan_of("s3_nm4_1f1b-deepspeed", 1, 3, 4, "1f1b-deepspeed", SyncSpec(), batch)),
    ]


def optimizer_cases(batch: int = BATCH) -> list[Case]:
    """The mlp's plans with other optimizers than SGD with momentum: Adam's update after every minibatch
    (several passes over every weight, each time), AdamW's step once a wave after BSP's all-reduce,
    and plain SGD under WSP (a change computed and pushed with no optimizer state)."""
    with_optimizer = lambda case, optimizer: Case(plan=replace(case.plan, name=f"{case.name}_{optimizer}",
                                                               optimizer=optimizer), slowdown=case.slowdown)
    return [
        with_optimizer(Case(plan=_plan_of("s2_nm2_1f1b", 1, 2, 2, "1f1b", SyncSpec(), batch)), "adam"),
        with_optimizer(Case(plan=_plan_of("vw2_s2_nm2_bsp", 2, 2, 2, "1f1b-flush", SyncSpec(mode="bsp"), batch)),
                       "adamw"),
        with_optimizer(Case(plan=_plan_of("vw2_s2_nm2_wsp_d1", 2, 2, 2, "1f1b",
                                          SyncSpec(mode="wsp", staleness_bound=1), batch)), "sgd"),
    ]


TINY_GPT = {"n_layer": 2, "seq_len": 32}            # as experiments/validation/plans/tp2_gpt.json
TINY_LLAMA = {"n_layer": 2, "seq_len": 32, "d_model": 256, "n_head": 4, "n_kv_head": 2, "d_ff": 512,
              "vocab_size": 8192}


def zoo_cases() -> list[Case]:
    """One small plan of each zoo family but the mlp (its own minibatch, CPU or GPU)."""
    one = lambda name, model, kwargs, batch, cuts, nm, schedule, sync=SyncSpec(), n_vw=1: Case(
        plan=_plan_of(name, n_vw, len(cuts) - 1, nm, schedule, sync, batch, cuts, model), model_kwargs=kwargs)
    return [
        one("gpt2_s2_nm2_1f1b-flush", "gpt2-small", TINY_GPT, 4, [0, 3, 5], 2, "1f1b-flush"),
        one("llama_s2_nm2_1f1b", "llama-3-8b", TINY_LLAMA, 16, [0, 3, 5], 2, "1f1b"),
        one("resnet18_s2_nm2_1f1b", "resnet18", {"image_size": 64, "num_classes": 100}, 8, [0, 38, 69], 2, "1f1b"),
        one("vgg11_s2_nm2_gpipe", "vgg11", {"image_size": 32, "num_classes": 10}, 8, [0, 17, 29], 2, "gpipe"),
        one("alexnet_s2_nm2_1f1b-flush", "alexnet", {"image_size": 64, "num_classes": 100}, 16, [0, 17, 22], 2,
            "1f1b-flush"),
        one("squeezenet_vw2_s1_nm2_wsp_d1", "squeezenet1_0", {"image_size": 64, "num_classes": 100}, 16, [0, 66],
            2, "1f1b", SyncSpec(mode="wsp", staleness_bound=1), n_vw=2),
        one("densenet121_s2_nm2_1f1b", "densenet121", {"image_size": 32, "num_classes": 10}, 8, [0, 235, 431], 2,
            "1f1b"),
        one("inception_s3_nm3_hetpipe", "inception_v3", {"image_size": 75, "num_classes": 10}, 4,
            [0, 91, 200, 314], 3, "hetpipe"),
    ]
