"""``tunecl devices``: the numbered list of OpenCL devices that ``--device`` selects from."""

from __future__ import annotations

import argparse

from tunecl.cli.output import print_json, print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "devices", help="list OpenCL devices (the numbers --device and TUNECL_DEVICE select)",
        description="List every OpenCL device in tunecl's stable order: devices that compile first, "
                    "then GPUs, accelerators, CPUs. '*' marks the default (TUNECL_DEVICE, else 0).")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tunecl import runtime
    from tunecl.errors import DeviceNotFoundError

    entries = runtime.list_devices()
    try:
        default = runtime.resolve().index
    except DeviceNotFoundError:
        default = None
    rows = []
    for entry in entries:
        info = entry.describe()
        info["default"] = entry.index == default
        rows.append(info)
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no OpenCL device found (on Linux: pip install pocl-binary-distribution, or your GPU's driver)")
        return 1
    print_table(
        ["#", "platform:device", "name", "type", "CUs", "memory", "driver", "status"],
        [[("*" if r["default"] else " ") + str(r["index"]), r["selector"], r["name"], r["type"],
          r["compute_units"], f"{r['global_mem_bytes'] / 2**30:.1f} GiB", r["driver"],
          "ok" if r["usable"] else f"cannot compile: {r['compiler_error']}"] for r in rows])
    return 0
