"""How far apart two correct float32 runs are, measured against float64: the yardstick for validate.

``tunecl validate`` passes a tensor when the device's normwise error against a float64 run is at most
8x CPU torch float32's. This script measures the same ratio between two correct float32
implementations, both CPU torch: the default memory layout and channels_last (other conv kernels,
other summation orders). No OpenCL device is used. Where the ratio between two correct runs exceeds
the multiplier, validate cannot judge that tensor at this batch and image size.

    python benchmarks/fp32_spread.py --net shufflenet_v2_x1_0 --image-size 32 --seed 0
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl.tools import load_model, make_inputs, output_classes
from tunecl.tools.tolerances import normwise_error


def train_step_tensors(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> dict:
    """Output, loss and every parameter gradient of one train-mode forward and backward."""
    torch.manual_seed(seed)
    model.train()
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    tensors = {"output": out.detach(), "loss": loss.detach()}
    tensors.update({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multiplier", type=float, default=8.0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    default = load_model(args.net)
    channels_last = copy.deepcopy(default).to(memory_format=torch.channels_last)
    exact = copy.deepcopy(default).double()
    x, y = make_inputs(args.batch, args.image_size, output_classes(default, args.batch, args.image_size, True),
                       args.seed)
    ref = train_step_tensors(exact, x.double(), y, args.seed)
    a = train_step_tensors(default, x, y, args.seed)
    b = train_step_tensors(channels_last, x.to(memory_format=torch.channels_last), y, args.seed)

    rows = []
    for name, r in ref.items():
        err_a, err_b = normwise_error(a[name], r), normwise_error(b[name], r)
        rows.append((err_b / err_a if err_a > 0 else (1.0 if err_b == 0 else float("inf")), name, err_a, err_b))
    rows.sort(reverse=True)
    over = sum(ratio > args.multiplier for ratio, *_ in rows)
    print(f"{args.net}, batch {args.batch}, image {args.image_size}, seed {args.seed}, train step: "
          f"err64 = ||x - float64|| / ||float64|| of {len(rows)} tensors")
    print(f"ratio err64(channels_last) / err64(default): median {rows[len(rows) // 2][0]:.3g}, "
          f"max {rows[0][0]:.3g}; over {args.multiplier:g}: {over}")
    print(f"{'tensor':50s} {'ratio':>9s} {'err64 default':>14s} {'err64 channels_last':>20s}")
    for ratio, name, err_a, err_b in rows[:10]:
        print(f"{name[:50]:50s} {ratio:9.3g} {err_a:14.3e} {err_b:20.3e}")


if __name__ == "__main__":
    main()
