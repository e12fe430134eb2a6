"""histc, bincount and put_ on the device against CPU torch: bins as torch's kernel computes them (float16
included), values outside the range and NaN not counted, weights, minlength, accumulation, and torch's errors."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op

NAN = float("nan")


@pytest.mark.parametrize("args", [(10,), (4, 0, 4), (7, -1, 1), (3,), (1, -5, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_histc(strict, args, dtype):
    x = (torch.randn(1000) * 2).to(dtype)
    x[:4] = torch.tensor([0.0, 1.0, -1.0, 4.0]).to(dtype)   # on the edges
    check_op(lambda x: torch.histc(x, *args), Input(x, grad=False), grad=False)
    check_op(lambda x: torch.histc(x.view(20, 50).t(), *args), Input(x, grad=False), grad=False)


def test_histc_of_constant_nan_and_empty_input(strict):
    check_op(lambda x: torch.histc(x, 3), Input(torch.tensor([1.0, 1.0]), grad=False), grad=False)
    check_op(lambda x: torch.histc(x, 4, 0, 4), Input(torch.tensor([0.0, 4.0, 5.0, -1.0, NAN]), grad=False), grad=False)
    check_op(lambda x: torch.histc(x, 5, 0, 1), Input(torch.empty(0), grad=False), grad=False)


def test_bincount(strict):
    values = torch.randint(0, 9, (500,))
    weights = torch.rand(500)
    check_op(torch.bincount, Input(values, grad=False), grad=False)
    check_op(lambda v: torch.bincount(v, minlength=20), Input(values, grad=False), grad=False)
    check_op(lambda v, w: torch.bincount(v, w), Input(values, grad=False), Input(weights, grad=False), grad=False)
    check_op(lambda v: torch.bincount(v.int()), Input(values, grad=False), grad=False)
    check_op(lambda v: torch.bincount(v, minlength=3), Input(torch.empty(0, dtype=torch.long), grad=False), grad=False)


def test_put(strict):
    index = torch.tensor([0, 5, -1, 5])
    source = torch.tensor([1.0, 2.0, 3.0, 4.0])
    check_op(lambda x, s: x.clone().put_(index.to(x.device), s, accumulate=True), Input(torch.randn(3, 4)),
             Input(source))
    check_op(lambda x, s: x.put(index[:3].to(x.device), s[:3]), Input(torch.randn(3, 4)), Input(source))


@pytest.mark.parametrize("call, message", [
    (lambda d: torch.bincount(torch.tensor([-1, 2], device=d)), "non-negative integral"),
    (lambda d: torch.bincount(torch.tensor([[1]], device=d)), "non-negative integral"),
    (lambda d: torch.histc(torch.tensor([1.0], device=d), bins=0), "bins must be > 0"),
    (lambda d: torch.histc(torch.tensor([1.0], device=d), 3, 2, 1), "max must be larger than min"),
])
def test_bad_counting_calls_raise_torch_errors(strict, call, message):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match=message):
            call(device)


def test_take(strict):
    index = torch.tensor([[0, 11], [-1, 5]])
    check_op(lambda x: x.take(index.to(x.device)), Input(torch.randn(3, 4)))
    check_op(lambda x: x.t().take(index.to(x.device)), Input(torch.randn(4, 3)))
    with pytest.raises(IndexError):
        torch.randn(3, 4, device="opencl").take(torch.tensor([12], device="opencl"))


def test_put_into_a_transposed_tensor(strict):
    check_op(lambda x, s: x.t().clone().t().put_(torch.tensor([1, 6], device=x.device), s, accumulate=True).t(),
             Input(torch.randn(3, 4)), Input(torch.tensor([2.0, 3.0])))
