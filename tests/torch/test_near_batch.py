"""The plan cache's near-batch stage: a shape tuned at another batch serves when the exact chain misses.

Results are written into the test's private tuning DB (``TUNECL_DB``); ``stats()`` shows the source,
the stored algorithm and params, and the lookup chain naming the stored problem key.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from opcheck import DEVICE, check_op

from tunecl import config
from tunecl.backend import plans, state
from tunecl.db import TuningDB
from tunecl.kernels import algorithm
from tunecl.problems import ConvProblem, GemmProblem

pytestmark = pytest.mark.skipif(not plans.conv_algorithms(), reason="no conv algorithm is registered")

TOL = {"atol": 3e-5, "rtol": 1e-5}
TUNED = ConvProblem(2, 4, 8, 8, 8, 3, 3, padding=1)   # tuned at batch 2 ...
WANTED = dataclasses.replace(TUNED, n=3)              # ... run at batch 3
DIRECT = {"TP": 2, "TQ": 1, "KPT": 2, "WGP": 4, "WGQ": 4, "WGK": 1, "LOCAL": 1, "CCH": 2, "UNROLL": 1}


def _device():
    return state.get().device


def _record(problem, name, params):
    found = algorithm(name)
    TuningDB(config.get().db_url).record(_device().fingerprint, problem, found.name, found.version, params,
                                         time_s=1e-4)


def _conv(x, w):
    return F.conv2d(x, w, padding=1)


def test_a_conv_tuned_at_another_batch_serves_this_batch(fresh_plans, fresh_stats):
    direct = algorithm("conv_direct")
    assert direct.space(WANTED, _device()).is_valid(DIRECT) and DIRECT != direct.default(WANTED, _device())
    _record(TUNED, "conv_direct", DIRECT)
    check_op(_conv, torch.randn(WANTED.input_shape), torch.randn(WANTED.weight_shape), grad=False, **TOL)
    plan = fresh_stats()["plans"][WANTED.key]
    assert (plan["source"], plan["algorithm"], plan["config"]) == ("user-near-batch", "conv_direct", DIRECT)
    assert plan["lookup"] == (f"no user or shipped result → user-near-batch result conv_direct "
                              f"v{direct.version} of {TUNED.key}")
    served = fresh_plans.cached(WANTED)
    assert served.plan.config == DIRECT  # the plan that ran was built from them
    assert fresh_stats()["plan_counts"] == {"user-near-batch": 1}
    assert "user-near-batch" in plans.SOURCES


def test_a_near_batch_config_that_does_not_fit_is_skipped_quietly(fresh_plans, fresh_stats):
    _record(TUNED, "conv_direct", {**DIRECT, "TP": 3})  # the nearest batch: 3 is not a TP value
    _record(dataclasses.replace(TUNED, n=8), "conv_direct", DIRECT)  # farther, fits
    x, w = torch.randn(WANTED.input_shape), torch.randn(WANTED.weight_shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a guess that fails is no user's concern
        got = _conv(x.to(DEVICE), w.to(DEVICE)).cpu()
    torch.testing.assert_close(got, _conv(x, w), **TOL)
    plan = fresh_stats()["plans"][WANTED.key]
    assert (plan["source"], plan["config"]) == ("user-near-batch", DIRECT)
    assert f"of {TUNED.key}" in plan["lookup"] and "unusable" in plan["lookup"]
    assert plan["lookup"].endswith(f"of {dataclasses.replace(TUNED, n=8).key}")

    other = dataclasses.replace(WANTED, c=2)  # only an unfit near batch: the default, still quietly
    _record(dataclasses.replace(other, n=2), "conv_direct", {**DIRECT, "TP": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _conv(torch.randn(other.input_shape).to(DEVICE), torch.randn(other.weight_shape).to(DEVICE))
    plan = fresh_stats()["plans"][other.key]
    assert plan["source"] == "default" and "unusable" in plan["lookup"]


def test_tune_on_miss_tunes_rather_than_take_a_near_batch(fresh_plans, fresh_stats, monkeypatch):
    _record(TUNED, "conv_direct", DIRECT)
    tuned = []
    monkeypatch.setattr(plans, "_tune_on_miss", lambda problem, *rest: tuned.append(problem))  # finds nothing
    with config.override(tune="on-miss"):
        _conv(torch.randn(WANTED.input_shape).to(DEVICE), torch.randn(WANTED.weight_shape).to(DEVICE))
    assert tuned == [WANTED]
    assert fresh_stats()["plans"][WANTED.key]["source"] == "default"


def test_a_gemm_tuned_at_a_near_m_serves(fresh_plans, fresh_stats):
    second = plans.gemm_algorithms()[1]  # not the first: the default would be the first's
    tuned = GemmProblem(8, 4, 16)
    params = second.default(tuned, _device())
    _record(tuned, second.name, params)
    check_op(torch.mm, torch.randn(12, 16), torch.randn(16, 4), atol=2e-5, grad=False)
    plan = fresh_stats()["plans"][GemmProblem(12, 4, 16).key]
    assert (plan["source"], plan["algorithm"], plan["config"]) == ("user-near-batch", second.name, params)
    assert plan["lookup"].endswith(f"of {tuned.key}")
    check_op(torch.mm, torch.randn(40, 16), torch.randn(16, 4), atol=2e-5, grad=False)  # M 5x away
    assert fresh_stats()["plans"][GemmProblem(40, 4, 16).key]["source"] == "default"
