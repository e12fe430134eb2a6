"""``scaled_dot_product_attention`` on the fused ``attention_flash`` kernels: forward and gradients against
CPU torch in float64 over odd head dims, lengths that are not multiples of the tiles, L != S, causal
masks, boolean and additive masks that broadcast, non-contiguous inputs and empty ones; which calls take
the fused path and which keep the math decomposition; float16; the overrideable ops' errors."""

from __future__ import annotations

import collections
import traceback

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tunecl.backend
from tunecl import config

FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


@pytest.fixture(autouse=True)
def fused_training(monkeypatch):
    """Calls that need gradients take the fused kernels here on any device (a CPU device trains on the math
    path otherwise: ``tunecl.kernels.attention.math_for_training``), so the fused backward is what is tested."""
    from tunecl.kernels import attention

    monkeypatch.setattr(attention, "math_for_training", lambda *args: False)


def _run(q, k, v, *, mask=None, causal=False, scale=None, view=None, dtype=torch.float32, **kwargs):
    """Output and q/k/v gradients on the device (``dtype``, through ``view`` if given) and on the CPU in
    float64, for the same upstream gradient."""
    view = view or (lambda t: t)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    mask64 = None if mask is None or mask.dtype == torch.bool else mask.double()
    expected = F.scaled_dot_product_attention(*(view(t) for t in leaves64),
                                              attn_mask=mask if mask64 is None else mask64, is_causal=causal,
                                              scale=scale, **kwargs)
    upstream = torch.randn(expected.shape, dtype=torch.float64)
    expected.backward(upstream)
    leaves = [t.to(dtype).to("opencl").requires_grad_() for t in (q, k, v)]
    dev_mask = None if mask is None else mask.to(torch.bool if mask.dtype == torch.bool else dtype).to("opencl")
    actual = F.scaled_dot_product_attention(*(view(t) for t in leaves), attn_mask=dev_mask, is_causal=causal,
                                            scale=scale, **kwargs)
    actual.backward(upstream.to(dtype).to("opencl"))
    return (expected.detach(), [t.grad for t in leaves64]), (actual.detach().cpu().double(),
                                                              [t.grad.cpu().double() for t in leaves])


def _check(q, k, v, atol=1e-5, rtol=1e-5, **kwargs):
    (out64, grads64), (out, grads) = _run(q, k, v, **kwargs)
    assert out.shape == out64.shape
    torch.testing.assert_close(out, out64, atol=atol, rtol=rtol)
    for name, got, want in zip("qkv", grads, grads64):
        torch.testing.assert_close(got, want, atol=4 * atol, rtol=4 * rtol, msg=lambda m, n=name: f"d{n}: {m}")


def _qkv(b, h, length, keys, e, ev=None):
    return torch.randn(b, h, length, e), torch.randn(b, h, keys, e), torch.randn(b, h, keys, ev or e)


# (batch, heads, L, S, head dim): every head dim and length named in the issue, each at least once
SHAPES = [
    (1, 1, 1, 1, 1), (2, 3, 7, 65, 1), (1, 6, 65, 7, 24), (3, 2, 130, 130, 24), (1, 1, 7, 130, 64),
    (2, 3, 65, 65, 80), (1, 1, 130, 7, 128), (6, 1, 1, 65, 128),
]


@pytest.mark.parametrize("b,h,length,keys,e", SHAPES)
def test_fused_forward_and_gradients(strict, fresh_stats, b, h, length, keys, e):
    _check(*_qkv(b, h, length, keys, e))
    ops = fresh_stats()["ops"]
    from tunecl.backend import compile as compiled

    assert (ops[FUSED], ops[FUSED_BACKWARD]) == (1, 1), compiled.stats()


@pytest.mark.parametrize("length,keys", [(7, 65), (65, 7), (130, 130), (1, 7), (65, 1)])
def test_causal_is_top_left_aligned(strict, fresh_stats, length, keys):
    _check(*_qkv(2, 3, length, keys, 24), causal=True)
    assert fresh_stats()["ops"][FUSED] == 1


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", [(65, 130), (2, 1, 65, 130), (1, 3, 1, 130), (2, 3, 65, 130)])
def test_masks_that_broadcast(strict, fresh_stats, kind, shape):
    if kind == "bool":
        mask = torch.rand(shape) > 0.4
        mask[..., 0] = True
    else:
        mask = torch.randn(shape)
    _check(*_qkv(2, 3, 65, 130, 24), mask=mask)
    assert fresh_stats()["ops"][FUSED] == 1


def test_rows_without_keys_give_zeros(strict):
    """A row whose keys are all masked out is 0, with zero gradients, as torch's math path gives."""
    mask = torch.rand(7, 65) > 0.5
    mask[3] = False
    float_mask = torch.zeros(7, 65).masked_fill(~mask, float("-inf"))
    for m in (mask, float_mask):
        (out64, _), (out, grads) = _run(*_qkv(1, 2, 7, 65, 24), mask=m)
        assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))
        assert torch.equal(grads[0][:, :, 3], torch.zeros_like(grads[0][:, :, 3]))
        torch.testing.assert_close(out, out64, atol=1e-5, rtol=1e-5)


def test_scale_value_dim_and_batch_dims(strict, fresh_stats):
    q, k, v = torch.randn(2, 3, 7, 24), torch.randn(2, 3, 65, 24), torch.randn(2, 3, 65, 80)
    _check(q, k, v, scale=0.3)
    _check(q[0], k[0], v[0])                                          # 3-D: (heads, L, E)
    _check(q[0, 0], k[0, 0], v[0, 0], causal=True)                    # 2-D
    _check(q.view(2, 3, 1, 7, 24), k.view(2, 3, 1, 65, 24), v.view(2, 3, 1, 65, 80))   # 5-D
    assert fresh_stats()["ops"][FUSED] == 4


def test_non_contiguous_inputs(strict, fresh_stats):
    """The (B, L, H, E) projections viewed as (B, H, L, E), as multi-head attention passes them, and
    every other element of the head dim: read in place, through their strides."""
    x = torch.randn(2, 65, 3, 48)
    _check(x, x * 0.5, x.flip(0), view=lambda t: t.transpose(1, 2)[..., ::2], causal=True)
    assert fresh_stats()["ops"][FUSED] == 1


@pytest.mark.parametrize("b,length,keys", [(0, 7, 7), (2, 0, 7), (2, 7, 0)])
def test_empty_inputs(strict, b, length, keys):
    """An empty batch or query length gives an empty output; no keys give zeros (torch's math path)."""
    q, k, v = _qkv(b, 3, length, keys, 24)
    (out64, grads64), (out, grads) = _run(q, k, v)
    assert out.shape == out64.shape
    torch.testing.assert_close(out, out64)
    for got, want in zip(grads, grads64):
        torch.testing.assert_close(got, want)


@config.override(random="host")
def test_math_path_keeps_dropout_grouped_heads_and_a_trainable_mask(strict, fresh_stats):
    """Dropout drawn on the host (a CPU device's default) takes the math path; with device draws it runs
    fused (tests/torch/test_sdpa_dropout.py)."""
    q, k, v = _qkv(2, 4, 7, 9, 8)
    dq, dk, dv = (t.to("opencl") for t in (q, k, v))
    out = F.scaled_dot_product_attention(dq, dk, dv, dropout_p=0.5)
    assert out.shape == (2, 4, 7, 8)
    _check(q, k[:, :2], v[:, :2], enable_gqa=True)
    bias = torch.randn(7, 9, requires_grad=True)
    dev_bias = bias.detach().to("opencl").requires_grad_()
    F.scaled_dot_product_attention(dq, dk, dv, attn_mask=dev_bias).sum().backward()
    assert dev_bias.grad is not None
    with sdpa_kernel([SDPBackend.MATH]):
        _check(q, k, v)
    assert FUSED not in fresh_stats()["ops"]


def test_fused_sdp_choice(strict):
    q, k, v = (t.to("opencl") for t in _qkv(1, 2, 7, 9, 8))
    assert torch._fused_sdp_choice(q, k, v) == int(SDPBackend.OVERRIDEABLE)
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.1) == int(SDPBackend.MATH)


def test_float16_computes_in_float32(strict, fresh_stats):
    q, k, v = _qkv(2, 3, 65, 33, 24)
    q, k, v = (t.half().float() for t in (q, k, v))   # inputs exact in float16
    (out64, grads64), (out, grads) = _run(q, k, v, dtype=torch.float16, causal=True)
    torch.testing.assert_close(out, out64, atol=2e-3, rtol=2e-3)
    for got, want in zip(grads, grads64):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    assert fresh_stats()["ops"][FUSED] == 1


def test_overrideable_op_errors_are_clear(strict):
    fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    q = torch.randn(1, 2, 7, 8, device="opencl")
    with pytest.raises(RuntimeError, match="4-D"):
        fused(q[0], q[0], q[0])
    with pytest.raises(RuntimeError, match="dropout"):
        fused(q, q, q, dropout_p=-0.5)
    with pytest.raises(RuntimeError, match="does not broadcast"):
        fused(q, q, q, torch.zeros(1, 2, 7, 8, 1, device="opencl")[..., 0][:, :, :3])
    with pytest.raises(RuntimeError, match="head dims"):
        fused(torch.randn(1, 1, 2, 300, device="opencl"), torch.randn(1, 1, 2, 300, device="opencl"),
              torch.randn(1, 1, 2, 300, device="opencl"))


def test_multihead_attention_training_runs_fused(strict, fresh_stats):
    """nn.MultiheadAttention in training (need_weights=False) calls scaled_dot_product_attention on its
    transposed head views: the fused kernels serve it, forward and backward, as on the CPU."""
    torch.manual_seed(0)
    cpu = torch.nn.MultiheadAttention(24, 3, batch_first=True)
    dev = torch.nn.MultiheadAttention(24, 3, batch_first=True)
    dev.load_state_dict(cpu.state_dict())
    dev.to("opencl")
    x = torch.randn(2, 65, 24)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(65)
    for module, inp in ((cpu, x), (dev, x.to("opencl"))):
        out = module(inp, inp, inp, need_weights=False, attn_mask=causal.to(inp.device), is_causal=True)[0]
        out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), cpu(x, x, x, need_weights=False, attn_mask=causal,
                                                       is_causal=True)[0].detach(), atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    assert tunecl.backend.stats()["ops"][FUSED_BACKWARD] == 1


def test_compiled_attention_runs_fused_forward_and_backward(strict, fresh_stats, monkeypatch):
    """Under torch.compile(backend="tunecl") the traced graph calls the fused op and its backward (the
    op's unused outputs are tensors, which the compiled graph saves for the backward). Each count of the
    backward op keeps its caller's stack (torch and tunecl frames), whichever path counted it (the
    registered kernel or the fallback), which a failure prints. The backend module is imported first: from
    a source tree (no entry point) that is what registers its name."""
    from tunecl.backend import compile as compiled
    from tunecl.backend import counters

    backward_calls = []

    class RecordingCounter(collections.Counter):
        def __setitem__(self, key, value):
            if key == FUSED_BACKWARD:
                backward_calls.append("".join(
                    f"\n    {frame.filename.rsplit('/site-packages/', 1)[-1]}:{frame.lineno} {frame.name}"
                    for frame in traceback.extract_stack()[:-1]
                    if "/torch/" in frame.filename or "/tunecl/" in frame.filename))
            super().__setitem__(key, value)

    monkeypatch.setattr(counters.op_counts, "__class__", RecordingCounter)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    q, k, v = _qkv(2, 3, 7, 9, 8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attend(*leaves).backward()
    dev = [t.to("opencl").requires_grad_() for t in (q, k, v)]
    torch.compile(attend, backend="tunecl")(*dev).backward()
    for got, want in zip(dev, leaves):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-5, rtol=1e-5)
    ops = fresh_stats()["ops"]
    assert (ops[FUSED], ops[FUSED_BACKWARD]) == (1, 1), \
        f"{compiled.stats()}; where the backward op was counted from:" + "\n  ---".join(backward_calls)


def test_the_backward_traces_on_the_meta_device_as_the_kernel_shapes_it(strict):
    """torch.compile traces the fused backward on meta tensors: the op has a Meta kernel on every torch
    (tunecl's where torch has none), whose outputs have the device kernel's shapes, dtypes and strides."""
    from tunecl.backend.ops import sdpa

    assert torch._C._dispatch_has_kernel_for_dispatch_key(FUSED_BACKWARD, "Meta")
    q, k, v = (t.to("opencl") for t in _qkv(2, 3, 7, 9, 8, ev=5))
    out, lse, *rest = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, is_causal=True)
    grad_out = torch.randn(out.shape).to("opencl")
    args = (grad_out, q, k, v, None, [True, True, True, False], out, lse, *rest[:2], 7, 9, 0.0, True, *rest[4:6])
    real = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(*args)
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    for shapes in (sdpa.fused_attention_backward_meta(*meta_args),
                   torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(*meta_args)):
        assert shapes[3] is None and real[3] is None   # (no mask: no mask gradient)
        for got, want in zip(shapes[:3], real[:3]):
            assert got.device.type == "meta"
            assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float"])
def test_repeated_signatures_replay_with_each_calls_tensors(strict, kind):
    """A signature's later calls replay its recorded launches with their own tensors bound: new inputs
    (and a new mask), forward and gradients, match CPU float64 each time. Every call's tensors stay alive,
    so no call's buffers are recycled into the next."""
    alive = []
    for _ in range(3):
        q, k, v = _qkv(2, 3, 37, 29, 16)
        mask = None
        if kind == "bool":
            mask = torch.rand(37, 29) > 0.3
            mask[:, 0] = True
        elif kind == "float":
            mask = torch.randn(2, 1, 37, 29)
        leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
        expected = F.scaled_dot_product_attention(*leaves64, is_causal=kind == "causal", attn_mask=(
            mask.double() if kind == "float" else mask))
        upstream = torch.randn(expected.shape, dtype=torch.float64)
        expected.backward(upstream)
        dev = [t.to("opencl").requires_grad_() for t in (q, k, v)]
        dev_mask = None if mask is None else mask.to("opencl")
        got = F.scaled_dot_product_attention(*dev, is_causal=kind == "causal", attn_mask=dev_mask)
        grad = upstream.float().to("opencl")
        got.backward(grad)
        alive += [*dev, dev_mask, got, grad]
        torch.testing.assert_close(got.detach().cpu().double(), expected.detach(), atol=1e-5, rtol=1e-5)
        for d, c in zip(dev, leaves64):
            torch.testing.assert_close(d.grad.cpu().double(), c.grad, atol=4e-5, rtol=4e-5)


def test_a_repeated_signature_follows_what_changed_between_its_calls(strict, fresh_stats):
    """A signature asks which route it takes once and runs pre-built from its second call; what can change
    between calls of the same layouts still changes the route or the call: torch's backend flags, a mask
    that now needs a gradient, another storage offset, another dtype. Each result against CPU float64."""
    q, k, v = _qkv(1, 2, 9, 11, 8)
    mask = torch.randn(9, 11)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    dev = [t.to("opencl") for t in (q, k, v)]
    dev_mask = mask.to("opencl")

    def fused_calls():
        return fresh_stats()["ops"].get(FUSED, 0)

    def check(got, atol=1e-5):
        torch.testing.assert_close(got.detach().cpu().double(), want, atol=atol, rtol=atol)

    for _ in range(3):
        check(F.scaled_dot_product_attention(*dev, attn_mask=dev_mask))
    assert fused_calls() == 3
    with sdpa_kernel([SDPBackend.MATH]):
        check(F.scaled_dot_product_attention(*dev, attn_mask=dev_mask))
    assert fused_calls() == 3

    trained = mask.double().requires_grad_()
    F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=trained).sum().backward()
    dev_trained = dev_mask.clone().requires_grad_()
    check(F.scaled_dot_product_attention(*dev, attn_mask=dev_trained))
    F.scaled_dot_product_attention(*dev, attn_mask=dev_trained).sum().backward()
    assert fused_calls() == 3
    torch.testing.assert_close(dev_trained.grad.cpu().double(), trained.grad, atol=1e-5, rtol=1e-5)

    # the same shapes and strides one element into a storage: the offset is part of the signature
    shifted = torch.zeros(q.numel() + 1, device="opencl")
    shifted[1:] = dev[0].flatten()
    for _ in range(2):
        check(F.scaled_dot_product_attention(shifted[1:].view(q.shape), *dev[1:], attn_mask=dev_mask))
    assert fused_calls() == 5
    half = [t.half() for t in dev]
    for _ in range(2):
        got = F.scaled_dot_product_attention(*half, attn_mask=dev_mask.half())
        assert got.dtype == torch.float16
        check(got, atol=2e-2)
    assert fused_calls() == 7
