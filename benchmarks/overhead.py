"""Host overhead per small op: the opencl backend next to CPU torch, measured in the same run.

Each case runs N ops on 16-float tensors (default 10,000 adds) and reports µs per op:

- ``cpu``: plain CPU torch, the peer;
- ``opencl``: wall time until the last op has *finished* on the device (synchronize included);
- ``host``: the time the Python thread spent enqueueing (before the final synchronize), i.e. the
  backend's host cost per op when the device keeps up;
- ``ratio``: opencl / cpu;
- ``thread``: the CPU time of the enqueueing thread per op (``time.thread_time``), with its spread
  (min-max over the rounds): on PoCL, whose workers share the cores, the steadiest measure of host cost.

Every number is the median of ``--repeats`` rounds after a warm-up. On a CPU OpenCL device (PoCL)
the device shares the host's cores, so ``opencl`` also includes kernel execution competing with
the host thread; on a GPU ``host`` is what limits small ops.

    python benchmarks/overhead.py                 # default device (TUNECL_DEVICE)
    python benchmarks/overhead.py --ops 20000 --repeats 7
    TUNECL_LAUNCH_BATCH=0 python benchmarks/overhead.py   # every launch enqueued at once (no batching)

``--layers`` adds the ops that dominate a convolutional net's step, on a small 2x64x8x8 activation
(``--layer-ops`` calls per round, default 500): convolution forward (3x3 and 1x1) and backward, batch norm
forward (training) and backward. Their host cost is what bounds an eager training step on a GPU (resnet50
calls each about 53 times per step); on PoCL the device's kernels share the cores, so there only ``host``
says something, and the CPU peer's time is mostly its arithmetic.

    python benchmarks/overhead.py --layers --only conv    # the layer cases whose name contains "conv"

``--transformer`` adds a transformer block's ops on 2 sequences of 16 tokens of width 64 (4 heads of 16):
``F.linear`` on a 3-D input with bias, GELU, layer norm forward and backward, dropout in training, and
scaled dot-product attention forward alone and forward plus backward (through autograd, the same on both
sides). BERT-base calls each of them 12 to 74 times per training step.

    python benchmarks/overhead.py --transformer --ops 100

On CPU devices the backend's elementwise launches and reductions are enqueued in batches
(``TUNECL_LAUNCH_BATCH``, ``Device.defer``); the header says which batch this run used, and with a
batch the ``unbatched`` column times each case with batching off in rounds interleaved with the others.

Where torch has CUDA, the ``cuda host µs`` column is torch CUDA's own host cost for the same calls (the
time to enqueue them, synchronize excluded, as ``host``), measured in a child process that never imports
``tunecl.backend``, with the same ops, rounds and medians; elsewhere it shows ``-``.

``--record FILE.csv`` appends the figures to a host-time results CSV (``benchmarks/results/host.csv``'s
columns, ``tunecl.tools.record.HOST_COLUMNS``): per case, the time to completion next to CPU torch, the host
time (next to torch CUDA's where measured), the thread CPU time and, with a batch, the unbatched time; and
the ``a.add_(b)`` breakdown. Each row holds the median, the spread over the rounds and the load average.

    python benchmarks/overhead.py --ops 2000 --record benchmarks/results/host.csv
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import torch

from tunecl.tools import record


def _time(fn: Callable[[], object], n: int, sync: Callable[[], None]) -> tuple[float, float]:
    """(host µs/op, total µs/op) of ``n`` calls of ``fn``."""
    host, total, _ = _time3(fn, n, sync)
    return host, total


def _time3(fn: Callable[[], object], n: int, sync: Callable[[], None]) -> tuple[float, float, float]:
    """(host µs/op, total µs/op, thread µs/op) of ``n`` calls of ``fn``; thread: the CPU time of the
    calling thread while it enqueued (on PoCL the device's worker threads are not counted, only the
    backend's Python and the driver's enqueue calls)."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    enqueued, cpu_enqueued = time.perf_counter(), time.thread_time()
    sync()
    done = time.perf_counter()
    return (enqueued - start) / n * 1e6, (done - start) / n * 1e6, (cpu_enqueued - cpu_start) / n * 1e6


def _cases(size: int) -> dict[str, Callable[[torch.device], Callable[[], object]]]:
    def binary(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.device], Callable]:
        def make(device: torch.device) -> Callable[[], object]:
            a, b = torch.randn(size, device=device), torch.randn(size, device=device)
            return lambda: op(a, b)
        return make

    def unary(op: Callable[[torch.Tensor], torch.Tensor], requires_grad: bool = False) -> Callable:
        def make(device: torch.device) -> Callable[[], object]:
            a = torch.randn(size, device=device, requires_grad=requires_grad)
            return lambda: op(a)
        return make

    def inplace(device: torch.device) -> Callable[[], object]:
        a, b = torch.randn(size, device=device), torch.randn(size, device=device)
        return lambda: a.add_(b, alpha=1e-6)

    return {
        "a + b": binary(torch.add),
        "a.add_(b)": inplace,
        "a * 2.0": unary(lambda a: a * 2.0),
        "relu(a)": unary(torch.relu),
        "a.sum()": unary(torch.sum),
        "a + b (requires_grad)": unary(lambda a: a + a, requires_grad=True),
    }


def _on_tensors(tensors: Callable[[torch.device], dict[str, torch.Tensor]]) -> Callable:
    """``case(op)`` for a case set whose ops read the named tensors ``tensors(device)`` makes: the case's
    maker builds them on the device and returns the call of ``op`` on them."""
    def case(op: Callable[[dict[str, torch.Tensor]], object]) -> Callable[[torch.device], Callable[[], object]]:
        def make(device: torch.device) -> Callable[[], object]:
            t = tensors(device)
            return lambda: op(t)
        return make
    return case


def _layer_cases() -> dict[str, Callable[[torch.device], Callable[[], object]]]:
    """A resnet-like layer's ops on a 2x64x8x8 activation (the ``--layers`` cases)."""
    aten = torch.ops.aten

    def tensors(device: torch.device) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        made = {"x": (2, 64, 8, 8), "dy": (2, 64, 8, 8), "w": (64, 64, 3, 3), "w1": (256, 64, 1, 1),
                "gamma": (64,), "beta": (64,)}
        t = {k: torch.randn(shape, generator=g).to(device) for k, shape in made.items()}
        t["mean"], t["var"] = torch.zeros(64, device=device), torch.ones(64, device=device)
        _, t["save_mean"], t["save_invstd"] = aten.native_batch_norm(t["x"], t["gamma"], t["beta"], t["mean"],
                                                                     t["var"], True, 0.1, 1e-5)
        return t

    case = _on_tensors(tensors)

    return {
        "conv2d 3x3 64->64": case(lambda t: aten.convolution(t["x"], t["w"], None, [1, 1], [1, 1], [1, 1], False,
                                                             [0, 0], 1)),
        "conv2d 1x1 64->256": case(lambda t: aten.convolution(t["x"], t["w1"], None, [1, 1], [0, 0], [1, 1],
                                                              False, [0, 0], 1)),
        "conv2d 3x3 backward": case(lambda t: aten.convolution_backward(
            t["dy"], t["x"], t["w"], None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])),
        "batch_norm (train)": case(lambda t: aten.native_batch_norm(t["x"], t["gamma"], t["beta"], t["mean"],
                                                                    t["var"], True, 0.1, 1e-5)),
        "batch_norm backward": case(lambda t: aten.native_batch_norm_backward(
            t["dy"], t["x"], t["gamma"], t["mean"], t["var"], t["save_mean"], t["save_invstd"], True, 1e-5,
            [True, True, True])),
    }


def _transformer_cases() -> dict[str, Callable[[torch.device], Callable[[], object]]]:
    """A transformer block's ops on 2 sequences of 16 tokens of width 64, 4 heads (the ``--transformer``
    cases)."""
    aten = torch.ops.aten
    F = torch.nn.functional

    def tensors(device: torch.device) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        made = {"x": (2, 16, 64), "dx": (2, 16, 64), "w": (256, 64), "b": (256,), "h": (2, 16, 256),
                "gamma": (64,), "beta": (64,), "q": (2, 4, 16, 16), "k": (2, 4, 16, 16), "v": (2, 4, 16, 16),
                "do": (2, 4, 16, 16)}
        t = {k: torch.randn(shape, generator=g).to(device) for k, shape in made.items()}
        _, t["mean"], t["rstd"] = aten.native_layer_norm(t["x"], [64], t["gamma"], t["beta"], 1e-12)
        for name in ("qg", "kg", "vg"):
            t[name] = t[name[0]].clone().requires_grad_()
        return t

    case = _on_tensors(tensors)

    def attention_step(t: dict[str, torch.Tensor]) -> None:
        out = F.scaled_dot_product_attention(t["qg"], t["kg"], t["vg"])
        torch.autograd.backward(out, t["do"])
        for name in ("qg", "kg", "vg"):
            t[name].grad = None

    return {
        "linear 64->256 (3-D)": case(lambda t: F.linear(t["x"], t["w"], t["b"])),
        "gelu": case(lambda t: F.gelu(t["h"])),
        "layer_norm": case(lambda t: aten.native_layer_norm(t["x"], [64], t["gamma"], t["beta"], 1e-12)),
        "layer_norm backward": case(lambda t: aten.native_layer_norm_backward(
            t["dx"], t["x"], [64], t["mean"], t["rstd"], t["gamma"], t["beta"], [True, True, True])),
        "dropout (train)": case(lambda t: F.dropout(t["x"], 0.1, training=True)),
        "sdpa forward": case(lambda t: F.scaled_dot_product_attention(t["q"], t["k"], t["v"])),
        "sdpa forward+backward": case(attention_step),
    }


def _selected(args: argparse.Namespace) -> list[tuple[str, Callable[[torch.device], Callable[[], object]], int]]:
    """(name, make, calls per round) of every case this run times."""
    cases = [(name, make, args.ops) for name, make in _cases(args.size).items()]
    if args.layers:
        cases += [(name, make, args.layer_ops) for name, make in _layer_cases().items()]
    if args.transformer:
        cases += [(name, make, args.layer_ops) for name, make in _transformer_cases().items()]
    return [case for case in cases if not args.only or args.only in case[0]]


def peer_host_times(args: argparse.Namespace, device: str) -> dict[str, float]:
    """Median host µs per call of each selected case on plain torch ``device`` (the CUDA column)."""
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.set_grad_enabled(True)
    medians = {}
    for name, make, ops in _selected(args):
        fn = make(dev)
        _time(fn, min(500, ops), sync)   # warm-up
        medians[name] = statistics.median(_time(fn, ops, sync)[0] for _ in range(args.repeats))
    return medians


def _cuda_peer(argv: list[str]) -> dict[str, float] | None:
    """The CUDA column: this script's cases timed by torch CUDA in a child process without tunecl.backend
    (None when torch has no CUDA here)."""
    if not torch.cuda.is_available():
        return None
    done = subprocess.run([sys.executable, __file__, "--peer-device", "cuda", *argv], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _breakdown(args: argparse.Namespace, dev: torch.device) -> dict[str, list[float]]:
    """Split ``a.add_(b)`` into the backend's Python work and the OpenCL enqueue itself (µs per call of each
    round, by part)."""
    from tunecl.backend import state

    pointwise = state.get().pointwise
    a, b = torch.randn(args.size, device=dev), torch.randn(args.size, device=dev)
    a.add_(b, alpha=1e-6)
    torch.opencl.synchronize()
    plans = dict(pointwise._plans)
    # (this call's plan: the process may hold other adds of this shape, of other dtypes or strides)
    wanted = ("add", a.shape, "float32", a.stride(), ("float32", b.stride()), ("float32", a.stride()))
    (plan,) = [p for key, p in plans.items() if key[:len(wanted)] == wanted]
    launch_args, queue = _launch_args(a, b), pointwise.queue
    enqueue = lambda: plan.kernel(queue, plan.global_size, (pointwise.local,), *launch_args)
    enqueue_times, python_times = [], []
    for _ in range(args.repeats):
        enqueue_times.append(_time(enqueue, args.ops, torch.opencl.synchronize)[0])
        # the backend keeps the plans it launches by its own key too: forget them so that it picks
        # up the stubbed ones (and the real ones again afterwards)
        pointwise._plans = {key: p._replace(kernel=lambda *_, **__: None) for key, p in plans.items()}
        pointwise.launches.clear()
        try:
            python_times.append(_time(lambda: a.add_(b, alpha=1e-6), args.ops, lambda: None)[0])
        finally:
            pointwise._plans = plans
            pointwise.launches.clear()
    print(f"a.add_(b) breakdown: backend Python (dispatch to launch, enqueue stubbed) "
          f"{statistics.median(python_times):.2f} µs; pyopencl call of the same kernel, back to back "
          f"{statistics.median(enqueue_times):.2f} µs")
    return {"backend Python (enqueue stubbed)": python_times, "pyopencl call, back to back": enqueue_times}


def _launch_args(a: torch.Tensor, b: torch.Tensor) -> list:
    from tunecl.backend.memory import buffer_of
    from tunecl.kernels.strided import pack_meta

    n = a.numel()
    return [buffer_of(a), buffer_of(a), buffer_of(b), 1e-6, pack_meta([n, n, 1, 1, 1, 0, 0, 0], "int")]


def host_rows(measured: dict[str, dict[str, list[float]]], breakdown: dict[str, list[float]],
              cuda: dict[str, float] | None, *, size: int, batch: int, device: str, load: float | None,
              command: str, commit: str) -> list[dict[str, str]]:
    """The host-time rows of one run: ``measured`` holds each case's µs per op of every round, by column
    (``cpu``, ``opencl``, ``host``, ``thread``, and ``unbatched`` when the run had a launch batch)."""
    def row(case: str, measure: str, samples: list[float], peer: float | None = None, peer_name: str = ""):
        return record.host_row(device=device, benchmark="overhead", case=f"{case}, launch batch {batch}",
                               measure=measure, samples_us=samples, peer_us=peer, peer_name=peer_name, load=load,
                               command=command, commit=commit)

    rows = []
    named = {*_layer_cases(), *_transformer_cases()}   # (the other cases are named with their size)
    for name, times in measured.items():
        case = name if name in named else f"{name}, {size} floats"
        cpu = statistics.median(times["cpu"])
        rows.append(row(case, "to completion", times["opencl"], cpu, "torch CPU"))
        rows.append(row(case, "host (enqueue)", times["host"], *((cuda[name], "torch CUDA host") if cuda else ())))
        rows.append(row(case, "thread CPU", times["thread"]))
        if times.get("unbatched"):
            rows.append(row(case, "to completion, unbatched", times["unbatched"], cpu, "torch CPU"))
    rows += [row(f"a.add_(b) breakdown, {size} floats", part, samples) for part, samples in breakdown.items()]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000, help="ops per round (default 10000)")
    parser.add_argument("--size", type=int, default=16, help="elements per tensor (default 16)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; the median is reported (default 5)")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--layers", action="store_true",
                        help="also time convolution and batch norm, forward and backward (2x64x8x8)")
    parser.add_argument("--transformer", action="store_true",
                        help="also time a transformer block's ops: linear, gelu, layer norm and its backward, "
                             "dropout, attention forward and forward+backward (2x16 tokens of width 64, 4 heads)")
    parser.add_argument("--layer-ops", type=int, default=500,
                        help="calls per round of a --layers or --transformer case (default 500)")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append the figures to a host-time results CSV (benchmarks/results/host.csv)")
    parser.add_argument("--peer-device", help=argparse.SUPPRESS)   # the child that times a torch device
    args = parser.parse_args(argv)
    if args.peer_device:
        if "tunecl.backend" in sys.modules:
            raise RuntimeError("the peer's host times must be measured without tunecl.backend imported")
        print(json.dumps(peer_host_times(args, args.peer_device)))
        return
    if args.record:
        record.check_argument(parser.prog, args.record, record.HOST_COLUMNS)
    cuda = _cuda_peer(sys.argv[1:] if argv is None else argv)

    import tunecl.backend

    dev = torch.device("opencl")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    from tunecl.backend import state

    print(f"device: {torch.opencl.get_device_name()} | torch {torch.__version__} | {args.ops} ops of "
          f"{args.size} floats, median of {args.repeats} | host load average {load:.2f} on {os.cpu_count()} CPUs"
          f" | launch batch {state.get().device.launch_batch}")
    device = state.get().device
    batch = device.launch_batch
    paired = batch > 1  # then every round is also run with batching off, interleaved (same machine load)
    print(f"{'case':24s} {'cpu µs':>8s} {'opencl µs':>10s} {'host µs':>8s} {'ratio':>7s}"
          + (f" {'unbatched µs':>13s}" if paired else "") + f" {'thread µs':>10s} {'spread':>13s} {'cuda host µs':>13s}")
    torch.set_grad_enabled(True)
    tunecl.backend.reset_stats()   # (the fallback line below counts this run's ops only)
    measured: dict[str, dict[str, list[float]]] = {}
    for name, make, ops in _selected(args):
        cpu_fn, dev_fn = make(torch.device("cpu")), make(dev)
        for fn, sync in ((cpu_fn, lambda: None), (dev_fn, torch.opencl.synchronize)):
            _time(fn, min(500, ops), sync)  # warm-up: compiles, caches, allocator
        cpu, host, total, unbatched, thread = [], [], [], [], []
        for _ in range(args.repeats):  # interleaved, so all see the same machine load
            cpu.append(_time(cpu_fn, ops, lambda: None)[1])
            h, t, th = _time3(dev_fn, ops, torch.opencl.synchronize)
            host.append(h)
            total.append(t)
            thread.append(th)
            if paired:
                device.launch_batch = 0
                try:
                    unbatched.append(_time(dev_fn, ops, torch.opencl.synchronize)[1])
                finally:
                    device.launch_batch = batch
        measured[name] = {"cpu": cpu, "opencl": total, "host": host, "thread": thread, "unbatched": unbatched}
        c, h, t = statistics.median(cpu), statistics.median(host), statistics.median(total)
        print(f"{name:24s} {c:8.2f} {t:10.2f} {h:8.2f} {t / c:7.1f}x"
              + (f" {statistics.median(unbatched):13.2f}" if paired else "")
              + f" {statistics.median(thread):10.2f} {min(thread):6.1f}-{max(thread):<6.1f}"
              + (f" {cuda[name]:13.2f}" if cuda else f" {'-':>13s}"))
    breakdown = _breakdown(args, dev)
    fallbacks = tunecl.backend.stats()["fallback_ops"]
    print(f"ops served by the CPU fallback: {fallbacks or 'none'}")
    if args.record:
        rows = host_rows(measured, breakdown, cuda, size=args.size, batch=batch,
                         device=torch.opencl.get_device_name(), load=load,
                         command=record.script_command(__file__, argv),
                         commit=record.code_version())
        record.append(args.record, rows, record.HOST_COLUMNS)
        print(f"recorded {len(rows)} rows in {args.record}", file=sys.stderr)


if __name__ == "__main__":
    main()
