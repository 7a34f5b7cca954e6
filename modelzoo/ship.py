"""Regenerate the shipped model profiles in gpu_profiles/models/ (derived times for every GPU type).

    python -m modelzoo.ship                     # all of SHIPPED
    python -m modelzoo.ship vgg19 resnet152     # some

Each profile is counted on the meta device (modelzoo.counting) and its times derived for every
shipped GPU type from gpu_profiles/gpus/*.yaml and gpu_profiles/efficiency.yaml (hetsim.derive).
Nothing is measured, so the output is the same on any machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetsim.data import data_root
from hetsim.derive import derive_profile, load_efficiencies
from hetsim.gpu import load_gpu_types
from hetsim.profile_files import save_profile
from modelzoo.counting import counted_profile

__all__ = ["SHIPPED", "ship"]

# HetPipe's two models at its batch size, then the antichain-partitioning paper's image models.
SHIPPED = [("vgg19", 32), ("resnet152", 32), ("vgg16", 32), ("resnet18", 32), ("resnet50", 32),
           ("resnet101", 32), ("alexnet", 32), ("resnext50", 32), ("resnext101", 32),
           ("inception_v3", 32), ("densenet121", 32), ("squeezenet1_0", 32)]

NOTE = ("; efficiency factors are ESTIMATES not fitted to GPU measurements (see gpu_profiles/efficiency.yaml "
        "and docs/profiles.md); FLOPs count a multiply-add as 2")


def ship(model: str, batch: int, out_dir: Path) -> Path:
    gpus = load_gpu_types()
    base, costs = counted_profile(model, batch)
    profile = derive_profile(base, costs, [gpus[n] for n in sorted(gpus)], load_efficiencies(gpus), note=NOTE)
    path = out_dir / f"{model}_b{batch}.yaml"
    save_profile(profile, path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names from SHIPPED (default: all)")
    parser.add_argument("--out", default=str(data_root() / "models"))
    args = parser.parse_args(argv)
    chosen = [(m, b) for m, b in SHIPPED if not args.models or m in args.models]
    for model, batch in chosen:
        print(f"wrote {ship(model, batch, Path(args.out))}", flush=True)


if __name__ == "__main__":
    main()
