"""The elementwise ops of a training step (relu, its backward, the residual add) on resnet50's activation
sizes, device time and bandwidth.

For each op and size, ``--iterations`` launches on the opencl device, each timed by its profiling event
(:class:`tunecl.profiling.KernelProfile`), so host cost is left out; next to it the peer measured in the
same run: torch on CUDA (timed by CUDA events) where CUDA exists, else torch on the CPU (wall time).
``GB/s`` counts each tensor operand read or written once (relu 2 passes over the tensor, the others 3).
Every result is checked against CPU torch first.

    python benchmarks/pointwise.py --device nvidia            # batch 64
    python benchmarks/pointwise.py --batch 2 --iterations 3   # PoCL, small
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

# (channels, height/width) of resnet50's larger activations at 224x224
SIZES = [(64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)]
# name -> (function of the tensors a, b, tensor operands read + written)
OPS = {
    "relu": (lambda a, b: torch.relu(a), 2),
    "threshold_backward": (lambda a, b: torch.ops.aten.threshold_backward(b, a, 0.0), 3),
    "add": (lambda a, b: torch.add(a, b), 3),
}


def _inputs(device: str, numel: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(numel, generator=generator).to(device) for _ in range(2))


def opencl_seconds(op: str, numel: int, iterations: int, seed: int) -> float:
    """Device seconds of one launch (median of the iterations); raises if the result is not CPU torch's."""
    from tunecl.profiling import KernelProfile

    fn = OPS[op][0]
    a, b = _inputs("opencl", numel, seed)
    got = fn(a, b).cpu()   # (and compiles)
    if not torch.equal(got, fn(a.cpu(), b.cpu())):
        raise SystemExit(f"{op}: the opencl result differs from CPU torch's")
    times = []
    for _ in range(iterations):
        with KernelProfile() as profile:
            fn(a, b)
            torch.opencl.synchronize()   # (elementwise launches may wait for the queue's next use)
        times.append(sum(row.seconds for row in profile.summary()))
    return statistics.median(times)


def peer_seconds(op: str, numel: int, iterations: int, seed: int) -> tuple[str, float]:
    fn = OPS[op][0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = _inputs(device, numel, seed)
    fn(a, b)
    times = []
    for _ in range(iterations):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            begin = time.perf_counter()
            fn(a, b)
            times.append(time.perf_counter() - begin)
    return f"torch {device}", statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="device selector (default: TUNECL_DEVICE or 0)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--ops", nargs="*", choices=sorted(OPS), default=list(OPS))
    parser.add_argument("--sizes", nargs="*", metavar="C,HW", help="channels,height instead of resnet50's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    cases = [(op, c, hw) for op in args.ops for c, hw in sizes]
    # the peer first, before the opencl backend is imported (as benchmarks/batch_norm.py does)
    peers = [peer_seconds(op, args.batch * c * hw * hw, args.iterations, args.seed) for op, c, hw in cases]
    if args.device is not None:
        import os
        os.environ["TUNECL_DEVICE"] = args.device
    import tunecl.backend  # noqa: F401  (after TUNECL_DEVICE is set)

    print(f"elementwise ops, batch {args.batch}, median of {args.iterations}; device {torch.opencl.get_device_name()}")
    print(f"{'op':>18}  {'shape':>16}  {'tunecl ms':>9}  {'GB/s':>6}  {'peer':>10}  {'peer ms':>8}  {'GB/s':>6}  {'ratio':>6}")
    rows, ours_total, peer_total = [], 0.0, 0.0
    for (op, c, hw), (peer, theirs) in zip(cases, peers, strict=True):
        numel = args.batch * c * hw * hw
        ours = opencl_seconds(op, numel, args.iterations, args.seed)
        nbytes = OPS[op][1] * 4 * numel
        ours_total, peer_total = ours_total + ours, peer_total + theirs
        shape = f"{args.batch}x{c}x{hw}x{hw}"
        print(f"{op:>18}  {shape:>16}  {ours * 1e3:>9.3f}  {nbytes / ours * 1e-9:>6.0f}  {peer:>10}  "
              f"{theirs * 1e3:>8.3f}  {nbytes / theirs * 1e-9:>6.0f}  {ours / theirs:>6.2f}")
        rows.append({"op": op, "shape": [args.batch, c, hw, hw], "tunecl_s": ours, "peer": peer, "peer_s": theirs,
                     "bytes": nbytes})
    print(f"{'sum':>18}  {'':>16}  {ours_total * 1e3:>9.3f}  {'':>6}  {'':>10}  {peer_total * 1e3:>8.3f}  {'':>6}  "
          f"{ours_total / peer_total:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": args.batch, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
