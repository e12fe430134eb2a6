"""``tunecl bench``: milliseconds per batch of a whole model on the opencl device, next to a torch peer.

Measured the way the dlprimitives seed table did, one iteration per batch, timed on the host:

- inference: copy the batch to the device, forward (eval mode, ``no_grad``), copy the result back;
- train: copy batch and labels, ``zero_grad``, forward, cross-entropy loss, backward, Adam step, then
  wait for the device.

The median of ``repeats`` iterations after ``warmup`` untimed ones is reported for our backend and for
the peer: torch on the CPU in this process, or torch CUDA in a child process that never imports
``tunecl.backend`` — with a PrivateUse1 backend loaded, CUDA ``backward()`` can fail
(pytorch#161129; backend notes §8). The child is this module run as ``python -m tunecl.tools.bench
--peer JSON``; it prints one JSON line.

``precision`` sets torch's TF32 flags (``torch.backends.cudnn.allow_tf32`` and
``torch.backends.cuda.matmul.allow_tf32``) for both sides while they are timed: ``"fp32"`` turns them off
(strict fp32: tunecl never serves a TF32 plan, CUDA never uses TF32), ``"tf32"`` turns them on (tunecl may
serve tuned TF32 tensor-core plans; cuDNN and cuBLAS use TF32, PyTorch's default for convolutions).

The CUDA peer runs with ``torch.backends.cudnn.benchmark`` off (PyTorch's default), on (cuDNN times its
algorithms per shape first, as a performance-minded user would have it), or both, each in its own child.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from tunecl.errors import TuneclError
from tunecl.tools import model_and_inputs, synchronize, use_device

COMPARE = ("cpu", "cuda", "none")
CUDNN_BENCHMARK = ("off", "on", "both")
PRECISIONS = ("fp32", "tf32")
GRAPH_DEVICES = ("opencl", "cuda")
PEER_TIMEOUT_S = 3600.0


def time_iterations(model: Any, x: Any, y: Any, device: str, *, train: bool, warmup: int, repeats: int,
                    after_warmup: Callable[[], None] | None = None,
                    after_timed: Callable[[Callable[[], None]], None] | None = None,
                    graph: bool = False, fused: bool = False, compiled: bool = False,
                    warmup_times: list[float] | None = None, issued_times: list[float] | None = None
                    ) -> list[float]:
    """Seconds of each of ``repeats`` timed iterations (after ``warmup`` untimed ones) on ``device``.

    ``model`` is moved to ``device``; ``x`` and ``y`` stay on the CPU and are copied every iteration,
    as part of the measured time. ``after_warmup`` runs between the untimed and the timed iterations;
    ``after_timed`` is called with the iteration function once they are done (to run more, e.g. profiled).
    ``warmup_times``, when given, gets the seconds of each untimed iteration appended; ``issued_times`` the
    seconds of each timed iteration until its work was enqueued, before it waits for the device (its host
    time: near the whole iteration when the host is the bottleneck, well below it when the device is).

    ``fused`` selects Adam's fused implementation (``fused=True``). With ``graph`` (devices ``opencl`` and
    ``cuda``; implies ``fused``, and on CUDA ``capturable=True``, which CUDA capture requires) one more
    untimed step, after ``after_warmup``, captures the whole training step (forward, loss, backward, Adam;
    inference: the forward) into a device graph (``torch.opencl.graph``, ``torch.cuda.graph``); a timed
    iteration then copies the batch into the graph's input tensors and replays it (inference: and copies the
    result back).

    ``compiled`` (device ``opencl``) runs the model and the optimizer step (a ``capturable`` Adam, whose step
    count lives on the device) through ``torch.compile(..., backend="tunecl")``: their graphs are captured
    during the warm-up (which needs at least 2 iterations) and replayed after.
    """
    import torch
    import torch.nn.functional as F

    if graph and device not in GRAPH_DEVICES:
        raise ValueError(f"graphs need one of the devices {GRAPH_DEVICES}, not {device!r}")
    model = model.to(device).train(train)
    options = {"fused": True, "capturable": device == "cuda"} if graph else {"fused": True} if fused else {}
    if compiled:
        options = {"capturable": True}   # its step count on the device, so the compiled step replays
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **options) if train else None
    forward, optimizer_step = model, optimizer.step if train else None
    if compiled:   # (the backend function itself: the name needs the package's entry point installed)
        from tunecl.backend.compile import tunecl_backend

        forward = torch.compile(model, backend=tunecl_backend)
        if train:
            optimizer_step = torch.compile(optimizer.step, backend=tunecl_backend)
    issued = [0.0]   # when the running iteration had enqueued its work

    if train:
        def iteration() -> None:
            xd, yd = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward(xd), yd)
            loss.backward()
            optimizer_step()
            issued[0] = time.perf_counter()
            synchronize(device)
    else:
        def iteration() -> None:
            with torch.no_grad():
                out = forward(x.to(device))
                issued[0] = time.perf_counter()
                out.cpu()   # (waits for the result)
            synchronize(device)

    # CUDA graphs want the warm-up on a side stream (lazy library setup stays out of the capture)
    side = torch.cuda.Stream() if graph and device == "cuda" else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())   # (the model and inputs were copied on the default one)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for _ in range(warmup):
            start = time.perf_counter()
            iteration()
            if warmup_times is not None:
                warmup_times.append(time.perf_counter() - start)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    if after_warmup is not None:
        after_warmup()
    if graph:
        iteration = _graphed_iteration(model, optimizer, x, y, device, issued)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        iteration()
        times.append(time.perf_counter() - start)
        if issued_times is not None:
            issued_times.append(issued[0] - start)
    if after_timed is not None:
        after_timed(iteration)
    return times


def _graphed_iteration(model: Any, optimizer: Any, x: Any, y: Any, device: str, issued: list[float]
                       ) -> Callable[[], None]:
    """Capture one step of ``model`` into a graph of ``device``; return the iteration that replays it (which
    notes in ``issued[0]`` when the replay was enqueued)."""
    import torch
    import torch.nn.functional as F

    if device == "cuda":
        g, capture = torch.cuda.CUDAGraph(), torch.cuda.graph
    else:
        g, capture = torch.opencl.Graph(), torch.opencl.graph
    static_x = x.to(device)
    if optimizer is not None:
        static_y = y.to(device)
        optimizer.zero_grad(set_to_none=True)   # the capture's backward creates the gradients replays rewrite
        with capture(g):
            F.cross_entropy(model(static_x), static_y).backward()
            optimizer.step()

        def iteration() -> None:
            static_x.copy_(x)
            static_y.copy_(y)
            g.replay()
            issued[0] = time.perf_counter()
            synchronize(device)
    else:
        with torch.no_grad(), capture(g):
            static_out = model(static_x)

        def iteration() -> None:
            static_x.copy_(x)
            g.replay()
            issued[0] = time.perf_counter()
            static_out.cpu()
            synchronize(device)
    synchronize(device)
    return iteration


def profile_iterations(iteration: Callable[[], None], count: int) -> dict[str, Any]:
    """Run ``iteration`` ``count`` times recording every kernel launch and copy (see
    :mod:`tunecl.profiling`); per batch: wall ms, device-busy ms, commands, and every kernel (launches,
    ms, share of the busy time), most time first."""
    from tunecl.profiling import KernelProfile

    with KernelProfile() as profile:
        start = time.perf_counter()
        for _ in range(count):
            iteration()
        wall = time.perf_counter() - start
        rows = profile.summary()
    busy = sum(row.seconds for row in rows)
    return {
        "iterations": count, "wall_ms": wall * 1e3 / count, "device_busy_ms": busy * 1e3 / count,
        "commands": sum(row.launches for row in rows) / count,
        "kernels": [{"name": row.name, "launches": row.launches / count, "ms": row.seconds * 1e3 / count,
                     "share": row.seconds / busy if busy else 0.0} for row in rows],
    }


@contextlib.contextmanager
def tf32_flags(allow: bool) -> Iterator[None]:
    """torch's TF32 flags for convolutions and matmuls set to ``allow`` in the block, then restored."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _timing(times: list[float], issued: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(times) * 1e3, "times_ms": [t * 1e3 for t in times],
            "issued_median_ms": statistics.median(issued) * 1e3, "issued_ms": [t * 1e3 for t in issued]}


def bench_net(net: str, *, device: str | None = None, batch: int = 16, image_size: int = 224,
              train: bool = False, compare: str | None = None, warmup: int = 3, repeats: int = 10,
              seed: int = 0, precision: str = "fp32", profile: int = 0, graph: bool = False,
              compiled: bool = False, cudnn_benchmark: str = "both",
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Benchmark ``net`` on the opencl device and on a peer; return one JSON-ready dict.

    Args:
        net: torchvision model name or ``package.module:factory`` (random weights).
        device: OpenCL device selector for ``opencl:0`` (see :func:`tunecl.tools.use_device`).
        compare: ``"cpu"`` (torch CPU, this process), ``"cuda"`` (torch CUDA, child process),
            ``"none"``, or ``None`` for cuda when ``torch.cuda.is_available()`` else cpu.
        precision: ``"fp32"`` or ``"tf32"``: torch's TF32 flags on both sides (module docstring).
        warmup: untimed iterations before the timed ones (compilation and plan building happen there).
        repeats: timed iterations; their median is the result.
        profile: this many more iterations on the opencl device (after the timed ones, not in the
            median) with every kernel launch and copy timed by its device event: see
            :func:`profile_iterations`; the result's ``profile`` (None when 0).
        graph: capture one step into a device graph after the warm-up and time its replays (see
            :func:`time_iterations`: the step includes a fused Adam), on our side and on a CUDA peer; a CPU
            peer runs the same fused Adam eagerly. The op counters (fallbacks, plan sources) then cover the
            captured step: ``stats_batches`` is 1.
        compiled: run our side's model and Adam step through ``torch.compile(..., backend="tunecl")`` (the
            peer stays eager);
            the result's ``compile`` holds the backend's counters (:func:`tunecl.backend.compile.stats`).
        cudnn_benchmark: the CUDA peer's ``torch.backends.cudnn.benchmark``: ``"off"``, ``"on"`` or
            ``"both"`` (two peers: ``peer`` has it off, ``peer_cudnn_benchmark`` on, each with its ratio).
        progress: called with a short line before each phase (the CLI prints them on stderr).

    Returns:
        ``net``, ``batch``, ``image_size``, ``mode``, ``warmup``, ``repeats``, ``ours`` and ``peer``
        (``device``, ``median_ms``, ``times_ms``, ``issued_median_ms`` and ``issued_ms``: each timed
        iteration's host time until its work was enqueued, ...; ``peer`` is None for ``compare="none"``),
        ``ratio`` (ours / peer median; ``ours["warmup_ms"]``: each warm-up iteration, the first with
        the kernel builds and, ``compiled``, Dynamo's and the backend's compile), ``peer_cudnn_benchmark`` and ``ratio_cudnn_benchmark`` (the CUDA peer
        with cudnn.benchmark on, when ``cudnn_benchmark="both"``; else None), ``shared_cores`` (the peer is torch CPU and the OpenCL device
        is the same CPU), ``fallback_ops`` (op -> CPU-fallback calls in the timed
        iterations), ``fallback_calls``, ``fallback_calls_per_batch``, ``plan_sources``, ``graph`` and
        ``stats_batches`` (the batches those counters cover).

    Raises:
        TuneclError: unknown model or device, an input the model cannot take, a failing peer.
    """
    import torch

    compare = compare or ("cuda" if torch.cuda.is_available() else "cpu")
    if compare not in COMPARE:
        raise ValueError(f"compare must be one of {COMPARE}, not {compare!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if warmup < 0 or repeats < 1 or batch < 1 or image_size < 1 or profile < 0:
        raise ValueError("need warmup, profile >= 0 and repeats, batch, image_size >= 1")
    if cudnn_benchmark not in CUDNN_BENCHMARK:
        raise ValueError(f"cudnn_benchmark must be one of {CUDNN_BENCHMARK}, not {cudnn_benchmark!r}")
    if compiled and (graph or warmup < 2):
        raise ValueError("compiled: needs warmup >= 2 (a warm-up and a capture) and no graph")
    if compare == "cuda" and not torch.cuda.is_available():   # say so before the long measurement
        raise TuneclError("--compare cuda: torch.cuda.is_available() is False here (torch "
                          f"{torch.__version__}); use --compare cpu or none")
    say = progress or (lambda line: None)
    device_name = use_device(device)
    model, x, y = model_and_inputs(net, batch, image_size, train, seed)
    mode = "train" if train else "inference"
    peer_model = copy.deepcopy(model) if compare == "cpu" else None

    import tunecl.backend

    say(f"measuring {net} on opencl:0 ({device_name}): {warmup} warm-up + {repeats} timed {mode} iterations"
        f" at {precision}" + (", replaying a captured graph" if graph else ""))
    stats: dict[str, Any] = {}
    profiled: dict[str, Any] = {}

    def after_timed(iteration: Callable[[], None]) -> None:
        stats.update(tunecl.backend.stats())   # the counters cover the timed iterations only
        if profile:
            say(f"profiling {profile} more iterations: device time of every kernel launch and copy")
            profiled.update(profile_iterations(iteration, profile))

    warmup_times: list[float] = []
    issued: list[float] = []
    try:
        with tf32_flags(precision == "tf32"):
            times = time_iterations(model, x, y, "opencl", train=train, warmup=warmup, repeats=repeats,
                                    after_warmup=tunecl.backend.reset_stats, after_timed=after_timed,
                                    graph=graph, compiled=compiled, warmup_times=warmup_times,
                                    issued_times=issued)
    except tunecl.backend.FallbackError as error:   # TUNECL_FALLBACK=error and an op without a kernel
        raise TuneclError(f"{net} cannot run on opencl:0: {error}") from None
    except torch.opencl.GraphCaptureError as error:
        raise TuneclError(f"--graph: a step of {net} cannot be captured: {error}") from None
    del model
    ours = {"device": f"opencl:0 {device_name}", **_timing(times, issued),
            "warmup_ms": [t * 1e3 for t in warmup_times]}
    device_type = torch.opencl.get_device_properties()["type"]

    peer = peer_benchmark = None
    if compare == "cpu":
        say(f"measuring the peer: torch CPU in this process ({torch.get_num_threads()} threads)")
        peer_issued: list[float] = []
        with tf32_flags(precision == "tf32"):   # (no effect on the CPU)
            peer_times = time_iterations(peer_model, x, y, "cpu", train=train, warmup=warmup, repeats=repeats,
                                         fused=graph, issued_times=peer_issued)   # the same Adam as ours, eagerly
        peer = {"kind": "cpu", "device": f"torch {torch.__version__} CPU", "process": "same",
                "threads": torch.get_num_threads(), "graph": False, **_timing(peer_times, peer_issued)}
    elif compare == "cuda":
        spec = {"net": net, "batch": batch, "image_size": image_size, "train": train, "warmup": warmup,
                "repeats": repeats, "seed": seed, "device": "cuda", "precision": precision, "graph": graph}
        peers = []
        for benchmark in ((False, True) if cudnn_benchmark == "both" else (cudnn_benchmark == "on",)):
            say(f"measuring the peer: torch CUDA (TF32 {'on' if precision == 'tf32' else 'off'}, cudnn.benchmark "
                f"{'on' if benchmark else 'off'}) in a separate process without tunecl.backend")
            peers.append(measure_in_subprocess({**spec, "cudnn_benchmark": benchmark}))
        peer, peer_benchmark = peers[0], peers[1] if len(peers) > 1 else None
    fallback = dict(sorted(stats["fallback_ops"].items(), key=lambda kv: -kv[1]))
    calls = sum(fallback.values())
    stats_batches = 1 if graph else repeats
    return {
        "net": net, "batch": batch, "image_size": image_size, "mode": mode, "precision": precision,
        "warmup": warmup, "repeats": repeats, "ours": ours, "peer": peer,
        "shared_cores": compare == "cpu" and device_type == "cpu",
        "ratio": ours["median_ms"] / peer["median_ms"] if peer else None,
        "peer_cudnn_benchmark": peer_benchmark,
        "ratio_cudnn_benchmark": ours["median_ms"] / peer_benchmark["median_ms"] if peer_benchmark else None,
        "fallback_ops": fallback, "fallback_calls": calls, "fallback_calls_per_batch": calls / stats_batches,
        "plan_sources": dict(stats["plan_sources"]), "profile": profiled or None, "graph": graph,
        "stats_batches": stats_batches, "compiled": compiled, "compile": _compile_stats() if compiled else None,
    }


def _compile_stats() -> dict[str, int]:
    from tunecl.backend import compile as tunecl_compile

    return tunecl_compile.stats()


def measure_in_subprocess(spec: dict[str, Any], timeout: float = PEER_TIMEOUT_S) -> dict[str, Any]:
    """Run :func:`peer_main` in a fresh Python that never imports ``tunecl.backend``; return its result.

    ``spec`` holds ``net``, ``batch``, ``image_size``, ``train``, ``warmup``, ``repeats``, ``seed``,
    ``precision`` (optional, default fp32), ``cudnn_benchmark`` (optional, default False) and ``device`` (``cuda``, or ``cpu`` to exercise this path without a GPU). The child gets this process's
    ``sys.path`` so it imports the same ``package.module:factory``.

    Raises:
        TuneclError: the child failed (its last stderr lines are in the message) or timed out.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    command = [sys.executable, "-m", "tunecl.tools.bench", "--peer", json.dumps(spec)]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TuneclError(f"the torch {spec['device']} peer did not finish within {timeout:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        raise TuneclError(f"the torch {spec['device']} peer failed (exit {done.returncode}):\n{tail}")
    return json.loads(lines[-1])


def peer_main(spec: dict[str, Any]) -> dict[str, Any]:
    """The child process's work: the same model and inputs, timed with plain torch on ``spec['device']``."""
    import torch

    device = spec["device"]
    tf32 = spec.get("precision", "fp32") == "tf32"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise TuneclError("--compare cuda: torch.cuda.is_available() is False in this environment")
        torch.backends.cuda.matmul.allow_tf32 = tf32   # what tunecl's side was allowed
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = bool(spec.get("cudnn_benchmark"))
        name = torch.cuda.get_device_name()
    else:
        name = "CPU"
    model, x, y = model_and_inputs(spec["net"], spec["batch"], spec["image_size"], spec["train"], spec["seed"])
    if "tunecl.backend" in sys.modules:   # the reason this runs in its own process
        raise TuneclError(f"building {spec['net']!r} imported tunecl.backend; the torch {device} peer must "
                          f"run without it (pytorch#161129): build the model in a module that does not "
                          f"import tunecl.backend")
    graph = bool(spec.get("graph")) and device == "cuda"
    issued: list[float] = []
    times = time_iterations(model, x, y, device, train=spec["train"], warmup=spec["warmup"],
                            repeats=spec["repeats"], graph=graph, issued_times=issued)
    if "tunecl.backend" in sys.modules:
        raise TuneclError("the peer process imported tunecl.backend while measuring")
    settings = (f"fp32, TF32 {'on' if tf32 else 'off'}, cudnn.benchmark "
                f"{'on' if spec.get('cudnn_benchmark') else 'off'}" if device == "cuda" else "fp32")
    if graph:
        settings += ", CUDA graph replays"
    return {"kind": device, "device": f"torch {torch.__version__} {name}", "process": "separate",
            "settings": settings, "backend_imported": False, "graph": graph, **_timing(times, issued)}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--peer":
        sys.exit("usage: python -m tunecl.tools.bench --peer JSON")
    try:
        result = peer_main(json.loads(sys.argv[2]))
    except TuneclError as error:
        sys.exit(f"tunecl: error: {error}")
    print(json.dumps(result))
