"""An add of a residual right after a batch norm runs inside the batch norm's launch: a residual block's
``out = bn(...); out += identity`` (and the in-place relu after it), ``out += bn(...)`` (a downsampled
identity) and ``x + bn(...)`` (mobilenet_v2's blocks). The held normalising launch takes the add instead of
a launch of its own. Results are bit for bit those of the unfolded route (``pointwise.FOLD_RESIDUALS``)
and close to CPU torch's, forward and backward; anything reaching the device in between, an alias, an
alpha, or a residual whose offset would change the launch's vector width leaves the add to run by itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tunecl.backend as backend
from tunecl import config
from tunecl.backend import state
from tunecl.backend.ops import pointwise

from batch_norm_parts import forced_parts

DEV = torch.device("opencl")


@pytest.fixture(params=[1, 3], ids=lambda p: f"P{p}")
def parts(request):
    with forced_parts(request.param):
        yield request.param


def _folds() -> int:
    return backend.stats()["eager_fusions"].get("residual", 0)


class Block(torch.nn.Module):
    """A residual block: ``kind`` "inplace" (``out += identity``, then relu), "downsample" (the identity a
    1x1 conv and batch norm, computed after the block's last batch norm, as torchvision's BasicBlock does),
    "sum" (``x + bn(...)``, as mobilenet_v2's) or "sum_first" (``bn(...) + x``)."""

    def __init__(self, kind: str, channels: int = 4, affine: bool = True) -> None:
        super().__init__()
        self.kind = kind
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(channels, affine=affine)
        if kind == "downsample":
            self.down = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 1, bias=False),
                                            torch.nn.BatchNorm2d(channels, affine=affine))
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.conv(x))
        if self.kind == "sum":
            return x + out
        if self.kind == "sum_first":
            return out + x
        identity = self.down(x) if self.kind == "downsample" else x
        out += identity
        return self.relu(out)


KINDS = ["inplace", "downsample", "sum", "sum_first"]


def _run(kind: str, fold: bool, monkeypatch, train: bool = True, shape=(3, 4, 6, 6), affine: bool = True,
         steps: int = 3) -> list[torch.Tensor]:
    """Outputs, input gradients and the state dict after ``steps`` steps on the device, on the CPU."""
    monkeypatch.setattr(pointwise, "FOLD_RESIDUALS", fold)
    torch.manual_seed(0)
    block = Block(kind, shape[1], affine).to(DEV).train(train)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    results = []
    with config.override(fallback="error"):
        for _ in range(steps):
            xd = x.to(DEV).requires_grad_(train)
            out = block(xd)
            results.append(out.detach().cpu())
            if train:
                out.square().sum().backward()
                results.append(xd.grad.cpu())
    return results + [t.detach().cpu() for t in block.state_dict().values()]


def _cpu(kind: str, train: bool = True, shape=(3, 4, 6, 6), affine: bool = True, steps: int = 3):
    torch.manual_seed(0)
    block = Block(kind, shape[1], affine).train(train)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    results = []
    for _ in range(steps):
        xc = x.clone().requires_grad_(train)
        out = block(xc)
        results.append(out.detach())
        if train:
            out.square().sum().backward()
            results.append(xc.grad)
    return results + [t.detach() for t in block.state_dict().values()]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_blocks_match_the_unfolded_route_and_cpu(monkeypatch, parts, kind, train):
    backend.reset_stats()
    folded = _run(kind, True, monkeypatch, train)
    assert _folds() == 3   # one add a step
    if kind in ("inplace", "downsample"):
        assert backend.stats()["eager_fusions"].get("activation", 0) >= 3   # the relu after it too
    plain = _run(kind, False, monkeypatch, train)
    assert len(folded) == len(plain)
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)
    for a, e in zip(folded, _cpu(kind, train)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["inplace", "sum"])
@pytest.mark.parametrize("shape", [(2, 5, 3, 3), (2, 3, 1, 1), (2, 6, 9, 7)], ids=["3x3", "1x1", "9x7"])
def test_odd_shapes_and_no_affine(monkeypatch, parts, kind, shape):
    """Rows that are not a multiple of 4 floats (one float at a time), one element per image and channel, no
    weight or bias."""
    folded = _run(kind, True, monkeypatch, shape=shape, affine=False, steps=2)
    plain = _run(kind, False, monkeypatch, shape=shape, affine=False, steps=2)
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)
    for a, e in zip(folded, _cpu(kind, shape=shape, affine=False, steps=2)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def _bn(x: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, None, None, training=True)


def _inputs(n: int = 3, shape=(2, 4, 4, 4)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(*shape, generator=g).to(DEV) for _ in range(n)]


def _twice(op):
    """``op()`` on the device with the fold, without it, and how many adds folded the first time."""
    results = []
    folds = 0
    for fold in (True, False):
        pointwise.FOLD_RESIDUALS = fold
        try:
            backend.reset_stats()
            with config.override(fallback="error"):
                results.append(op().cpu())
            if fold:
                folds = _folds()
        finally:
            pointwise.FOLD_RESIDUALS = True
    return results[0], results[1], folds


def test_the_same_call_folds_from_its_first_use():
    """The batch norm's pre-built call holds its launch from the signature's first call on; repeated calls
    keep folding (the residual variant is built once per offsets)."""
    x, r, _ = _inputs()

    def op():
        outs = []
        for _ in range(3):
            y = _bn(x)
            y += r
            outs.append(y)
        return torch.stack(outs)
    folded, plain, folds = _twice(op)
    assert torch.equal(folded, plain) and folds == 3
    torch.testing.assert_close(folded[0].cpu(), F.batch_norm(x.cpu(), None, None, training=True) + r.cpu())


def test_the_batch_norms_own_input_as_the_residual():
    """``bn(x) + x`` and ``y = bn(x); y += x``: the launch reads x twice; views of other shapes do not fold."""
    x = _inputs(1)[0]
    expected = F.batch_norm(x.cpu(), None, None, training=True) + x.cpu()

    def summed():
        return _bn(x) + x

    def in_place():
        y = _bn(x)
        y += x
        return y

    def part():
        y = _bn(x)
        y[:, :2] += x[:, :2]   # a view of y: another size than the launch wrote
        return y
    for op in (summed, in_place):
        folded, plain, folds = _twice(op)
        assert folds == 1 and torch.equal(folded, plain)
        torch.testing.assert_close(folded, expected)
    folded, plain, folds = _twice(part)
    assert folds == 0 and torch.equal(folded, plain)


def test_a_sum_never_lands_on_a_buffer_the_batch_norm_still_uses(parts):
    """Without autograd, the batch norm's input (a temporary) and its saved statistics die as it returns; the
    sum's new tensor must not be allocated on their buffers while the held launch still reads and writes
    them (the re-issued launch would write the sum over its own input and statistics)."""
    x, r, _ = _inputs()

    def op():
        with torch.no_grad():
            outs = [r + F.batch_norm(x * 1.0, None, None, training=True) for _ in range(3)]
            return torch.stack(outs)
    folded, plain, folds = _twice(op)
    assert folds == 3 and torch.equal(folded, plain)
    expected = F.batch_norm(x.cpu(), None, None, training=True) + r.cpu()
    for each in folded:
        torch.testing.assert_close(each, expected)


def test_a_read_or_an_op_between_leaves_the_add_alone():
    x, r, z = _inputs()

    def read_between():
        y = _bn(x)
        assert y.sum().item() == pytest.approx(0.0, abs=1e-3)
        y += r
        return y

    def op_between():
        y = _bn(x)
        w = z * 2
        y += r
        return y + w
    for op in (read_between, op_between):
        folded, plain, folds = _twice(op)
        assert folds == 0 and torch.equal(folded, plain)


def test_aliases_and_alpha_leave_the_add_alone():
    """``y += y``, a residual in y's own storage, alpha != 1 and a subtraction run by themselves."""
    x, r, _ = _inputs()

    def self_add():
        y = _bn(x)
        y.add_(y)
        return y

    def alpha():
        y = _bn(x)
        y.add_(r, alpha=2.0)
        return torch.add(y, r, alpha=0.5)

    def sub():
        y = _bn(x)
        return r - y
    for op in (self_add, alpha, sub):
        folded, plain, folds = _twice(op)
        assert folds == 0 and torch.equal(folded, plain)
    y = _bn(x)
    y += y
    torch.testing.assert_close(y.cpu(), 2 * F.batch_norm(x.cpu(), None, None, training=True))


def test_a_noncontiguous_residual_runs_by_itself():
    """A transposed view as the residual (in place and summed) takes the add's own strided launch, right."""
    x, r, _ = _inputs()
    residual = r.transpose(2, 3)
    expected = F.batch_norm(x.cpu(), None, None, training=True) + residual.cpu()

    def in_place():
        y = _bn(x)
        y += residual
        return y

    def summed():
        return _bn(x) + residual
    for op in (in_place, summed):
        folded, plain, folds = _twice(op)
        assert folds == 0 and torch.equal(folded, plain)
        torch.testing.assert_close(folded, expected)


def test_a_residual_at_an_offset():
    """A residual 4-aligned inside a bigger buffer folds; one 1 float off would make the launch read one float
    at a time (another grid), so its add runs by itself; the results are right either way."""
    x = _inputs(1)[0]
    big = torch.randn(2 * x.numel() + 5).to(DEV)
    for start, expect in ((4, 1), (1, 0)):
        residual = big[start:start + x.numel()].view(x.shape)

        def op(residual=residual):
            y = _bn(x)
            y += residual
            return y
        folded, plain, folds = _twice(op)
        assert folds == expect and torch.equal(folded, plain)
        torch.testing.assert_close(folded, F.batch_norm(x.cpu(), None, None, training=True) + residual.cpu())


def test_residual_variants_per_call_are_bounded():
    """A residual at ever new offsets builds one variant each, at most MAX_RESIDUALS kept per pre-built
    call; every add folds and is right."""
    from tunecl.kernels.ops import norm

    x = _inputs(1)[0]
    big = torch.randn(x.numel() + 4 * (norm.MAX_RESIDUALS + 3)).to(DEV)
    expected_y = F.batch_norm(x.cpu(), None, None, training=True)
    backend.reset_stats()
    with config.override(fallback="error"):
        for k in range(norm.MAX_RESIDUALS + 3):
            residual = big[4 * k:4 * k + x.numel()].view(x.shape)
            y = _bn(x)
            y += residual
            torch.testing.assert_close(y.cpu(), expected_y + residual.cpu())
    assert _folds() == norm.MAX_RESIDUALS + 3
    kept = [call.prepared._residuals for call in state.get().norm.calls.values()
            if call is not None and getattr(call.prepared, "_residuals", None)]
    assert kept and all(len(variants) <= norm.MAX_RESIDUALS for variants in kept)


def test_nonfinite_values_and_relu6_in_inference(parts):
    """NaN and infinities pass through the add and the activation as torch's own ops compute them; an
    in-place relu6 folds after the add where no gradient is recorded."""
    x, r, _ = _inputs()
    r[0, 0, 0, 0] = float("nan")
    r[0, 1, 1, 1] = float("inf")
    r[1, 2, 2, 2] = float("-inf")
    rm, rv = torch.zeros(4, device=DEV), torch.ones(4, device=DEV)

    def op():
        with torch.no_grad():
            y = F.batch_norm(x, rm, rv, training=False)
            y += r
            return F.hardtanh_(y, 0.0, 6.0)
    folded, plain, folds = _twice(op)
    assert folds == 1
    torch.testing.assert_close(folded, plain, rtol=0, atol=0, equal_nan=True)   # bit for bit, NaN included
    expected = F.hardtanh(F.batch_norm(x.cpu(), rm.cpu(), rv.cpu(), training=False) + r.cpu(), 0.0, 6.0)
    torch.testing.assert_close(folded, expected, equal_nan=True)


@pytest.mark.parametrize("kind", KINDS)
def test_graph_capture_records_the_folded_launch_and_replays_it(monkeypatch, kind):
    """A captured forward records the batch norm's launch with the add (and the relu) inside; its replays give
    the eager results, on new inputs too, with the fold and without it."""
    results = {}
    for fold in (True, False):
        monkeypatch.setattr(pointwise, "FOLD_RESIDUALS", fold)
        torch.manual_seed(0)
        block = Block(kind).to(DEV)
        x = torch.randn(3, 4, 6, 6).to(DEV)
        with torch.no_grad():
            block(x)   # the signatures' first calls
            graph = torch.opencl.Graph()
            backend.reset_stats()
            with torch.opencl.graph(graph):
                out = block(x)
            assert _folds() == (1 if fold else 0)
            replays = []
            for seed in (3, 4):
                x.copy_(torch.randn(3, 4, 6, 6, generator=torch.Generator().manual_seed(seed)))
                graph.replay()
                replays.append(out.cpu())
                assert torch.equal(replays[-1], block(x).cpu())
        results[fold] = replays
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
