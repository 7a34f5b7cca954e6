"""Tensor-parallel stages (modelzoo.tp, Megatron's split): a member's share computes what the unsplit
layers compute, and a plan with TP stages trains in the executor and reports every member."""

from __future__ import annotations

import copy
import math
import time
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import executor
import modelzoo
from conftest import profile as synthetic_profile
from exec_helpers import TINY_GPT, host
from hetsim.errors import PlanError
from hetsim.feasibility import check_plan
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from modelzoo.gpt import Block, GPTConfig
from modelzoo.tasks import loss as task_loss
from modelzoo.tp import TPBlock, TPComm, split_stage, stage_loss, unsplittable

T = 2
ATOL = 1e-5


def _spawn(fn, tmp_path, *args) -> list[dict]:
    """Run fn(rank, comm, *args) on T gloo processes; each returns a dict of floats."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(r, str(tmp_path / "store"), out, fn, args)) for r in range(T)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return [results[r] for r in range(T)]


def _member(rank, store, out, fn, args):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=T)
    try:
        out.put((rank, fn(rank, TPComm(rank, T, dist.group.WORLD), *args)))
    except BaseException as exc:                # the parent sees the failure, not a timeout
        out.put((rank, {"error": repr(exc)}))
    dist.destroy_process_group()


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def _block_vs_unsplit(rank: int, comm: TPComm) -> dict:
    c = GPTConfig(n_layer=1, d_model=32, n_head=4, seq_len=8, vocab_size=16)
    torch.manual_seed(0)
    block = Block(c)
    x = torch.randn(3, 8, 32)
    grad_out = torch.randn(3, 8, 32)
    whole, x_whole = copy.deepcopy(block), x.clone().requires_grad_(True)
    torch.manual_seed(1)                        # train mode: dropout draws the same masks in both
    y_whole = whole(x_whole)
    y_whole.backward(grad_out)
    split, x_split = TPBlock(copy.deepcopy(block), comm), x.clone().requires_grad_(True)
    torch.manual_seed(1)
    y_split = split(x_split)
    y_split.backward(grad_out)
    nh, hd, d = 4, 8, 32
    heads = slice(2 * rank, 2 * rank + 2)
    qkv_w = whole.qkv.weight.grad.view(3, nh, hd, d)[:, heads].reshape(-1, d)
    qkv_b = whole.qkv.bias.grad.view(3, nh, hd)[:, heads].reshape(-1)
    cols, units = slice(16 * rank, 16 * rank + 16), slice(64 * rank, 64 * rank + 64)
    return {"out": _err(y_split, y_whole), "input grad": _err(x_split.grad, x_whole.grad),
            "qkv weight grad": _err(split.qkv.weight.grad, qkv_w), "qkv bias grad": _err(split.qkv.bias.grad, qkv_b),
            "proj grad": _err(split.proj.weight.grad, whole.proj.weight.grad[:, cols]),
            "proj bias grad": _err(split.proj_bias.grad, whole.proj.bias.grad),
            "fc1 grad": _err(split.fc1.weight.grad, whole.mlp[0].weight.grad[units]),
            "fc2 grad": _err(split.fc2.weight.grad, whole.mlp[2].weight.grad[:, units]),
            "ln1 grad": _err(split.ln1.weight.grad, whole.ln1.weight.grad),
            "input grad digest": float(x_split.grad.double().sum())}


def test_a_tp2_block_computes_the_unsplit_blocks_output_and_gradients(tmp_path):
    members = _spawn(_block_vs_unsplit, tmp_path)
    for m in members:
        assert "error" not in m, m
        assert {k: v for k, v in m.items() if k != "input grad digest" and v > ATOL} == {}
    # Every member's input gradient is the whole one, so the lead's alone goes upstream.
    assert members[0]["input grad digest"] == members[1]["input grad digest"]


def _model_vs_unsplit(rank: int, comm: TPComm) -> dict:
    """The whole tiny GPT (vocab-parallel embedding and head, the vocab-parallel loss) split over T."""
    torch.manual_seed(0)
    model, _ = modelzoo.build("gpt2-small", batch=1, **{**TINY_GPT, "vocab_size": 63})   # not a multiple of T
    model.eval()                                # no dropout: the graphs differ in nothing but the split
    whole, split = modelzoo.layer_graph(copy.deepcopy(model)), modelzoo.layer_graph(copy.deepcopy(model))
    split_stage(split, 0, len(split), comm)
    ids = torch.randint(63, (2, 16), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(63, (2, 16), generator=torch.Generator().manual_seed(2))
    n = len(whole)
    loss_whole = task_loss(whole.run(0, n, {-1: ids})[n - 1], labels)
    loss_whole.backward()
    loss_split = stage_loss(split, n)(split.run(0, n, {-1: ids})[n - 1], labels)
    loss_split.backward()
    lo, hi = comm.share(63)
    return {"loss": abs(float(loss_split.detach()) - float(loss_whole.detach())),
            "token rows grad": _err(split.layers[0].tokens.weight.grad, whole.layers[0].tokens.weight.grad[lo:hi]),
            "positions grad": _err(split.layers[0].positions.weight.grad, whole.layers[0].positions.weight.grad),
            "head rows grad": _err(split.layers[n - 1].linear.weight.grad[:hi - lo], whole.layers[n - 1].weight.grad[lo:hi]),
            "head padding grad": float(split.layers[n - 1].linear.weight.grad[hi - lo:].abs().sum()),
            "final norm grad": _err(split.layers[n - 2].weight.grad, whole.layers[n - 2].weight.grad)}


def test_a_tp2_gpt_with_split_vocabulary_gives_the_unsplit_loss_and_gradients(tmp_path):
    for m in _spawn(_model_vs_unsplit, tmp_path):
        assert "error" not in m, m
        assert {k: v for k, v in m.items() if v > ATOL} == {}


def test_only_gpt_layers_and_the_last_linear_split():
    gpt_graph = modelzoo.layer_graph(modelzoo.build("gpt2-small", batch=1, **TINY_GPT)[0])
    assert unsplittable(gpt_graph, 0, len(gpt_graph), 2) is None
    assert "multiples of the tensor-parallel degree 4" in unsplittable(gpt_graph, 1, 2, 4)    # 2 heads
    mlp_graph = modelzoo.layer_graph(modelzoo.build("mlp", batch=1)[0])
    assert "does not split" in unsplittable(mlp_graph, 0, 3, 2)
    assert unsplittable(mlp_graph, len(mlp_graph) - 1, len(mlp_graph), 2) is None      # the classifier


# The executor ---------------------------------------------------------------------------------------

def tp_gpt_plan(groups: list[list[list[int]]], cuts: list[int], *, nm: int = 2, schedule: str = "1f1b-flush",
                sync: str = "none", batch: int = 4) -> Plan:
    """groups[v][s]: the host GPU indices of stage s of VW v (the first leads)."""
    return Plan(name="tp_test", model="gpt2-small", minibatch_size=batch, nm=nm, schedule=schedule,
                sync=SyncSpec(mode=sync), virtual_workers=tuple(
                    VirtualWorker(name=f"vw{v}", stages=tuple(
                        StageSpec(gpu=f"host/gpu{g[0]}", tp_gpus=tuple(f"host/gpu{i}" for i in g[1:]),
                                  layers=(cuts[s], cuts[s + 1])) for s, g in enumerate(stages)))
                    for v, stages in enumerate(groups)))


def _run(plan: Plan, waves: int = 4, **options):
    opts = executor.ExecOptions(waves=waves, warmup_waves=1, seed=3, **options)
    return executor.launch(plan, host(len(plan.gpus)), "gpt2-small", options=opts, model_kwargs=TINY_GPT)


def _losses(report) -> list[float]:
    return [loss for _vw, _mb, loss in report.training["losses"]]


def test_a_pipeline_with_a_tp2_stage_trains_as_the_unsplit_pipeline_and_reports_every_member():
    # Layers: embed, blocks_0, blocks_1, ln_f, head; stage 1 (blocks_1, ln_f, head) split over two ranks.
    plain = _run(tp_gpt_plan([[[0], [1]]], [0, 2, 5]), waves=5)
    split = _run(tp_gpt_plan([[[0], [1, 2]]], [0, 2, 5]), waves=5)
    assert len(_losses(split)) == 10 and all(math.isfinite(x) for x in _losses(split))
    # Same seed, same dropout masks: the split computes the same losses up to rounding.
    assert _losses(split) == pytest.approx(_losses(plain), rel=1e-4)
    assert _losses(split)[-1] < _losses(split)[0]
    gpus = {g.id: g for g in split.gpus}
    assert sorted(gpus) == ["host/gpu0", "host/gpu1", "host/gpu2"]
    assert (gpus["host/gpu0"].tp, gpus["host/gpu1"].tp, gpus["host/gpu2"].tp) == (1, 2, 2)
    assert gpus["host/gpu1"].stage == gpus["host/gpu2"].stage == 1 and gpus["host/gpu2"].compute_s > 0
    # Each member holds half of the split layers' weights (norms and biases whole).
    assert gpus["host/gpu2"].memory_breakdown["weights_bytes"] < 0.6 * plain.gpus[1].memory_breakdown["weights_bytes"]
    assert set(split.training["tp_allreduce_s"]) == {"host/gpu1", "host/gpu2"}


def test_two_replicas_of_a_tp2_stage_average_their_shards_under_bsp():
    report = _run(tp_gpt_plan([[[0, 1]], [[2, 3]]], [0, 5], nm=2, sync="bsp"), waves=3)
    assert len(_losses(report)) == 12 and all(math.isfinite(x) for x in _losses(report))
    assert sorted(g.id for g in report.gpus if g.tp == 2) == [f"host/gpu{i}" for i in range(4)]
    # Member k of each replica holds the same shard after every step's average.
    digests = report.training["final_weights"]
    by_gpu = {key.split(" on ")[1].rstrip(")"): d for key, d in digests.items()}
    assert by_gpu["host/gpu0"] == by_gpu["host/gpu2"] and by_gpu["host/gpu1"] == by_gpu["host/gpu3"]
    assert by_gpu["host/gpu0"] != by_gpu["host/gpu1"]


@pytest.mark.parametrize("sync,schedule", [("wsp", "1f1b"), ("sdpipe", "1f1b-flush")])
def test_tp_stages_with_wsp_or_sdpipe_are_refused_in_one_line(sync, schedule):
    plan = tp_gpt_plan([[[0, 1]], [[2, 3]]], [0, 5], sync=sync, schedule=schedule)
    with pytest.raises(PlanError, match=f"sync {sync}.*tensor-parallel") as err:
        executor.make_job(plan, host(4), "gpt2-small", model_kwargs=TINY_GPT)
    assert "\n" not in str(err.value)
    with pytest.raises(PlanError, match=f"sync {sync}.*tensor-parallel"):        # and in the simulator's checks
        check_plan(plan, host(4), synthetic_profile(5, 0.01, 0.02, types=("cpu",)))


def test_a_tp_stage_of_layers_it_cannot_split_is_refused():
    plan = Plan(name="mlp_tp", model="mlp", minibatch_size=8, nm=1, schedule="gpipe", sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="vw0", stages=(
                    StageSpec(gpu="host/gpu0", tp_gpus=("host/gpu1",), layers=(0, 9)),)),))
    with pytest.raises(PlanError, match=r"vw0 stage 0 .*layer 0 \(_0, Linear\) has weights tensor parallelism does not split"):
        executor.make_job(plan, host(2), "mlp")


def test_bsp_replicas_of_different_tp_degrees_are_refused():
    plan = tp_gpt_plan([[[0, 1]], [[2]]], [0, 5], sync="bsp")
    with pytest.raises(PlanError, match="same tensor-parallel degree"):
        executor.make_job(plan, host(3), "gpt2-small", model_kwargs=TINY_GPT)


# hetsim validate ------------------------------------------------------------------------------------

def test_onto_host_keeps_each_tensor_parallel_group():
    from executor.validate import onto_host
    plan = Plan(name="p", model="gpt2-small", minibatch_size=4, nm=1, schedule="gpipe", sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="vw0", stages=(
                    StageSpec(gpu="n0/gpu0", layers=(0, 2)),
                    StageSpec(gpu="n0/gpu2", tp_gpus=("n0/gpu3",), layers=(2, 5)))),))
    mapped, _ = onto_host(plan)
    assert [s.members for s in mapped.virtual_workers[0].stages] == [("host/gpu0",), ("host/gpu1", "host/gpu2")]


def test_a_measured_profile_gets_megatrons_allreduce_bytes_and_the_saved_bytes_per_layer():
    from executor.validate import with_counted_bytes
    from modelzoo.counting import counted_profile
    from modelzoo.profiler import measure_profile
    profile = with_counted_bytes(measure_profile("gpt2-small", 2, repeats=1, warmup=0, **TINY_GPT),
                                 "gpt2-small", TINY_GPT)
    counted = counted_profile("gpt2-small", 2, **TINY_GPT)[0]
    assert [l.saved_bytes for l in profile.layers] == [l.saved_bytes for l in counted.layers]
    # the loss's log-softmax (b, s, vocab) in fp32 is in the head's count
    assert profile.layers[-1].saved_bytes > 2 * TINY_GPT["seq_len"] * TINY_GPT["vocab_size"] * 4
    activation = 2 * TINY_GPT["seq_len"] * TINY_GPT["d_model"] * 4             # one fp32 (b, s, d)
    per_token = 3 * 2 * TINY_GPT["seq_len"] * 4      # the loss's row maxima, exponential sums, targets
    assert [l.tp_allreduce_bytes for l in profile.layers] == [activation, 2 * activation, 2 * activation, 0,
                                                              per_token]
    assert [l.tp_bwd_bytes for l in profile.layers] == [0, 2 * activation, 2 * activation, 0, activation]
    # modelzoo.tp's forward calls: the lookup's, each block's after its two row-parallel products, the loss's
    assert [l.tp_calls for l in profile.layers] == [1, 2, 2, 0, 2]


def test_the_counted_allreduce_calls_are_the_ones_modelzoo_tp_makes_in_each_pass():
    from modelzoo.counting import counted_profile
    model, ids = modelzoo.build("gpt2-small", batch=2, **TINY_GPT)
    graph = modelzoo.layer_graph(model)
    comm = TPComm(0, T)                          # no group: each all-reduce a copy, still recorded
    split_stage(graph, 0, len(graph), comm)
    # Layer by layer, each from a leaf as a pipeline stage gets it; the loss is the last layer's.
    leaves, outputs, fwd = [], [], []
    x = ids
    for layer in graph.layers:
        x = x.detach().requires_grad_(x.is_floating_point())
        leaves.append(x)
        outputs.append(x := layer(x))
        fwd.append(len(comm.drain()))
    loss = stage_loss(graph, len(graph))(outputs[-1], torch.zeros_like(ids))
    fwd[-1] += len(comm.drain())
    loss.backward()
    bwd = [len(comm.drain())]
    for i in reversed(range(len(graph) - 1)):
        outputs[i].backward(leaves[i + 1].grad)
        bwd.insert(0, len(comm.drain()))
    # The lookup's forward only; two each way a block; the head's loss two forward, its input's one back.
    assert (fwd, bwd) == ([1, 2, 2, 0, 2], [0, 2, 2, 0, 1])
    counted = counted_profile("gpt2-small", 2, **TINY_GPT)[0].layers
    assert [l.tp_calls for l in counted] == fwd and [l.tp_bwd_calls for l in counted] == bwd


def test_a_collective_latency_is_what_a_call_takes_beyond_its_rings_messages():
    from executor.calibrate import collective_latency
    # 2 ranks: 2 steps of 0.1 ms + 0.5 MB at 1 GB/s each: 1.2 ms of a 3 ms call.
    assert collective_latency(3e-3, 1_000_000, 2, 1e-4, 1e9) == pytest.approx(1.8e-3)
    assert collective_latency(1e-3, 1_000_000, 2, 1e-4, 1e9) == 0.0         # never negative


def test_the_collective_probe_times_the_executors_all_reduce_between_processes():
    from executor.calibrate import collective_call
    # Real processes: gloo over loopback, 384 KiB from busy work takes 1-5 ms on the CI-size host.
    assert 1e-5 < collective_call(393216, 2, calls=5, busy_s=0.002) < 0.1


def _wait_in_all_reduce(rank: int, comm: TPComm) -> dict:
    buf = torch.ones(1_000_000)
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)                         # member 0 waits for member 1 inside its call
    wall, cpu = time.perf_counter(), time.thread_time()
    comm.all_reduce(buf)
    return {"wall": time.perf_counter() - wall, "cpu": time.thread_time() - cpu}


def test_a_members_thread_cpu_seconds_leave_out_its_wait_in_a_gloo_all_reduce(tmp_path):
    # What lets validate compare a TP member's measured CPU work with the profile's share and predict
    # at it: a member waiting in a call for the other spends no CPU time on its own thread (gloo's
    # wait blocks; its reductions, here a few ms, run on gloo's threads).
    waited = _spawn(_wait_in_all_reduce, tmp_path)
    assert all("error" not in w for w in waited), waited
    assert waited[0]["wall"] > 0.5 and waited[0]["cpu"] < 0.05


def test_validate_compares_a_tp_plan_member_by_member():
    from executor.validate import validate_plan, work_rows
    from hetsim.compare import compare_reports
    plan = tp_gpt_plan([[[0], [1, 2]]], [0, 2, 5], nm=2)
    inputs: dict = {}
    prediction, measurement = validate_plan(plan, model_kwargs=TINY_GPT, waves=4, warmup_waves=1, cores=2,
                                            link_Bps=2e9, latency_s=5e-5, colocated_work=1.0, profile_repeats=2,
                                            inputs=inputs)
    assert [(g.id, g.tp) for g in prediction.gpus] == [(g.id, g.tp) for g in measurement.gpus] == \
        [("host/gpu0", 1), ("host/gpu1", 2), ("host/gpu2", 2)]
    # One all-reduce call measured now; what it took beyond its messages is the link's collective latency.
    call = measurement.training["tp_allreduce_call_s"]
    link = inputs["cluster"].nodes[0].intra_link
    # The probe's call moves the mean bytes of a minibatch's calls: ten of one activation (the lookup's,
    # four a block, the head's input gradient) and the loss's two of 12 bytes a token between them.
    tokens = plan.minibatch_size * TINY_GPT["seq_len"]
    per_call = (10 * tokens * TINY_GPT["d_model"] * 4 + 12 * tokens) // 12
    assert call > 0 and link.collective_latency_s == pytest.approx(max(0.0, call - 2 * (5e-5 + per_call / 2 / 2e9)))
    work = measurement.training["predicted_work_s_per_minibatch"]
    assert work["host/gpu1"] == work["host/gpu2"] > 0                 # the stage's work over 2
    metrics = [r.metric for r in compare_reports(prediction, measurement) + work_rows(measurement)]
    assert "host/gpu2 [vw0 s1] compute ms/minibatch" in metrics
    assert "host/gpu2 [vw0 s1 tp2] CPU work ms/minibatch" in metrics
    # Each member's measured work is compared, so the run is also predicted at it.
    assert measurement.training["predicted_samples_s_at_measured_work"] > 0
