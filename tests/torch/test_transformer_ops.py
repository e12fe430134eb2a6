"""The ops transformers add to a CNN's set (tril/triu, layer norm's and the embedding's backward), on
opencl vs CPU, forward and backward, over odd shapes, dtypes and strided views; and a tiny GPT-2-like block
trained one step on opencl."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op, strided, t
from torch import nn

from tunecl import config

TRI_CASES = [((5, 7), 0), ((7, 5), 2), ((3, 4, 6), -2), ((2, 3, 1, 1), 1), ((1, 1), 0), ((0, 3), 0), ((2, 0, 4), 1),
             ((4, 4), 100), ((4, 4), -100), ((2, 3, 5, 4), 3), ((3, 257, 33), -1)]


@pytest.mark.parametrize("fn", [torch.tril, torch.triu])
@pytest.mark.parametrize("shape,k", TRI_CASES)
def test_tril_triu(fn, shape, k):
    check_op(lambda x: fn(x, k), torch.randn(shape))


@pytest.mark.parametrize("fn", [torch.tril, torch.triu])
def test_tril_triu_of_strided_views(fn):
    check_op(lambda x: fn(x, 1), t(torch.randn(6, 9)))
    check_op(lambda x: fn(x, -1), strided(torch.randn(3, 5, 10)))
    check_op(lambda x: fn(x), Input(torch.randn(4, 6, 8), lambda v: v.transpose(0, 2)))
    # batch dims that do not merge (gaps between the matrices): through a contiguous copy
    check_op(lambda x: fn(x, 2), Input(torch.randn(4, 3, 5, 6), lambda v: v[::2, :, 1:, ::2]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float16])
def test_tril_triu_of_other_dtypes(dtype):
    x = (torch.randn(3, 6, 5) * 4).to(dtype)
    check_op(lambda v: (torch.tril(v, 1), torch.triu(v, -1)), x)


@pytest.mark.parametrize("name", ["tril_", "triu_"])
def test_tril_triu_in_place(name):
    def fn(x, k):
        y = x.clone()
        getattr(y, name)(k)   # a contiguous tensor
        z = x.clone()
        getattr(z[:, ::2], name)(k)   # a strided view, updated in place
        w = x.clone().transpose(0, 1)
        getattr(w, name)(k)
        return y, z, w
    for k in (0, -2, 3):
        check_op(lambda x, k=k: fn(x, k), torch.randn(5, 8, 7))


def test_causal_mask(strict):
    mask = torch.tril(torch.ones(9, 9, dtype=torch.bool, device="opencl"))
    assert torch.equal(mask.cpu(), torch.tril(torch.ones(9, 9, dtype=torch.bool)))


LAYER_NORM_CASES = [((3, 7, 5), (5,)), ((4, 300), (300,)), ((2, 3, 257), (257,)), ((2, 3, 4), (3, 4)), ((1, 1), (1,)),
                    ((9,), (9,)), ((5, 0), (0,)), ((0, 6), (6,)), ((2, 1, 1000), (1000,))]


@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@pytest.mark.parametrize("shape,normalized", LAYER_NORM_CASES)
def test_layer_norm(shape, normalized, affine):
    x = torch.randn(shape) * 2 + 1
    w, b = torch.rand(normalized) + 0.5, torch.randn(normalized)
    if affine == "both":
        check_op(lambda v, w, b: F.layer_norm(v, normalized, w, b, 1e-5), x, w, b, atol=2e-5)
    elif affine == "weight":
        check_op(lambda v, w: F.layer_norm(v, normalized, w, None, 1e-5), x, w, atol=2e-5)
    else:
        check_op(lambda v: F.layer_norm(v, normalized, None, None, 1e-5), x, atol=2e-5)


def test_layer_norm_of_strided_inputs_and_partial_masks():
    w, b = torch.rand(6) + 0.5, torch.randn(6)
    check_op(lambda v, w, b: F.layer_norm(v, (6,), w, b), t(torch.randn(6, 5)), w, b, atol=2e-5)
    check_op(lambda v, w, b: F.layer_norm(v, (6,), w, b), strided(torch.randn(4, 12)), w, b, atol=2e-5)
    # only some gradients asked for: the input's alone, the parameters' alone
    check_op(lambda v, w, b: F.layer_norm(v, (6,), w, b), torch.randn(3, 6), Input(w, grad=False),
             Input(b, grad=False), atol=2e-5)
    check_op(lambda v, w, b: F.layer_norm(v, (6,), w, b), Input(torch.randn(3, 6), grad=False), w, b, atol=2e-5)


@pytest.mark.parametrize("params", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("shape,normalized", LAYER_NORM_CASES)
def test_native_layer_norm_op_directly(shape, normalized, params):
    """The output and the saved statistics (torch's shapes: the leading dims, then ones) against float64
    CPU torch; rows far from zero (mean 100, deviation 3) check that the variance is not taken as
    E[x^2] - mean^2."""
    x = torch.randn(shape) * 3 + 100
    w = torch.rand(normalized) + 0.5 if params in ("both", "weight") else None
    b = torch.randn(normalized) if params in ("both", "bias") else None
    expected = torch.ops.aten.native_layer_norm(x.double(), list(normalized),
                                                *(None if v is None else v.double() for v in (w, b)), 1e-5)
    actual = torch.ops.aten.native_layer_norm(x.to("opencl"), list(normalized),
                                              *(None if v is None else v.to("opencl") for v in (w, b)), 1e-5)
    for e, a, tol in zip(expected, actual, (2e-5, 2e-4, 2e-4)):
        assert a.shape == e.shape and a.dtype == torch.float32 and a.device.type == "opencl"
        torch.testing.assert_close(a.cpu().double(), e, atol=tol, rtol=tol, equal_nan=True)  # (rstd of 0 columns)


def test_native_layer_norm_other_calls_take_torchs_route(strict):
    """A non-contiguous input, float16, parameters of another layout: torch's composite, same results."""
    x = torch.randn(6, 10)
    w, b = torch.rand(10) + 0.5, torch.randn(10)
    cases = [(x.t().contiguous().t(), w, b), (x.half(), w.half(), b.half()), (x, w[None].expand(2, 10)[0], b),
             (x, torch.rand(20)[::2], b)]
    for xi, wi, bi in cases:
        expected = torch.ops.aten.native_layer_norm(xi.float(), [10], wi.float(), bi.float(), 1e-5)
        actual = torch.ops.aten.native_layer_norm(xi.to("opencl"), [10], wi.to("opencl"), bi.to("opencl"), 1e-5)
        for e, a in zip(expected, actual):
            assert a.shape == e.shape
            torch.testing.assert_close(a.cpu().float(), e, atol=2e-3 if xi.dtype == torch.half else 2e-5,
                                       rtol=1e-3 if xi.dtype == torch.half else 1e-5)


def test_native_layer_norm_is_one_launch_and_the_same_run_to_run(strict):
    """One launch per call; the pre-built calls after a signature's first (its launches recorded, then
    replayed with each call's buffers) compute what the first did, on new inputs and at new storage offsets."""
    from tunecl.profiling import KernelProfile

    xs = [torch.randn(4, 7, 300) for _ in range(3)]
    w, b = torch.rand(300) + 0.5, torch.randn(300)
    dw, db = w.to("opencl"), b.to("opencl")
    for x in xs + [xs[0]]:
        expected = torch.ops.aten.native_layer_norm(x, [300], w, b, 1e-5)
        for dx in (x.to("opencl"), torch.cat([torch.randn(5), x.flatten()]).to("opencl")[5:].view(4, 7, 300)):
            got = torch.ops.aten.native_layer_norm(dx, [300], dw, db, 1e-5)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g.cpu(), e, atol=2e-5, rtol=1e-5)
    first = [v.cpu() for v in torch.ops.aten.native_layer_norm(xs[1].to("opencl"), [300], dw, db, 1e-5)]
    again = [v.cpu() for v in torch.ops.aten.native_layer_norm(xs[1].to("opencl"), [300], dw, db, 1e-5)]
    for a, c in zip(first, again):
        assert torch.equal(a, c)
    with KernelProfile() as profile:
        torch.ops.aten.native_layer_norm(xs[2].to("opencl"), [300], dw, db, 1e-5)
        torch.opencl.synchronize()
        launches = {row.name: row.launches for row in profile.summary()}
    assert launches.get("ln_forward") == 1 and len([n for n in launches if n.startswith("ln_")]) == 1, launches


def test_layer_norm_backward_replays_with_each_calls_buffers(strict):
    """The backward's pre-built calls (after a signature's first) read each call's tensors: gradients of new
    inputs and upstream gradients match the CPU's, with and without weight and bias."""
    for affine in (True, False):
        ln_cpu = torch.nn.LayerNorm(48, elementwise_affine=affine)
        ln_dev = torch.nn.LayerNorm(48, elementwise_affine=affine).to("opencl")
        ln_dev.load_state_dict(ln_cpu.state_dict())
        for _ in range(3):
            x, g = torch.randn(6, 5, 48), torch.randn(6, 5, 48)
            cx, dx = x.clone().requires_grad_(), x.to("opencl").requires_grad_()
            ln_cpu(cx).backward(g)
            ln_dev(dx).backward(g.to("opencl"))
            torch.testing.assert_close(dx.grad.cpu(), cx.grad, atol=1e-5, rtol=1e-5)
            for pc, pd in zip(ln_cpu.parameters(), ln_dev.parameters()):
                torch.testing.assert_close(pd.grad.cpu(), pc.grad, atol=1e-4, rtol=1e-4)
                pc.grad = pd.grad = None


def test_layer_norm_backward_op_directly(strict):
    """Each output mask, twice: a signature's second call runs pre-built (its outputs those the mask asks for)."""
    x, dy = torch.randn(4, 3, 10), torch.randn(4, 3, 10)
    w, b = torch.rand(10) + 0.5, torch.randn(10)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [10], w, b, 1e-5)
    for mask in [[True, True, True], [True, False, False], [False, True, False], [False, False, True],
                 [False, True, True]] * 2:
        expected = torch.ops.aten.native_layer_norm_backward(dy, x, [10], mean, rstd, w, b, mask)
        actual = torch.ops.aten.native_layer_norm_backward(*(v.to("opencl") for v in (dy, x)), [10],
                                                           *(v.to("opencl") for v in (mean, rstd, w, b)), mask)
        for e, a in zip(expected, actual):
            assert (e is None) == (a is None)
            if e is not None:
                torch.testing.assert_close(a.cpu(), e, atol=2e-5, rtol=1e-5)


def test_layer_norm_float16(strict):
    x, dy = torch.randn(5, 33).half(), torch.randn(5, 33).half()
    w, b = (torch.rand(33) + 0.5).half(), torch.randn(33).half()
    _, mean, rstd = torch.ops.aten.native_layer_norm(x.float(), [33], w.float(), b.float(), 1e-5)
    expected = torch.ops.aten.native_layer_norm_backward(dy.float(), x.float(), [33], mean, rstd, w.float(),
                                                         b.float(), [True, True, True])
    actual = torch.ops.aten.native_layer_norm_backward(*(v.to("opencl") for v in (dy, x)), [33],
                                                       *(v.to("opencl") for v in (mean, rstd, w, b)), [True] * 3)
    for e, a in zip(expected, actual):
        assert a.dtype == torch.float16
        torch.testing.assert_close(a.cpu().float(), e, atol=2e-2, rtol=1e-2)


EMBEDDING_CASES = [(10, (4, 7), 5), (37, (3, 9), 33), (1, (6,), 1), (5, (2, 3), 257), (8, (0,), 3), (300, (65,), 2)]


@pytest.mark.parametrize("num,shape,dims", EMBEDDING_CASES)
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("scale", [False, True])
def test_embedding(num, shape, dims, padding_idx, scale):
    indices = torch.randint(0, num, shape)
    check_op(lambda w, i: F.embedding(i, w, padding_idx=padding_idx, scale_grad_by_freq=scale),
             torch.randn(num, dims), indices)


def test_embedding_dense_backward_directly(strict):
    grad, indices = torch.randn(3, 8, 6), torch.randint(0, 11, (3, 8))
    for dtype in (torch.int64, torch.int32):
        for padding_idx, scale in ((-1, False), (4, False), (-1, True), (2, True)):
            expected = torch.ops.aten.embedding_dense_backward(grad, indices.to(dtype), 11, padding_idx, scale)
            actual = torch.ops.aten.embedding_dense_backward(grad.to("opencl"), indices.to(dtype).to("opencl"), 11,
                                                             padding_idx, scale)
            torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
    # a strided gradient, float16, and a run repeated bit for bit
    g = torch.randn(8, 6, 4).transpose(0, 1)
    i = torch.randint(0, 5, (6, 8))
    actual = torch.ops.aten.embedding_dense_backward(g.to("opencl"), i.to("opencl"), 5, -1, False)
    torch.testing.assert_close(actual.cpu(), torch.ops.aten.embedding_dense_backward(g, i, 5, -1, False))
    again = torch.ops.aten.embedding_dense_backward(g.to("opencl"), i.to("opencl"), 5, -1, False)
    assert torch.equal(actual.cpu(), again.cpu())
    h = torch.ops.aten.embedding_dense_backward(g.half().to("opencl"), i.to("opencl"), 5, -1, False)
    assert h.dtype == torch.float16
    torch.testing.assert_close(h.cpu().float(), torch.ops.aten.embedding_dense_backward(g, i, 5, -1, False),
                               atol=1e-2, rtol=1e-2)


class TinyGPT(nn.Module):
    """One GPT-2 block: token and position embeddings, causal self-attention, an MLP, a final layer norm and
    the output projection tied to the token embedding."""

    def __init__(self, vocab: int = 41, dims: int = 24, heads: int = 2, context: int = 9) -> None:
        super().__init__()
        self.heads = heads
        self.tokens, self.positions = nn.Embedding(vocab, dims), nn.Embedding(context, dims)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(dims), nn.LayerNorm(dims), nn.LayerNorm(dims)
        self.qkv, self.proj = nn.Linear(dims, 3 * dims), nn.Linear(dims, dims)
        self.fc, self.fc_out = nn.Linear(dims, 4 * dims), nn.Linear(4 * dims, dims)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        batch, length = idx.shape
        x = self.tokens(idx) + self.positions(torch.arange(length, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (u.view(batch, length, self.heads, -1).transpose(1, 2) for u in (q, k, v))
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        causal = torch.tril(torch.ones(length, length, device=idx.device))
        attention = scores.masked_fill(causal == 0, float("-inf")).softmax(-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(batch, length, -1))
        x = x + self.fc_out(F.gelu(self.fc(self.ln2(x))))
        return self.ln_f(x) @ self.tokens.weight.t()


MY_OPS = ("aten::tril.out", "aten::triu.out", "aten::native_layer_norm", "aten::native_layer_norm_backward",
          "aten::embedding_dense_backward")


def test_tiny_gpt_trains_one_step_on_the_device(fresh_stats):
    torch.manual_seed(0)
    cpu = TinyGPT()
    dev = copy.deepcopy(cpu).to("opencl")
    idx = torch.randint(0, 41, (3, 9))
    losses, grads = [], []
    with config.override(fallback="warn"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model, x in ((cpu, idx), (dev, idx.to("opencl"))):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            grads.append({n: p.grad.cpu() for n, p in model.named_parameters()})
            opt.step()
            losses.append((loss.item(), F.cross_entropy(model(x).flatten(0, 1), x.flatten()).item()))
    fallbacks = fresh_stats()["fallback_ops"]
    assert not [op for op in MY_OPS if op in fallbacks], fallbacks
    assert fresh_stats()["ops"].get("aten::native_layer_norm_backward", 0) == 3
    assert fresh_stats()["ops"].get("aten::embedding_dense_backward", 0) == 2
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-4, rtol=1e-3, msg=name)
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), atol=1e-4, rtol=1e-4)
    assert losses[1][1] < losses[1][0]
