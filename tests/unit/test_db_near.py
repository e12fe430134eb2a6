"""Near-batch lookup: the matching rule (tunecl.db.near) and TuningDB.lookup_near_batch over the chain."""

from __future__ import annotations

import dataclasses

import pytest

from tunecl.db import TuningDB, exchange
from tunecl.db.near import GEMM_MAX_RATIO, batch_pattern
from tunecl.db.records import Record
from tunecl.problems import ConvProblem, GemmProblem

CONV = ConvProblem(n=16, c=64, h=56, w=56, k=64, r=3, s=3, padding=1, direction="bwd_data")
GEMM = GemmProblem(64, 1000, 2048, trans_b=True)


def _at(problem, batch: int) -> str:
    field = "n" if isinstance(problem, ConvProblem) else "m"
    return dataclasses.replace(problem, **{field: batch}).key


# -- the rule ---------------------------------------------------------------------------------------
def test_conv_pattern_matches_every_field_but_n():
    pattern = batch_pattern(CONV)
    assert (pattern.prefix, pattern.batch) == ("conv:n=", 16)
    assert pattern.suffix == CONV.key.removeprefix("conv:n=16")
    assert pattern.batch_of(_at(CONV, 2)) == 2 and pattern.batch_of(_at(CONV, 1024)) == 1024  # any ratio
    assert pattern.batch_of(CONV.key) is None  # the problem itself is the exact lookup's
    for field, value in (("c", 32), ("h", 28), ("w", 28), ("k", 128), ("stride", 2), ("padding", 0),
                         ("dilation", 2), ("direction", "fwd"), ("dtype", "float16")):
        other = dataclasses.replace(CONV, n=8, **{field: value})
        assert pattern.batch_of(other.key) is None, field
    assert pattern.batch_of(dataclasses.replace(CONV, n=8, c=32, k=32, groups=32).key) is None
    assert pattern.batch_of(_at(GEMM, 16)) is None
    assert pattern.batch_of("conv:n=08" + pattern.suffix) is None  # not canonical: never stored
    assert pattern.batch_of("conv:n=x" + pattern.suffix) is None


def test_gemm_pattern_matches_m_within_a_factor():
    pattern = batch_pattern(GEMM)
    assert (pattern.prefix, pattern.suffix) == ("gemm:m=", GEMM.key.removeprefix("gemm:m=64"))
    assert GEMM_MAX_RATIO == 4
    assert [pattern.batch_of(_at(GEMM, m)) for m in (15, 16, 17, 63, 100, 256, 257)] == [
        None, 16, 17, 63, 100, 256, None]
    for field, value in (("n", 999), ("k", 1024), ("trans_a", True), ("trans_b", False), ("batch", 2),
                         ("dtype", "float16")):
        assert pattern.batch_of(dataclasses.replace(GEMM, m=32, **{field: value}).key) is None, field


def test_rank_closest_batch_first_ties_to_the_larger():
    pattern = batch_pattern(dataclasses.replace(CONV, n=4))
    keys = [_at(CONV, n) for n in (1, 2, 3, 6, 8, 16, 64)] + [CONV.key, GEMM.key]
    # |log(n/4)|: 3 and 6 ~0.29/0.41, 2 and 8 tie at log 2 (8 first), 16 and 1 tie at log 4 (16 first)
    assert pattern.rank(keys) == [_at(CONV, n) for n in (3, 6, 8, 2, 16, 1, 64)]
    assert pattern.rank([]) == []


def test_batch_pattern_refuses_other_values():
    with pytest.raises(TypeError):
        batch_pattern("conv:n=1,c=1,h=1,w=1,k=1,r=1,s=1")  # a key, not a problem


# -- the DB -----------------------------------------------------------------------------------------
@pytest.fixture
def db(tmp_path):
    with TuningDB(str(tmp_path / "db" / "tuning.sqlite")) as opened:
        yield opened


def _ship(folder, records: list[Record]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    document = {"format": "tunecl-db", "version": 1, "records": [exchange.record_to_dict(r) for r in records]}
    exchange.write_document(document, folder / "acme.json")


def test_lookup_near_batch_follows_the_chain_closest_first(db, fingerprint, tmp_path):
    mine, other_driver, other_model = fingerprint("1.0"), fingerprint("2.0"), fingerprint(name="Acme GPU 1")
    wanted = dataclasses.replace(CONV, n=3)
    _ship(tmp_path / "shipped", [
        Record(fingerprint("9.0"), _at(CONV, 4), "conv_direct", 1, {"at": "ship 4"}, 1e-3),
        Record(mine, CONV.key, "conv_direct", 1, {"at": "ship 16"}, 1e-3)])
    db.record(mine, _at(CONV, 2), "conv_direct", 1, {"at": 2}, 2e-3)
    db.record(mine, _at(CONV, 2), "conv_winograd", 1, {"at": "2w"}, 1e-3)  # the faster one per problem
    db.record(mine, _at(CONV, 16), "conv_direct", 1, {"at": 16}, 1e-3)
    db.record(mine, _at(CONV, 4), "conv_direct", 1, {"at": 4}, 1e-3, status="failed:wrong result")
    db.record(mine, dataclasses.replace(CONV, n=4, c=32).key, "conv_direct", 1, {"at": "c32"}, 1e-3)
    db.record(other_driver, _at(CONV, 4), "conv_direct", 1, {"at": "driver 4"}, 1e-3)  # nearer than 2
    db.record(other_model, _at(CONV, 4), "conv_direct", 1, {"at": "model 4"}, 1e-3)  # another model

    hits = db.lookup_near_batch(mine, wanted)
    # the user DB's exact device first (2 is nearer 3 than 16), then the other driver, then shipped:
    # the exact device's shipped record first there, then the model's
    assert [(h.source, h.problem, h.params) for h in hits] == [
        ("user-near-batch", _at(CONV, 2), {"at": "2w"}),
        ("user-near-batch", _at(CONV, 16), {"at": 16}),
        ("user-other-driver-near-batch", _at(CONV, 4), {"at": "driver 4"}),
        ("shipped-near-batch", CONV.key, {"at": "ship 16"}),
        ("shipped-near-batch", _at(CONV, 4), {"at": "ship 4"}),
    ]
    assert [(h.source, h.params) for h in db.lookup_near_batch(other_model, wanted)] == [
        ("user-near-batch", {"at": "model 4"})]  # another model gets none of mine
    assert hits[0].algorithm == "conv_winograd" and hits[0].device_label == mine.label
    assert db.lookup_near_batch(mine, wanted.key) == hits  # a key works as well
    # versions and precision filter as in lookup
    only_winograd = db.lookup_near_batch(mine, wanted, versions={"conv_winograd": 1})
    assert [h.params for h in only_winograd] == [{"at": "2w"}]
    assert db.lookup_near_batch(mine, wanted, versions={}) == []
    assert db.lookup_near_batch(mine, wanted, precision="tf32") == []
    # the exact lookup is unchanged: the near batches never answer it
    assert db.lookup(mine, wanted) is None
    assert db.lookup(mine, _at(CONV, 2)).problem == _at(CONV, 2)
    db.record(mine, wanted, "conv_direct", 1, {"at": 3}, 1e-3)  # the exact problem is lookup's alone
    assert db.lookup_near_batch(mine, wanted) == hits


def test_lookup_near_batch_gemm(db, fingerprint):
    fp = fingerprint()
    for m in (8, 32, 128, 512):
        db.record(fp, _at(GEMM, m), "gemm_tiled", 1, {"m": m}, 1e-3)
    db.record(fp, dataclasses.replace(GEMM, m=64, k=1024), "gemm_tiled", 1, {"k": 1024}, 1e-3)
    assert [h.params for h in db.lookup_near_batch(fp, GEMM)] == [{"m": 128}, {"m": 32}]  # tie: the larger
    assert [h.params for h in db.lookup_near_batch(fp, dataclasses.replace(GEMM, m=2))] == [{"m": 8}]
