"""``tunecl db``: inspect, export, import and maintain the tuning database.

Every subcommand takes ``--db URL`` (default: ``TUNECL_DB``, else the user data folder) and calls the
library in ``tunecl.db``. ``--device SEL`` selects among the devices stored in the DB; only an index or
``platform:device`` is resolved by the runtime (OpenCL), imported only then.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

from tunecl import config
from tunecl.cli import db_coverage
from tunecl.cli.db_targets import db_url, select_devices
from tunecl.cli.output import print_json, print_table
from tunecl.errors import TuneclError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``db`` command and its subcommands."""
    parser = subparsers.add_parser(
        "db", help="inspect, export, import and maintain the tuning database",
        description="Inspect, export, import and maintain the tuning database.")
    sub = parser.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="URL",
                        help="SQLAlchemy URL or SQLite file of the tuning DB (default: TUNECL_DB or the "
                             "user data folder)")
    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", metavar="SEL",
                        help="only the results of these device models (any driver): a part of the name, "
                             "vendor or platform of devices stored in the DB (every one that has it), or a "
                             "key as `tunecl db stats` prints it; an index or platform:device as `tunecl "
                             "devices` lists them selects a device of this machine")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    def add(name: str, func: Any, help: str,
            parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
        command = sub.add_parser(name, parents=[common, *parents], help=help,
                                 description=help[0].upper() + help[1:] + ".")
        command.set_defaults(func=func)
        return command

    add("path", cmd_path, "print the tuning DB in use (file path or URL), its schema revision and the "
        "shipped results' folder", [])
    add("stats", cmd_stats, "count devices, problems and results", [as_json])
    command = add("list", cmd_list, "list stored results", [device, as_json])
    command.add_argument("--problem", metavar="SUBSTR", help="only problems whose key contains SUBSTR")
    command.add_argument("--all", action="store_true", help="include failed results")
    command = add("show", cmd_show, "show every result for one problem key, per device", [as_json])
    command.add_argument("key", metavar="KEY", help="problem key, e.g. gemm:m=1024,n=1024,k=1024")
    command = add("export", cmd_export, "export ok results as a JSON document", [device])
    command.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: standard output)")
    command = add("import", cmd_import, "merge an exported JSON document (the faster result wins)", [])
    command.add_argument("file", metavar="FILE", help="export document ('-' for standard input)")
    command.add_argument("--dry-run", action="store_true", help="report what would change, write nothing")
    command = add("prune", cmd_prune, "remove old and/or failed results", [])
    command.add_argument("--older-than", metavar="AGE", type=parse_cutoff,
                         help="results created before this: 30d, 12h, 90m, 2w or a date (2025-01-31)")
    command.add_argument("--failed", action="store_true", help="failed results")
    command.add_argument("--yes", action="store_true", help="really remove (default: only report)")
    command = add("coverage", db_coverage.run, "count which conv, GEMM and attention problems of nets the DB and the shipped "
                  "results serve on a device, per net, batch, mode and precision (nothing runs on a device)",
                  [as_json])
    db_coverage.add_arguments(command)
    add("upgrade", cmd_upgrade, "migrate the tuning DB's schema to this tunecl's revision", [])
    command = add("plot", cmd_plot, "write a tuning study's optimization history and parameter importances "
                  "as a PNG (needs matplotlib: the plots extra)", [])
    command.add_argument("file", metavar="FILE.png", help="the PNG file to write")
    command.add_argument("--study", metavar="NAME",
                         help="the study: its name as `tunecl tune` prints it, or a part of it only that "
                              "study has, e.g. a problem key (default: the storage's only study)")
    command.add_argument("--storage", metavar="URL",
                         help="Optuna storage of the studies (default: TUNECL_STORAGE, else "
                              "NAME-studies.sqlite next to the DB NAME.sqlite)")


def parse_cutoff(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """``30d``/``12h``/``90m``/``45s``/``2w`` before now, or an ISO date/time (UTC unless it says)."""
    now = now or dt.datetime.now(dt.UTC)
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text.strip().lower())
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[match[2]]
        return now - dt.timedelta(**{unit: float(match[1])})
    try:
        cutoff = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an age like 30d, 12h, 90m or a date like 2025-01-31, got {text!r}") from None
    return cutoff if cutoff.tzinfo else cutoff.replace(tzinfo=dt.UTC)


def _open(args: argparse.Namespace, must_exist: bool = True, **kwargs: Any) -> Any:
    """The DB of ``--db``. With ``must_exist`` (the commands that read or remove results) a SQLite file
    that is not there is an error, not a new empty DB: a mistyped path must not answer "0 results"
    and leave a file behind. A server DB is opened as it is (its tables are created on first use)."""
    from tunecl.db import TuningDB
    from tunecl.db.store import sqlite_path

    path = sqlite_path(db_url(args))
    if must_exist and path is not None and not path.is_file():
        raise TuneclError(f"no tuning DB at {path} (`tunecl tune` and `tunecl db import` create one; "
                          "`tunecl db path` shows the default)")
    return TuningDB(args.db, **kwargs)


def _model_keys(selector: str | None, db: Any) -> list[str] | None:
    """The device models ``--device`` selects in ``db`` (None: every device); see
    :func:`~tunecl.cli.db_targets.select_devices`."""
    if selector is None:
        return None
    return [fp.model_key for fp in select_devices(selector, db.devices(), str(db.display_url))]


def cmd_path(args: argparse.Namespace) -> int:
    """The DB in use, its schema revision and the shipped folder; creates and changes nothing."""
    from tunecl.db import shipped
    from tunecl.db.schema import head_revision
    from tunecl.db.store import sqlite_path

    url = db_url(args)
    path = sqlite_path(url)
    print(f"db        {path if path is not None else url.render_as_string(hide_password=True)}")
    print(f"revision  {_stored_revision(url, path)} (this tunecl: {head_revision()})")
    folder = shipped.folder()
    print(f"shipped   {folder if folder is not None else 'disabled (TUNECL_SHIPPED_DB is empty)'}")
    return 0


def _stored_revision(url: Any, path: Any) -> str:
    """The schema revision stamped in the DB at ``url``, read without creating or migrating anything."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from tunecl.db.schema import current_revision

    if path is not None and not path.is_file():
        return "none: the file does not exist yet"
    if path is not None:
        # Read-only. Without a write-ahead log beside it the file is also opened immutable, which keeps
        # SQLite from creating the -wal and -shm files that a read of a WAL-mode DB otherwise leaves.
        live = Path(f"{path}-wal").exists()
        url = url.set(database=f"file:{path}",
                      query={"mode": "ro", "uri": "true", **({} if live else {"immutable": "1"})})
    try:
        engine = create_engine(url)
    except (ImportError, SQLAlchemyError) as error:
        return f"unknown: {error}"
    try:
        with engine.connect() as connection:
            return current_revision(connection) or "none (no tunecl tables yet)"
    except SQLAlchemyError as error:
        return f"unknown: {str(error.orig if hasattr(error, 'orig') else error).splitlines()[0]}"
    finally:
        engine.dispose()


def cmd_stats(args: argparse.Namespace) -> int:
    from tunecl.db import shipped

    with _open(args) as db:
        stats = db.stats()
    index = shipped.index()
    stats["shipped"] = {"folder": str(shipped.folder() or ""), "files": [str(f) for f in index.files],
                        "results": sum(len(rs) for rs in index.by_device.values())}
    if args.json:
        print_json(stats)
        return 0
    print(f"tuning DB: {stats['url']} (schema revision {stats['schema_revision']})")
    print(f"{stats['devices']} devices, {stats['problems']} problems, {stats['results']} results "
          f"({stats['ok']} ok, {stats['failed']} failed)")
    if stats["per_device"]:
        print()
        print_table(["device", "key", "problems", "results", "ok", "failed"],
                    [[d["device"], d["key"], d["problems"], d["results"], d["ok"], d["failed"]]
                     for d in stats["per_device"]])
    ship = stats["shipped"]
    where = ship["folder"] or "disabled"
    print(f"\nshipped results: {ship['results']} in {len(ship['files'])} files ({where})")
    return 0


def _rows(records: list, with_status: bool, with_device: bool = True) -> tuple[list[str], list[list[Any]]]:
    headers = ["device"] * with_device + ["problem", "algorithm", "version", "precision", "time ms",
                                          "default ms", "speedup", "trials", "created"]
    rows = []
    for r in records:
        row = [r.device.label] * with_device + [
            r.problem, r.algorithm, r.algorithm_version, r.precision, _ms(r.time_s), _ms(r.default_time_s),
            None if r.speedup is None else f"{r.speedup:.2f}x", r.trials,
            r.created_at.strftime("%Y-%m-%d %H:%M") if r.created_at else None]
        rows.append(row + [r.status] * with_status)
    return headers + ["status"] * with_status, rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def _as_json(records: list) -> list[dict[str, Any]]:
    from tunecl.db.exchange import record_to_dict

    return [{"device_label": r.device.label, "device_key": r.device.key, **record_to_dict(r),
             "speedup": r.speedup} for r in records]


def cmd_list(args: argparse.Namespace) -> int:
    with _open(args) as db:
        records = db.results(model_keys=_model_keys(args.device, db), problem_contains=args.problem,
                             ok_only=not args.all)
    if args.json:
        print_json(_as_json(records))
    elif records:
        print_table(*_rows(records, with_status=args.all))
    else:
        print("no results", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from tunecl.db.store import problem_key

    try:
        key = problem_key(args.key)
    except ValueError as error:
        raise TuneclError(f"bad problem key {args.key!r}: {error}") from None
    with _open(args) as db:
        records = db.results(problem=key)
    if args.json:
        print_json({"problem": key, "results": _as_json(records)})
        return 0
    print(key)
    if not records:
        print("no results for this problem", file=sys.stderr)
    labels: dict[str, list] = {}
    for record in records:
        labels.setdefault(f"{record.device.label} [{record.device.key}]", []).append(record)
    for label, group in labels.items():
        print(f"\n{label}")
        headers, rows = _rows(group, with_status=True, with_device=False)
        print_table(headers[1:], [row[1:] for row in rows])  # the problem column is the heading
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tunecl.db import exchange

    with _open(args) as db:
        document = db.export(model_keys=_model_keys(args.device, db))
    if args.output:
        exchange.write_document(document, args.output)
        print(f"exported {len(document['records'])} results to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(exchange.dumps(document))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from tunecl.db import exchange

    # the whole document is validated before the DB is even opened: a bad file changes nothing
    records = exchange.read_document(args.file)
    if args.dry_run:  # merged into a copy in memory: the DB file, or its absence, stays as it is
        from tunecl.db.scratch import scratch_copy

        with scratch_copy(args.db) as db:
            report = exchange.import_document(db, records, dry_run=True)
    else:
        with _open(args, must_exist=False) as db:  # importing into a new DB is how one starts
            report = exchange.import_document(db, records)
    print(report)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    if args.older_than is None and not args.failed:
        raise TuneclError("say what to prune: --older-than AGE and/or --failed")
    with _open(args) as db:
        count = db.prune(args.older_than, failed_only=args.failed, dry_run=not args.yes)
    if args.yes:
        print(f"removed {count} results")
    else:
        print(f"would remove {count} results (run again with --yes to remove them)")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    from tunecl.db.schema import head_revision

    with _open(args, must_exist=False, auto_upgrade=True) as db:
        before, head = db.opened_at_revision, head_revision()
        where = db.display_url
    if before == head:
        print(f"{where}: already at schema revision {head}")
    else:
        print(f"{where}: schema revision {before or '(new)'} -> {head}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from tunecl.search.study_plot import find_study, write_study_plot
    from tunecl.search.tuner import open_storage

    url = args.storage or (config.studies_next_to(args.db) if args.db else config.get().storage_url)
    path = _sqlite_file(url)
    if path is not None and not path.is_file():  # opening it would create an empty storage
        raise TuneclError(f"no study storage at {path}")
    import optuna

    storage = open_storage(url)
    plot = write_study_plot(optuna.load_study(study_name=find_study(storage, args.study), storage=storage),
                            args.file)
    print(f"wrote {plot.path}: {plot.completed} measured trials of {plot.study_name}"
          + (f"; {plot.importance_note}" if plot.importance_note else ""))
    return 0


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite storage URL or path (None for other storages)."""
    url = config.normalize_db_url(url)
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") and url != "sqlite:///:memory:" else None
