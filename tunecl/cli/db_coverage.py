"""``tunecl db coverage``: which conv, GEMM and attention problems of nets the tuning DB and the shipped results serve
on a device, per net × batch × mode × precision (the work is :mod:`tunecl.tools.plan_sources`).

The nets' problems are extracted on the meta device and looked up for a device fingerprint, so nothing
runs on a device and the device may be one this machine does not have: one stored in the DB or the
shipped results (``--device h200``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunecl.cli.db_targets import db_url, select_devices
from tunecl.cli.output import print_json, print_table
from tunecl.precision import PRECISIONS, TF32

MODES = ("inference", "training")   # tunecl.tools.plan_sources.MODES (kept here so --help imports nothing)
ALL_NETS = "all"


def comma_list(choices: tuple[str, ...] | None = None) -> Any:
    """argparse type of ``A[,B...]``: the items in order, each once (one of ``choices`` when given)."""

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"empty item in {text!r}")
        unknown = [item for item in items if choices is not None and item not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, unknown))}; "
                                             f"choose from {', '.join(choices or ())}")
        return list(dict.fromkeys(items))

    return parse


def batch_list(text: str) -> list[int]:
    """argparse type of ``--batch N[,N...]``: positive integers."""
    from tunecl.cli.tune import positive_int

    return list(dict.fromkeys(positive_int(item, "positive integers") for item in comma_list()(text)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tunecl db coverage`` (``--db`` and ``--json`` come with the ``db`` commands)."""
    from tunecl.cli.nets import NET_HELP
    from tunecl.cli.tune import positive_int

    parser.add_argument("--net", metavar="NAME[,NAME...]", type=comma_list(), required=True,
                        help=f"the nets: '{ALL_NETS}' for the 18 torchvision CNNs of the nets' validation "
                             f"(tunecl.tools.coverage.NETS), or each a {NET_HELP}")
    parser.add_argument("--batch", metavar="N[,N...]", type=batch_list, default=[16],
                        help="batch sizes (default 16)")
    parser.add_argument("--image-size", type=positive_int, default=224,
                        help="input height/width (default 224, as `tunecl tune --net`); for hf: models the "
                             "sequence length")
    parser.add_argument("--mode", metavar="MODE[,MODE...]", type=comma_list(MODES), default=list(MODES),
                        help="inference (the forward's problems) and/or training (also both backward "
                             "directions) (default: both)")
    parser.add_argument("--precision", metavar="P[,P...]", type=comma_list(PRECISIONS), default=["fp32"],
                        help="what the requests accept: fp32 (strict, torch's default for matmuls) and/or "
                             "tf32 (TF32 allowed for matmuls and convolutions, torch's allow_tf32 flags) "
                             "(default fp32)")
    parser.add_argument("--device", metavar="SEL",
                        help="the device whose plans to look up: a part of the name, vendor or platform of a "
                             "device stored in the DB or the shipped results (h200), or its key as `tunecl db "
                             "stats` prints it; an index or platform:device as `tunecl devices` lists them "
                             "selects a device of this machine (default: TUNECL_DEVICE or 0 of this machine)")
    parser.add_argument("--problems", action="store_true",
                        help="also list every problem with where its plan comes from")


def usage_error(message: str) -> int:
    """A usage error found after parsing (an unknown net or device): as argparse words it, exit 2."""
    print(f"tunecl db coverage: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from tunecl.db import shipped
    from tunecl.db.scratch import scratch_copy
    from tunecl.errors import DeviceNotFoundError
    from tunecl.tools.coverage import NETS

    nets = list(dict.fromkeys(n for name in args.net for n in (NETS if name == ALL_NETS else [name])))
    problem = _unknown_net(nets, args.image_size)
    if problem is not None:
        return usage_error(problem)
    # a copy in memory: reading creates no file where there is none, and changes nothing in one
    with scratch_copy(args.db) as db:
        try:
            fingerprint = _device(args.device, db, shipped.index())
        except DeviceNotFoundError as error:
            return usage_error(str(error))
        rows = _coverage(db, fingerprint, nets, args)
    folder = shipped.folder()
    files = [str(f) for f in shipped.index().files]
    if args.json:
        print_json({"device": {"label": fingerprint.label, "key": fingerprint.key,
                               "model_key": fingerprint.model_key},
                    "db": str(_db_path(args)), "shipped": {"folder": str(folder or ""), "files": files},
                    "rows": [row.to_dict() for row in rows]})
        return 0
    _print_text(rows, fingerprint, args, folder, files)
    return 0


def _db_path(args: argparse.Namespace) -> Any:
    """The user DB's file or URL, as `tunecl db path` prints it."""
    from tunecl.db.store import sqlite_path

    url = db_url(args)
    path = sqlite_path(url)
    return path if path is not None else url.render_as_string(hide_password=True)


def _unknown_net(nets: list[str], image_size: int) -> str | None:
    """Why one of ``nets`` cannot be built (checked before any is extracted), or None."""
    from tunecl.search.workload import model_builder

    for net in nets:
        try:
            model_builder(net, image_size)
        except ValueError as error:
            return f"{error}\n(or '{ALL_NETS}' for the 18 torchvision CNNs)"
        except (ImportError, AttributeError) as error:
            return f"cannot build {net!r}: {error}"
    return None


def _device(selector: str | None, db: Any, shipped_index: Any) -> Any:
    """The fingerprint ``--device`` names among the devices of the DB and the shipped results (one
    model; of several drivers of it, the first by label), or this machine's default device."""
    from tunecl.errors import DeviceNotFoundError

    if selector is None:
        from tunecl import runtime

        return runtime.select_device(None).fingerprint
    from tunecl.db.selection import is_local_form

    found = {fp.key: fp for fp in [*db.devices(), *shipped_index.devices()]}
    stored = sorted(found.values(), key=lambda fp: (fp.label, fp.key))
    if not stored and not is_local_form(selector):
        raise DeviceNotFoundError(f"no device to select with {selector!r}: neither the DB nor the shipped results "
                                  f"hold any results")
    matches = select_devices(selector, stored, "the DB or the shipped results")
    models = {fp.model_key: fp for fp in matches}
    if len(models) > 1:
        names = "; ".join(f"{fp.label} [{fp.key}]" for fp in matches)
        raise DeviceNotFoundError(f"{selector!r} names {len(models)} device models: {names}; give a key or "
                                  f"a longer part of one name")
    return matches[0]


def _coverage(db: Any, fingerprint: Any, nets: list[str], args: argparse.Namespace) -> list[Any]:
    """Every net × batch × mode × precision, extracting one net's problems at a time."""
    from tunecl.errors import TuneclError
    from tunecl.search.workload import net_problems
    from tunecl.tools import plan_sources

    rows = []
    for net in nets:
        for batch in args.batch:
            for mode in args.mode:
                if sys.stderr.isatty():
                    print(f"extracting {net} batch {batch} {mode}", file=sys.stderr, flush=True)
                try:
                    workload = net_problems(net, batch, args.image_size, train=plan_sources.MODES[mode],
                                            device_type=fingerprint.device_type)
                except (ValueError, RuntimeError, ImportError, AttributeError) as error:
                    raise TuneclError(f"cannot extract the workload of {net!r} at batch {batch}, image "
                                      f"{args.image_size}: {str(error).splitlines()[0]}") from None
                rows += [plan_sources.net_coverage(db, fingerprint, net, workload, batch=batch,
                                                   image_size=args.image_size, mode=mode, request=request)
                         for request in args.precision]
    return rows


def _print_text(rows: list[Any], fingerprint: Any, args: argparse.Namespace, folder: Any,
                files: list[str]) -> None:
    print(f"device   {fingerprint.label} [{fingerprint.key}]")
    path = _db_path(args)
    print(f"user DB  {path}" + (" (no file: nothing stored)" if hasattr(path, "is_file") and not path.is_file() else ""))
    print(f"shipped  {folder if folder is not None else 'disabled (TUNECL_SHIPPED_DB is empty)'}"
          + (f" ({len(files)} files)" if folder is not None else ""))
    print()
    headers = ["net", "batch", "mode", "precision", "problems", "user", "shipped", "user near batch",
               "shipped near batch", "default", "at tf32"]
    table = []
    for row in rows:
        c = row.counts
        table.append([row.net, row.batch, row.mode, row.precision, len(row.plans),
                      c["user"] + c["user-other-driver"], c["shipped"],
                      c["user-near-batch"] + c["user-other-driver-near-batch"], c["shipped-near-batch"],
                      c["default"], sum(p.hit is not None and p.hit.precision == TF32 for p in row.plans)])
    print_table(headers, table)
    print("\nuser: this device, or its model on another driver; near batch: the same problem tuned at another "
          "batch (the backend's next step, with TUNECL_TUNE=off); default: the heuristic default; at tf32: the "
          "stored results among them that compute at TF32")
    if not args.problems:
        return
    for row in rows:
        print(f"\n{row.net} batch {row.batch} {row.mode} {row.precision}")
        print_table(["problem", "calls", "source", "algorithm", "from"],
                    [[p.problem.key, p.calls, p.source, p.hit.algorithm if p.hit else "-",
                      p.hit.problem if p.hit and p.hit.problem != p.problem.key else ""] for p in row.plans])
