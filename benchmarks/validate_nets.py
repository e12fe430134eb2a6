"""Validate the nets of docs/results.md (the 18 torchvision CNNs, then convnext_tiny/small, vit_b_16,
swin_t, hf:bert and hf:gpt2): eval and train step, one JSON file per net.

Each net runs as ``tunecl validate --net NAME [--train] --json`` in its own process (so one net's
failure or crash cannot hide another's), at the smallest image size it takes (``--image-size`` raises
that floor), with ``TUNECL_FALLBACK=error``. Prints one table row per net.

``--compile`` validates through ``torch.compile(..., backend="tunecl")`` (``tunecl validate --compile``:
the replayed step is compared). ``--record FILE.csv`` appends one row per net to a CSV in
``benchmarks/results/validate.csv``'s columns (:data:`COLUMNS`), with the command that reproduces it.

    TUNECL_SHIPPED_DB= TUNECL_DB=/tmp/empty.sqlite python benchmarks/validate_nets.py --out DIR
    python benchmarks/validate_nets.py --device nvidia --batch 4 --image-size 224 --train-only --out DIR
    python benchmarks/validate_nets.py --nets CNNS --compile --record benchmarks/results/validate.csv
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tunecl.tools import record
from tunecl.tools.coverage import BEYOND_CNNS

# the smallest image each net takes at batch 2 (32 where that is enough)
NETS = {"alexnet": 63, "resnet18": 32, "resnet50": 32, "vgg16": 32, "squeezenet1_0": 32, "googlenet": 32,
        "densenet161": 32, "inception_v3": 75, "shufflenet_v2_x1_0": 32, "mobilenet_v2": 32,
        "mobilenet_v3_large": 32, "mobilenet_v3_small": 32, "resnext50_32x4d": 32, "wide_resnet50_2": 32,
        "mnasnet1_0": 32, "efficientnet_b0": 32, "efficientnet_b4": 32, "regnet_y_400mf": 32}
# the transformers, ConvNeXts and hf: language models (their sequence length in place of the image size)
NETS.update(BEYOND_CNNS)
CNNS = list(NETS)[:18]
CRITERIA = ("fp32", "fp64", "zero", "own", "perturbed", "FAIL")
COLUMNS = record.VALIDATE_COLUMNS   # benchmarks/results/validate.csv's


def run(net: str, args: argparse.Namespace, image: int, train: bool) -> tuple[dict | None, float, str]:
    command = [sys.executable, "-m", "tunecl", "validate", "--net", net, "--batch", str(args.batch),
               "--image-size", str(image), "--seed", str(args.seed), "--json"]
    if train:
        command.append("--train")
    if args.compile:
        command.append("--compile")
    if args.device:
        command += ["--device", args.device]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "TUNECL_FALLBACK": "error"})
    seconds = time.perf_counter() - start
    text = done.stdout
    try:
        return json.loads(text[text.index("{"):]), seconds, ""
    except ValueError:
        return None, seconds, (done.stderr.strip().splitlines() or ["no output"])[-1]


def row(net: str, image: int, eval_: dict | None, train: dict | None, times: dict[str, float]) -> str:
    def verdict(report: dict | None) -> str:
        if report is None:
            return "ERROR"
        if report["passed"]:
            return "ok"
        return f"FAIL ({sum(not c['passed'] for c in report['checks'])} of {len(report['checks'])})"

    forward = "-" if eval_ is None else f"{verdict(eval_)} (rel {eval_['checks'][0]['max_rel']:.1e})"
    if train is None:
        return f"| {net} | {image} | {forward} | - | - | - | - | - |"
    by = counts(train)
    worst = max((c["max_rel"] for c in train["checks"] if c["max_rel"] is not None), default=0.0)
    fallback = sum(train["fallback_ops"].values()) + (0 if eval_ is None else sum(eval_["fallback_ops"].values()))
    seconds = train["seconds"]
    runs = " / ".join(f"{seconds.get(k, 0):.1f}" for k in ("cpu", "fp64", "device", "perturbed"))
    wall = f"{times['train']:.0f}" + (f" / {times['eval']:.0f}" if "eval" in times else "")
    return (f"| {net} | {image} | {forward} | {verdict(train)} | {worst:.1e} | "
            f"{' / '.join(str(by[k]) for k in CRITERIA)} | {fallback} | {wall} | {runs} |")


def counts(report: dict) -> collections.Counter:
    """How many checks of ``report`` each criterion passed (``own``: own output or gradient; ``FAIL``)."""
    by = collections.Counter()
    for c in report["checks"]:
        passed_by = c["passed_by"] or "FAIL"
        by["own" if passed_by.startswith("own") else passed_by] += 1
    return by


def csv_row(net: str, image: int, args: argparse.Namespace, eval_: dict | None, train: dict | None) -> dict[str, str]:
    """The validate.csv row of one net (empty fields for a run that was not made or gave no report)."""
    report = train or eval_
    device = report["device"].removeprefix("opencl:0 ") if report else (args.device or "")
    row = {"date": dt.date.today().isoformat(), "device": device, "net": net, "batch": str(args.batch),
           "image_size": str(image), "seed": str(args.seed), "compiled": str(args.compile)}
    row["eval_passed"] = "" if eval_ is None else str(eval_["passed"])
    row["eval_output_rel"] = "" if eval_ is None or not eval_["checks"] else f"{eval_['checks'][0]['max_rel']:.1e}"
    row["train_passed"] = "False" if train is None else str(train["passed"])
    by = counts(train) if train else collections.Counter()
    worst = max((c["max_rel"] for c in train["checks"] if c["max_rel"] is not None), default=0.0) if train else None
    row.update({"train_checks": str(len(train["checks"])) if train else "",
                "train_worst_rel_vs_cpu_fp32": "" if worst is None else f"{worst:.1e}",
                "passed_by_fp32": str(by["fp32"]), "passed_by_fp64": str(by["fp64"]), "passed_by_zero": str(by["zero"]),
                "passed_by_own": str(by["own"]), "passed_by_perturbed": str(by["perturbed"]), "failed": str(by["FAIL"]),
                "fallback_ops": str(sum(sum(r["fallback_ops"].values()) for r in (eval_, train) if r))})
    command = ["python", "benchmarks/validate_nets.py", "--nets", net, "--batch", str(args.batch),
               "--image-size", str(image), "--seed", str(args.seed)]
    command += ["--compile"] * args.compile + ["--train-only"] * args.train_only
    command += ["--device", args.device] if args.device else []
    # (runs without the shipped tuning results say so: their plans are the defaults)
    without_shipped = os.environ.get("TUNECL_SHIPPED_DB") == ""
    row["command"] = " ".join(["TUNECL_SHIPPED_DB="] * without_shipped + command)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", metavar="SEL")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=0, help="at least this image size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=[*NETS, "CNNS"], metavar="NET",
                        help="nets to validate (CNNS: the 18 CNNs)")
    parser.add_argument("--train-only", action="store_true", help="skip the eval-mode runs")
    parser.add_argument("--compile", action="store_true", help="validate through torch.compile(backend='tunecl')")
    parser.add_argument("--out", type=Path, help="write NET.json (both reports) into this folder")
    parser.add_argument("--record", type=Path, metavar="FILE.csv", help="append one row per net to this CSV "
                        "(benchmarks/results/validate.csv's columns)")
    args = parser.parse_args(argv)
    args.nets = list(dict.fromkeys(n for name in args.nets for n in (CNNS if name == "CNNS" else [name])))
    if args.record:
        record.check_argument(parser.prog, args.record, COLUMNS)
    print("| net | image | forward (eval) | train step | worst rel vs CPU fp32 | checks: "
          f"{' / '.join(CRITERIA)} | fallback ops | wall s train / eval | train runs s: cpu / fp64 / "
          "device / perturbed |")
    print("|---|---:|---|---|---:|---|---:|---:|---:|")
    failed = 0
    for net in args.nets:
        image = max(NETS[net], args.image_size)
        times: dict[str, float] = {}
        eval_ = None
        if not args.train_only:
            eval_, times["eval"], error = run(net, args, image, False)
        train, times["train"], error = run(net, args, image, True)
        failed += not (train and train["passed"] and (args.train_only or (eval_ and eval_["passed"])))
        print(row(net, image, eval_, train, times) + (f" {error}" if train is None else ""), flush=True)
        if args.record:
            record.append(args.record, [csv_row(net, image, args, eval_, train)], COLUMNS)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{net.replace(':', '_')}.json").write_text(json.dumps(
                {"net": net, "image_size": image, "batch": args.batch, "seed": args.seed,
                 "runs": {"eval": eval_, "train": train}}, indent=1))
    print(f"{len(args.nets) - failed} of {len(args.nets)} nets pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
