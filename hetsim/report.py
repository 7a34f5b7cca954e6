"""The report: what a simulation predicts and what the executor measures, in one format.

`Report.to_json()` is deterministic (sorted keys, shortest round-trip floats), so the same inputs and
seed give byte-identical files. Per-update records go to CSV files beside it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from hetsim.errors import HetsimError
from hetsim.outputs import staged
from hetsim.trace import TraceWriter

__all__ = ["GpuStats", "LinkStats", "VwStats", "Report", "distribution", "STALENESS_LOCAL_COLUMNS",
           "STALENESS_GLOBAL_COLUMNS", "LOSS_COLUMNS"]

STALENESS_LOCAL_COLUMNS = ("vw", "stage", "minibatch", "staleness")
STALENESS_GLOBAL_COLUMNS = ("vw", "stage", "wave", "version", "staleness")
LOSS_COLUMNS = ("vw", "minibatch", "t_s", "loss")     # measurements: loss.csv, seconds since the start
# Every file Report.write may write (which ones depends on the report) and the figures hetsim.plots draws.
REPORT_FILES = ("report.json", "gpus.csv", "links.csv", "virtual_workers.csv", "staleness_local.csv",
                "staleness_global.csv", "loss.csv", "trace.json")
REPORT_FIGURES = ("utilisation.png", "timeline.png")


@dataclass(kw_only=True)
class GpuStats:
    id: str
    type: str
    vw: str
    stage: int
    layers: tuple[int, int]
    busy_fraction: float          # compute time / window
    compute_s: float
    recv_wait_s: float            # idle, waiting for activations or gradients
    sync_wait_s: float            # blocked in PULL/ALLREDUCE/GROUP_SYNC
    memory_bytes: int             # peak: weights, gradients, optimiser, stash, activations
    memory_capacity_bytes: int
    memory_breakdown: dict[str, int] = field(default_factory=dict)
    tp: int = 1                   # size of the tensor-parallel group this GPU belongs to


@dataclass(kw_only=True)
class LinkStats:
    id: str
    bandwidth_Bps: float
    bytes: float
    utilisation: float


@dataclass(kw_only=True)
class VwStats:
    name: str
    minibatches: int              # timed in the steady-state window (hetsim.window)
    minibatches_per_s: float
    samples_per_s: float
    sync_wait_s: float            # time the input stage was blocked by synchronisation


def distribution(values: Iterable[int]) -> dict[str, Any]:
    values = list(values)
    if not values:
        return {"count": 0, "mean": None, "max": None, "histogram": {}}
    hist = Counter(values)
    return {"count": len(values), "mean": sum(values) / len(values), "max": max(values),
            "histogram": {str(k): hist[k] for k in sorted(hist)}}


@dataclass(kw_only=True)
class Report:
    kind: str                                  # "prediction" or "measurement"
    plan: dict[str, Any]
    cluster: str
    model: str
    profile_source: str
    settings: dict[str, Any]
    window: dict[str, float]
    throughput: dict[str, float]
    virtual_workers: list[VwStats]
    gpus: list[GpuStats]
    links: list[LinkStats]
    staleness: dict[str, Any]
    sync: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)   # measurements only: losses, ...
    # Per-update records, written as CSV rather than into the JSON.
    staleness_local: list[tuple] = field(default_factory=list, repr=False)
    staleness_global: list[tuple] = field(default_factory=list, repr=False)
    losses: list[tuple] = field(default_factory=list, repr=False)     # LOSS_COLUMNS, measurements only
    # Predicted time to a target loss (hetsim.convergence), when the model has a convergence entry.
    time_to_accuracy: dict[str, Any] = field(default_factory=dict)
    trace: TraceWriter | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(replace(self, trace=None))
        for key in ("staleness_local", "staleness_global", "losses", "trace"):
            doc.pop(key)
        if not doc["time_to_accuracy"]:          # most reports: no key, so their JSON stays as it was
            doc.pop("time_to_accuracy")
        return doc

    def to_json(self) -> str:
        return json.dumps(_plain(self.to_dict()), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Report":
        doc = dict(doc)
        doc["virtual_workers"] = [VwStats(**v) for v in doc["virtual_workers"]]
        doc["gpus"] = [GpuStats(**{**g, "layers": tuple(g["layers"])}) for g in doc["gpus"]]
        doc["links"] = [LinkStats(**l) for l in doc["links"]]
        return cls(**doc)

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        """A report.json read back with what `write` put beside it (the per-update CSVs, loss.csv,
        trace.json), so that writing it again loses nothing."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
            report = cls.from_dict(doc)
        except OSError as exc:
            raise HetsimError(f"report {path}: cannot read ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise HetsimError(f"report {path}: not JSON ({exc})") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise HetsimError(f"report {path}: not a hetsim report.json ({type(exc).__name__}: {exc})") from None
        if path.name != "report.json":     # CSVs beside another name may be another report's
            return report
        report.staleness_local = _records(path.parent / "staleness_local.csv", STALENESS_LOCAL_COLUMNS, int)
        report.staleness_global = _records(path.parent / "staleness_global.csv", STALENESS_GLOBAL_COLUMNS, int)
        report.losses = _records(path.parent / "loss.csv", LOSS_COLUMNS, int, int, float, float)
        trace = path.parent / "trace.json"
        if trace.is_file():
            try:
                report.trace = TraceWriter.from_dict(json.loads(trace.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise HetsimError(f"report {trace}: not a trace hetsim wrote ({type(exc).__name__}: {exc})") from None
        return report

    def tables(self) -> dict[str, "Any"]:
        """pandas DataFrames of the per-GPU, per-link, per-VW and per-update records."""
        import pandas as pd
        return {
            "gpus": pd.DataFrame([_row(g) for g in self.gpus]),
            "links": pd.DataFrame([asdict(l) for l in self.links]),
            "virtual_workers": pd.DataFrame([asdict(v) for v in self.virtual_workers]),
            "staleness_local": pd.DataFrame(self.staleness_local, columns=STALENESS_LOCAL_COLUMNS),
            "staleness_global": pd.DataFrame(self.staleness_global, columns=STALENESS_GLOBAL_COLUMNS),
            # A measurement's loss against wall-clock (loss.csv), for time to accuracy.
            **({"loss": pd.DataFrame(self.losses, columns=LOSS_COLUMNS)} if self.losses else {}),
        }

    def write(self, out_dir: str | Path, *, drop_figures: bool = False) -> list[Path]:
        """report.json, one CSV per table and trace.json (if traced); hetsim.plots draws the figures.
        All of them or none; an earlier report's file that this one does not write (trace.json of a
        traced run) is removed, so none there contradicts the rest, and with `drop_figures` its figures
        too (a writer that draws none, as the executor)."""
        owns = REPORT_FILES + (REPORT_FIGURES if drop_figures else ())
        with staged(out_dir, "report folder", owns=owns) as stage:
            names = [p.name for p in self._write(stage)]
        return [Path(out_dir) / name for name in names]

    def _write(self, out: Path) -> list[Path]:
        paths = [out / "report.json"]
        paths[0].write_text(self.to_json())
        for name, frame in self.tables().items():
            path = out / f"{name}.csv"
            frame.to_csv(path, index=False)
            paths.append(path)
        if self.trace is not None:
            paths.append(out / "trace.json")
            self.trace.write(paths[-1])
        return paths


def _records(path: Path, columns: tuple[str, ...], *types) -> list[tuple]:
    """The rows of one of `write`'s CSVs beside a report.json, typed (`types` per column, the last one
    repeated); none where it is absent."""
    if not path.is_file():
        return []
    import csv
    types = types + (types[-1],) * (len(columns) - len(types))
    try:
        with path.open(newline="") as f:
            header, *rows = list(csv.reader(f)) or [[]]
        if tuple(header) != columns:
            raise ValueError(f"columns {header}, expected {list(columns)}")
        return [tuple(t(v) for t, v in zip(types, row, strict=True)) for row in rows]
    except (OSError, ValueError, csv.Error) as exc:
        raise HetsimError(f"report {path}: not the table a report writes ({exc})") from None


def _row(g: GpuStats) -> dict[str, Any]:
    row = asdict(g)
    row["layers"] = f"{g.layers[0]}-{g.layers[1]}"
    breakdown = row.pop("memory_breakdown")
    row.update({f"mem_{k}": v for k, v in sorted(breakdown.items())})   # as report.json orders them
    return row


def _plain(value: Any) -> Any:
    """JSON-safe copy: tuples to lists, numpy scalars to Python numbers, NaN/inf to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value
