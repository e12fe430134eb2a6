"""attention_flash against torch in float64: the default config and configs drawn at random from its
space (forward and backward), on shapes that are not multiples of the tiles, with strided operands,
a broadcast mask and causality; the space's constraints."""

from __future__ import annotations

import math

import draws
import numpy as np
import pyopencl as cl
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tunecl.kernels.attention import ALGORITHMS, AttentionOperands, local_floats  # noqa: E402
from tunecl.kernels.strided import Operand  # noqa: E402
from tunecl.problems import AttentionProblem  # noqa: E402

ALGORITHM = ALGORITHMS[0]


def _buffer(device, t: torch.Tensor) -> cl.Buffer:
    data = np.ascontiguousarray(t.detach().numpy())
    return cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)


def _read(device, buffer: cl.Buffer, shape) -> torch.Tensor:
    out = np.empty(math.prod(shape), np.float32)
    cl.enqueue_copy(device.queue, out, buffer)
    device.queue.finish()
    return torch.from_numpy(out).view(shape).double()


def _check(device, problem: AttentionProblem, config: dict[str, int]) -> None:
    """Run ``config`` on random inputs (q in a (B, L, H, E) layout read as (B, H, L, E), a mask broadcast
    over the batch) and compare output, log-sum-exp and gradients with float64 torch."""
    p = problem
    g = torch.Generator().manual_seed(0)
    q = torch.randn(p.batch, p.l, p.heads, p.e, generator=g).transpose(1, 2)   # strided: (b, h, l, e) view
    k, v = torch.randn(p.batch, p.heads, p.s, p.e, generator=g), torch.randn(p.batch, p.heads, p.s, p.ev, generator=g)
    dout = torch.randn(p.batch, p.heads, p.l, p.ev, generator=g)
    mask = None
    if p.mask == "bool":
        mask = torch.rand(1, p.heads, p.l, p.s, generator=g) > 0.3
    elif p.mask == "float":
        mask = torch.randn(1, p.heads, p.l, p.s, generator=g)
    scale = 0.37
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    attn_mask = mask if mask is None or mask.dtype == torch.bool else mask.double()
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=attn_mask, is_causal=p.causal, scale=scale)
    expected.backward(dout.double())

    def operand(buffer, t):
        return Operand(buffer, 0, tuple(t.stride()), "float32")

    qc = q.transpose(1, 2).contiguous()          # the (B, L, H, E) memory behind q's view
    qb, kb, vb = _buffer(device, qc), _buffer(device, k), _buffer(device, v)
    shapes = {"out": (p.batch, p.heads, p.l, p.ev), "dq": (p.batch, p.heads, p.l, p.e),
              "dk": (p.batch, p.heads, p.s, p.e), "dv": (p.batch, p.heads, p.s, p.ev)}
    bufs = {name: _buffer(device, torch.zeros(shape)) for name, shape in shapes.items()}
    lse = _buffer(device, torch.zeros(p.batch * p.heads * p.l))
    delta = _buffer(device, torch.zeros(p.batch * p.heads * p.l))
    mask_op = None
    if mask is not None:
        stored = mask.to(torch.uint8) if mask.dtype == torch.bool else mask
        strides = tuple(0 if n == 1 else s for n, s in zip(stored.shape, stored.stride()))
        mask_op = Operand(_buffer(device, stored), 0, strides, "bool" if p.mask == "bool" else "float32")
    ops = AttentionOperands(q=operand(qb, q), k=operand(kb, k), v=operand(vb, v),
                            out=operand(bufs["out"], torch.zeros(shapes["out"])),
                            lse=Operand(lse, 0, (1,), "float32"), mask=mask_op)
    fwd = ALGORITHM.build(p.with_direction("fwd"), device, _for_direction(config, "fwd"))
    fwd.run(ops, scale)
    out = _read(device, bufs["out"], shapes["out"])
    torch.testing.assert_close(out, expected.detach(), atol=1e-5, rtol=1e-5, msg=lambda m: f"{config}: out: {m}")
    scores = torch.einsum("bhle,bhse->bhls", leaves[0].detach(), leaves[1].detach()) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    if p.causal:
        scores = scores.masked_fill(torch.ones(p.l, p.s, dtype=torch.bool).tril().logical_not(), float("-inf"))
    torch.testing.assert_close(_read(device, lse, (p.batch, p.heads, p.l)), scores.logsumexp(-1), atol=1e-5,
                               rtol=1e-5)
    ops.dout = operand(_buffer(device, dout), dout)
    ops.delta = Operand(delta, 0, (1,), "float32")
    ops.dq, ops.dk, ops.dv = (operand(bufs[n], torch.zeros(shapes[n])) for n in ("dq", "dk", "dv"))
    bwd = ALGORITHM.build(p.with_direction("bwd"), device, _for_direction(config, "bwd"))
    bwd.run(ops, scale)
    for name, leaf in zip(("dq", "dk", "dv"), leaves):
        torch.testing.assert_close(_read(device, bufs[name], shapes[name]), leaf.grad, atol=4e-5, rtol=4e-5,
                                   msg=lambda m, n=name: f"{config}: {n}: {m}")


def _for_direction(config: dict[str, int], direction: str) -> dict[str, int]:
    return {**config, "KVSHARE": config["KVSHARE"] if direction == "fwd" else 0}


SHAPES = [AttentionProblem(2, 3, 37, 21, 24, 24), AttentionProblem(1, 2, 21, 37, 5, 7, causal=True),
          AttentionProblem(1, 2, 19, 33, 16, 16, mask="bool"), AttentionProblem(2, 1, 33, 19, 8, 8, mask="float")]


@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.key)
def test_default_config(device, problem):
    config = ALGORITHM.default(problem, device)
    _check(device, problem, {**config, "KVSHARE": config.get("KVSHARE", 0)})


def _drawable(problem: AttentionProblem, device) -> list[dict[str, int]]:
    """Configs valid in both directions (one config serves the forward and, without KVSHARE, the backward)."""
    bwd = ALGORITHM.space(problem.with_direction("bwd"), device)
    return [c for c in ALGORITHM.space(problem, device).configs() if bwd.is_valid(_for_direction(c, "bwd"))]


@pytest.mark.parametrize("index", range(draws.count(3, 12)))
def test_random_configs(device, index):
    rng = draws.rng(f"attention_flash/random/{index}")
    problem = SHAPES[rng.randrange(len(SHAPES))]
    _check(device, problem, rng.choice(_drawable(problem, device)))


def test_space_constraints_name_the_rule(device):
    problem = AttentionProblem(1, 1, 64, 64, 128, 128)
    space = ALGORITHM.space(problem, device)
    bad = dict(BM=16, BN=16, TM=32, TN=2, PAD=0, KVSHARE=0)
    assert "rows_divide_among_threads" in space.violations(bad)
    assert local_floats(problem, dict(BM=32, BN=32, TM=8, TN=4, PAD=1, KVSHARE=1)) < \
        local_floats(problem, dict(BM=32, BN=32, TM=8, TN=4, PAD=1, KVSHARE=0))
    with pytest.raises(ValueError, match="rows_divide_among_threads"):
        ALGORITHM.build(problem, device, bad)
    bwd = ALGORITHM.space(problem.with_direction("bwd"), device)
    assert "kvshare_is_forward_only" in bwd.violations(dict(BM=32, BN=32, TM=8, TN=4, PAD=0, KVSHARE=1))
