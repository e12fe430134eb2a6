"""gemm_mma_tf32 on a GPU: capability probes, correctness, and speed next to torch.mm with TF32.

One run answers: does the device grant "mma_tf32" (and "cp_async")? Does the kernel compute correctly
(the default and seeded random configs, every transpose, edges, batch 3 with offsets, ld > row length
and gaps, against numpy in float64 within the TF32 tolerance)? How fast are the default and ~40 random
valid configs at 4096^3 and 1024^3 (verified by the tuner's harness, timed by device events) next to
``torch.mm`` on CUDA with ``torch.backends.cuda.matmul.allow_tf32 = True`` (and TF32 off), timed in the
same run with CUDA events? Also the fp32 ``gemm_tiled`` default, and ptxas's register report of the
default and of the fastest config (``-cl-nv-verbose``).

The fp16 rows: ``gemm_mma_f16`` (float16 A, B, C; ``mma.sync ... m16n8k16 ... f16``, fp32
accumulation) where the probe grants "mma_f16": its default and the best of ``--configs`` random
valid configs per shape (each verified by the tuner's harness at the float16 tolerance), next to
``torch.mm`` on CUDA float16 tensors. Where the family does not apply the script says so.

    python benchmarks/gemm_mma.py --device nvidia --json gemm-mma.json

OpenCL work runs in a child process: a kernel that faults leaves an NVIDIA context unusable, so after
a launch error (or a hang past ``--job-timeout``) the child is replaced and the run goes on, naming the
config that did it. Without torch or CUDA the peer columns stay empty. About 2-4 minutes on an H200.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import queue
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import runtime
from tunecl.kernels.gemm import gemm_tiled, gemm_mma
from tunecl.problems import GemmProblem
from tunecl.search.harness import gemm_spread, tf32_tolerance

F16 = "float16"

CHECK_SHAPES = [(1, 1, 1), (7, 33, 127), (257, 129, 65), (128, 128, 128)]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
DRAW_SHAPE = (2048, 512, 256)  # random correctness configs come from this shape's space (tiles 16..256)
EPS32 = float(np.finfo(np.float32).eps)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Operands in their buffers: batch, offsets, row padding (ld - row length), gap between matrices."""

    batch: int = 1
    offsets: tuple[int, int, int] = (0, 0, 0)
    pads: tuple[int, int, int] = (0, 0, 0)
    gap: int = 0
    alpha: float = 1.0
    beta: float = 0.0


# packed; batch 3 with aligned offsets/ld/gaps (vector paths); batch 3 unaligned (scalar variants)
LAYOUTS = [
    Layout(),
    Layout(3, (4, 8, 12), (4, 8, 4), 4, 0.75, -1.25),
    Layout(3, (1, 3, 5), (3, 1, 2), 1, -1.5, 0.5),
]


# ---- the child process: OpenCL only ------------------------------------------------------------------

_device: Any = None
_harnesses: dict[GemmProblem, Any] = {}


def _problem(spec: list) -> GemmProblem:
    m, n, k, ta, tb, batch, *dtype = spec
    return GemmProblem(m, n, k, bool(ta), bool(tb), batch=batch, dtype=dtype[0] if dtype else "float32")


def check_job(device: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Run one config on one problem and layout; compare with numpy in float64 (TF32 tolerance)."""
    p = _problem(job["problem"])
    layout = Layout(**{k: tuple(v) if isinstance(v, list) else v for k, v in job["layout"].items()})
    plan = _mma(job).build(p, device, job["config"])
    rng = np.random.default_rng(job["seed"])
    shapes = [(p.k, p.m) if p.trans_a else (p.m, p.k), (p.n, p.k) if p.trans_b else (p.k, p.n), (p.m, p.n)]
    lds = [cols + pad for (_, cols), pad in zip(shapes, layout.pads, strict=True)]
    strides = [rows * ld + layout.gap for (rows, _), ld in zip(shapes, lds, strict=True)]
    flats, mats = [], []
    for (rows, cols), ld, stride, offset, name in zip(
        shapes, lds, strides, layout.offsets, "abc", strict=True
    ):
        size = offset + (p.batch - 1) * stride + (rows - 1) * ld + cols + 8
        flat = np.full(size, np.nan if name != "c" else 7.0, np.float32)  # NaN around inputs shows reads
        views = [
            np.lib.stride_tricks.as_strided(flat[offset + b * stride :], (rows, cols), (4 * ld, 4))
            for b in range(p.batch)
        ]
        for view in views:
            view[...] = np.nan if name == "c" and layout.beta == 0 else rng.uniform(-1, 1, (rows, cols))
        flats.append(flat)
        mats.append(np.stack([v.copy() for v in views]).astype(np.float64))
    buffers = [device.upload(f) for f in flats]
    names = ("a_offset", "b_offset", "c_offset", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c")
    args = dict(zip(names, (*layout.offsets, *lds, *strides), strict=True))
    plan.run(*buffers, alpha=layout.alpha, beta=layout.beta, **args)[-1].wait()
    out_flat = device.download(buffers[2], flats[2].shape)
    op_a = mats[0].transpose(0, 2, 1) if p.trans_a else mats[0]
    op_b = mats[1].transpose(0, 2, 1) if p.trans_b else mats[1]
    ref = layout.alpha * (op_a @ op_b)
    scale = abs(layout.alpha) * (np.abs(op_a) @ np.abs(op_b))
    if layout.beta:
        ref += layout.beta * mats[2]
        scale += abs(layout.beta) * np.abs(mats[2])
    tolerance = 8 * EPS32 * math.sqrt(p.k) * scale + abs(layout.alpha) * tf32_tolerance(
        gemm_spread(op_a, op_b)
    )
    out = np.stack(
        [
            np.lib.stride_tricks.as_strided(
                out_flat[layout.offsets[2] + b * strides[2] :], (p.m, p.n), (4 * lds[2], 4)
            )
            for b in range(p.batch)
        ]
    ).astype(np.float64)
    error = np.abs(out - ref)
    bad = ~(error <= tolerance)
    inside = np.zeros(out_flat.shape, bool)
    for b in range(p.batch):
        np.lib.stride_tricks.as_strided(
            inside[layout.offsets[2] + b * strides[2] :], (p.m, p.n), (lds[2], 1)
        )[...] = True
    outside_changed = int(np.count_nonzero(out_flat[~inside] != 7.0))
    ratio = float(np.max(error / np.maximum(tolerance, 1e-30)))
    if bad.any() or outside_changed:
        where = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None
        message = (
            f"{int(bad.sum())} of {bad.size} wrong"
            + (f", first at {where}: got {out[where]:.6g}, expected {ref[where]:.6g}" if where else "")
            + f"; {outside_changed} written outside C"
        )
        return {"status": "wrong_result", "message": message, "error_over_tolerance": ratio}
    return {"status": "ok", "message": "", "error_over_tolerance": ratio}


def time_job(device: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Verify and time one config with the tuner's evaluation (harness inputs, TF32 tolerance)."""
    from tunecl.search.evaluate import evaluate
    from tunecl.search.harness_registry import harness_for
    from tunecl.search.measure import TimingPolicy

    p = _problem(job["problem"])
    if p not in _harnesses:
        _harnesses[p] = harness_for(p, device)
    algorithm = (
        _mma(job)
        if job["algorithm"] in (gemm_mma.NAME, gemm_mma.F16_NAME)
        else gemm_tiled.GemmTiled()
    )
    policy = TimingPolicy(warmup=2, min_time=job["min_time"], min_repeats=5, max_repeats=200, timeout=30.0)
    result = evaluate(algorithm, p, device, job["config"], harness=_harnesses[p], policy=policy)
    return {
        "status": result.status.value,
        "message": result.message,
        "time_s": result.time if result.ok else None,
    }


def verbose_build_job(device: Any, job: dict[str, Any]) -> dict[str, Any]:
    """The compiler's report (registers, spills) for one config: NVIDIA's -cl-nv-verbose build log."""
    import pyopencl as cl

    from tunecl.kernels.base import build_options, read_source

    p, config = _problem(job["problem"]), job["config"]
    options = {k: v for k, v in config.items() if k not in ("VW", "MAXRREG")}
    options.update(VWA=config["VW"], VWB=config["VW"], CSCALAR=0)
    extra = [f"-DTRANS_A={int(p.trans_a)}", f"-DTRANS_B={int(p.trans_b)}", "-cl-nv-verbose"]
    if config.get("MAXRREG"):
        extra.append(f"-cl-nv-maxrregcount={config['MAXRREG']}")
    program = cl.Program(device.context, read_source("tunecl.kernels.gemm", "gemm_mma.cl"))
    try:
        program.build(options=build_options(options, extra))
    except cl.Error as error:
        return {"status": "compile_error", "message": str(error)[-2000:]}
    log = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
    lines = [ln.strip() for ln in log.splitlines() if "ptxas" in ln or "registers" in ln or "spill" in ln]
    return {"status": "ok", "message": " | ".join(lines)[:2000]}


JOBS = {"check": check_job, "time": time_job, "verbose": verbose_build_job}


class _Emulated(gemm_mma.GemmMmaTF32):
    """``--emulate``: the plain-C stand-in of the PTX, to try this script where there are no tensor cores."""

    def build(
        self, problem: GemmProblem, device: Any, config: dict[str, int], *, emulate: bool = True
    ) -> Any:
        return super().build(problem, device, config, emulate=True)


class _EmulatedF16(gemm_mma.GemmMmaF16):
    """``--emulate`` for gemm_mma_f16."""

    def build(
        self, problem: GemmProblem, device: Any, config: dict[str, int], *, emulate: bool = True
    ) -> Any:
        return super().build(problem, device, config, emulate=True)


def _mma(job: dict[str, Any]) -> gemm_mma.GemmMmaTF32:
    if job.get("algorithm") == gemm_mma.F16_NAME:
        return _EmulatedF16() if job.get("emulate") else gemm_mma.GemmMmaF16()
    return _Emulated() if job.get("emulate") else gemm_mma.GemmMmaTF32()


def child(selector: str, jobs: list[dict[str, Any]], results: Any, granted: bool) -> None:
    """Run ``jobs`` in order, one result each; stop after a launch error (the context may be dead)."""
    device = runtime.select_device(selector)
    if granted:  # --force / --emulate: see the device as if both probes had passed
        device = _Granted(device)
    for index, job in enumerate(jobs):
        try:
            outcome = JOBS[job["kind"]](device, job)
        except Exception as error:  # noqa: BLE001 - report anything, the parent decides
            outcome = {
                "status": "launch_error" if "pyopencl" in type(error).__module__ else "error",
                "message": f"{type(error).__name__}: {str(error).strip()[:1500]}",
                "trace": traceback.format_exc()[-1500:],
            }
        results.put((index, outcome))
        if outcome["status"] == "launch_error":
            return


def run_jobs(
    selector: str,
    jobs: list[dict[str, Any]],
    job_timeout: float,
    deadline: float,
    label: str,
    granted: bool = False,
) -> list[dict[str, Any]]:
    """Run ``jobs`` in child processes, replacing a child after a launch error or a hang."""
    context = multiprocessing.get_context("spawn")
    outcomes: list[dict[str, Any] | None] = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        if time.monotonic() > deadline:
            for i in range(start, len(jobs)):
                outcomes[i] = {"status": "skipped", "message": "time budget used up"}
            break
        results = context.Queue()
        process = context.Process(target=child, args=(selector, jobs[start:], results, granted), daemon=True)
        process.start()
        done = start
        while done < len(jobs):
            # the first answer also waits for the child to import, open the device and build a harness
            limit = time.monotonic() + job_timeout + (60 if done == start else 0)
            answer = None
            while answer is None and time.monotonic() < limit:
                try:
                    answer = results.get(timeout=1.0)
                except queue.Empty:
                    if not process.is_alive() and results.empty():
                        break
            if answer is None:
                if process.is_alive():
                    process.kill()
                    outcomes[done] = {
                        "status": "timeout",
                        "message": f"no answer within {job_timeout:g} s (hang?)",
                    }
                else:
                    outcomes[done] = {
                        "status": "crash",
                        "message": f"the child process died (exit {process.exitcode})",
                    }
                print(
                    f"  [{label}] job {done}: {outcomes[done]['message']}; starting a new process", flush=True
                )
                done += 1
                break
            index, outcome = answer
            outcomes[start + index] = outcome
            done = start + index + 1
            if outcome["status"] == "launch_error":
                print(
                    f"  [{label}] launch error on {jobs[start + index].get('config')}: "
                    f"{outcome['message'][:200]}; starting a new process",
                    flush=True,
                )
                break
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
        start = done
    return [o or {"status": "skipped", "message": ""} for o in outcomes]


# ---- the parent: plans the jobs, times torch, prints ----------------------------------------------


def torch_peers(problem: GemmProblem, min_time: float) -> dict[str, float]:
    """Seconds per ``torch.mm`` on CUDA with TF32 on and off (CUDA events, median); {} without CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    a = torch.rand(problem.m, problem.k, device="cuda") * 2 - 1
    b = torch.rand(problem.k, problem.n, device="cuda") * 2 - 1
    c = torch.empty(problem.m, problem.n, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    saved = torch.backends.cuda.matmul.allow_tf32
    peers = {}
    try:
        for name, tf32 in (("torch.mm TF32", True), ("torch.mm fp32", False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            samples: list[float] = []
            for _ in range(3):  # warm-up (cuBLAS picks its kernel)
                torch.mm(a, b, out=c)
            torch.cuda.synchronize()
            while len(samples) < 5 or (sum(samples) < min_time and len(samples) < 500):
                start.record()
                torch.mm(a, b, out=c)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e-3)
            peers[name] = statistics.median(samples)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return peers


def torch_f16_peer(problem: GemmProblem, min_time: float) -> dict[str, float]:
    """Seconds per ``torch.mm`` of float16 tensors on CUDA (CUDA events, median); {} without CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    a = (torch.rand(problem.m, problem.k, device="cuda") * 2 - 1).half()
    b = (torch.rand(problem.k, problem.n, device="cuda") * 2 - 1).half()
    c = torch.empty(problem.m, problem.n, device="cuda", dtype=torch.float16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    samples: list[float] = []
    while len(samples) < 5 or (sum(samples) < min_time and len(samples) < 500):
        start.record()
        torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return {"torch.mm fp16": statistics.median(samples)}


def fp16_rows(args: Any, selector: str, view: Any, granted: bool, deadline: float) -> list[dict[str, Any]]:
    """Per shape: gemm_mma_f16's default and the best of ``args.configs`` random valid configs (each
    verified and timed by the tuner's evaluation) next to torch.mm on float16 CUDA tensors."""
    mma = gemm_mma.GemmMmaF16()
    summaries = []
    for spec in args.shapes:
        p = GemmProblem.from_spec(f"{spec},dtype={F16}")
        space = mma.space(p, view).configs()
        default = mma.default(p, view)
        pick = random.Random(args.seed + p.m + 1)
        others = [c for c in space if c != default]
        chosen = [default] + pick.sample(others, min(args.configs, len(others)))
        key = [p.m, p.n, p.k, int(p.trans_a), int(p.trans_b), p.batch, F16]
        jobs = [
            {"kind": "time", "algorithm": gemm_mma.F16_NAME, "problem": key, "config": c,
             "min_time": args.min_time, "emulate": args.emulate}
            for c in chosen
        ]
        print(
            f"\n{spec} fp16: gemm_mma_f16 default + {len(chosen) - 1} random of {len(space)} valid configs, "
            "each verified (float16 tolerance) and timed",
            flush=True,
        )
        outcomes = run_jobs(selector, jobs, args.job_timeout, deadline, f"{spec} fp16", granted)
        peers = torch_f16_peer(p, args.min_time) if time.monotonic() < deadline + 30 else {}
        peer = gflops(p, peers.get("torch.mm fp16"))
        rows = [
            {"config": j["config"], **o, "gflops": gflops(p, o.get("time_s"))}
            for j, o in zip(jobs, outcomes, strict=True)
        ]
        best = max((r for r in rows if r["gflops"]), key=lambda r: r["gflops"], default=None)
        statuses: dict[str, int] = {}
        for row in rows:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        summary = {
            "shape": spec, "dtype": F16, "space_size": len(space), "statuses": statuses, "peers_s": peers,
            "peer_fp16_gflops": peer, "default_gflops": rows[0]["gflops"],
            "default_vs_torch_fp16": rows[0]["gflops"] / peer if rows[0]["gflops"] and peer else None,
            "best_gflops": best["gflops"] if best else None, "best_config": best["config"] if best else None,
            "best_vs_torch_fp16": best["gflops"] / peer if best and peer else None, "rows": rows,
        }
        for row in rows:
            if row["status"] != "ok":
                print(f"  {row['status']}: {brief(row['config'])}  {failure_reason(row['message'])[:200]}")
        print(
            f"fp16 {spec}: gemm_mma_f16 default {_fmt(summary['default_gflops'])} GFLOP/s "
            f"({_fmt(summary['default_vs_torch_fp16'], '.3f')} x torch.mm fp16), best of "
            f"{len(rows)} {_fmt(summary['best_gflops'])} ({_fmt(summary['best_vs_torch_fp16'], '.3f')} x; "
            f"{brief(best['config']) if best else '-'}); torch.mm fp16 {_fmt(peer)}; statuses {statuses}"
        )
        summaries.append(summary)
    return summaries


def gflops(problem: GemmProblem, seconds: float | None) -> float | None:
    return None if not seconds else problem.flops / seconds * 1e-9


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def failure_reason(message: str) -> str:
    """The informative part of a failure message: a compiler's error lines rather than its options."""
    parts = [part.strip() for part in message.replace(" | ", "\n").splitlines()]
    errors = [part for part in parts if "error" in part.lower() and "build failed" not in part.lower()]
    return " | ".join(errors[:3]) if errors else message


def brief(config: dict[str, int]) -> str:
    c = config
    if "WARPS_M" not in c:
        return " ".join(f"{k}={v}" for k, v in c.items())
    return (
        f"{c['MWG']}x{c['NWG']}x{c['KWG']} w{c['WARPS_M']}x{c['WARPS_N']} vw{c['VW']} kp{c['KPAIR']} "
        f"pad{c['PAD']} {'async' if c['ASYNC'] else 'regs'}{c['STAGES']} gm{c['GM']}"
        + (f" rreg{c['MAXRREG']}" if c["MAXRREG"] else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", metavar="SEL", default="nvidia", help="device selector (default: nvidia)")
    parser.add_argument("--shapes", nargs="+", default=["4096,4096,4096", "1024,1024,1024"], metavar="M,N,K")
    parser.add_argument("--configs", type=int, default=40, help="random configs timed per shape (default 40)")
    parser.add_argument("--check-configs", type=int, default=10, help="random configs checked per transpose")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of samples per timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=220.0, help="seconds before no new phase starts")
    parser.add_argument("--job-timeout", type=float, default=60.0, help="seconds one job may take")
    parser.add_argument(
        "--force",
        action="store_true",
        help="run even where the probe did not grant mma_tf32 (diagnosis: builds the PTX anyway)",
    )
    parser.add_argument("--skip-check", action="store_true", help="skip the correctness phase")
    parser.add_argument("--skip-fp16", action="store_true", help="skip the gemm_mma_f16 rows")
    parser.add_argument(
        "--emulate",
        action="store_true",
        help="run the plain-C stand-in of the PTX (to try this script on PoCL; its numbers "
        "say nothing about tensor cores)",
    )
    parser.add_argument("--json", metavar="FILE", help="write everything as JSON to FILE")
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget

    entry = runtime.resolve(args.device)
    selector = f"{entry.platform_index}:{entry.device_index}"
    device = runtime.select_device(selector)
    report: dict[str, Any] = {"device": device.fingerprint.to_dict(), "label": device.fingerprint.label}
    print(f"device: {device.fingerprint.label}  [{entry.platform}]  ({selector})")
    probes = runtime.capability_probes(device)
    report["probes"] = probes
    for name, reason in probes.items():
        print(f"probe {name}: {'granted' if not reason else 'not granted: ' + reason}")
    capabilities = frozenset(name for name, reason in probes.items() if not reason)
    granted = runtime.MMA_TF32 not in capabilities and (args.force or args.emulate)
    if runtime.MMA_TF32 not in capabilities and not granted:
        print("gemm_mma_tf32 does not apply on this device; nothing to run (--force builds the PTX anyway)")
        if not args.skip_fp16:
            print(f"gemm_mma_f16 does not apply on this device either (probe mma_f16: "
                  f"{probes.get(runtime.MMA_F16) or 'granted'})")
        _write(args.json, report)
        return 2
    # the device as the algorithm sees it (with --force: as if both probes had passed)
    view = _Granted(device) if granted else device
    mma = gemm_mma.GemmMmaTF32()

    # -- correctness --------------------------------------------------------------------------------
    if not args.skip_check:
        jobs, labels = [], []
        for t_index, transposes in enumerate(TRANSPOSES):
            space = mma.space(GemmProblem(*DRAW_SHAPE, *transposes), view).configs()
            pick = random.Random(args.seed * 1000 + t_index)
            configs = [("default", None)] + [
                (f"random {i}", pick.choice(space)) for i in range(args.check_configs)
            ]
            for name, config in configs:
                for s_index, shape in enumerate(CHECK_SHAPES):
                    layout = LAYOUTS[(s_index + len(labels)) % len(LAYOUTS)]
                    p = GemmProblem(*shape, *transposes, batch=layout.batch)
                    chosen = config if config is not None else mma.default(p, view)
                    jobs.append(
                        {
                            "kind": "check",
                            "problem": [*shape, *transposes, layout.batch],
                            "config": chosen,
                            "layout": dataclasses.asdict(layout),
                            "seed": len(jobs),
                            "emulate": args.emulate,
                        }
                    )
                    labels.append(f"{'nt'[transposes[0]]}{'nt'[transposes[1]]} {name}")
        print(
            f"correctness: {len(jobs)} runs ({len(TRANSPOSES)} transposes x {1 + args.check_configs} "
            f"configs x {len(CHECK_SHAPES)} shapes; batch 3 with offsets, ld > row length, gaps)",
            flush=True,
        )
        outcomes = run_jobs(selector, jobs, args.job_timeout, deadline, "check", granted)
        failures = [
            (label, job, o)
            for label, job, o in zip(labels, jobs, outcomes, strict=True)
            if o["status"] != "ok"
        ]
        worst = max((o.get("error_over_tolerance", 0) for o in outcomes if o["status"] == "ok"), default=None)
        print(
            f"correctness: {len(jobs) - len(failures)} of {len(jobs)} ok; largest error / tolerance "
            f"among the ok: {_fmt(worst, '.3f')}"
        )
        for label, job, o in failures[:15]:
            print(
                f"  FAIL {label} {job['problem']} {brief(job['config'])}: {o['status']} {o['message'][:300]}"
            )
        report["correctness"] = [
            {"label": label, **job, **o} for label, job, o in zip(labels, jobs, outcomes, strict=True)
        ]

    # -- speed ----------------------------------------------------------------------------------------
    report["shapes"] = []
    for spec in args.shapes:
        p = GemmProblem.from_spec(spec)
        space = mma.space(p, view).configs()
        default = mma.default(p, view)
        pick = random.Random(args.seed + p.m)
        others = [c for c in space if c != default]
        chosen = [default] + pick.sample(others, min(args.configs, len(others)))
        key = [p.m, p.n, p.k, int(p.trans_a), int(p.trans_b), p.batch]
        jobs = [
            {
                "kind": "time",
                "algorithm": gemm_tiled.NAME,
                "problem": key,
                "config": gemm_tiled.GemmTiled().default(p, device),
                "min_time": args.min_time,
            }
        ]
        jobs += [
            {
                "kind": "time",
                "algorithm": gemm_mma.NAME,
                "problem": key,
                "config": c,
                "min_time": args.min_time,
                "emulate": args.emulate,
            }
            for c in chosen
        ]
        print(
            f"\n{spec}: gemm_tiled default + gemm_mma_tf32 default + {len(chosen) - 1} random of "
            f"{len(space)} valid configs, each verified (TF32 tolerance) and timed",
            flush=True,
        )
        outcomes = run_jobs(selector, jobs, args.job_timeout, deadline, spec, granted)
        peers = torch_peers(p, args.min_time) if time.monotonic() < deadline + 30 else {}
        rows = [
            {"algorithm": j["algorithm"], "config": j["config"], **o, "gflops": gflops(p, o.get("time_s"))}
            for j, o in zip(jobs, outcomes, strict=True)
        ]
        mma_rows = [r for r in rows[1:] if r["gflops"]]
        best = max(mma_rows, key=lambda r: r["gflops"], default=None)
        tf32_peer = gflops(p, peers.get("torch.mm TF32"))
        # ptxas's report for the default and the fastest config (registers, spills)
        verbose = [
            {"kind": "verbose", "problem": key, "config": r["config"]}
            for r in ([rows[1]] + ([best] if best is not None and best is not rows[1] else []))
        ]
        notes = (
            []
            if args.emulate
            else run_jobs(selector, verbose, args.job_timeout, deadline + 60, "verbose", granted)
        )
        print(f"{'GFLOP/s':>9} {'vs TF32':>8}  status        config")
        for row in sorted(rows, key=lambda r: -(r["gflops"] or 0)):
            ratio = row["gflops"] / tf32_peer if row["gflops"] and tf32_peer else None
            tag = (
                "gemm_tiled default (fp32)"
                if row["algorithm"] == gemm_tiled.NAME
                else ("default " if row["config"] == default else "") + brief(row["config"])
            )
            message = "" if row["status"] == "ok" else "  " + failure_reason(row["message"])[:200]
            print(f"{_fmt(row['gflops']):>9} {_fmt(ratio, '.3f'):>8}  {row['status']:<13} {tag}{message}")
        for name, seconds in peers.items():
            ratio = gflops(p, seconds) / tf32_peer if tf32_peer else None
            print(
                f"{_fmt(gflops(p, seconds)):>9} {_fmt(ratio, '.3f'):>8}  peer          {name} (CUDA events)"
            )
        statuses: dict[str, int] = {}
        for row in rows[1:]:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        summary = {
            "shape": spec,
            "space_size": len(space),
            "statuses": statuses,
            "peers_s": peers,
            "peer_tf32_gflops": tf32_peer,
            "default_gflops": rows[1]["gflops"],
            "best_gflops": best["gflops"] if best else None,
            "best_config": best["config"] if best else None,
            "best_vs_torch_tf32": best["gflops"] / tf32_peer if best and tf32_peer else None,
            "compiler_reports": notes,
            "rows": rows,
        }
        print(
            f"summary {spec}: best {_fmt(summary['best_gflops'])} GFLOP/s = "
            f"{_fmt(summary['best_vs_torch_tf32'], '.3f')} x torch.mm TF32 ({_fmt(tf32_peer)}); default "
            f"{_fmt(summary['default_gflops'])}; statuses {statuses}"
        )
        for note, which in zip(notes, ("default", "best"), strict=False):
            text = (
                note["message"]
                if note["status"] == "ok"
                else "\n    ".join(note["message"].splitlines()[-30:])
            )
            print(f"  compiler report ({which}, {note['status']}): {text[:3000]}")
        report["shapes"].append(summary)

    # -- fp16 ----------------------------------------------------------------------------------------
    if not args.skip_fp16:
        granted16 = runtime.MMA_F16 not in capabilities and (args.force or args.emulate)
        if runtime.MMA_F16 in capabilities or granted16:
            view16 = _Granted(device) if granted16 else device
            report["fp16"] = fp16_rows(args, selector, view16, granted16, deadline + 120)
        else:
            print(f"\ngemm_mma_f16 does not apply on this device (probe mma_f16: {probes.get(runtime.MMA_F16)}); "
                  "no fp16 rows (--force builds the PTX anyway)")
            report["fp16"] = None
    report["elapsed_s"] = time.monotonic() - started
    print(f"\ndone in {report['elapsed_s']:.0f} s")
    _write(args.json, report)
    return 0


class _Granted:
    """A device seen as if every probe had passed (``--force``)."""

    def __init__(self, device: Any):
        self._device = device
        self.capabilities = frozenset({runtime.MMA_TF32, runtime.CP_ASYNC, runtime.MMA_F16})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)


def _write(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
