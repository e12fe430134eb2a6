"""Training batch norm (forward statistics + normalise, then backward) on resnet50's shapes, device time.

For each shape, ``--iterations`` forward+backward passes of ``F.batch_norm(training=True)`` on the opencl
device, every kernel timed by its profiling event (:class:`tunecl.profiling.KernelProfile`), so host cost
is left out; next to it the peer measured in the same run: torch on CUDA (cuDNN's batch norm, timed by
CUDA events) where CUDA exists, else torch on the CPU (wall time). Also the effective bandwidth: a
forward+backward must read x three times, read dy twice and write y and dx once each (8 passes over the
tensor), so ``GB/s = 8 * 4 * numel / time``.

    python benchmarks/batch_norm.py --device nvidia --batch 64
    python benchmarks/batch_norm.py --batch 2 --iterations 3      # PoCL, small
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

# (channels, height/width) of resnet50's batch norms at 224x224, each once
RESNET50 = [(64, 112), (64, 56), (256, 56), (128, 56), (128, 28), (512, 28), (256, 28), (256, 14),
            (1024, 14), (512, 14), (512, 7), (2048, 7)]
PASSES = 8  # tensor-sized reads and writes of one training forward+backward (module docstring)


def _inputs(device: str, n: int, c: int, hw: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, hw, hw, generator=generator) * 2 + 0.5
    dy = torch.randn(n, c, hw, hw, generator=generator)
    weight, bias = torch.rand(c, generator=generator) + 0.5, torch.randn(c, generator=generator)
    return [t.to(device) for t in (x, dy, weight, bias)]


def _step(x, dy, weight, bias):
    x = x.detach().requires_grad_()
    weight, bias = weight.detach().requires_grad_(), bias.detach().requires_grad_()
    mean, var = torch.zeros_like(weight), torch.ones_like(weight)
    y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5)
    y.backward(dy)
    return y, x.grad


def opencl_seconds(n: int, c: int, hw: int, iterations: int, seed: int) -> tuple[float, float]:
    """Device seconds per forward+backward (median of the iterations), and the worst error against CPU."""
    from tunecl.profiling import KernelProfile

    tensors = _inputs("opencl", n, c, hw, seed)
    y, dx = _step(*tensors)  # warm-up: compiles
    cpu_y, cpu_dx = _step(*[t.cpu() for t in tensors])
    error = max((y.cpu() - cpu_y).abs().max().item(), (dx.cpu() - cpu_dx).abs().max().item())
    times = []
    for _ in range(iterations):
        with KernelProfile() as profile:
            _step(*tensors)
        times.append(sum(row.seconds for row in profile.summary()))
    return statistics.median(times), error


def peer_seconds(n: int, c: int, hw: int, iterations: int, seed: int) -> tuple[str, float]:
    if torch.cuda.is_available():
        tensors = _inputs("cuda", n, c, hw, seed)
        _step(*tensors)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(iterations):
            start.record()
            _step(*tensors)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return "torch cuda", statistics.median(times)
    tensors = _inputs("cpu", n, c, hw, seed)
    _step(*tensors)
    times = []
    for _ in range(iterations):
        begin = time.perf_counter()
        _step(*tensors)
        times.append(time.perf_counter() - begin)
    return "torch cpu", statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="device selector (default: TUNECL_DEVICE or 0)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--shapes", nargs="*", metavar="C,HW", help="channels,height instead of resnet50's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else RESNET50
    # the peer first: once the opencl backend is registered, autograd on CUDA tensors trips an internal
    # assert of torch's engine (a stream guard for the second device type), so CUDA runs before it
    peers = [peer_seconds(args.batch, c, hw, args.iterations, args.seed) for c, hw in shapes]
    if args.device is not None:
        import os
        os.environ["TUNECL_DEVICE"] = args.device
    import tunecl.backend  # noqa: F401  (after TUNECL_DEVICE is set)

    print(f"batch norm, training forward+backward, batch {args.batch}, median of {args.iterations}; "
          f"device {torch.opencl.get_device_name()}")
    print(f"{'shape':>20}  {'tunecl ms':>9}  {'GB/s':>7}  {'peer':>10}  {'peer ms':>8}  {'ratio':>6}  {'max err':>8}")
    rows, ours_total, peer_total = [], 0.0, 0.0
    for (c, hw), (peer, theirs) in zip(shapes, peers, strict=True):
        ours, error = opencl_seconds(args.batch, c, hw, args.iterations, args.seed)
        numel = args.batch * c * hw * hw
        bandwidth = PASSES * 4 * numel / ours * 1e-9
        ours_total, peer_total = ours_total + ours, peer_total + theirs
        shape = f"{args.batch}x{c}x{hw}x{hw}"
        print(f"{shape:>20}  {ours * 1e3:>9.3f}  {bandwidth:>7.0f}  {peer:>10}  {theirs * 1e3:>8.3f}  "
              f"{ours / theirs:>6.2f}  {error:>8.1e}")
        rows.append({"shape": [args.batch, c, hw, hw], "tunecl_s": ours, "gbps": bandwidth, "peer": peer,
                     "peer_s": theirs, "max_abs_error": error})
    print(f"{'sum':>20}  {ours_total * 1e3:>9.3f}  {'':>7}  {'':>10}  {peer_total * 1e3:>8.3f}  "
          f"{ours_total / peer_total:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": args.batch, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
