"""Training-step benchmark: a torchvision model's SGD step on ``opencl`` next to CPU torch.

Three rows, measured in the same run: the step on ``opencl`` with convolutions on the device (conv
plans from the tuning DB's lookup chain, else the heuristic defaults), the same with convolutions
forced onto the CPU route (the backend's counted fallback), and plain CPU torch (the peer). The
first step (plan lookup and kernel builds) is reported apart; the others are medians.

    python benchmarks/train_step.py --net resnet18 --batch 1 --image-size 64 --steps 5
    TUNECL_DB=tuned.sqlite python benchmarks/train_step.py      # with tuned conv plans
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def time_steps(device: str, net: str, batch: int, image_size: int, steps: int) -> tuple[float, list[float]]:
    """(first step, later steps) in seconds for an SGD step of ``net`` on ``device``."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, net)(num_classes=10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch, 3, image_size, image_size).to(device)
    y = torch.randint(0, 10, (batch,)).to(device)

    def step() -> float:
        started = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if device == "opencl":
            torch.opencl.synchronize()
        return time.perf_counter() - started

    first = step()
    return first, [step() for _ in range(steps)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet18")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("TUNECL_FALLBACK", "silent")

    import tunecl.backend
    from tunecl.backend.ops import conv
    from tunecl.errors import Unsupported

    rows = {}
    rows["opencl, conv on the device"] = time_steps("opencl", args.net, args.batch, args.image_size, args.steps)
    sources = tunecl.backend.stats()["plan_counts"]

    def cpu_route(*_args: object, **_kwargs: object) -> None:
        raise Unsupported("benchmark: convolution on the CPU route")

    device_forward, device_backward = conv._forward, conv._backward
    conv._forward = conv._backward = cpu_route
    try:
        rows["opencl, conv on the CPU route"] = time_steps("opencl", args.net, args.batch, args.image_size,
                                                           args.steps)
    finally:
        conv._forward, conv._backward = device_forward, device_backward
    rows["CPU torch (peer)"] = time_steps("cpu", args.net, args.batch, args.image_size, args.steps)

    peer = statistics.median(rows["CPU torch (peer)"][1])
    print(f"{args.net} batch {args.batch} image {args.image_size}: SGD step, median of {args.steps} "
          f"(conv plans by source: {sources})")
    for name, (first, later) in rows.items():
        median = statistics.median(later)
        print(f"  {name:32s} first {first * 1e3:8.0f} ms   step {median * 1e3:8.1f} ms   "
              f"{median / peer:6.2f}x CPU torch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
