"""Attention on the device: ``scaled_dot_product_attention`` (torch's math decomposition, forward and
backward), ``nn.MultiheadAttention``'s inference fast path ``_native_multi_head_attention`` and
``nn.TransformerEncoderLayer``'s ``_transformer_encoder_layer_fwd``, against CPU torch over odd shapes and
every mask form, with the CPU fallback forbidden."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op
from torch import nn

from tunecl import config

mha = torch.ops.aten._native_multi_head_attention.default


# -- scaled_dot_product_attention ------------------------------------------------------------------------
SDPA_SHAPES = [(2, 3, 5, 7, 8), (1, 1, 1, 1, 1), (3, 2, 9, 4, 5), (2, 4, 17, 17, 16)]   # B, H, L, S, E


@pytest.mark.parametrize("b,h,length,keys,e", SDPA_SHAPES)
@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
def test_sdpa_forward_and_backward(b, h, length, keys, e, mask):
    q, k, v = torch.randn(b, h, length, e), torch.randn(b, h, keys, e), torch.randn(b, h, keys, e + 1)
    if mask == "bool":
        keep = torch.rand(length, keys) > 0.3
        keep[:, 0] = True   # (a row with no key would be NaN on CPU and on the device)
        check_op(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, keep)
    elif mask == "float":
        bias = torch.randn(b, 1, length, keys)
        check_op(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bias)
    else:
        causal = mask == "causal"
        check_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v)


def test_sdpa_scale_grouped_query_heads_and_strided_inputs():
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 3)
    check_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True), q, k, v)
    # (B, L, H, E) projections viewed as (B, H, L, E), as the transformers' attention layers pass them
    x = torch.randn(2, 9, 3, 4)
    view = lambda t: t.transpose(1, 2)
    check_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             Input(x, view), Input(x * 0.5, view), Input(x.flip(0), view))


def test_sdpa_against_float64_over_a_long_sequence(strict):
    """L = S = 129 (past any 128-wide tile), forward and backward against CPU float64: the device's
    float32 is as close to it as CPU float32 is, to a few ulps."""
    q64, k64, v64 = (torch.randn(2, 2, 129, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    upstream = torch.randn(2, 2, 129, 16, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    expected.backward(upstream)
    for device in ("cpu", "opencl"):
        q, k, v = (t.detach().float().to(device).requires_grad_() for t in (q64, k64, v64))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(upstream.float().to(device))
        torch.testing.assert_close(out.detach().cpu().double(), expected.detach(), atol=2e-6, rtol=1e-5)
        for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
            torch.testing.assert_close(got.cpu().double(), want, atol=1e-5, rtol=1e-5)


# -- _native_multi_head_attention ------------------------------------------------------------------------
def _mha_args(batch: int, length: int, embed: int) -> tuple[torch.Tensor, ...]:
    x = torch.randn(batch, length, embed)
    return (x, torch.randn(3 * embed, embed) / embed ** 0.5, torch.randn(3 * embed),
            torch.randn(embed, embed) / embed ** 0.5, torch.randn(embed))


def _compare(args: tuple, embed: int, heads: int, **kwargs) -> None:
    x, w_qkv, b_qkv, w_out, b_out = args
    mask = kwargs.pop("mask", None)
    with config.override(fallback="error"), torch.no_grad():
        expected = mha(x, x, x, embed, heads, w_qkv, b_qkv, w_out, b_out, mask, **kwargs)
        dev = [a.to("opencl") for a in args]
        actual = mha(dev[0], dev[0], dev[0], embed, heads, *dev[1:],
                     None if mask is None else mask.to("opencl"), **kwargs)
    for e, a in zip(expected, actual):
        assert (e is None) == (a is None)
        if e is not None:
            assert a.device.type == "opencl" and a.shape == e.shape
            torch.testing.assert_close(a.cpu(), e, atol=2e-6, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("batch,length,embed,heads", [(2, 5, 12, 3), (1, 1, 4, 1), (3, 7, 10, 5), (2, 17, 16, 2)])
@pytest.mark.parametrize("weights", ["none", "average", "per_head"])
def test_native_mha_without_mask(strict, batch, length, embed, heads, weights):
    kwargs = {"none": {"need_weights": False}, "average": {},
              "per_head": {"average_attn_weights": False}}[weights]
    _compare(_mha_args(batch, length, embed), embed, heads, **kwargs)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize("mask_type", [0, 1, 2])
def test_native_mha_masks(strict, dtype, mask_type):
    batch, length, embed, heads = 3, 6, 12, 4
    shape = {0: (length, length), 1: (batch, length), 2: (batch, heads, length, length)}[mask_type]
    excluded = torch.rand(shape) > 0.6
    excluded[..., 0] = False
    if mask_type == 1:
        excluded[1] = True   # a sequence with every key padded: NaN, as on the CPU
    mask = excluded if dtype == torch.bool else torch.zeros(shape).masked_fill(excluded, float("-inf"))
    args = _mha_args(batch, length, embed)
    _compare(args, embed, heads, mask=mask, mask_type=mask_type)
    _compare(args, embed, heads, mask=mask, mask_type=mask_type, need_weights=False)


def test_native_mha_of_distinct_query_key_and_value(strict):
    """Three in-projections instead of one (the op takes any query/key/value of one shape)."""
    x, w_qkv, b_qkv, w_out, b_out = _mha_args(2, 5, 8)
    key, value = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    expected = mha(x, key, value, 8, 2, w_qkv, b_qkv, w_out, b_out)
    dev = [t.to("opencl") for t in (x, key, value, w_qkv, b_qkv, w_out, b_out)]
    actual = mha(*dev[:3], 8, 2, *dev[3:])
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a.cpu(), e, atol=2e-6, rtol=1e-5)


def test_native_mha_of_an_empty_batch(strict):
    args = _mha_args(0, 4, 8)
    _compare(args, 8, 2, need_weights=False)


def test_native_mha_bad_arguments_raise_clear_errors(strict):
    x, w_qkv, b_qkv, w_out, b_out = (a.to("opencl") for a in _mha_args(2, 5, 12))
    with pytest.raises(RuntimeError, match="divide evenly"):
        mha(x, x, x, 12, 5, w_qkv, b_qkv, w_out, b_out)
    with pytest.raises(RuntimeError, match="qkv_weight"):
        mha(x, x, x, 12, 3, w_qkv[:24], b_qkv, w_out, b_out)
    with pytest.raises(RuntimeError, match="embed_dim 8"):
        mha(x, x, x, 8, 2, w_qkv, b_qkv, w_out, b_out)
    with pytest.raises(RuntimeError, match="key padding mask"):
        mha(x, x, x, 12, 3, w_qkv, b_qkv, w_out, b_out, torch.zeros(5, 2, dtype=torch.bool, device="opencl"),
            mask_type=1)
    with pytest.raises(RuntimeError, match="does not broadcast"):
        mha(x, x, x, 12, 3, w_qkv, b_qkv, w_out, b_out, torch.zeros(4, 5, 5, dtype=torch.bool, device="opencl"),
            mask_type=2)


def test_multihead_attention_takes_the_fast_path_on_the_device(strict, fresh_stats):
    """In eval mode without grad, nn.MultiheadAttention (self-attention, batch first, an even head count)
    calls _native_multi_head_attention; vit_b_16 does so in every block (without weights or a mask: the
    fused attention)."""
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(12, 4, batch_first=True).eval()   # (the fast path wants an even head count)
    x = torch.randn(2, 7, 12)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 4:] = True
    dev_attention = copy.deepcopy(attention).to("opencl")
    xd = x.to("opencl")
    with torch.no_grad():
        for kwargs in ({}, {"need_weights": False}, {"key_padding_mask": padding, "need_weights": False}):
            dev_kwargs = {k: v.to("opencl") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            expected, actual = attention(x, x, x, **kwargs), dev_attention(xd, xd, xd, **dev_kwargs)
            torch.testing.assert_close(actual[0].cpu(), expected[0], atol=2e-6, rtol=1e-5)
            assert (actual[1] is None) == (expected[1] is None)
    assert fresh_stats()["ops"]["aten::_native_multi_head_attention"] == 3
    # without weights and mask the attention is the fused kernels' (the problem the training path runs)
    assert fresh_stats()["ops"]["aten::_scaled_dot_product_fused_attention_overrideable"] == 1


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_transformer_encoder_layer_takes_its_fast_path_on_the_device(strict, fresh_stats, norm_first, activation,
                                                                      padded):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(12, 4, dim_feedforward=19, activation=activation, batch_first=True,
                                       norm_first=norm_first).eval()
    with torch.no_grad():   # layer norms that are not the identity
        for p in (layer.norm1.weight, layer.norm2.weight, layer.norm1.bias, layer.norm2.bias):
            p.copy_(torch.rand(p.shape) + 0.5)
    dev = copy.deepcopy(layer).to("opencl")
    x = torch.randn(3, 7, 12)
    padding = None
    if padded:
        padding = torch.zeros(3, 7, dtype=torch.bool)
        padding[1, 5:] = True
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=padding)
        actual = dev(x.to("opencl"), src_key_padding_mask=None if padding is None else padding.to("opencl"))
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert fresh_stats()["ops"]["aten::_transformer_encoder_layer_fwd"] == 1
