"""TuningDB: the record rule, best/lookup with versions and precision, the lookup chain, concurrency."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing

import pytest

from tunecl import config
from tunecl.db import TuningDB, exchange, open_db
from tunecl.db.records import Record
from tunecl.errors import DatabaseError
from tunecl.fingerprint import Fingerprint
from tunecl.problems import ConvProblem, GemmProblem

GEMM = GemmProblem(256, 256, 256)
CONV = ConvProblem(n=1, c=64, h=56, w=56, k=64, r=3, s=3, padding=1)


@pytest.fixture
def db(tmp_path):
    with TuningDB(str(tmp_path / "db" / "tuning.sqlite")) as opened:
        yield opened


def test_new_db_is_created_with_its_folder(tmp_path):
    path = tmp_path / "a" / "b" / "t.sqlite"
    with TuningDB(str(path)) as db:
        assert db.path == path and db.url == f"sqlite:///{path}"
        assert db.stats()["results"] == 0
        with db.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    assert path.exists()


def test_default_url_comes_from_config(tmp_path):
    with config.override(db_url=f"sqlite:///{tmp_path / 'cfg.sqlite'}"), TuningDB() as db:
        assert db.path == tmp_path / "cfg.sqlite"
    assert open_db() is open_db()  # shared per process and URL


def test_record_keeps_the_faster_ok_result(db, fingerprint):
    fp = fingerprint()
    db.record(fp, GEMM, "gemm", 1, {"MWG": 64}, 2e-3, default_time_s=4e-3, trials=10)
    db.record(fp, GEMM, "gemm", 1, {"MWG": 32}, 1e-3, default_time_s=4e-3, trials=20)
    db.record(fp, GEMM, "gemm", 1, {"MWG": 16}, 3e-3)  # slower: ignored
    hit = db.best(fp, GEMM)
    assert (hit.params, hit.time_s, hit.default_time_s, hit.source) == ({"MWG": 32}, 1e-3, 4e-3, "user")
    assert hit.device_label == fp.label and hit.precision == "fp32"
    [record] = db.results()
    assert record.trials == 20 and record.origin.startswith("tuned on ")


def test_failed_results_are_kept_apart_and_never_served(db, fingerprint):
    fp = fingerprint()
    db.record(fp, GEMM, "gemm", 1, {"MWG": 16}, None, status="failed:wrong result")
    assert db.best(fp, GEMM) is None and db.lookup(fp, GEMM) is None
    db.record(fp, GEMM, "gemm", 1, {"MWG": 32}, 5e-3)  # ok beats failed
    db.record(fp, GEMM, "gemm", 1, {"MWG": 8}, 1e-9, status="failed:compile error")  # never replaces ok
    assert db.best(fp, GEMM).params == {"MWG": 32}
    # a failed algorithm next to an ok one: only the ok one is served, however "fast" the failure
    db.record(fp, GEMM, "gemm_small", 1, {"X": 1}, 1e-9, status="failed:wrong result")
    assert db.lookup(fp, GEMM).algorithm == "gemm"
    assert [r.status for r in db.results()] == ["ok", "failed:wrong result"]


def test_best_takes_the_fastest_algorithm_filtered_by_versions(db, fingerprint):
    fp = fingerprint()
    db.record(fp, GEMM, "gemm", 1, {"v": 1}, 1e-3)
    db.record(fp, GEMM, "gemm", 2, {"v": 2}, 3e-3)
    db.record(fp, GEMM, "xgemm", 1, {"v": 3}, 2e-3)
    assert db.best(fp, GEMM).params == {"v": 1}
    assert db.best(fp, GEMM, versions={"gemm": 2, "xgemm": 1}).params == {"v": 3}
    assert db.best(fp, GEMM, versions={"gemm": 2}).params == {"v": 2}  # xgemm not listed: ignored
    assert db.best(fp, GEMM, versions={"gemm": 3}) is None
    assert db.best(fp, GEMM, versions={}) is None
    assert db.best(fp, GEMM.key).params == {"v": 1}  # a key works as well as the problem


def test_precision_is_never_mixed(db, fingerprint):
    fp = fingerprint()
    db.record(fp, GEMM, "gemm", 1, {"p": "fp32"}, 2e-3)
    db.record(fp, GEMM, "gemm", 1, {"p": "tf32"}, 1e-3, precision="tf32")
    assert db.best(fp, GEMM).params == {"p": "fp32"}  # strict fp32 never gets tf32
    assert db.lookup(fp, GEMM, precision="tf32").precision == "tf32"
    hit = db.lookup(fp, GEMM, precision=("fp32", "tf32"))  # a request that allows both: the fastest
    assert (hit.precision, hit.params) == ("tf32", {"p": "tf32"})
    assert db.lookup(fp, GEMM, precision="fp16") is None
    assert len(db.results()) == 2  # two natural keys


def _ship(folder, records: list[Record]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    document = {"format": "tunecl-db", "version": 1, "records": [exchange.record_to_dict(r) for r in records]}
    exchange.write_document(document, folder / "acme.json")


def test_lookup_chain_exact_then_other_driver_then_shipped(db, fingerprint, tmp_path):
    mine, other_driver, shipped_driver = fingerprint("1.0"), fingerprint("2.0"), fingerprint("3.0")
    other_model = fingerprint(name="Acme GPU 1000")
    _ship(tmp_path / "shipped", [Record(shipped_driver, GEMM.key, "gemm", 1, {"from": "shipped"}, 9e-3)])

    assert db.lookup(other_model, GEMM) is None
    hit = db.lookup(mine, GEMM)
    assert (hit.source, hit.params) == ("shipped", {"from": "shipped"})
    assert hit.device_label == shipped_driver.label
    assert db.lookup(mine, GEMM, versions={"gemm": 2}) is None  # versions filter the shipped step too

    db.record(other_driver, GEMM, "gemm", 1, {"from": "other driver"}, 5e-3)
    hit = db.lookup(mine, GEMM)
    assert (hit.source, hit.params) == ("user-other-driver", {"from": "other driver"})
    assert db.best(mine, GEMM) is None  # best() is this exact device only

    db.record(mine, GEMM, "gemm", 1, {"from": "mine"}, 7e-3)  # slower than the other driver's, still first
    assert (db.lookup(mine, GEMM).source, db.lookup(mine, GEMM).params) == ("user", {"from": "mine"})
    assert db.lookup(other_model, GEMM) is None
    assert db.lookup(mine, CONV) is None


def test_shipped_prefers_the_exact_device_and_can_be_disabled(db, fingerprint, tmp_path, monkeypatch):
    from tunecl.db import shipped

    mine, other = fingerprint("1.0"), fingerprint("2.0")
    _ship(tmp_path / "shipped", [Record(other, GEMM.key, "gemm", 1, {"d": "other"}, 1e-3),
                                 Record(mine, GEMM.key, "gemm", 1, {"d": "mine"}, 2e-3)])
    assert db.lookup(mine, GEMM).params == {"d": "mine"}
    assert db.lookup(fingerprint("4.0"), GEMM).params == {"d": "other"}  # same model: the fastest
    monkeypatch.setenv("TUNECL_SHIPPED_DB", "")
    assert shipped.folder() is None and db.lookup(mine, GEMM) is None


def test_hit_params_are_a_copy(db, fingerprint):
    fp = fingerprint()
    db.record(fp, GEMM, "gemm", 1, {"MWG": 64, "tile": (4, 4)}, 1e-3)
    hit = db.best(fp, GEMM)
    assert hit.params == {"MWG": 64, "tile": [4, 4]}  # stored as JSON gives it back
    hit.params["MWG"] = 1
    assert db.best(fp, GEMM).params["MWG"] == 64


@pytest.mark.parametrize("change, message", [
    ({"time_s": None}, "needs its time_s"),
    ({"time_s": 0.0}, "positive"),
    ({"time_s": float("nan")}, "positive"),
    ({"default_time_s": -1.0}, "positive"),
    ({"status": "great"}, "status"),
    ({"algorithm": ""}, "algorithm"),
    ({"algorithm_version": -1}, "algorithm_version"),
    ({"trials": True}, "trials"),
    ({"params": {"f": object()}}, "JSON"),
    ({"problem": "gemm:m=0,n=1,k=1"}, "positive"),
])
def test_record_rejects_bad_arguments(db, fingerprint, change, message):
    args = {"fingerprint": fingerprint(), "problem": GEMM, "algorithm": "gemm", "algorithm_version": 1,
            "params": {}, "time_s": 1e-3} | change
    with pytest.raises(ValueError, match=message):
        db.record(**args)
    assert db.results() == []


def test_results_filters_and_stats(db, fingerprint):
    a, b, c = fingerprint("1.0"), fingerprint("2.0"), fingerprint(name="Other")
    db.record(a, GEMM, "gemm", 1, {}, 1e-3)
    db.record(a, CONV, "conv_direct", 1, {}, None, status="failed:timeout")
    db.record(b, CONV, "conv_direct", 1, {}, 2e-3)
    db.record(c, CONV, "conv_direct", 1, {}, 3e-3)
    assert len(db.results()) == 4
    assert [r.problem for r in db.results(a)] == sorted([GEMM.key, CONV.key])
    assert len(db.results(a, same_model=True)) == 3
    assert len(db.results(a, same_model=True, ok_only=True)) == 2
    assert {r.device for r in db.results(problem=CONV)} == {a, b, c}
    assert len(db.results(problem_contains="conv:n=1,")) == 3
    assert db.results(problem_contains="%") == []  # LIKE wildcards are escaped
    stats = db.stats()
    counts = [stats[name] for name in ("devices", "problems", "results", "ok", "failed")]
    assert counts == [3, 2, 4, 3, 1]
    per = {d["key"]: d for d in stats["per_device"]}
    assert (per[a.key]["results"], per[a.key]["failed"], per[a.key]["problems"]) == (2, 1, 2)
    json.dumps(stats)


def test_prune(db, fingerprint):
    a, b = fingerprint("1.0"), fingerprint("2.0")
    long_ago = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    db.merge([Record(a, GEMM.key, "old", 1, {}, 1e-3, created_at=long_ago, origin="x"),
              Record(b, CONV.key, "old_failed", 1, {}, None, status="failed:x", created_at=long_ago,
                     origin="x")])
    db.record(a, GEMM, "new", 1, {}, 1e-3)
    db.record(a, GEMM, "new_failed", 1, {}, None, status="failed:y")
    cutoff = dt.datetime(2021, 1, 1, tzinfo=dt.UTC)
    with pytest.raises(ValueError):
        db.prune()
    assert db.prune(cutoff, dry_run=True) == 2 and len(db.results()) == 4
    assert db.prune(cutoff, failed_only=True, dry_run=True) == 1
    assert db.prune(failed_only=True) == 2
    assert sorted(r.algorithm for r in db.results()) == ["new", "old"]
    assert db.prune(cutoff) == 1
    assert [r.algorithm for r in db.results()] == ["new"]
    stats = db.stats()
    assert (stats["devices"], stats["problems"]) == (1, 1)  # orphans went with their results


def test_sql_errors_become_database_errors(db):
    from sqlalchemy import text

    with pytest.raises(DatabaseError, match="no such table"), db.session_scope() as session:
        session.execute(text("SELECT * FROM nowhere"))


def test_garbage_file_is_a_database_error(tmp_path):
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatabaseError, match="not a database"):
        TuningDB(str(path))


WRITERS, RECORDS = 4, 150   # records per writer


def _record_many(url: str, worker: int, count: int, start=None) -> None:
    fp = Fingerprint("Acme", "Acme GPU 9000", f"driver-{worker % 2}", "3.0", "gpu", 64, 1024, 65536, 2**34)
    with TuningDB(url) as db:
        if start is not None:
            start.wait(timeout=120)   # every writer has started and opened the DB: the writes overlap
        for i in range(count):
            problem = GemmProblem(i + 1, worker + 1, 8)
            db.record(fp, problem, "gemm", 1, {"worker": worker, "i": i}, 1e-3 + i * 1e-6)


def test_four_processes_write_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    # spawn, not fork: each writer is a fresh process with its own connections, as separate tuning runs are
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WRITERS)
    workers = [context.Process(target=_record_many, args=(url, w, RECORDS, start)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
    assert [w.exitcode for w in workers] == [0] * WRITERS
    with TuningDB(url) as db:
        records = db.results()
        assert len(records) == WRITERS * RECORDS
        found = {(r.params["worker"], r.params["i"]) for r in records}
        assert found == {(w, i) for w in range(WRITERS) for i in range(RECORDS)}
        assert db.stats()["devices"] == 2
