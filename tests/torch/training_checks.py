"""Checks shared by the tests that train the same model two ways (compiled and eager, rewritten or not)."""

from __future__ import annotations

import torch


def assert_same_parameters_and_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                     reference: torch.nn.Module, reference_optimizer: torch.optim.Optimizer,
                                     atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """``model``'s parameters and ``optimizer``'s state (moments, step counts, ...) equal the reference's."""
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=atol, rtol=rtol)
    for a, b in zip(optimizer.state.values(), reference_optimizer.state.values(), strict=True):
        for key in a:
            torch.testing.assert_close(a[key].cpu(), b[key].cpu(), atol=atol, rtol=rtol)
