"""The attention harness: torch's ``scaled_dot_product_attention`` on the CPU in float64 as the reference.

The plan contract is the one of ``tunecl/kernels/attention.py``: ``plan.run(ops, scale)`` with an
:class:`~tunecl.kernels.attention.AttentionOperands` whose operands are (batch, head, row, column)
strided. The harness lays q, k, v, the output, dO and the gradients out contiguous (B, H, rows, cols), and
a mask as (B, 1, L, S) broadcast over the heads (stride 0, as the masks of language models are), each
between NaN guard regions (:func:`~tunecl.search.harness.guarded`; the boolean mask between bytes of a
fixed pattern). The score scale is ``1 / sqrt(E)``, torch's default.

- ``dir=fwd``: the timed launch writes the output and the row log-sum-exp (both start as NaN, so neither
  may be read); both are checked against torch float64 (the output from ``scaled_dot_product_attention``,
  the log-sum-exp from the scores).
- ``dir=bwd``: the timed launch reads q, k, v, the mask, dO and the forward's output and log-sum-exp
  (the float64 reference's, rounded to the data type and float32 as a forward would store them) and
  writes dQ, dK, dV (NaN at the start) and its delta workspace; the gradients are checked against
  torch's float64 autograd of ``scaled_dot_product_attention``.

The reference and the tolerances are computed in chunks of (batch, head) pairs, about
:data:`CHUNK_SCORES` (query, key) pairs at a time, so the float64 temporaries stay near 32 MB however long
the sequences. Inputs are uniform in [-1, 1] from ``numpy.random.default_rng(seed)``; a boolean mask keeps a key with
probability 0.7 and always key ``i mod S`` of row ``i`` (a row without keys is 0 in the kernels and NaN in
torch's math, so the harness draws none); a causal problem's row ``i`` keeps keys ``j <= i``.

Tolerances, per element, from the magnitudes of the exact terms (float64), in the manner of
:func:`~tunecl.search.harness.reduction_tolerance`, ``r(n) = u (8 sqrt(n) + 8)`` (``u`` float32's unit
roundoff):

- a score ``s_ij = scale q_i . k_j (+ mask_ij)`` is off by at most ``e_i = r(E) max_j (scale |q_i| . |k_j|
  + |mask_ij|)`` over its row; ``exp`` turns that into a relative error of ``P_ij = softmax_j(s_i)``, to
  which the row sum and the exponentials' own rounding add ``r(S) + 16 u``: ``p_i = 2 e_i + r(S) + 16 u``
  bounds the relative error of every ``P_ij`` (the 2: the numerator's and the row sum's);
- output: ``(p_i + r(S)) (P |V|)_id``; log-sum-exp: ``e_i + r(S) + 8 u (|lse_i| + 1)``;
- backward, with ``P`` recomputed from the stored log-sum-exp (``p_i`` plus ``u |lse_i|`` for its float32
  rounding) and ``dS_ij = P_ij (dO_i . V_j - dO_i . O_i)``: the error of ``dS_ij`` is at most
  ``E_ij = P_ij (p_i (|dP_ij| + |delta_i|) + r(EV) (|dO_i| . |V_j| + |dO_i| . |O_i|) + w |dO_i| . |O_i|)``
  (``w``: the rounding of the stored O, float16's unit roundoff for half problems, else ``u``);
  ``dV = P^T dO`` within ``(p + r(L)) P^T |dO|``, ``dQ = scale dS K`` within ``scale (E |K| + r(S) |dS| |K|)``
  and ``dK = scale dS^T Q`` within ``scale (E^T |Q| + r(L) |dS|^T |Q|)``.

float16 problems round each tolerance once more for the half output
(:func:`~tunecl.search.harness.half_output_tolerance`). What it still catches: a key lost or counted twice
moves an output by ``P_ij |v_jd|``, about ``1 / S`` of the output's magnitude, against a tolerance of
``~4e-5`` of it at E = 64, S = 512; a score scale off by 1e-3 moves the outputs by ``~1e-3 |s|`` of theirs.
"""

from __future__ import annotations

import collections
import math
from typing import Any, ClassVar

import numpy as np

from tunecl.kernels.attention import AttentionOperands
from tunecl.kernels.base import Plan
from tunecl.kernels.strided import Operand
from tunecl.problems import AttentionProblem
from tunecl.runtime import Device
from tunecl.search.harness import (
    EPS32,
    GUARD_ELEMENTS,
    HALF_UNIT_ROUNDOFF,
    compare_guarded,
    guarded,
    half_output_tolerance,
    modified_input,
    reduction_tolerance,
)

KEEP = 0.7               # probability that a boolean mask keeps a key
CHUNK_SCORES = 1 << 22   # (query, key) pairs of the reference computed at once: float64 temporaries of ~32 MB
MASK_GUARD_BYTE = 0xA5   # the bytes around a boolean mask


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class AttentionHarness:
    """Inputs, torch float64 reference and guarded buffers for one attention problem (see the module)."""

    kind: ClassVar[str] = "attention"

    def __init__(self, problem: AttentionProblem, device: Device, seed: int = 0, guard: int = GUARD_ELEMENTS):
        self.problem = problem
        self.device = device
        self.seed = seed
        self.guard = guard
        self.scale = 1.0 / math.sqrt(problem.e)
        self._data: dict[str, Any] | None = None

    # -- shapes --------------------------------------------------------------------------------------
    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        p = self.problem
        q, k, v, o = (p.batch, p.heads, p.l, p.e), (p.batch, p.heads, p.s, p.e), (p.batch, p.heads, p.s, p.ev), \
            (p.batch, p.heads, p.l, p.ev)
        return {"q": q, "k": k, "v": v, "out": o, "dout": o, "dq": q, "dk": k, "dv": v,
                "lse": (p.batch, p.heads, p.l), "delta": (p.batch, p.heads, p.l), "mask": (p.batch, 1, p.l, p.s)}

    # -- inputs and reference ------------------------------------------------------------------------
    def _prepare(self) -> dict[str, Any]:
        if self._data is None:
            self._data = self._make()
        return self._data

    def _make(self) -> dict[str, Any]:
        p, shapes, g = self.problem, self.shapes, self.guard
        rng = np.random.default_rng(self.seed)
        dtype = np.dtype(p.dtype)
        q, k, v, dout = (rng.uniform(-1.0, 1.0, shapes[n]).astype(dtype) for n in ("q", "k", "v", "dout"))
        mask = None
        if p.mask == "bool":
            mask = rng.random(shapes["mask"]) < KEEP
            rows = np.arange(p.l)
            mask[:, :, rows, rows % p.s] = True
        elif p.mask == "float":
            mask = rng.uniform(-1.0, 1.0, shapes["mask"]).astype(dtype)
        pairs = p.batch * p.heads
        step = max(1, min(pairs, CHUNK_SCORES // (p.l * p.s)))
        flat = [x.reshape(pairs, *x.shape[2:]) for x in (q, k, v, dout)]
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = collections.defaultdict(list)
        for first in range(0, pairs, step):
            chunk = slice(first, min(pairs, first + step))
            chunk_mask = None if mask is None else mask[np.arange(chunk.start, chunk.stop) // p.heads, 0]
            for name, value in self._reference(*(x[chunk] for x in flat), chunk_mask).items():
                parts[name].append(value)

        def joined(name: str, index: int, shape: tuple[int, ...]) -> np.ndarray:
            return np.concatenate([part[index] for part in parts[name]]).reshape(shape)

        data: dict[str, Any] = {
            "q": guarded(q, g, dtype), "k": guarded(k, g, dtype), "v": guarded(v, g, dtype), "mask": None,
            "expected": {}, "tolerance": {}}
        if mask is not None:
            data["mask"] = (self._guarded_bytes(mask.astype(np.uint8)) if p.mask == "bool"
                            else guarded(mask, g, dtype))
        for name in ("out", "lse") if p.direction == "fwd" else ("dq", "dk", "dv"):
            data["expected"][name] = joined(name, 0, shapes[name])
            data["tolerance"][name] = joined(name, 1, shapes[name])
            data[f"{name}_nan"] = guarded(np.full(shapes[name], np.nan, np.float32 if name == "lse" else dtype), g,
                                          np.float32 if name == "lse" else dtype)
        if p.direction == "bwd":
            data["dout"] = guarded(dout, g, dtype)
            data["out"] = guarded(joined("stored_out", 0, shapes["out"]), g, dtype)
            data["lse"] = guarded(joined("stored_lse", 0, shapes["lse"]), g)
            data["delta_nan"] = guarded(np.full(shapes["delta"], np.nan, np.float32), g)
        return data

    def _reference(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray,
                   mask: np.ndarray | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """For a chunk of (batch, head) pairs (the first dim of every array): each output's float64
        reference and tolerance (see the module); backward also the forward's output and log-sum-exp as
        a forward stores them (``stored_out``, ``stored_lse``; their tolerances unused)."""
        import torch
        import torch.nn.functional as F

        p = self.problem
        dtype = np.dtype(p.dtype)
        q64, k64, v64, dout64 = (torch.from_numpy(x.astype(np.float64)) for x in (q, k, v, dout))
        mask64 = None if mask is None else torch.from_numpy(mask if p.mask == "bool" else mask.astype(np.float64))
        leaves = [t.clone().requires_grad_(p.direction == "bwd") for t in (q64, k64, v64)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask64, is_causal=p.causal, scale=self.scale)
        if p.direction == "bwd":
            out.backward(dout64)
        out = out.detach()
        # the scores, their row log-sum-exp and the probabilities, for the log-sum-exp and the tolerances
        scores = self.scale * q64 @ k64.transpose(-2, -1)
        magnitude = self.scale * q64.abs() @ k64.abs().transpose(-2, -1)
        if p.mask == "bool":
            scores = scores.masked_fill(~mask64, float("-inf"))
        elif p.mask == "float":
            scores = scores + mask64
            magnitude = magnitude + mask64.abs()
        if p.causal:
            scores = scores.masked_fill(torch.ones(p.l, p.s, dtype=torch.bool).tril().logical_not(), float("-inf"))
        lse = scores.logsumexp(-1)
        probs = (scores - lse[..., None]).exp()
        del scores
        score_error = reduction_tolerance(p.e) * magnitude.amax(-1)                     # e_i
        prob_error = 2.0 * score_error + reduction_tolerance(p.s) + 16.0 * EPS32        # p_i
        del magnitude
        if p.direction == "fwd":
            return {"out": (out.numpy(), ((prob_error + reduction_tolerance(p.s))[..., None]
                                          * (probs @ v64.abs())).numpy()),
                    "lse": (lse.numpy(), (score_error + reduction_tolerance(p.s)
                                          + 8.0 * EPS32 * (lse.abs() + 1.0)).numpy())}
        stored_out = out.numpy().astype(dtype)                 # the forward's results as a forward stores them
        out_abs = torch.from_numpy(stored_out.astype(np.float64)).abs()
        prob_error = prob_error + EPS32 * lse.abs()
        rounding = HALF_UNIT_ROUNDOFF if p.dtype == "float16" else EPS32
        d_probs = dout64 @ v64.transpose(-2, -1)                                            # dP
        delta = (dout64 * out).sum(-1)
        dout_out = (dout64.abs() * out_abs).sum(-1)                                         # |dO_i| . |O_i|
        ds_error = probs * (prob_error[..., None] * (d_probs.abs() + delta.abs()[..., None])
                            + reduction_tolerance(p.ev) * (dout64.abs() @ v64.abs().transpose(-2, -1)
                                                          + dout_out[..., None])
                            + rounding * dout_out[..., None])                              # E_ij
        ds_abs = (probs * (d_probs - delta[..., None])).abs()
        del d_probs
        k_abs, q_abs = k64.abs(), q64.abs()
        none = np.empty(0)
        return {
            "dq": (leaves[0].grad.numpy(),
                   (self.scale * (ds_error @ k_abs + reduction_tolerance(p.s) * ds_abs @ k_abs)).numpy()),
            "dk": (leaves[1].grad.numpy(),
                   (self.scale * (ds_error.transpose(-2, -1) @ q_abs
                                  + reduction_tolerance(p.l) * ds_abs.transpose(-2, -1) @ q_abs)).numpy()),
            "dv": (leaves[2].grad.numpy(),
                   ((prob_error + reduction_tolerance(p.l))[..., None] * probs).transpose(-2, -1).matmul(
                       dout64.abs()).numpy()),
            "stored_out": (stored_out, none), "stored_lse": (lse.numpy().astype(np.float32), none)}

    def _guarded_bytes(self, values: np.ndarray) -> np.ndarray:
        out = np.full(values.size + 2 * self.guard, MASK_GUARD_BYTE, np.uint8)
        out[self.guard:self.guard + values.size] = values.ravel()
        return out

    # -- binding -------------------------------------------------------------------------------------
    def bind(self, plan: Plan) -> AttentionBinding:
        data = self._prepare()
        up = self.device.upload
        names = ("q", "k", "v", "mask") + (("out", "lse") if self.problem.direction == "fwd"
                                            else ("dout", "out", "lse", "dq", "dk", "dv", "delta"))
        buffers = {}
        for name in names:
            source = data.get(f"{name}_nan", data.get(name))
            buffers[name] = None if source is None else up(source)
        return AttentionBinding(self, plan, buffers)

    def operands(self, buffers: dict[str, Any]) -> AttentionOperands:
        """The plan's operands on ``buffers`` (each at the guard's offset, contiguous; the mask broadcast
        over the heads)."""
        p, shapes, g = self.problem, self.shapes, self.guard
        dtype = p.dtype

        def operand(name: str, kind: str = dtype) -> Operand | None:
            buffer = buffers.get(name)
            if buffer is None:
                return None
            strides = _contiguous_strides(shapes[name])
            if name == "mask":
                strides = (strides[0], 0, strides[2], strides[3])
                kind = "bool" if p.mask == "bool" else dtype
            elif name in ("lse", "delta"):
                strides, kind = (1,), "float32"
            return Operand(buffer, g, strides, kind)

        return AttentionOperands(q=operand("q"), k=operand("k"), v=operand("v"), out=operand("out"),
                                 lse=operand("lse"), mask=operand("mask"), dout=operand("dout"),
                                 delta=operand("delta"), dq=operand("dq"), dk=operand("dk"), dv=operand("dv"))

    def compare(self, name: str, out: np.ndarray) -> str | None:
        """Check a downloaded guarded output buffer ``name`` (out, lse, dq, dk or dv); None when correct."""
        data = self._prepare()
        expected, tolerance = data["expected"][name], data["tolerance"][name]
        case = f"{name}, {self.problem.direction}"
        if self.problem.dtype == "float16" and name != "lse":
            tolerance = half_output_tolerance(expected, tolerance)
            case += ", float16"
        return compare_guarded(out, self.guard, expected, tolerance, case)


class AttentionBinding:
    """An attention plan on its own guarded buffers (see :class:`AttentionHarness`)."""

    def __init__(self, harness: AttentionHarness, plan: Plan, buffers: dict[str, Any]):
        self.harness = harness
        self.plan = plan
        self.buffers = buffers
        self.ops = harness.operands(buffers)

    def launch(self) -> list[Any]:
        return self.plan.run(self.ops, self.harness.scale)

    def check(self) -> str | None:
        h = self.harness
        data = h._prepare()
        device = h.device
        outputs = ("out", "lse") if h.problem.direction == "fwd" else ("dq", "dk", "dv")
        self.launch()
        device.synchronize()
        for name in outputs:
            initial = data[f"{name}_nan"]
            message = h.compare(name, device.download(self.buffers[name], initial.shape, initial.dtype))
            if message:
                return message
        if "delta" in self.buffers:   # the workspace: its contents are free, its guards are not
            message = self._guards_intact("delta", data["delta_nan"])
            if message:
                return message
        inputs = ("q", "k", "v", "mask") + (("dout", "out", "lse") if h.problem.direction == "bwd" else ())
        return modified_input(device, ((name, self.buffers.get(name), data.get(name)) for name in inputs))

    def _guards_intact(self, name: str, initial: np.ndarray) -> str | None:
        g = self.harness.guard
        after = self.harness.device.download(self.buffers[name], initial.shape, initial.dtype).view(np.uint32)
        before = initial.view(np.uint32)
        for side, region in (("before", slice(0, g)), ("after", slice(initial.size - g, initial.size))):
            touched = int(np.count_nonzero(after[region] != before[region]))
            if touched:
                return f"wrote {touched} element(s) into the guard region {side} the {name} workspace"
        return None

    def release(self) -> None:
        for buffer in self.buffers.values():
            if buffer is not None:
                buffer.release()
