"""The optim family: multi-tensor Adam/AdamW and SGD steps, and torch's elementwise ``_foreach_*`` ops
(``optim.cl``).

Each launch updates up to ``slots`` tensors (as many as the device's kernel-argument bytes allow unless
``TUNECL_OPTIM_SLOTS`` says otherwise, see :func:`slots_for`), so a step over P parameters costs
ceil(P / slots) launches instead of several per parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl import config, profiling
from tunecl.errors import Unsupported
from tunecl.kernels.ops.fused import Chain
from tunecl.kernels.ops.multi_tensor import Chunks
from tunecl.kernels.strided import Operand, StridedFamily, meta_dtype
from tunecl.runtime import Device, addresses

SLOTS = 8            # tensors per launch where the device's parameter bytes are not known to allow more
SLOT_CHOICES = config.OPTIM_SLOTS   # what optim.cl's FOR_SLOTS expands: 1 .. 8, 16, 24, 32
CHAIN_COLUMNS = 8    # foreach_chain's columns, at most (optim.cl's COLS)
CHAIN_STEPS = 32     # and steps
CHAIN_CONSTANTS = 32  # and numbers passed by value (K(q))
CHAIN_CALLS = 64     # foreach_chain signatures whose launches Optim keeps


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


class Optim(StridedFamily):
    source_file = "optim.cl"

    def __init__(self, device: Device):
        super().__init__(device)
        self.cpu_layout = device.fingerprint.device_type == "cpu"
        self.items = MAX_ITEMS_CPU if self.cpu_layout else MAX_ITEMS   # work-items per slot, at most
        self.slots = slots_for(device, config.get().optim_slots)          # tensors per launch
        # the backend's pre-built calls (tunecl.backend.ops.optim_calls: its signature key -> its call)
        self.calls: dict[tuple, Any] = {}
        # tensor lists those calls found valid: their data_ptrs -> (element offsets, storage addresses)
        self.lists: dict[tuple, Any] = {}
        self._chains: dict[tuple, Chunks] = {}   # chain_chunks' signature -> its launches
        self._chain_options: dict[tuple, list[str]] = {}   # a foreach_chain kernel's key -> its build options
        self._by_address: bool | None = None   # see by_address()

    def _kernel(self, name: str, flags: tuple[str, ...], scalars: int, per_slot_buffers: int, meta_len: int
                ) -> tuple[cl.Kernel, Callable[[], tuple | None]]:
        """The step kernel ``name`` with ``flags``, and its by-address variant (see :meth:`_build`)."""
        head = [np.float32] * scalars + ([np.int32] if name == "sgd_step" else []) + [meta_dtype(meta_len, "long")]
        tail = [None, np.int64] * sum(f in flags for f in TENSOR_ARGUMENTS)
        return self._build((name, flags, self.slots), [f"-DSLOTS={self.slots}"] + [f"-D{f}" for f in flags], name,
                           head, per_slot_buffers * self.slots, tail)

    def _build(self, key: tuple, options: list[str], name: str, head: list, pointers: int, tail: list = ()
               ) -> tuple[cl.Kernel, Callable[[], tuple | None]]:
        """Kernel ``name`` built with ``options`` (arguments: ``head`` dtypes, ``pointers`` pointer arguments,
        ``tail`` dtypes), and Chunks' ``by_address``: a function giving, where :meth:`by_address`, its
        ``ADDRESSES`` variant (no pointer arguments; built when first asked for) and the function giving
        buffers' addresses."""
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, options, name, [*head, *[None] * pointers, *tail])

        def by_address() -> tuple | None:
            if not self.by_address():
                return None
            variant = self.cache.get(key + ("ADDRESSES",))
            if variant is None:
                variant = self.cache.build(key + ("ADDRESSES",), [*options, "-DADDRESSES"], name, [*head, *tail])
            return variant, self._addresses_of

        return kernel, by_address

    def by_address(self) -> bool:
        """Whether the pre-built launches reach tensors by address (:mod:`tunecl.runtime.addresses`; probed
        when first asked, by the first pre-built launch: never inside a graph capture or a profile)."""
        if self._by_address is None:
            self._by_address = addresses.usable(self.device)
        return self._by_address

    def _addresses_of(self, buffers: Sequence[cl.Buffer | None]) -> list[int]:
        return addresses.addresses(self.device, buffers)

    def queue(self) -> cl.CommandQueue:
        """The device's queue, taken once per launch (see :attr:`tunecl.runtime.Device.queue`)."""
        return self.device.queue

    def _run(self, chunks: Chunks, rows: Sequence[Sequence[Operand | None]],
             tensors: Sequence[Operand | None] = ()) -> None:
        """Launch ``chunks`` over ``rows`` (one tuple of operands per tensor, None for an absent one) and the
        one-element ``tensors`` of TENSOR_ARGUMENTS the kernel was built for (None: not built)."""
        buffers = []
        for column, operands in enumerate(zip(*rows)):
            chunks.set_offsets(column, [0 if o is None else o.offset for o in operands])
            buffers.append([None if o is None else o.buffer for o in operands])
        tail = [t for t in tensors if t is not None]
        for index, t in enumerate(tail):
            chunks.set_tail_offset(index, t.offset)
        chunks.launch(self.queue, buffers, [t.buffer for t in tail])

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
        chunks = self.adam_chunks(numels, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                                  amsgrad=amsgrad, maximize=maximize, adamw=adamw,
                                  tensors=tuple(t is not None for t in tensors))
        self._run(chunks, rows, tensors)

    def adam_chunks(self, numels: Sequence[int], *, lr: float | Operand, beta1: float, beta2: float,
                    weight_decay: float, eps: float, amsgrad: bool, maximize: bool, adamw: bool,
                    tensors: tuple[bool, bool, bool]) -> Chunks:
        """:meth:`adam`'s launches over tensors of ``numels``, by column (param, grad, exp_avg, exp_avg_sq,
        max_exp_avg_sq, step); ``tensors``: which of TENSOR_ARGUMENTS are tensors (the tail, in that order;
        ``lr`` is then not read)."""
        flags = tuple(f for f, on in (("AMSGRAD", amsgrad), ("MAXIMIZE", maximize), ("ADAMW", adamw),
                                      ("GROUP_CORRECTIONS", self.cpu_layout),
                                      *zip(TENSOR_ARGUMENTS, tensors)) if on)
        kernel, by_address = self._kernel("adam_step", flags, 5, 6, 7 * self.slots)
        return Chunks(kernel, self.slots, self.local, self.items, numels, 6,
                      head=[0.0 if tensors[0] else lr, beta1, beta2, weight_decay, eps], head_types="fffff",
                      tail=sum(tensors), by_address=by_address)

    def sgd(self, rows: Sequence[tuple[Operand, Operand, Operand | None]], numels: Sequence[int], *,
            lr: float | Operand, weight_decay: float, momentum: float, dampening: float, nesterov: bool,
            maximize: bool, first_step: bool, grad_scale: Operand | None = None,
            found_inf: Operand | None = None) -> None:
        """``rows``: (param, grad, momentum buffer or None) per tensor; ``lr``, ``grad_scale`` and
        ``found_inf`` as for :meth:`adam`."""
        self._check(rows)
        tensors = _tensor_arguments(lr, grad_scale, found_inf)
        chunks = self.sgd_chunks(numels, lr=lr, weight_decay=weight_decay, momentum=momentum, dampening=dampening,
                                 nesterov=nesterov, maximize=maximize, first_step=first_step,
                                 tensors=tuple(t is not None for t in tensors))
        self._run(chunks, rows, tensors)

    def sgd_chunks(self, numels: Sequence[int], *, lr: float | Operand, weight_decay: float, momentum: float,
                   dampening: float, nesterov: bool, maximize: bool, first_step: bool,
                   tensors: tuple[bool, bool, bool]) -> Chunks:
        """:meth:`sgd`'s launches over tensors of ``numels``, by column (param, grad, momentum buffer);
        ``tensors`` as for :meth:`adam_chunks`."""
        flags = tuple(f for f, on in (("MOMENTUM", momentum != 0), ("NESTEROV", nesterov), ("MAXIMIZE", maximize),
                                      *zip(TENSOR_ARGUMENTS, tensors)) if on)
        kernel, by_address = self._kernel("sgd_step", flags, 4, 3, 4 * self.slots)
        return Chunks(kernel, self.slots, self.local, self.items, numels, 3,
                      head=[0.0 if tensors[0] else lr, weight_decay, momentum, dampening, int(first_step)],
                      head_types="ffffi", tail=sum(tensors), by_address=by_address)

    def map(self, expr: str, outs: Sequence[tuple[cl.Buffer, int]],
            inputs: Sequence[Sequence[tuple[cl.Buffer, int]] | Sequence[float]],
            params: Sequence[Sequence[float]], numels: Sequence[int], single: Sequence[bool] = ()) -> None:
        """``outs[k] = expr(inputs..., params...)`` for every tensor k, a launch per ``slots`` tensors.

        ``expr`` names a float expression of the pointwise family (:data:`tunecl.kernels.ops.pointwise.EXPRESSIONS`,
        inputs a, b, c, parameters s0, s1). Tensors are (buffer, element offset) pairs of contiguous float32
        data, ``numels[k]`` elements for index k; an input may alias its output exactly. Each entry of
        ``inputs`` is a list with one pair per tensor or one number per tensor; each entry of ``params``
        one number per tensor. ``single[j]`` true: input j's tensors hold one element each, read for every
        element of the output (a 0-dim tensor broadcast).
        """
        tensor = [bool(column) and isinstance(column[0], tuple) for column in inputs]
        chunks = self.map_chunks(expr, tensor, len(params), numels, single)
        # the pointers o, a, b, c (an unused one points at the output); the numbers a, b, c (0 where a
        # tensor), s0, s1
        pointers = [outs] + [column if is_tensor else outs for column, is_tensor in zip(inputs, tensor)]
        pointers += [outs] * (4 - len(pointers))
        buffers = []
        for column, pairs in enumerate(pointers):
            chunks.set_offsets(column, [offset for _, offset in pairs])
            buffers.append([buffer for buffer, _ in pairs])
        for index, (column, is_tensor) in enumerate(zip(inputs, tensor)):
            if not is_tensor:
                chunks.set_values(index, column)
        for index, column in enumerate(params):
            chunks.set_values(3 + index, column)
        chunks.launch(self.queue, buffers)

    def add_counts(self, tensors: Sequence[tuple[cl.Buffer, int]], numels: Sequence[int], value: int) -> None:
        """``q += value`` for every int64 tensor q (a (buffer, element offset) pair of contiguous data of
        ``numels[k]`` elements), a launch per ``slots`` tensors."""
        slots = self.slots
        key = ("foreach_add_long", slots)
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, [f"-DSLOTS={slots}"], "foreach_add_long",
                                      [np.int64, meta_dtype(2 * slots, "long")] + [None] * slots)
        chunks = Chunks(kernel, slots, self.local, self.items, numels, 1, head=(int(value),), head_types="q",
                        empty_items=1)
        chunks.set_offsets(0, [offset for _, offset in tensors])
        chunks.launch(self.queue, [[buffer for buffer, _ in tensors]])

    def chain(self, chain: Chain, ones: Sequence[bool], writes: Sequence[tuple[int, int]],
              columns: Sequence[Sequence[tuple[cl.Buffer, int]]], numels: Sequence[int],
              constants: Sequence[float] = ()) -> None:
        """For every tensor index k, ``chain`` over the k-th tensors of ``columns`` (its inputs ``v0``.. are
        the columns, each a list of (buffer, element offset) pairs of contiguous float32 data), a launch per
        ``slots`` tensors: each ``(column, step)`` of ``writes`` stores that step's value into the column.
        ``ones[j]``: column j's tensors hold one element each, read for every element; the others hold
        ``numels[k]`` elements at index k. A written column is read before it is written, element by
        element, so it may be one the chain reads; no tensor may be in two columns if one is written.
        ``constants``: the numbers ``K(0)``, ``K(1)``, .. the steps read (passed by value, so a chain that
        differs only in them is the same kernel)."""
        ncol = len(columns)
        if ncol != chain.inputs or len(ones) != ncol or any(len(c) != len(numels) for c in columns):
            raise ValueError("a foreach chain takes one column per chain input, each a tensor per numel")
        if not writes or any(ones[j] for j, _ in writes):
            raise ValueError("a foreach chain writes full columns only")
        chunks = self.chain_chunks(chain, tuple(ones), tuple(writes), numels, len(constants))
        self.launch_chain(chunks, [[buffer for buffer, _ in column] for column in columns],
                          [[offset for _, offset in column] for column in columns], constants)

    def launch_chain(self, chunks: Chunks, buffers: Sequence[Sequence[cl.Buffer | None]],
                     offsets: Sequence[Sequence[int]], constants: Sequence[float] = ()) -> None:
        """Launch :meth:`chain_chunks`' ``chunks`` over each column's ``buffers`` and element ``offsets``, with
        the numbers ``constants``: from kernel copies with their arguments set from the signature's second
        launch on (every column bound anew), through the kernel's invoker while a graph capture or a profile
        watches pyopencl's launches. The same launches either way."""
        for j, column in enumerate(offsets):
            chunks.set_offsets(j, column)
        if constants:
            chunks.set_head([np.asarray(constants, np.float32).tobytes()])
        if profiling.swap_lock.locked():
            chunks.launch(self.queue, buffers)
        elif chunks.presets is not None:
            for j, column in enumerate(buffers):
                chunks.bind((j,), column)
            chunks.enqueue(self.queue)
        elif chunks.launched and chunks.prebuild(buffers):
            chunks.enqueue(self.queue)
        else:
            chunks.launch(self.queue, buffers)

    def chain_chunks(self, chain: Chain, ones: tuple[bool, ...], writes: tuple[tuple[int, int], ...],
                     numels: Sequence[int], constants: int = 0) -> Chunks:
        """:meth:`chain`'s launches over tensors of ``numels``, by column; kept per signature (the most
        recent :data:`CHAIN_CALLS`), so a run a step repeats builds its grid once."""
        key = (chain, ones, writes, tuple(numels), constants)
        chunks = self._chains.get(key)
        if chunks is not None:
            return chunks
        ncol = len(ones)
        chain.check(max_inputs=CHAIN_COLUMNS, max_steps=CHAIN_STEPS, constants=constants)
        if constants > CHAIN_CONSTANTS:
            raise Unsupported(f"a foreach chain of {constants} numbers (at most {CHAIN_CONSTANTS})")
        slots = self._chain_slots(ncol, constants)
        kernel_key = ("foreach_chain", chain, ones, writes, slots, constants)
        options = self._chain_options.get(kernel_key)
        if options is None:
            # what reads only one-element columns and constants is the same for every element of a slot:
            # one work-item of each work-group loads and computes it and shares it through local memory
            # (Adam's bias corrections: two pow() per work-group, not per element; on a CPU device each
            # work-item has about one element)
            uniform = [f"v{j}" for j, one in enumerate(ones) if one]
            for k, step in enumerate(chain.steps):
                if all(not isinstance(a, str) or a in uniform or a.startswith("K(") for a in step.args):
                    uniform.append(f"t{k}")
            before = "".join(f"LD1({j})" for j, one in enumerate(ones) if one) \
                + "".join(f"SV({k})" for k in range(len(chain.steps)) if f"t{k}" in uniform)
            share = "".join(f"SHARE({k},{name})" for k, name in enumerate(uniform))
            unshare = "".join(f"UNSHARE({k},{name})" for k, name in enumerate(uniform))
            loads = "".join(f"LD({j},i)" for j, one in enumerate(ones) if not one)
            steps = "".join(f"SV({k})" for k in range(len(chain.steps)) if f"t{k}" not in uniform)
            stores = "".join(f"ST({j},t{step})" for j, step in writes)
            options = [f"-DSLOTS={slots}", f"-DNCOL={ncol}", *chain.options(), f"-DNUNIFORM={max(len(uniform), 1)}",
                       f"-DBEFORE={before}", f"-DSHARES={share}", f"-DUNSHARES={unshare}",
                       f"-DLOADS={loads}", f"-DSTEPS={steps}", f"-DSTORES={stores}"]
            if constants:
                options.append(f"-DNCONST={constants}")
            self._chain_options[kernel_key] = options
        head = [meta_dtype((ncol + 1) * slots, "long")]
        if constants:
            head.insert(0, np.dtype(f"V{4 * constants}"))
        kernel, by_address = self._build(kernel_key, options, "foreach_chain", head, ncol * slots)
        chunks = Chunks(kernel, slots, self.local, self.items, numels, ncol, empty_items=1,
                        head=[bytes(4 * constants)] if constants else (), head_types="b" if constants else "",
                        by_address=by_address)
        if len(self._chains) >= CHAIN_CALLS:
            del self._chains[next(iter(self._chains))]
        self._chains[key] = chunks
        return chunks

    def _chain_slots(self, columns: int, constants: int = 0) -> int:
        """Tensors per foreach_chain launch: the most of 1 .. 8, 16, 24, 32 up to :attr:`slots` whose pointers
        and meta (and ``constants`` floats) fit the device's parameter bytes."""
        limit = getattr(self.device.cl_device, "max_parameter_size", 1024) - 4 * constants
        fits = [s for s in (*range(1, 9), 16, 24, 32) if s <= self.slots and 8 * (2 * columns + 1) * s <= limit]
        return max(fits, default=1)

    def map_chunks(self, expr: str, tensor: Sequence[bool], params: int, numels: Sequence[int],
                   single: Sequence[bool] = ()) -> Chunks:
        """:meth:`map`'s launches over tensors of ``numels``, by column (o, a, b, c), with values (the numbers
        a, b, c, s0, s1 per tensor, 0 until set); ``tensor``: which inputs are tensors (the others numbers),
        ``params``: how many parameters ``expr`` takes, ``single``: as for :meth:`map`."""
        from tunecl.kernels.ops.pointwise import EXPRESSIONS

        spec = EXPRESSIONS[expr]
        if len(tensor) != spec.nin or params != spec.nparams or spec.nin > 3 or spec.nparams > 2 or spec.special:
            raise ValueError(f"{expr} takes {spec.nin} inputs and {spec.nparams} parameters")
        flags = tuple(f"-D{letter}_SCALAR" for letter, is_tensor in zip("ABC", [*tensor, False, False, False])
                      if not is_tensor) \
            + tuple(f"-D{letter}_ONE" for letter, one, is_tensor in zip("ABC", single, tensor) if one and is_tensor)
        slots = self.slots
        kernel, by_address = self._build(("foreach_map", expr, flags, slots),
                                         [f"-DSLOTS={slots}", f"-DMAP_EXPR={spec.code}", *flags], "foreach_map",
                                         [meta_dtype(5 * slots, "int"), meta_dtype(5 * slots, "long")], 4 * slots)
        return Chunks(kernel, slots, self.local, self.items, numels, 4, values=5, empty_items=1,
                      by_address=by_address)
