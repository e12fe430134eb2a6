"""The inference fast paths of ``nn.MultiheadAttention`` (``_native_multi_head_attention``) and
``nn.TransformerEncoderLayer`` (``_transformer_encoder_layer_fwd``), composed of the device's own ops
(linear, layer norm, and the attention itself), as CPU torch computes them. Without a mask and without
the attention weights (``need_weights=False``, what both modules' fast paths ask) the attention is
``scaled_dot_product_attention`` (:func:`tunecl.backend.ops.sdpa.scaled_dot_product_attention`, called
directly: below the autograd key torch's own op would take its math path; the fused kernels, the same
problem the module's training path runs); otherwise batched matmuls, masked fill and softmax.

The fast paths run without autograd (the modules take them only in inference), and so do these
kernels: the ops they call are dispatched below the autograd key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tunecl.backend.ops import sdpa
from tunecl.errors import Unsupported

# what ``mask_type`` says the mask's shape is (torch's ``_masked_softmax``): 0 an L x S attention mask
# shared by every sequence and head, 1 a B x S key padding mask, 2 one broadcastable to B x heads x L x S
_ATTENTION_MASK, _KEY_PADDING_MASK, _GENERIC_MASK = 0, 1, 2


def _masked_out(mask: torch.Tensor, mask_type: int | None, scores: torch.Tensor) -> torch.Tensor:
    """The positions ``mask`` excludes, as a bool tensor broadcastable to ``scores`` (B x heads x L x S).

    As in CPU torch, a float mask excludes where it is nonzero (``nn.MultiheadAttention`` passes its
    masks as 0 / -inf)."""
    excluded = mask if mask.dtype == torch.bool else mask != 0
    batch, _, length, keys = scores.shape
    if mask_type == _ATTENTION_MASK:
        if tuple(excluded.shape) != (length, keys):
            raise RuntimeError(f"_native_multi_head_attention: an attention mask (mask_type 0) must be "
                               f"{length} x {keys}, got {tuple(excluded.shape)}")
        return excluded
    if mask_type == _KEY_PADDING_MASK:
        if tuple(excluded.shape) != (batch, keys):
            raise RuntimeError(f"_native_multi_head_attention: a key padding mask (mask_type 1) must be "
                               f"{batch} x {keys}, got {tuple(excluded.shape)}")
        return excluded.view(batch, 1, 1, keys)
    if mask_type not in (None, _GENERIC_MASK):
        raise RuntimeError(f"_native_multi_head_attention: unknown mask_type {mask_type} (0, 1 or 2)")
    try:
        torch.broadcast_shapes(excluded.shape, scores.shape)
    except RuntimeError:
        raise RuntimeError(f"_native_multi_head_attention: a mask of shape {tuple(excluded.shape)} does not "
                           f"broadcast to the scores' {tuple(scores.shape)}") from None
    return excluded


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int, num_head: int,
           qkv_weight: torch.Tensor, qkv_bias: torch.Tensor) -> None:
    """torch's argument checks of the op, with its messages."""
    if any(t.is_nested for t in (query, key, value)):
        raise Unsupported("nested tensors")
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise RuntimeError(f"_native_multi_head_attention: expected 3-D query/key/value, got "
                           f"{query.dim()}-D/{key.dim()}-D/{value.dim()}-D tensors")
    if query.shape[2] != embed_dim:
        raise RuntimeError(f"passed-in embed_dim {embed_dim} didn't match last dim of query {query.shape[2]}")
    if not query.shape == key.shape == value.shape:
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")
    if tuple(qkv_weight.shape) != (3 * embed_dim, embed_dim) or tuple(qkv_bias.shape) != (3 * embed_dim,):
        raise RuntimeError(f"expected `qkv_weight` of shape {(3 * embed_dim, embed_dim)} and `qkv_bias` of "
                           f"shape {(3 * embed_dim,)}, got {tuple(qkv_weight.shape)} and {tuple(qkv_bias.shape)}")
    if num_head <= 0 or embed_dim % num_head:
        raise RuntimeError("`embed_dim` must divide evenly by `num_heads`")


def native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                                num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                proj_weight: torch.Tensor, proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head attention of batch-first ``query``/``key``/``value`` (B x L x E): the in-projection
    (``qkv_weight`` stacks W_q, W_k, W_v), softmax(q k^T / sqrt(E / heads)) with ``mask``'s positions
    excluded (a row with every key excluded is NaN, as on the CPU), the out-projection; and the attention
    weights (averaged over the heads with ``average_attn_weights``) when ``need_weights``, else None."""
    _check(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias)
    batch, length, _ = query.shape
    if query.numel() == 0:
        return torch.empty_like(query), None
    head_dim = embed_dim // num_head
    if query is key and key is value:   # self-attention: one in-projection GEMM of 3 x embed_dim outputs
        projected = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        projected = [F.linear(x, w, b) for x, w, b in zip((query, key, value), qkv_weight.chunk(3),
                                                          qkv_bias.chunk(3))]
    q, k, v = (p.view(batch, length, num_head, head_dim).transpose(1, 2) for p in projected)
    if mask is None and not need_weights:
        context = sdpa.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, length, embed_dim)
        return F.linear(context, proj_weight, proj_bias), None
    q = q * (1.0 / math.sqrt(head_dim))   # scaled before the product, as torch does
    # k made row-major per head (the copy the product would make anyway), so the score GEMM reads it
    # transposed, as in the module's training path: one tuned GEMM serves both
    scores = q @ k.contiguous().transpose(-2, -1)
    if mask is None:
        attention = scores.softmax(-1)
    else:
        excluded = _masked_out(mask, mask_type, scores)
        attention = scores.masked_fill(excluded, float("-inf")).softmax(-1)
    context = (attention @ v).transpose(1, 2).reshape(batch, length, embed_dim)
    out = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, attention.mean(1) if average_attn_weights else attention


def transformer_encoder_layer_fwd(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                                  qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                                  use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                                  norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                                  ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                                  ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                                  mask_type: int | None = None) -> torch.Tensor:
    """One encoder layer of batch-first ``src``: self-attention (:func:`native_multi_head_attention`) and
    the feed-forward block (linear, ReLU or exact GELU, linear), each added to its input, with layer
    norm after each sum, or with ``norm_first`` before each block."""
    def attention(x: torch.Tensor) -> torch.Tensor:
        return native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                           proj_bias, mask, False, True, mask_type)[0]

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2, ffn_bias_2)

    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    if norm_first:
        x = src + attention(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attention(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


KERNELS: dict[str, Callable[..., Any]] = {
    "_native_multi_head_attention": native_multi_head_attention,
    "_transformer_encoder_layer_fwd": transformer_encoder_layer_fwd,
}
