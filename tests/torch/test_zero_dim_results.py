"""0-dim inputs give 0-dim results: non-structured ops (abs, logical_*) pass their ``.out`` kernel a
fresh ``empty({0})``, which must take the inputs' broadcast shape (it used to stay of shape (0,), so
softsign, l1_loss, soft_margin_loss and isclose followed wrong)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tunecl import config

OPS = {
    "logical_not": lambda a, b: torch.logical_not(a > 0),
    "logical_and": lambda a, b: torch.logical_and(a > 0, b > 0),
    "logical_or": lambda a, b: torch.logical_or(a > 0, b > 0),
    "logical_xor": lambda a, b: torch.logical_xor(a > 0, b > 0),
    "abs": lambda a, b: a.abs(),
    "softsign": lambda a, b: F.softsign(a),
    "l1_loss": lambda a, b: F.l1_loss(a, b),
    "soft_margin_loss": lambda a, b: F.soft_margin_loss(a, b.sign()),
    "isclose": lambda a, b: torch.isclose(a, a + b * 1e-9),
    "allclose": lambda a, b: torch.tensor(torch.allclose(a, a)),
    "mixed 0-dim and 1-dim": lambda a, b: torch.logical_and(a > 0, torch.ones(3, dtype=torch.bool, device=a.device)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_0_dim_input_gives_the_cpu_result(name):
    a, b = torch.tensor(0.7), torch.tensor(-0.3)
    expected = OPS[name](a, b)
    with config.override(fallback="silent"):
        got = OPS[name](a.to("opencl"), b.to("opencl"))
    assert got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected)


def test_an_out_argument_of_another_shape_is_resized_as_torch_does():
    a = torch.randn(2, 3)
    out = torch.empty(5, device="opencl")
    with pytest.warns(UserWarning, match="resized"):
        torch.abs(a.to("opencl"), out=out)
    assert out.shape == (2, 3)
    torch.testing.assert_close(out.cpu(), a.abs())
