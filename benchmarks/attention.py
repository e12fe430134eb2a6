"""scaled_dot_product_attention on the device: the fused kernels next to the math decomposition (matmul,
softmax, matmul on the device's kernels), and torch's own SDPA as the peer, timed in the same run.

For each sequence length (L = S, ``--seq``; head dim ``--head-dim``, ``--heads`` heads, ``--batch``), the
opencl rows are ``fused`` (the fused kernels: the call under
``torch.nn.attention.sdpa_kernel([SDPBackend.OVERRIDEABLE])``, which the backend takes for inference and,
on GPUs, for training) and ``math`` (under ``sdpa_kernel([SDPBackend.MATH])``: what a CPU device trains on), each timed ``--iterations`` times per round over
``--rounds`` interleaved rounds: device time (the sum of the call's kernel events,
:class:`tunecl.profiling.KernelProfile`) and wall time to completion. The peer is torch's SDPA on CUDA
(timed by CUDA events; flash or memory-efficient kernels, as torch picks) where torch sees CUDA, else on
the CPU (wall time). It is measured in a child process that never imports ``tunecl.backend``: a CUDA
backward fails inside torch in a process where a PrivateUse1 device is registered (pytorch/pytorch#161129). ``--backward`` times
the forward and backward of ``out.backward(grad)`` instead of the forward alone. ``--dropout P`` passes
``dropout_p=P`` to every call, the peer's too: the fused kernels then draw the dropout decisions themselves
(device draws, ``TUNECL_RANDOM=device``, as on GPUs by default), the math route stores its scores and draws
a mask. Each figure is the median over rounds of the round medians; ``spread`` is (slowest - fastest round
median) / median. The fused and math results are checked against CPU float64 before timing (with
``--dropout``, the fused route's against CPU float64 computing the keep decisions its key draws).

    python benchmarks/attention.py --seq 128 512 --iterations 3           # PoCL
    python benchmarks/attention.py --device nvidia --backward --record benchmarks/results/results.csv
    python benchmarks/attention.py --device nvidia --backward --dropout 0.1 --batch 16 --heads 12 --seq 128 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

SEQ = [128, 512, 2048]


def _inputs(device: str, args: argparse.Namespace, seq: int, grad: bool) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.heads, seq, args.head_dim)
    return [torch.randn(shape, generator=generator).to(device).requires_grad_(grad) for _ in range(4)]


def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, args: argparse.Namespace) -> None:
    out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal, dropout_p=args.dropout)
    if args.backward:
        out.backward(grad)


def _spread(medians: list[float]) -> float:
    return (max(medians) - min(medians)) / statistics.median(medians)


def peer_seconds(seq: int, args: argparse.Namespace) -> tuple[str, list[float]]:
    """torch's SDPA on CUDA (event time) or the CPU (wall time): one median per round."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, g = _inputs(device, args, seq, args.backward)
    _call(q, k, v, g, args)
    rounds = []
    for _ in range(args.rounds):
        times = []
        for _ in range(args.iterations):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _call(q, k, v, g, args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            else:
                begin = time.perf_counter()
                _call(q, k, v, g, args)
                times.append(time.perf_counter() - begin)
        rounds.append(statistics.median(times))
    return f"torch {device}", rounds


def _peers_in_child(argv: list[str]) -> dict[int, tuple[str, list[float]]]:
    """:func:`peer_seconds` of every ``--seq``, measured by this script in a child process."""
    done = subprocess.run([sys.executable, __file__, "--peer-only", *argv], check=True, capture_output=True, text=True)
    return {int(seq): (name, rounds) for seq, (name, rounds) in json.loads(done.stdout.splitlines()[-1]).items()}


def _check(seq: int, args: argparse.Namespace) -> None:
    """The fused and the math route against CPU float64, forward and (with --backward) gradients; with
    --dropout also the fused route's dropout against CPU float64 computing its key's keep decisions."""
    q, k, v, g = _inputs("cpu", args, min(seq, 256), True)
    for route, dropout in (("fused", 0.0), ("math", 0.0)) + ((("fused", args.dropout),) if args.dropout else ()):
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        dev = [t.detach().to("opencl").requires_grad_() for t in (q, k, v)]
        torch.manual_seed(args.seed)
        with sdpa_kernel([SDPBackend.OVERRIDEABLE if route == "fused" else SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(*dev, is_causal=args.causal, dropout_p=dropout)
            out.backward(g.detach().to("opencl"))
        keep = None
        if dropout:
            from tunecl.backend import memory, random_draws, state

            torch.manual_seed(args.seed)   # the key the call drew
            mask = memory.empty_contiguous((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), torch.bool)
            state.get().random.bernoulli_keyed(memory.buffer_of(mask), mask.storage_offset(), mask.numel(),
                                               1.0 - dropout, random_draws.key(), "bool")
            keep = mask.cpu().double() / (1.0 - dropout)
        expected = _reference(*leaves, args.causal, keep)
        expected.backward(g.detach().double())
        pairs = [(out, expected)] + [(d.grad, c.grad) for d, c in zip(dev, leaves)]
        for got, want in pairs:
            error = (got.detach().cpu().double() - want.detach()).abs().max().item()
            if error > 1e-3:
                raise SystemExit(f"seq {seq}: the {route} route{' with dropout' if dropout else ''} is off by "
                                 f"{error:.2e} from CPU float64")


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               keep: torch.Tensor | None) -> torch.Tensor:
    """Attention in float64 on the CPU, the probabilities times ``keep`` (kept / (1 - p), else 0) if given."""
    if keep is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, -1) * keep) @ v


def opencl_seconds(seq: int, route: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Device and wall seconds of one call on the route, one median of each per round."""
    from tunecl.profiling import KernelProfile

    q, k, v, g = _inputs("opencl", args, seq, args.backward)
    backends = [SDPBackend.OVERRIDEABLE if route == "fused" else SDPBackend.MATH]
    with sdpa_kernel(backends):
        _call(q, k, v, g, args)   # (compiles)
        torch.opencl.synchronize()
        device_rounds, wall_rounds = [], []
        for _ in range(args.rounds):
            device_times, wall_times = [], []
            for _ in range(args.iterations):
                for t in (q, k, v):
                    t.grad = None
                begin = time.perf_counter()
                with KernelProfile() as profile:
                    _call(q, k, v, g, args)
                    torch.opencl.synchronize()
                wall_times.append(time.perf_counter() - begin)
                device_times.append(sum(row.seconds for row in profile.summary()))
            device_rounds.append(statistics.median(device_times))
            wall_rounds.append(statistics.median(wall_times))
    return device_rounds, wall_rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="device selector (default: TUNECL_DEVICE or 0)")
    parser.add_argument("--seq", nargs="+", type=int, default=SEQ, help=f"sequence lengths (default {SEQ})")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--dropout", type=float, default=0.0, metavar="P", help="dropout_p of every call (default 0)")
    parser.add_argument("--iterations", type=int, default=10, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    parser.add_argument("--record", metavar="FILE.csv", help="append fused-vs-peer and fused-vs-math rows")
    parser.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)   # the peer's child process
    args = parser.parse_args(argv)
    if args.peer_only:
        if "tunecl.backend" in sys.modules:
            raise RuntimeError("the peer must be timed without tunecl.backend imported")
        print(json.dumps({seq: peer_seconds(seq, args) for seq in args.seq}))
        return 0
    from tunecl.tools import record

    if args.record:
        record.check_argument(parser.prog, args.record)
    peers = _peers_in_child(sys.argv[1:] if argv is None else list(argv))
    if args.device is not None:
        os.environ["TUNECL_DEVICE"] = args.device
    if args.dropout:
        os.environ["TUNECL_RANDOM"] = "device"   # (the fused kernels draw dropout where draws are on the device)
    import tunecl.backend  # noqa: F401  (after TUNECL_DEVICE is set)

    what = "forward + backward" if args.backward else "forward"
    dropout = f", dropout {args.dropout}" if args.dropout else ""
    print(f"scaled_dot_product_attention {what}, batch {args.batch}, {args.heads} heads, head dim {args.head_dim}"
          f"{', causal' if args.causal else ''}{dropout}, float32; median of {args.iterations} x {args.rounds} rounds; "
          f"device {torch.opencl.get_device_name()}")
    print(f"{'seq':>5}  {'fused dev ms':>12}  {'wall ms':>8}  {'spread':>6}  {'math dev ms':>11}  {'wall ms':>8}  "
          f"{'math/fused':>10}  {'peer':>10}  {'peer ms':>8}  {'spread':>6}  {'fused/peer':>10}")
    rows: list[dict[str, Any]] = []
    for seq in args.seq:
        _check(seq, args)
        fused_dev, fused_wall = opencl_seconds(seq, "fused", args)
        math_dev, math_wall = opencl_seconds(seq, "math", args)
        peer, peer_rounds = peers[seq]
        fused, fused_w, math_, math_w, theirs = (statistics.median(r) for r in (
            fused_dev, fused_wall, math_dev, math_wall, peer_rounds))
        # a CUDA peer is device time (events), a CPU peer wall time: compare like with like
        ours_vs_peer = fused if peer == "torch cuda" else fused_w
        print(f"{seq:>5}  {fused * 1e3:>12.3f}  {fused_w * 1e3:>8.3f}  {_spread(fused_dev):>6.1%}  "
              f"{math_ * 1e3:>11.3f}  {math_w * 1e3:>8.3f}  {math_ / fused:>10.2f}  {peer:>10}  "
              f"{theirs * 1e3:>8.3f}  {_spread(peer_rounds):>6.1%}  {ours_vs_peer / theirs:>10.2f}")
        rows.append({"seq": seq, "fused_device_s": fused, "fused_wall_s": fused_w, "fused_spread": _spread(fused_dev),
                     "math_device_s": math_, "math_wall_s": math_w, "math_spread": _spread(math_dev),
                     "peer": peer, "peer_s": theirs, "peer_spread": _spread(peer_rounds)})
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                                               "causal": args.causal, "backward": args.backward,
                                               "dropout": args.dropout, "rows": rows},
                                              indent=1))
    if args.record:
        command = record.script_command(__file__, argv)
        commit = record.code_version()
        device = torch.opencl.get_device_name()
        recorded = []
        for r in rows:
            workload = (f"sdpa b{args.batch} h{args.heads} L{r['seq']} d{args.head_dim}"
                        f"{' causal' if args.causal else ''}{f' dropout {args.dropout}' if args.dropout else ''}"
                        f" {'fwd+bwd' if args.backward else 'fwd'}")
            ours = r["fused_device_s"] if r["peer"] == "torch cuda" else r["fused_wall_s"]
            recorded.append(record.row(device=device, benchmark="attention", workload=workload, precision="fp32",
                                       unit="ms", ours=ours * 1e3, peer=r["peer_s"] * 1e3, peer_name=r["peer"],
                                       command=command, commit=commit))
            recorded.append(record.row(device=device, benchmark="attention", workload=workload, precision="fp32",
                                       unit="ms", ours=r["fused_device_s"] * 1e3, peer=r["math_device_s"] * 1e3,
                                       peer_name="tunecl math decomposition", command=command, commit=commit))
        record.append(args.record, recorded)
        print(f"recorded {len(recorded)} rows in {args.record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
