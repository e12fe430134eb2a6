"""Batch norm's reductions finish inside the elementwise launch: with one part per channel (P = 1) each
direction is one launch (``bn_stats_apply``, ``bn_backward_reduce_apply``), with several the elementwise
kernel merges the parts itself (``FINISH``) instead of a finalize launch. The results are bit for bit
those of the separate launches that ``ONE_LAUNCH = False`` runs, in training and evaluation, with and
without parameters, with an in-place relu or relu6 folded into the forward, with the backward reading dy
through an activation's mask, on float4 and scalar rows, and on grids that loop over channels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tunecl import config
from tunecl.backend.ops import nn as nn_ops
from tunecl.kernels.ops import norm as module

from batch_norm_parts import forced_parts

DEV = torch.device("opencl")

# (N, C, *spatial): float4 rows (7x8 -> L 56), scalar rows (7x7), BatchNorm1d input, one element per
# channel per sample, one sample
SHAPES = [(4, 5, 7, 8), (3, 6, 7, 7), (9, 4), (2, 3, 1, 1), (1, 2, 13)]


@pytest.fixture(params=[1, 3], ids=lambda p: f"P{p}")
def one_part(request):
    """P forced to 1 or 3; the kept launches dropped before and after (ONE_LAUNCH is read when they are
    built)."""
    with forced_parts(request.param) as norm:
        yield norm


def _both(norm, monkeypatch, run):
    """``run()``'s CPU copies with one launch per direction and with two; and the kernels the first ran."""
    results = []
    names = set()
    for one in (True, False):
        monkeypatch.setattr(module, "ONE_LAUNCH", one)
        norm.forget_launches()
        with config.override(fallback="error"):
            results.append([None if t is None else t.detach().cpu() for t in run()])
        if one:   # the kernels by name, "+" marking those that finish the reduction themselves
            names = {key[0] + ("+" if "FINISH" in key[3] else "") for key in norm._launches}
    return results, names


def _expected(norm, *directions):
    """The kernels ``directions`` ("forward", "backward") launch in training with ONE_LAUNCH, at norm's P."""
    if norm.force_parts == 1:
        kernels = {"forward": {"bn_stats_apply"}, "backward": {"bn_backward_reduce_apply"}}
    else:
        kernels = {"forward": {"bn_stats", "bn_apply+"}, "backward": {"bn_backward_reduce", "bn_backward_apply+"}}
    return set().union(*(kernels[d] for d in directions))


def _assert_equal(results):
    for a, b in zip(*results):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                               b.view(torch.int32) if b.dtype == torch.float32 else b)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("fold", [None, "relu", "relu6"])
def test_training_step_is_bit_identical(one_part, monkeypatch, shape, affine, fold):
    torch.manual_seed(7)
    c = shape[1]
    x0, g0 = torch.randn(shape) * 2 + 1, torch.randn(shape)
    w0, b0 = torch.rand(c) + 0.5, torch.randn(c)

    def run():
        x = x0.to(DEV).requires_grad_(True)
        params = [p.to(DEV).requires_grad_(True) for p in (w0, b0)] if affine else [None, None]
        rm, rv = torch.zeros(c, device=DEV), torch.ones(c, device=DEV)
        y = F.batch_norm(x, rm, rv, *params, training=True, momentum=0.3, eps=1e-4)
        if fold == "relu":
            y = y.relu_()
        elif fold == "relu6":
            y = F.relu6(y, inplace=True)
        y.backward(g0.to(DEV))
        return [y, rm, rv, x.grad] + [None if p is None else p.grad for p in params]
    results, names = _both(one_part, monkeypatch, run)
    _assert_equal(results)
    assert names == _expected(one_part, "forward", "backward")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["relu", "relu6"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_masked_backward_is_bit_identical(one_part, monkeypatch, shape, mask, train):
    """The backward of an activation folded into the batch norm's backward (what compiled graphs call),
    and the evaluation backward with weight and bias gradients (its reduction and its elementwise part)."""
    torch.manual_seed(11)
    c = shape[1]
    x, g = torch.randn(shape).to(DEV), torch.randn(shape).to(DEV)
    act = (torch.randn(shape) * 4).to(DEV)
    w = (torch.rand(c) + 0.5).to(DEV)
    rm, rv = (torch.randn(c) * 0.1).to(DEV), (torch.rand(c) + 0.5).to(DEV)
    _, mean, invstd = torch.native_batch_norm(x, w, None, rm.clone(), rv.clone(), True, 0.1, 1e-5)

    def run():
        return nn_ops.batch_norm_backward_masked(g, act, mask, x, w, rm, rv, mean, invstd, train, 1e-5,
                                                 [True, True, True])
    results, names = _both(one_part, monkeypatch, run)
    _assert_equal(results)
    assert names == _expected(one_part, "backward")


def test_evaluation_forward_is_unchanged(one_part, monkeypatch):
    """Evaluation has no reduction: the forward stays one elementwise launch."""
    x = torch.randn(3, 4, 5, 5).to(DEV)
    rm, rv = torch.zeros(4, device=DEV), torch.ones(4, device=DEV)
    results, names = _both(one_part, monkeypatch,
                           lambda: [F.batch_norm(x, rm, rv, training=False)])
    _assert_equal(results)
    assert names == {"bn_apply"}


def test_grid_that_loops_over_channels(one_part, monkeypatch):
    """More channels than the grid has rows of work-groups: each work-group finishes several channels."""
    monkeypatch.setattr(module, "MAX_GRID_GROUPS", 3)
    test_training_step_is_bit_identical(one_part, monkeypatch, (3, 10, 12), True, "relu")


def test_one_launch_matches_cpu(one_part):
    """Against CPU torch (the two-launch route's own tests cover the rest of test_batch_norm.py)."""
    torch.manual_seed(5)
    x0, g0 = torch.randn(6, 5, 9, 4) * 3 - 1, torch.randn(6, 5, 9, 4)
    w0, b0 = torch.rand(5) + 0.5, torch.randn(5)

    def run(device):
        x = x0.to(device).detach().requires_grad_(True)
        w, b = (p.to(device).detach().requires_grad_(True) for p in (w0, b0))
        rm, rv = torch.zeros(5, device=device), torch.ones(5, device=device)
        with config.override(fallback="error"):
            y = F.relu(F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2))
            y.backward(g0.to(device))
        return [t.detach().cpu() for t in (y, rm, rv, x.grad, w.grad, b.grad)]
    for e, a in zip(run("cpu"), run(DEV)):
        torch.testing.assert_close(a, e, atol=5e-5, rtol=1e-4)
