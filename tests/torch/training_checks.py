"""Checks shared by the tests that train the same model two ways (compiled and eager, rewritten or not)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F


def assert_same_parameters_and_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                     reference: torch.nn.Module, reference_optimizer: torch.optim.Optimizer,
                                     atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """``model``'s parameters and ``optimizer``'s state (moments, step counts, ...) equal the reference's."""
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=atol, rtol=rtol)
    for a, b in zip(optimizer.state.values(), reference_optimizer.state.values(), strict=True):
        for key in a:
            torch.testing.assert_close(a[key].cpu(), b[key].cpu(), atol=atol, rtol=rtol)


def sgd_trained_state(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
                      options: dict[str, Any] | None = None, compiled: bool = True) -> dict[str, torch.Tensor]:
    """The state dict (on the CPU) of a copy of ``model`` on opencl after ``steps`` SGD steps (lr 0.1) of
    cross-entropy on the batch ``x``, ``y``: run through ``torch.compile(..., backend="tunecl", options=...)``
    or, with ``compiled`` False, eagerly."""
    net = copy.deepcopy(model).to("opencl")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    run = torch.compile(net, backend="tunecl", options=options) if compiled else net
    for _ in range(steps):
        F.cross_entropy(run(x.to("opencl")), y.to("opencl")).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: value.cpu() for name, value in net.state_dict().items()}


def assert_same_state(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float = 1e-5,
                      rtol: float = 1e-5) -> None:
    """Two state dicts of the same model hold the same values, name by name."""
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=atol, rtol=rtol, msg=name)
