"""Predicted vs measured: the rows `hetsim validate` prints and the validation suite tabulates.

Pure functions of two Reports (a prediction and a measurement of the same plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.errors import HetsimError
from hetsim.report import Report

__all__ = ["Comparison", "compare_reports", "format_comparison", "percent_error"]


@dataclass(frozen=True, kw_only=True)
class Comparison:
    metric: str
    predicted: float | None
    measured: float | None

    @property
    def error_pct(self) -> float | None:
        return percent_error(self.predicted, self.measured)


def percent_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured in %, None when undefined.

    >>> percent_error(105.0, 100.0)
    5.0
    """
    if predicted is None or measured is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def compare_reports(prediction: Report, measurement: Report) -> list[Comparison]:
    """Throughput, each GPU's compute and waiting per minibatch of its VW, staleness, and SDPipe's groups.
    The two must be of one plan: the same GPUs in the same virtual workers."""
    for name, r in (("prediction", prediction), ("measurement", measurement)):
        if not isinstance(r, Report):
            raise HetsimError(f"compare: {name}: expected a Report, got {type(r).__name__}")
    where = lambda r: sorted((g.id, g.vw) for g in r.gpus)
    if where(prediction) != where(measurement):
        raise HetsimError(f"compare: the prediction (plan {prediction.plan.get('name')!r}) and the measurement (plan "
                          f"{measurement.plan.get('name')!r}) place different GPUs or virtual workers; compare "
                          "reports of one plan")
    rows = [Comparison(metric="throughput samples/s", predicted=prediction.throughput["samples_per_s"],
                       measured=measurement.throughput["samples_per_s"])]
    for p, m in zip(prediction.virtual_workers, measurement.virtual_workers):
        rows.append(Comparison(metric=f"{p.name} samples/s", predicted=p.samples_per_s, measured=m.samples_per_s))
    rate = {r.kind: {v.name: v.minibatches_per_s for v in r.virtual_workers} for r in (prediction, measurement)}
    span = {r.kind: r.window["duration_s"] for r in (prediction, measurement)}
    measured = {g.id: g for g in measurement.gpus}
    for g in prediction.gpus:
        m = measured[g.id]
        for label, attr in (("compute", "compute_s"), ("recv wait", "recv_wait_s"), ("sync wait", "sync_wait_s")):
            rows.append(Comparison(
                metric=f"{g.id} [{g.vw} s{g.stage}] {label} ms/minibatch",
                predicted=1e3 * getattr(g, attr) / (span["prediction"] * rate["prediction"][g.vw]),
                measured=1e3 * getattr(m, attr) / (span["measurement"] * rate["measurement"][m.vw])))
    for scope in ("local", "global"):
        if scope in prediction.staleness and scope in measurement.staleness:
            for stat in ("max", "mean"):
                rows.append(Comparison(metric=f"{scope} staleness {stat}",
                                       predicted=prediction.staleness[scope][stat],
                                       measured=measurement.staleness[scope][stat]))
    if "group_size" in prediction.sync and "group_size" in measurement.sync:      # SDPipe's groups
        rows.append(Comparison(metric="sdpipe mean group size", predicted=prediction.sync["group_size"]["mean"],
                               measured=measurement.sync["group_size"]["mean"]))
        rows.append(Comparison(metric="sdpipe connections", predicted=sum(prediction.sync["connections"]),
                               measured=sum(measurement.sync["connections"])))
    return rows


def format_comparison(rows: list[Comparison]) -> str:
    width = max(len(r.metric) for r in rows)
    lines = [f"{'':<{width}}  {'predicted':>10}  {'measured':>10}  {'error':>8}"]
    for r in rows:
        err = "" if r.error_pct is None else f"{r.error_pct:+.1f}%"
        lines.append(f"{r.metric:<{width}}  {_num(r.predicted):>10}  {_num(r.measured):>10}  {err:>8}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"
