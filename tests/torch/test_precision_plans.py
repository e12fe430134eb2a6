"""The backend serves plans by torch's precision flags: a TF32 result only where the flags allow TF32.

PoCL has no tensor cores, so ``gemm_mma_tf32`` never applies here; the selection is tested with a
stand-in TF32 algorithm registered after the fp32 families (where the real one is): it declares
``precision = "tf32"`` and computes with ``gemm_tiled``'s kernels. The test's private tuning DB holds a
faster result of it and a slower ``gemm_tiled`` result for one shape.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import DEVICE

from tunecl import config, kernels, precision
from tunecl.backend import plans, state
from tunecl.db import TuningDB
from tunecl.kernels import algorithm
from tunecl.problems import ConvProblem, GemmProblem

M, N, K = 12, 4, 16
PROBLEM = GemmProblem(M, N, K)
CONV = ConvProblem(2, 4, 8, 8, 8, 3, 3, padding=1)
DIRECT = {"TP": 2, "TQ": 1, "KPT": 2, "WGP": 4, "WGQ": 4, "WGK": 1, "LOCAL": 1, "CCH": 2, "UNROLL": 1}


class FakeTF32:
    """``gemm_tiled`` under another name, declaring TF32 precision (what the plan cache looks at)."""

    name = "gemm_fake_tf32"
    version = 1
    kind = "gemm"
    precision = precision.TF32

    def __init__(self):
        self.tiled = algorithm("gemm_tiled")

    def applies(self, problem, device):
        return self.tiled.applies(problem, device)

    def space(self, problem, device):
        return self.tiled.space(problem, device)

    def default(self, problem, device):
        return self.tiled.default(problem, device)

    def build(self, problem, device, config_):
        return self.tiled.build(problem, device, config_)


@pytest.fixture
def torch_flags_restored():
    """torch's TF32 flags as they were before the test, whatever it sets."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    matmul_precision = torch.get_float32_matmul_precision()
    yield
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.fixture
def fake_tf32(monkeypatch, fresh_plans, fresh_stats, torch_flags_restored):
    """The stand-in registered last for GEMMs; a slower gemm_tiled and a faster TF32 result stored."""
    fake, real = FakeTF32(), kernels.algorithms
    monkeypatch.setattr(kernels, "algorithms", lambda kind: real(kind) + ([fake] if kind == "gemm" else []))
    device = state.get().device
    db = TuningDB(config.get().db_url)
    params = fake.tiled.default(PROBLEM, device)
    db.record(device.fingerprint, PROBLEM, "gemm_tiled", fake.tiled.version, params, time_s=2e-4)
    db.record(device.fingerprint, PROBLEM, fake.name, fake.version, params, time_s=1e-4, precision=precision.TF32)
    return fresh_stats


def _served(stats, problem=PROBLEM):
    """Run one fp32 matmul of ``problem``'s shape (checked against CPU torch); the plan that served it."""
    a, b = torch.randn(M, K), torch.randn(K, N)
    torch.testing.assert_close((a.to(DEVICE) @ b.to(DEVICE)).cpu(), a @ b, atol=2e-5, rtol=1e-5)
    entry = stats()["plans"][problem.key]
    return entry["algorithm"], entry["precision"], entry["source"]


def test_default_flags_never_serve_the_faster_tf32_result(fake_tf32):
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    assert plans.accepted_precisions("gemm") == {"fp32"}
    assert _served(fake_tf32) == ("gemm_tiled", "fp32", "user")


@pytest.mark.parametrize("allow", ["allow_tf32", "high", "medium"])
def test_torch_flags_make_the_tf32_result_eligible_and_flipping_back_serves_fp32(fake_tf32, allow):
    assert _served(fake_tf32) == ("gemm_tiled", "fp32", "user")
    if allow == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision(allow)
    assert plans.accepted_precisions("gemm") == {"fp32", "tf32"}
    assert _served(fake_tf32) == ("gemm_fake_tf32", "tf32", "user")

    if allow == "allow_tf32":  # back to strict in the same process: the fp32 plan cached before serves
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        torch.set_float32_matmul_precision("highest")
    assert plans.accepted_precisions("gemm") == {"fp32"}
    assert fake_tf32()["plans"][PROBLEM.key]["precision"] == "fp32"  # stats show what the flags serve now
    assert _served(fake_tf32) == ("gemm_tiled", "fp32", "user")
    assert fake_tf32()["plan_sources"] == {"user": 3}


def test_the_default_plan_stays_fp32_when_tf32_is_allowed(fake_tf32):
    torch.backends.cuda.matmul.allow_tf32 = True
    other = GemmProblem(8, 8, 8)  # no stored result: the first applicable algorithm's default
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close((a.to(DEVICE) @ b.to(DEVICE)).cpu(), a @ b, atol=2e-5, rtol=1e-5)
    entry = fake_tf32()["plans"][other.key]
    assert (entry["algorithm"], entry["precision"], entry["source"]) == ("gemm_tiled", "fp32", "default")


def test_tune_on_miss_tunes_at_the_precision_the_flags_accept(fake_tf32, monkeypatch):
    from tunecl import tune

    asked = []

    def tune_problem(problem, device, db, **options):
        asked.append((options["precision"], sorted(a.name for a in options["algorithms"])))
        raise OSError("not tuning in this test")

    monkeypatch.setattr(tune, "tune_problem", tune_problem)
    device = state.get().device
    with config.override(tune="on-miss"):
        for allow in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allow
            with pytest.warns(UserWarning, match="on a miss failed"):
                plans.plan(GemmProblem(8, 8, 8 + allow))
    applicable = [a for a in kernels.algorithms("gemm") if a.applies(GemmProblem(8, 8, 8), device)]

    def computing_at(*accepted):  # on a GPU with tensor cores the real gemm_mma_tf32 is one of them
        return sorted(a.name for a in applicable if getattr(a, "precision", "fp32") in accepted)

    assert "gemm_fake_tf32" in computing_at("tf32") and "gemm_tiled" in computing_at("fp32")
    assert asked == [("fp32", computing_at("fp32")), ("tf32", computing_at("fp32", "tf32"))]


def test_convolutions_follow_cudnn_allow_tf32_and_still_get_their_fp32_results(fresh_plans, fresh_stats,
                                                                               torch_flags_restored):
    """PyTorch lets cuDNN use TF32 for convolutions by default, and so does tunecl: a stored TF32 conv
    result would serve. There is no TF32 conv algorithm yet, so a conv is served what it was before."""
    direct = algorithm("conv_direct")
    device = state.get().device
    TuningDB(config.get().db_url).record(device.fingerprint, CONV, direct.name, direct.version, DIRECT, time_s=1e-4)
    x, w = torch.randn(CONV.input_shape), torch.randn(CONV.weight_shape)
    for allow in (True, False):
        torch.backends.cudnn.allow_tf32 = allow
        assert plans.accepted_precisions("conv") == ({"fp32", "tf32"} if allow else {"fp32"})
        got = F.conv2d(x.to(DEVICE), w.to(DEVICE), padding=1).cpu()
        torch.testing.assert_close(got, F.conv2d(x, w, padding=1), atol=3e-5, rtol=1e-5)
        entry = fresh_stats()["plans"][CONV.key]
        assert (entry["algorithm"], entry["config"], entry["precision"], entry["source"]) == (
            "conv_direct", DIRECT, "fp32", "user")
