"""Reflection and replication padding, 1-, 2- and 3-d, forward and backward, against CPU torch (float64 for
the gradients' sums), with torch's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import check_op, Input

CASES = [
    ((2, 3, 7), (3, 2)),                       # 1-d, batched
    ((3, 7), (2, 0)),                          # 1-d, unbatched, one side
    ((3, 7), (2, -1)),                         # negative padding crops
    ((2, 3, 5, 6), (1, 2, 2, 1)),              # 2-d
    ((3, 5, 6), (0, 0, 4, 1)),                 # 2-d, unbatched, the height only
    ((2, 3, 5, 6), (-1, 2, 0, 3)),
    ((1, 2, 3, 4, 5), (1, 1, 2, 0, 1, 2)),     # 3-d
    ((2, 3, 4, 5), (1, 2, 0, 1, 2, 1)),        # 3-d, unbatched
    ((2, 1, 1, 9), (0, 0, 0, 0)),              # no padding at all: a copy
]


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape, padding", CASES)
def test_padding_matches_cpu_forward_and_backward(strict, mode, shape, padding):
    check_op(lambda x: F.pad(x, padding, mode=mode), Input(torch.randn(shape, dtype=torch.float64).float()),
             grad_atol=1e-5)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_padding_modules_strided_float16_and_integer_inputs(strict, mode):
    module = (torch.nn.ReflectionPad2d if mode == "reflect" else torch.nn.ReplicationPad2d)((2, 1, 1, 3))
    check_op(lambda x: module(x.transpose(2, 3)), Input(torch.randn(2, 3, 6, 5)))
    check_op(lambda x: F.pad(x, (2, 1, 1, 3), mode=mode), Input(torch.randn(2, 3, 6, 5).half()), atol=0, rtol=0,
             grad_atol=1e-2)
    x = torch.arange(24).view(1, 4, 6)
    assert torch.equal(F.pad(x.to("opencl"), (2, 3), mode=mode).cpu(), F.pad(x, (2, 3), mode=mode))


def test_a_cropped_and_padded_gradient_sums_every_read_of_an_element(strict):
    """Replication reads the edge once per padded position: its gradient is their sum (here 1 + 5 and 1 + 4)."""
    x = torch.zeros(1, 1, 6, device="opencl", requires_grad=True)
    F.pad(x, (5, 4), mode="replicate").sum().backward()
    assert x.grad.cpu().view(-1).tolist() == [6.0, 1.0, 1.0, 1.0, 1.0, 5.0]
    y = torch.zeros(1, 6, device="opencl", requires_grad=True)
    F.pad(y, (3, 2), mode="reflect").sum().backward()   # reads: 0 1x, 1-3 2x, 4 2x, 5 1x (+ 3 reflected, 2 after)
    want = torch.zeros(1, 6, dtype=torch.float64, requires_grad=True)
    F.pad(want, (3, 2), mode="reflect").sum().backward()
    assert y.grad.cpu().double().equal(want.grad)


@pytest.mark.parametrize("make, padding, mode", [
    (lambda d: torch.randn(1, 1, 2, 2, device=d), (2, 2, 0, 0), "reflect"),   # pad >= the dim
    (lambda d: torch.randn(2, 3, device=d), (1, 1, 1, 1), "replicate"),       # 2-d padding of a 2-d input
    (lambda d: torch.randn(1, 0, 4, device=d), (1, 1), "reflect"),            # an empty dim
])
def test_bad_padding_raises_torch_errors(strict, make, padding, mode):
    with pytest.raises((RuntimeError, NotImplementedError, ValueError)) as cpu:
        F.pad(make("cpu"), padding, mode=mode)
    with pytest.raises(type(cpu.value)) as device:
        F.pad(make("opencl"), padding, mode=mode)
    assert _without_shapes(device.value) == _without_shapes(cpu.value)


def _without_shapes(error: BaseException) -> str:
    """An error's message up to the shape it names (the device's spells it ``torch.Size([...])``)."""
    return str(error).split("torch.Size")[0].split("[")[0]
