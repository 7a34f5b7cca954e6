"""A rank that dies or hangs stops the whole run within a bounded time, with errors naming it;
training resumes from the last per-wave checkpoint with the same losses."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

import executor
import hetsim
import modelzoo
from exec_helpers import host, mlp_plan
from executor.health import ExecutorError
from executor.launch import layout_of
from hetsim.errors import HetsimError, PlanError
from hetsim.plan import SyncSpec
from hetsim.profile import LayerProfile, ModelProfile

ROOT = Path(__file__).resolve().parents[2]

TIMEOUT_S = 4.0


def run(plan, **options):
    opts = executor.ExecOptions(warmup_waves=1, seed=5, timeout_s=TIMEOUT_S, **options)
    return executor.launch(plan, host(len(plan.gpus)), options=opts)


@pytest.mark.parametrize("kind,word", [("die", "died"), ("hang", "hung")])
def test_a_dead_or_hung_rank_is_named_by_every_other_rank(kind, word):
    plan = mlp_plan([[0, 3, 6, 9]], nm=2, schedule="1f1b")
    start = time.monotonic()
    with pytest.raises(ExecutorError) as info:
        run(plan, waves=4, fault=f"1:F3:{kind}")
    elapsed = time.monotonic() - start
    message = str(info.value)
    culprit = "rank 1 (vw0 stage 1 on host/gpu1)"
    assert f"{culprit} {word}" in message
    for other in (0, 2):                           # each survivor exited on its own, naming rank 1
        line = next(l for l in message.splitlines() if l.strip().startswith(f"rank {other} "))
        assert culprit in line and "killed" not in line
    assert elapsed < TIMEOUT_S + 15


@pytest.mark.parametrize("optimizer", [None, "adam"])
def test_resume_from_the_last_wave_checkpoint_gives_the_same_losses(tmp_path, optimizer):
    # Adam's state includes its step count (bias correction): a resume that lost it would differ.
    plan = replace(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush"), optimizer=optimizer)
    want = {mb: loss for _, mb, loss in run(plan, waves=5).training["losses"]}
    with pytest.raises(ExecutorError, match="rank 1"):
        run(plan, waves=5, checkpoint_dir=str(tmp_path), fault="1:F5:die")    # dies in wave 2
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "rank0_wave0.pt", "rank0_wave1.pt", "rank1_wave0.pt", "rank1_wave1.pt"]
    # Resuming skips waves 0 and 1: a fault at their F1 would never fire, and is refused up front.
    with pytest.raises(HetsimError, match=r"^fault '1:F1:die': rank 1 .* never runs F1 after resuming from wave 1 "):
        run(plan, waves=5, checkpoint_dir=str(tmp_path), resume=True, fault="1:F1:die")
    resumed = run(plan, waves=5, checkpoint_dir=str(tmp_path), resume=True)
    got = {mb: loss for _, mb, loss in resumed.training["losses"]}
    assert sorted(got) == [4, 5, 6, 7, 8, 9]                                   # waves 2, 3, 4
    assert got == pytest.approx({mb: want[mb] for mb in got}, abs=1e-6)


def test_checkpoints_refuse_asynchronous_schedules(tmp_path):
    plan = mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b")
    with pytest.raises(HetsimError, match="flush schedule"):
        run(plan, waves=3, checkpoint_dir=str(tmp_path))


# ---- one plan validation, shared with the simulator ------------------------------------------------

def nominal_profile(n_layers: int = 9) -> ModelProfile:
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=1000, output_bytes=1000,
                                fwd_s={"cpu": 1e-3}, bwd_s={"cpu": 2e-3}) for i in range(n_layers))
    return ModelProfile(model="mlp", batch_size=16, layers=layers, input_bytes=1000,
                        edges=tuple((i, i + 1) for i in range(n_layers - 1)), source="nominal")


def test_the_executor_refuses_a_plan_that_stops_short_of_the_last_layer():
    # The mlp has 9 layers; this plan once trained layers 0-7 only, without a word.
    with pytest.raises(PlanError, match=r"^plan: virtual_workers\[0\]\.stages: vw0 covers layers \[0, 8\) "
                                        r"but model mlp has 9 layers"):
        executor.make_job(mlp_plan([[0, 4, 8]], nm=2, schedule="1f1b"), host(2))


def test_the_executor_refuses_a_gpu_used_twice():
    plan = mlp_plan([[0, 4, 9], [0, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="wsp"))
    vw1 = replace(plan.virtual_workers[1], stages=(replace(plan.virtual_workers[1].stages[0], gpu="host/gpu0"),))
    with pytest.raises(PlanError, match=r"virtual_workers\[1\]\.stages\[0\]\.gpu: .*host/gpu0 is already used"):
        executor.make_job(replace(plan, virtual_workers=(plan.virtual_workers[0], vw1)), host(3))


def test_wsp_without_parameter_servers_is_refused_by_simulator_and_executor_alike():
    plan = mlp_plan([[0, 9], [0, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="wsp"))
    bare = replace(host(2), ps_nodes=())
    with pytest.raises(PlanError, match=r"^plan: sync.mode: wsp .* lists none") as sim:
        hetsim.simulate(bare, nominal_profile(), plan, waves=3, warmup_waves=1)
    with pytest.raises(PlanError) as ex:
        executor.make_job(plan, bare)
    assert str(ex.value) == str(sim.value)


def test_wsp_with_virtual_workers_of_different_depths_runs_as_simulated():
    # VW0 one stage, VW1 two: each stage looked up the same stage index in every VW (a BSP need).
    plan = mlp_plan([[0, 9], [0, 4, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="wsp", staleness_bound=1))
    report = run(plan, waves=6)
    assert report.staleness["global"]["count"] == 6 * 3                  # one push per wave per stage
    assert len(report.training["losses"]) == 2 * 12
    predicted = hetsim.simulate(host(3), nominal_profile(), plan, waves=6, warmup_waves=1)
    assert report.staleness["global"]["max"] <= predicted.staleness["global_bound"]


def test_a_resnet_at_32_px_derives_its_shapes_in_every_torch_path():
    # A batch norm cannot train on one sample's 1x1 map: shapes come from eval mode or a batch >= 2.
    from executor.calibrate import optimizer_seconds
    from executor.colocation import _stage_step
    kwargs = {"image_size": 32, "num_classes": 4}
    assert len(optimizer_seconds("resnet18", schedule="1f1b", nm=2, wsp=False, repeats=1, model_kwargs=kwargs)) > 0
    _stage_step("resnet18", 0, 3, 2, kwargs)()
    net, _ = modelzoo.build("resnet18", device="meta", **kwargs)
    n = len(modelzoo.layer_graph(net))
    plan = replace(mlp_plan([[0, n // 2, n]], nm=2, schedule="1f1b", batch=2), model="resnet18")
    report = executor.launch(plan, host(2), options=executor.ExecOptions(waves=3, warmup_waves=1, data="random"),
                             model_kwargs=kwargs)
    assert len(report.training["losses"]) == 6


def test_one_gpu_and_one_wave_runs():
    report = executor.launch(mlp_plan([[0, 9]], nm=1, schedule="1f1b"), host(1),
                             options=executor.ExecOptions(waves=1, warmup_waves=0, timeout_s=TIMEOUT_S))
    assert len(report.training["losses"]) == 1 and report.throughput["minibatches_per_s"] > 0


# ---- faults of any role ----------------------------------------------------------------------------

def heartbeats(folder: Path) -> dict[int, tuple[str, int]]:
    """rank -> (last reported action, pid), read from the launcher's rendezvous file under `folder`."""
    out = {}
    for store in folder.glob("hetsim-exec-*/store"):
        data = store.read_bytes()
        # A key's value follows its 4-byte length, which may read as a digit: ranks here are < 10.
        for m in re.finditer(rb"hb/(\d)(....)", data, re.DOTALL):
            value = data[m.end():m.end() + int.from_bytes(m.group(2), "little")].decode(errors="replace")
            parts = value.split("|")
            if len(parts) == 5 and parts[4].isdigit():
                out[int(m.group(1))] = (parts[1], int(parts[4]))
    return out


WSP2 = mlp_plan([[0, 9], [0, 9]], nm=2, schedule="1f1b", sync=SyncSpec(mode="wsp", staleness_bound=1))
SDPIPE2 = mlp_plan([[0, 9], [0, 9]], nm=2, schedule="1f1b-flush", sync=SyncSpec(mode="sdpipe", sdpipe_period=2))


@pytest.mark.parametrize("plan,rank,signum,culprit,word", [
    (mlp_plan([[0, 3, 6, 9]], nm=2, schedule="1f1b"), 1, signal.SIGSTOP, "rank 1 (vw0 stage 1 on host/gpu1)",
     "is stopped"),
    # Once reported as "rank 2 (parameter server 0) hung (at action start ...)": the stage waiting on the
    # server named it, and the server was waiting on the stopped stage.
    (WSP2, 1, signal.SIGSTOP, "rank 1 (vw1 stage 0 on host/gpu1)", "is stopped"),
    (WSP2, 2, signal.SIGSTOP, "rank 2 (parameter server 0)", "is stopped"),
    (WSP2, 2, signal.SIGKILL, "rank 2 (parameter server 0)", "died"),
    (SDPIPE2, 2, signal.SIGSTOP, "rank 2 (sdpipe group scheduler)", "is stopped"),
    (SDPIPE2, 2, signal.SIGKILL, "rank 2 (sdpipe group scheduler)", "died"),
], ids=["stage-stopped", "wsp-stage-stopped", "ps-stopped", "ps-killed", "scheduler-stopped", "scheduler-killed"])
def test_a_stopped_or_killed_rank_of_any_role_is_named_within_the_timeout(plan, rank, signum, culprit, word,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))       # where the launcher's rendezvous lives
    failure = {}

    def launch():
        try:
            run(plan, waves=20000)
        except ExecutorError as exc:
            failure["message"] = str(exc)

    thread = threading.Thread(target=launch, daemon=True)
    thread.start()
    n_ranks = layout_of(executor.make_job(plan, host(len(plan.gpus)))).world_size
    deadline = time.monotonic() + 60
    beats = {}
    while time.monotonic() < deadline:               # every stage rank is past its start
        beats = heartbeats(tmp_path)
        if len(beats) == n_ranks and all(beats[r][0] != "start" for r in range(len(plan.gpus))):
            break
        time.sleep(0.2)
    assert len(beats) == n_ranks, f"the ranks never all started: {beats}"
    os.kill(beats[rank][1], signum)
    start = time.monotonic()
    thread.join(2 * TIMEOUT_S + 30)
    assert not thread.is_alive(), "the launch did not return"
    assert time.monotonic() - start < 2 * TIMEOUT_S + 15
    message = failure["message"]
    assert f"{culprit} {word}" in message, message
    assert "hung (at action start" not in message


def descendants(proc: psutil.Process) -> set[psutil.Process]:
    try:
        return set(proc.children(recursive=True))
    except psutil.NoSuchProcess:
        return set()


LAUNCHER = """
import sys
sys.path[:0] = {paths!r}
import executor
from exec_helpers import host, mlp_plan
plan = mlp_plan([[0, 3, 6, 9]], nm=2, schedule="1f1b")
executor.launch(plan, host(3), options=executor.ExecOptions(waves=20000, warmup_waves=1))
"""


@pytest.mark.parametrize("how", ["launcher-sigkill", "validate-sigterm"])
def test_killing_the_launcher_or_validate_leaves_no_process_behind(how, tmp_path):
    if how == "launcher-sigkill":
        script = LAUNCHER.format(paths=[str(ROOT), str(Path(__file__).parent)])
        argv, signum, wanted = [sys.executable, "-c", script], signal.SIGKILL, 3
    else:
        plan = mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b")
        (tmp_path / "plan.json").write_text(plan.to_json())
        argv = [sys.executable, "-m", "hetsim", "validate", "--plan", str(tmp_path / "plan.json"), "--waves", "40"]
        signum, wanted = signal.SIGTERM, 2          # probes, a ping-pong pair or the ranks, whichever runs
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent, seen = psutil.Process(proc.pid), set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(seen) < wanted + 1:
            seen |= descendants(parent)
            time.sleep(0.1)
        assert len(seen) >= wanted, "the launcher started no children"
        time.sleep(2.0)
        seen |= descendants(parent)
        os.kill(proc.pid, signum)
        proc.wait(30)
        # A child still importing torch when its parent dies exits as soon as it gets to run
        # (executor.children.die_with_parent); on a loaded host that import alone can take many seconds.
        gone, alive = psutil.wait_procs(list(seen), timeout=60)
        assert not alive, f"left behind: {[p.cmdline()[:3] for p in alive]}"
    finally:
        proc.kill()
        for p in seen:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


# ---- checkpoints know what wrote them ---------------------------------------------------------------

def test_resume_refuses_checkpoints_of_another_partition(tmp_path):
    # Once accepted: the loss went from 0.65 to 4.74, weights loaded into the wrong layers.
    run(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush"), waves=3, checkpoint_dir=str(tmp_path))
    assert (tmp_path / "fingerprint.json").exists()
    other = mlp_plan([[0, 5, 9]], nm=2, schedule="1f1b-flush")
    with pytest.raises(HetsimError, match=r"^resume: the checkpoints in .* were written by plan 'test' \(model mlp, "
                                          r"stages vw0 \[0, 4\) \[4, 9\)\), not by this run's .*\[0, 5\) \[5, 9\)"):
        run(other, waves=5, checkpoint_dir=str(tmp_path), resume=True)
    with pytest.raises(HetsimError, match=r"model mlp\(hidden=48\)"):
        executor.launch(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush"), host(2), model_kwargs={"hidden": 48},
                        options=executor.ExecOptions(waves=5, warmup_waves=1, checkpoint_dir=str(tmp_path),
                                                     resume=True, timeout_s=TIMEOUT_S))


def test_a_fresh_run_refuses_a_directory_holding_an_earlier_runs_checkpoints(tmp_path):
    plan = mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush")
    run(plan, waves=5, checkpoint_dir=str(tmp_path))
    before = sorted(p.name for p in tmp_path.glob("*.pt"))
    with pytest.raises(HetsimError, match=r"^checkpoint_dir: .* already holds checkpoints of plan 'test'"):
        run(plan, waves=3, checkpoint_dir=str(tmp_path))   # a stale wave 4 would be resumed from
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == before            # nothing written is lost


def test_a_resume_with_nothing_left_to_run_is_refused_once_before_any_rank_starts(tmp_path):
    plan = mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush")
    run(plan, waves=3, checkpoint_dir=str(tmp_path))
    with pytest.raises(HetsimError) as info:
        run(plan, waves=3, checkpoint_dir=str(tmp_path), resume=True)
    assert str(info.value).startswith("resume: checkpoints reach wave 2") and "\n" not in str(info.value)


def test_a_checkpoint_folder_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "ck").write_text("")
    with pytest.raises(HetsimError, match=r"^checkpoint_dir: .*ck is a file, not a folder$"):
        run(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-flush"), waves=3, checkpoint_dir=str(tmp_path / "ck"))


def test_a_fault_for_a_rank_the_run_does_not_have_is_refused_before_any_rank_starts():
    with pytest.raises(HetsimError, match=r"^fault '9:F1:die': this run has ranks 0\.\.1$"):
        run(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b"), waves=3, fault="9:F1:die")


def test_a_script_that_launches_without_the_main_guard_is_told_so(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b").to_json())
    script = tmp_path / "unguarded.py"
    script.write_text(f"import executor\nexecutor.launch({str(plan)!r}, 'cpu_host', "
                      "options=executor.ExecOptions(waves=2, timeout_s=20))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and 'if __name__ == "__main__":' in done.stderr


# ---- the error survives torchrun -------------------------------------------------------------------

def test_a_ranks_error_reaches_torchruns_failure_summary(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(mlp_plan([[0, 4, 9]], nm=2, schedule="hetpipe").to_json())      # hetpipe needs --profile
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "executor",
                "--plan", str(plan), "--cluster", "cpu_host", "--waves", "3", "--timeout", str(TIMEOUT_S)]
    done = subprocess.run(torchrun, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    summary = done.stderr[done.stderr.index("Root Cause"):]
    assert "pass --profile" in summary, summary        # once: "error_file: <N/A>" and no message
    own = [l for l in done.stderr.splitlines() if l.startswith("executor: error:")]
    assert own and all("pass --profile" in l for l in own)


def test_a_fault_at_an_action_its_rank_never_runs_is_refused_before_any_rank_starts():
    # 3 waves of Nm 2: rank 1 runs F0 .. F5 and never reaches F999.
    with pytest.raises(HetsimError, match=r"^fault '1:F999:die': rank 1 \(vw0 stage 1 on host/gpu1\) never runs "
                                          r"F999 \(its actions run \S+ \.\. \S+\)$"):
        run(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b"), waves=3, fault="1:F999:die")


def test_a_fault_for_a_rank_without_schedule_actions_is_refused():
    # Rank 2 of a 2-VW WSP plan is its parameter server, which runs no F/B actions to fail at.
    with pytest.raises(HetsimError, match=r"^fault '2:F1:die': rank 2 \(parameter server 0\) runs no schedule "
                                          r"actions; name a stage rank$"):
        run(WSP2, waves=3, fault="2:F1:die")
