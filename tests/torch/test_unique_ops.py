"""``torch.unique`` and ``torch.unique_consecutive``, with and without ``dim``, on the device against CPU torch:
values, inverse and counts, NaN (each one distinct), dtypes, 0-dim, empty and non-contiguous inputs, and
torch's errors."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op

NAN = float("nan")
FLAGS = [dict(), dict(return_inverse=True), dict(return_counts=True), dict(return_inverse=True, return_counts=True)]


def _fixed(t: torch.Tensor, view=lambda v: v) -> Input:
    return Input(t, view, grad=False)


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("values", [
    torch.tensor([3.0, NAN, 1.0, NAN, 3.0, -0.0, 0.0]),
    torch.randint(0, 5, (4, 6)),
    torch.randint(-3, 3, (50,), dtype=torch.int8),
    torch.tensor([True, False, True]),
    (torch.randn(100) * 3).round().half(),
    torch.tensor(5.0),
    torch.empty(0, 3),
    torch.tensor([7]),
])
def test_unique(strict, values, flags):
    check_op(lambda v: torch.unique(v, **flags), _fixed(values), grad=False)
    check_op(lambda v: torch.unique(v, sorted=False, **flags), _fixed(values), grad=False)   # sorted anyway
    check_op(lambda v: torch.unique_consecutive(v, **flags), _fixed(values), grad=False)


@pytest.mark.parametrize("flags", FLAGS)
def test_unique_along_a_dim(strict, flags):
    rows = torch.randint(0, 2, (9, 3))
    for dim in (0, 1, -1):
        check_op(lambda v: torch.unique(v, dim=dim, **flags), _fixed(rows), grad=False)
        check_op(lambda v: torch.unique_consecutive(v, dim=dim, **flags), _fixed(rows), grad=False)
    cube = torch.randint(0, 2, (3, 4, 2)).float()
    check_op(lambda v: torch.unique(v, dim=1, **flags), _fixed(cube), grad=False)
    check_op(lambda v: torch.unique(v, dim=0, **flags), _fixed(cube.half()), grad=False)
    check_op(lambda v: torch.unique_consecutive(v, dim=2, **flags), _fixed(cube), grad=False)
    check_op(lambda v: torch.unique(v, dim=1, **flags), _fixed(torch.empty(3, 0)), grad=False)


def test_views(strict):
    x = torch.randint(0, 4, (5, 8))
    check_op(lambda v: torch.unique(v, return_inverse=True, return_counts=True), _fixed(x, lambda v: v.t()),
             grad=False)
    check_op(lambda v: torch.unique(v, dim=1, return_inverse=True), _fixed(x, lambda v: v[:, ::2]), grad=False)
    check_op(lambda v: torch.unique_consecutive(v, return_counts=True), _fixed(x, lambda v: v.t()), grad=False)


def test_bad_dims_raise_torch_errors(strict):
    for device in ("cpu", "opencl"):
        with pytest.raises(IndexError):
            torch.unique(torch.randn(3, 4, device=device), dim=2)
        with pytest.raises((IndexError, RuntimeError)):
            torch.unique_consecutive(torch.tensor(1.0, device=device), dim=1)
        with pytest.raises(RuntimeError, match="aren't selected"):
            torch.unique(torch.empty(3, 0, device=device), dim=0)
        with pytest.raises(RuntimeError, match="more than one"):
            torch.unique_consecutive(torch.empty(0, 0, device=device), dim=0)
