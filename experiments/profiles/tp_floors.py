"""Host floors of a tensor-parallel rank's transformer block pass, fitted to Sailor's TP layer times:
the `floor_s.Block.<pass>` entries of gpu_profiles/efficiency.yaml `gpus:`.

    python experiments/profiles/tp_floors.py [--data DIR] [--write] [--held-back-yaml FILE]

Sailor measured OPT-350's blocks at tensor-parallel degree 1, 2, 4 (8 on some types) and micro-batch
1 to 128 (profiles_tmp.json; times include the rank's all-reduces). At small micro-batches a TP rank's
block pass stops getting faster: GH200's forward takes 1.44-1.70 ms at TP 2 and 4, micro-batch 1 and 2,
while the rank's derived share of the work is 0.5-1.2 ms. The host cannot issue a block's kernels and
collectives faster than that. Model of one measured pass:

    measured = max(derived share + overhead_s, floor_s) + all-reduce

with the derived share as `hetsim import sailor --derived` times it (modelzoo.sailor_times) and the
all-reduce what the simulator charges: a ring over t GPUs, 2(t-1)/t x the block's TP bytes at Sailor's
intra-node bandwidth for t GPUs. The floor applies at t > 1 only (hetsim.derive): a block on one GPU
makes no collective calls, and Sailor's TP-1 blocks run below the TP floors (GH200 forward, micro-batch
1: 1.23 ms). Per GPU type and pass, floor_s minimises the squared log error over every (micro-batch,
TP > 1) entry, the smallest such value where the minimum is flat (no floor unless the data ask for
one). Fitted on the NVLink types only: on PCIe (TITAN RTX, RTX 2080 Ti, RTX 3090) the TP
excess over the model grows with the micro-batch, which is all-reduce bandwidth below Sailor's
intra-node figure, not a floor; the report shows it and fits nothing there.

The check: the same fit on the TP-2 entries only, applied to the TP >= 4 entries (`--held-back-yaml`
writes an efficiency.yaml with those floors, for experiments/peers/sailor/run.py --efficiency). Writes
tp_floors.md beside this file; `--write` puts the all-entries fit into gpu_profiles/efficiency.yaml.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import yaml

from hetsim.data import data_root
from hetsim.derive import PASSES, Efficiency, load_efficiencies, pass_time_s, tp_share
from hetsim.gpu import load_gpu_types
from hetsim.sailor import GPU_TYPES, NVLINK_TYPES, read_shape
from hetsim.transformer import transformer_layers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sailor_layers import BLOCKS, MODEL, PRECISION, costs, default_data  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIG = "configs/training_config_opt_350.json"
GRID = np.arange(0.0, 10e-3, 5e-6)          # candidate floors: 0 to 10 ms in 5 us steps
NO_FLOOR = {f"floor_s.Block.{p}": 0.0 for p in PASSES}


def entries(data: Path) -> list[dict]:
    """One row per (GPU type, micro-batch, TP degree): mean measured block pass, the derived share
    without a floor, and the all-reduce the simulator adds."""
    runs = json.loads((data / "profiles_tmp.json").read_text())[MODEL]
    intra = json.loads((data / "network" / "intra_node_bandwidths.json").read_text())
    _model, shape, _opt = read_shape(data / CONFIG)
    gpus = load_gpu_types()
    effs = load_efficiencies(gpus)
    rows = []
    for sailor_type, by_mbs in runs.items():
        gpu = GPU_TYPES[sailor_type]
        eff = Efficiency(factors=NO_FLOOR, base=effs[gpu])
        for mbs, by_tp in by_mbs.items():
            block = costs(int(mbs))[0]
            ar_bytes = transformer_layers(shape, int(mbs))[1].tp_allreduce_bytes
            for tp, layers in by_tp.items():
                t = int(tp)
                bw = intra[sailor_type][tp][1] if tp in intra[sailor_type] else max(
                    v[1] for v in intra[sailor_type].values())
                share = tp_share(block, t)
                row = {"gpu": gpu, "nvlink": sailor_type in NVLINK_TYPES, "mbs": int(mbs), "tp": t,
                       "allreduce": 0.0 if t == 1 else 2 * (t - 1) / t * ar_bytes / bw}
                for k, p in enumerate(PASSES):
                    row[p] = float(np.mean([layers[str(i)][k] for i in BLOCKS]))
                    row[f"derived_{p}"] = pass_time_s(share, p, gpus[gpu], eff, PRECISION, t)
                rows.append(row)
    return sorted(rows, key=lambda r: (r["gpu"], r["tp"], r["mbs"]))


def predict(row: dict, pass_: str, floor: float) -> float:
    return max(row[f"derived_{pass_}"], floor if row["tp"] > 1 else 0.0) + row["allreduce"]


def fit_floor(rows: list[dict], pass_: str) -> float:
    """The smallest floor of least squared log error over `rows`."""
    losses = [sum(math.log(predict(r, pass_, f) / r[pass_]) ** 2 for r in rows) for f in GRID]
    return float(GRID[int(np.argmin(np.round(losses, 12)))])


def fit(rows: list[dict], max_tp: int | None = None) -> dict[str, dict[str, float]]:
    """gpu -> {floor_s.Block.<pass>: seconds} for the NVLink types, on entries of 1 < TP <= max_tp."""
    out = {}
    for gpu in sorted({r["gpu"] for r in rows if r["nvlink"]}):
        mine = [r for r in rows if r["gpu"] == gpu and 1 < r["tp"] <= (max_tp or r["tp"])]
        out[gpu] = {f"floor_s.Block.{p}": round(fit_floor(mine, p), 6) for p in PASSES}
    return out


def errors(rows: list[dict], floors: dict) -> list[float]:
    """predicted / measured - 1 of block fwd+bwd per row, with `floors` (0 where a type has none)."""
    out = []
    for r in rows:
        f = floors.get(r["gpu"], {})
        pred = sum(predict(r, p, f.get(f"floor_s.Block.{p}", 0.0)) for p in PASSES)
        out.append(pred / (r["fwd"] + r["bwd"]) - 1)
    return out


def report(rows: list[dict], shipped: dict, held: dict, data: Path) -> str:
    lines = ["# Host floors of a tensor-parallel block pass: Sailor's OPT-350 (TP 1-8)", "",
             f"Measured: {data.name}/profiles_tmp.json, mean of the 24 blocks, all-reduces included. Model: "
             "max(derived share + overhead_s, floor_s) + ring all-reduce at Sailor's intra-node bandwidth. "
             "Written by `python experiments/profiles/tp_floors.py`.", "",
             "## Floors (ms)", "", "| GPU type | fwd | bwd | fwd, fit on TP 2 | bwd, fit on TP 2 |",
             "|---|---|---|---|---|"]
    for gpu, f in shipped.items():
        h = held[gpu]
        lines.append(f"| {gpu} | {f['floor_s.Block.fwd'] * 1e3:.3f} | {f['floor_s.Block.bwd'] * 1e3:.3f} | "
                     f"{h['floor_s.Block.fwd'] * 1e3:.3f} | {h['floor_s.Block.bwd'] * 1e3:.3f} |")
    lines += ["", "## Block fwd+bwd, predicted / measured - 1 (%), micro-batch <= 4", "",
              "Held back: the TP-2 fit on TP >= 4 entries. TP 1 takes no floor.", "",
              "| GPU type | tp | mbs | measured ms | no floor | shipped floor | held-back floor |",
              "|---|---|---|---|---|---|---|"]
    small = [r for r in rows if r["nvlink"] and r["tp"] > 1 and r["mbs"] <= 4]
    for r, e0, e1, e2 in zip(small, errors(small, {}), errors(small, shipped), errors(small, held)):
        lines.append(f"| {r['gpu']} | {r['tp']} | {r['mbs']} | {(r['fwd'] + r['bwd']) * 1e3:.2f} | "
                     f"{e0 * 100:+.1f} | {e1 * 100:+.1f} | " + (f"{e2 * 100:+.1f} |" if r["tp"] >= 4 else "(fitted) |"))
    tested = [r for r in rows if r["nvlink"] and r["tp"] >= 4]
    lines += ["", "## Mean |error| over the TP >= 4 entries (all micro-batches)", "",
              "| GPU type | no floor | held-back floor | shipped floor |", "|---|---|---|---|"]
    for gpu in [*sorted({r["gpu"] for r in tested}), "all"]:
        mine = [r for r in tested if gpu in ("all", r["gpu"])]
        lines.append(f"| {gpu} | {_mean_abs(errors(mine, {})):.1f} | {_mean_abs(errors(mine, held)):.1f} | "
                     f"{_mean_abs(errors(mine, shipped)):.1f} |")
    lines += ["",
              "## PCIe types: the TP excess grows with the micro-batch (no floor fitted)", "",
              "Measured minus modelled block fwd+bwd (ms), no floor: a floor would show as a constant.", "",
              "| GPU type | tp | " + " | ".join(f"mbs {m}" for m in (1, 2, 4, 8)) + " |", "|---|---|---|---|---|---|"]
    for gpu in sorted({r["gpu"] for r in rows if not r["nvlink"]}):
        for tp in sorted({r["tp"] for r in rows if r["gpu"] == gpu and r["tp"] > 1}):
            by = {r["mbs"]: r for r in rows if r["gpu"] == gpu and r["tp"] == tp}
            cells = [f"{sum(by[m][p] - predict(by[m], p, 0.0) for p in PASSES) * 1e3:.1f}" if m in by else ""
                     for m in (1, 2, 4, 8)]
            lines.append(f"| {gpu} | {tp} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean_abs(errs: list[float]) -> float:
    return 100 * float(np.mean(np.abs(errs)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=default_data(),
                        help="folder with Sailor's profiles_tmp.json and network/ (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=HERE / "tp_floors.md")
    parser.add_argument("--write", action="store_true", help="write the floors into gpu_profiles/efficiency.yaml")
    parser.add_argument("--held-back-yaml", type=Path, default=None, metavar="FILE",
                        help="also write a copy of efficiency.yaml with the floors fitted on TP 2 only")
    args = parser.parse_args(argv)
    rows = entries(args.data)
    shipped, held = fit(rows), fit(rows, max_tp=2)
    text = report(rows, shipped, held, args.data)
    args.out.write_text(text)
    print(text)
    from modelzoo.pipedream_fit import write_efficiency
    path = data_root() / "efficiency.yaml"
    current = yaml.safe_load(path.read_text()).get("gpus") or {}
    merged = lambda floors: {**current, **{g: {**current.get(g, {}), **f} for g, f in floors.items()}}
    if args.held_back_yaml:
        args.held_back_yaml.write_text(path.read_text())
        write_efficiency(args.held_back_yaml, gpus=merged(held))
    if args.write:
        write_efficiency(path, gpus=merged(shipped))
    elif any({k: v for k, v in current.get(g, {}).items() if k.startswith("floor_s.")} != f
             for g, f in shipped.items()):
        print("gpu_profiles/efficiency.yaml floors differ from this fit: rerun with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
