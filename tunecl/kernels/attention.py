"""attention_flash: fused scaled-dot-product attention (``attention.cl``), forward and backward.

A work-group takes a block of query rows and loops over tiles of keys with an online softmax, so the
L x S score matrix is never stored; the backward recomputes the scores per tile from the forward's row
log-sum-exp (one kernel for dQ over key tiles, one for dK and dV over query tiles, after a small kernel
for delta = rowsum(dO * O)). Every operand is read and written through its strides, so the transposed
views multi-head attention makes need no copies. Tunables, with the values searched:

=======  =====================  ===================================================================
BM       8 16 32 64 128         query rows per work-group (per query tile in the dK/dV kernel)
BN       8 16 32 64 128         keys per tile (keys per work-group in the dK/dV kernel)
TM       1 2 4 8 16 32          threads along the rows (queries; keys in the dK/dV kernel)
TN       1 2 4 8 16 32          threads along the keys of a tile and the output columns
PAD      0 1                    extra floats per local-memory row (bank conflicts)
KVSHARE  0 1                    forward only: V is loaded into K's local tile once the scores are
                                computed (half the key/value local memory, one more load phase)
=======  =====================  ===================================================================

The problem (:class:`~tunecl.problems.AttentionProblem`) fixes the head dims, the mask kind, causality,
the dtype (float16 is loaded and stored as half, computed in float32) and the direction; its lengths,
batch and heads only size the launch.

Dropout on the attention probabilities is a variant of the same config (``run(..., dropout=(p, key))``,
compiled with ``-DDROPOUT=1``): the forward and both backward kernels draw each score's keep decision
from Philox under ``key`` (``philox.cl``), so no mask is stored; the draw of score (b*h, i, j) is element
``(b*h*L + i)*S + j`` of a keyed Bernoulli draw (``Random.bernoulli_keyed``) under the same key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl.kernels.base import Config, Constraint, Space, build_options, read_source
from tunecl.kernels.gemm.core import Rule, check_config, device_type, make_space
from tunecl.kernels.sizes import next_pow2
from tunecl.kernels.strided import INT32_MAX, Operand, meta_dtype, pack_meta
from tunecl.problems import AttentionProblem
from tunecl.runtime import Device

NAME = "attention_flash"
VERSION = 1
MAX_HEAD_DIM = 256
DTYPES = ("float32", "float16")   # of query, key and value (float16: loaded and stored as half)
MAX_REGISTERS = 256   # accumulators and score tiles per thread (floats)
DELTA_GROUP = 64      # work-items per work-group of attn_bwd_delta

_PARAMS: dict[str, tuple[int, ...]] = {
    "BM": (8, 16, 32, 64, 128), "BN": (8, 16, 32, 64, 128), "TM": (1, 2, 4, 8, 16, 32),
    "TN": (1, 2, 4, 8, 16, 32), "PAD": (0, 1), "KVSHARE": (0, 1),
}
# meta blocks (element offset and the strides of b, h, row, column) in attention.cl's order
_BLOCKS = ("q", "k", "v", "out", "mask", "dout", "dq", "dk", "dv")
META_LENGTH = 3 + 5 * len(_BLOCKS) + 2


def local_floats(problem: AttentionProblem, c: Mapping[str, int]) -> int:
    """Floats of local memory the config's kernels declare (the largest of them for ``bwd``)."""
    hd, vd, pad = problem.e, problem.ev, c["PAD"]
    bm, bn = c["BM"], c["BN"]
    if problem.direction == "fwd":
        kv = bn * max(hd, vd) + bn * pad if c["KVSHARE"] else bn * (hd + vd + 2 * pad)
        return bm * (hd + pad) + kv + bm * (bn + pad) + bm * c["TN"]
    dq = bm * (hd + vd + 2 * pad) + bn * (hd + vd + 2 * pad) + bm * (bn + pad) + 2 * bm
    dkdv = bn * (hd + vd + 2 * pad) + bm * (hd + vd + 2 * pad) + 2 * bn * (bm + pad) + 2 * bm
    return max(dq, dkdv)


def registers(problem: AttentionProblem, c: Mapping[str, int]) -> int:
    """Floats each thread keeps in registers (score tiles and output accumulators), the largest kernel's."""
    bm, bn, tm, tn = c["BM"], c["BN"], c["TM"], c["TN"]
    hch, vch = -(-problem.e // tn), -(-problem.ev // tn)
    rows, keys = bm // tm, bn // tn
    if problem.direction == "fwd":
        return rows * keys + rows * (vch + 2)
    dq = 2 * rows * keys + rows * hch
    dkdv = 2 * (bn // tm) * (bm // tn) + (bn // tm) * (hch + vch)
    return max(dq, dkdv)


def _constraints(problem: AttentionProblem, device: Any) -> list[Rule]:
    rules: list[Rule] = [
        ("rows_divide_among_threads", ("BM", "BN", "TM", "TN"),
         lambda c: c["BM"] % c["TM"] == 0 and c["BN"] % c["TN"] == 0),
        ("work_group_size_within_device", ("TM", "TN"), lambda c: c["TM"] * c["TN"] <= device.max_work_group_size),
        ("local_memory_within_device", ("BM", "BN", "TM", "TN", "PAD", "KVSHARE"),
         lambda c: 4 * local_floats(problem, c) <= device.local_mem_size),
        (f"registers_per_thread_at_most_{MAX_REGISTERS}", ("BM", "BN", "TM", "TN"),
         lambda c: registers(problem, c) <= MAX_REGISTERS),
    ]
    if problem.direction == "bwd":
        # the dK/dV kernel takes BN keys as its rows (over TM threads) and BM queries as its columns (TN)
        rules.append(("backward_blocks_divide_among_threads", ("BM", "BN", "TM", "TN"),
                      lambda c: c["BN"] % c["TM"] == 0 and c["BM"] % c["TN"] == 0))
        rules.append(("kvshare_is_forward_only", ("KVSHARE",), lambda c: c["KVSHARE"] == 0))
    return rules


def _pruning(problem: AttentionProblem) -> list[Rule]:
    """Rules that drop valid configs which cannot pay off for this problem (search-space size only)."""
    l_cap, s_cap = max(8, next_pow2(problem.l)), max(8, next_pow2(problem.s))
    return [
        ("tiles_within_problem", ("BM", "BN"), lambda c: c["BM"] <= l_cap and c["BN"] <= s_cap),
        ("work_group_size_16_to_256", ("TM", "TN"), lambda c: 16 <= c["TM"] * c["TN"] <= 256),
    ]


# defaults, most preferred first: the first one the problem's space holds is taken
_GPU_PREFERENCES = {
    "fwd": [dict(BM=64, BN=32, TM=16, TN=8, PAD=1, KVSHARE=0), dict(BM=64, BN=32, TM=16, TN=8, PAD=1, KVSHARE=1),
            dict(BM=32, BN=32, TM=8, TN=8, PAD=1, KVSHARE=1), dict(BM=16, BN=32, TM=4, TN=8, PAD=1, KVSHARE=1),
            dict(BM=16, BN=16, TM=4, TN=4, PAD=1, KVSHARE=1)],
    "bwd": [dict(BM=32, BN=32, TM=8, TN=8, PAD=1, KVSHARE=0), dict(BM=16, BN=32, TM=8, TN=4, PAD=1, KVSHARE=0),
            dict(BM=16, BN=16, TM=4, TN=4, PAD=1, KVSHARE=0), dict(BM=8, BN=8, TM=4, TN=4, PAD=1, KVSHARE=0)],
}
_CPU_PREFERENCES = {   # (the best of a sweep on PoCL, 2-core x86: L = S = 512 forward, 256 backward, head dim 64)
    "fwd": [dict(BM=32, BN=32, TM=16, TN=4, PAD=0, KVSHARE=0), dict(BM=16, BN=16, TM=8, TN=1, PAD=0, KVSHARE=0)],
    "bwd": [dict(BM=16, BN=16, TM=8, TN=2, PAD=0, KVSHARE=0), dict(BM=8, BN=8, TM=4, TN=2, PAD=0, KVSHARE=0)],
}


@dataclasses.dataclass
class AttentionOperands:
    """The tensors of one call, each an :class:`Operand` whose strides are (batch, head, row, column);
    ``mask``'s are 0 where it broadcasts, ``lse`` and ``delta`` are contiguous (batch*heads, L) float32.
    The forward reads q, k, v, mask and writes out, lse; the backward also reads out, lse and dout,
    fills delta (workspace) and writes dq, dk, dv."""

    q: Operand
    k: Operand
    v: Operand
    out: Operand
    lse: Operand
    mask: Operand | None = None
    dout: Operand | None = None
    delta: Operand | None = None
    dq: Operand | None = None
    dk: Operand | None = None
    dv: Operand | None = None


def _broadcasts(shape: Sequence[int], to: Sequence[int]) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (numpy's rule, right-aligned)."""
    return len(shape) <= len(to) and all(n in (1, m) for n, m in zip(reversed(shape), reversed(to)))


# Scores of at most this many bytes (batch x heads x L x S float32) may be stored by the math path.
MATH_SCORES_BYTES = 256 << 20
# On GPUs, training attention of at least this many scores per head (L x S) takes the math path.
GPU_MATH_SCORES = 256 * 256


def math_for_training(device_type: str, query: Sequence[int], key: Sequence[int]) -> bool:
    """Whether a call that needs gradients takes the math decomposition (matrix products and softmax,
    its scores stored for the backward) instead of the fused kernels, on a device of ``device_type``
    (``Fingerprint.device_type``) for these query and key shapes (batch dims, rows, head dim). Only while
    the stored scores fit :data:`MATH_SCORES_BYTES`: beyond, the fused kernels keep memory bounded.

    - CPU devices: the fused backward measured slower than the math backward (PoCL, batch 1, 4 heads,
      head dim 64, forward + backward ms, fused vs math: sequence 128 4.34 vs 3.33, 512 64.5 vs 24.9, and
      56.0 vs 24 with a tuned backward), so training takes the math path.
    - GPUs: from :data:`GPU_MATH_SCORES` scores per head (sequence 256 x 256). On an H100 at batch 16,
      12 heads, head dim 64 (``benchmarks/attention.py --backward``; the fused kernels tuned at 128, untuned
      beyond), math / fused forward + backward device time: sequence 128 1.18 (tuned fused: faster), 256
      0.86, 512 0.77, 1024 0.72 (scores over the bound there; fused), 2048 0.75.

    The backend and ``tunecl tune --net``'s workload extraction both ask this."""
    if device_type != "cpu" and query[-2] * key[-2] < GPU_MATH_SCORES:
        return False
    return 4 * math.prod(query[:-2]) * query[-2] * key[-2] <= MATH_SCORES_BYTES


def unsupported(query: Sequence[int], key: Sequence[int], value: Sequence[int], dtypes: Sequence[str],
                mask: Sequence[int] | None = None, mask_dtype: str | None = None, mask_requires_grad: bool = False,
                dropout_p: float = 0.0, is_causal: bool = False) -> str | None:
    """Why the fused kernels do not compute ``scaled_dot_product_attention`` of these operands, or None
    when they do: the shapes of query, key, value and the mask (rows x head dim last, batch dims before),
    the dtype names of query, key and value (``float32`` ...) and the mask's. A dropout probability in
    [0, 1] is computed (where the caller can draw on the device: :func:`dropout_on_device`). The backend
    (``tunecl/backend/ops/sdpa.py``) and ``tunecl tune --net``'s workload extraction both ask this."""
    if not 0.0 <= dropout_p <= 1.0:
        return f"a dropout probability of {dropout_p}"
    if dtypes[0] not in DTYPES or dtypes[1] != dtypes[0] or dtypes[2] != dtypes[0]:
        return f"dtypes {'/'.join(dtypes)}"
    if len(query) < 2 or not len(query) == len(key) == len(value):
        return "ranks"
    batch = tuple(query[:-2])
    if tuple(key[:-2]) != batch or tuple(value[:-2]) != batch:
        return "batch dims that differ (broadcast or grouped-query heads)"
    if key[-1] != query[-1] or value[-2] != key[-2]:
        return "mismatched head dims or key/value lengths"
    if max(query[-1], value[-1]) > MAX_HEAD_DIM:
        return f"head dims over {MAX_HEAD_DIM}"
    if mask is not None:
        if is_causal:
            return "a mask with is_causal"
        if mask_dtype != "bool" and mask_dtype != dtypes[0]:
            return f"a {mask_dtype} mask"
        if mask_requires_grad:
            return "a mask that requires grad"
        if len(mask) > len(query):
            return "a mask of more dims than the query"
        if not _broadcasts(mask, (*batch, query[-2], key[-2])):
            return "a mask that does not broadcast"
    return None


def dropout_on_device(device_type: str, random_mode: str) -> bool:
    """Whether a call with dropout takes the fused kernels (their Philox draw) on a device of
    ``device_type`` under ``TUNECL_RANDOM`` = ``random_mode``: where random numbers are drawn on the device
    (``device``, or ``auto`` off CPU devices); with host draws dropout keeps the math path, whose mask
    torch's CPU generator draws as the CPU kernels do."""
    return random_mode == "device" or (random_mode == "auto" and device_type != "cpu")


def batch_and_heads(shape: Sequence[int]) -> tuple[int, int]:
    """The (batch, heads) the fused kernels run ``shape`` (batch dims, rows, head dim) as: missing leading
    dims are 1, dims before the last batch dim fold into the batch."""
    lead = (1, 1, *shape[:-2])
    return math.prod(lead[:-1]), lead[-1]


def problem_of(query: Sequence[int], key: Sequence[int], value: Sequence[int], dtype: str,
               mask_dtype: str | None, is_causal: bool, direction: str) -> AttentionProblem:
    """The problem the fused kernels run for operands that :func:`unsupported` accepts."""
    batch, heads = batch_and_heads(query)
    mask = "none" if mask_dtype is None else "bool" if mask_dtype == "bool" else "float"
    return AttentionProblem(batch, heads, query[-2], key[-2], query[-1], value[-1], causal=is_causal, mask=mask,
                            direction=direction, dtype=dtype)


def _reach(o: Operand | None, sizes: Sequence[int]) -> int:
    if o is None:
        return 0
    return abs(o.offset) + sum((n - 1) * abs(s) for n, s in zip(sizes, o.strides))


class AttentionPlan:
    """One config of ``attention_flash`` built for one problem; ``run`` enqueues without waiting."""

    def __init__(self, problem: AttentionProblem, device: Device, config: Config):
        self.algorithm = NAME
        self.problem, self.device, self.config = problem, device, dict(config)
        p = problem
        self.workspace_bytes = 4 * p.batch * p.heads * p.l if p.direction == "bwd" else 0
        self.source = read_source(__package__, "attention.cl")
        self.threads = config["TM"] * config["TN"]
        self._kernels: dict[tuple[str, str, bool], cl.Kernel] = {}
        dtype = 1 if p.dtype == "float16" else 0
        mask = ("none", "bool", "float").index(p.mask)
        self._options = build_options({k: v for k, v in config.items() if p.direction == "fwd" or k != "KVSHARE"},
                                      [f"-DHD={p.e}", f"-DVD={p.ev}", f"-DDT={dtype}", f"-DMASK={mask}",
                                       f"-DCAUSAL={int(p.causal)}"])

    def program(self, idx: str = "int", dropout: bool = False) -> cl.Program:
        """The config's kernels compiled for the index type ``idx`` (``int`` or ``long``), with dropout or
        not (built once per process, see :meth:`Device.build`)."""
        return self.device.build(self.source, self._options + [f"-DIDX={idx}"] + (["-DDROPOUT=1"] if dropout else []))

    def _kernel(self, name: str, idx: str, scalars: list[Any], dropout: bool = False) -> cl.Kernel:
        kernel = self._kernels.get((name, idx, dropout))
        if kernel is None:
            program = self.program(idx, dropout)
            scalars = scalars + [np.float32, np.uint32, np.uint32] if dropout else scalars
            kernel = self.device.kernel(program, name, scalars + [meta_dtype(META_LENGTH, idx)])
            self._kernels[(name, idx, dropout)] = kernel
        return kernel

    def _meta(self, ops: AttentionOperands) -> tuple[str, bytes]:
        p = self.problem
        q_sizes, k_sizes = (p.batch, p.heads, p.l, p.e), (p.batch, p.heads, p.s, p.e)
        v_sizes, o_sizes = (p.batch, p.heads, p.s, p.ev), (p.batch, p.heads, p.l, p.ev)
        reach = max(_reach(ops.q, q_sizes), _reach(ops.k, k_sizes), _reach(ops.v, v_sizes),
                    _reach(ops.out, o_sizes), _reach(ops.mask, (p.batch, p.heads, p.l, p.s)),
                    _reach(ops.dout, o_sizes), _reach(ops.dq, q_sizes), _reach(ops.dk, k_sizes),
                    _reach(ops.dv, v_sizes), ops.lse.offset + p.batch * p.heads * p.l,
                    (ops.delta.offset if ops.delta else 0) + p.batch * p.heads * p.l)
        idx = "long" if reach > INT32_MAX else "int"
        values = [p.heads, p.l, p.s]
        for name in _BLOCKS:
            o = getattr(ops, name)
            values += [0] * 5 if o is None else [o.offset, *o.strides]
        values += [ops.lse.offset, ops.delta.offset if ops.delta else 0]
        return idx, pack_meta(values, idx)

    def run(self, ops: AttentionOperands, scale: float, dropout: tuple[float, int] | None = None) -> list[cl.Event]:
        """Enqueue the problem's direction on ``ops`` with the score scale ``scale`` and, if given, dropout
        ``(p, key)``: each probability zeroed with probability ``p``, the rest scaled by 1 / (1 - p), drawn
        under the 64-bit ``key`` (the backward of a forward must get the same); the events enqueued."""
        p, queue, wg = self.problem, self.device.queue, self.threads
        idx, meta = self._meta(ops)
        mask = (ops.mask or ops.q).buffer   # (a kernel without a mask never reads it)
        bh, c = p.batch * p.heads, self.config
        scale = np.float32(scale)
        drop = dropout is not None
        tail: tuple = (scale, meta)
        if drop:
            probability, key = dropout
            if not 0.0 <= probability <= 1.0:
                raise ValueError(f"a dropout probability must be in [0, 1], not {probability}")
            tail = (scale, np.float32(1.0 - probability), np.uint32(key & 0xFFFFFFFF),
                    np.uint32((key >> 32) & 0xFFFFFFFF), meta)
        if p.direction == "fwd":
            kernel = self._kernel("attn_fwd", idx, [None] * 6 + [np.float32], drop)
            return [kernel(queue, (-(-p.l // c["BM"]) * wg, bh), (wg, 1), ops.q.buffer, ops.k.buffer, ops.v.buffer,
                           mask, ops.out.buffer, ops.lse.buffer, *tail)]
        if ops.dout is None or ops.delta is None or ops.dq is None or ops.dk is None or ops.dv is None:
            raise ValueError("the attention backward needs dout, delta, dq, dk and dv")
        rows = bh * p.l
        delta = self._kernel("attn_bwd_delta", idx, [None] * 3 + [np.int64 if idx == "long" else np.int32])
        dq = self._kernel("attn_bwd_dq", idx, [None] * 8 + [np.float32], drop)
        dkdv = self._kernel("attn_bwd_dkdv", idx, [None] * 9 + [np.float32], drop)
        common = (ops.q.buffer, ops.k.buffer, ops.v.buffer, mask, ops.dout.buffer, ops.lse.buffer, ops.delta.buffer)
        return [
            delta(queue, (-(-rows // DELTA_GROUP) * DELTA_GROUP,), (DELTA_GROUP,), ops.dout.buffer, ops.out.buffer,
                  ops.delta.buffer, rows, meta),
            dq(queue, (-(-p.l // c["BM"]) * wg, bh), (wg, 1), *common, ops.dq.buffer, *tail),
            dkdv(queue, (-(-p.s // c["BN"]) * wg, bh), (wg, 1), *common, ops.dk.buffer, ops.dv.buffer, *tail),
        ]


class AttentionFlash:
    """The ``attention_flash`` algorithm (see the module docstring for its tunables)."""

    name = NAME
    version = VERSION
    kind = "attention"

    def applies(self, problem: AttentionProblem, device: Device) -> bool:
        return (isinstance(problem, AttentionProblem) and max(problem.e, problem.ev) <= MAX_HEAD_DIM
                and bool(self.space(problem, device).configs()))

    def space(self, problem: AttentionProblem, device: Device) -> Space:
        return make_space(dict(_PARAMS), _constraints(problem, device), _pruning(problem))

    def default(self, problem: AttentionProblem, device: Device) -> Config:
        """The first of a short list of configs (large tiles first; 128-thread work-groups on a GPU,
        16 to 64 on a CPU) that the problem's space holds, else its first valid config."""
        space = self.space(problem, device)
        table = _CPU_PREFERENCES if device_type(device) == "cpu" else _GPU_PREFERENCES
        for wanted in table[problem.direction]:
            if space.is_valid(wanted) and all(rule.check(wanted) for rule in _pruning_constraints(problem)):
                return dict(wanted)
        for wanted in table[problem.direction]:
            if space.is_valid(wanted):
                return dict(wanted)
        configs = space.configs()
        if not configs:
            raise ValueError(f"{NAME} has no valid config for {problem.key} on this device")
        return dict(configs[0])

    def build(self, problem: AttentionProblem, device: Device, config: Config) -> AttentionPlan:
        """Compile ``config`` for ``problem`` (its 32-bit index variant; the 64-bit one on first need);
        ValueError (before compiling) if the config is invalid, BuildError if the compiler rejects it."""
        check_config(self.space(problem, device), config, NAME)
        plan = AttentionPlan(problem, device, config)
        plan.program("int")
        return plan


def _pruning_constraints(problem: AttentionProblem) -> list[Constraint]:
    return [Constraint(name, check) for name, _, check in _pruning(problem)]


ALGORITHMS = [AttentionFlash()]
