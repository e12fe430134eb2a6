"""``tunecl db ...`` through ``tunecl.cli.main``: output, exit codes, and bad imports changing nothing."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

import tunecl
from tunecl.cli import main
from tunecl.db import TuningDB
from tunecl.db.records import Record
from tunecl.db.schema import head_revision
from tunecl.errors import DeviceNotFoundError
from tunecl.problems import GemmProblem

GEMM = GemmProblem(512, 512, 512)
SMALL = GemmProblem(8, 8, 8)


@pytest.fixture
def db_path(tmp_path, fingerprint) -> Path:
    """A closed DB file with a few results (closing checkpoints the WAL into the file)."""
    path = tmp_path / "cli.sqlite"
    with TuningDB(str(path)) as db:
        db.record(fingerprint("1.0"), GEMM, "gemm", 2, {"MWG": 64}, 1e-3, default_time_s=2.5e-3, trials=30)
        db.record(fingerprint("2.0"), GEMM, "gemm", 2, {"MWG": 32}, 2e-3)
        db.record(fingerprint("1.0"), SMALL, "gemm_small", 1, {}, None, status="failed:wrong result")
        db.record(fingerprint(name="Other"), SMALL, "gemm_small", 1, {"X": 1}, 1e-5)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_path_defaults_to_tunecl_db(capsys, tmp_path):
    code, out, err = _run(capsys, "db", "path")
    assert (code, err) == (0, "")
    assert out == (f"db        {tmp_path / 'tuning.sqlite'}\n"
                   f"revision  none: the file does not exist yet (this tunecl: {head_revision()})\n"
                   f"shipped   {tmp_path / 'shipped'}\n")
    assert list(tmp_path.iterdir()) == []  # printing the path creates nothing


def test_path_reads_the_revision_of_a_db_and_leaves_its_folder_as_it_was(capsys, db_path):
    before = sorted(db_path.parent.iterdir())
    code, out, _ = _run(capsys, "db", "path", "--db", str(db_path))
    assert code == 0 and out.splitlines()[:2] == [f"db        {db_path}",
                                                  f"revision  0001 (this tunecl: {head_revision()})"]
    assert sorted(db_path.parent.iterdir()) == before  # no -wal or -shm file left behind


def test_path_of_a_server_hides_the_password(capsys, monkeypatch):
    monkeypatch.setenv("TUNECL_SHIPPED_DB", "")
    code, out, _ = _run(capsys, "db", "path", "--db", "postgresql+nosuchdriver://me:secret@host/tune")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "db        postgresql+nosuchdriver://me:***@host/tune"
    assert lines[1].startswith("revision  unknown: ") and "secret" not in out
    assert lines[2] == "shipped   disabled (TUNECL_SHIPPED_DB is empty)"


@pytest.mark.parametrize("argv", [("stats",), ("stats", "--json"), ("list",), ("list", "--json"), ("export",),
                                  ("export", "-o", "{tmp}/out.json"), ("show", "gemm:m=8,n=8,k=8"),
                                  ("prune", "--failed")])
def test_reading_a_db_that_does_not_exist_is_an_error_that_creates_nothing(argv, capsys, tmp_path):
    missing = tmp_path / "typo.sqlite"
    code, out, err = _run(capsys, "db", *(a.format(tmp=tmp_path) for a in argv), "--db", str(missing))
    assert (code, out) == (1, "")
    assert err == (f"tunecl: error: no tuning DB at {missing} (`tunecl tune` and `tunecl db import` create "
                   "one; `tunecl db path` shows the default)\n")
    assert list(tmp_path.iterdir()) == []


def test_stats(capsys, db_path):
    code, out, _ = _run(capsys, "db", "stats", "--db", str(db_path))
    assert code == 0 and "3 devices, 2 problems, 4 results (3 ok, 1 failed)" in out
    assert "Acme GPU 9000 (driver 1.0)" in out and "shipped results: 0 in 0 files" in out
    stats = json.loads(_run(capsys, "db", "stats", "--db", str(db_path), "--json")[1])
    assert stats["results"] == 4 and len(stats["per_device"]) == 3


def test_list(capsys, db_path):
    code, out, _ = _run(capsys, "db", "list", "--db", str(db_path))
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["device", "problem", "algorithm"]
    assert len(lines) == 4 and "2.5" in lines[1] and "failed" not in out  # ok results only
    assert "speedup" in lines[0] and "2.5" in out
    code, out, _ = _run(capsys, "db", "list", "--db", str(db_path), "--all", "--problem", "m=8,")
    assert code == 0 and len(out.splitlines()) == 3 and "failed:wrong result" in out
    rows = json.loads(_run(capsys, "db", "list", "--db", str(db_path), "--json")[1])
    assert [r["time_s"] for r in rows] == [1e-3, 2e-3, 1e-5]
    assert rows[0]["speedup"] == 2.5 and rows[0]["device_label"] == "Acme GPU 9000 (driver 1.0)"


def test_show(capsys, db_path):
    code, out, _ = _run(capsys, "db", "show", "gemm:m=8,n=8,k=8", "--db", str(db_path))
    assert code == 0 and out.startswith(SMALL.key + "\n")  # the key is shown canonical
    assert "Acme GPU 9000 (driver 1.0)" in out and "Other (driver 1.0)" in out
    assert "failed:wrong result" in out
    shown = json.loads(_run(capsys, "db", "show", SMALL.key, "--db", str(db_path), "--json")[1])
    assert shown["problem"] == SMALL.key and len(shown["results"]) == 2
    code, _, err = _run(capsys, "db", "show", "gemm:m=8", "--db", str(db_path))
    assert code == 1 and err.startswith("tunecl: error: bad problem key") and err.count("\n") == 1


def test_export_import_round_trip(capsys, db_path, tmp_path):
    code, out, _ = _run(capsys, "db", "export", "--db", str(db_path))
    document = json.loads(out)
    assert code == 0 and document["format"] == "tunecl-db" and len(document["records"]) == 3
    exported = tmp_path / "out.json"
    code, _, err = _run(capsys, "db", "export", "--db", str(db_path), "-o", str(exported))
    assert code == 0 and "exported 3 results" in err
    target = tmp_path / "target.sqlite"
    assert _run(capsys, "db", "import", str(exported), "--db", str(target), "--dry-run") == (
        0, "added 3, updated 0, skipped 0 (dry run: nothing written)\n", "")
    assert _run(capsys, "db", "import", str(exported), "--db", str(target)) == (
        0, "added 3, updated 0, skipped 0\n", "")
    again = json.loads(_run(capsys, "db", "export", "--db", str(target))[1])
    assert again["records"] == document["records"]


def _good_document(fingerprint) -> dict:
    record = Record(fingerprint(), GEMM.key, "gemm", 3, {"MWG": 128}, 5e-4, origin="tuned on elsewhere")
    from tunecl.db.exchange import record_to_dict

    return {"format": "tunecl-db", "version": 1, "records": [record_to_dict(record)]}


BAD_FILES = {
    "malformed": lambda d: '{"format": "tunecl-db", version: 1}',
    "truncated": lambda d: json.dumps(d)[:-25],
    "wrong format": lambda d: json.dumps(d | {"format": "something-else"}),
    "newer version": lambda d: json.dumps(d | {"version": 99}),
    "bad record": lambda d: json.dumps(d | {"records": [*d["records"], d["records"][0] | {"time_s": -1}]}),
    "bad problem": lambda d: json.dumps(d | {"records": [*d["records"], d["records"][0] | {"problem": "x"}]}),
    "binary": lambda d: b"\x89PNG\r\n\x1a\n\xff\xfe",
}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_import_exits_1_with_one_line_and_leaves_the_db_byte_identical(kind, capsys, db_path, tmp_path,
                                                                             fingerprint):
    bad = tmp_path / "bad.json"
    content = BAD_FILES[kind](_good_document(fingerprint))
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _sha256(db_path)
    code, out, err = _run(capsys, "db", "import", str(bad), "--db", str(db_path))
    assert code == 1 and out == ""
    assert err.startswith(f"tunecl: error: {bad}: ") and err.count("\n") == 1
    assert _sha256(db_path) == before
    assert not Path(f"{db_path}-wal").exists()


def test_a_good_import_merges(capsys, db_path, tmp_path, fingerprint):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good_document(fingerprint)))
    code, out, _ = _run(capsys, "db", "import", str(good), "--db", str(db_path))
    assert (code, out) == (0, "added 1, updated 0, skipped 0\n")


def test_import_of_a_missing_file(capsys, db_path, tmp_path):
    code, _, err = _run(capsys, "db", "import", str(tmp_path / "nope.json"), "--db", str(db_path))
    assert code == 1 and "cannot read" in err


def test_prune_reports_until_yes(capsys, db_path):
    before = _sha256(db_path)
    code, _, err = _run(capsys, "db", "prune", "--db", str(db_path))
    assert code == 1 and "--older-than" in err
    prune = ("db", "prune", "--db", str(db_path))
    assert _run(capsys, *prune, "--failed")[1].startswith("would remove 1 results")
    assert _run(capsys, *prune, "--older-than", "1h")[1].startswith("would remove 0")
    assert _run(capsys, *prune, "--older-than", "2999-01-01")[1].startswith("would remove 4")
    with TuningDB(str(db_path)):
        pass  # (close the engines the commands used; the file must not have changed)
    assert _sha256(db_path) == before
    assert _run(capsys, "db", "prune", "--db", str(db_path), "--failed", "--yes")[1] == "removed 1 results\n"
    with TuningDB(str(db_path)) as db:
        assert db.stats()["failed"] == 0


def test_prune_rejects_a_bad_age(capsys, db_path):
    with pytest.raises(SystemExit) as exit_:
        main(["db", "prune", "--db", str(db_path), "--older-than", "soon"])
    assert exit_.value.code == 2 and "expected an age" in capsys.readouterr().err


def test_parse_cutoff():
    import datetime as dt

    from tunecl.cli.db import parse_cutoff

    now = dt.datetime(2025, 6, 1, 12, tzinfo=dt.UTC)
    assert parse_cutoff("30d", now) == dt.datetime(2025, 5, 2, 12, tzinfo=dt.UTC)
    assert parse_cutoff("12h", now) == dt.datetime(2025, 6, 1, 0, tzinfo=dt.UTC)
    assert parse_cutoff("2w", now) == now - dt.timedelta(weeks=2)
    assert parse_cutoff("2025-01-31", now) == dt.datetime(2025, 1, 31, tzinfo=dt.UTC)


def test_upgrade_of_a_current_db(capsys, db_path):
    code, out, _ = _run(capsys, "db", "upgrade", "--db", str(db_path))
    assert code == 0 and "already at schema revision 0001" in out


@pytest.fixture
def fake_runtime(monkeypatch, fingerprint):
    """An index or platform:device goes through tunecl.runtime (OpenCL); unit tests use a stand-in for it
    with two local devices: 0 (0:0), the Acme model on driver 1.0, and 1 (1:0), a model the DB lacks."""
    devices = {"0": fingerprint("1.0"), "0:0": fingerprint("1.0"), "1": fingerprint(name="Local CPU"),
               "1:0": fingerprint(name="Local CPU")}
    asked = []

    def select_device(selector):
        asked.append(selector)
        if selector not in devices:
            raise DeviceNotFoundError(f"no OpenCL device matches {selector!r}; available devices: ...")
        return types.SimpleNamespace(fingerprint=devices[selector])

    fake = types.ModuleType("tunecl.runtime")
    fake.select_device = select_device
    monkeypatch.setitem(sys.modules, "tunecl.runtime", fake)
    monkeypatch.setattr(tunecl, "runtime", fake, raising=False)
    return asked


def _listed(capsys, db_path, selector: str) -> list[tuple[str, str]]:
    code, out, err = _run(capsys, "db", "list", "--db", str(db_path), "--device", selector, "--json")
    assert (code, err) == (0, ""), err
    return sorted({(r["device"]["name"], r["device"]["driver_version"]) for r in json.loads(out)})


ACME = [("Acme GPU 9000", "1.0"), ("Acme GPU 9000", "2.0")]


def test_a_local_index_selects_that_device_model(capsys, db_path, fake_runtime):
    assert _listed(capsys, db_path, "0") == ACME  # every driver of the model
    assert _listed(capsys, db_path, "0:0") == ACME
    assert _listed(capsys, db_path, "1") == []  # a device of this machine without results
    assert fake_runtime == ["0", "0:0", "1"]


def test_a_name_part_selects_among_the_stored_devices_not_this_machines(capsys, db_path, fake_runtime):
    assert _listed(capsys, db_path, "gpu 9000") == ACME
    assert len(_listed(capsys, db_path, "acme")) == 3  # the vendor of all three
    assert _listed(capsys, db_path, "OTHER") == [("Other", "1.0")]
    assert _listed(capsys, db_path, "driver 2.0") == ACME  # a match stands for its model, any driver
    assert _listed(capsys, db_path, "9000") == ACME  # a number that is no local device is a name part
    document = json.loads(_run(capsys, "db", "export", "--db", str(db_path), "--device", "other")[1])
    assert [r["device"]["name"] for r in document["records"]] == ["Other"]
    assert fake_runtime == ["9000"]


def test_a_key_from_stats_selects_its_device_model(capsys, db_path, fake_runtime, fingerprint):
    stats = json.loads(_run(capsys, "db", "stats", "--db", str(db_path), "--json")[1])
    key = next(d["key"] for d in stats["per_device"] if d["device"] == "Acme GPU 9000 (driver 2.0)")
    assert _listed(capsys, db_path, key) == ACME
    assert _listed(capsys, db_path, fingerprint(name="Other").model_key) == [("Other", "1.0")]
    assert fake_runtime == []


@pytest.mark.parametrize("command", ["list", "export"])
def test_a_device_nothing_stored_matches_is_an_error_that_lists_the_stored_ones(capsys, db_path, fake_runtime,
                                                                                command, fingerprint):
    code, out, err = _run(capsys, "db", command, "--db", str(db_path), "--device", "nvidia")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"tunecl: error: no device stored in {db_path} matches 'nvidia'; stored devices: "
                          f"Acme GPU 9000 (driver 1.0) [{fingerprint('1.0').key}]; Acme GPU 9000 (driver 2.0) ")
    assert "Other (driver 1.0)" in err
    code, _, err = _run(capsys, "db", command, "--db", str(db_path), "--device", "7")
    assert code == 1 and err.startswith("tunecl: error: no OpenCL device number 7 on this machine, and no "
                                        "device stored in")
    code, _, err = _run(capsys, "db", command, "--db", str(db_path), "--device", "3:1")
    assert code == 1 and err.startswith("tunecl: error: no OpenCL device matches '3:1'")


def test_a_device_in_an_empty_db(capsys, tmp_path, fake_runtime):
    path = tmp_path / "empty.sqlite"
    TuningDB(str(path)).close()
    code, _, err = _run(capsys, "db", "list", "--db", str(path), "--device", "h200")
    assert code == 1 and err == f"tunecl: error: no device stored in {path} matches 'h200'; the DB holds no results yet\n"


def test_list_prints_the_speedup_as_tune_does(capsys, db_path):
    out = _run(capsys, "db", "list", "--db", str(db_path))[1]
    assert "2.50x" in out.splitlines()[1]
    out = _run(capsys, "db", "show", GEMM.key, "--db", str(db_path))[1]
    assert "2.50x" in out


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, fingerprint):
    """``tunecl db list | head -1``: no BrokenPipeError traceback, the status of a tool killed by SIGPIPE."""
    import os
    import subprocess

    path = tmp_path / "big.sqlite"
    records = [Record(fingerprint(), GemmProblem(8 + i, 8, 8).key, "gemm", 1, {"MWG": 16}, 1e-3)
               for i in range(2000)]  # ~300 kB: far more output than a pipe holds
    with TuningDB(str(path)) as db:
        db.merge(records)
    root = Path(tunecl.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    shell = f"{sys.executable} -m tunecl db list --db {path} | head -1; echo status ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", shell], check=True, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["device", "problem"] and lines[1] == "status 141"


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha256(p) if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


def test_a_dry_run_into_a_new_db_creates_nothing(capsys, tmp_path, fingerprint):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good_document(fingerprint)))
    before = _tree(tmp_path)
    for target in (tmp_path / "new.sqlite", tmp_path / "no" / "such" / "folder" / "new.sqlite"):
        assert _run(capsys, "db", "import", str(good), "--dry-run", "--db", str(target)) == (
            0, "added 1, updated 0, skipped 0 (dry run: nothing written)\n", "")
    assert _tree(tmp_path) == before


def test_a_dry_run_counts_against_the_db_and_leaves_its_folder_as_it_was(capsys, db_path, tmp_path,
                                                                        fingerprint):
    document = _good_document(fingerprint)
    faster = dict(document["records"][0], algorithm_version=2, params={"MWG": 16}, time_s=5e-4)
    slower = dict(faster, problem=SMALL.key, algorithm="gemm_small", algorithm_version=1, time_s=1.0,
                  device=fingerprint(name="Other").to_dict())
    document["records"] = [*document["records"], faster, slower]  # new, faster than stored, slower
    good = tmp_path / "good.json"
    good.write_text(json.dumps(document))
    before = _tree(tmp_path)
    assert _run(capsys, "db", "import", str(good), "--dry-run", "--db", str(db_path)) == (
        0, "added 1, updated 1, skipped 1 (dry run: nothing written)\n", "")
    assert _tree(tmp_path) == before  # byte-identical, and no -wal or -shm file left beside it
    assert _run(capsys, "db", "import", str(good), "--db", str(db_path))[1] == "added 1, updated 1, skipped 1\n"


def test_a_dry_run_on_a_db_in_use_sees_its_latest_results(capsys, db_path, tmp_path, fingerprint):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good_document(fingerprint)))
    with TuningDB(str(db_path)) as db:  # open, with results still in its write-ahead log
        db.record(fingerprint(), GEMM, "gemm", 3, {"MWG": 8}, 1e-4)
        assert _run(capsys, "db", "import", str(good), "--dry-run", "--db", str(db_path))[1] == (
            "added 0, updated 0, skipped 1 (dry run: nothing written)\n")


def test_a_dry_run_refuses_a_newer_db_by_its_name(capsys, db_path, tmp_path, fingerprint):
    import sqlite3

    with sqlite3.connect(db_path) as connection:
        connection.execute("UPDATE tunecl_alembic_version SET version_num = '9a9a9a9a'")
    connection.close()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good_document(fingerprint)))
    before = _tree(tmp_path)
    code, out, err = _run(capsys, "db", "import", str(good), "--dry-run", "--db", str(db_path))
    assert (code, out) == (1, "")
    assert err.startswith(f"tunecl: error: the tuning DB {db_path} has schema revision 9a9a9a9a, newer")
    assert _tree(tmp_path) == before
