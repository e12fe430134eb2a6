"""``torch.cdist`` by its direct form (small sets, p other than 2, or without the matrix-product form) against
CPU torch, forward and backward, every kind of p, batch dims broadcast, zero distances and torch's errors."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op

DIRECT = "donot_use_mm_for_euclid_dist"


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
@pytest.mark.parametrize("shapes", [((3, 4), (5, 4)), ((2, 3, 4), (2, 5, 4)), ((2, 3, 4), (5, 4)),
                                    ((1, 3, 4), (2, 5, 4)), ((1, 1), (2, 1))])
def test_cdist(strict, p, shapes):
    x = torch.randn(shapes[0], dtype=torch.float64).float()
    y = torch.randn(shapes[1], dtype=torch.float64).float()
    y.view(-1)[0] = x.view(-1)[0]   # a zero difference (and for 1 column a zero distance)
    check_op(lambda a, b: torch.cdist(a, b, p, compute_mode=DIRECT), Input(x), Input(y), grad_atol=1e-4)


def test_cdist_of_identical_points_and_views(strict):
    x = torch.randn(4, 3)
    check_op(lambda a: torch.cdist(a, a.clone(), 2.0, compute_mode=DIRECT), Input(x), grad_atol=1e-4)
    check_op(lambda a, b: torch.cdist(a.t(), b, 1.0), Input(torch.randn(5, 3)), Input(torch.randn(6, 5)))
    check_op(lambda a, b: torch.cdist(a, b), Input(torch.randn(30, 4)), Input(torch.randn(40, 4)),
             atol=1e-4, grad_atol=1e-3)   # torch's matrix-product form (already on the device)


def test_bad_cdist_calls_raise_torch_errors(strict):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match="same number of columns"):
            torch.cdist(torch.randn(3, 4, device=device), torch.randn(5, 3, device=device))
        with pytest.raises(RuntimeError, match="non-negative p"):
            torch.cdist(torch.randn(3, 4, device=device), torch.randn(5, 4, device=device), p=-1)
