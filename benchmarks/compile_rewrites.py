"""Which of ``torch.compile(backend="tunecl")``'s graph rewrites changes a net's gradients: one training step's
parameter gradients, compiled with every rewrite and with each rewrite off in turn, against the same step run
eagerly on the device.

Every run starts from the same weights and batch (a copy of one model); a compiled run makes ``--calls``
steps (the first runs the graphs eagerly, the second captures them, later ones replay) and the last one's
gradients are compared. Per variant it prints how many parameters' gradients differ from the eager ones by
more than ``--tolerance`` relative to the eager gradient's largest magnitude, and the worst three. Eager on
the device against CPU torch is printed first as the yardstick (at small images a net's batch norms see few
values and fp32 differences grow; ``tunecl validate`` judges that case with float64 references).

    python benchmarks/compile_rewrites.py --net regnet_y_400mf --batch 2 --image-size 32
    TUNECL_DEVICE=nvidia python benchmarks/compile_rewrites.py --net regnet_y_400mf --variants all,-fuse_pointwise
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def gradients(model, x, y, device: str, options: dict | None = None, calls: int = 1) -> tuple[float, dict]:
    """The loss and the parameters' gradients (on the CPU) of the last of ``calls`` training steps of a copy of
    ``model`` on ``device``, compiled with tunecl's ``options`` unless None."""
    import torch

    m = copy.deepcopy(model).to(device)
    run = m if options is None else torch.compile(m, backend="tunecl", options=options)
    xd, yd = x.to(device), y.to(device)
    for _ in range(calls):
        for p in m.parameters():
            p.grad = None
        loss = torch.nn.functional.cross_entropy(run(xd), yd)
        loss.backward()
    return loss.item(), {n: p.grad.detach().cpu() for n, p in m.named_parameters() if p.grad is not None}


def compare(got: dict, want: dict, tolerance: float) -> tuple[int, list[tuple[str, float]]]:
    """How many of ``want``'s gradients ``got`` misses or differs from by more than ``tolerance`` (relative to
    the largest magnitude of ``want``'s), and the worst three (name, relative difference)."""
    relative = {}
    for name, w in want.items():
        g = got.get(name)
        scale = w.abs().max().item() or 1.0
        relative[name] = float("inf") if g is None else (g - w).abs().max().item() / scale
    worst = sorted(relative.items(), key=lambda item: -item[1])[:3]
    return sum(v > tolerance for v in relative.values()), worst


def main(argv: list[str] | None = None) -> int:
    from tunecl.backend.compile import REWRITES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="regnet_y_400mf")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--variants", default=None, metavar="all,-NAME,...",
                        help=f"'all' (every rewrite) and '-NAME' (NAME off; of {', '.join(REWRITES)}); "
                             f"default: all, then each off")
    parser.add_argument("--calls", type=int, default=3, help="compiled steps per variant, the last compared")
    parser.add_argument("--tolerance", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    variants = args.variants.split(",") if args.variants else ["all"] + [f"-{r}" for r in REWRITES]
    unknown = [v for v in variants if v != "all" and (not v.startswith("-") or v[1:] not in REWRITES)]
    if unknown:
        parser.error(f"unknown variants {unknown}: 'all' or '-NAME' with NAME one of {', '.join(REWRITES)}")

    import torch

    import tunecl.backend  # noqa: F401
    from tunecl.tools import model_and_inputs

    torch.manual_seed(args.seed)
    model, x, y = model_and_inputs(args.net, args.batch, args.image_size, train=True)
    model.train()
    start = time.perf_counter()
    cpu_loss, cpu = gradients(model, x, y, "cpu")
    eager_loss, eager = gradients(model, x, y, "opencl")
    print(f"{args.net} batch {args.batch} image {args.image_size} train step on {torch.opencl.get_device_name()}: "
          f"{len(eager)} parameter gradients; differing: relative difference above {args.tolerance:g}")
    print(f"  {'eager vs CPU':30s} loss {eager_loss:.6f} vs {cpu_loss:.6f}  "
          + _line(*compare(eager, cpu, args.tolerance), len(cpu)))
    for variant in variants:
        torch._dynamo.reset()
        options = {} if variant == "all" else {variant[1:]: False}
        label = f"compiled {variant} vs eager"
        try:
            loss, got = gradients(model, x, y, "opencl", options, calls=args.calls)
        except Exception as error:   # noqa: BLE001 (a variant that fails is reported, the next one runs)
            print(f"  {label:30s} failed: {type(error).__name__}: {str(error)[:200]}")
            continue
        print(f"  {label:30s} loss {loss:.6f}  " + _line(*compare(got, eager, args.tolerance), len(eager))
              + f"  ({time.perf_counter() - start:.0f} s)")
    return 0


def _line(differing: int, worst: list[tuple[str, float]], total: int) -> str:
    return f"differing {differing}/{total}; worst: " + ", ".join(f"{n} {v:.2g}" for n, v in worst)


if __name__ == "__main__":
    sys.exit(main())
