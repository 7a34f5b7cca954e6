"""Statistical efficiency: how many samples training needs to reach a target loss, so that plans can be
ranked by time to accuracy rather than by throughput alone.

Staleness buys throughput and costs convergence (HetPipe sec. 5, PipeDream sec. 3.3, SDPipe sec. 2):
a what-if answer needs both sides. The model is the empirical one of McCandlish et al. 2018 ("An
Empirical Model of Large-Batch Training", eq. 2.11) for the batch, times linear penalties for
staleness and for virtual workers that update shared weights asynchronously:

    samples(G, s, V) = samples_min * (1 + G / noise_batch) * (1 + staleness_cost * s) * (1 + async_cost * (V - 1))

G is the update batch: the samples averaged into one weight update (a minibatch under per-minibatch
updates, Nm of them after a flush, Nm x VWs after a BSP all-reduce). Below the gradient noise scale
(`noise_batch`) the samples needed hardly depend on G; far above it, the updates do. s is the
effective staleness: how many updates a gradient's weights lack when it is applied, from the report's
per-update staleness: the pipeline's own (local, in minibatches) plus, under WSP, the other virtual
workers' updates missing from the pulled weights (global staleness in waves x updates per wave x other
VWs). V counts the VWs of a WSP or SDPipe plan (1 otherwise): each keeps its own momentum while their
updates add up in the shared weights, and asynchrony itself acts as extra momentum (Mitliagkas et al.
2016, "Asynchrony begets momentum"), which costs steps beyond staleness. VWs of unequal pace count in
units of the fastest: V = sum of their paces / the fastest pace (a VW half as fast interleaves half as
many updates with the others'), each pace the inverse of its busiest GPU's busy fraction, since the
VWs of a WSP run advance at one long-run rate. SDPipe's weight averaging is counted by its local
staleness and V only (an approximation).

The constants are data, per model and task (gpu_profiles/convergence.yaml), fitted once from executor
runs (experiments/time_to_accuracy/fit.py); time to target = samples / the simulated samples per second.
Pure Python: no torch, no simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from hetsim.errors import HetsimError, SpecError
from hetsim.fields import is_whole
from hetsim.plan import ASYNC_SCHEDULES

__all__ = ["TargetFit", "ConvergenceModel", "Dynamics", "TimeToTarget", "Observation", "load_convergence",
           "dynamics_of", "vw_busy", "samples_to_target", "time_to_target", "time_at", "crossing", "fit_target",
           "rank_by_time", "format_time_to_accuracy", "attach_time_to_accuracy", "rank_plans"]

_FILE = "convergence.yaml"
_FIT_HINT = ("experiments/time_to_accuracy/fit.py fits an entry from executor runs (the mlp's as shipped; set its "
             "MODEL, TASK, FIT_ON and the runs of run.py for another)")


@dataclass(frozen=True, kw_only=True)
class TargetFit:
    """The fitted constants for one target loss."""
    loss: float
    samples_min: float                 # samples to the target with a tiny update batch and no staleness
    noise_batch: float | None          # None: the fit saw one update batch only, so no batch effect
    staleness_cost: float              # relative extra samples per update of effective staleness
    async_cost: float = 0.0            # relative extra samples per asynchronous VW beyond the first

    def __post_init__(self):
        if not (self.samples_min > 0 and self.staleness_cost >= 0 and self.async_cost >= 0
                and (self.noise_batch is None or self.noise_batch > 0)):
            raise SpecError(f"convergence target {self.loss}: samples_min and noise_batch must be > 0, costs "
                            f">= 0; got {self.samples_min}, {self.noise_batch}, {self.staleness_cost}, "
                            f"{self.async_cost}")


@dataclass(frozen=True, kw_only=True)
class ConvergenceModel:
    """One model+task entry of convergence.yaml."""
    model: str
    task: str
    minibatch_size: int                # the minibatch the fit's runs used
    smoothing: int                     # losses in the moving mean whose crossing counts
    default_target: float
    targets: tuple[TargetFit, ...]
    trained_with: dict[str, Any] = field(default_factory=dict)   # model arguments, optimiser, data
    source: str = ""
    # The fitted model's parameter bytes (modelzoo's count): a profile of the same name but another
    # size (another width or depth) is another model, which the constants do not describe.
    param_bytes: int | None = None
    # The smallest and largest update batch among the fit's runs: outside them the batch term is
    # extrapolated (and far above them its slope can put a lower target before a higher one).
    update_batches: tuple[int, int] | None = None

    def at(self, target: float | None) -> TargetFit:
        target = self.default_target if target is None else target
        for t in self.targets:
            if math.isclose(t.loss, target, rel_tol=1e-9, abs_tol=1e-12):
                return t
        fitted = ", ".join(f"{t.loss:g}" for t in self.targets)
        raise HetsimError(f"--target-loss {target:g}: the convergence entry {self.model}/{self.task} is fitted "
                          f"for target losses {fitted} only; choose one of them")


@dataclass(frozen=True, kw_only=True)
class Dynamics:
    """What a plan's run does to the optimisation: update batch, effective staleness, sync mode."""
    update_batch: int
    staleness: float
    mode: str                          # bsp, wsp, sdpipe, or async / sync (one VW, by its schedule)
    async_vws: float = 1.0             # VWs updating shared weights without waiting for each other,
                                       # in units of the fastest one's pace


@dataclass(frozen=True, kw_only=True)
class TimeToTarget:
    target_loss: float
    samples: float
    minibatches: float
    samples_per_s: float
    seconds: float
    dynamics: Dynamics

    def to_dict(self) -> dict[str, Any]:
        d = self.dynamics
        return {"target_loss": self.target_loss, "samples": self.samples, "minibatches": self.minibatches,
                "samples_per_s": self.samples_per_s, "seconds": self.seconds, "update_batch": d.update_batch,
                "effective_staleness": d.staleness, "mode": d.mode,
                "async_vws": d.async_vws}


# the data file -----------------------------------------------------------------------------------
def load_convergence(model: str, task: str = "teacher", path: str | Path | None = None) -> ConvergenceModel | None:
    """The entry for `model` and `task` in convergence.yaml (shipped, or `path`), or None."""
    from hetsim.data import data_root
    from hetsim.fields import Fields
    doc = Fields.load(Path(path) if path is not None else data_root() / _FILE)
    entries = doc.records("entries") if doc.list("entries", []) else []      # an empty list: no entries yet
    for entry in entries:
        if entry.text("model") == model and entry.text("task") == task:
            return _entry(entry)
    return None


def _entry(f) -> ConvergenceModel:
    f.reject_unknown({"model", "task", "minibatch_size", "smoothing", "default_target", "targets",
                      "trained_with", "source", "param_bytes", "update_batches"})
    targets = []
    for k, t in enumerate(f.records("targets")):
        t.reject_unknown({"loss", "samples_min", "noise_batch", "staleness_cost", "async_cost"})
        targets.append(TargetFit(loss=t.number("loss", positive=True),
                                 samples_min=t.number("samples_min", positive=True),
                                 noise_batch=t.number("noise_batch", None, positive=True),
                                 staleness_cost=t.number("staleness_cost", nonnegative=True),
                                 async_cost=t.number("async_cost", 0.0, nonnegative=True)))
        if any(math.isclose(targets[-1].loss, other.loss) for other in targets[:-1]):
            raise f.error(f"targets[{k}].loss", f"{targets[-1].loss:g} is fitted twice")
    model = ConvergenceModel(model=f.text("model"), task=f.text("task"),
                             minibatch_size=f.number("minibatch_size", positive=True, integer=True),
                             smoothing=f.number("smoothing", positive=True, integer=True),
                             default_target=f.number("default_target", positive=True), targets=tuple(targets),
                             trained_with=dict(f.sub("trained_with").data) if f.has("trained_with") else {},
                             source=f.text("source", ""),
                             param_bytes=f.number("param_bytes", None, positive=True, integer=True),
                             update_batches=_batch_range(f))
    if not any(math.isclose(t.loss, model.default_target) for t in targets):
        raise f.error("default_target", f"{model.default_target:g} is not among the targets' losses")
    return model


def _batch_range(f) -> tuple[int, int] | None:
    pair = f.list("update_batches", None)
    if pair is None:
        return None
    if not (len(pair) == 2 and all(is_whole(b) and b > 0 for b in pair)
            and pair[0] <= pair[1]):
        raise f.error("update_batches", f"expected [smallest, largest] update batch of the fit's runs, got {pair!r}")
    return pair[0], pair[1]


# the model ---------------------------------------------------------------------------------------
def dynamics_of(plan: dict, staleness: dict, busy: dict[str, float] | None = None) -> Dynamics:
    """Update batch and effective staleness of a plan (a report's `plan`) from a report's `staleness`;
    `busy` (VW name -> its busiest GPU's busy fraction, `vw_busy`) weighs asynchronous VWs by pace."""
    n_vw, nm, batch = len(plan["virtual_workers"]), plan["nm"], plan["minibatch_size"]
    per_minibatch = plan["schedule"] in ASYNC_SCHEDULES
    mode = plan["sync"]["mode"]
    update_batch = batch if per_minibatch else batch * nm * (n_vw if mode == "bsp" else 1)
    local = staleness["local"]["mean"] or 0.0
    stale = float(local)
    if mode == "wsp" and staleness.get("global", {}).get("mean") is not None:
        # Pulled weights lack the other VWs' updates of the last `global` waves.
        stale += staleness["global"]["mean"] * (nm if per_minibatch else 1) * (n_vw - 1)
    async_vws = float(n_vw) if mode in ("wsp", "sdpipe") else 1.0
    if async_vws > 1 and busy and all(busy.get(vw["name"], 0) > 0 for vw in plan["virtual_workers"]):
        paces = [1.0 / busy[vw["name"]] for vw in plan["virtual_workers"]]
        async_vws = sum(paces) / max(paces)
    if mode == "none":
        mode = "async" if per_minibatch else "sync"
    return Dynamics(update_batch=update_batch, staleness=stale, mode=mode, async_vws=async_vws)


def vw_busy(gpus) -> dict[str, float]:
    """VW name -> the busy fraction of its busiest GPU, from a report's `gpus` (objects or dicts)."""
    out: dict[str, float] = {}
    for g in gpus:
        vw, frac = (g["vw"], g["busy_fraction"]) if isinstance(g, dict) else (g.vw, g.busy_fraction)
        out[vw] = max(out.get(vw, 0.0), frac)
    return out


def samples_to_target(fit: TargetFit, update_batch: float, staleness: float, async_vws: float = 1.0) -> float:
    """Samples (over every VW) to reach fit.loss: the module docstring's formula."""
    if not (update_batch >= 0 and staleness >= 0 and async_vws >= 1):
        raise HetsimError(f"samples_to_target: update_batch and staleness must be >= 0 and async_vws >= 1; "
                          f"got {update_batch}, {staleness}, {async_vws}")
    batch_factor = 1.0 if fit.noise_batch is None else 1.0 + update_batch / fit.noise_batch
    return (fit.samples_min * batch_factor * (1.0 + fit.staleness_cost * staleness)
            * (1.0 + fit.async_cost * (async_vws - 1)))


def time_to_target(model: ConvergenceModel, report, target: float | None = None,
                   samples_per_s: float | None = None) -> TimeToTarget:
    """Predicted time to `target` (default: the entry's) of a report: samples from the model at the
    report's update batch and staleness, over its samples per second (or `samples_per_s`)."""
    rate = report.throughput["samples_per_s"] if samples_per_s is None else samples_per_s
    if not 0 < rate < math.inf:
        raise HetsimError(f"time to accuracy: plan {report.plan['name']} has no throughput ({rate} samples/s)")
    dyn = dynamics_of(report.plan, report.staleness, vw_busy(report.gpus))
    return time_at(model.at(target), dyn, rate, report.plan["minibatch_size"])


def time_at(fit: TargetFit, dyn: Dynamics, samples_per_s: float, minibatch: int) -> TimeToTarget:
    """Time to `fit`'s loss of a run with dynamics `dyn` at `samples_per_s`."""
    samples = samples_to_target(fit, dyn.update_batch, dyn.staleness, dyn.async_vws)
    return TimeToTarget(target_loss=fit.loss, samples=samples, minibatches=samples / minibatch,
                        samples_per_s=samples_per_s, seconds=samples / samples_per_s, dynamics=dyn)


def rank_by_time(items: Sequence[tuple[Any, TimeToTarget]]) -> list[tuple[Any, TimeToTarget]]:
    """Fastest to the target first; ties keep their order (the throughput ranking's)."""
    return sorted(items, key=lambda item: item[1].seconds)


def format_time_to_accuracy(section: dict) -> str:
    """One line for a report's time_to_accuracy section."""
    return (f"time to loss {section['target_loss']:g}: {section['seconds']:.4g} s predicted "
            f"({section['minibatches']:.0f} minibatches at {section['samples_per_s']:.1f} samples/s; "
            f"update batch {section['update_batch']}, effective staleness {section['effective_staleness']:.2f} "
            f"updates, {section['mode']}; hetsim.convergence, {section.get('entry', '')})")


# measured curves and the fit ---------------------------------------------------------------------
def crossing(curve: Iterable[Sequence], target: float, window: int) -> tuple[int, float] | None:
    """(minibatches done, t_s) when the moving mean of the last `window` losses first reaches `target`.
    `curve`: (vw, minibatch, t_s, loss) rows in time order (a measurement's loss.csv), every VW's
    losses in one stream, so the count is of minibatches over all VWs."""
    recent: list[float] = []
    total = 0.0
    for i, (_vw, _mb, t_s, loss) in enumerate(curve):
        recent.append(loss)
        total += loss
        if len(recent) > window:
            total -= recent[-window - 1]
        if len(recent) >= window and total / window <= target:
            return i + 1, t_s
    return None


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One measured run: its update batch, effective staleness, asynchronous VWs and samples to the target."""
    update_batch: float
    staleness: float
    samples: float
    async_vws: float = 1.0


# The free constants besides samples_min, each searched on a log grid (0 is tried too, and None for
# noise_batch: no batch effect) and then refined.
_GRID = 24


def fit_target(loss: float, observations: Sequence[Observation]) -> TargetFit:
    """Least squares in log samples over (noise_batch, staleness_cost, async_cost), samples_min in
    closed form (the geometric mean of the rest). A constant the data cannot identify (one update
    batch, no staleness, no asynchronous VWs) is left out: noise_batch None, a cost 0."""
    if len(observations) < 2:
        raise HetsimError(f"fit: target {loss:g} needs at least 2 runs that reached it, got {len(observations)}")
    batches = sorted({o.update_batch for o in observations})
    noises = [None] if len(batches) == 1 else [None] + [batches[0] * 2 ** (k / 2) for k in range(-12, 2 * _GRID - 12)]
    costs = [0.0] + [0.01 * 1.3 ** k for k in range(_GRID)]
    stale = costs if any(o.staleness for o in observations) else [0.0]
    vws = costs if any(o.async_vws > 1 for o in observations) else [0.0]
    best = min(((_residual(observations, (nb, a, c))[0], i) for i, (nb, a, c) in
                enumerate((nb, a, c) for nb in noises for a in stale for c in vws)))
    point = [(nb, a, c) for nb in noises for a in stale for c in vws][best[1]]
    point = _refine(observations, point)
    _, smin = _residual(observations, point)
    return TargetFit(loss=loss, samples_min=smin, noise_batch=point[0], staleness_cost=point[1], async_cost=point[2])


def _residual(observations, point) -> tuple[float, float]:
    """(sum of squared log errors, best samples_min) for fixed (noise_batch, staleness_cost, async_cost)."""
    nb, a, c = point
    unit = TargetFit(loss=1.0, samples_min=1.0, noise_batch=nb, staleness_cost=a, async_cost=c)
    logs = [math.log(o.samples) - math.log(samples_to_target(unit, o.update_batch, o.staleness, o.async_vws))
            for o in observations]
    mean = sum(logs) / len(logs)
    return sum((x - mean) ** 2 for x in logs), math.exp(mean)


def _refine(observations, point, rounds: int = 200) -> tuple:
    """Pattern search from the grid's best point: scale one free constant at a time (a constant at 0 or
    None stays so), halving the step when no move helps."""
    step = 0.2
    for _ in range(rounds):
        base = _residual(observations, point)[0]
        moves = [tuple(v * math.exp(d) if j == i else v for j, v in enumerate(point))
                 for i, v in enumerate(point) if v for d in (step, -step)]
        scored = [(_residual(observations, m)[0], m) for m in moves]
        better = [x for x in scored if x[0] < base - 1e-15]
        if better:
            point = min(better, key=lambda x: x[0])[1]
        else:
            step /= 2
            if step < 1e-7:
                break
    return point


def optimizer_mismatch(model: ConvergenceModel, optimizer: str | None) -> str:
    """Why the entry cannot predict plans training with `optimizer` (a plan's; None: SGD with
    momentum), or "": samples to a target fitted with one optimizer say nothing of another."""
    fitted, planned = model.trained_with.get("optimizer"), optimizer or "momentum"
    if fitted is None or fitted == planned:
        return ""
    return (f"the {model.model}/{model.task} entry of gpu_profiles/{_FILE} was fitted on runs training with "
            f"{fitted}, and the plan trains with {planned}; {_FIT_HINT}")


def batch_note(model: ConvergenceModel, minibatch: int) -> str:
    """A caution where the plan's minibatch is not the one the entry was fitted at, or ""."""
    if minibatch == model.minibatch_size:
        return ""
    return (f"time to accuracy: the {model.model}/{model.task} entry was fitted on runs at minibatch "
            f"{model.minibatch_size}, the plan trains at {minibatch}; its constants are not known to hold there")


def size_note(model: ConvergenceModel, param_bytes: int | None) -> str:
    """A caution where the profile's model is not the size the entry was fitted on, or ""."""
    if not model.param_bytes or not param_bytes or param_bytes == model.param_bytes:
        return ""                          # 0: a profile that does not know its parameters
    return (f"time to accuracy: the {model.model}/{model.task} entry was fitted on a {model.model} of "
            f"{model.param_bytes / 1e6:.3g} MB of parameters, the profile's has {param_bytes / 1e6:.3g} MB "
            f"(another width or depth); its constants are not known to hold there")


def range_note(model: ConvergenceModel, update_batches: Iterable[int]) -> str:
    """A caution where an update batch lies outside those the entry was fitted on, or ""."""
    if model.update_batches is None:
        return ""
    lo, hi = model.update_batches
    outside = sorted({b for b in update_batches if not lo <= b <= hi})
    if not outside:
        return ""
    return (f"time to accuracy: update batch {', '.join(map(str, outside))} lies outside the {lo}-{hi} the "
            f"{model.model}/{model.task} entry was fitted on; its batch term is extrapolated there, and far above "
            "that range it can even put a lower target loss before a higher one")


def _notes(model: ConvergenceModel, minibatch: int, param_bytes: int | None,
           update_batches: Iterable[int] = ()) -> list[str]:
    return [n for n in (size_note(model, param_bytes), batch_note(model, minibatch),
                        range_note(model, update_batches)) if n]


# what the CLI calls ------------------------------------------------------------------------------
def attach_time_to_accuracy(report, target: float | None = None, path: str | Path | None = None,
                            param_bytes: int | None = None) -> None:
    """Give `report` its time_to_accuracy section when its model has a convergence entry fitted with
    the plan's optimizer (`hetsim simulate`); asking for a target without one is an error.
    `param_bytes`: the profile's, checked against the entry's model size (a note where they differ)."""
    model = load_convergence(report.model, path=path)
    if model is None:
        if target is not None:
            raise HetsimError(f"--target-loss: no convergence entry for model {report.model!r} in "
                              f"gpu_profiles/{_FILE}; {_FIT_HINT}")
        return
    mismatch = optimizer_mismatch(model, report.plan.get("optimizer"))
    if mismatch:
        if target is not None:
            raise HetsimError(f"--target-loss: {mismatch}")
        return
    ttt = time_to_target(model, report, target)
    report.time_to_accuracy = {**ttt.to_dict(), "entry": f"{model.model}/{model.task}"}
    report.notes.extend(_notes(model, report.plan["minibatch_size"], param_bytes, [ttt.dynamics.update_batch]))


def rank_plans(result, cluster, profile, space, target: float | None = None, path: str | Path | None = None):
    """`hetsim plan --objective time-to-accuracy`: the search's simulated candidates reordered by
    predicted time to `target`, each at its ranked throughput (n x slowest VW) with the update batch
    and staleness its simulation in the search measured; returns (result, table text)."""
    from dataclasses import replace

    model = load_convergence(profile.model, path=path)
    if model is None:
        raise HetsimError(f"--objective time-to-accuracy: no convergence entry for model {profile.model!r} in "
                          f"gpu_profiles/{_FILE}; {_FIT_HINT}")
    mismatch = optimizer_mismatch(model, space.optimizer)
    if mismatch:
        raise HetsimError(f"--objective time-to-accuracy: {mismatch}")
    simulated = [c for c in result.candidates if c.simulated_mb_s is not None]
    if not simulated:
        raise HetsimError("--objective time-to-accuracy: no candidate was simulated (the closed form alone "
                          "ranked them: --cost-model pipedream, or a cluster past the search's simulation "
                          "limit), and time to accuracy needs each plan's simulated staleness")
    fit = model.at(target)
    timed = [(c, time_at(fit, c.dynamics, c.simulated_mb_s * profile.batch_size, profile.batch_size))
             for c in simulated]
    ranked = rank_by_time(timed)
    rest = [c for c in result.candidates if c.simulated_mb_s is None]
    batches = [c.dynamics.update_batch for c, _ in timed]
    table = [f"note: {note}" for note in _notes(model, profile.batch_size, profile.param_bytes, batches)] + [
             f"time to loss {fit.loss:g} ({model.model}/{model.task}, hetsim.convergence): "
             "simulated plans, fastest first",
             f"{'#':>3} {'policy':<18}{'Nm':>3}{'D':>3}{'samples/s':>11}{'staleness':>10}{'minibatches':>12}"
             f"{'seconds':>10}"]
    for i, (c, t) in enumerate(ranked, 1):
        table.append(f"{i:>3} {c.policy:<18}{c.nm:>3}{c.staleness:>3}{t.samples_per_s:>11.1f}"
                     f"{t.dynamics.staleness:>10.2f}{t.minibatches:>12.0f}{t.seconds:>10.4g}")
    return replace(result, candidates=tuple([c for c, _ in ranked] + rest)), "\n".join(table)
