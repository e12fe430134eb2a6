"""Which path attention that needs gradients takes: on a CPU device (PoCL here) the math decomposition,
whose backward measured faster there than the fused one, while its stored scores fit
``MATH_SCORES_BYTES``; on GPUs the same from 256 x 256 scores per head; the fused kernels for inference,
for longer sequences and shorter ones on GPUs. The backend and ``tunecl tune --net``'s extraction follow the
same rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tunecl.backend
from tunecl.backend import state
from tunecl.kernels import attention
from tunecl.search.workload import extract

FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"

_DEVICE_TYPE = state.get().device.fingerprint.device_type
cpu_route = pytest.mark.skipif(_DEVICE_TYPE != "cpu", reason="the math path for all training is a CPU device's route")
gpu_route = pytest.mark.skipif(_DEVICE_TYPE != "gpu", reason="the math path from 256 x 256 scores is a GPU's route")


def test_the_rule():
    assert attention.math_for_training("cpu", (2, 4, 512, 64), (2, 4, 512, 64))
    assert attention.math_for_training("cpu", (2, 4, 128, 64), (2, 4, 128, 64))
    # GPUs: the fused kernels below 256 x 256 scores per head, the math path from there while the scores fit
    assert not attention.math_for_training("gpu", (16, 12, 128, 64), (16, 12, 128, 64))
    assert not attention.math_for_training("gpu", (16, 12, 255, 64), (16, 12, 256, 64))
    assert attention.math_for_training("gpu", (16, 12, 256, 64), (16, 12, 256, 64))
    assert attention.math_for_training("gpu", (16, 12, 512, 64), (16, 12, 512, 64))
    assert not attention.math_for_training("gpu", (16, 12, 1024, 64), (16, 12, 1024, 64))   # 768 MiB of scores
    # scores of 8 x 8192 x 8192 float32 (2 GiB) keep the fused kernels' bounded memory
    assert not attention.math_for_training("cpu", (1, 8, 8192, 64), (1, 8, 8192, 64))
    assert attention.math_for_training("cpu", (128, 128, 64), (128, 64))   # no head dim: batch dims multiply


def _grads(q, k, v, **kwargs):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, **kwargs)
    out.backward(torch.ones_like(out))
    return out.detach(), [t.grad for t in leaves]


@cpu_route
@pytest.mark.parametrize("causal", [False, True])
def test_training_takes_the_math_path_and_inference_the_fused_kernels(fresh_stats, strict, causal):
    q, k, v = (torch.randn(2, 3, 17, 8, dtype=torch.float64) for _ in range(3))
    out64, grads64 = _grads(q, k, v, is_causal=causal)
    out, grads = _grads(*(t.float().to("opencl") for t in (q, k, v)), is_causal=causal)
    ops = fresh_stats()["ops"]
    assert FUSED not in ops and FUSED_BACKWARD not in ops
    torch.testing.assert_close(out.cpu().double(), out64, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, grads64):
        torch.testing.assert_close(got.cpu().double(), want, atol=4e-5, rtol=4e-5)
    with torch.no_grad():
        inference = F.scaled_dot_product_attention(*(t.float().to("opencl") for t in (q, k, v)), is_causal=causal)
    assert fresh_stats()["ops"][FUSED] == 1
    torch.testing.assert_close(inference.cpu().double(), out64, atol=1e-5, rtol=1e-5)


@cpu_route
def test_scores_over_the_bound_train_on_the_fused_kernels(fresh_stats, strict, monkeypatch):
    q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
    monkeypatch.setattr(attention, "MATH_SCORES_BYTES", 4 * 2 * 9 * 9 - 1)
    out, grads = _grads(*(t.to("opencl") for t in (q, k, v)))
    ops = fresh_stats()["ops"]
    assert ops[FUSED] == 1 and ops[FUSED_BACKWARD] == 1
    out_cpu, grads_cpu = _grads(q, k, v)
    torch.testing.assert_close(out.cpu(), out_cpu, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, grads_cpu):
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


@gpu_route
@pytest.mark.parametrize("causal", [False, True])
def test_a_gpu_trains_long_sequences_on_the_math_path_and_short_ones_on_the_fused_kernels(fresh_stats, strict,
                                                                                         causal):
    for length, fused in ((256, False), (128, True)):
        q, k, v = (torch.randn(1, 2, length, 8, dtype=torch.float64) for _ in range(3))
        out64, grads64 = _grads(q, k, v, is_causal=causal)
        tunecl.backend.reset_stats()
        out, grads = _grads(*(t.float().to("opencl") for t in (q, k, v)), is_causal=causal)
        ops = fresh_stats()["ops"]
        assert (ops[FUSED] == 1 and ops[FUSED_BACKWARD] == 1) if fused else \
            (FUSED not in ops and FUSED_BACKWARD not in ops), (length, dict(ops))
        torch.testing.assert_close(out.cpu().double(), out64, atol=1e-5, rtol=1e-5)
        for got, want in zip(grads, grads64):
            torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-4)
        tunecl.backend.reset_stats()
        with torch.no_grad():   # inference keeps the fused kernels at every length
            F.scaled_dot_product_attention(*(t.float().to("opencl") for t in (q, k, v)), is_causal=causal)
        assert fresh_stats()["ops"][FUSED] == 1


@cpu_route
def test_sdpa_kernel_without_math_trains_on_the_fused_kernels(fresh_stats, strict):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
    with sdpa_kernel([SDPBackend.OVERRIDEABLE]):
        out, grads = _grads(*(t.to("opencl") for t in (q, k, v)))
    ops = fresh_stats()["ops"]
    assert ops[FUSED] == 1 and ops[FUSED_BACKWARD] == 1
    out_cpu, grads_cpu = _grads(q, k, v)
    for got, want in zip([out, *grads], [out_cpu, *grads_cpu]):
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


class _Attention(nn.Module):
    """An image's pixels as tokens of its 3 channels, one attention of 2 heads of dim 4 over them."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 24)

    def forward(self, x):
        q, k, v = self.proj(x.flatten(2).transpose(1, 2)).view(x.shape[0], -1, 2, 3, 4).permute(3, 0, 2, 1, 4)
        return F.scaled_dot_product_attention(q, k, v)


def test_tune_net_extraction_follows_the_device_types_route():
    def keys(device_type, train):
        return {p.key.split(":")[0] + ("-bwd" if ",dir=bwd" in p.key else "")
                for p in extract(_Attention(), batch=2, image_size=3, train=train, device_type=device_type)}

    assert keys("gpu", True) == {"gemm", "attention", "attention-bwd"}
    assert keys("cpu", True) == {"gemm"}          # the score and context products, as bmm problems
    assert keys("cpu", False) == keys("gpu", False) == {"gemm", "attention"}
