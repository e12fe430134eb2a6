"""Filling ops (fill_, zero_, arange) on the device, and random ops from the CPU generator.

There is no device Generator in a Python backend (``torch.Generator(device="opencl")`` cannot be
made), so random ops draw from torch's CPU default generator (or the CPU generator passed in) with
the same calls the CPU kernels make, then upload. ``torch.manual_seed`` therefore makes opencl
randomness reproducible, and a model initialised on the device matches one initialised on the CPU.
``bernoulli_(p)`` (stochastic depth's draw, as dropout's masks) on float32 or bool tensors draws on the
device instead, under a key from that generator (:mod:`tunecl.backend.random_draws`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, graphs, random_draws, state
from tunecl.backend.dtypes import scalar_type_name
from tunecl.backend.operands import is_device, operand
from tunecl.backend.ops.pointwise import run

Number = bool | int | float


def fill_(self: torch.Tensor, value: Number) -> torch.Tensor:
    state.get().pointwise("fill", self.shape, operand(self), (), (value,))
    return self


def fill_tensor_(self: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if value.device.type != "opencl":
        return fill_(self, value.item())
    return run("copy", self, (value,))


def zero_(self: torch.Tensor) -> torch.Tensor:
    return fill_(self, 0)


def arange_out(start: Number, end: Number, step: Number = 1, *, out: torch.Tensor) -> torch.Tensor:
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    if out.dtype.is_floating_point or any(isinstance(v, float) for v in (start, end, step)):
        length = math.ceil((end - start) / step)
    else:
        length = -(-(end - start) // step)
    if out.numel() != length:
        out.resize_((length,))
    state.get().pointwise("arange", out.shape, operand(out), (), (start, step))
    return out


def linspace_out(start: Number, end: Number, steps: int, *, out: torch.Tensor) -> torch.Tensor:
    if out.shape != (steps,):
        out.resize_((steps,))
    if steps == 1:
        return fill_(out, start)
    step = (end - start) / (steps - 1)
    state.get().pointwise("linspace", out.shape, operand(out), (), (start, step, steps // 2, end))
    return out


def eye_out(n: int, m: int | None = None, *, out: torch.Tensor) -> torch.Tensor:
    m = n if m is None else m
    if out.shape != (n, m):
        out.resize_((n, m))
    state.get().pointwise("eye", out.shape, operand(out), (), (max(m, 1),))
    return out


def _host_random(method: str) -> Callable[..., torch.Tensor]:
    """A kernel that draws ``method`` (e.g. ``normal_``) on a CPU tensor and uploads it."""
    def kernel(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple(copies.to_cpu(a) if is_device(a) else a for a in args)
        host = torch.empty(self.shape, dtype=self.dtype)
        getattr(host, method)(*args, **kwargs)
        copies.upload_into(self, host)
        return self
    return kernel


def bernoulli_float_(self: torch.Tensor, p: float = 0.5, generator: torch.Generator | None = None,
                     **kwargs: Any) -> torch.Tensor:
    """``bernoulli_(p)``: in a graph capture (no explicit generator), drawn anew by every replay, on the
    host or from the graph's device generator (see :mod:`tunecl.backend.graphs`); else on the device under
    a key from the CPU generator where :mod:`tunecl.backend.random_draws` applies, or on the host."""
    generator = kwargs.pop("generator", generator)
    shape, dtype = self.shape, self.dtype
    if generator is None and (graphs.draw_on_host(self, lambda: torch.empty(shape, dtype=dtype).bernoulli_(p),
                                                  copies.write_bytes)
                              or graphs.bernoulli_(self, float(p))):
        return self
    if not graphs.capturing() and random_draws.bernoulli_(self, p, generator):
        return self
    return _host_bernoulli(self, p, generator=generator)


_host_bernoulli = _host_random("bernoulli_")


def multinomial(self: torch.Tensor, num_samples: int, replacement: bool = False, *,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """``torch.multinomial`` on the device, by torch's own algorithms (its checks and messages first).

    Without replacement, or for one sample (a language model's sampling ``generate``): on the device, the top
    ``num_samples`` of ``self / q`` with ``q ~ Exp(1)`` drawn as the CPU kernel draws it
    (``empty_like(self).exponential_(1)``, from the CPU generator), so a contiguous ``self`` gives CPU torch's
    samples under the same seed. Several samples with replacement: drawn on the host by the CPU kernel, as
    the other random ops of this module draw."""
    if self.dim() < 1 or self.dim() > 2:
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{scalar_type_name(self.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    categories = self.shape[-1]
    if not replacement and num_samples > categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if categories > 1 << 24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    shape = (num_samples,) if self.dim() == 1 else (self.shape[0], num_samples)
    if not math.prod(shape):
        return torch.empty(shape, dtype=torch.int64, device=self.device)
    rows = self if self.dim() == 2 else self.unsqueeze(0)
    if not replacement or num_samples == 1:
        if not bool((self.max() < math.inf) & (self.min() >= 0)):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        if bool((rows.sum(1) == 0).any()):
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        scores = torch.div(self, torch.empty_like(self).exponential_(1, generator=generator))
        if num_samples == 1:
            return torch.argmax(scores, dim=-1, keepdim=True)
        return torch.topk(scores, num_samples).indices
    # with replacement, several samples: the CPU kernel on the probabilities brought to the host (its running
    # sums are sequential: a category of probability 0 is never drawn), then the samples uploaded
    return torch.multinomial(copies.to_cpu(self), num_samples, True, generator=generator).to(self.device)


def multinomial_out(self: torch.Tensor, num_samples: int, replacement: bool = False, *,
                    generator: torch.Generator | None = None, out: torch.Tensor) -> torch.Tensor:
    if out.dtype != torch.int64:
        raise RuntimeError(f"multinomial expects Long tensor out, got: {scalar_type_name(out.dtype)}")
    return copies.copy_from_and_resize(multinomial(self, num_samples, replacement, generator=generator), out)


def _triangle_indices(which: str) -> Callable[..., torch.Tensor]:
    """``tril_indices`` / ``triu_indices``: worked out on the host (they depend on the sizes alone) and
    uploaded."""
    def kernel(row: int, col: int, offset: int = 0, *, dtype: torch.dtype | None = None, layout: Any = None,
               device: torch.device | None = None, pin_memory: bool | None = None) -> torch.Tensor:
        host = getattr(torch, which)(row, col, offset, dtype=torch.int64 if dtype is None else dtype)
        return host.to(torch.device("opencl") if device is None else device)
    return kernel


def randperm_out(n: int, *, generator: torch.Generator | None = None, out: torch.Tensor) -> torch.Tensor:
    return copies.copy_from_and_resize(torch.randperm(n, generator=generator, dtype=out.dtype), out)


KERNELS: dict[str, Callable[..., Any]] = {
    "fill_.Scalar": fill_,
    "fill_.Tensor": fill_tensor_,
    "zero_": zero_,
    "arange.start_out": arange_out,
    "linspace.out": linspace_out,
    "eye.out": lambda n, *, out: eye_out(n, out=out),
    "eye.m_out": eye_out,
    "uniform_": _host_random("uniform_"),
    "normal_": _host_random("normal_"),
    "bernoulli_.float": bernoulli_float_,
    "bernoulli_.Tensor": _host_random("bernoulli_"),
    "random_": _host_random("random_"),
    "random_.from": _host_random("random_"),
    "random_.to": _host_random("random_"),
    "exponential_": _host_random("exponential_"),
    "randperm.generator_out": randperm_out,
    "multinomial": multinomial,
    "tril_indices": _triangle_indices("tril_indices"),
    "triu_indices": _triangle_indices("triu_indices"),
    "multinomial.out": multinomial_out,
}
