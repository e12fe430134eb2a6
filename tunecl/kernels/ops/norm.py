"""The norm family: batch normalisation forward (train/eval) and backward (``norm.cl``).

The per-channel sums (forward statistics, backward reduction) split each channel's M = N * L elements
over P work-groups (a partial kernel on a (GROUP * P, C) grid writing per-part results to scratch, then a
finalize kernel merging the parts in a fixed order); P is picked from the device's compute units so a
few channels still fill a big GPU. Each reduction reads its data once (the statistics keep a running
count/mean/M2 per work-item, merged by Chan et al.'s formula), UNROLL loads per work-item in flight. The
elementwise kernels run on a 2-D grid of (position in a row, row n * C + c). With P = 1 (small channels,
or more channels than the device needs work-groups) a direction is one launch: the partial kernel's
work-group finishes its channel and then computes that channel's elementwise results itself
(``bn_stats_apply``, ``bn_backward_reduce_apply``); with P > 1 the elementwise kernel merges the parts
itself (FINISH) instead of a finalize launch: two launches a direction. Bit for bit what the separate
launches give (ONE_LAUNCH).
When L is a multiple of 4 and the big tensors' offsets are 4-aligned, every kernel loads and stores float4
(VW = 4).

The launch geometry is set by the module constants below (GROUP_SIZE, UNROLL, GROUPS_PER_UNIT, MIN_PART,
ELEMENTWISE_GROUPS_PER_UNIT), the knobs to tune on a new device.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl import profiling
from tunecl.kernels import launches
from tunecl.kernels.strided import INT32_MAX, KernelCache, meta_dtype, pack_meta, relu_tag, work_group
from tunecl.kernels.sizes import round_up
from tunecl.runtime import Device

# the tensors every batch-norm kernel takes, in argument order (then the scratch buffer, eps, momentum,
# meta), each given as (buffer, element offset): contiguous float32 data
_OFFSETS = ("x", "y", "weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd", "dy",
            "grad_weight", "grad_bias", "act", "masked_dy", "step_count")
Tensor = tuple  # (cl.Buffer | None, element offset)
_ACT, _MASKED_DY = _OFFSETS.index("act"), _OFFSETS.index("masked_dy")   # a residual's and a sum's argument slots
META_LENGTH = 18  # N, C, L, the 14 offsets, P

# -- launch geometry (tune here) --
GROUP_SIZE = 256         # work-items per work-group of the partial kernels (rounded down to a power of two)
UNROLL = 4               # vector loads per work-item per main-loop step of the partial kernels
GROUPS_PER_UNIT = 8      # partial work-groups (all channels together) per compute unit: one wave of 256-item
                         # groups on a 2048-thread SM; 4-8 keeps a GPU busy
MIN_PART = 4096          # elements per partial work-group at least (P = 1 below 2 * MIN_PART per channel)
MIN_ITEM_VECTORS = 2 * UNROLL  # a part's vectors per work-item at least: a smaller part gets a smaller work-group
MIN_GROUP = 32           # (down to this many work-items, one warp)
ELEMENTWISE_GROUPS_PER_UNIT = 8      # the elementwise kernels' work-groups per compute unit at least ...
ELEMENTWISE_MAX_GROUPS_PER_UNIT = 0   # ... and at most, 0: no cap (past it, work-items loop over several rows;
                                      # on PoCL 256 helps short rows, 7x7, but slows long ones, 112x112)
ONE_LAUNCH = True        # a direction's finalize (P > 1) or its whole reduction (P = 1) inside its elementwise launch
VECTOR = 4               # float4 loads when L and the big tensors' offsets allow (1 turns them off)
MAX_LAUNCHES = 4096      # launch plans kept (see BatchNorm._launch)
MAX_RESIDUALS = 8        # residual variants kept per pre-built forward (by the residual's and the sum's offsets)
MAX_GRID_GROUPS = 65535  # work-groups along dims 1 and 2 of a grid (CUDA's limit); the kernels loop past it
# the in-place ops the normalising launch can apply as it writes (Device.replace_held), by their build flag
FOLDS = {"relu": "RELU", "relu6": "RELU6"}
SUM_FOLDS = {"relu": "SUM_RELU", "relu6": "SUM_RELU6"}   # ... and to the sum a residual add wrote (SUM_OUT)
# the activations whose backward the backward kernels apply to dy as they read it, by their build flag
MASKS = {"relu": "MASK_RELU", "relu6": "MASK_RELU6"}


def _power_of_two_below(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


class BatchNorm:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "norm.cl")
        self.group = _power_of_two_below(work_group(device, GROUP_SIZE))  # the partial kernels' tree sums need 2^k
        self.finalize_group = work_group(device, 64)
        self.compute_units = max(1, int(device.cl_device.max_compute_units))
        sizes = list(device.cl_device.max_work_item_sizes)
        self.max_items = (int(sizes[0]), int(sizes[1]) if len(sizes) > 1 else 1)
        self.force_parts: int | None = None  # tests: split every channel into this many parts
        # partial sums and the backward's per-channel sums, reused by every call (the queue is in order;
        # the lock keeps one call's launches together when several threads use the backend)
        self._scratch: cl.Buffer | None = None
        self._scratch_bytes = 0
        self._lock = threading.Lock()
        # (name, kind, shape, flags, parts, offsets) -> (kernel, global size, local size, packed meta): what
        # _launch derives from them, kept so that a net's repeated layers skip deriving it again
        self._launches: dict[tuple, tuple[cl.Kernel, tuple[int, ...], tuple[int, ...], bytes]] = {}
        # the backend's pre-built calls (tunecl.backend.ops.nn: its own signature key -> its call, or None
        # for the general route); here because they hold this instance's kernels (see Pointwise.launches)
        self.calls: dict[tuple, Any] = {}

    def parts(self, channels: int, count: int) -> int:
        """P, the work-groups per channel of the partial kernels, for ``channels`` channels of ``count``
        elements: about GROUPS_PER_UNIT work-groups per compute unit, each of MIN_PART elements at least."""
        if self.force_parts is not None:
            return max(1, int(self.force_parts))
        want = -(-GROUPS_PER_UNIT * self.compute_units // max(channels, 1))
        return max(1, min(want, count // MIN_PART))

    @staticmethod
    def vector_width(length: int, ops: Mapping[str, Tensor | None]) -> int:
        """VW, the floats per load of x, y, dy, act and masked_dy: VECTOR when every row of L floats starts
        on a VECTOR boundary (L a multiple of it, the tensors' offsets too; buffers themselves are aligned),
        else 1. The finalize kernels must get the same VW as their partial kernel (it sets the parts' bounds)."""
        if VECTOR > 1 and length % VECTOR == 0 and all(
                t is None or t[1] % VECTOR == 0
                for t in (ops.get("x"), ops.get("y"), ops.get("dy"), ops.get("act"), ops.get("masked_dy"))):
            return VECTOR
        return 1

    def _scratch_for(self, channels: int, parts: int) -> cl.Buffer:
        nbytes = 4 * (2 * channels + 2 * channels * parts)
        if self._scratch is None or self._scratch_bytes < nbytes:
            self._scratch_bytes = max(round_up(nbytes, 1 << 16), 2 * self._scratch_bytes)
            self._scratch = self.device.alloc(self._scratch_bytes)
        return self._scratch

    def partial_group(self, vectors: int) -> int:
        """The partial kernels' work-group size for a part of ``vectors`` loads: self.group, or for a small
        part the power of two that gives each work-item MIN_ITEM_VECTORS of them (MIN_GROUP at least)."""
        want = _power_of_two_below(max(1, vectors // MIN_ITEM_VECTORS))
        return max(min(MIN_GROUP, self.group), min(self.group, want))

    def _kernel(self, name: str, flags: tuple[str, ...], idx: str, group: int) -> cl.Kernel:
        key = (name, flags, idx, group)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DGROUP={group}", f"-DUNROLL={UNROLL}", f"-DIDX={idx}"] + [f"-D{flag}" for flag in flags]
            kernel = self.cache.build(key, options, name,
                                      [None] * 15 + [np.float32, np.float32, meta_dtype(META_LENGTH, idx)])
        return kernel

    def _elementwise_grid(self, n: int, c: int, length: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(global, local) of bn_apply / bn_backward_apply: dim 0 over a row's ``length`` vectors, dim 1 over the
        N * C rows. A short row gets exactly L lanes, and a work-group spans several (contiguous) rows."""
        rows, group = n * c, self.group
        if length <= group:
            local0 = min(length, self.max_items[0])
            groups0 = 1
        else:
            steps = -(-length // group)
            local0 = min(group, round_up(-(-length // steps), 32), self.max_items[0])
            groups0 = 0  # below
        local1 = max(1, min(group // local0, rows, self.max_items[1]))
        groups1 = min(-(-rows // local1), MAX_GRID_GROUPS)
        if ELEMENTWISE_MAX_GROUPS_PER_UNIT:
            groups1 = min(groups1, ELEMENTWISE_MAX_GROUPS_PER_UNIT * self.compute_units)
        if not groups0:
            want = -(-ELEMENTWISE_GROUPS_PER_UNIT * self.compute_units // groups1)
            groups0 = max(1, min(want, -(-length // local0)))
        return (local0 * groups0, local1 * groups1), (local0, local1)

    def _launch(self, name: str, kind: str, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None],
                flags: tuple[str, ...], eps: float, momentum: float, parts: int, scratch: cl.Buffer | None,
                held: bool = False) -> None:
        """Enqueue ``name``: ``kind`` "partial" (grid (GROUP * parts, C)), "finalize" (one item per channel)
        or "elementwise". ``held``: through :meth:`Device.hold`, tagged by y's buffer, offset and size."""
        located = [ops.get(k) for k in _OFFSETS]
        offsets = tuple(0 if t is None else t[1] for t in located)
        kernel, global_size, local_size, meta = self._kept_launch(name, kind, shape, ops, flags, parts, offsets)
        args = [None if t is None else t[0] for t in located] + [scratch, np.float32(eps), np.float32(momentum), meta]
        y_buffer, y_offset = ops["y"] if held else (None, 0)
        if y_buffer is not None:
            n, c, length = shape
            # the twins: the same launch's kernel built with RELU or RELU6 (same grid and meta)
            self.device.hold(kernel, global_size, local_size, args, relu_tag(y_buffer, y_offset, n * c * length),
                             lambda op: self._kept_launch(name, kind, shape, ops, (*flags, FOLDS[op]), parts,
                                                          offsets)[0] if op in FOLDS else None)
        else:
            self.device.defer(kernel, global_size, local_size, args)

    def _kept_launch(self, name: str, kind: str, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None],
                     flags: tuple[str, ...], parts: int, offsets: tuple[int, ...]
                     ) -> tuple[cl.Kernel, tuple[int, ...], tuple[int, ...], bytes]:
        """:meth:`_plan_launch`, planned once per signature."""
        key = (name, kind, shape, flags, parts, offsets)
        launch = self._launches.get(key)
        if launch is None:
            launch = self._plan_launch(name, kind, shape, ops, flags, parts, offsets)
            if len(self._launches) >= MAX_LAUNCHES:  # a safety valve for ever-changing shapes
                self._launches.clear()
            self._launches[key] = launch
        return launch

    def _plan_launch(self, name: str, kind: str, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None],
                     flags: tuple[str, ...], parts: int, offsets: tuple[int, ...]
                     ) -> tuple[cl.Kernel, tuple[int, ...], tuple[int, ...], bytes]:
        """The kernel, grid and packed meta of one :meth:`_launch` (everything but the buffers and scalars)."""
        n, c, length = shape
        vw = self.vector_width(length, ops)
        flags = flags + (f"VW={vw}",)
        group = self.partial_group(-(-n * (length // vw) // parts)) if kind == "partial" else self.group
        # (the partial kernels' walk steps up to GROUP * C + L elements past a channel's last element)
        reach = n * c * length + 2 * group * c + length
        idx = "long" if max(offsets) + reach > INT32_MAX else "int"
        kernel = self._kernel(name, flags, idx, group)
        meta = pack_meta([n, c, length, *offsets, parts], idx)
        if kind == "partial":
            global_size, local_size = (group * parts, min(c, MAX_GRID_GROUPS)), (group, 1)
        elif kind == "finalize":
            global_size, local_size = (round_up(c, self.finalize_group),), (self.finalize_group,)
        else:
            global_size, local_size = self._elementwise_grid(n, c, length // vw)
        return kernel, global_size, local_size, meta

    def _reduce_steps(self, partial: str, finalize: str, shape: tuple[int, int, int], flags: tuple[str, ...],
                      scratch_channels: int) -> tuple[list[tuple], cl.Buffer]:
        n, c, length = shape
        parts = self.parts(c, n * length)
        scratch = self._scratch_for(scratch_channels, parts)
        steps = [(partial, "partial", flags, parts, scratch, False)]
        if parts > 1:  # with one part the partial kernel finishes each channel itself
            steps.append((finalize, "finalize", flags, parts, scratch, False))
        return steps, scratch

    def _forward_steps(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                       fusable: bool, count_by: int = 0) -> list[tuple]:
        """The forward's launches as (name, kind, flags, parts, scratch, held); with self._lock held."""
        steps = self._normalising_steps(shape, ops, training, fusable)
        if ops.get("step_count") is not None:   # (checked: training, so the first step is the statistics')
            name, kind, flags, parts, scratch, held = steps[0]
            steps[0] = (name, kind, (*flags, f"COUNT_BY={int(count_by)}"), parts, scratch, held)
        return steps

    def _normalising_steps(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                           fusable: bool) -> list[tuple]:
        n, c, length = shape
        if c == 0:
            return []
        flags = tuple(f for f, on in (("HAS_WEIGHT", ops.get("weight")), ("HAS_BIAS", ops.get("bias")),
                                      ("HAS_RUNNING", ops.get("running_mean")), ("EVAL", not training)) if on)
        steps: list[tuple] = []
        if training:
            steps, scratch = self._reduce_steps("bn_stats", "bn_stats_finalize", shape,
                                                tuple(f for f in flags if f == "HAS_RUNNING"), c)
            if ONE_LAUNCH and n * length:
                return _finished_inside(steps, scratch, "bn_stats_apply", "bn_apply", flags, fusable)
        if n * length:
            steps.append(("bn_apply", "elementwise", tuple(f for f in flags if f != "HAS_RUNNING"), 1, None, fusable))
        return steps

    def _backward_steps(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                        need_input_grad: bool, mask: str | None = None) -> list[tuple]:
        """The backward's launches as (name, kind, flags, parts, scratch, held); with self._lock held."""
        n, c, length = shape
        if c == 0:
            return []
        base = (("HAS_WEIGHT",) if ops.get("weight") is not None else ()) + (("EVAL",) if not training else ())
        if mask is not None:
            base += (MASKS[mask],)
        reduce_flags = base + (("HAS_GW",) if ops.get("grad_weight") is not None else ()) + \
            (("HAS_GB",) if ops.get("grad_bias") is not None else ()) + \
            (("WRITE_DY",) if ops.get("masked_dy") is not None else ())
        steps: list[tuple] = []
        scratch = None
        if training or ops.get("grad_weight") is not None or ops.get("grad_bias") is not None:
            steps, scratch = self._reduce_steps("bn_backward_reduce", "bn_backward_finalize", shape, reduce_flags, c)
            if ONE_LAUNCH and need_input_grad and n * length:
                return _finished_inside(steps, scratch, "bn_backward_reduce_apply", "bn_backward_apply",
                                        reduce_flags, False)
        if need_input_grad and n * length:
            steps.append(("bn_backward_apply", "elementwise", base, 1, scratch, False))
        return steps

    def forward(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                eps: float, momentum: float, fusable: bool = False, count_by: int = 0) -> None:
        """``ops`` names x, y, weight, bias, running_mean, running_var, save_mean, save_invstd. ``fusable``
        (y contiguous float32): the normalising launch waits, held, so that an in-place relu of y right
        after it can run inside it instead (:func:`tunecl.kernels.strided.relu_tag`). ``step_count`` too (an
        int64 element, offset in its elements; training, a non-empty input): the first launch adds
        ``count_by`` to it."""
        _check_count(shape, ops, training)
        with self._lock:
            for name, kind, flags, parts, scratch, held in self._forward_steps(shape, ops, training, fusable,
                                                                               count_by):
                self._launch(name, kind, shape, ops, flags, eps, momentum, parts, scratch, held)

    def backward(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                 eps: float, need_input_grad: bool, mask: str | None = None) -> None:
        """``ops`` names dy, x, weight, mean/invstd (saved or running), y (grad_input), grad_weight and
        grad_bias; with ``mask`` ("relu" or "relu6", a key of :data:`MASKS`) also act, and dy is read through
        that activation's mask (the backward of the activation that followed the batch norm, fused), and
        optionally masked_dy, which the reduction fills with that masked dy (it needs one: training, or a
        grad_weight or grad_bias)."""
        _check_mask(ops, training, mask)
        with self._lock:
            for name, kind, flags, parts, scratch, held in self._backward_steps(shape, ops, training,
                                                                                need_input_grad, mask):
                self._launch(name, kind, shape, ops, flags, eps, 0.0, parts, scratch, held)

    # -- pre-built calls ----------------------------------------------------------------------------
    def prepare_forward(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                        eps: float, momentum: float, fusable: bool = False, count_by: int = 0) -> Prepared | None:
        """:meth:`forward`'s launches for every call of this signature (the shape, which of ``ops`` are
        given and their offsets, the flags and scalars), pre-built; None where they cannot be."""
        _check_count(shape, ops, training)
        with self._lock:
            steps = self._forward_steps(shape, ops, training, fusable, count_by)
        return self._prepare(shape, ops, steps, eps, momentum)

    def prepare_backward(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool,
                         eps: float, need_input_grad: bool, mask: str | None = None) -> Prepared | None:
        """:meth:`backward`'s launches for every call of this signature, pre-built (see :meth:`prepare_forward`)."""
        _check_mask(ops, training, mask)
        with self._lock:
            steps = self._backward_steps(shape, ops, training, need_input_grad, mask)
        return self._prepare(shape, ops, steps, eps, 0.0)

    def _prepare(self, shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], steps: list[tuple],
                 eps: float, momentum: float) -> Prepared | None:
        if not steps:
            return None
        # the call's own buffers are not kept: a layout of (None, offset) pairs plans the same launches
        layout = {k: (None, t[1]) for k, t in ops.items() if t is not None}
        positions, offsets = _placement(layout)
        built = []
        recipe = None
        for name, kind, flags, parts, scratch, held in steps:
            bound = self._bound(name, kind, shape, layout, flags, parts, scratch, eps, momentum)
            if bound is None:
                return None
            twin = None
            if held:
                twin = self._twin(bound, name, kind, shape, layout, flags, parts)
                recipe = (name, kind, shape, layout, flags, parts, scratch, eps, momentum)
            built.append((bound, twin))
        n, c, length = shape
        return Prepared(self, tuple(built), positions, offsets[1], n * c * length, recipe)

    def _bound(self, name: str, kind: str, shape: tuple[int, int, int], layout: Mapping[str, Tensor | None],
               flags: tuple[str, ...], parts: int, scratch: cl.Buffer | None, eps: float,
               momentum: float) -> launches.Bound | None:
        """One step's launch pre-built on ``layout`` (operands as (None, offset)): its operands bound per call."""
        positions, offsets = _placement(layout)
        kernel, global_size, local_size, meta = self._kept_launch(name, kind, shape, layout, flags, parts, offsets)
        args = [None] * len(_OFFSETS) + [scratch, np.float32(eps), np.float32(momentum), meta]
        return launches.Bound.build(kernel, global_size, local_size, args, positions)

    def _twin(self, bound: launches.Bound, name: str, kind: str, shape: tuple[int, int, int],
              layout: Mapping[str, Tensor | None], flags: tuple[str, ...], parts: int,
              folds: Mapping[str, str] = FOLDS) -> launches.Twin:
        """The held step's kernels with an in-place activation of its output folded in (``folds``: of y,
        :data:`FOLDS`, or of the sum, :data:`SUM_FOLDS`)."""
        offsets = _placement(layout)[1]
        return launches.Twin(bound, lambda op: self._kept_launch(
            name, kind, shape, layout, (*flags, folds[op]), parts, offsets)[0] if op in folds else None)

    def residual_step(self, recipe: tuple, residual_offset: int, sum_offset: int | None
                      ) -> tuple[launches.Bound, launches.Twin] | None:
        """The held normalising step of a pre-built forward (``recipe``) with a residual added as it writes,
        and its twins for an in-place activation after it: RESIDUAL (y += the residual at ``residual_offset``,
        bound to act; the activation of y) or, with ``sum_offset``, SUM_OUT (y as before, y + the residual
        into a tensor at ``sum_offset``, bound to masked_dy; the activation of the sum). None where the
        residual or the sum would change the launch's vector width (its grid, and with P > 1 the parts'
        bounds the partial kernel used)."""
        name, kind, shape, layout, flags, parts, scratch, eps, momentum = recipe
        fused = dict(layout, act=(None, residual_offset))
        if sum_offset is not None:
            fused["masked_dy"] = (None, sum_offset)
        if self.vector_width(shape[2], fused) != self.vector_width(shape[2], layout):
            return None
        flags = (*flags, "RESIDUAL" if sum_offset is None else "SUM_OUT")
        with self._lock:
            bound = self._bound(name, kind, shape, fused, flags, parts, scratch, eps, momentum)
            if bound is None:
                return None
            return bound, self._twin(bound, name, kind, shape, fused, flags, parts,
                                     FOLDS if sum_offset is None else SUM_FOLDS)

    def forget_launches(self) -> None:
        """Drop the kept launch plans and pre-built calls: after changing this module's launch constants
        (tests, tuning)."""
        self._launches.clear()
        self.calls.clear()


def _placement(layout: Mapping[str, Tensor | None]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The argument positions of the operands ``layout`` has, and every operand's element offset (0 where
    absent), in the order of ``_OFFSETS``."""
    located = [layout.get(k) for k in _OFFSETS]
    return (tuple(i for i, t in enumerate(located) if t is not None),
            tuple(0 if t is None else t[1] for t in located))


def _hold(device: Device, bound: launches.Bound, binding: tuple, tag: object, twin: launches.Twin, watched: bool,
          payload: object = None) -> None:
    """Hold ``bound`` on ``binding`` (:meth:`Device.hold`) with ``twin`` for an in-place activation: while a
    capture or a profile watches (``watched``) as the kernel's own launch, else pre-built."""
    if watched:
        device.hold(bound.kernel, bound.global_size, bound.local_size, bound.arguments(binding), tag, twin.kernel,
                    payload)
    else:
        device.hold(bound, bound.global_size, bound.local_size, (binding,), tag, twin, payload)


def _finished_inside(reduce_steps: list[tuple], scratch: cl.Buffer, fused: str, elementwise: str,
                     flags: tuple[str, ...], held: bool) -> list[tuple]:
    """A direction's launches with its reduction (``reduce_steps``: the partial kernel, and with P > 1 the
    finalize kernel) finished inside its elementwise launch (ONE_LAUNCH): with P = 1 one ``fused`` launch on
    the partial kernel's grid; with P > 1 the partial kernel, then ``elementwise`` merging the parts (FINISH).
    ``flags`` cover both parts of the work."""
    if len(reduce_steps) == 1:
        return [(fused, "partial", flags, 1, scratch, held)]
    partial, (_, _, _, parts, _, _) = reduce_steps
    return [partial, (elementwise, "elementwise", (*flags, "FINISH"), parts, scratch, held)]


def _check_count(shape: tuple[int, int, int], ops: Mapping[str, Tensor | None], training: bool) -> None:
    if ops.get("step_count") is not None and not (training and shape[1] and shape[0] * shape[2]):
        raise ValueError("step_count needs training on a non-empty input")


def _check_mask(ops: Mapping[str, Tensor | None], training: bool, mask: str | None) -> None:
    if (mask is None) != (ops.get("act") is None) or (mask is not None and mask not in MASKS):
        raise ValueError(f"mask {mask!r} needs an act tensor and one of {sorted(MASKS)}")
    if ops.get("masked_dy") is not None and (mask is None or not (
            training or ops.get("grad_weight") is not None or ops.get("grad_bias") is not None)):
        raise ValueError("masked_dy needs a mask and a reduction (training, or grad_weight or grad_bias)")


class Prepared:
    """One batch-norm call signature's launches, pre-built (:class:`tunecl.kernels.launches.Bound`): a call
    binds its tensors' buffers, those of ``ops`` that the signature has in the order of ``_OFFSETS``, and
    enqueues them as :meth:`BatchNorm.forward` / :meth:`BatchNorm.backward` would (deferred; the forward's
    normalising launch held for an in-place relu, or a residual add: :class:`HeldNormalisation`), bit for
    bit the same launches."""

    __slots__ = ("_norm", "_recipe", "_residuals", "count", "positions", "steps", "y_offset")

    def __init__(self, norm: BatchNorm, steps: tuple, positions: tuple[int, ...], y_offset: int, count: int,
                 recipe: tuple | None = None):
        self._norm, self.steps, self.positions = norm, steps, positions
        self.y_offset, self.count = y_offset, count
        self._recipe = recipe   # what the held step was built from (BatchNorm.residual_step)
        # (residual offset, sum offset or None) -> the held step with that residual added, or None
        self._residuals: dict[tuple[int, int | None], tuple | None] = {}

    def residual_step(self, residual_offset: int, sum_offset: int | None) -> tuple | None:
        """:meth:`BatchNorm.residual_step` of the held step, built once per pair of offsets."""
        key = (residual_offset, sum_offset)
        made = self._residuals.get(key, self)
        if made is self:
            try:
                made = None if self._recipe is None else self._norm.residual_step(self._recipe, *key)
            except Exception:   # (its kernel failed to build) the add runs by itself, as it would have
                made = None
            if len(self._residuals) >= MAX_RESIDUALS:
                self._residuals.clear()
            self._residuals[key] = made
        return made

    def enqueue(self, buffers: Sequence[cl.Buffer], tensors: object = None) -> None:
        """Launch on ``buffers`` (one per position: the signature's tensors in ``_OFFSETS`` order; y's
        is the second). ``tensors``: the forward's operand and output tensors, kept alive while its launch is
        held (see :class:`HeldNormalisation`)."""
        bind: list = [None] * (2 * len(buffers))
        bind[0::2] = self.positions
        bind[1::2] = buffers
        binding = tuple(bind)
        norm = self._norm
        device = norm.device
        watched = profiling.swap_lock.locked()   # a capture or a profile: the kernels' own launches
        with norm._lock:
            for bound, twin in self.steps:
                if twin is None:
                    if watched:
                        device.defer(bound.kernel, bound.global_size, bound.local_size, bound.arguments(binding))
                    else:
                        device.defer(bound, bound.global_size, bound.local_size, (binding,))
                    continue
                tag = relu_tag(buffers[1], self.y_offset, self.count)
                _hold(device, bound, binding, tag, twin, watched,
                      HeldNormalisation(self, binding, tag, watched, tensors))


class HeldNormalisation:
    """The payload of a pre-built forward's held normalising launch: an add of a residual to y right after
    may run inside it instead (:meth:`add`). It keeps the forward's tensors alive while it is held: an input
    or a saved statistic that nobody keeps any more (a forward without autograd) would otherwise give its
    buffer back, and the add's new output could be allocated on it, for the re-issued launch to write
    while it reads or writes that buffer as the forward's."""

    __slots__ = ("binding", "prepared", "tag", "tensors", "watched")

    def __init__(self, prepared: Prepared, binding: tuple, tag: object, watched: bool, tensors: object = None
                 ) -> None:
        self.prepared, self.binding, self.tag = prepared, binding, tag
        self.watched = watched   # a capture or a profile: the kernels' own launches, as Prepared.enqueue made
        self.tensors = tensors

    def add(self, residual: Tensor, out: Tensor | None = None) -> bool:
        """Launch the held normalisation with ``residual`` (buffer, element offset; laid out as y) added as it
        writes, instead of it: into y (``out`` None: ``y += residual``) or into ``out`` (laid out as y, maybe
        the residual itself; ``out = y + residual``, y written as before). The launch stays held for an
        in-place relu or relu6 of what the add wrote. False where the launch was enqueued already, another
        came after it, or the residual's offset changes the launch's vector width: the add then runs by
        itself."""
        prepared = self.prepared
        made = prepared.residual_step(residual[1], None if out is None else out[1])
        if made is None:
            return False
        device = prepared._norm.device
        if device.take_held(self.tag) is not self:
            return False
        bound, twin = made
        if out is None:
            binding, tag = (*self.binding, _ACT, residual[0]), self.tag
        else:
            binding = (*self.binding, _ACT, residual[0], _MASKED_DY, out[0])
            tag = relu_tag(out[0], out[1], prepared.count)
        _hold(device, bound, binding, tag, twin, self.watched)
        return True

