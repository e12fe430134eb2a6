"""``tunecl tune``: tune one GEMM, convolution or attention on a device and store the winner in the tuning DB.

The work is :func:`tunecl.tune.tune_problem`; this module parses arguments, draws a progress line on
stderr and prints the outcome (a summary, or one JSON object with ``--json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, TextIO

from tunecl import config
from tunecl.cli.eta import Eta
from tunecl.cli.output import print_json, print_table
from tunecl.precision import PRECISIONS
from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem

SAMPLERS = ("tpe", "random", "grid")  # the search layer's names (kept here so --help imports nothing)



def _storage(args) -> str | None:
    """``--storage``, else the studies next to ``--db`` when that is given, else the configured storage."""
    if args.storage:
        return args.storage
    return config.studies_next_to(args.db) if args.db else None

def gemm_spec(text: str) -> GemmProblem:
    """argparse type of ``--gemm M,N,K[,ta,tb[,batch]][,dtype=float16]``."""
    try:
        return GemmProblem.from_spec(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def conv_spec(text: str) -> ConvProblem:
    """argparse type of ``--conv n=..,c=..,h=..,w=..,k=..,r=..[,stride=..,pad=..,dil=..,groups=..,dir=..,
    dtype=float16]``."""
    body = text.removeprefix("conv:")
    try:
        return ConvProblem.parse(body)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad convolution spec: {error}") from None


def attention_spec(text: str) -> AttentionProblem:
    """argparse type of ``--attention b=..,h=..,l=..,s=..,e=..[,ev=..,causal=0|1,mask=none|bool|float,
    dir=fwd|bwd,dtype=float16]``."""
    body = text.removeprefix("attention:")
    try:
        return AttentionProblem.parse(body)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad attention spec: {error}") from None


def _number(text: str, convert: type, expected: str) -> Any:
    """``convert(text)``; if it does not parse, the argparse error "expected ..., got 'text'"."""
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text: str, expected: str = "a positive integer") -> int:
    """argparse type of an integer >= 1 (``expected`` words the errors)."""
    value = _number(text, int, expected)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int, "an integer ≥ 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {value}")
    return value


def positive_seconds(text: str) -> float:
    value = _number(text, float, "seconds")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def usage_error(message: str) -> int:
    """A usage error found after parsing (it needs the device or the problem): as argparse words it, exit 2."""
    print(f"tunecl tune: error: {message}", file=sys.stderr)
    return 2


def try_spec(text: str) -> tuple[str, dict[str, int]]:
    from tunecl.search.space import parse_named

    try:
        return parse_named(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def algorithm_names(text: str) -> list[str]:
    """``NAME[,NAME...]``: registered algorithm names (an unknown one is a usage error that lists them)."""
    from tunecl import kernels

    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty algorithm name in {text!r}")
    for name in names:
        try:
            kernels.algorithm(name)
        except KeyError as error:
            raise argparse.ArgumentTypeError(str(error.args[0])) from None
    return list(dict.fromkeys(names))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune", help="tune a GEMM, convolution or attention on a device and store the winner",
        description="Search the algorithms and parameters of one problem on one device with Optuna, "
                    "verify every candidate against a CPU reference, re-measure the best few and store "
                    "each algorithm's best in the tuning DB. Interrupted runs resume from the Optuna "
                    "study (same device, problem, algorithm versions and sampler).")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--gemm", metavar="M,N,K[,ta,tb[,batch]][,dtype=float16]", type=gemm_spec,
                      help="C = op(A) @ op(B), row-major; ta/tb are 0 or 1 (e.g. 1024,1024,1024); "
                           "dtype=float16: half A, B, C (default float32)")
    what.add_argument("--conv", metavar="SPEC", type=conv_spec,
                      help="n=16,c=64,h=56,w=56,k=64,r=3[,stride=1,pad=1,dil=1,groups=1,dir=fwd]"
                           "[,dtype=float16] (float16: half x, w, dy and outputs; default float32)")
    what.add_argument("--attention", metavar="SPEC", type=attention_spec,
                      help="fused scaled-dot-product attention of b batches x h heads, queries l x e, keys "
                           "s x e, values s x ev: b=2,h=4,l=128,s=128,e=64[,ev=64,causal=0,mask=none,dir=fwd]"
                           "[,dtype=float16] (mask: none, bool or float, broadcast over the heads; causal=1 "
                           "takes no mask; dir=bwd: the gradients of q, k and v; float16: half tensors)")
    what.add_argument("--net", metavar="NAME",
                      help="every conv, GEMM and attention problem (linear layers, and the fused attention "
                           "of scaled_dot_product_attention, else its products) of a "
                           "torchvision model (resnet50, vit_b_16, swin_t), of hf:bert / hf:gpt2 (small "
                           "configs) or hf:bert-base / hf:gpt2-base (--image-size is then the sequence "
                           "length) or of package.module:factory; "
                           "a line on stderr as each problem starts (with the time "
                           "elapsed and an estimate of the time left) and one as it ends")
    parser.add_argument("--device", metavar="SEL",
                        help="device index, name part or platform:device (default: TUNECL_DEVICE or 0)")
    net = parser.add_argument_group("with --net")
    net.add_argument("--batch", type=positive_int, default=16, help="batch size (default 16)")
    net.add_argument("--image-size", type=positive_int, default=224, help="input height/width (default 224)")
    net.add_argument("--train", action="store_true", help="also tune both backward directions")
    net.add_argument("--total-time-limit", type=positive_seconds, metavar="S",
                     help="start no new problem after S seconds; without --time-limit and --trials, S "
                          "is also shared: each problem searches for its share of the FLOPs of the problems "
                          "still to tune times what is left of S (at least 2 s), so the run ends near S "
                          "(default with neither: 20 s per problem, at most 600 s)")
    net.add_argument("--retune", action="store_true",
                     help="tune problems the DB already holds for this device at the current versions")
    parser.add_argument("--trials", type=positive_int, metavar="N",
                        help="evaluations in the study, resumed ones included (default: the whole space "
                             "when it has ≤ 200 valid configs, else 100 unless --time-limit is given)")
    parser.add_argument("--time-limit", type=positive_seconds, metavar="S",
                        help="seconds of searching per problem (with --net and neither this nor --trials, "
                             "the problems share a total budget: see --total-time-limit). Every algorithm's default config (and each "
                             "--try config) is measured even past the limit, so that the tuned result is "
                             "never slower than the default, and the final re-measurement of the best "
                             "configs comes on top: a run can take longer than S")
    parser.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="search strategy (default: tpe)")
    parser.add_argument("--patience", type=non_negative_int, metavar="N", default=None,
                        help="stop after N evaluations without a 1%% gain (default 40; 0: never)")
    parser.add_argument("--min-time", type=positive_seconds, metavar="S", default=None,
                        help="measure each candidate until its samples add up to S seconds (default 0.1)")
    parser.add_argument("--jobs", "-j", type=positive_int, metavar="J", default=None,
                        help="compile up to J candidates at once in worker processes; they are still "
                             "measured one at a time (default: with --net the CPU cores this process may "
                             "use, at most 8; else 1)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="the precision results must satisfy: fp32 (strict, default) or tf32 (also "
                             "tensor-core TF32 algorithms where the device has them; each result is "
                             "verified and stored under its own algorithm's precision)")
    parser.add_argument("--algorithms", metavar="NAME[,NAME...]", type=algorithm_names,
                        help="search only these algorithms (registered names, e.g. conv_1x1_wgmma_tf32, "
                             "gemm_simt), for instance to add a new family's results without searching "
                             "the others again; with --net a problem counts as tuned when each of them "
                             "that applies has a stored result, and problems none of them applies to are "
                             "listed as not applicable")
    parser.add_argument("--warm-start", type=non_negative_int, default=0, metavar="N",   # tunecl.tune.WARM_START
                        help="start each search from up to N configs: the winners of the most similar "
                             "problems stored for this device model (same kind and kernel shape, other "
                             "batch or sizes; the DB and the shipped results), measured and verified right "
                             "after the defaults (default 0: none; they take trials from the search)")
    parser.add_argument("--try", dest="tries", metavar="ALG[:K=V,...]", type=try_spec, action="append",
                        default=[],
                        help="with --gemm, --conv or --attention: also evaluate ALG's default with these parameters "
                             "changed, right after the defaults, e.g. a config found elsewhere: --try "
                             "gemm_tiled:MWG=128,NWG=256 (repeatable; like the defaults, measured before a "
                             "time limit or --patience stops the search, but counted among --trials)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and the sampler")
    parser.add_argument("--db", metavar="URL", help="tuning DB URL or SQLite file (default: TUNECL_DB)")
    parser.add_argument("--storage", metavar="URL",
                        help="Optuna storage of the studies: an RDB URL (sqlite:///..., postgresql://...), "
                             "journal:///abs/path.log (Optuna's journal file) or a SQLite file (default: "
                             "TUNECL_STORAGE, else NAME-studies.sqlite next to the DB NAME.sqlite); processes "
                             "given the same --storage and --db share the work")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    parser.add_argument("--no-progress", action="store_true",
                        help="do not draw the progress line (it is drawn only when stderr is a terminal: a "
                             "log file gets the per-problem lines, not ten redraws a second)")
    parser.set_defaults(func=run)


class ProgressLine:
    """A one-line progress display on a stream, redrawn with ``\\r`` at most 10 times a second."""

    def __init__(self, out: TextIO, flops: int):
        self.out = out
        self.flops = flops
        self.start = time.monotonic()
        self.last_draw = 0.0
        self.width = 0

    def __call__(self, progress: Any) -> None:
        now = time.monotonic()
        final = progress.total is not None and progress.done >= progress.total
        if now - self.last_draw < 0.1 and not final:
            return
        self.last_draw = now
        total = "?" if progress.total is None else str(progress.total)
        label = "trials" if progress.phase == "search" else "re-measured"
        best = progress.best
        best_text = (f"best {best.time * 1e3:.4g} ms {self.flops / best.time * 1e-9:.1f} GFLOP/s "
                     f"({best.algorithm})" if best is not None else "best -")
        line = f"tuning: {progress.done}/{total} {label}  {best_text}  {now - self.start:.1f} s"
        self.out.write("\r" + line.ljust(self.width))
        self.width = len(line)
        self.out.flush()

    def close(self) -> None:
        if self.width:
            self.out.write("\n")
            self.out.flush()


def progress_line(args: argparse.Namespace, out: TextIO, flops: int) -> ProgressLine | None:
    """The progress line for one problem, or None with ``--no-progress`` or when ``out`` is not a terminal."""
    if args.no_progress or not out.isatty():
        return None
    return ProgressLine(out, flops)


def default_net_jobs() -> int:
    """``--jobs`` of a net's tuning when not given: the cores this process may use, at most 8.

    A net has dozens of problems, so the build processes (kept across problems) pay for their start
    many times over, and compiling candidates is most of the tuning time.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def run(args: argparse.Namespace) -> int:
    from tunecl import runtime
    from tunecl.db import TuningDB
    from tunecl.search.measure import TimingPolicy
    from tunecl.search.tuner import DEFAULT_PATIENCE
    from tunecl.tune import tune_problem

    device = runtime.select_device(args.device)
    jobs = args.jobs if args.jobs is not None else (default_net_jobs() if args.net is not None else 1)
    options: dict[str, Any] = {"seed": args.seed, "jobs": jobs, "precision": args.precision,
                               "warm_start": args.warm_start}
    if args.algorithms:
        from tunecl import kernels

        options["algorithms"] = [kernels.algorithm(name) for name in args.algorithms]
    if args.patience is not None:
        options["patience"] = args.patience or None
    else:
        options["patience"] = DEFAULT_PATIENCE
    if args.min_time is not None:
        options["policy"] = TimingPolicy(min_time=args.min_time)
    if args.net is not None:
        if args.tries:
            return usage_error("--try goes with --gemm, --conv or --attention (one problem), not --net")
        return run_net(args, device, options)
    options["seeds"] = args.tries
    problem = next(p for p in (args.gemm, args.conv, args.attention) if p is not None)
    progress = progress_line(args, sys.stderr, problem.flops)
    with TuningDB(args.db) as db:
        try:
            outcome = tune_problem(problem, device, db, trials=args.trials, time_limit=args.time_limit,
                                   sampler=args.sampler, storage_url=_storage(args), progress=progress,
                                   **options)
        except ValueError as error:   # a --try that does not fit this problem, device or precision
            return usage_error(f"--try: {error}")
        finally:
            if progress is not None:
                progress.close()
        stored_in = db.display_url
    if args.json:
        data = outcome.to_dict()
        data["db"] = stored_in
        print_json(data)
    else:
        print_outcome(outcome, stored_in)
    return 0 if outcome.winner is not None else 1


def _round(value: float | None) -> float | None:
    """Four significant digits, as a number."""
    return None if value is None else float(f"{value:.4g}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


def print_outcome(outcome: Any, stored_in: str, out: TextIO | None = None) -> None:
    """The human summary of a :class:`~tunecl.search.tuner.TuneOutcome`."""
    from tunecl.tune import failure_counts

    out = out or sys.stdout
    w, d = outcome.winner, outcome.default

    def line(label: str, text: str) -> None:
        print(f"{label:<10}{text}", file=out)

    space = outcome.space_size if outcome.space_size is not None else "many"
    line("problem", f"{outcome.problem.key}  ({outcome.problem.flops / 1e9:.4g} GFLOP)")
    line("device", outcome.device)
    line("search", f"{outcome.strategy}: {outcome.trials} trials ({outcome.resumed} resumed, "
                   f"{outcome.invalid} invalid proposals skipped) of {space} valid configs; "
                   f"stopped by {outcome.stop_reason.replace('_', ' ')} after {outcome.elapsed:.1f} s")
    failures = failure_counts(outcome.statuses)
    if failures:
        line("failures", failures)
    if d is not None:
        text = (f"{_ms(d.time)} ms  {outcome.gflops(d):.2f} GFLOP/s  ({d.algorithm} default)" if d.ok
                else f"{d.algorithm} default failed: {d.status.value} {d.message}")
        line("default", text)
    if w is None:
        line("best", "no candidate passed verification; nothing was stored")
        return
    speedup = outcome.speedup
    line("best", f"{_ms(w.time)} ms  {outcome.gflops(w):.2f} GFLOP/s"
                 + (f"  ({speedup:.2f}x the default)" if speedup is not None else ""))
    for r in outcome.tried:   # configs asked for with --try
        differs = {k: v for k, v in r.config.items() if outcome.defaults.get(r.algorithm) is None
                   or outcome.defaults[r.algorithm].config.get(k) != v}
        what = f"{r.algorithm} " + " ".join(f"{k}={v}" for k, v in differs.items())
        line("tried", f"{what}: {_ms(r.time)} ms  {outcome.gflops(r):.2f} GFLOP/s" if r.ok
             else f"{what}: {r.status.value.replace('_', ' ')} {r.message}".rstrip())
    if outcome.hints == 1:
        line("warm", "started from 1 config of a similar stored problem; the winner "
                     + ("is that config" if outcome.hint_won else "is not that config"))
    elif outcome.hints:
        line("warm", f"started from {outcome.hints} configs of similar stored problems; the winner "
                     + ("is one of them" if outcome.hint_won else "is not one of them"))
    precision = outcome.precision_of(w.algorithm)
    line("chosen", f"{w.algorithm} v{outcome.versions[w.algorithm]}"
                   + ("" if precision == "fp32" else f" ({precision})") + "  "
                   + " ".join(f"{k}={v}" for k, v in w.config.items()))
    rows = []
    for name in outcome.versions:
        best = outcome.per_algorithm.get(name)
        default = outcome.defaults.get(name)
        default_ok = default is not None and default.ok
        # numbers stay numbers (print_table right-aligns a column that is all numbers)
        rows.append([name, outcome.trials_per_algorithm.get(name, 0),
                     _round(best.time * 1e3) if best else "-",
                     _round(outcome.gflops(best)) if best else "-",
                     _round(default.time * 1e3) if default_ok else "-",
                     f"{default.time / best.time:.2f}x" if best and default_ok else "-"])
    print(file=out)
    print_table(["algorithm", "trials", "best ms", "GFLOP/s", "default ms", "speedup"], rows, out=out)
    print(file=out)
    line("stored", stored_in)
    line("study", f"{outcome.study_name}  in {outcome.storage_url}")


NET_TIME_LIMIT = 20.0  # seconds per problem of the default total budget of --net ...
NET_TOTAL_TIME_LIMIT = 600.0  # ... and its most: a net of many problems is tuned in about 10 minutes


def run_net(args: argparse.Namespace, device: Any, options: dict[str, Any]) -> int:
    """``tunecl tune --net``: tune a model's whole workload, one line per problem, then a summary."""
    from tunecl.db import TuningDB
    from tunecl.errors import TuneclError
    from tunecl.search.workload import net_problems
    from tunecl.tune import MIN_SHARE_S, tune_workload

    try:
        workload = net_problems(args.net, args.batch, args.image_size, train=args.train,
                                device_type=device.fingerprint.device_type)
    except ValueError as error:
        if str(error).startswith("unknown model"):   # it names the known models itself
            raise TuneclError(str(error)) from None
        raise TuneclError(f"cannot extract the workload of {args.net!r}: {error}") from None
    except (ImportError, AttributeError) as error:
        raise TuneclError(f"cannot extract the workload of {args.net!r}: {error}") from None
    total = len(workload)
    err = sys.stderr
    shared = args.trials is None and args.time_limit is None
    if shared and args.total_time_limit is None:
        # The single-problem default (100 trials or the whole small space) averaged ~40 s per problem
        # on the H200: 16 minutes for resnet50's 24 forward problems. A net gets a total time budget
        # instead, which its problems share by their FLOPs (tune_workload).
        args.total_time_limit = min(NET_TIME_LIMIT * total, NET_TOTAL_TIME_LIMIT)
    print(f"{args.net} batch {args.batch} image {args.image_size}{' train' if args.train else ''}: "
          f"{total} unique problems ({sum(workload.values())} calls) on {device.fingerprint.label}", file=err)
    if shared:
        print(f"budget: {args.total_time_limit:g} s in all, shared by the problems to tune in proportion to their "
              f"FLOPs (at least {MIN_SHARE_S:g} s each)", file=err)
    else:
        budget = [f"{args.trials} trials"] if args.trials is not None else []
        budget += [f"{args.time_limit:g} s"] if args.time_limit is not None else []
        print(f"budget per problem: {' or '.join(budget)}", file=err)
    progress: ProgressLine | None = None
    eta = Eta(total, args.total_time_limit)

    def on_start(index: int, problem: Any) -> None:
        nonlocal progress
        print(f"[{index + 1}/{total}] {problem.key}  ({eta.status()})", file=err, flush=True)
        progress = progress_line(args, err, problem.flops)

    def on_done(index: int, row: Any) -> None:
        nonlocal progress
        eta.finished_one()
        if progress is not None:
            progress.close()
            progress = None
        if row.status == "tuned":
            print(f"[{index + 1}/{total}] tuned in {row.seconds:.1f} s: {row.algorithm}, "
                  f"{_round(_ms_num(row.default_s)) or '-'} -> {_round(_ms_num(row.tuned_s))} ms", file=err, flush=True)
        else:
            print(f"[{index + 1}/{total}] {row.problem.key}: {row.status}"
                  + (f" after {row.seconds:.1f} s" if row.seconds is not None else "")
                  + (f": {row.reason}" if row.reason else ""), file=err, flush=True)

    def draw(event: Any) -> None:
        """Forwards the tuner's progress to the line of the problem being tuned (tune_workload
        passes one callback for every problem; each problem gets its own line)."""
        if progress is not None:
            progress(event)

    rows: list[Any] = []
    interrupted = False
    with TuningDB(args.db) as db:
        try:
            rows = tune_workload(workload, device, db, trials=args.trials, time_limit=args.time_limit,
                                 total_time_limit=args.total_time_limit, retune=args.retune,
                                 on_start=on_start, on_done=lambda i, r: (on_done(i, r), rows.append(r)),
                                 sampler=args.sampler, storage_url=_storage(args), progress=draw, **options)
        except KeyboardInterrupt:
            interrupted = True
            if progress is not None:
                progress.close()
            print("interrupted: every finished problem is stored; run the same command to resume",
                  file=err)
        stored_in = db.display_url
    print_net_summary(rows, stored_in, json_out=args.json)
    not_run = sum(row.status == "not run" for row in rows)
    if not_run:
        print(f"{not_run} of {total} problems not run within the {args.total_time_limit:g} s budget: the same "
              f"command tunes them (the stored problems are skipped), or give --total-time-limit more", file=err)
    if interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in rows) else 0


def print_net_summary(rows: list[Any], stored_in: str, json_out: bool = False,
                      out: TextIO | None = None) -> None:
    """The table of ``tunecl tune --net``: per problem and the estimated whole-net time."""
    out = out or sys.stdout
    known = [r for r in rows if r.default_s and r.tuned_s]
    before = sum(r.default_s * r.count for r in known)
    after = sum(r.tuned_s * r.count for r in known)
    if json_out:
        print_json({"db": stored_in, "estimated_default_ms": before * 1e3, "estimated_tuned_ms": after * 1e3,
                    "problems": [{"problem": r.problem.key, "count": r.count, "status": r.status,
                                  "algorithm": r.algorithm, "default_ms": _ms_num(r.default_s),
                                  "tuned_ms": _ms_num(r.tuned_s), "speedup": r.speedup, "seconds": r.seconds,
                                  "reason": r.reason}
                                 for r in rows],
                    "tuning_seconds": sum(r.seconds or 0.0 for r in rows)},
                   out=out)
        return
    print_table(["problem", "count", "status", "algorithm", "default ms", "tuned ms", "speedup"],
                [[r.problem.key, r.count, r.status, r.algorithm or "-", _round(_ms_num(r.default_s)) or "-",
                  _round(_ms_num(r.tuned_s)) or "-", f"{r.speedup:.2f}x" if r.speedup else "-"]
                 for r in rows], out=out)
    print(file=out)
    if known:
        print(f"estimated time per pass of these problems ({len(known)} of {len(rows)} with both times): "
              f"default {before * 1e3:.4g} ms -> tuned {after * 1e3:.4g} ms ({before / after:.2f}x)", file=out)
    tuned = [r for r in rows if r.seconds is not None]
    if tuned:
        spent = sum(r.seconds for r in tuned)
        print(f"tuning    {len(tuned)} problems in {spent:.1f} s ({spent / len(tuned):.1f} s each)", file=out)
    for r in rows:
        if r.reason:
            print(f"failed    {r.problem.key}: {r.reason}", file=out)
    print(f"stored    {stored_in}", file=out)


def _ms_num(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
