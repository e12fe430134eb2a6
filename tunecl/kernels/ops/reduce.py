"""The reduce family: sum, mean, amax/amin, argmax/argmin, var/std and vector norms over any dims.

One ``reduce.cl`` template; each op is a row of ``REDUCTIONS`` (mode plus MAP/COMBINE/FINAL
expressions passed as ``-D`` macros). A work-item per output loops serially when outputs are many
and short; a work-group per output with a tree in local memory serves long reductions.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import NamedTuple

import numpy as np
import pyopencl as cl

from tunecl import profiling
from tunecl.errors import Unsupported
from tunecl.kernels import launches
from tunecl.kernels.strided import (CTYPES, FLOATING, INT32_MAX, KernelCache, Operand, merge_dims, meta_dtype,
                                    pack_meta, pad_front, rank_bucket, work_group)
from tunecl.runtime import Device

PLAIN, ARG, VARIANCE = 0, 1, 2


class Reduction(NamedTuple):
    mode: int
    map: str = "v"
    combine: str = "a+v"
    final: str = "a"
    identity_float: str = "0"
    identity_int: str = "0"
    better: str = ""          # ARG mode: the comparison that makes v better than bv
    float_only: bool = False


_MAX = "((v>a||v!=v)?v:a)"
_MIN = "((v<a||v!=v)?v:a)"

REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction(PLAIN),
    "mean": Reduction(PLAIN, final="a/n", float_only=True),
    "prod": Reduction(PLAIN, combine="a*v", identity_float="1", identity_int="1"),
    "amax": Reduction(PLAIN, combine=_MAX, identity_float="-INFINITY", identity_int="LONG_MIN"),
    "amin": Reduction(PLAIN, combine=_MIN, identity_float="INFINITY", identity_int="LONG_MAX"),
    "norm1": Reduction(PLAIN, map="fabs(v)", float_only=True),
    "norm2": Reduction(PLAIN, map="v*v", final="sqrt(a)", float_only=True),
    "norm_inf": Reduction(PLAIN, map="fabs(v)", combine=_MAX, float_only=True),
    "norm_p": Reduction(PLAIN, map="pow(fabs(v),p0)", final="pow(a,1.0f/p0)", float_only=True),
    "any": Reduction(PLAIN, map="(v!=0)", combine="(a||v)"),
    "all": Reduction(PLAIN, map="(v!=0)", combine="(a&&v)", identity_float="1", identity_int="1"),
    "argmax": Reduction(ARG, identity_float="-INFINITY", identity_int="LONG_MIN", better=">"),
    "argmin": Reduction(ARG, identity_float="INFINITY", identity_int="LONG_MAX", better="<"),
    "var": Reduction(VARIANCE, float_only=True),
    "std": Reduction(VARIANCE, final="sqrt(a)", float_only=True),
}

_BETTER = ("(ISNAN(bv)?(ISNAN(v)&&(i)<(bi)):(ISNAN(v)||(v)CMP(bv)||((v)==(bv)&&(i)<(bi))))")


class _Plan(NamedTuple):
    """Per-signature launch data: the kernel, ``meta`` without the offsets, and the NDRange."""

    kernel: cl.Kernel
    prefix: list[int]
    extents: tuple[int, int, int]  # largest element offset past the input's, output's, out2's own
    global_size: tuple[int]
    local_size: tuple[int]
    wide: bool


class Reduce:
    """Launches ``REDUCTIONS`` ops on one device; compiles each signature once and caches the
    per-shape launch plan (a dict hit on the hot path, like the pointwise family)."""

    MAX_PLANS = 4096

    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "reduce.cl")
        self.group = work_group(device, 256)
        self._plans: dict[tuple, _Plan] = {}
        # the backend's pre-built reduction calls by signature (tunecl.backend.ops.reduction)
        self.calls: dict[tuple, Prepared | None] = {}

    def __call__(self, op: str, shape: Sequence[int], inp: Operand, reduce_dims: Collection[int],
                 out: Operand, out2: Operand | None = None, p0: float = 0.0, defer: bool = False) -> cl.Event | None:
        """Enqueue ``out = op(inp)`` over ``reduce_dims`` of ``inp`` (shape ``shape``).

        Args:
            shape: the input's shape.
            reduce_dims: the dims reduced (others are kept and index the output).
            out, out2: outputs with strides given *for the input's dims* (reduced dims ignored);
                ``out2`` takes arg indices (ARG) or the mean (var/std).
            p0: the op's parameter (variance correction, norm order).
            defer: by way of :meth:`Device.defer` (then no event is returned).

        Raises:
            Unsupported: a dtype or rank this family does not handle.
        """
        key = (op, tuple(shape), inp.strides, inp.dtype, tuple(sorted(reduce_dims)), out.strides, out.dtype,
               None if out2 is None else (out2.strides, out2.dtype))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(key, op, shape, inp, reduce_dims, out, out2, wide=False)
            if plan is None:
                return None
        offsets = [inp.offset, out.offset, out2.offset if out2 is not None else 0]
        if not plan.wide and any(o + e > INT32_MAX for o, e in zip(offsets, plan.extents)):
            plan = self._plan(None, op, shape, inp, reduce_dims, out, out2, wide=True)
        args = [out.buffer] + ([out2.buffer] if out2 is not None else []) + [
            inp.buffer, float(p0), pack_meta(plan.prefix + offsets, "long" if plan.wide else "int")]
        if defer:
            self.device.defer(plan.kernel, plan.global_size, plan.local_size, args)
            return None
        return plan.kernel(self.device.queue, plan.global_size, plan.local_size, *args)

    def prepare(self, op: str, shape: Sequence[int], inp: Operand, reduce_dims: Collection[int], out: Operand,
                p0: float = 0.0) -> Prepared | None:
        """:meth:`__call__`'s launch for every call with this signature (the op, shape, the operands' strides,
        offsets and dtypes, ``p0``; their buffers are ignored), pre-built: each call binds its own output
        and input buffers. None where it cannot be (no elements, a kernel that cannot be copied)."""
        key = (op, tuple(shape), inp.strides, inp.dtype, tuple(sorted(reduce_dims)), out.strides, out.dtype, None)
        plan = self._plans.get(key) or self._plan(key, op, shape, inp, reduce_dims, out, None, wide=False)
        if plan is None:
            return None
        offsets = [inp.offset, out.offset, 0]
        if not plan.wide and any(o + e > INT32_MAX for o, e in zip(offsets, plan.extents)):
            plan = self._plan(None, op, shape, inp, reduce_dims, out, None, wide=True)
        args = [None, None, float(p0), pack_meta(plan.prefix + offsets, "long" if plan.wide else "int")]
        bound = launches.Bound.build(plan.kernel, plan.global_size, plan.local_size, args, (0, 1))
        return None if bound is None else Prepared(self.device, bound)

    def _plan(self, key: tuple | None, op: str, shape: Sequence[int], inp: Operand, reduce_dims: Collection[int],
              out: Operand, out2: Operand | None, wide: bool) -> _Plan | None:
        red = REDUCTIONS[op]
        if inp.dtype not in CTYPES or out.dtype not in CTYPES or (out2 is not None and out2.dtype == "float16"):
            raise Unsupported(f"reduce {op} from {inp.dtype} to {out.dtype}")
        floating = inp.dtype in FLOATING
        if red.float_only and not floating:
            raise Unsupported(f"{op} of {inp.dtype}")
        kept = [d for d in range(len(shape)) if d not in reduce_dims]
        reduced = [d for d in range(len(shape)) if d in reduce_dims]
        count = math.prod(shape[d] for d in kept)
        n = math.prod(shape[d] for d in reduced)
        if count == 0:
            return None
        out2_strides = out2.strides if out2 is not None else out.strides
        kshape, (k_in, k_out, k_out2) = merge_dims([shape[d] for d in kept], [
            [inp.strides[d] for d in kept], [out.strides[d] for d in kept], [out2_strides[d] for d in kept]])
        rshape, (r_in,) = merge_dims([shape[d] for d in reduced], [[inp.strides[d] for d in reduced]])
        kdim, rdim = rank_bucket(len(kshape)), rank_bucket(len(rshape))

        def reach(sizes: Sequence[int], strides: Sequence[int]) -> int:
            return sum((s - 1) * st for s, st in zip(sizes, strides))
        extents = (reach(kshape, k_in) + reach(rshape, r_in), reach(kshape, k_out), reach(kshape, k_out2))
        wide = wide or count * max(n, 1) > INT32_MAX or any(e > INT32_MAX for e in extents)
        idx = "long" if wide else "int"
        # a work-group per output for long reductions, unless outputs are many and the reduced
        # elements are far apart (then a work-item per output reads neighbouring outputs together)
        group = self.group if n >= 64 and (count <= 4096 or r_in[-1] == 1) else 0
        tacc = "float" if floating else "long"
        kernel_key = (op, inp.dtype, out.dtype, out2.dtype if out2 is not None else None, kdim, rdim, group, idx)
        kernel = self.cache.get(kernel_key) or self._build(kernel_key, red, tacc, 2 + 4 * kdim + 2 * rdim + 3)
        prefix = [count, n] + pad_front(kshape, kdim, 1) + pad_front(rshape, rdim, 1) + \
            pad_front(k_in, kdim, 0) + pad_front(r_in, rdim, 0) + pad_front(k_out, kdim, 0) + \
            pad_front(k_out2, kdim, 0)
        if group:
            sizes = (count * group,), (group,)
        else:
            local = work_group(self.device, 64)
            sizes = (-(-count // local) * local,), (local,)
        plan = _Plan(kernel, prefix, extents, sizes[0], sizes[1], wide)
        if key is not None:
            if len(self._plans) >= self.MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _build(self, key: tuple, red: Reduction, tacc: str, meta_len: int) -> cl.Kernel:
        _, tin, tout, tout2, kdim, rdim, group, idx = key
        options = [f"-DMODE={red.mode}", f"-DGROUP={group}", f"-DKDIM={kdim}", f"-DRDIM={rdim}",
                   f"-DIDX={idx}", f"-DTIN={CTYPES[tin]}", f"-DTACC={tacc}", f"-DTOUT={CTYPES[tout]}",
                   f"-DIDENTITY={red.identity_float if tacc == 'float' else red.identity_int}",
                   f"-DMAP(v)={red.map}", f"-DCOMBINE(a,v)={red.combine}", f"-DFINAL(a,n)={red.final}"]
        options += ["-DIN_HALF"] * (tin == "float16") + ["-DOUT_HALF"] * (tout == "float16")
        if red.better:
            options.append(f"-DBETTER(v,i,bv,bi)={_BETTER.replace('CMP', red.better)}")
        dtypes: list = [None]
        if tout2 is not None:
            options += ["-DHAS_OUT2", f"-DTOUT2={CTYPES[tout2]}"]
            dtypes.append(None)
        dtypes += [None, np.float32, meta_dtype(meta_len, idx)]
        return self.cache.build(key, options, "reduce", dtypes)


class Prepared:
    """One reduction signature's launch, pre-built (:class:`tunecl.kernels.launches.Bound`): a call binds its
    output's and input's buffers and defers it as :meth:`Reduce.__call__` would, the same launch; while a
    graph capture or a KernelProfile holds pyopencl's launch function, the kernel's own launch."""

    __slots__ = ("bound", "device")

    def __init__(self, device: Device, bound: launches.Bound) -> None:
        self.device, self.bound = device, bound

    def enqueue(self, out: cl.Buffer, inp: cl.Buffer) -> None:
        bound = self.bound
        binding = (0, out, 1, inp)
        if profiling.swap_lock.locked():
            self.device.defer(bound.kernel, bound.global_size, bound.local_size, bound.arguments(binding))
        else:
            self.device.defer(bound, bound.global_size, bound.local_size, (binding,))
