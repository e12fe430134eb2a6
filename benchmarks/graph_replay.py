"""Host time of a model's step run eagerly against a replay of its captured graph (torch.opencl.graph).

For each of the two ways the step runs ``--iterations`` times; per iteration it reports the host time until
the step was enqueued (the Python thread's cost: the device may still be working) and the wall time until
the device finished, as medians. The train step is forward, cross-entropy and backward (the part a graph
captures; the optimizer step is left out of both); inference is a forward under ``no_grad``. The inputs sit
on the device already, so no host copy is timed. Before timing, both results are checked to be identical.

    python benchmarks/graph_replay.py --net resnet50 --batch 2 --image-size 32 --train
    TUNECL_DEVICE=nvidia python benchmarks/graph_replay.py --net resnet50 --batch 16 --train
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--train", action="store_true", help="forward, loss and backward (default: inference)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import tunecl.backend  # noqa: F401
    from tunecl.tools import model_and_inputs

    model, x, y = model_and_inputs(args.net, args.batch, args.image_size, args.train)
    model = model.to("opencl").train(args.train)
    sx, sy = x.to("opencl"), y.to("opencl")

    def eager() -> torch.Tensor:
        if args.train:
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(sx), sy)
            loss.backward()
            return loss
        with torch.no_grad():
            return model(sx)

    for _ in range(args.warmup):
        eager()
    model.zero_grad(set_to_none=True)
    g = torch.opencl.Graph()
    if args.train:
        with torch.opencl.graph(g):
            captured = F.cross_entropy(model(sx), sy)
            captured.backward()
        grads = [p.grad for p in model.parameters()]
    else:
        with torch.no_grad(), torch.opencl.graph(g):
            captured = model(sx)
    g.replay()
    replayed = captured.cpu().clone()
    expected = eager().detach().cpu()
    if args.train:   # the eager step made its own gradients; the graph keeps rewriting the captured ones
        for p, grad in zip(model.parameters(), grads):
            p.grad = grad
    if not torch.equal(replayed, expected):
        print(f"replay and eager step differ: {replayed} vs {expected}", file=sys.stderr)
        return 1

    def timed(step) -> tuple[float, float]:
        host, wall = [], []
        for _ in range(args.iterations):
            torch.opencl.synchronize()
            start = time.perf_counter()
            step()
            enqueued = time.perf_counter()
            torch.opencl.synchronize()
            host.append(enqueued - start)
            wall.append(time.perf_counter() - start)
        return statistics.median(host) * 1e3, statistics.median(wall) * 1e3

    eager_host, eager_wall = timed(eager)
    if args.train:
        for p, grad in zip(model.parameters(), grads):
            p.grad = grad
    replay_host, replay_wall = timed(g.replay)
    mode = "train (forward, loss, backward)" if args.train else "inference"
    print(f"{args.net} batch {args.batch} image {args.image_size} {mode} on {torch.opencl.get_device_name()}: "
          f"{g.commands} commands per step, graph holds {g.nbytes / 2**20:.1f} MiB; "
          f"median of {args.iterations}, ms")
    print(f"{'':8}{'host':>10}{'wall':>10}")
    print(f"{'eager':8}{eager_host:10.2f}{eager_wall:10.2f}")
    print(f"{'replay':8}{replay_host:10.2f}{replay_wall:10.2f}")
    print(f"host time eager / replay: {eager_host / replay_host:.1f}x; results identical")
    g.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
