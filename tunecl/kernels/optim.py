"""The optim family: multi-tensor Adam/AdamW and SGD steps, and torch's elementwise ``_foreach_*`` ops
(``optim.cl``).

Each launch updates up to ``slots`` tensors (``SLOTS`` = 8 unless ``TUNECL_OPTIM_SLOTS`` says otherwise,
see :func:`slots_for`), so a step over P parameters costs ceil(P / slots) launches instead of several per
parameter.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from tunecl import config
from tunecl.kernels.strided import KernelCache, Operand, Unsupported, meta_dtype, pack_meta, work_group
from tunecl.runtime import Device

SLOTS = 8            # tensors per launch where the device's parameter bytes are not known to allow more
SLOT_CHOICES = config.OPTIM_SLOTS   # what optim.cl's FOR_SLOTS expands: 1 .. 8, 16, 24, 32


def parameter_bytes(slots: int) -> int:
    """Bytes of kernel arguments of the largest launch at ``slots`` tensors: adam_step with a learning-rate,
    grad_scale and found_inf tensor (5 floats, the meta struct of 7 longs per slot, 6 pointers per slot,
    3 pointer + offset pairs); foreach_map (5 floats + 5 longs + 4 pointers per slot) and sgd_step are
    smaller."""
    return 5 * 4 + 7 * 8 * slots + 6 * 8 * slots + 3 * (8 + 8)


def slots_for(device: Device, setting: int | None) -> int:
    """Tensors per launch: ``setting`` (``TUNECL_OPTIM_SLOTS``), or for ``None`` (``auto``) the most of
    8, 16, 24 and 32 whose largest launch fits the device's ``CL_DEVICE_MAX_PARAMETER_SIZE`` (OpenCL
    guarantees 1024 bytes, which 8 slots fit; NVIDIA's 4352 fit 32)."""
    if setting is not None:
        if setting not in SLOT_CHOICES:
            raise ValueError(f"optimizer slots must be one of {', '.join(map(str, SLOT_CHOICES))}, not {setting}")
        return setting
    limit = getattr(device.cl_device, "max_parameter_size", 1024)
    return max(s for s in (8, 16, 24, 32) if s == 8 or parameter_bytes(s) <= limit)
MAX_ITEMS = 1 << 16  # work-items per slot; larger tensors are strided over
# On CPU devices: up to one element per work-item. PoCL vectorises across the work-items of a group, not
# along one work-item's loop: Adam's foreach ops on 15.7M parameters took 37 ns per parameter strided over
# 65536 work-items, 6.6 unstrided. (adam_step then computes its two pow() once per work-group,
# GROUP_CORRECTIONS, rather than per work-item.)
MAX_ITEMS_CPU = 1 << 24


# one-element tensors a step kernel may read on the device, in the order of its trailing arguments
TENSOR_ARGUMENTS = ("LR_TENSOR", "GRAD_SCALE", "FOUND_INF")


def _tensor_arguments(lr: float | Operand, grad_scale: Operand | None, found_inf: Operand | None
                      ) -> tuple[Operand | None, Operand | None, Operand | None]:
    """(lr if it is a tensor, grad_scale, found_inf), each a float32 operand or None."""
    tensors = (lr if isinstance(lr, Operand) else None, grad_scale, found_inf)
    if any(t is not None and t.dtype != "float32" for t in tensors):
        raise Unsupported("learning-rate, grad_scale and found_inf tensors must be float32")
    return tensors


class Optim:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "optim.cl")
        self.local = work_group(device, 256)
        self.cpu_layout = device.fingerprint.device_type == "cpu"
        self.items = MAX_ITEMS_CPU if self.cpu_layout else MAX_ITEMS   # work-items per slot, at most
        self.slots = slots_for(device, config.get().optim_slots)          # tensors per launch

    def _kernel(self, name: str, flags: tuple[str, ...], scalars: int, per_slot_buffers: int, meta_len: int
                ) -> cl.Kernel:
        slots = self.slots
        key = (name, flags, slots)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DSLOTS={slots}"] + [f"-D{f}" for f in flags]
            dtypes = [np.float32] * scalars + ([np.int32] if name == "sgd_step" else []) + \
                [meta_dtype(meta_len, "long")] + [None] * (per_slot_buffers * slots) + \
                [None, np.int64] * sum(f in flags for f in TENSOR_ARGUMENTS)
            kernel = self.cache.build(key, options, name, dtypes)
        return kernel

    def _launch(self, kernel: cl.Kernel, scalars: list, rows: Sequence[Sequence[Operand | None]],
                numels: Sequence[int], per_slot: int, tensors: Sequence[Operand | None] = ()) -> None:
        """Launch over ``rows`` (one tuple of operands per tensor) in chunks of ``slots``; ``tensors``: the
        one-element tensors of TENSOR_ARGUMENTS the kernel was built for, in that order (None: not built)."""
        tail = [value for t in tensors if t is not None for value in (t.buffer, t.offset)]
        slots = self.slots
        for start in range(0, len(rows), slots):
            chunk, sizes = rows[start:start + slots], numels[start:start + slots]
            meta: list[int] = []
            buffers: list = []
            for row, n in zip(chunk, sizes):
                meta += [n] + [o.offset if o is not None else 0 for o in row]
                buffers += [o.buffer if o is not None else None for o in row]
            pad = slots - len(chunk)
            meta += [0] * ((per_slot + 1) * pad)
            buffers += [None] * (per_slot * pad)
            items = min(max(sizes, default=1), self.items)
            global_size = (-(-items // self.local) * self.local, len(chunk))
            kernel(self.device.queue, global_size, (self.local, 1), *scalars, pack_meta(meta, "long"), *buffers,
                   *tail)

    @staticmethod
    def _check(rows: Sequence[Sequence[Operand | None]]) -> None:
        for row in rows:
            for o in row:
                if o is not None and o.dtype != "float32":
                    raise Unsupported("fused optimizer steps need float32 tensors")

    def adam(self, rows: Sequence[tuple[Operand, Operand, Operand, Operand, Operand | None, Operand]],
             numels: Sequence[int], *, lr: float | Operand, beta1: float, beta2: float, weight_decay: float,
             eps: float, amsgrad: bool, maximize: bool, adamw: bool, grad_scale: Operand | None = None,
             found_inf: Operand | None = None) -> None:
        """``rows``: (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq or None, step) per tensor; ``lr`` a
        number or a one-element float32 tensor read on the device; ``grad_scale`` and ``found_inf`` as in
        torch's fused step (mixed precision: grads are divided by the scale and written back; nothing
        changes when found_inf is 1)."""
        self._check(rows)
        tensors = _tensor_arguments(lr, grad_scale, found_inf)
        flags = tuple(f for f, on in (("AMSGRAD", amsgrad), ("MAXIMIZE", maximize), ("ADAMW", adamw),
                                      ("GROUP_CORRECTIONS", self.cpu_layout),
                                      *zip(TENSOR_ARGUMENTS, (t is not None for t in tensors))) if on)
        kernel = self._kernel("adam_step", flags, 5, 6, 7 * self.slots)
        self._launch(kernel, [0.0 if tensors[0] else lr, beta1, beta2, weight_decay, eps], rows, numels, 6, tensors)

    def sgd(self, rows: Sequence[tuple[Operand, Operand, Operand | None]], numels: Sequence[int], *,
            lr: float | Operand, weight_decay: float, momentum: float, dampening: float, nesterov: bool,
            maximize: bool, first_step: bool, grad_scale: Operand | None = None,
            found_inf: Operand | None = None) -> None:
        """``rows``: (param, grad, momentum buffer or None) per tensor; ``lr``, ``grad_scale`` and
        ``found_inf`` as for :meth:`adam`."""
        self._check(rows)
        tensors = _tensor_arguments(lr, grad_scale, found_inf)
        flags = tuple(f for f, on in (("MOMENTUM", momentum != 0), ("NESTEROV", nesterov), ("MAXIMIZE", maximize),
                                      *zip(TENSOR_ARGUMENTS, (t is not None for t in tensors))) if on)
        kernel = self._kernel("sgd_step", flags, 4, 3, 4 * self.slots)
        self._launch(kernel, [0.0 if tensors[0] else lr, weight_decay, momentum, dampening, int(first_step)], rows,
                     numels, 3, tensors)

    def map(self, expr: str, outs: Sequence[tuple[cl.Buffer, int]],
            inputs: Sequence[Sequence[tuple[cl.Buffer, int]] | Sequence[float]],
            params: Sequence[Sequence[float]], numels: Sequence[int], single: Sequence[bool] = ()) -> None:
        """``outs[k] = expr(inputs..., params...)`` for every tensor k, a launch per ``slots`` tensors.

        ``expr`` names a float expression of the pointwise family (:data:`tunecl.kernels.pointwise.EXPRESSIONS`,
        inputs a, b, c, parameters s0, s1). Tensors are (buffer, element offset) pairs of contiguous float32
        data, ``numels[k]`` elements for index k; an input may alias its output exactly. Each entry of
        ``inputs`` is a list with one pair per tensor or one number per tensor; each entry of ``params``
        one number per tensor. ``single[j]`` true: input j's tensors hold one element each, read for every
        element of the output (a 0-dim tensor broadcast).
        """
        from tunecl.kernels.pointwise import EXPRESSIONS

        spec = EXPRESSIONS[expr]
        if len(inputs) != spec.nin or len(params) != spec.nparams or spec.nin > 3 or spec.nparams > 2:
            raise ValueError(f"{expr} takes {spec.nin} inputs and {spec.nparams} parameters")
        count = len(outs)
        columns = list(inputs) + [None] * (3 - len(inputs))
        tensor = [bool(column) and isinstance(column[0], tuple) for column in columns]
        flags = tuple(f"-D{letter}_SCALAR" for letter, is_tensor in zip("ABC", tensor) if not is_tensor) \
            + tuple(f"-D{letter}_ONE" for letter, one, is_tensor in zip("ABC", single, tensor) if one and is_tensor)
        slots = self.slots
        key = ("foreach_map", expr, flags, slots)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DSLOTS={slots}", f"-DMAP_EXPR={spec.code}", *flags]
            dtypes = [meta_dtype(5 * slots, "int"), meta_dtype(5 * slots, "long")] + [None] * (4 * slots)
            kernel = self.cache.build(key, options, "foreach_map", dtypes)
        zeros = [0.0] * count
        # per tensor: the (buffer, offset) of o, a, b, c (an unused pointer points at the output) and the
        # numbers a, b, c (0 where a tensor), s0, s1
        pointers = [outs] + [column if is_tensor else outs for column, is_tensor in zip(columns, tensor)]
        numbers = [zeros if is_tensor or column is None else column for column, is_tensor in zip(columns, tensor)] \
            + list(params) + [zeros] * (2 - len(params))
        # per slot, in the kernel's order: meta (numel, then o, a, b, c offsets), buffers (o, a, b, c),
        # values (a, b, c, s0, s1); built by zipping whole columns rather than element by element
        offsets = [[offset for _, offset in column] for column in pointers]
        handles = [[buffer for buffer, _ in column] for column in pointers]
        meta_all = [v for row in zip(numels, *offsets) for v in row]
        buffers_all = [b for row in zip(*handles) for b in row]
        values_all = [v for row in zip(*numbers) for v in row]
        queue, local = self.device.queue, self.local
        for start in range(0, count, slots):
            stop = min(start + slots, count)
            meta = meta_all[5 * start:5 * stop]
            buffers = buffers_all[4 * start:4 * stop]
            values = values_all[5 * start:5 * stop]
            pad = slots - (stop - start)
            if pad:
                meta += [0] * (5 * pad)
                values += [0.0] * (5 * pad)
                buffers += [None] * (4 * pad)
            items = min(max(numels[start:stop]), self.items) or 1
            kernel(queue, (-(-items // local) * local, stop - start), (local, 1), array("f", values).tobytes(),
                   pack_meta(meta, "long"), *buffers)
