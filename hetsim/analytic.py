"""VGG profiles computed from layer shapes and datasheet rates, for use before any measurement.

Counts per image, fp32: a convolution does 2*Cin*Cout*k*k FLOPs per output pixel (a multiply-add
is 2 FLOPs), a linear layer 2*in*out, ReLU one per element, max-pooling k*k per output element.
Backward costs twice the forward FLOPs (input and weight gradients). Bytes moved are the input,
weights and output, read or written once. Times come from `hetsim.roofline`.

    python -m hetsim.analytic vgg19 --batch 32 --out gpu_profiles/models/vgg19_b32_analytic.yaml
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hetsim.gpu import GpuType, load_gpu_types
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.profile_files import save_profile
from hetsim.roofline import roofline_s

__all__ = ["vgg_profile", "VGG_CONFIGS"]

VGG_CONFIGS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"],
}
FP32 = 4


@dataclass(frozen=True)
class _Shape:
    """One layer per image: FLOPs, input/output elements and parameters."""

    name: str
    kind: str
    flops: float
    in_elems: int
    out_elems: int
    params: int


def _vgg_shapes(config: list, image: int = 224, classes: int = 1000) -> list[_Shape]:
    shapes, c, hw = [], 3, image
    for i, v in enumerate(config):
        if v == "M":
            out = c * (hw // 2) ** 2
            shapes.append(_Shape(f"pool{i}", "MaxPool2d", 4 * out, c * hw * hw, out, 0))
            hw //= 2
            continue
        out = v * hw * hw
        shapes.append(_Shape(f"conv{i}", "Conv2d", 2 * c * v * 9 * hw * hw + out, c * hw * hw, out,
                             c * v * 9 + v))
        shapes.append(_Shape(f"relu{i}", "ReLU", out, out, out, 0))
        c = v
    features = c * hw * hw
    for j, (n_in, n_out) in enumerate([(features, 4096), (4096, 4096), (4096, classes)]):
        shapes.append(_Shape(f"fc{j}", "Linear", 2 * n_in * n_out + n_out, n_in, n_out, n_in * n_out + n_out))
        if j < 2:
            shapes.append(_Shape(f"fc{j}_relu", "ReLU", n_out, n_out, n_out, 0))
            shapes.append(_Shape(f"fc{j}_dropout", "Dropout", n_out, n_out, n_out, 0))
    return shapes


def _layer(shape: _Shape, batch: int, gpus: list[GpuType]) -> LayerProfile:
    flops = shape.flops * batch
    moved = FP32 * (batch * (shape.in_elems + shape.out_elems) + shape.params)
    return LayerProfile(
        name=shape.name, kind=shape.kind, param_bytes=FP32 * shape.params,
        output_bytes=FP32 * batch * shape.out_elems, flops_fwd=float(flops),
        fwd_s={g.name: roofline_s(flops, moved, g, layer_kind=shape.kind) for g in gpus},
        bwd_s={g.name: roofline_s(2 * flops, 2 * moved, g, layer_kind=shape.kind) for g in gpus})


def vgg_profile(model: str, batch: int, gpus: list[GpuType], image: int = 224) -> ModelProfile:
    shapes = _vgg_shapes(VGG_CONFIGS[model], image)
    layers = tuple(_layer(s, batch, gpus) for s in shapes)
    return ModelProfile(
        model=model, batch_size=batch, layers=layers,
        edges=tuple((i, i + 1) for i in range(len(layers) - 1)),
        input_bytes=FP32 * batch * 3 * image * image,
        source=(f"analytic: {model} layer shapes at {image}x{image} and datasheet peak rates with assumed "
                "efficiencies (hetsim.roofline); not measured"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(VGG_CONFIGS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--gpus", default="", help="comma-separated GPU types (default: all shipped)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    types = load_gpu_types()
    names = args.gpus.split(",") if args.gpus else sorted(types)
    save_profile(vgg_profile(args.model, args.batch, [types[n] for n in names]), args.out)


if __name__ == "__main__":
    main()
