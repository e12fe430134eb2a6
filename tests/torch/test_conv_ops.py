"""Convolutions on the device through conv plans, and the plan cache's lookup chain (GEMM included).

Every op test runs forward and backward against CPU torch with ``TUNECL_FALLBACK=error`` (through
``check_op``). The plan tests write results into the test's private tuning DB (``TUNECL_DB``) or
shipped folder and check that ``stats()`` shows the stored algorithm, params and source.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from opcheck import DEVICE, Input, check_op

import tunecl.backend
from tunecl import config
from tunecl.backend import FallbackError, plans, state
from tunecl.db import TuningDB, exchange, shipped
from tunecl.db.records import Record
from tunecl.kernels import algorithm, algorithms
from tunecl.problems import ConvProblem, GemmProblem

pytestmark = pytest.mark.skipif(not plans.conv_algorithms(), reason="no conv algorithm is registered")

TOL = {"atol": 3e-5, "rtol": 1e-5}


def conv(x, w, b=None, **kwargs):
    return F.conv2d(x, w, b, **kwargs)


# (input shape, weight shape, bias, conv2d keyword arguments)
SHAPES = {
    "3x3_pad1_bias": ((2, 4, 9, 9), (6, 4, 3, 3), True, {"padding": 1}),
    "stride2": ((1, 4, 9, 8), (6, 4, 3, 3), False, {"stride": 2, "padding": 1}),
    "dilation2": ((2, 3, 10, 10), (5, 3, 3, 3), True, {"dilation": 2, "padding": 2}),
    "groups2_asymmetric": ((1, 4, 7, 8), (6, 2, 3, 3), True, {"groups": 2, "stride": (2, 1), "padding": (1, 0)}),
    "depthwise": ((2, 6, 7, 7), (6, 1, 3, 3), True, {"groups": 6, "padding": 1}),
    "depthwise_multiplier2": ((1, 3, 6, 6), (6, 1, 3, 3), False, {"groups": 3, "stride": 2, "padding": 1}),
    "1x1": ((2, 8, 5, 5), (4, 8, 1, 1), True, {}),
    "1x1_stride2": ((1, 8, 6, 6), (4, 8, 1, 1), False, {"stride": 2}),
    "rectangular_7x7_stride2_batch1": ((1, 3, 16, 15), (4, 3, 7, 5), True, {"stride": 2, "padding": (3, 2)}),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_conv2d_forward_and_backward(name, fresh_stats):
    x_shape, w_shape, with_bias, kwargs = SHAPES[name]
    args = [torch.randn(x_shape), torch.randn(w_shape)] + ([torch.randn(w_shape[0])] if with_bias else [])
    check_op(conv, *args, **kwargs, **TOL)
    snapshot = fresh_stats()
    assert not snapshot["fallback_ops"]
    assert snapshot["ops"]["aten::convolution_overrideable"] == 1
    assert snapshot["ops"]["aten::convolution_backward_overrideable"] == 1


def test_non_contiguous_inputs_are_made_contiguous_on_the_device(fresh_stats):
    every_other_column = Input(torch.randn(2, 4, 9, 18), lambda v: v[..., ::2])
    channels_last = Input(torch.randn(2, 4, 9, 9), lambda v: v.contiguous(memory_format=torch.channels_last))
    transposed_weight = Input(torch.randn(4, 6, 3, 3), lambda v: v.transpose(0, 1))
    offset_bias = Input(torch.randn(12), lambda v: v[6:])
    check_op(conv, every_other_column, transposed_weight, offset_bias, padding=1, **TOL)
    check_op(conv, channels_last, torch.randn(6, 4, 3, 3), padding=1, stride=2, **TOL)
    assert not fresh_stats()["fallback_ops"]


def test_output_mask_skips_unrequested_gradients(fresh_stats, fresh_plans):
    # input without grad: only grad_weight (bwd_weight) and grad_bias (a sum) are computed (the plans
    # cached are emptied first: stats()["plans"] lists every cached plan, an earlier test's of this shape too)
    check_op(conv, Input(torch.randn(1, 3, 8, 8), grad=False), torch.randn(4, 3, 3, 3), torch.randn(4), padding=1,
             **TOL)
    directions = {key.split("dir=")[1].split(",")[0] for key in fresh_stats()["plans"] if key.startswith("conv:")
                  and "c=3,h=8,w=8,k=4" in key}
    assert directions == {"fwd", "bwd_weight"}


def test_zero_size_batch_launches_nothing(fresh_stats, fresh_plans):
    check_op(conv, torch.randn(0, 4, 5, 5), torch.randn(6, 4, 3, 3), torch.randn(6))
    snapshot = fresh_stats()
    assert not snapshot["fallback_ops"] and not snapshot["plans"]


def test_conv1d_runs_on_the_device_as_a_2d_convolution(fresh_stats):
    check_op(F.conv1d, torch.randn(2, 4, 9), torch.randn(3, 4, 3), torch.randn(3), padding=1, **TOL)
    assert not fresh_stats()["fallback_ops"]


def test_unmappable_transposed_convolutions_take_the_counted_cpu_route(fresh_stats):
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3)
    # output_padding 1 ≥ stride 1 (torch allows it below the dilation): no regular convolution maps
    # the larger output back to 5x5, so it is not a bwd_data problem
    odd = {"dilation": 2, "output_padding": 1}
    with config.override(fallback="silent"):
        got = F.conv_transpose2d(x.to(DEVICE), w.to(DEVICE), **odd)
        # 3-d ones run on the device (tests/torch/test_conv3d_ops.py)
        F.conv_transpose3d(torch.randn(1, 2, 4, 5, 5).to(DEVICE), torch.randn(2, 3, 3, 3, 3).to(DEVICE))
        F.conv3d(torch.randn(1, 2, 4, 5, 5).to(DEVICE), torch.randn(3, 2, 3, 3, 3).to(DEVICE))
    torch.testing.assert_close(got.cpu(), F.conv_transpose2d(x, w, **odd))
    assert fresh_stats()["fallback_ops"] == {"aten::convolution_overrideable": 1}
    with config.override(fallback="error"), pytest.raises(FallbackError, match="must be smaller than the stride"):
        F.conv_transpose2d(x.to(DEVICE), w.to(DEVICE), **odd)


# -- transposed convolutions: the plans of the regular convolution they are made of ----------------------
def conv_t(x, w, b=None, **kwargs):
    return F.conv_transpose2d(x, w, b, **kwargs)


# (input shape, weight shape (C_in, C_out/groups, kh, kw), bias, conv_transpose2d keyword arguments)
TRANSPOSED = {
    "3x3_bias": ((2, 4, 5, 5), (4, 3, 3, 3), True, {}),
    "4x4_stride2_pad1_batch1": ((1, 4, 4, 5), (4, 3, 4, 4), True, {"stride": 2, "padding": 1}),
    "3x3_stride2_output_padding1": ((2, 3, 5, 4), (3, 4, 3, 3), True, {"stride": 2, "padding": 1,
                                                                       "output_padding": 1}),
    "5x5_stride3_pad2_output_padding2": ((1, 3, 3, 4), (3, 2, 5, 5), False, {"stride": 3, "padding": 2,
                                                                             "output_padding": (2, 1)}),
    "dilation2": ((2, 3, 5, 5), (3, 4, 3, 3), True, {"dilation": 2, "padding": 2}),
    "groups2_stride2": ((2, 4, 5, 5), (4, 3, 3, 3), True, {"groups": 2, "stride": 2}),
    "depthwise": ((1, 6, 5, 5), (6, 1, 3, 3), True, {"groups": 6, "padding": 1}),
    "depthwise_multiplier2_stride2": ((2, 3, 4, 4), (3, 2, 4, 4), False, {"groups": 3, "stride": 2,
                                                                          "padding": 1}),
    "1x1_stride2": ((2, 4, 3, 3), (4, 5, 1, 1), True, {"stride": 2}),
    "1x1_pad1": ((1, 4, 5, 5), (4, 3, 1, 1), False, {"padding": 1}),
    "non_square_kernel_and_stride": ((1, 3, 5, 7), (3, 4, 3, 2), True, {"stride": (2, 1), "padding": (1, 0),
                                                                        "output_padding": (1, 0)}),
}


@pytest.mark.parametrize("name", sorted(TRANSPOSED))
def test_conv_transpose2d_forward_and_backward(name, fresh_stats):
    x_shape, w_shape, with_bias, kwargs = TRANSPOSED[name]
    bias = [torch.randn(w_shape[1] * kwargs.get("groups", 1))] if with_bias else []
    check_op(conv_t, torch.randn(x_shape), torch.randn(w_shape), *bias, **kwargs, **TOL)
    snapshot = fresh_stats()
    assert not snapshot["fallback_ops"]
    assert snapshot["ops"]["aten::convolution_overrideable"] == 1
    assert snapshot["ops"]["aten::convolution_backward_overrideable"] == 1


def test_conv_transpose2d_runs_the_regular_convolutions_plans(fresh_stats, fresh_plans):
    """Its output is the regular problem's bwd_data, its gradients that problem's fwd and bwd_weight:
    the very plans (and tuning DB entries) a Conv2d of that shape uses."""
    check_op(conv_t, torch.randn(2, 4, 5, 5), torch.randn(4, 6, 4, 4), torch.randn(6), stride=2, padding=1,
             output_padding=1, **TOL)
    regular = ConvProblem(2, 6, 11, 11, 4, 4, 4, stride=2, padding=1)
    assert regular == ConvProblem.transposed(2, 4, 5, 5, 6, 4, 4, stride=2, padding=1, output_padding=1)
    assert {key for key in fresh_stats()["plans"] if key.startswith("conv:")} == {
        regular.with_direction(direction).key for direction in ("fwd", "bwd_data", "bwd_weight")}


def test_conv_transpose2d_of_non_contiguous_operands(fresh_stats):
    every_other_column = Input(torch.randn(2, 4, 5, 10), lambda v: v[..., ::2])
    channels_last = Input(torch.randn(1, 4, 5, 5), lambda v: v.contiguous(memory_format=torch.channels_last))
    transposed_weight = Input(torch.randn(3, 4, 3, 3), lambda v: v.transpose(0, 1))
    offset_bias = Input(torch.randn(6), lambda v: v[3:])
    check_op(conv_t, every_other_column, transposed_weight, offset_bias, stride=2, **TOL)
    check_op(conv_t, channels_last, torch.randn(4, 3, 3, 3), padding=1, **TOL)
    assert not fresh_stats()["fallback_ops"]


def test_conv_transpose2d_output_mask_and_empty_batch(fresh_stats, fresh_plans):
    check_op(conv_t, Input(torch.randn(1, 3, 4, 4), grad=False), torch.randn(3, 2, 3, 3), torch.randn(2),
             stride=2, **TOL)
    directions = {key.split("dir=")[1].split(",")[0] for key in fresh_stats()["plans"] if key.startswith("conv:")}
    assert directions == {"bwd_data", "bwd_weight"}   # no input gradient: no regular fwd
    check_op(conv_t, torch.randn(0, 3, 4, 4), torch.randn(3, 2, 3, 3), torch.randn(2), stride=2)
    assert not fresh_stats()["fallback_ops"]


def test_conv_transpose2d_in_float16(fresh_stats):
    x, w, b = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(3)
    got = F.conv_transpose2d(*(t.half().to(DEVICE) for t in (x, w, b)), stride=2, padding=1, output_padding=1)
    expected = F.conv_transpose2d(*(t.half().float() for t in (x, w, b)), stride=2, padding=1, output_padding=1)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.cpu().float(), expected.half().float(), atol=1e-2, rtol=1e-3)
    assert not fresh_stats()["fallback_ops"]


def _dcgan_generator(latent: int = 8, width: int = 8) -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(
        nn.ConvTranspose2d(latent, width * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(width * 2), nn.ReLU(True),
        nn.ConvTranspose2d(width * 2, width, 4, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
        nn.ConvTranspose2d(width, 3, 4, 2, 1), nn.Tanh())


def test_dcgan_generator_trains_on_the_device_without_fallback(strict, fresh_stats):
    cpu = _dcgan_generator()
    dev = _dcgan_generator().to(DEVICE)
    dev.load_state_dict(cpu.state_dict())
    z, target = torch.randn(2, 8, 1, 1), torch.rand(2, 3, 16, 16) * 2 - 1
    outputs = []
    for model, device in ((cpu, "cpu"), (dev, DEVICE)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        out = model(z.to(device))
        F.mse_loss(out, target.to(device)).backward()
        optimizer.step()
        outputs.append(out)
    assert outputs[1].shape == (2, 3, 16, 16)
    torch.testing.assert_close(outputs[1].detach().cpu(), outputs[0].detach(), atol=1e-4, rtol=1e-4)
    for (name, want), got in zip(cpu.state_dict().items(), dev.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4, msg=name)
    for (name, want), got in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-4, rtol=1e-4, msg=name)
    snapshot = fresh_stats()
    assert not snapshot["fallback_ops"]
    assert snapshot["ops"]["aten::convolution_overrideable"] == 3
    assert snapshot["ops"]["aten::convolution_backward_overrideable"] == 3


# -- plans: the lookup chain ------------------------------------------------------------------------
def _device():
    return state.get().device


def _plan_of(stats, problem):
    return stats()["plans"][problem.key]


def _non_default_direct_config(problem):
    direct = algorithm("conv_direct")
    params = {"TP": 2, "TQ": 1, "KPT": 2, "WGP": 4, "WGQ": 4, "WGK": 1, "LOCAL": 1, "CCH": 2, "UNROLL": 1}
    assert direct.space(problem, _device()).is_valid(params)
    assert params != direct.default(problem, _device())
    return direct, params


PROBLEM = ConvProblem(1, 4, 8, 8, 8, 3, 3, padding=1)


def _record_into(source, tmp_path, problem, name, version, params):
    """Store one result where ``source`` of the lookup chain finds it."""
    fingerprint = _device().fingerprint
    if source == "user-other-driver":
        fingerprint = dataclasses.replace(fingerprint, driver_version=fingerprint.driver_version + "-other")
    if source == "shipped":
        folder = tmp_path / "shipped_db"
        folder.mkdir()
        record = Record(dataclasses.replace(fingerprint, driver_version="0.1-shipped"), problem.key, name, version,
                        params, 1e-4)
        exchange.write_document({"format": exchange.FORMAT, "version": exchange.VERSION,
                                 "records": [exchange.record_to_dict(record)]}, folder / "device.json")
        shipped.clear_cache()
        return config.override(shipped_db=str(folder))
    TuningDB(config.get().db_url).record(fingerprint, problem, name, version, params, time_s=1e-4)
    return config.override()


@pytest.mark.parametrize("source", ["user", "user-other-driver", "shipped"])
def test_conv_with_a_db_entry_runs_that_entry(source, tmp_path, fresh_plans, fresh_stats):
    direct, params = _non_default_direct_config(PROBLEM)
    with _record_into(source, tmp_path, PROBLEM, direct.name, direct.version, params):
        check_op(conv, torch.randn(PROBLEM.input_shape), torch.randn(PROBLEM.weight_shape), torch.randn(8),
                 padding=1, **TOL)
    assert _plan_of(fresh_stats, PROBLEM) | {"lookup": None} == {
        "algorithm": "conv_direct", "source": source, "config": params, "lookup": None, "precision": "fp32"}
    served = fresh_plans.cached(PROBLEM)
    assert served.plan.config == params  # the plan that ran was built from them
    # the backward directions of the same shape have no entry: defaults
    for direction in ("bwd_data", "bwd_weight"):
        problem = PROBLEM.with_direction(direction)
        first = next(a for a in algorithms("conv") if a.applies(problem, _device()))
        assert _plan_of(fresh_stats, problem)["source"] == "default"
        assert _plan_of(fresh_stats, problem)["algorithm"] == first.name
        assert _plan_of(fresh_stats, problem)["config"] == first.default(problem, _device())
    counts = fresh_stats()["plan_counts"]
    assert counts[source] == 1 and counts["default"] == 2


def test_conv_entry_of_another_algorithm_runs_it(fresh_plans, fresh_stats):
    implicit = algorithm("conv_implicit_gemm")
    assert implicit.applies(PROBLEM, _device())
    params = implicit.default(PROBLEM, _device())
    TuningDB(config.get().db_url).record(_device().fingerprint, PROBLEM, implicit.name, implicit.version, params,
                                         time_s=1e-4)
    check_op(conv, torch.randn(PROBLEM.input_shape), torch.randn(PROBLEM.weight_shape), padding=1, grad=False, **TOL)
    plan = _plan_of(fresh_stats, PROBLEM)
    assert (plan["algorithm"], plan["source"], plan["config"]) == ("conv_implicit_gemm", "user", params)


def test_unknown_shape_runs_the_first_applicable_algorithms_default(fresh_plans, fresh_stats):
    problem = ConvProblem(1, 4, 8, 8, 8, 3, 3, padding=1, stride=2)
    direct, params = _non_default_direct_config(PROBLEM)
    TuningDB(config.get().db_url).record(_device().fingerprint, PROBLEM, direct.name, direct.version, params,
                                         time_s=1e-4)  # another shape's entry
    check_op(conv, torch.randn(problem.input_shape), torch.randn(problem.weight_shape), padding=1, stride=2,
             grad=False, **TOL)
    first = next(a for a in plans.conv_algorithms() if a.applies(problem, _device()))
    plan = _plan_of(fresh_stats, problem)
    assert (plan["algorithm"], plan["source"], plan["config"]) == (first.name, "default",
                                                                   first.default(problem, _device()))
    assert plan["lookup"] == "no user or shipped result"


def test_an_unusable_entry_falls_back_to_the_default_with_one_warning(fresh_plans, fresh_stats):
    direct, params = _non_default_direct_config(PROBLEM)
    TuningDB(config.get().db_url).record(_device().fingerprint, PROBLEM, direct.name, direct.version,
                                         {**params, "TP": 3}, time_s=1e-4)  # 3 is not a TP value
    x, w = torch.randn(PROBLEM.input_shape).to(DEVICE), torch.randn(PROBLEM.weight_shape).to(DEVICE)
    with pytest.warns(UserWarning, match="cannot be used: .*TP=3.*running the default plan instead"):
        conv(x, w, padding=1)
    plan = _plan_of(fresh_stats, PROBLEM)
    first = next(a for a in plans.conv_algorithms() if a.applies(PROBLEM, _device()))
    assert (plan["source"], plan["algorithm"], plan["config"]) == (
        "default", first.name, first.default(PROBLEM, _device()))
    assert "unusable" in plan["lookup"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv(x, w, padding=1)  # the cached plan: no second warning


def test_an_unusable_entry_falls_back_to_the_next_fastest_stored_result(fresh_plans, fresh_stats):
    """The fastest stored result cannot be built; the next fastest, of another algorithm, serves instead
    of the default, with one warning naming both."""
    direct, params = _non_default_direct_config(PROBLEM)
    db = TuningDB(config.get().db_url)
    db.record(_device().fingerprint, PROBLEM, direct.name, direct.version, {**params, "TP": 3}, time_s=1e-5)
    implicit = algorithm("conv_implicit_gemm")
    runner_up = implicit.default(PROBLEM, _device())
    db.record(_device().fingerprint, PROBLEM, implicit.name, implicit.version, runner_up, time_s=2e-5)
    x, w = torch.randn(PROBLEM.input_shape), torch.randn(PROBLEM.weight_shape)
    with pytest.warns(UserWarning, match=r"cannot be used: user conv_direct .*TP=3.*running the user "
                                         r"conv_implicit_gemm result instead"):
        got = conv(x.to(DEVICE), w.to(DEVICE), padding=1).cpu()
    plan = _plan_of(fresh_stats, PROBLEM)
    assert (plan["source"], plan["algorithm"], plan["config"]) == ("user", implicit.name, runner_up)
    torch.testing.assert_close(got, conv(x, w, padding=1), **TOL)


def test_plans_are_chosen_once_per_shape(fresh_plans, fresh_stats, monkeypatch, caplog):
    lookups, builds = [], []
    real_lookup, real_build = TuningDB.lookup, _device().build
    monkeypatch.setattr(TuningDB, "lookup", lambda self, *a, **k: lookups.append(a) or real_lookup(self, *a, **k))
    monkeypatch.setattr(_device(), "build", lambda *a, **k: builds.append(a) or real_build(*a, **k))
    x = torch.randn(PROBLEM.input_shape).to(DEVICE).requires_grad_()
    w = torch.randn(PROBLEM.weight_shape).to(DEVICE).requires_grad_()
    with caplog.at_level(logging.INFO, logger="tunecl.backend.plans"), config.override(fallback="error"):
        for _ in range(3):
            conv(x, w, padding=1).sum().backward()
        torch.opencl.synchronize()
        n_lookups, n_builds = len(lookups), len(builds)
        assert n_lookups == 3  # fwd, bwd_data, bwd_weight: once each
        for _ in range(3):
            conv(x, w, padding=1).sum().backward()
    assert (len(lookups), len(builds)) == (n_lookups, n_builds)  # no SQL, no compiler after the first call
    logged = [r.getMessage() for r in caplog.records if r.name == "tunecl.backend.plans"]
    assert sum(PROBLEM.key in message for message in logged) == 1
    assert fresh_stats()["plan_sources"]["default"] == 6 * 3


def test_tune_on_miss_stores_a_result_and_uses_it(fresh_plans, fresh_stats, monkeypatch):
    monkeypatch.setattr(plans, "TUNE_TRIALS", 3)
    monkeypatch.setattr(plans, "TUNE_TIME_LIMIT", 5.0)
    problem = ConvProblem(1, 2, 5, 5, 3, 3, 3, padding=1)
    x, w = torch.randn(problem.input_shape), torch.randn(problem.weight_shape)
    with config.override(tune="on-miss"):
        got = conv(x.to(DEVICE), w.to(DEVICE), padding=1).cpu()
    torch.testing.assert_close(got, conv(x, w, padding=1), **TOL)
    tuned = _plan_of(fresh_stats, problem)
    assert tuned["source"] == "tuned-on-miss"
    stored = TuningDB(config.get().db_url).best(_device().fingerprint, problem)
    assert stored is not None and stored.time_s > 0
    plans.clear()  # a new process: the stored result is found in the user DB, nothing is tuned
    conv(x.to(DEVICE), w.to(DEVICE), padding=1)
    again = _plan_of(fresh_stats, problem)
    assert again["source"] == "user" and (again["algorithm"], again["config"]) == (stored.algorithm, stored.params)


# -- GEMM plans through the same cache ------------------------------------------------------------------
def test_gemm_with_a_db_entry_runs_that_entry(fresh_plans, fresh_stats):
    problem = GemmProblem(8, 4, 16)
    second = plans.gemm_algorithms()[1]  # not the first: the default would be the first's
    params = second.default(problem, _device())
    TuningDB(config.get().db_url).record(_device().fingerprint, problem, second.name, second.version, params,
                                         time_s=1e-4)
    check_op(torch.mm, torch.randn(8, 16), torch.randn(16, 4), atol=2e-5)
    plan = _plan_of(fresh_stats, problem)
    assert (plan["algorithm"], plan["source"], plan["config"]) == (second.name, "user", params)
    unknown = GemmProblem(8, 5, 16)
    check_op(torch.mm, torch.randn(8, 16), torch.randn(16, 5), atol=2e-5, grad=False)
    first = plans.gemm_algorithms()[0]
    assert _plan_of(fresh_stats, unknown) | {"lookup": None} == {
        "algorithm": first.name, "source": "default", "config": first.default(unknown, _device()), "lookup": None,
        "precision": "fp32"}
    assert tunecl.backend.stats()["plan_counts"]["user"] == 1
