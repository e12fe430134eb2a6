"""Bugs the OpInfo suite found, one test each (CPU torch is the reference)."""

from __future__ import annotations

import pytest
import torch

from tunecl import config
from tunecl.backend import copies


@pytest.fixture(autouse=True)
def _silent_fallback():
    with config.override(fallback="silent"):
        yield


def test_fallback_op_may_resize_its_downloaded_out_argument():
    # the host copies of opencl tensors were made with Tensor.numpy(), which left their storage not
    # resizable: CPU smooth_l1_loss resizes its out= argument and failed
    a, b = torch.randn(5), torch.randn(5)
    got = torch.nn.functional.smooth_l1_loss(a.to("opencl"), b.to("opencl"))
    torch.testing.assert_close(got.cpu(), torch.nn.functional.smooth_l1_loss(a, b))
    host = torch.empty(3)
    copies.read_bytes(copies._bytes_of(host), copies.buffer_of(torch.ones(3, device="opencl")), 0)
    assert host.untyped_storage().resizable() and host.tolist() == [1.0, 1.0, 1.0]


def test_fallback_writes_back_into_a_size_one_tensor_with_stride_zero():
    # index_fill's backward fills a size-1 gradient expanded from a scalar (stride 0)
    x = torch.randn(1, requires_grad=True)
    d = x.detach().to("opencl").requires_grad_()
    index = torch.tensor([0])
    x.index_fill(0, index, 2.0).sum().backward()
    d.index_fill(0, index.to("opencl"), 2.0).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_efficient_zero_tensors_upload_as_zeros():
    # sgn's gradient of a real input is a ZeroTensor, which has no data to copy
    x = torch.randn(3, 3, device="opencl", requires_grad=True)
    x.sgn().sum().backward()
    assert x.grad.cpu().tolist() == [[0.0] * 3] * 3


def test_numbers_for_tensor_arguments_reach_the_cpu_op_as_tensors():
    # remainder of integers has no device kernel: the adapter's fallback got the 3 of ``x % 3`` as a
    # Python number, which the CPU schema (Tensor other) refused
    x = torch.arange(-5, 5)
    got = torch.remainder(x.to("opencl"), 3)
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), torch.remainder(x, 3))
    torch.testing.assert_close(torch.remainder(x.to("opencl").float(), 2.5).cpu(), torch.remainder(x.float(), 2.5))


def test_sparse_results_are_refused_clearly():
    with pytest.raises(RuntimeError, match="sparse_coo is not supported on the OpenCL device"):
        torch.randn(3, 3, device="opencl").to_sparse()


def test_group_norm_of_a_non_contiguous_input():
    # torch's composite group norm views its input: a non-contiguous one failed
    x = torch.randn(2, 5, 6, 3)[:, :, ::2].transpose(1, 3)
    whole = torch.empty(0).set_(x.untyped_storage()).to("opencl")
    d = whole.as_strided(x.shape, x.stride(), x.storage_offset()).requires_grad_()
    assert not d.is_contiguous()
    w, b = torch.randn(3), torch.randn(3)
    xl = x.clone().requires_grad_()
    expected = torch.nn.functional.group_norm(xl, 3, w, b)
    got = torch.nn.functional.group_norm(d, 3, w.to("opencl"), b.to("opencl"))
    torch.testing.assert_close(got.cpu(), expected)
    expected.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(d.grad.cpu(), xl.grad)


@pytest.mark.parametrize("fn, dtype", [
    (lambda x, out: torch.bitwise_not(x > 0, out=out), torch.bool),
    (lambda x, out: torch._C._nn.gelu(x, out=out), torch.float32),
    (lambda x, out: torch.ops.aten.elu_backward.grad_input(x, 1.0, 1.0, 1.0, False, x, grad_input=out),
     torch.float32),
])
@pytest.mark.parametrize("shape", [(), (1,)])
def test_out_overloads_resize_an_empty_out(fn, dtype, shape, strict):
    # they launched into out as given: a 0-dim or size-1 input left out with shape (0,)
    x = torch.randn(shape)
    expected = fn(x, torch.empty(0, dtype=dtype))
    got = fn(x.to("opencl"), torch.empty(0, dtype=dtype, device="opencl"))
    assert got.shape == expected.shape == shape
    torch.testing.assert_close(got.cpu(), expected)


def test_empty_extremes_raise_what_torch_raises(strict):
    e = torch.empty(0, 3, device="opencl")
    with pytest.raises(RuntimeError, match=r"amax\(\): Expected reduction dim to be specified"):
        torch.amax(e)
    with pytest.raises(IndexError, match=r"amin\(\): Expected reduction dim 0 to have non-zero size"):
        torch.amin(e, 0)
    with pytest.raises(IndexError, match=r"argmax\(\): Expected reduction dim to be specified"):
        torch.argmax(e)
    with pytest.raises(IndexError, match=r"max\(\): Expected reduction dim 0 to have non-zero size"):
        torch.max(e, 0)
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max' must not be None"):
        torch.ops.aten.clamp.out(e, None, None, out=torch.empty(0, device="opencl"))
