"""Where the host's time goes in a model's iteration on the opencl device (Python's cProfile).

On a GPU, small and medium nets are bound by the host: ``tunecl bench --profile`` shows the device idle
for most of the wall time. This prints, for ``--iterations`` inference (or ``--train``) iterations after
a warm-up, the wall time per iteration with and without the profiler, and the functions with the most
self time (``tottime``) and cumulative time per iteration, so the cost of dispatch, plan lookup,
allocation and kernel enqueueing can be told apart. cProfile sees the calling thread only, and autograd
runs a device's backward ops on a thread of its own: with ``--train`` the profiled iterations therefore
run backward on the calling thread (``torch.autograd.set_multithreading_enabled(False)``, which does the
same work one thread over), so the tables cover forward, backward and the optimizer.
``--torch-profiler`` instead prints torch's per-op host time over every thread (self CPU time per ATen
op, which includes tunecl's Python kernels). ``--precision tf32`` allows TF32 convolutions and matmuls
(torch's flags, as ``tunecl bench --precision tf32``); the default is strict fp32.

    python benchmarks/host_profile.py --net resnet50 --batch 16              # default device
    TUNECL_DEVICE=nvidia python benchmarks/host_profile.py --net resnet50 --batch 16 --top 30
    python benchmarks/host_profile.py --net resnet50 --batch 2 --image-size 32 --train --torch-profiler
    TUNECL_DEVICE=nvidia python benchmarks/host_profile.py --net resnet50 --batch 64 --train --precision tf32
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--train", action="store_true", help="forward, loss, backward, Adam step")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--top", type=int, default=25, help="functions listed per table")
    parser.add_argument("--torch-profiler", action="store_true",
                        help="torch.profiler's per-op host time (all threads) instead of cProfile")
    parser.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                        help="tf32: torch's TF32 flags on for convolutions and matmuls (default: fp32, off)")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"

    import tunecl.backend  # noqa: F401
    from tunecl.tools import model_and_inputs

    model, x, y = model_and_inputs(args.net, args.batch, args.image_size, args.train)
    model = model.to("opencl").train(args.train)
    if args.train:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def iteration() -> None:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x.to("opencl")), y.to("opencl")).backward()
            optimizer.step()
            torch.opencl.synchronize()
    else:
        def iteration() -> None:
            with torch.no_grad():
                model(x.to("opencl")).cpu()

    for _ in range(args.warmup):
        iteration()
    start = time.perf_counter()
    for _ in range(args.iterations):
        iteration()
    plain = (time.perf_counter() - start) / args.iterations
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.iterations):
                iteration()
        profiled = (time.perf_counter() - start) / args.iterations
        print(f"{args.net} batch {args.batch} image {args.image_size} {'train' if args.train else 'inference'} "
              f"on {torch.opencl.get_device_name()}: {plain * 1e3:.2f} ms per iteration, {profiled * 1e3:.2f} ms "
              f"under torch.profiler; totals over {args.iterations} iterations")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
        return 0
    profiler = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):  # backward on this thread, where cProfile looks
        start = time.perf_counter()
        for _ in range(args.iterations):
            iteration()
        one_thread = (time.perf_counter() - start) / args.iterations
        start = time.perf_counter()
        profiler.enable()
        for _ in range(args.iterations):
            iteration()
        profiler.disable()
        profiled = (time.perf_counter() - start) / args.iterations
    print(f"{args.net} batch {args.batch} image {args.image_size} {'train' if args.train else 'inference'} "
          f"{args.precision} on {torch.opencl.get_device_name()}: {plain * 1e3:.2f} ms per iteration, "
          + (f"{one_thread * 1e3:.2f} ms with backward on the calling thread, " if args.train else "")
          + f"{profiled * 1e3:.2f} ms under cProfile; times below are totals over {args.iterations} iterations")
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).strip_dirs().sort_stats(order).print_stats(args.top)
        print(f"\n== by {order} ==")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:20000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
