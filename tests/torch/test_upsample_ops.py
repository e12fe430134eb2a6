"""2-d upsampling (nearest, nearest-exact, bilinear with align_corners either way) on opencl vs CPU, forward
and backward, by sizes and scale factors (up, down, fractional, equal sizes), over odd shapes, dtypes and
strided views; every call under ``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op, strided

MODES = [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bilinear", True)]
# (input shape, interpolate's keyword arguments)
RESIZES = [((2, 3, 5, 7), {"scale_factor": 2}), ((1, 2, 4, 6), {"scale_factor": 3}),
           ((2, 1, 9, 11), {"scale_factor": 0.5}), ((1, 3, 5, 4), {"scale_factor": 1.7}),
           ((1, 2, 5, 5), {"scale_factor": 1.1}),   # equal sizes: copied one to one
           ((2, 2, 6, 5), {"scale_factor": (2.5, 0.6)}), ((1, 1, 3, 8), {"size": (9, 11)}),
           ((1, 2, 7, 6), {"size": (3, 4)}), ((1, 1, 1, 1), {"size": (4, 5)}),
           ((1, 2, 4, 4), {"size": (1, 1)}), ((1, 2, 1, 5), {"size": (3, 1)}),
           ((2, 3, 5, 7), {"size": (5, 7)}), ((1, 2, 5, 3), {"size": (10, 6)}), ((1, 1, 33, 17), {"size": (70, 35)}),
           ((1, 2, 6, 5), {"scale_factor": 1.7, "recompute_scale_factor": True})]


def _interpolate(mode, align_corners, **kwargs):
    return lambda x: F.interpolate(x, mode=mode, align_corners=align_corners, **kwargs)


@pytest.mark.parametrize("mode,align_corners", MODES)
@pytest.mark.parametrize("shape,kwargs", RESIZES)
def test_upsample(mode, align_corners, shape, kwargs):
    check_op(_interpolate(mode, align_corners, **kwargs), torch.randn(shape))


@pytest.mark.parametrize("mode,align_corners", MODES)
def test_upsample_of_strided_views_and_channels_last(mode, align_corners):
    fn = _interpolate(mode, align_corners, scale_factor=1.5)
    check_op(fn, strided(torch.randn(2, 3, 5, 12)))
    check_op(fn, Input(torch.randn(4, 3, 6, 5), lambda v: v.transpose(0, 1)))
    check_op(fn, Input(torch.randn(2, 5, 6, 3), lambda v: v.permute(0, 3, 1, 2)))   # channels_last
    out = check_op(fn, Input(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)))
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("mode,align_corners", MODES)
def test_upsample_of_an_empty_batch(mode, align_corners):
    check_op(_interpolate(mode, align_corners, size=(6, 4)), torch.randn(0, 3, 3, 2))


@pytest.mark.parametrize("mode,align_corners", MODES)
def test_upsample_float16(mode, align_corners, strict):
    x = torch.randn(2, 3, 5, 6).half()
    fn = _interpolate(mode, align_corners, size=(8, 13))
    actual = fn(x.to("opencl"))
    assert actual.dtype == torch.float16
    torch.testing.assert_close(actual.cpu().float(), fn(x.float()), atol=2e-3, rtol=2e-3)
    if mode.startswith("nearest"):   # moved bit for bit
        assert torch.equal(actual.cpu(), fn(x))
    leaf = x.to("opencl").requires_grad_()
    upstream = torch.randn(2, 3, 8, 13).half()
    fn(leaf).backward(upstream.to("opencl"))
    reference = x.float().requires_grad_()
    fn(reference).backward(upstream.float())
    assert leaf.grad.dtype == torch.float16
    torch.testing.assert_close(leaf.grad.cpu().float(), reference.grad, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.int32, torch.bool])
def test_upsample_nearest_of_other_dtypes(dtype, strict):
    """Nearest moves bits, so any dtype works; the CPU kernels take uint8 (the reference for the others is
    the CPU's float32 result, exact for these small integers)."""
    x = (torch.randn(2, 3, 4, 5) * 5).to(dtype)
    for fn in (lambda v: F.interpolate(v, scale_factor=2.5),
               lambda v: F.interpolate(v, size=(3, 7), mode="nearest-exact"),
               lambda v: F.interpolate(v.transpose(2, 3), size=(6, 3))):
        expected = fn(x) if dtype == torch.uint8 else fn(x.float()).to(dtype)
        actual = fn(x.to("opencl"))
        assert actual.dtype == dtype and torch.equal(actual.cpu(), expected)


def test_upsample_backward_ops_directly_and_deterministic(strict):
    """The backward overloads called as torch's derivatives call them (with scales), against the CPU, and
    twice on the device with identical bits; nearest's gradient matches the CPU's bit for bit (same
    summation order)."""
    g = torch.randn(2, 3, 11, 9)
    calls = [(torch.ops.aten.upsample_nearest2d_backward, ((11, 9), (2, 3, 4, 5), 2.75, 1.8)),
             (torch.ops.aten._upsample_nearest_exact2d_backward, ((11, 9), (2, 3, 4, 5), 2.75, 1.8)),
             (torch.ops.aten.upsample_bilinear2d_backward, ((11, 9), (2, 3, 4, 5), False, 2.75, 1.8)),
             (torch.ops.aten.upsample_bilinear2d_backward, ((11, 9), (2, 3, 4, 5), True, None, None))]
    for op, args in calls:
        expected = op(g, *args)
        first, second = op(g.to("opencl"), *args), op(g.to("opencl"), *args)
        torch.testing.assert_close(first.cpu(), expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(first.cpu(), second.cpu())
        if "nearest" in str(op):
            assert torch.equal(first.cpu(), expected)


def test_upsample_bilinear_gradient_against_float64():
    """A large upsampling sums many terms per input: compared with a float64 CPU reference."""
    x = torch.randn(1, 2, 13, 10, dtype=torch.float64)
    upstream = torch.randn(1, 2, 61, 47, dtype=torch.float64)
    for align_corners in (False, True):
        leaf = x.float().to("opencl").requires_grad_()
        F.interpolate(leaf, size=(61, 47), mode="bilinear", align_corners=align_corners).backward(
            upstream.float().to("opencl"))
        reference = x.clone().requires_grad_()
        F.interpolate(reference, size=(61, 47), mode="bilinear",
                      align_corners=align_corners).backward(upstream)
        torch.testing.assert_close(leaf.grad.cpu().double(), reference.grad, atol=1e-5, rtol=1e-5)


def test_upsample_bad_input_raises(strict):
    """The functional forms are checked by torch's meta kernels; the out= overloads reach ours directly."""
    x = torch.randn(2, 3, 4, 5, device="opencl")
    out = torch.empty(0, device="opencl")
    with pytest.raises(RuntimeError, match="4-d"):
        torch.ops.aten.upsample_nearest2d.out(x[0], [4, 4], out=out)
    with pytest.raises(RuntimeError, match="output_size"):
        torch.ops.aten.upsample_bilinear2d.out(x, [0, 4], False, out=out)
    with pytest.raises(RuntimeError, match="grad_output"):
        torch.ops.aten.upsample_bilinear2d_backward.grad_input(x, [4, 4], [2, 3, 2, 2], False, grad_input=out)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.aten.upsample_nearest2d.out(x, [4, 4],
                                              out=torch.empty(0, dtype=torch.int64, device="opencl"))
