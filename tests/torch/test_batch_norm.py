"""Batch norm on opencl vs CPU torch: the split per-channel sums (P work-groups per channel, forced here
to several values since PoCL's few compute units pick small P), odd shapes, the float4 path (L a multiple
of 4, aligned offsets) and its scalar fallback, views with offsets, non-contiguous input, the one-pass
statistics' accuracy on channels with a big mean (and a first element far from it), and bit-identical
repeats."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tunecl import config
from tunecl.backend import state

from batch_norm_parts import forced_parts

DEV = torch.device("opencl")

# (N, C, *spatial): N = 1, C = 1, L = 1 (BatchNorm1d on (N, C)), odd L (7x7, 13x5), L above the
# work-group size (20x30, 1100) and M not a multiple of anything; L a multiple of 4 (float4 loads) with
# N = 1, L = 4, many channels, and L well past a work-group of float4s (2052)
SHAPES = [(4, 3, 5, 5), (1, 3, 7, 7), (5, 1, 13, 5), (6, 4), (1, 2, 9), (3, 2, 20, 30), (2, 2, 1100), (37, 1),
          (2, 5, 1, 1), (1, 3, 4, 4), (5, 2, 1, 4), (3, 70, 8), (2, 2, 2052)]


@pytest.fixture
def norm():
    """The backend's BatchNorm, its kept launch plans dropped before and after (a test may change the
    module's launch constants, which the plans were derived from)."""
    instance = state.get().norm
    instance.forget_launches()
    yield instance
    instance.forget_launches()


@pytest.fixture(params=[None, 1, 2, 3, 7, 500], ids=lambda p: f"P{p}")
def parts(request):
    """P forced (None: the heuristic); 500 is more parts than most channels have elements."""
    with forced_parts(request.param):
        yield request.param


def _run(device, x, g, weight, bias, stats, training, momentum=0.3, eps=1e-4):
    """y, the running statistics after the call, and the gradients of x, weight and bias for upstream g."""
    x = x.detach().clone().to(device).requires_grad_(True)
    params = [None if p is None else p.detach().clone().to(device).requires_grad_(True) for p in (weight, bias)]
    rm, rv = (None, None) if stats is None else (s.clone().to(device) for s in stats)
    with config.override(fallback="error"):
        y = F.batch_norm(x, rm, rv, *params, training=training, momentum=momentum, eps=eps)
        y.backward(g.to(device))
    grads = [x.grad] + [None if p is None else p.grad for p in params]
    return [t if t is None else t.detach().cpu() for t in [y, rm, rv] + grads]


def _compare(shape, training, affine, running, atol=5e-5, rtol=1e-4):
    c = shape[1]
    x = torch.randn(shape) * 2 + 1
    g = torch.randn(shape)
    weight, bias = (torch.rand(c) + 0.5, torch.randn(c)) if affine else (None, None)
    stats = (torch.randn(c) * 0.1, torch.rand(c) + 0.5) if running else None
    expected = _run("cpu", x, g, weight, bias, stats, training)
    actual = _run(DEV, x, g, weight, bias, stats, training)
    names = ("y", "running_mean", "running_var", "grad_input", "grad_weight", "grad_bias")
    for name, e, a in zip(names, expected, actual):
        assert (e is None) == (a is None), name
        if e is not None:
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("running", [True, False], ids=["running", "no_running"])
def test_training_matches_cpu(shape, affine, running, parts):
    _compare(shape, True, affine, running)


@pytest.mark.parametrize("shape", SHAPES + [(1, 3), (1, 1, 1)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_eval_matches_cpu(shape, affine, parts):
    _compare(shape, False, affine, True)


def test_views_with_offsets(norm):
    """x, weight, bias and the running statistics are contiguous views that start inside their storage."""
    norm.force_parts = 3
    try:
        base = torch.randn(3, 4, 6, 5)
        pbase, sbase = torch.rand(11) + 0.5, torch.rand(13) + 0.5

        def run(device):
            b = base.clone().to(device).requires_grad_(True)
            p = pbase.clone().to(device).requires_grad_(True)
            s = sbase.clone().to(device)
            x, w, bi, rm, rv = b[1:], p[1:5], p[6:10], s[2:6], s[8:12]
            with config.override(fallback="error"):
                y = F.batch_norm(x, rm, rv, w, bi, training=True, momentum=0.2)
                y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(device))
            return [t.detach().cpu() for t in (y, s, b.grad, p.grad)]
        for e, a in zip(run("cpu"), run(DEV)):
            torch.testing.assert_close(a, e, atol=5e-5, rtol=1e-4)
    finally:
        norm.force_parts = None


@pytest.mark.parametrize("forced", [None, 1, 4, 13])
def test_large_channel_with_a_big_mean(norm, forced):
    """M = 120,000 per channel, mean 1000, std 0.01: the shifted sums keep the variance accurate
    (sum(x^2) - sum(x)^2/M in float32 would lose it entirely); compared with float64 on CPU."""
    x = 1000 + 0.01 * torch.randn(4, 2, 150, 200)
    x[:, 1] = x[:, 1] * -1 + 2000.5  # another channel, its mean near -1000 + 2000.5
    g = torch.randn(x.shape)
    old = norm.force_parts
    norm.force_parts = forced
    try:
        xd = x.to(DEV).requires_grad_(True)
        with config.override(fallback="error"):
            y, mean, invstd = torch.native_batch_norm(xd, None, None, None, None, True, 0.1, 1e-5)
            gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
                g.to(DEV), xd, torch.ones(2, device=DEV), None, None, mean, invstd, True, 1e-5, [True, True, True])
    finally:
        norm.force_parts = old
    x64, g64 = x.double(), g.double()
    m64 = x64.mean((0, 2, 3))
    var64 = x64.var((0, 2, 3), unbiased=False)
    i64 = 1 / torch.sqrt(var64 + 1e-5)
    torch.testing.assert_close(mean.cpu().double(), m64, atol=1e-4, rtol=0)  # a float32 ulp of 1000 is 6e-5
    torch.testing.assert_close(invstd.cpu().double(), i64, rtol=5e-5, atol=0)
    xhat = (x64 - m64[None, :, None, None]) * i64[None, :, None, None]
    # y is off by (rounding of the float32 mean) * invstd at most: 3e-5 * ~100
    torch.testing.assert_close(y.detach().cpu().double(), xhat, atol=6e-3, rtol=0)
    gb64 = g64.sum((0, 2, 3))
    gw64 = (g64 * xhat).sum((0, 2, 3))
    torch.testing.assert_close(gb.cpu().double(), gb64, atol=2e-2, rtol=1e-4)
    torch.testing.assert_close(gw.cpu().double(), gw64, atol=0.5, rtol=1e-3)
    count = x64[:, 0].numel()
    gx64 = (g64 - gb64[None, :, None, None] / count - xhat * gw64[None, :, None, None] / count) \
        * i64[None, :, None, None]
    torch.testing.assert_close(gx.cpu().double(), gx64, atol=0.1, rtol=1e-2)


@pytest.mark.parametrize(("hw", "forced_parts"), [
    ((37, 41), 9),      # scalar loads (41 is no multiple of 4)
    ((36, 44), None),   # float4 loads, the heuristic's parts
    ((36, 44), 5),      # float4 loads, forced parts
])
def test_repeats_are_bit_identical(norm, hw, forced_parts):
    x = torch.randn(8, 3, *hw) * 3 + 2
    g = torch.randn(x.shape)
    w, b = torch.rand(3) + 0.5, torch.randn(3)
    norm.force_parts = forced_parts
    try:
        first = _run(DEV, x, g, w, b, (torch.zeros(3), torch.ones(3)), True)
        second = _run(DEV, x, g, w, b, (torch.zeros(3), torch.ones(3)), True)
    finally:
        norm.force_parts = None
    for a, b_ in zip(first, second):
        assert torch.equal(a, b_)


def test_single_value_per_channel_keeps_torch_running_var():
    """M = 1: biased var 0, unbiased var 0/0 -> running_var NaN, as on CPU."""
    x = torch.randn(1, 3)
    out = []
    for device in ("cpu", DEV):
        rm, rv = torch.zeros(3, device=device), torch.ones(3, device=device)
        y, mean, invstd = torch.native_batch_norm(x.to(device), None, None, rm, rv, True, 0.1, 1e-5)
        out.append([t.cpu() for t in (mean, invstd, rm, rv)])
        assert y.abs().max().item() < 1e-3
    for e, a in zip(*out):
        torch.testing.assert_close(a, e, equal_nan=True)


def test_parts_heuristic(norm):
    """About 8 work-groups per compute unit over all channels, each with 4096 elements at least."""
    old = norm.compute_units
    norm.compute_units = 132  # an H200
    try:
        assert norm.parts(64, 64 * 112 * 112) == 17      # resnet50 stem: 1088 work-groups
        assert norm.parts(256, 64 * 56 * 56) == 5
        assert norm.parts(2048, 64 * 7 * 7) == 1
        assert norm.parts(64, 8 * 12) == 1               # small problems stay in one part
        assert norm.parts(1, 10_000) == 2
    finally:
        norm.compute_units = old


def test_partial_group_and_vector_width(norm):
    """A small part gets a smaller work-group (MIN_ITEM_VECTORS loads per item, a warp at least); float4
    loads need L and the offsets of x, y and dy to be multiples of 4."""
    from tunecl.kernels.ops import norm as module
    assert norm.partial_group(10**6) == norm.group
    assert norm.partial_group(1) == min(module.MIN_GROUP, norm.group)
    if norm.group >= 64:
        assert norm.partial_group(64 * module.MIN_ITEM_VECTORS) == 64
    width = norm.vector_width
    assert width(196, {"x": (None, 0), "y": (None, 8)}) == 4
    assert width(49, {"x": (None, 0), "y": (None, 0)}) == 1
    assert width(196, {"x": (None, 2), "y": (None, 0)}) == 1
    assert width(196, {"x": (None, 0), "dy": (None, 6), "y": None}) == 1


@pytest.mark.parametrize("start", [0, 1, 2, 4], ids=lambda s: f"start{s}")
def test_float4_path_with_offsets(start, norm):
    """L = 8: x, dy and the parameters are views starting `start` floats into their storage (4: the float4
    path on an offset view; 1, 2: the scalar fallback), forward and backward called directly."""
    norm.force_parts = 3
    try:
        base, gbase = torch.randn(5 * 3 * 8 + start) * 2 + 1, torch.randn(5 * 3 * 8 + start)

        def run(device):
            x = base.to(device)[start:].view(5, 3, 8)
            g = gbase.to(device)[start:].view(5, 3, 8)
            w, b = torch.linspace(0.5, 1.5, 3, device=device), torch.linspace(-1, 1, 3, device=device)
            rm, rv = torch.zeros(3, device=device), torch.ones(3, device=device)
            with config.override(fallback="error"):
                y, mean, invstd = torch.native_batch_norm(x, w, b, rm, rv, True, 0.2, 1e-5)
                grads = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, True, 1e-5,
                                                                  [True, True, True])
            return [t.cpu() for t in (y, mean, invstd, rm, rv, *grads)]
        for e, a in zip(run("cpu"), run(DEV)):
            torch.testing.assert_close(a, e, atol=5e-5, rtol=1e-4)
    finally:
        norm.force_parts = None


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_non_contiguous_input(layout):
    """The adapter takes strided input (a contiguous copy runs the kernels)."""
    base = torch.randn(4, 6, 5, 8) * 2 + 1
    g = torch.randn(4, 6, 5, 8)
    w, b = torch.rand(6) + 0.5, torch.randn(6)

    def run(device):
        if layout == "channels_last":
            x = base.to(device).contiguous(memory_format=torch.channels_last)
        else:
            x = base.transpose(2, 3).contiguous().to(device).transpose(2, 3)
        assert not x.is_contiguous()
        x.requires_grad_(True)
        params = [p.detach().clone().to(device).requires_grad_(True) for p in (w, b)]
        rm, rv = torch.zeros(6, device=device), torch.ones(6, device=device)
        with config.override(fallback="error"):
            y = F.batch_norm(x, rm, rv, *params, training=True, momentum=0.3)
            y.backward(g.to(device))
        return [t.detach().cpu() for t in (y, rm, rv, x.grad, *(p.grad for p in params))]
    for e, a in zip(run("cpu"), run(DEV)):
        torch.testing.assert_close(a, e, atol=5e-5, rtol=1e-4)


def test_channels_past_the_grid(norm, monkeypatch):
    """More channels than a grid dimension takes: the partial kernels loop over channels."""
    from tunecl.kernels.ops import norm as module
    monkeypatch.setattr(module, "MAX_GRID_GROUPS", 3)
    for forced in (1, 2):
        norm.force_parts = forced
        try:
            _compare((3, 10, 12), True, True, True)
            _compare((3, 10, 5), True, True, True)
        finally:
            norm.force_parts = None


@pytest.mark.parametrize("forced", [None, 1, 7])
@pytest.mark.parametrize("shape", [(16, 3, 28, 28), (16, 3, 27, 27)], ids=["L784", "L729"])
def test_big_mean_with_an_outlying_first_element(norm, forced, shape):
    """The statistics shift by the channel's first element K; here K lies 1000 std from the mean (mean
    1e3, std 0.1) and the variance must still be accurate: the per-item (count, mean, M2) merges do not
    depend on K being typical. Also a mean of -5e3 with std 1e-2."""
    x = 1000 + 0.1 * torch.randn(shape)
    x[0, :, 0, 0] = 1100
    x[:, 2] = -5e3 + 1e-2 * torch.randn(x[:, 2].shape)
    norm.force_parts = forced
    try:
        with config.override(fallback="error"):
            _, mean, invstd = torch.native_batch_norm(x.to(DEV), None, None, None, None, True, 0.1, 0.0)
    finally:
        norm.force_parts = None
    x64 = x.double()
    m64, v64 = x64.mean((0, 2, 3)), x64.var((0, 2, 3), unbiased=False)
    torch.testing.assert_close(mean.cpu().double(), m64, atol=5e-4, rtol=0)  # a float32 ulp of 5000: 4.9e-4
    torch.testing.assert_close(1 / invstd.cpu().double() ** 2, v64, rtol=2e-6, atol=0)


# -- an in-place relu right after a batch norm (or an add) runs inside its launch -------------------------------
def _block(channels: int = 8) -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.BatchNorm2d(channels),
                               torch.nn.ReLU(inplace=True), torch.nn.Conv2d(channels, 4, 1), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(inplace=True))


def _fusions(monkeypatch) -> list[bool]:
    """Whether each in-place relu from here on was folded into the launch before it."""
    device = state.get().device
    results, replace = [], device.replace_held

    def recording(tag, op="relu"):
        results.append(replace(tag, op))
        return results[-1]

    monkeypatch.setattr(device, "replace_held", recording)
    return results


@pytest.mark.parametrize("train", [True, False])
def test_relu_after_batch_norm_is_fused_and_bit_identical(train, monkeypatch):
    x = torch.randn(2, 3, 9, 7)
    x[0, 1, 2, 3] = float("nan")   # relu keeps NaN (eval: only that element; train: its channels)
    runs = {}
    for fused in (True, False):
        model = _block().to("opencl").train(train)
        fusions = _fusions(monkeypatch) if fused else None
        if not fused:
            monkeypatch.setattr(state.get().device, "replace_held", lambda tag, op="relu": False)
        xd = x.to("opencl").requires_grad_()
        y = model(xd)
        y.backward(torch.ones_like(y))
        runs[fused] = [t.detach().cpu() for t in (y, xd.grad, *[p.grad for p in model.parameters()])]
        if fused:
            assert fusions == [True, True]
        monkeypatch.undo()
    for a, b in zip(runs[True], runs[False]):
        assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    clean = x.nan_to_num()   # (against the CPU without the NaN, which convolutions spread differently)
    torch.testing.assert_close(_block().to("opencl").train(train)(clean.to("opencl")).detach().cpu(),
                               _block().train(train)(clean).detach(), atol=1e-5, rtol=1e-4)


def _block6(channels: int = 8, low: float = 0.0, high: float = 6.0) -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.BatchNorm2d(channels),
                               torch.nn.Hardtanh(low, high, inplace=True), torch.nn.Conv2d(channels, 4, 1),
                               torch.nn.BatchNorm2d(4), torch.nn.Hardtanh(low, high, inplace=True))


@pytest.mark.parametrize("grad", [False, True])
def test_relu6_after_batch_norm_is_fused(grad, monkeypatch):
    """ReLU6(inplace=True) after a batch norm runs inside its launch, bit for bit as unfused (NaN and -0.0
    pass through as the elementwise hardtanh passes them), in inference and where autograd records it (its
    backward reads the result, so no clone of the input enqueues the batch norm first), gradients too."""
    x = 3 * torch.randn(2, 3, 9, 7)
    x[0, 1, 2, 3] = float("nan")
    runs = {}
    for fused in (True, False):
        model = _block6().to("opencl").eval()
        fusions = _fusions(monkeypatch) if fused else None
        if not fused:
            monkeypatch.setattr(state.get().device, "replace_held", lambda tag, op="relu": False)
        xd = x.to("opencl").requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            y = model(xd)
        runs[fused] = [y.detach().cpu()]
        if grad:
            y.backward(torch.ones_like(y))
            runs[fused] += [t.cpu() for t in (xd.grad, *[p.grad for p in model.parameters()])]
        if fused:
            assert fusions == [True, True]
        monkeypatch.undo()
    for a, b in zip(runs[True], runs[False]):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num().view(torch.int32),
                                                                b.nan_to_num().view(torch.int32))
    clean = x.nan_to_num()
    with torch.no_grad():
        torch.testing.assert_close(_block6().to("opencl").eval()(clean.to("opencl")).cpu(),
                                   _block6().eval()(clean), atol=1e-5, rtol=1e-4)


def test_hardtanh_of_other_bounds_is_not_fused(monkeypatch):
    model = _block6(low=-1.0, high=2.0).to("opencl").eval()
    fusions = _fusions(monkeypatch)
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        y = model(x.to("opencl")).cpu()
    assert fusions == []   # only hardtanh_(0, 6) asks
    with torch.no_grad():
        torch.testing.assert_close(y, _block6(low=-1.0, high=2.0).eval()(x), atol=1e-5, rtol=1e-4)


def test_relu_is_not_fused_across_another_op_or_into_a_view(monkeypatch):
    fusions = _fusions(monkeypatch)
    bn = torch.nn.BatchNorm2d(4).to("opencl")
    x = torch.randn(2, 4, 5, 5)
    expected = F.batch_norm(x, None, None, training=True)
    cases = [(lambda y: y.mul_(0.5).relu_(), lambda e: (e * 0.5).relu()),         # another op came between
             (lambda y: (y[:, :2].relu_(), y)[1], lambda e: torch.cat([e[:, :2].relu(), e[:, 2:]], 1)),  # a view
             (lambda y: torch.relu(y), lambda e: e.relu()),                          # not in place
             (lambda y: y.relu_(), lambda e: e.relu())]                              # fused
    for op, reference in cases:
        fusions.clear()
        got = op(bn(x.to("opencl"))).cpu()
        torch.testing.assert_close(got, reference(expected), atol=1e-5, rtol=1e-4)
        assert fusions == ([True] if reference is cases[-1][1] else [False] * len(fusions))


def test_backward_without_an_input_gradient_matches_cpu():
    """Only the weight and bias need gradients (the input does not require grad)."""
    torch.manual_seed(5)
    x = torch.randn(3, 4, 5, 5)
    grads = {}
    for device in ("cpu", "opencl"):
        bn = torch.nn.BatchNorm2d(4).to(device)
        (bn(x.to(device)) * torch.arange(4.0, device=device).view(1, 4, 1, 1)).pow(2).sum().backward()
        grads[device] = [bn.weight.grad.cpu(), bn.bias.grad.cpu()]
    for a, b in zip(grads["cpu"], grads["opencl"]):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_functional_batch_norm_reaches_native_batch_norm_directly(strict):
    """F.batch_norm calls native_batch_norm alone (ops/composite.py's batch_norm): nothing else reaches the
    device, not the reserve tensor of torch's _batch_norm_impl_index route; the output and the running
    statistics are those of that route, bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = (torch.randn(3, 4, 5, 6) * 2 + 1).to(DEV)
    w, b = (torch.rand(4) + 0.5).to(DEV), torch.randn(4).to(DEV)
    stats = [(torch.randn(4) * 0.1).to(DEV), (torch.rand(4) + 0.5).to(DEV)]
    other = [s.clone() for s in stats]
    with Log():
        y = F.batch_norm(x, *stats, w, b, training=True, momentum=0.3, eps=1e-4)
    assert seen == [torch.ops.aten.native_batch_norm.default]
    expected = torch.ops.aten._batch_norm_impl_index.default.decompose(x, w, b, *other, True, 0.3, 1e-4, False)[0]
    assert torch.equal(y.cpu(), expected.cpu())
    for s, o in zip(stats, other):
        assert torch.equal(s.cpu(), o.cpu())


_BAD_CALLS = {
    "running_mean_size": lambda x, s, w: F.batch_norm(x, s[:3], s, w, w, training=True),
    "running_var_size": lambda x, s, w: F.batch_norm(x, s, s[:2], w, w, training=False),
    "weight_size": lambda x, s, w: F.batch_norm(x, s, s, w[:1], w, training=True),
    "bias_size": lambda x, s, w: F.batch_norm(x, s, s, w, w[:3], training=False),
    "eval_without_running_mean": lambda x, s, w: F.batch_norm(x, None, s, w, w, training=False),
    "eval_without_running_var": lambda x, s, w: F.batch_norm(x, s, None, w, w, training=False),
    "one_dim_input": lambda x, s, w: torch.batch_norm(x[0, 0, 0], w, w, s, s, False, 0.1, 1e-5, False),
}


@pytest.mark.parametrize("case", sorted(_BAD_CALLS))
def test_batch_norm_argument_errors_match_cpu(case):
    """Calls that torch's checks refuse raise as on the CPU (ops/composite.py leaves them to torch's route)."""
    def call(device):
        x = torch.ones(2, 4, 3, 3, device=device)
        s, w = torch.ones(4, device=device), torch.ones(4, device=device)
        try:
            _BAD_CALLS[case](x, s, w)
        except Exception as error:   # noqa: BLE001 (the CPU's own exception is the reference)
            return type(error), str(error).splitlines()[0]
        return None

    expected = call("cpu")
    assert expected is not None
    assert call(DEV) == expected


def test_batch_norm_of_an_empty_input_matches_cpu(strict):
    x = torch.randn(0, 4, 3, 3)
    w, b = torch.rand(4) + 0.5, torch.randn(4)
    stats = [torch.zeros(4), torch.ones(4)]
    expected = F.batch_norm(x, *[s.clone() for s in stats], w, b, training=True)
    actual = F.batch_norm(x.to(DEV), *[s.to(DEV) for s in stats], w.to(DEV), b.to(DEV), training=True)
    assert actual.device.type == "opencl" and torch.equal(actual.cpu(), expected)


def _activation_input(shape: tuple[int, ...], mask: str) -> torch.Tensor:
    """Values for the activation's tensor: both sides of the mask's bounds and exactly on them; for relu also
    NaN, which passes the gradient (CPU torch's hardtanh_backward passes it in its scalar loop and zeroes it
    in its vectorised one, so it is no reference for relu6 there; the kernels pass it, as CUDA's do)."""
    a = torch.randn(shape, dtype=torch.float64) * 4
    flat = a.view(-1)
    flat[::7] = 0.0
    if mask == "relu6":
        flat[3::11] = 6.0
        return a
    a = a.clamp(min=0)   # a relu's output
    a.view(-1)[5::13] = float("nan")
    return a


@pytest.mark.parametrize("mask", ["relu", "relu6"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 5, 4, 4), (3, 2, 1100), (2, 5, 1, 1), (37, 1)])
def test_backward_through_an_activation_mask_matches_its_two_ops(shape, train, mask, parts):
    """``batch_norm_backward_masked`` against CPU float64 ``threshold_backward`` / ``hardtanh_backward`` then
    ``native_batch_norm_backward``; the float4 path (L a multiple of 4) and the scalar one."""
    from tunecl.backend.ops.nn import batch_norm_backward_masked

    torch.manual_seed(0)
    c = shape[1]
    x, grad = torch.randn(shape, dtype=torch.float64) + 1.5, torch.randn(shape, dtype=torch.float64)
    act = _activation_input(shape, mask)
    weight = torch.rand(c, dtype=torch.float64) + 0.5
    rm, rv = torch.randn(c, dtype=torch.float64), torch.rand(c, dtype=torch.float64) + 0.5
    dims = [0] + list(range(2, len(shape)))
    mean = x.mean(dims)
    invstd = 1 / (x.var(dims, unbiased=False) + 1e-5).sqrt()
    masked = (torch.ops.aten.threshold_backward(grad, act, 0) if mask == "relu"
              else torch.ops.aten.hardtanh_backward(grad, act, 0, 6))
    expected = torch.ops.aten.native_batch_norm_backward(masked, x, weight, rm, rv, mean, invstd, train, 1e-5,
                                                         [True, True, True])
    on = [t.float().to(DEV) for t in (grad, act, x, weight, rm, rv, mean, invstd)]
    got = batch_norm_backward_masked(on[0], on[1], mask, *on[2:], train, 1e-5, [True, True, True])
    for g, e, name in zip(got, expected, ("grad_input", "grad_weight", "grad_bias")):
        torch.testing.assert_close(g.cpu().double(), e, rtol=1e-4, atol=1e-4, msg=name)


def test_backward_through_a_mask_of_another_layout_takes_the_two_ops():
    """A non-contiguous activation tensor: the general route (the masked gradient, then the backward)."""
    from tunecl.backend.ops.nn import batch_norm_backward_masked

    x, grad = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    act = torch.randn(2, 4, 4, 3).permute(0, 3, 1, 2)
    weight, mean, invstd = torch.rand(3) + 0.5, x.mean([0, 2, 3]), torch.rand(3) + 0.5
    masked = torch.ops.aten.threshold_backward(grad, act, 0)
    expected = torch.ops.aten.native_batch_norm_backward(masked, x, weight, None, None, mean, invstd, True, 1e-5,
                                                         [True, False, True])
    got = batch_norm_backward_masked(grad.to(DEV), act.to(DEV), "relu", x.to(DEV), weight.to(DEV), None, None,
                                     mean.to(DEV), invstd.to(DEV), True, 1e-5, [True, False, True])
    assert got[1] is None
    for g, e in ((got[0], expected[0]), (got[2], expected[2])):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="relu"):
        batch_norm_backward_masked(grad.to(DEV), act.to(DEV), "gelu", x.to(DEV), weight.to(DEV), None, None,
                                   mean.to(DEV), invstd.to(DEV), True, 1e-5, [True, True, True])
