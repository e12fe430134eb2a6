"""``scaled_dot_product_attention`` with dropout on the fused kernels (device draws, ``TUNECL_RANDOM=device``):
the output and q/k/v gradients against CPU torch in float64 with the keep mask the kernels draw (a keyed
Bernoulli draw of the contiguous (B*H, L, S) mask under the same key), over odd lengths, L != S, causal
and broadcast masks, non-contiguous inputs, float16 and the probabilities 0.1, 0.5 and 1; the keep rate,
fresh masks per call and ``torch.manual_seed`` reproducing them; and the calls that keep the math path
(host draws, graph captures, ``_fused_sdp_choice``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

import tunecl.backend
from tunecl import config
from tunecl.backend import memory, random_draws, state

FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


@pytest.fixture(autouse=True)
def device_draws(monkeypatch):
    """Dropout drawn on the device, and calls that need gradients on the fused kernels (a CPU device draws
    on the host and trains on the math path otherwise), so the fused dropout is what is tested."""
    from tunecl.kernels import attention

    monkeypatch.setattr(attention, "math_for_training", lambda *args: False)
    with config.override(random="device"):
        yield


def _keep_mask(key: int, shape: tuple[int, ...], keep: float) -> torch.Tensor:
    """The kernels' keep decisions under ``key`` for scores of ``shape`` (B, H, L, S), as float64 0/1."""
    mask = memory.empty_contiguous(shape, torch.bool)
    state.get().random.bernoulli_keyed(memory.buffer_of(mask), mask.storage_offset(), mask.numel(), keep, key, "bool")
    return mask.cpu().double()


def _check(q, k, v, p, *, mask=None, causal=False, view=None, dtype=torch.float32, seed=11, atol=1e-5):
    """The device's output and gradients with dropout ``p`` against float64 CPU torch computing the same
    dropout (the mask drawn under the key the call drew: the first number drawn after ``seed``)."""
    view = view or (lambda t: t)
    leaves = [t.to(dtype).to("opencl").requires_grad_() for t in (q, k, v)]
    dev_mask = None if mask is None else mask.to(torch.bool if mask.dtype == torch.bool else dtype).to("opencl")
    torch.manual_seed(seed)
    actual = F.scaled_dot_product_attention(*(view(t) for t in leaves), attn_mask=dev_mask, is_causal=causal,
                                            dropout_p=p)
    upstream = torch.randn(actual.shape, dtype=torch.float64)
    actual.backward(upstream.to(dtype).to("opencl"))
    torch.manual_seed(seed)
    key = random_draws.key()

    leaves64 = [t.to(dtype).double().requires_grad_() for t in (q, k, v)]
    q64, k64, v64 = (view(t) for t in leaves64)
    scores = q64 @ k64.transpose(-1, -2) / q64.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    probs = torch.softmax(scores, -1)
    keep = _keep_mask(key, tuple(probs.shape), 1.0 - p)   # (B, H, L, S): the inputs here are 4-D
    expected = (probs * keep / (1.0 - p) if p < 1 else probs * 0.0) @ v64
    expected.backward(upstream)
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach(), atol=atol, rtol=atol)
    for name, got, want in zip("qkv", leaves, leaves64):
        torch.testing.assert_close(got.grad.cpu().double(), want.grad, atol=4 * atol, rtol=4 * atol,
                                   msg=lambda m, n=name: f"d{n}: {m}")
    return keep


def _qkv(b, h, length, keys, e, ev=None):
    return torch.randn(b, h, length, e), torch.randn(b, h, keys, e), torch.randn(b, h, keys, ev or e)


@pytest.mark.parametrize("p", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("b,h,length,keys,e", [(2, 3, 37, 29, 16), (1, 2, 65, 130, 24), (3, 1, 1, 7, 8)])
def test_dropout_forward_and_gradients(strict, fresh_stats, p, b, h, length, keys, e):
    _check(*_qkv(b, h, length, keys, e), p)
    ops = fresh_stats()["ops"]
    assert (ops[FUSED], ops[FUSED_BACKWARD]) == (1, 1)


def test_dropout_with_causality_masks_and_strides(strict, fresh_stats):
    _check(*_qkv(2, 3, 65, 65, 24), 0.2, causal=True)
    bool_mask = torch.rand(1, 3, 65, 130) > 0.4
    bool_mask[..., 0] = True
    _check(*_qkv(2, 3, 65, 130, 24), 0.2, mask=bool_mask)
    _check(*_qkv(2, 3, 65, 130, 24), 0.2, mask=torch.randn(65, 130))
    x = torch.randn(2, 65, 3, 48)   # (B, L, H, E) projections viewed as (B, H, L, E), every other element
    _check(x, x * 0.5, x.flip(0), 0.3, view=lambda t: t.transpose(1, 2)[..., ::2])
    assert fresh_stats()["ops"][FUSED] == 4


def test_a_repeated_signature_draws_its_own_key_each_call(strict, fresh_stats):
    """From a signature's second call on, its forward and backward run pre-built (no checks, no plan lookup,
    outputs allocated in one go): each call still draws a key of its own, and its backward draws the same
    decisions again. Every call against CPU float64 with its own keep mask."""
    q, k, v = _qkv(2, 3, 37, 29, 16)
    mask = torch.randn(37, 29)
    keeps = [_check(q, k, v, 0.3, mask=mask, seed=seed) for seed in (1, 2, 3)]
    assert not torch.equal(keeps[0], keeps[1]) and not torch.equal(keeps[1], keeps[2])
    ops = fresh_stats()["ops"]
    assert (ops[FUSED], ops[FUSED_BACKWARD]) == (3, 3)


def test_dropout_in_float16(strict):
    q, k, v = (t.half().float() for t in _qkv(2, 3, 65, 33, 24))
    _check(q, k, v, 0.25, dtype=torch.float16, atol=1e-2)


def test_masks_keep_at_the_rate_differ_per_call_and_follow_the_seed(strict):
    q, k, v = (t.to("opencl") for t in _qkv(2, 4, 128, 128, 16))
    ones = torch.ones_like(v)

    def kept(seed):   # with v = 1 each output entry is the row's kept probability mass / keep
        torch.manual_seed(seed)
        return F.scaled_dot_product_attention(q, k, ones, dropout_p=0.4).cpu()

    torch.manual_seed(3)
    key = random_draws.key()
    keep = _keep_mask(key, (2, 4, 128, 128), 0.6)
    assert abs(keep.mean().item() - 0.6) < 0.01   # 131072 draws: 9 standard deviations
    first, again, other = kept(3), kept(3), kept(4)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert abs(first.mean().item() - 1.0) < 0.02   # dropout keeps the expected value


def test_host_draws_keep_the_math_path(strict, fresh_stats):
    """With host draws (the CPU's masks, bit for bit, as ``tunecl validate`` wants them) dropout takes
    torch's math path, as it does for ``_fused_sdp_choice`` callers."""
    q, k, v = (t.to("opencl") for t in _qkv(1, 2, 7, 9, 8))
    with config.override(random="host"):
        torch.manual_seed(0)
        got = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(0)
    want = F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), dropout_p=0.5)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    assert FUSED not in fresh_stats()["ops"]
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.1) == int(SDPBackend.MATH)


def test_a_compiled_call_with_dropout_draws_fresh_masks_per_replay(strict):
    """A compiled graph keeps the math path for dropout (its replays draw each mask from the graph's device
    generator), so every replay drops anew."""
    pytest.importorskip("tunecl.backend.compile")   # registers the backend (an installed tunecl has its entry point)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    run = torch.compile(attend, backend="tunecl")
    q, k, v = (t.to("opencl") for t in _qkv(1, 2, 16, 16, 8))
    outs = [run(q, k, v).cpu() for _ in range(4)]
    assert all(not torch.equal(a, b) for a, b in zip(outs, outs[1:]))
    assert all(torch.isfinite(o).all() for o in outs)


def test_overrideable_op_refuses_dropout_out_of_range(strict):
    fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    q = torch.randn(1, 2, 7, 8, device="opencl")
    with pytest.raises(RuntimeError, match="dropout probability of 1.5"):
        fused(q, q, q, dropout_p=1.5)
    out, _, _, _, _, _, seed, offset, _ = fused(q, q, q, dropout_p=0.5)
    assert seed.device.type == "cpu" and seed.dtype == torch.int64 and seed.dim() == 0
    assert tunecl.backend.stats()["ops"][FUSED] >= 1
