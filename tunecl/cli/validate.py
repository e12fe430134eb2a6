"""``tunecl validate``: a model on the opencl device against CPU torch (float32 and float64).

The work is :func:`tunecl.tools.validate.validate_net`; this module parses arguments and prints the
report (a table, or one JSON object with ``--json``). Exit code 0: every check passed; 1: a check failed
or the device run raised (e.g. a CPU fallback under ``TUNECL_FALLBACK=error``, named in the output).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any, TextIO

from tunecl.cli.nets import NET_HELP, size_help
from tunecl.cli.output import print_json, print_table
from tunecl.cli.tune import positive_int

TOLERANCES_HELP = """\
Three runs: the opencl device, CPU torch float32 and CPU torch float64 (same weights, inputs and seed).
A tensor passes when ANY of these holds:
 fp32  relative error vs CPU float32, max|opencl - cpu| / max|cpu| per tensor, within:
  output               <= 1e-3   fp32 on both sides, but tiled GEMM/conv and tree reductions sum in
  loss                 <= 1e-3   other orders (~1e-6 per op, growing with depth)
  gradients            <= 1e-2   backward doubles the depth, and batch norm at batch 1-2 over small
                                 maps divides by small standard deviations, amplifying rounding
  parameters after     <= 1e-4   over elements whose gradients have the same sign and |g| > 1e-5
  one Adam step                  (1000 eps): Adam's first step is lr * sign(g), so a near-zero gradient
                                 whose sign differs by rounding moves a parameter by up to 2 lr; those
                                 elements are counted and held to that bound only
 fp64  err(opencl) <= 8 x err(cpu) + 1e-6, err(x) = ||x - float64|| / ||float64|| (2-norms): the
       device is not much further from float64 than CPU float32 is (PyTorch's accuracy check with an
       fp64 reference). Train-mode batch norm over 2 samples on 1x1 maps is ill-conditioned: CPU
       float32 itself is 53% off float64 on resnet50's output at batch 2, image 32, and 100% or more
       on gradients, which no fixed tolerance between two float32 runs can judge. 8: measured device/CPU ratios reach 6 on such
       tensors and ~2 elsewhere; a ReLU that one run's rounding flips still fails (100x or more).
 zero  (gradients) max|ref| < 1e-4 x the model's largest gradient G (ref: float32 or float64) is zero
       but for rounding (a conv bias before batch norm) and passes on max abs error <= 1e-2 x 1e-4 x G
 own output    (loss) the loss is the float64 cross-entropy of the device's own output to 1e-5 rel
 own gradient  (parameters) the parameter is Adam's first step on the device's own gradient,
               p0 - lr * g / (|g| + eps) in float64, to 1e-4 rel: where |g| ~ 1e-5 an ill-conditioned
               gradient moves the step by ~1e-3 lr, 1e-3 relative on a bias initialised to zero
Under TUNECL_FALLBACK=error an op without an OpenCL kernel raises, and validate fails naming it.
exit code: 0 every check passed, 1 a check failed or the device run raised."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate", help="compare a model on the opencl device with CPU torch (exit 1 on a mismatch)",
        description=textwrap.fill(
            "Run a model (random weights) on the opencl device, on the CPU in float32 and on the CPU in "
            "float64 with the same weights, inputs and seed. Without --train: one eval-mode forward, the "
            "outputs compared. With --train: train-mode forward, cross-entropy loss, backward and one Adam "
            "step (lr 1e-3), comparing output, loss, every parameter gradient and every parameter after "
            "the step.", 100),
        epilog=TOLERANCES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--net", metavar="NAME", required=True,
                        help=NET_HELP)
    parser.add_argument("--device", metavar="SEL",
                        help="OpenCL device for opencl:0: index, name part or platform:device "
                             "(default: TUNECL_DEVICE or 0)")
    parser.add_argument("--train", action="store_true", help="compare a training step, not inference")
    parser.add_argument("--batch", type=positive_int, default=2, help="batch size (default 2)")
    parser.add_argument("--image-size", type=positive_int, default=64, help=size_help(64))
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs")
    parser.add_argument("--compile", action="store_true",
                        help="run the device's model (and Adam step, capturable) through torch.compile(..., "
                             "backend='tunecl'): the same step three times from the same weights and seed "
                             "(a warm-up, the capture, a replay), the replay compared")
    parser.add_argument("--locate", action="store_true",
                        help="instead of the checks: compare every module's output (with --train also the "
                             "gradient reaching it) and list the first ones where the device departs from "
                             "float64 further than CPU float32 does (the fp64 bound below); exit code 1 "
                             "where any does")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tunecl.tools.validate import validate_net

    if args.locate:
        return _locate(args)
    report = validate_net(args.net, device=args.device, train=args.train, batch=args.batch,
                          image_size=args.image_size, seed=args.seed, compiled=args.compile)
    if args.json:
        print_json(report.to_dict())
    else:
        print_report(report)
    return report.exit_code


def _locate(args: argparse.Namespace) -> int:
    import dataclasses

    from tunecl.errors import TuneclError
    from tunecl.tools.locate import locate

    if args.compile:
        raise TuneclError("--locate runs the model eagerly (module hooks); leave out --compile")
    found = locate(args.net, device=args.device, train=args.train, batch=args.batch,
                   image_size=args.image_size, seed=args.seed)
    if args.json:
        print_json(dataclasses.asdict(found))
        return found.exit_code
    what = "outputs and the gradients reaching them" if found.train else "outputs"
    print(f"{found.net} on {found.device}: every module's {what} against CPU torch float32 and float64, "
          f"batch {args.batch}, image {args.image_size} ({found.outputs} outputs"
          + (f", {found.gradients} gradients" if found.train else "") + " compared)")
    if found.departures:
        print(file=sys.stdout)
        print_table(["phase", "module", "kind", "shape", "err64", "cpu err64", "ratio"],
                    [[d.phase, d.module, d.kind, "x".join(map(str, d.shape)), _num(d.device_error),
                      _num(d.cpu_error), f"{d.device_error / d.cpu_error:.2f}" if d.cpu_error else "-"]
                     for d in found.departures])
        print(f"\nDEPARTS: {len(found.departures)} listed, by phase in the order the run reached them; errors "
              f"propagate, so the first of each phase is where to look")
    else:
        from tunecl.tools.tolerances import Tolerances

        tol = Tolerances()
        print(f"none departs: the device is within {tol.multiplier:g} x CPU float32's error against float64 "
              f"+ {tol.floor:g} everywhere")
    return found.exit_code


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _ratio(check: Any) -> str:
    return "-" if check is None or check.fp64_ratio is None else f"{check.fp64_ratio:.2f}"


def _by(check: Any) -> str:
    return "-" if check is None else (check.passed_by or "FAIL")


def print_report(report: Any, out: TextIO | None = None) -> None:
    """The human form of a :class:`tunecl.tools.validate.ValidationReport`.

    Per tensor: ``rel`` against CPU float32, ``err64`` (the device's normwise error against float64),
    ``cpu err64`` (CPU float32's), their ratio and the criterion that passed (``by``).
    """
    out = out or sys.stdout
    tol = report.tolerances
    mode = ("train step (train-mode forward, CE loss, backward, Adam)" if report.train
            else "inference (eval mode)")
    if report.compiled:
        mode += ", compiled (torch.compile backend='tunecl', the replay compared)"
    print(f"{report.net} on {report.device} vs CPU torch float32 and float64: {mode}, batch {report.batch}, "
          f"image {report.image_size}", file=out)
    print(f"tolerances: {tol.describe(report.train)}; relative: max|opencl - cpu| / max|cpu| per tensor",
          file=out)
    print(file=out)
    checks = {(c.kind, c.name): c for c in report.checks}
    rows = [[c.kind, _num(c.max_abs), _num(c.max_rel), f"{c.tolerance:g}", _num(c.fp64_error),
             _num(c.cpu_fp64_error), _ratio(c), _by(c), c.note]
            for c in report.checks if c.kind in ("output", "loss")]
    if rows:
        print_table(["tensor", "max abs", "rel", "tol rel", "err64", "cpu err64", "ratio", "by", "note"], rows,
                    out=out)
    grads = [c for c in report.checks if c.kind == "grad"]
    if grads:
        print(file=out)
        table = []
        for g in grads:
            p = checks.get(("param", g.name))
            table.append([g.name, _num(g.max_rel), _num(g.fp64_error), _num(g.cpu_fp64_error), _ratio(g), _by(g),
                          _num(p.max_rel if p else None), _num(p.fp64_error if p else None),
                          _num(p.cpu_fp64_error if p else None), _by(p),
                          "; ".join(n for n in (g.note, p.note if p else "") if n)])
        print_table(["parameter", f"grad rel (<={tol.grad:g})", "err64", "cpu err64", "ratio", "by",
                     f"step rel (<={tol.param:g})", "err64", "cpu err64", "by", "note"], table, out=out)
    print(file=out)
    if report.fallback_ops:
        ops = ", ".join(f"{op} {n}" for op, n in report.fallback_ops.items())
        print(f"fallback  {sum(report.fallback_ops.values())} calls ran on the CPU fallback: {ops}", file=out)
    else:
        print("fallback  none: every op ran on the device", file=out)
    if report.plan_sources:
        print("plans     " + ", ".join(f"{s} {n}" for s, n in report.plan_sources.items()), file=out)
    if report.compile_stats is not None:
        counters = report.compile_stats
        eager = {k.partition(":")[2] or k: n for k, n in counters.items() if k.startswith("eager")}
        print(f"compile   captures {counters.get('captures', 0)}, replays {counters.get('replays', 0)}"
              + "".join(f"; ran eagerly: {why} {n}" for why, n in eager.items()), file=out)
    if report.seconds:
        print("seconds   " + ", ".join(f"{k} {v:.2f}" for k, v in report.seconds.items()), file=out)
    if report.checks:
        by = {}
        for c in report.checks:
            by[c.passed_by or "FAIL"] = by.get(c.passed_by or "FAIL", 0) + 1
        print("criteria  " + ", ".join(f"{k} {n}" for k, n in by.items()), file=out)
    if report.error is not None:
        op = f" (op {report.error_op})" if report.error_op else ""
        print(f"FAIL: the device run raised{op}: {report.error}", file=out)
    elif report.passed:
        print(f"PASS: {len(report.checks)} of {len(report.checks)} checks within tolerance", file=out)
    else:
        names = ", ".join(f"{c.kind} {c.name}" if c.kind != c.name else c.kind for c in report.failures[:8])
        more = f" and {len(report.failures) - 8} more" if len(report.failures) > 8 else ""
        print(f"FAIL: {len(report.failures)} of {len(report.checks)} checks over tolerance: {names}{more}",
              file=out)
