"""``check_op``: run an op on CPU and on opencl, forward and backward, and compare.

Inputs are CPU tensors (leaves) or :class:`Input` specs (a leaf plus a view applied on each side,
so non-contiguous layouts reach the device as real strided views). Everything runs with
``TUNECL_FALLBACK=error``: an op that would take the CPU fallback fails the test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tunecl import config

DEVICE = torch.device("opencl")


@dataclasses.dataclass
class Input:
    """A leaf tensor, the view the op receives (``view(leaf)``), and whether to take its gradient."""

    leaf: torch.Tensor
    view: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    grad: bool = True


def t(x: torch.Tensor) -> Input:
    """Transposed view of a 2-d leaf (non-contiguous)."""
    return Input(x, lambda v: v.t())


def strided(x: torch.Tensor) -> Input:
    """Every other element of the last dim (non-contiguous, with gaps)."""
    return Input(x, lambda v: v[..., ::2])


def _prepare(args: tuple, device: torch.device | None) -> tuple[list[Any], list[torch.Tensor]]:
    values, leaves = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = Input(a, grad=a.is_floating_point())
        if isinstance(a, Input):
            leaf = a.leaf.detach().clone()
            if device is not None:
                leaf = leaf.to(device)
            if a.grad and leaf.is_floating_point():
                leaf.requires_grad_(True)
                leaves.append(leaf)
            else:
                leaves.append(None)
            values.append(a.view(leaf))
        else:
            values.append(a)
    return values, leaves


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for x in out for o in _flat(x)]
    return []


def assert_close(expected: torch.Tensor, actual: torch.Tensor, atol: float, rtol: float, what: str) -> None:
    assert actual.device.type == "opencl", f"{what}: result is on {actual.device}, not opencl"
    got = actual.detach().cpu()
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(got, expected.detach(), atol=atol, rtol=rtol, equal_nan=True, msg=what)
    else:
        assert torch.equal(got, expected), f"{what}: {got} != {expected}"


def check_op(fn: Callable[..., Any], *args: Any, atol: float = 1e-5, rtol: float = 1.3e-6,
             grad: bool = True, grad_atol: float | None = None, **kwargs: Any) -> Any:
    """Compare ``fn(*args, **kwargs)`` on CPU and opencl, then the gradients of its float inputs.

    Returns the opencl result. ``atol``/``rtol`` apply to outputs, ``grad_atol`` (default
    ``10 * atol``) to gradients; integer and bool results must match exactly.
    """
    with config.override(fallback="error"):
        cpu_args, cpu_leaves = _prepare(args, None)
        dev_args, dev_leaves = _prepare(args, DEVICE)
        expected = fn(*cpu_args, **kwargs)
        actual = fn(*dev_args, **kwargs)
        exp_flat, act_flat = _flat(expected), _flat(actual)
        assert len(exp_flat) == len(act_flat)
        for i, (e, a) in enumerate(zip(exp_flat, act_flat)):
            assert_close(e, a, atol, rtol, f"output {i}")
        differentiable = [(e, a) for e, a in zip(exp_flat, act_flat) if e.requires_grad and e.dtype.is_floating_point]
        if grad and differentiable:
            cpu_loss = dev_loss = 0
            for e, a in differentiable:
                upstream = torch.randn(e.shape, dtype=e.dtype)
                cpu_loss = cpu_loss + (e * upstream).sum()
                dev_loss = dev_loss + (a * upstream.to(DEVICE)).sum()
            cpu_loss.backward()
            dev_loss.backward()
            for i, (c, d) in enumerate(zip(cpu_leaves, dev_leaves)):
                if c is None or c.grad is None:
                    continue
                assert d.grad is not None, f"input {i}: no gradient on opencl"
                assert_close(c.grad, d.grad, grad_atol or 10 * atol, 10 * rtol, f"grad of input {i}")
    return actual


def same_results(a: Any, b: Any) -> None:
    """Two calls' results (a tensor or a tuple with Nones) are identical: dtypes, shapes and bits."""
    def host(result: Any) -> list[torch.Tensor | None]:
        return [None if t is None else t.cpu() for t in (result if isinstance(result, tuple) else (result,))]

    for x, y in zip(host(a), host(b), strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)

