"""The fused family: a chain of elementwise ops compiled into one kernel (``fused.cl``).

A :class:`Chain` lists its steps in order; each step is one op of the pointwise family
(:data:`tunecl.kernels.ops.pointwise.EXPRESSIONS`, float code) applied to the chain's inputs (``"v0"`` ..),
earlier steps (``"t0"`` ..) or constants, with the op's parameters as constants. The chain becomes
build options of the one template (each step's expression as a macro), so one chain signature is
compiled once per rank and index type and kept; shapes, strides and offsets are launch arguments.
Float32 only: the values between steps stay in registers, where the unfused ops would round each to
float32 in memory, so a fused chain computes the same values (up to the compiler's contractions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

import pyopencl as cl

from tunecl.errors import Unsupported
from tunecl.kernels.ops.pointwise import EXPRESSIONS
from tunecl.kernels.strided import (INT32_MAX, Operand, StridedFamily, merge_dims, meta_dtype,
                                    pack_meta, pad_front, rank_bucket)
from tunecl.kernels.sizes import round_up

MAX_INPUTS = 8    # in0 .. in7 of fused.cl
MAX_STEPS = 16    # t0 .. t15 of fused.cl
Arg = str | float  # "v<k>" (input k), "t<k>" (step k), a constant, or "K(<q>)" (number q of a kernel argument)
_CONSTANT = re.compile(r"K\(\d+\)")


class Step(NamedTuple):
    """One op of a chain: ``op`` (an :data:`EXPRESSIONS` key) on ``args`` (its a, b, c), with ``params``
    (its s0 ..)."""

    op: str
    args: tuple[Arg, ...]
    params: tuple[float, ...]


class Chain(NamedTuple):
    """``inputs`` float32 operands and the ``steps`` computed from them; the last step is the output."""

    inputs: int
    steps: tuple[Step, ...]

    def check(self, max_inputs: int = MAX_INPUTS, max_steps: int = MAX_STEPS, constants: int = 0) -> None:
        """Raise :class:`Unsupported` for a chain ``fused.cl`` (or a kernel taking ``max_inputs`` inputs and
        ``max_steps`` steps, and ``constants`` numbers ``K(q)`` as an argument) cannot compute."""
        if not 1 <= self.inputs <= max_inputs:
            raise Unsupported(f"a fused chain of {self.inputs} inputs (1 to {max_inputs})")
        if not 1 <= len(self.steps) <= max_steps:
            raise Unsupported(f"a fused chain of {len(self.steps)} steps (1 to {max_steps})")
        for k, step in enumerate(self.steps):
            expr = EXPRESSIONS.get(step.op)
            if expr is None or not expr.code or expr.special:
                raise Unsupported(f"{step.op} has no floating expression a fused kernel computes")
            if len(step.args) != expr.nin or len(step.params) != expr.nparams:
                raise Unsupported(f"{step.op} takes {expr.nin} inputs and {expr.nparams} parameters")
            for arg in step.args:
                if isinstance(arg, str) and not (arg[0] == "v" and int(arg[1:]) < self.inputs
                                                 or arg[0] == "t" and int(arg[1:]) < k
                                                 or _is_constant(arg, constants)):
                    raise Unsupported(f"step {k} reads {arg}, which is not defined before it")
            for param in step.params:
                if isinstance(param, str) and not _is_constant(param, constants):
                    raise Unsupported(f"step {k} takes {param} as a parameter: not a number")

    def options(self) -> list[str]:
        """The build options that compute this chain (no whitespace: options split at it)."""
        options = [f"-DNIN={self.inputs}", f"-DNSTEPS={len(self.steps)}", f"-DRESULT=t{len(self.steps) - 1}"]
        for k, step in enumerate(self.steps):
            args = [_c(a) for a in step.args] + ["0"] * (3 - len(step.args))
            params = [_c(p) for p in step.params] + ["0"] * (4 - len(step.params))
            options.append(f"-DF{k}(a,b,c,s0,s1,s2,s3)={EXPRESSIONS[step.op].code}")
            options.append(f"-DSTEP{k}=F{k}({','.join(args + params)})")
        return options


def _is_constant(arg: str, constants: int) -> bool:
    """Whether ``arg`` is ``K(q)`` with q below ``constants``."""
    return _CONSTANT.fullmatch(arg) is not None and int(arg[2:-1]) < constants


def _c(value: Arg) -> str:
    """A step argument as C: a value's name, or a float constant written exactly (hexadecimal)."""
    if isinstance(value, str):
        return value
    value = float(value)
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = f"{float.hex(abs(value))}f"
    return f"(-{text})" if math.copysign(1.0, value) < 0 else text


class Fused(StridedFamily):
    """Launches :class:`Chain` kernels on one device; compiles each chain signature once per rank and
    index type."""

    source_file = "fused.cl"

    def __call__(self, chain: Chain, shape: Sequence[int], out: Operand, inputs: Sequence[Operand]) -> None:
        """Enqueue ``out = chain(inputs)`` over ``shape`` (every operand's strides given for it, 0 along
        broadcast dims). Never waits.

        Raises:
            Unsupported: a chain, dtype or rank this family does not handle.
        """
        if len(inputs) != chain.inputs:
            raise ValueError(f"the chain takes {chain.inputs} inputs, got {len(inputs)}")
        for x in (out, *inputs):
            if x.dtype != "float32":
                raise Unsupported(f"a fused chain over {x.dtype} (float32 only)")
            if len(x.strides) != len(shape):
                raise ValueError(f"strides {x.strides} do not match the shape {tuple(shape)}")
        count = math.prod(shape)
        if count == 0:
            return
        operands = (out, *inputs)
        mshape, mstrides = merge_dims(shape, [x.strides for x in operands])
        rank = rank_bucket(len(mshape))
        extents = [sum((n - 1) * s for n, s in zip(mshape, st)) for st in mstrides]
        wide = count > INT32_MAX or any(x.offset + e > INT32_MAX for x, e in zip(operands, extents))
        idx = "long" if wide else "int"
        meta = [count] + pad_front(mshape, rank, 1)
        for st in mstrides:
            meta += pad_front(st, rank, 0)
        meta += [x.offset for x in operands]
        kernel = self._kernel(chain, rank, idx, len(meta))
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,),
               *[x.buffer for x in operands], pack_meta(meta, idx))

    def _kernel(self, chain: Chain, rank: int, idx: str, meta_len: int) -> cl.Kernel:
        key = (chain, rank, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            chain.check()
            options = chain.options() + [f"-DNDIM={rank}", f"-DIDX={idx}"]
            dtypes = [None] * (1 + chain.inputs) + [meta_dtype(meta_len, idx)]
            kernel = self.cache.build(key, options, "fused", dtypes)
        return kernel

    def __len__(self) -> int:
        """How many chain kernels are compiled."""
        return len(self.cache)
