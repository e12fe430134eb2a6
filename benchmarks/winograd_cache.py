"""Winograd weight cache on and off: an eval-mode stack of resnet-like 3×3 conv layers on the opencl device.

``--layers`` convolutions of ``--channels`` → ``--channels`` on ``--size``² images (stride 1, padding 1,
each followed by ReLU), batch ``--batch``, under ``torch.no_grad()``. Every layer's shape is served the
chosen Winograd family (``--algorithm``: ``conv_winograd`` = F(2×2,3×3), ``conv_winograd_f4`` =
F(4×4,3×3)) at its default config through a throw-away tuning DB, so both runs execute the same plans
and differ only in whether the filter transform runs on every call (``TUNECL_WINOGRAD_CACHE=off``) or
once per weight (``auto``, the default, which caches a ``no_grad`` forward). Each figure is the median of ``--repeats`` forwards (synchronized) after a
warm-up; the printed ratio is off / on.

    python benchmarks/winograd_cache.py                         # 512 channels, 7×7, batch 1
    python benchmarks/winograd_cache.py --channels 64 --size 56 --algorithm conv_winograd_f4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=512)
    parser.add_argument("--size", type=int, default=7)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--algorithm", default="conv_winograd", choices=["conv_winograd", "conv_winograd_f4"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)

    scratch = tempfile.mkdtemp(prefix="winograd_cache_")
    os.environ.update(TUNECL_DB=os.path.join(scratch, "tuning.sqlite"),
                      TUNECL_STORAGE=os.path.join(scratch, "studies.sqlite"), TUNECL_SHIPPED_DB="",
                      TUNECL_TUNE="off", TUNECL_FALLBACK="error")

    import torch

    import tunecl.backend
    from tunecl import config
    from tunecl.backend import state, weight_cache
    from tunecl.db import TuningDB
    from tunecl.kernels import algorithm
    from tunecl.problems import ConvProblem

    device = state.get().device
    problem = ConvProblem(args.batch, args.channels, args.size, args.size, args.channels, 3, 3, padding=1)
    family = algorithm(args.algorithm)
    if not family.applies(problem, device):
        print(f"{args.algorithm} does not apply to {problem.key} on {device.name}")
        return 1
    TuningDB(config.get().db_url).record(device.fingerprint, problem, family.name, family.version,
                                         family.default(problem, device), time_s=1.0)

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Conv2d(args.channels, args.channels, 3, padding=1), torch.nn.ReLU(inplace=True)]
    model = torch.nn.Sequential(*layers).eval().to("opencl")
    x = torch.randn(problem.input_shape).to("opencl")

    def forward_ms(mode: str) -> tuple[float, torch.Tensor]:
        weight_cache.clear()
        times = []
        with config.override(winograd_cache=mode), torch.no_grad():
            for i in range(args.warmup + args.repeats):
                torch.opencl.synchronize()
                start = time.perf_counter()
                y = model(x)
                torch.opencl.synchronize()
                if i >= args.warmup:
                    times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), y.cpu()

    off_ms, y_off = forward_ms("off")
    on_ms, y_on = forward_ms("auto")   # the default: on for a no_grad forward
    cache = weight_cache.stats()
    assert tunecl.backend.stats()["plans"][problem.key]["algorithm"] == args.algorithm
    same = torch.equal(y_off, y_on)
    print(f"{device.name}: {args.layers} × conv3x3 {args.channels}→{args.channels} on {args.size}×{args.size}, "
          f"batch {args.batch}, {args.algorithm}, eval/no_grad, median of {args.repeats}")
    print(f"  cache off:       {off_ms:9.3f} ms/forward")
    print(f"  cache on (auto): {on_ms:9.3f} ms/forward   ({cache['entries']} transformed weights, "
          f"{cache['bytes'] / 2**20:.2f} MiB held, {cache.get('hits', 0)} hits)")
    print(f"  ratio off/on: {off_ms / on_ms:.2f}×   outputs bit-identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
