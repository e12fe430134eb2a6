"""The precision policy: which precisions a request accepts (torch's flags), and that the tuning DB never
serves a TF32 result to a strict-FP32 request, whatever it holds; TF32 rounding and its tolerance."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from tunecl import precision
from tunecl.db import TuningDB, exchange
from tunecl.db.records import Record
from tunecl.precision import FP32, TF32, TorchFlags, accepted_precisions, at_least, torch_flags
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.search.harness import gemm_spread, reduction_tolerance, tf32_tolerance
from tunecl.search.result import Result, Status
from tunecl.search.tuner import TuneOutcome
from tunecl.tune import record_outcome

GEMM = GemmProblem(1024, 1024, 1024)
CONV = ConvProblem(n=1, c=64, h=56, w=56, k=64, r=3, s=3, padding=1)
VERSIONS = {"gemm_tiled": 1, "gemm_direct": 1, "gemm_mma_tf32": 1}

# Every combination of the three torch settings the policy reads.
ALL_FLAGS = [
    TorchFlags(matmul, precision_, cudnn)
    for matmul, precision_, cudnn in itertools.product(
        (False, True), ("highest", "high", "medium"), (False, True)
    )
]


def matmul_allows_tf32(flags: TorchFlags) -> bool:
    return flags.matmul_allow_tf32 or flags.float32_matmul_precision != "highest"


# ---- the policy ------------------------------------------------------------------------------------


def test_at_least_orders_precisions():
    assert at_least(FP32) == {FP32}
    assert at_least(TF32) == {FP32, TF32}  # an fp32 result satisfies a TF32 request, never the reverse
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        at_least("fp16")


@pytest.mark.parametrize("flags", ALL_FLAGS, ids=str)
def test_matmuls_follow_the_matmul_flags_and_convs_the_cudnn_flag(flags):
    assert accepted_precisions("gemm", flags) == ({FP32, TF32} if matmul_allows_tf32(flags) else {FP32})
    assert accepted_precisions("conv", flags) == ({FP32, TF32} if flags.cudnn_allow_tf32 else {FP32})
    assert accepted_precisions("reduce", flags) == {FP32}  # kinds without a TF32 policy are strict


def test_pytorch_defaults_strict_matmuls_tf32_convs():
    defaults = TorchFlags(matmul_allow_tf32=False, float32_matmul_precision="highest", cudnn_allow_tf32=True)
    assert accepted_precisions("gemm", defaults) == {FP32}
    assert accepted_precisions("conv", defaults) == {FP32, TF32}
    assert accepted_precisions("gemm") == accepted_precisions("conv") == {FP32}  # no flags: strict


def _module(**attributes):
    return types.SimpleNamespace(**attributes)


def _raises(*args):
    raise RuntimeError("you have used mix of the legacy and new APIs to set the TF32 status")


class _Refusing:
    """A torch settings object whose legacy getter raises (torch does when both flag APIs were used)."""

    def __init__(self, fp32_precision):
        self.fp32_precision = fp32_precision

    @property
    def allow_tf32(self):
        _raises()


def test_torch_flags_reads_the_legacy_settings():
    fake = _module(
        backends=_module(cuda=_module(matmul=_module(allow_tf32=True)), cudnn=_module(allow_tf32=False)),
        get_float32_matmul_precision=lambda: "high",
    )
    assert torch_flags(fake) == TorchFlags(True, "high", False)


def test_torch_flags_falls_back_to_the_new_api_and_to_strict():
    backends = _module(fp32_precision="none", cuda=_module(matmul=_Refusing("tf32")), cudnn=_Refusing("none"))
    backends.cudnn.conv = _module(fp32_precision="ieee")
    fake = _module(backends=backends, get_float32_matmul_precision=_raises)
    assert torch_flags(fake) == TorchFlags(True, "high", False)
    backends.cudnn.conv.fp32_precision = "none"  # inherits: cudnn "none", then the global setting
    backends.fp32_precision = "tf32"
    assert torch_flags(fake).cudnn_allow_tf32
    assert torch_flags(_module()) == TorchFlags()  # nothing readable: strict


def test_torch_flags_of_the_installed_torch():
    torch = pytest.importorskip("torch")
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert accepted_precisions("gemm", torch_flags(torch)) == {FP32}
        torch.set_float32_matmul_precision("high")
        assert accepted_precisions("gemm", torch_flags(torch)) == {FP32, TF32}
    finally:
        torch.set_float32_matmul_precision(saved)


# ---- strict requests never get TF32, whatever the DB holds -------------------------------------------


def _ship(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    document = {"format": "tunecl-db", "version": 1, "records": [exchange.record_to_dict(r) for r in records]}
    exchange.write_document(document, folder / "acme.json")


@pytest.fixture
def db(tmp_path):
    with TuningDB(str(tmp_path / "db" / "tuning.sqlite")) as opened:
        yield opened


@pytest.mark.parametrize("problem", [GEMM, CONV], ids=["gemm", "conv"])
def test_a_strict_request_never_gets_the_faster_tf32_result(db, fingerprint, tmp_path, problem):
    """A faster TF32 result and a slower fp32 one, for this device, another driver and in the shipped
    results: every flag combination that is strict for the problem gets an fp32 result."""
    mine, other_driver, shipped_driver = fingerprint("1.0"), fingerprint("2.0"), fingerprint("3.0")
    tf32_algorithm = "gemm_mma_tf32"
    for device, scale in ((mine, 1.0), (other_driver, 0.5)):
        db.record(device, problem, tf32_algorithm, 1, {"MWG": 128}, 1e-4 * scale, precision=TF32)
        db.record(device, problem, "gemm_tiled", 1, {"MWG": 64}, 9e-4 * scale)
    _ship(
        tmp_path / "shipped",
        [Record(shipped_driver, problem.key, tf32_algorithm, 1, {"MWG": 256}, 1e-6, precision=TF32)],
    )
    for flags in ALL_FLAGS:
        accepted = accepted_precisions(problem.kind, flags)
        hit = db.lookup(mine, problem, versions=VERSIONS, precision=accepted)
        if accepted == {FP32}:
            assert (hit.precision, hit.algorithm) == (FP32, "gemm_tiled"), flags
        else:
            assert (hit.precision, hit.algorithm) == (TF32, tf32_algorithm), flags
        assert hit.source == "user"


def test_a_strict_request_with_only_tf32_results_gets_the_default(db, fingerprint, tmp_path):
    """Only TF32 results anywhere in the chain: a strict lookup misses (the heuristic default runs)."""
    mine, other_driver = fingerprint("1.0"), fingerprint("2.0")
    db.record(other_driver, GEMM, "gemm_mma_tf32", 1, {"MWG": 128}, 1e-4, precision=TF32)
    _ship(
        tmp_path / "shipped", [Record(mine, GEMM.key, "gemm_mma_tf32", 1, {"MWG": 64}, 1e-5, precision=TF32)]
    )
    strict = accepted_precisions("gemm", TorchFlags())
    assert db.lookup(mine, GEMM, versions=VERSIONS, precision=strict) is None
    assert db.best(mine, GEMM, precision=strict) is None
    relaxed = accepted_precisions("gemm", TorchFlags(matmul_allow_tf32=True))
    hit = db.lookup(mine, GEMM, versions=VERSIONS, precision=relaxed)
    assert (hit.source, hit.precision) == ("user-other-driver", TF32)


def test_a_strict_request_never_gets_tf32_from_another_batch(db, fingerprint, tmp_path):
    """The near-batch fallback (a result tuned at another M / n) filters precision the same way."""
    mine = fingerprint()
    for problem in (
        GemmProblem(512, 1024, 1024),
        ConvProblem(n=4, c=64, h=56, w=56, k=64, r=3, s=3, padding=1),
    ):
        db.record(mine, problem, "gemm_mma_tf32", 1, {"MWG": 128}, 1e-5, precision=TF32)
    _ship(
        tmp_path / "shipped",
        [
            Record(
                mine, GemmProblem(2048, 1024, 1024).key, "gemm_mma_tf32", 1, {"MWG": 64}, 1e-6, precision=TF32
            )
        ],
    )
    db.record(mine, GemmProblem(256, 1024, 1024), "gemm_tiled", 1, {"MWG": 64}, 9e-4)
    for problem in (GEMM, CONV):
        for flags in ALL_FLAGS:
            accepted = accepted_precisions(problem.kind, flags)
            hits = db.lookup_near_batch(mine, problem, versions=VERSIONS, precision=accepted)
            if accepted == {FP32}:
                assert all(hit.precision == FP32 for hit in hits), (problem, flags, hits)
            else:
                assert any(hit.precision == TF32 for hit in hits), (problem, flags)
    assert [h.algorithm for h in db.lookup_near_batch(mine, GEMM, versions=VERSIONS)] == ["gemm_tiled"]


def _outcome(per_algorithm, precisions, precision_=TF32) -> TuneOutcome:
    winner = min(per_algorithm.values(), key=lambda r: r.time)
    return TuneOutcome(
        problem=GEMM,
        device="Acme",
        winner=winner,
        default=per_algorithm["gemm_tiled"],
        defaults=dict(per_algorithm),
        per_algorithm=per_algorithm,
        versions={n: 1 for n in per_algorithm},
        trials=4,
        resumed=0,
        invalid=0,
        trials_per_algorithm={n: 2 for n in per_algorithm},
        statuses={},
        study_name="s",
        storage_url="u",
        strategy="tpe",
        space_size=None,
        stop_reason="trials",
        elapsed=1.0,
        precision=precision_,
        precisions=precisions,
    )


def test_a_tf32_study_records_each_result_under_its_algorithms_precision(db, fingerprint):
    fp = fingerprint()
    outcome = _outcome(
        {
            "gemm_tiled": Result("gemm_tiled", {"MWG": 64}, Status.OK, (9e-4,)),
            "gemm_mma_tf32": Result("gemm_mma_tf32", {"MWG": 128}, Status.OK, (1e-4,)),
        },
        {"gemm_tiled": FP32, "gemm_mma_tf32": TF32},
    )
    assert record_outcome(db, fp, outcome) == ["gemm_tiled", "gemm_mma_tf32"]
    assert {(r.algorithm, r.precision) for r in db.results()} == {
        ("gemm_tiled", FP32),
        ("gemm_mma_tf32", TF32),
    }
    assert db.lookup(fp, GEMM).algorithm == "gemm_tiled"  # strict by default
    assert db.lookup(fp, GEMM, precision=at_least(TF32)).algorithm == "gemm_mma_tf32"
    assert (
        _outcome({"gemm_tiled": outcome.per_algorithm["gemm_tiled"]}, {}).precision_of("gemm_tiled") == FP32
    )


# ---- TF32 rounding and the verification tolerance -----------------------------------------------------


def test_tf32_round_is_round_to_nearest_ties_away():
    ulp = 2.0**-10  # TF32 ulp at 1
    values = np.array(
        [1 + 0.25 * ulp, 1 + 0.5 * ulp, 1 + 0.75 * ulp, -(1 + 0.5 * ulp), 3.0, np.inf, -np.inf], np.float32
    )
    assert precision.tf32_round(values).tolist() == [1.0, 1 + ulp, 1 + ulp, -(1 + ulp), 3.0, np.inf, -np.inf]
    assert np.isnan(precision.tf32_round(np.array([np.nan], np.float32))[0])
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
    rounded = precision.tf32_round(x)
    assert not (rounded.view(np.uint32) & 0x1FFF).any()  # 13 low mantissa bits cleared
    assert np.abs(rounded - x).max() <= np.abs(x).max() * 2.0**-11


def _tf32_product(a, b):
    return precision.tf32_round(a).astype(np.float64) @ precision.tf32_round(b).astype(np.float64)


@pytest.mark.parametrize("k", [1, 7, 64, 1024])
def test_tf32_tolerance_holds_a_tf32_product_and_rejects_wrong_pairings(k):
    """Within the tolerance: the exact product of TF32-rounded inputs. Outside it: the fp32 tolerance
    alone (TF32 needs its own), a fragment whose k pairs are swapped, a lost k step of 8 terms."""
    rng = np.random.default_rng(k)
    m, n = 96, 80
    a = rng.uniform(-1, 1, (1, m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (1, k, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = (
        np.linalg.norm(a.astype(np.float64), axis=2)[:, :, None]
        * np.linalg.norm(b.astype(np.float64), axis=1)[:, None, :]
    )
    tolerance = reduction_tolerance(k) * bound + tf32_tolerance(
        gemm_spread(a.astype(np.float64), b.astype(np.float64))
    )
    tf32 = _tf32_product(a[0], b[0])[None]
    assert (np.abs(tf32 - exact) <= tolerance).all()
    if k >= 7:  # with a few terms the TF32 error can stay below the fp32 tolerance
        assert (np.abs(tf32 - exact) > reduction_tolerance(k) * bound).any()
    if k >= 8:
        order = np.arange(k)
        order[: k // 8 * 8] = np.arange(k // 8 * 8).reshape(-1, 8)[:, [4, 5, 6, 7, 0, 1, 2, 3]].ravel()
        swapped = _tf32_product(a[0][:, order], b[0])[None]  # A's k and k + 4 exchanged
        assert (np.abs(swapped - exact) > tolerance).mean() > 0.5
        lost = _tf32_product(a[0][:, 8:], b[0][8:])[None]  # the first k step missing
        assert (np.abs(lost - exact) > tolerance).any()
    transposed = _tf32_product(a[0], b[0][:, ::-1])[None]  # B's columns reversed
    assert (np.abs(transposed - exact) > tolerance).mean() > 0.5


def _tf32_truncated_product(a, b):
    """As the wgmma kernels compute: the tensor cores ignore the 13 low mantissa bits of the fp32 inputs."""
    def truncate(x):
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    return truncate(a) @ truncate(b)


@pytest.mark.parametrize("k", [64, 512, 4096])
def test_tf32_tolerance_holds_a_truncated_product_through_its_value_term(k):
    """Truncation errors all point towards zero: with inputs of one sign (a convolution's activations
    after a relu are) they add up in proportion to the output, beyond the spread term. The value term
    covers them and still rejects a lost k step."""
    rng = np.random.default_rng(k)
    m, n = 64, 48
    a = rng.uniform(0, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-0.25, 1, (k, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    spread = gemm_spread(a[None].astype(np.float64), b[None].astype(np.float64))[0]
    fp32 = reduction_tolerance(k) * np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=0)[None, :]
    error = np.abs(_tf32_truncated_product(a, b) - exact)
    assert (error <= fp32 + tf32_tolerance(spread, exact)).all()
    if k >= 512:   # the bias grows like k, the spread like sqrt(k)
        assert (error > fp32 + tf32_tolerance(spread)).any()   # the spread term alone is exceeded
    lost = np.abs(_tf32_truncated_product(a[:, 8:], b[8:]) - exact)
    assert (lost > fp32 + tf32_tolerance(spread, exact)).mean() > 0.5


def test_spread_bounds_the_norm_of_the_terms():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 5, 33))
    b = rng.standard_normal((2, 33, 4))
    terms = np.sqrt(np.einsum("bik,bkj->bij", a**2, b**2))
    spread = gemm_spread(a, b)
    assert (terms <= spread * (1 + 1e-12)).all() and (spread <= terms * np.sqrt(33)).all()
