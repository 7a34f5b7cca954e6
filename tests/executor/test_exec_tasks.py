"""Each model trains on its own task (modelzoo.tasks): a decoder on next-token prediction over token
ids, a classifier on class labels; the executor, its calibrations and the profiler derive one shape."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

import executor
import modelzoo
from exec_helpers import TINY_GPT, gpt_plan, host
from executor.data import DATA_MODES, SyntheticData
from modelzoo.tasks import CLASSIFY, NEXT_TOKEN, Task, loss, task_of

GPT_TASK = Task(kind=NEXT_TOKEN, input_shape=(TINY_GPT["seq_len"],), n_classes=TINY_GPT["vocab_size"])
MLP_TASK = Task(kind=CLASSIFY, input_shape=(64,), n_classes=10)


def test_a_decoder_predicts_the_next_token_over_its_vocabulary():
    task = task_of(*modelzoo.build("gpt2-small", batch=1, **TINY_GPT))
    assert task == GPT_TASK and task.tokens_per_sample == TINY_GPT["seq_len"]


@pytest.mark.parametrize("name,kwargs,classes", [("mlp", {}, 10),
                                                  ("squeezenet1_0", {"image_size": 64, "num_classes": 7}, 7)])
def test_a_classifier_has_one_label_per_sample_over_its_output_width(name, kwargs, classes):
    model, example = modelzoo.build(name, batch=1, **kwargs)
    task = task_of(model, example)
    assert (task.kind, task.n_classes, task.tokens_per_sample) == (CLASSIFY, classes, None)
    assert task.input_shape == tuple(example.shape[1:]) and model.training       # its mode is left as it was


@pytest.mark.parametrize("mode", DATA_MODES)
def test_a_decoder_batch_is_token_ids_in_range_with_labels_shifted_by_one(mode):
    data = SyntheticData(task=GPT_TASK, mode=mode, seed=1, batch=4)
    x, y = data.inputs(0, 3), data.labels(0, 3)
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (4, TINY_GPT["seq_len"])
    assert 0 <= min(x.min(), y.min()) and max(x.max(), y.max()) < TINY_GPT["vocab_size"]
    assert torch.equal(y[:, :-1], x[:, 1:])                  # position t is labelled with token t + 1
    again = SyntheticData(task=GPT_TASK, mode=mode, seed=1, batch=4)
    assert torch.equal(again.inputs(0, 3), x) and torch.equal(again.labels(0, 3), y)
    assert not torch.equal(data.inputs(1, 3), x)


def test_the_teacher_stream_gives_every_token_one_successor_to_learn():
    data = SyntheticData(task=GPT_TASK, mode="teacher", seed=1, batch=8)
    successor: dict[int, int] = {}
    for mb in range(3):
        for a, b in zip(data.inputs(0, mb).flatten().tolist(), data.labels(0, mb).flatten().tolist()):
            assert successor.setdefault(a, b) == b


@pytest.mark.parametrize("task", [GPT_TASK, MLP_TASK], ids=["decoder", "classifier"])
def test_random_batches_have_the_executor_data_shapes(task):
    x, y = task.random_batch(4, torch.Generator().manual_seed(0))
    data = SyntheticData(task=task, mode="teacher", seed=0, batch=4)
    assert (x.shape, x.dtype) == (data.inputs(0, 0).shape, data.inputs(0, 0).dtype)
    assert (y.shape, y.dtype) == (data.labels(0, 0).shape, data.labels(0, 0).dtype)


def test_the_decoder_loss_is_the_mean_cross_entropy_over_every_position():
    scores, labels = torch.randn(2, 3, 5), torch.randint(5, (2, 3))
    per_position = [-torch.log_softmax(scores[b, t], 0)[labels[b, t]] for b in range(2) for t in range(3)]
    assert float(loss(scores, labels)) == pytest.approx(float(sum(per_position)) / 6, rel=1e-5)
    classes, one_each = torch.randn(4, 5), torch.randint(5, (4,))
    assert torch.equal(loss(classes, one_each), torch.nn.functional.cross_entropy(classes, one_each))


def test_a_decoder_profile_times_its_loss_in_the_last_layer_and_counts_tokens():
    from modelzoo.profiler import measure_profile
    profile = measure_profile("gpt2-small", 2, repeats=1, warmup=0, **TINY_GPT)
    assert profile.tokens_per_sample == TINY_GPT["seq_len"] and "next_token loss in the last layer" in profile.source
    assert profile.layers[-1].bwd_s["cpu"] > 0
    bare = measure_profile("gpt2-small", 2, repeats=1, warmup=0, loss=False, **TINY_GPT)
    assert "loss" not in bare.source and bare.tokens_per_sample == TINY_GPT["seq_len"]


def test_the_calibrations_run_a_decoders_stages():
    # Both failed on a GPT: the probe fed float noise to the embedding, the optimiser calibration
    # gave one label per sample for scores at every position.
    from executor.calibrate import optimizer_seconds
    from executor.colocation import _stage_step
    per_layer = optimizer_seconds("gpt2-small", schedule="1f1b", nm=2, wsp=False, repeats=2, model_kwargs=TINY_GPT)
    assert len(per_layer) == 5 and all(s > 0 for s in per_layer)          # every GPT layer has weights
    for lo, hi in [(0, 3), (3, 5)]:
        step = _stage_step("gpt2-small", lo, hi, 4, TINY_GPT)
        step()
        step()


def test_a_gpt_pipeline_trains_on_next_tokens_and_its_loss_falls():
    plan = gpt_plan([0, 3, 5], nm=2, schedule="1f1b")
    report = executor.launch(plan, host(2), model_kwargs=TINY_GPT,
                             options=executor.ExecOptions(waves=8, warmup_waves=1, seed=3, lr=0.2))
    losses = [l for _, _, l in sorted(report.training["losses"])]
    assert len(losses) == 16 and all(math.isfinite(l) for l in losses)
    assert losses[0] == pytest.approx(math.log(TINY_GPT["vocab_size"]), abs=0.5)   # chance at the start
    assert statistics.fmean(losses[-4:]) < statistics.fmean(losses[:4]) - 0.3
    rate = report.throughput
    assert rate["tokens_per_s"] == pytest.approx(rate["samples_per_s"] * TINY_GPT["seq_len"])


def test_validate_predicts_and_measures_a_gpt_plan():
    from executor.validate import validate_plan
    plan = gpt_plan([0, 3, 5], nm=2, schedule="1f1b-flush")
    prediction, measurement = validate_plan(plan, model_kwargs=TINY_GPT, waves=4, warmup_waves=1, cores=2,
                                            link_Bps=2e9, latency_s=5e-5, colocated_work=1.0, profile_repeats=2)
    for report in (prediction, measurement):          # both count a sequence's tokens
        rate = report.throughput
        assert rate["tokens_per_s"] == pytest.approx(rate["samples_per_s"] * TINY_GPT["seq_len"])
        assert rate["samples_per_s"] > 0
    assert "next_token loss in the last layer" in prediction.profile_source
