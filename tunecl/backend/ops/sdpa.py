"""``scaled_dot_product_attention`` on the device: the fused ``attention_flash`` kernels where they apply,
torch's math decomposition (matmuls and softmax on the device's kernels) otherwise.

torch picks a fused SDPA backend through a C++ dispatch stub that a Python backend cannot fill, so the op
is taken over on ``AutogradPrivateUse1`` (it is CompositeImplicitAutograd): :func:`scaled_dot_product_attention`
calls ``_scaled_dot_product_fused_attention_overrideable`` (torch's op for a backend's own fused
attention, with its autograd formula calling the ``_backward`` op) when :func:`fused_reason` finds
nothing against it, else torch's own decomposition. The fused path takes float32 or float16 q/k/v with
equal batch dims and head dims up to 256, any strides, ``is_causal``, a boolean or additive mask that
broadcasts to (..., L, S) and does not need a gradient, ``scale``, and dropout where random numbers are
drawn on the device (``TUNECL_RANDOM``, :func:`tunecl.kernels.attention.dropout_on_device`) outside a
graph capture and a compiler's trace. Grouped-query heads (``enable_gqa`` with fewer key heads), nested
tensors, a mask that requires grad, dropout with host draws (the CPU's masks) or inside a capture or a
trace (where the graph's device generator draws each replay's mask), and
``torch.nn.attention.sdpa_kernel`` without ``SDPBackend.OVERRIDEABLE`` take the math path; so does a
call that needs gradients on a device where the fused backward is the slower one
(:func:`tunecl.kernels.attention.math_for_training`: CPU devices, and GPUs from 256 x 256 scores per
head; scores of up to 256 MiB) unless
``sdpa_kernel`` leaves out ``SDPBackend.MATH``.
``_fused_sdp_choice`` answers the same choice for callers that ask it directly; it gives MATH for dropout,
since such callers (a compiler's trace) may replay the call from a graph.

Dropout's keep decisions are drawn inside the kernels (Philox under a 64-bit key drawn from torch's CPU
generator, as eager dropout's masks are: ``torch.manual_seed`` reproduces them) and drawn again by the
backward, so no mask is stored. The key travels from the forward to the backward as the op's
``philox_seed`` output, a 0-dim int64 CPU tensor (as CUDA's fused attention keeps it outside a capture), so
the backward reads it without waiting for the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from tunecl.backend import graphs, memory, plans, random_draws, state
from tunecl.backend.operands import buffers_of, layout_key, operand
from tunecl.errors import Unsupported
from tunecl.kernels import attention as family
from tunecl.kernels import launches
from tunecl.kernels.attention import AttentionOperands
from tunecl.kernels.strided import Operand
from tunecl.problems import AttentionProblem

_sdpa = torch.ops.aten.scaled_dot_product_attention.default
_fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default


def fused_reason(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                 dropout_p: float, is_causal: bool, enable_gqa: bool = False) -> str | None:
    """Why these arguments take the math path, or None when the fused kernels compute them (the shapes and
    dtypes are :func:`tunecl.kernels.attention.unsupported`'s to judge)."""
    if not torch._C._get_overrideable_sdp_enabled():
        return "SDPBackend.OVERRIDEABLE is disabled (torch.nn.attention.sdpa_kernel)"
    tensors = (query, key, value) + (() if attn_mask is None else (attn_mask,))
    if any(t.is_nested for t in tensors) or any(t.device.type != "opencl" for t in tensors):
        return "nested or non-opencl tensors"
    return family.unsupported(query.shape, key.shape, value.shape, [_name(t.dtype) for t in (query, key, value)],
                              None if attn_mask is None else attn_mask.shape,
                              None if attn_mask is None else _name(attn_mask.dtype),
                              attn_mask is not None and attn_mask.requires_grad, dropout_p, is_causal)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """(..., rows, cols) as (B, H, rows, cols): leading dims added or folded into B (a view where
    the strides allow one, as ``reshape``)."""
    if t.dim() == 4:
        return t
    if t.dim() < 4:
        return t.view((1,) * (4 - t.dim()) + tuple(t.shape))
    return t.reshape(-1, *t.shape[-3:])


def _dropout_fused(query: torch.Tensor) -> bool:
    """Whether a call with dropout may take the fused kernels now: draws on the device, and neither a graph
    capture (its replays draw from the graph's generator) nor a compiler's trace (fake tensors) running."""
    return (family.dropout_on_device(state.get().device.fingerprint.device_type, random_draws.mode())
            and not graphs.capturing() and not _fake(query))


def _fake(t: torch.Tensor) -> bool:
    return torch._subclasses.fake_tensor.is_fake(t) or torch._C._functorch.is_functorch_wrapped_tensor(t) \
        or torch._is_functional_tensor(t)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch's op on ``AutogradPrivateUse1``: the fused kernels through the overrideable op (whose
    autograd formula runs the fused backward), or torch's decomposition."""
    route = _route_key(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    fused = _routes.get(route) if route is not None else None
    if fused is None:
        fused = fused_reason(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) is None
        if route is not None:
            _routes.keep(route, fused, MAX_CALLS)
    if not fused or (dropout_p > 0.0 and not _dropout_fused(query)) or (
            torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
            and torch._C._get_math_sdp_enabled()
            and family.math_for_training(state.get().device.fingerprint.device_type, query.shape, key.shape)):
        return _sdpa.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                               enable_gqa=enable_gqa)
    shape = (*query.shape[:-1], value.shape[-1])
    mask = None
    if attn_mask is not None:
        mask = _as_4d(attn_mask.expand(*query.shape[:-1], key.shape[-2]))
    out = _fused(_as_4d(query), _as_4d(key), _as_4d(value), mask, dropout_p, is_causal, False, scale=scale)[0]
    return out if query.dim() == 4 else out.reshape(shape)


def _route_key(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
               dropout_p: float, is_causal: bool, enable_gqa: bool) -> tuple | None:
    """What :func:`fused_reason` depends on (see :data:`_routes`): the operands' layouts and devices, the
    mask's ``requires_grad``, the arguments and torch's OVERRIDEABLE flag; None for nested tensors (their
    calls ask :func:`fused_reason` each time)."""
    if query.is_nested or key.is_nested or value.is_nested:
        return None
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    return (*map(layout_key, tensors), *(t.device.type for t in tensors), attn_mask is not None
            and attn_mask.requires_grad, dropout_p, is_causal, enable_gqa, torch._C._get_overrideable_sdp_enabled())


# Whether the fused kernels compute a call (fused_reason finds nothing against them), by _route_key: a
# signature asks fused_reason once
_routes = plans.SignatureCalls()


def fused_sdp_choice(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *,
                     scale: float | None = None, enable_gqa: bool = False) -> int:
    """``_fused_sdp_choice``: OVERRIDEABLE where the fused kernels apply, else MATH (and MATH for dropout:
    see the module docstring)."""
    reason = fused_reason(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    return int(SDPBackend.MATH if reason is not None or dropout_p > 0.0 else SDPBackend.OVERRIDEABLE)


# -- the overrideable ops ----------------------------------------------------------------------------
def _check_4d(name: str, *tensors: torch.Tensor | None) -> None:
    for t in tensors:
        if t is not None and t.dim() != 4:
            raise RuntimeError(f"{name}: expected 4-D (batch, heads, length, head dim) tensors, got {t.dim()}-D")


def _problem(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
             is_causal: bool, direction: str) -> AttentionProblem:
    return family.problem_of(query.shape, key.shape, value.shape, _name(query.dtype),
                             None if mask is None else _name(mask.dtype), is_causal, direction)


def _strided(t: torch.Tensor, shape: Sequence[int]) -> Operand:
    """``t`` as the kernels read it: (b, h, row, column) strides, 0 where ``t`` broadcasts to ``shape``."""
    base = operand(t)
    strides = tuple(0 if n == 1 and want != 1 else s for n, s, want in zip(t.shape, base.strides, shape))
    return base._replace(strides=strides)


def _like_query(query: torch.Tensor, last: int) -> torch.Tensor:
    """An output of ``query``'s shape with last dim ``last``, laid out in ``query``'s dim order (as
    torch's meta kernel of the op allocates it)."""
    shape = (*query.shape[:-1], last)
    if tuple(query.shape) == shape:
        return torch.empty_like(query)
    order = sorted(range(4), key=lambda i: query.stride()[i], reverse=True)
    strides = [0] * 4
    step = 1
    for i in reversed(order):
        strides[i] = step
        step *= shape[i]
    return memory.empty(shape, strides, query.dtype)


def _check_inputs(name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  mask: torch.Tensor | None, dropout_p: float, is_causal: bool) -> None:
    _check_4d(name, query, key, value)
    reason = fused_reason(query, key, value, mask, dropout_p, is_causal)
    if reason is not None and not reason.startswith("SDPBackend"):
        raise RuntimeError(f"{name}: the opencl fused attention does not compute {reason}")
    if mask is not None and (mask.dim() != 4 or any(n not in (1, m) for n, m in zip(
            mask.shape, (*query.shape[:-1], key.shape[2])))):
        raise RuntimeError(f"{name}: attn_bias of shape {tuple(mask.shape)} does not broadcast to "
                           f"{(*query.shape[:-1], key.shape[2])}")


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: torch.Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, return_debug_mask: bool = False, *,
                    scale: float | None = None) -> tuple:
    """``_scaled_dot_product_fused_attention_overrideable`` on 4-D float32/float16 tensors: (output, row
    log-sum-exp (B, H, L) float32, then the op's other outputs: with dropout, ``philox_seed`` holds the key
    the backward draws the same decisions under, as a 0-dim int64 CPU tensor)."""
    signature = ("fwd", is_causal, scale, dropout_p, *map(layout_key, (query, key, value, attn_bias)),
                 attn_bias is not None and attn_bias.requires_grad)
    call = _seen(signature)
    if call is not None and not (dropout_p and graphs.capturing()):
        (out, lse, *unused), buffers = call.outputs.empty()
        if not dropout_p:
            call.recorded.launches.enqueue(_calls.owner.device.queue,
                                           (*buffers_of((query, key, value, attn_bias)), *buffers[:2]))
        else:
            dropout = _draw(dropout_p, unused)
            call.plan.run(_forward_operands(query, key, value, attn_bias, out, lse), call.scale, dropout)
        return out, lse, unused[0], unused[1], call.length, call.keys, unused[2], unused[3], unused[4]
    name = "_scaled_dot_product_fused_attention_overrideable"
    _check_inputs(name, query, key, value, attn_bias, dropout_p, is_causal)
    if dropout_p > 0.0 and graphs.capturing():
        raise RuntimeError(f"{name}: the opencl fused attention draws no dropout inside a graph capture "
                           "(scaled_dot_product_attention takes the math path there)")
    batch, heads, length, e = query.shape
    keys = key.shape[2]
    out = _like_query(query, value.shape[3])
    lse = memory.empty_contiguous((batch, heads, length), torch.float32)
    # (cum_seq_q/k, philox seed/offset and the debug mask are unused without dropout: empty tensors, since
    # a compiled graph saves them for the backward and wants tensors there)
    unused = [memory.empty_contiguous((0,), torch.int64) for _ in range(5)]
    dropout = _draw(dropout_p, unused) if dropout_p > 0.0 else None
    if out.numel() and keys:
        _run_plan(signature, lambda: _problem(query, key, value, attn_bias, is_causal, "fwd"),
                  lambda: _forward_operands(query, key, value, attn_bias, out, lse), _scale(scale, e), dropout,
                  (query, key, value, attn_bias, out, lse), (out, lse, *unused), (length, keys))
    elif out.numel():   # no keys: every row attends to nothing (torch's math path gives 0)
        out.zero_()
        lse.fill_(float("-inf"))
    return out, lse, unused[0], unused[1], length, keys, unused[2], unused[3], unused[4]


def _draw(dropout_p: float, unused: list) -> tuple[float, int]:
    """A call's dropout: (probability, a key drawn now); the key and offset 0 become the op's ``philox_seed``
    and ``philox_offset`` outputs (``unused[2]``, ``unused[3]``), 0-dim int64 CPU tensors."""
    dropout = (float(dropout_p), random_draws.key())
    unused[2], unused[3] = torch.tensor(dropout[1], dtype=torch.int64), torch.tensor(0, dtype=torch.int64)
    return dropout


def _forward_operands(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: torch.Tensor | None,
                      out: torch.Tensor, lse: torch.Tensor) -> AttentionOperands:
    mask = None if attn_bias is None else _strided(attn_bias, (*query.shape[:3], key.shape[2]))
    return AttentionOperands(q=operand(query), k=operand(key), v=operand(value), out=operand(out),
                             lse=operand(lse), mask=mask)


def fused_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attn_bias: torch.Tensor | None, grad_input_mask: Sequence[bool], out: torch.Tensor,
                             logsumexp: torch.Tensor, cum_seq_q: Any, cum_seq_k: Any, max_q: int, max_k: int,
                             dropout_p: float, is_causal: bool, philox_seed: Any, philox_offset: Any, *,
                             scale: float | None = None) -> tuple:
    """``_scaled_dot_product_fused_attention_overrideable_backward``: (grad_query, grad_key, grad_value,
    None); the mask gets no gradient (a mask that needs one takes the math path)."""
    signature = ("bwd", is_causal, scale, dropout_p, *map(layout_key, (grad_out, query, key, value, attn_bias, out,
                                                                      logsumexp)),
                 attn_bias is not None and attn_bias.requires_grad, tuple(grad_input_mask))
    call = _seen(signature)
    if call is not None and (not dropout_p or isinstance(philox_seed, torch.Tensor) and philox_seed.numel() == 1):
        (*grads, delta), buffers = call.outputs.empty()
        if not dropout_p:
            call.recorded.launches.enqueue(_calls.owner.device.queue, (
                *buffers_of((query, key, value, attn_bias, grad_out, out, logsumexp)), buffers[3], *buffers[:3]))
        else:
            call.plan.run(_backward_operands(query, key, value, attn_bias, grad_out, out, logsumexp, delta, grads),
                          call.scale, (float(dropout_p), int(philox_seed)))
        return (*grads, None)
    name = "_scaled_dot_product_fused_attention_overrideable_backward"
    _check_inputs(name, query, key, value, attn_bias, dropout_p, is_causal)
    if len(grad_input_mask) > 3 and grad_input_mask[3]:
        raise RuntimeError(f"{name}: the opencl fused attention computes no attn_bias gradient")
    batch, heads, length, e = query.shape
    keys = key.shape[2]
    grads = [torch.empty_like(t) for t in (query, key, value)]
    if grad_out.dtype != query.dtype or tuple(grad_out.shape) != tuple(out.shape):
        raise RuntimeError(f"{name}: grad_out of {grad_out.dtype} {tuple(grad_out.shape)} for an output of "
                           f"{out.dtype} {tuple(out.shape)}")
    if not (length and keys and batch * heads):
        for g in grads:
            g.zero_()
        return (*grads, None)
    if logsumexp.dtype != torch.float32 or tuple(logsumexp.shape) != (batch, heads, length) \
            or not logsumexp.is_contiguous():
        raise RuntimeError(f"{name}: logsumexp must be the forward's contiguous float32 (batch, heads, length)")
    dropout = None
    if dropout_p > 0.0:
        if not isinstance(philox_seed, torch.Tensor) or philox_seed.numel() != 1:
            raise RuntimeError(f"{name}: with dropout, philox_seed must be the forward's one-element key tensor")
        dropout = (float(dropout_p), int(philox_seed))
    delta = memory.empty_contiguous((batch, heads, length), torch.float32)

    _run_plan(signature, lambda: _problem(query, key, value, attn_bias, is_causal, "bwd"),
              lambda: _backward_operands(query, key, value, attn_bias, grad_out, out, logsumexp, delta, grads),
              _scale(scale, e), dropout, (query, key, value, attn_bias, grad_out, out, logsumexp, delta, *grads),
              (*grads, delta), ())
    return (*grads, None)


def _backward_operands(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: torch.Tensor | None,
                       grad_out: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor, delta: torch.Tensor,
                       grads: Sequence[torch.Tensor]) -> AttentionOperands:
    mask = None if attn_bias is None else _strided(attn_bias, (*query.shape[:3], key.shape[2]))
    return AttentionOperands(q=operand(query), k=operand(key), v=operand(value), out=operand(out),
                             lse=operand(logsumexp), mask=mask, dout=operand(grad_out), delta=operand(delta),
                             dq=operand(grads[0]), dk=operand(grads[1]), dv=operand(grads[2]))


# -- pre-built calls ----------------------------------------------------------------------------------
# A call whose signature (each operand's shape, strides, storage offset and dtype, causality, scale, the
# dropout probability, the mask's requires_grad, the backward's grad_input_mask, and the precisions torch's
# flags accept) ran before passed the checks then: it allocates its outputs as laid out then, in one go, and
# runs the plan found then, with no check, problem or plan lookup again. Without dropout it runs the plan's
# launches as recorded on the signature's first call, with this call's buffers bound
# (kernels.launches.RecordedRun), so no operands or meta are built either; with dropout, whose key changes
# every call, it runs the plan on this call's operands.
MAX_CALLS = 256
_calls = plans.SignatureCalls()


class _Call:
    """A pre-built call: its plan and scale, and once a call of it ran, its outputs' layouts and the
    forward's integer outputs (its query and key lengths); without dropout, the plan's recorded launches."""

    __slots__ = ("keys", "length", "outputs", "plan", "recorded", "scale")

    def __init__(self, plan: Any, scale: float) -> None:
        self.plan, self.scale, self.recorded = plan, scale, launches.RecordedRun()
        self.outputs: memory.Layouts | None = None
        self.length = self.keys = 0


def _seen(signature: tuple) -> _Call | None:
    """The pre-built call of ``signature`` once a call of it ran (without dropout: once its launches were
    recorded), else None (the general route)."""
    call = _calls.lookup((*signature, plans.accepted_precisions("attention")))
    return call if call is not _calls and call is not None and call.outputs is not None else None


def _run_plan(signature: tuple, problem_of: Callable[[], AttentionProblem],
              operands: Callable[[], AttentionOperands], scale: float, dropout: tuple[float, int] | None,
              roles: tuple, outputs: tuple, extra: tuple) -> None:
    """Run the problem's plan on the operands, without dropout by the recorded launches of the call's
    ``signature`` where it has them (``roles``: the call's tensors in the order the recording binds them).
    Once a call ran (without dropout: once its launches are recorded), the signature's later calls take
    :func:`_seen`'s route with ``outputs``' layouts (and ``extra``, the forward's query and key lengths)."""
    key = (*signature, plans.accepted_precisions("attention"))
    call = _calls.lookup(key)
    if call is _calls:
        call = _calls.keep(key, _Call(state.get().plan(problem_of()), scale) if _calls.prebuilds else None,
                           MAX_CALLS)
    if call is None:
        state.get().plan(problem_of()).run(operands(), scale, dropout)
        return
    plan = call.plan
    if dropout is None:
        call.recorded(_calls.owner.device, buffers_of(roles), lambda: plan.run(operands(), scale))
        if not call.recorded.launches:
            return
    else:
        plan.run(operands(), scale, dropout)
    if call.outputs is None:
        call.outputs = memory.Layouts([(t.shape, t.stride(), t.dtype) for t in outputs])
        call.length, call.keys = extra or (0, 0)


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / head_dim ** 0.5 if scale is None else float(scale)


def _never_unsupported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The overrideable ops have no CPU kernel to fall back to: a case the kernels cannot run is an error."""
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Unsupported as why:
            raise RuntimeError(f"opencl fused attention: {why}") from None
    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def fused_attention_backward_meta(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
    """The backward's outputs as :func:`fused_attention_backward` shapes them, on the meta device: what
    ``torch.compile`` traces with. torch releases without a Meta kernel for the op (2.11) otherwise trace by
    running the device kernel on zero-filled inputs, which computes it once more per compile."""
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), None


KERNELS: dict[str, Callable[..., Any]] = {
    "_fused_sdp_choice": fused_sdp_choice,
    "_scaled_dot_product_fused_attention_overrideable": _never_unsupported(fused_attention),
    "_scaled_dot_product_fused_attention_overrideable_backward": _never_unsupported(fused_attention_backward),
}
AUTOGRAD_KERNELS: dict[str, Callable[..., Any]] = {
    "scaled_dot_product_attention": scaled_dot_product_attention,
}
# registered where torch has none of its own
META_KERNELS: dict[str, Callable[..., Any]] = {
    "_scaled_dot_product_fused_attention_overrideable_backward": fused_attention_backward_meta,
}
