"""Export/import: the round trip, the merge rule, provenance, and validation before any write."""

from __future__ import annotations

import copy
import datetime as dt
import json

import pytest

from tunecl.db import TuningDB, exchange, shipped
from tunecl.db.records import Record
from tunecl.errors import ImportFormatError
from tunecl.problems import ConvProblem, GemmProblem

GEMM = GemmProblem(128, 64, 32, trans_b=True)
CONV = ConvProblem(n=2, c=32, h=28, w=28, k=64, r=3, s=3, stride=2, padding=1)


def _filled(path, fingerprint) -> TuningDB:
    db = TuningDB(str(path))
    a, b, other = fingerprint("1.0"), fingerprint("2.0"), fingerprint(name="Other GPU")
    db.record(a, GEMM, "gemm", 3, {"MWG": 64, "VW": [2, 4], "name": "ü"}, 1.25e-4, default_time_s=3e-4,
              trials=50)
    db.record(a, GEMM, "gemm", 3, {"MWG": 64}, 1.5e-4, precision="tf32", origin="tuned on lab-7")
    db.record(a, CONV, "conv_winograd", 1, {"TILE": 4}, None, status="failed:wrong result")
    db.record(b, CONV, "conv_im2col", 2, {}, 0.1 / 3, trials=7)
    db.record(other, GEMM, "gemm", 3, {"MWG": 16}, 2e-3)
    return db


def _strip(document: dict) -> dict:
    return {k: v for k, v in document.items() if k != "exported_at"}


def test_export_import_export_round_trips(tmp_path, fingerprint):
    with _filled(tmp_path / "a.sqlite", fingerprint) as db:
        first = db.export()
    assert len(first["records"]) == 4  # failed results are not exported
    assert [r["status"] for r in first["records"]] == ["ok"] * 4
    path = tmp_path / "export.json"
    exchange.write_document(first, path)
    assert json.loads(path.read_text()) == first  # dumps() is plain JSON
    with TuningDB(str(tmp_path / "b.sqlite")) as empty:
        report = empty.import_(path)
        assert (report.added, report.updated, report.skipped) == (4, 0, 0)
        second = empty.export()
        assert _strip(second) == _strip(first)
        assert str(empty.import_(path)) == "added 0, updated 0, skipped 4"  # idempotent


def test_export_of_one_device_model_is_deterministic(tmp_path, fingerprint):
    with _filled(tmp_path / "a.sqlite", fingerprint) as db:
        mine = db.export(fingerprint("9.9"))  # any driver of the model
        again = db.export(fingerprint("1.0"))
    assert len(mine["records"]) == 3
    assert {r["device"]["name"] for r in mine["records"]} == {"Acme GPU 9000"}
    assert exchange.dumps(mine | {"exported_at": ""}) == exchange.dumps(again | {"exported_at": ""})
    keys = [(r["device"]["driver_version"], r["problem"], r["algorithm"], r["precision"])
            for r in mine["records"]]
    assert keys == sorted(keys)


def test_import_merges_keeping_the_faster_and_provenance(tmp_path, fingerprint):
    fp = fingerprint()
    with TuningDB(str(tmp_path / "t.sqlite")) as db:
        db.record(fp, GEMM, "gemm", 1, {"mine": 1}, 2e-3)
        db.record(fp, CONV, "conv_direct", 1, {"mine": 2}, 1e-3)
        db.record(fp, CONV, "conv_winograd", 1, {"mine": 3}, None, status="failed:compile error")
        faster = Record(fp, GEMM.key, "gemm", 1, {"theirs": 1}, 1e-3, origin="tuned on big-box")
        slower = Record(fp, CONV.key, "conv_direct", 1, {"theirs": 2}, 5e-3)
        fixed = Record(fp, CONV.key, "conv_winograd", 1, {"theirs": 3}, 4e-3)
        may_day = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
        new = Record(fp, CONV.key, "conv_im2col", 1, {"theirs": 4}, 6e-3, created_at=may_day)
        document = {"format": "tunecl-db", "version": 1,
                    "records": [exchange.record_to_dict(r) for r in (faster, slower, fixed, new)]}
        for item in document["records"][1:]:
            del item["origin"]  # no provenance in the file: the file's name becomes it
        path = tmp_path / "from-lab.json"
        path.write_text(json.dumps(document))

        dry = db.import_(path, dry_run=True)
        assert (dry.added, dry.updated, dry.skipped, dry.dry_run) == (1, 2, 1, True)
        assert {r.params.get("mine") for r in db.results()} == {1, 2, 3}  # nothing written

        assert str(db.import_(path)) == "added 1, updated 2, skipped 1"
        results = {r.algorithm: r for r in db.results()}
        assert results["gemm"].params == {"theirs": 1} and results["gemm"].origin == "tuned on big-box"
        assert results["conv_direct"].params == {"mine": 2}
        assert results["conv_winograd"].status == "ok"
        assert results["conv_winograd"].origin == "imported from from-lab.json"
        assert results["conv_im2col"].created_at == may_day


def _valid_document(fingerprint) -> dict:
    record = Record(fingerprint(), GEMM.key, "gemm", 1, {"MWG": 64}, 1e-3, 2e-3, 10,
                    created_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC), origin="tuned on x")
    records = [exchange.record_to_dict(record) for _ in range(2)]  # two separate dicts
    return {"format": "tunecl-db", "version": 1, "records": records}


def _broken(document: dict, change) -> dict:
    document = copy.deepcopy(document)
    change(document)
    return document


BAD_DOCUMENTS = {
    "wrong format": (lambda d: d.update(format="optuna"), "not a tunecl export"),
    "not an object": (lambda d: d.clear(), "not a tunecl export"),
    "newer version": (lambda d: d.update(version=2), "version 2 is newer"),
    "bad version": (lambda d: d.update(version="1"), "bad document version"),
    "no records": (lambda d: d.pop("records"), "'records' must be a list"),
    "record not object": (lambda d: d["records"].append(3), "record 2: expected an object"),
    "missing field": (lambda d: d["records"][1].pop("time_s"), "record 1: missing time_s"),
    "bad problem": (lambda d: d["records"][1].update(problem="gemm:m=1"), "record 1: missing n="),
    "unknown kind": (lambda d: d["records"][0].update(problem="fft:n=1"), "record 0: not a problem key"),
    "zero time": (lambda d: d["records"][1].update(time_s=0), "record 1: time_s must be a positive"),
    "negative default": (lambda d: d["records"][1].update(default_time_s=-1), "default_time_s"),
    "string time": (lambda d: d["records"][1].update(time_s="1"), "time_s"),
    "bool version": (lambda d: d["records"][1].update(algorithm_version=True), "algorithm_version"),
    "bad status": (lambda d: d["records"][1].update(status="fast"), "status"),
    "params list": (lambda d: d["records"][1].update(params=[1]), "params"),
    "device lacks": (lambda d: d["records"][1]["device"].pop("name"), "record 1: device fingerprint lacks"),
    "device type": (lambda d: d["records"][1]["device"].update(compute_units="64"), "compute_units"),
    "bad date": (lambda d: d["records"][1].update(created_at="yesterday"), "record 1: Invalid isoformat"),
}


@pytest.mark.parametrize("name", BAD_DOCUMENTS)
def test_invalid_documents_are_rejected_with_the_record_index(name, fingerprint):
    change, message = BAD_DOCUMENTS[name]
    with pytest.raises(ImportFormatError, match=message) as error:
        exchange.validate_document(_broken(_valid_document(fingerprint), change), "x.json")
    assert "\n" not in str(error.value) and str(error.value).startswith("x.json: ")


def test_valid_document_parses(fingerprint):
    records = exchange.parse_document(json.dumps(_valid_document(fingerprint)).encode(), "ok.json")
    assert len(records) == 2 and records[0].device == fingerprint()


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"format": "tunecl-db", "version": 1, "records": [{"dev', "truncated"),
    ("", "truncated"),
    ('{"format": "tunecl-db", "version": 1, "records": [{"time_s": NaN}]}', "record 0: missing"),
])
def test_unparsable_text(text, message):
    with pytest.raises(ImportFormatError, match=message):
        exchange.parse_document(text, "x.json")


def test_not_a_number_times_are_rejected(fingerprint):
    document = _valid_document(fingerprint)
    text = json.dumps(document).replace('"time_s": 0.001', '"time_s": NaN', 1)
    with pytest.raises(ImportFormatError, match="record 0: time_s"):
        exchange.parse_document(text, "x.json")


def test_a_bad_record_leaves_the_db_unchanged(tmp_path, fingerprint):
    document = _valid_document(fingerprint)
    document["records"][0]["algorithm"] = "other"  # would be added ...
    document["records"].append({"broken": True})   # ... but the document is bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with TuningDB(str(tmp_path / "t.sqlite")) as db:
        with pytest.raises(ImportFormatError, match="record 2"):
            db.import_(path)
        assert db.results() == []


def test_shipped_folder_is_loaded_once_and_skips_broken_files(tmp_path, fingerprint, monkeypatch):
    folder = tmp_path / "shipped"
    folder.mkdir()
    exchange.write_document(_valid_document(fingerprint), folder / "acme.json")
    (folder / "broken.json").write_text("{")
    (folder / "notes.txt").write_text("ignored")
    with pytest.warns(UserWarning, match="broken.json"):
        index = shipped.index()
    assert [f.name for f in index.files] == ["acme.json"]
    assert shipped.index() is index  # loaded once
    hit = shipped.lookup(fingerprint("5.0"), GEMM.key, None, frozenset({"fp32"}))
    assert hit.source == "shipped" and hit.params == {"MWG": 64}
    monkeypatch.setenv("TUNECL_SHIPPED_DB", str(tmp_path / "missing"))
    assert shipped.index().files == []


def test_the_repository_shipped_folder_is_valid():
    from tunecl import config

    folder = config.Config.from_env({}).shipped_db
    for path in sorted(__import__("pathlib").Path(folder).glob("*.json")):
        exchange.read_document(path)  # raises on a malformed shipped file


def test_a_scratch_copy_holds_the_db_and_writes_nothing_back(tmp_path, fingerprint):
    import hashlib

    from tunecl.db.scratch import scratch_copy

    path = tmp_path / "a.sqlite"
    _filled(path, fingerprint).close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with scratch_copy(str(path)) as copy:
        assert copy.path is None and len(copy.results()) == 5
        copy.record(fingerprint(), CONV, "conv_im2col", 2, {}, 1e-3)
        assert len(copy.results()) == 6
    with scratch_copy(str(path)) as again:  # each copy is a fresh one
        assert len(again.results()) == 5
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sqlite"]
    with scratch_copy(str(tmp_path / "none" / "b.sqlite")) as empty:
        assert empty.results() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sqlite"]


def test_export_of_stored_device_models_by_key(tmp_path, fingerprint):
    from tunecl.db.selection import describe, is_local_form, stored_matches

    with _filled(tmp_path / "a.sqlite", fingerprint) as db:
        stored = db.devices()
        assert [fp.label for fp in stored] == ["Acme GPU 9000 (driver 1.0)", "Acme GPU 9000 (driver 2.0)",
                                               "Other GPU (driver 1.0)"]
        other = stored_matches("other gpu", stored)
        assert other == [fingerprint(name="Other GPU")]
        document = db.export(model_keys=[fp.model_key for fp in other])
        assert {r["device"]["name"] for r in document["records"]} == {"Other GPU"}
        both = db.export(model_keys=[fp.model_key for fp in stored])
        assert len(both["records"]) == len(db.export()["records"]) == 4
        assert db.export(model_keys=[])["records"] == []
    assert stored_matches(fingerprint("2.0").key, stored) == [fingerprint("2.0")]
    assert stored_matches("  ", stored) == [] and stored_matches("h200", stored) == []
    assert [is_local_form(s) for s in ("0", " 12 ", "1:0", "1 : 0", "h200", "0x1", "1:a")] == [
        True, True, True, True, False, False, False]
    assert describe([]) == "the DB holds no results yet"
    assert describe(stored[-1:]) == f"stored devices: Other GPU (driver 1.0) [{fingerprint(name='Other GPU').key}]"
