"""conv_implicit_gemm_mma_tf32 (or, with --fp16, _f16) on a GPU: correctness, and speed next to cuDNN.

One run answers: does the device grant "mma_tf32"? Does the tensor-core implicit GEMM compute
correctly in all three directions (the default and seeded random configs on the test shape list:
edges, stride 2, padding 0 and 2, dilation 2, groups 2, 1x1, a 7x7 first layer, batch 1, K = 1000,
checked by the tuner's harness at the TF32 tolerance)? How fast are the default and a few random
configs on resnet50 layers (verified, then timed by device events) next to the fp32
``conv_implicit_gemm`` default and next to ``torch.nn.functional.conv2d`` / its gradients on CUDA with
``torch.backends.cudnn.allow_tf32`` True and False (cudnn.benchmark on), timed with CUDA events in a
child process that never touches OpenCL?

    python benchmarks/conv_mma.py --device nvidia --json conv-mma.json
    python benchmarks/conv_mma.py --device nvidia --fp16 --json conv-mma-f16.json

``--fp16`` checks and times ``conv_implicit_gemm_mma_f16`` on the float16 problems of the same shapes
(capability "mma_f16"; the fp32 tolerance plus one rounding to half) next to the fp32
``conv_implicit_gemm`` default on the float32 problem and cuDNN on float16 tensors.

Without the capability it says so and checks nothing (``--emulate`` runs the correctness part with the
plain-C mma, e.g. on PoCL). Without torch CUDA the cuDNN columns stay empty. A launch error is
reported per config (the run goes on; an NVIDIA context may not survive one). About 1-2 minutes on an
H200; ``--budget`` stops the timing part early.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import pyopencl as cl

from tunecl import runtime
from tunecl.kernels.conv.conv_implicit_gemm import ConvImplicitGemm
from tunecl.kernels.conv.conv_implicit_gemm_mma import ConvImplicitGemmMmaF16, ConvImplicitGemmMmaTF32
from tunecl.problems import DIRECTIONS, ConvProblem
from tunecl.search.harness_conv import ConvHarness

CHECK_SHAPES = [
    "n=2,c=8,h=9,w=11,k=12,r=3,s=3,pad=1", "n=2,c=6,h=10,w=9,k=8,r=3,s=3,stride=2,pad=1",
    "n=1,c=8,h=7,w=9,k=8,r=3,s=3,pad=0", "n=1,c=4,h=10,w=9,k=6,r=3,s=3,pad=2,dil=2",
    "n=2,c=8,h=7,w=8,k=6,r=3,s=3,pad=1,groups=2", "n=2,c=16,h=7,w=9,k=12,r=1,s=1,stride=2",
    "n=1,c=3,h=15,w=13,k=8,r=7,s=7,stride=2,pad=3", "n=1,c=8,h=3,w=3,k=1000,r=3,s=3,pad=1",
    "n=2,c=40,h=12,w=12,k=72,r=3,s=3,pad=1",
]
TIME_SHAPES = [
    "n=16,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3", "n=16,c=64,h=56,w=56,k=64,r=3,s=3,pad=1",
    "n=16,c=256,h=56,w=56,k=128,r=1,s=1,stride=2", "n=16,c=256,h=14,w=14,k=256,r=3,s=3,pad=1",
    "n=16,c=512,h=7,w=7,k=2048,r=1,s=1",
]
RANDOM_CHECKS = 8     # random configs per direction (correctness)
RANDOM_TIMED = 6      # random configs per timed problem


def family(fp16: bool) -> Any:
    """The tensor-core family measured: TF32 on fp32 problems, or f16 on float16 ones."""
    return ConvImplicitGemmMmaF16() if fp16 else ConvImplicitGemmMmaTF32()


def parse(spec: str, direction: str, mma: Any) -> ConvProblem:
    return ConvProblem.parse(f"{spec},dtype={mma.variant.dtype}").with_direction(direction)


def check(device: Any, emulate: bool, seed: int, mma: Any) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for direction in DIRECTIONS:
        jobs = [(spec, "default") for spec in CHECK_SHAPES]
        jobs += [(CHECK_SHAPES[i % len(CHECK_SHAPES)], "random") for i in range(RANDOM_CHECKS)]
        for spec, kind in jobs:
            p = parse(spec, direction, mma)
            space_device = device
            config = mma.default(p, space_device) if kind == "default" else rng.choice(
                mma.space(p, space_device).configs())
            try:
                plan = mma.build(p, device, config, emulate=emulate)
                binding = ConvHarness(p, device, seed=len(rows)).bind(plan)
                message = binding.check()
                binding.release()
            except (cl.Error, ValueError) as error:
                message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            rows.append({"problem": p.key, "config": config, "kind": kind, "ok": message is None,
                         "message": message})
            print(f"  {'ok ' if message is None else 'BAD'} {direction:10s} {kind:7s} {spec:45s} "
                  f"{brief(config)}{'' if message is None else '  ' + message}", flush=True)
    return rows


def brief(config: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def time_configs(device: Any, p: ConvProblem, seed: int, min_time: float, mma: Any) -> dict[str, Any]:
    from tunecl.search.evaluate import evaluate
    from tunecl.search.measure import TimingPolicy

    fp32 = ConvImplicitGemm()
    harness = ConvHarness(p, device)
    p32 = dataclasses.replace(p, dtype="float32")   # the fp32 family's problem (fp16: the converted route)
    harness32 = harness if p32 == p else ConvHarness(p32, device)
    policy = TimingPolicy(warmup=2, min_time=min_time, min_repeats=5, max_repeats=200, timeout=30.0)
    space = mma.space(p, device).configs()
    candidates = [("default", mma, mma.default(p, device))]
    candidates += [("random", mma, c) for c in random.Random(seed).sample(space, min(RANDOM_TIMED, len(space)))]
    candidates += [("fp32 default", fp32, fp32.default(p32, device))]
    rows = []
    for label, algorithm, config in candidates:
        problem, bound = (p32, harness32) if algorithm is fp32 else (p, harness)
        result = evaluate(algorithm, problem, device, config, harness=bound, policy=policy)
        rows.append({"label": label, "algorithm": algorithm.name, "config": config,
                     "status": result.status.value, "message": result.message,
                     "time_s": result.time if result.ok else None})
    return {"problem": p.key, "tflops": p.flops / 1e12, "runs": rows}


def cudnn_times(specs: list[str], min_time: float, results: Any, fp16: bool = False) -> None:
    """ms of conv2d / its two gradients on CUDA with cuDNN, TF32 on and off, or on float16 tensors
    (``fp16``; child process)."""
    try:
        import torch
    except ImportError:
        results.put({})
        return
    if not torch.cuda.is_available():
        results.put({})
        return
    torch.backends.cudnn.benchmark = True
    out = {}
    for spec in specs:
        for direction in DIRECTIONS:
            p = ConvProblem.parse(spec + (",dtype=float16" if fp16 else "")).with_direction(direction)
            dtype = torch.float16 if fp16 else torch.float32
            x = torch.rand(p.input_shape, device="cuda", dtype=dtype) * 2 - 1
            w = torch.rand(p.weight_shape, device="cuda", dtype=dtype) * 2 - 1
            dy = torch.rand(p.output_shape, device="cuda", dtype=dtype) * 2 - 1
            call = _cudnn_call(torch, p, x, w, dy)
            for tf32 in ((None,) if fp16 else (True, False)):
                if tf32 is not None:
                    torch.backends.cudnn.allow_tf32 = tf32
                for _ in range(3):
                    call()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                repeats, total = 0, 0.0
                while total < min_time or repeats < 5:
                    start.record()
                    call()
                    end.record()
                    torch.cuda.synchronize()
                    total += start.elapsed_time(end) / 1e3
                    repeats += 1
                out[f"{p.key}|{'fp16' if fp16 else 'tf32' if tf32 else 'fp32'}"] = total / repeats
    results.put(out)


def _cudnn_call(torch: Any, p: ConvProblem, x: Any, w: Any, dy: Any) -> Any:
    """The torch call computing ``p``'s direction (conv2d, or its input / weight gradient)."""
    kw = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
    if p.direction == "fwd":
        return lambda: torch.nn.functional.conv2d(x, w, **kw)
    if p.direction == "bwd_data":
        return lambda: torch.nn.grad.conv2d_input(p.input_shape, w, dy, **kw)
    return lambda: torch.nn.grad.conv2d_weight(x, p.weight_shape, dy, **kw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="device selector (default: TUNECL_DEVICE / the first)")
    parser.add_argument("--emulate", action="store_true", help="check with the plain-C mma (no timings)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the whole run")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of timed repeats per config")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--fp16", action="store_true",
                        help="conv_implicit_gemm_mma_f16 on float16 problems, next to cuDNN in float16")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget
    device = runtime.select_device(args.device)
    mma = family(args.fp16)
    capability = mma.variant.capability
    granted = capability in device.capabilities
    print(f"device: {device.fingerprint.label}; capabilities: {sorted(device.capabilities) or 'none'}")
    report: dict[str, Any] = {"device": device.fingerprint.label, "algorithm": mma.name, capability: granted}
    if not granted and not args.emulate:
        print(f"no {capability} capability: nothing to check here (--emulate checks the plain-C mma)")
        _write(args.json, report)
        return 0

    peers: dict[str, float] = {}
    child = None
    if granted:  # cuDNN in a child process (CUDA and the OpenCL driver never share a process here)
        ctx = multiprocessing.get_context("spawn")
        queue_ = ctx.Queue()
        child = ctx.Process(target=cudnn_times, args=(TIME_SHAPES, args.min_time, queue_, args.fp16),
                            daemon=True)
        child.start()
        try:
            peers = queue_.get(timeout=max(10.0, deadline - time.monotonic() - 60))
        except Exception as error:  # noqa: BLE001 - a missing peer only empties its columns
            print(f"cuDNN peer unavailable: {type(error).__name__} {error}")
        child.join(timeout=5)

    tolerance = "fp32 tolerance + one rounding to half" if args.fp16 else "TF32 tolerance"
    print(f"correctness of {mma.name} (tuner's harness, {tolerance}):")
    report["checks"] = check(device, emulate=not granted, seed=20240613, mma=mma)
    bad = [r for r in report["checks"] if not r["ok"]]
    print(f"correctness: {len(report['checks']) - len(bad)}/{len(report['checks'])} ok")
    report["timings"] = []
    if granted:
        peer_columns = ("cuDNN fp16", "") if args.fp16 else ("cuDNN tf32", "cuDNN fp32")
        print(f"{'problem':78s} {'mma def':>8s} {'mma best':>8s} {'fp32 def':>8s} {peer_columns[0]:>10s} "
              f"{peer_columns[1]:>10s}  (ms)")
        for spec in TIME_SHAPES:
            for direction in DIRECTIONS:
                if time.monotonic() > deadline:
                    print("budget spent: timings stop here")
                    break
                p = parse(spec, direction, mma)
                row = time_configs(device, p, seed=len(report["timings"]), min_time=args.min_time, mma=mma)
                if args.fp16:
                    row["cudnn_fp16_s"] = peers.get(f"{p.key}|fp16")
                else:
                    row["cudnn_tf32_s"] = peers.get(f"{p.key}|tf32")
                    row["cudnn_fp32_s"] = peers.get(f"{p.key}|fp32")
                report["timings"].append(row)
                mma_times = [r["time_s"] for r in row["runs"] if r["algorithm"] != "conv_implicit_gemm"
                             and r["time_s"]]
                default = row["runs"][0]["time_s"]
                fp32 = row["runs"][-1]["time_s"]
                peer_cells = ([row["cudnn_fp16_s"], None] if args.fp16
                              else [row["cudnn_tf32_s"], row["cudnn_fp32_s"]])
                cells = [default, min(mma_times) if mma_times else None, fp32, *peer_cells]
                print(f"{spec + ' ' + direction:78s} " + " ".join(
                    f"{c * 1e3:8.3f}" if c else f"{'-':>8s}" for c in cells), flush=True)
                failed = [r for r in row["runs"] if r["status"] != "ok"]
                for r in failed:
                    print(f"    {r['label']} {r['status']}: {r['message']}  {brief(r['config'])}")
    _write(args.json, report)
    return 1 if bad else 0


def _write(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
