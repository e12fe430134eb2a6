"""Elementwise ops on opencl vs CPU: forward and backward, with strided, broadcast, 0-dim, empty
and size-1 operands. Every case runs with TUNECL_FALLBACK=error (inside check_op)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op, strided, t

X = lambda *shape: torch.randn(shape)
POS = lambda *shape: torch.rand(shape) + 0.5

# one layout per family member keeps compiles down; the layout matrix below covers the rest
UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "relu": torch.relu, "relu6": F.relu6, "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.7),
    "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "threshold": lambda x: F.threshold(x, 0.1, -2.0), "clamp": lambda x: x.clamp(-0.5, 0.5),
    "clamp_min": lambda x: x.clamp(min=0.1), "clamp_max": lambda x: x.clamp(max=0.1),
    "square": lambda x: x ** 2, "pow3": lambda x: x ** 3, "sign": torch.sign, "floor": torch.floor,
    "round": torch.round, "erf": torch.erf, "sin": torch.sin,
}
UNARY_POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
                  "log1p": torch.log1p, "pow_half": lambda x: x ** 0.5, "pow_tensor": lambda x: x ** (x - 0.5)}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_on_strided_input(name):
    x = X(6, 10)
    x[0, :4] = torch.tensor([-1.0, 0.0, 1.0, 3.0])  # hit the kinks of relu-like ops exactly
    check_op(UNARY[name], strided(x))


@pytest.mark.parametrize("name", sorted(UNARY_POSITIVE))
def test_unary_of_positive_input(name):
    check_op(UNARY_POSITIVE[name], t(POS(5, 4)), atol=2e-5)


BINARY = {
    "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=-2.5),
    "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum, "minimum": torch.minimum, "pow": lambda a, b: a.abs().add(0.1) ** b,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "atan2_free_where": lambda a, b: torch.where(a > b, a, b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcast_against_transposed(name):
    # (4, 5) transposed view against a (4, 1) column: broadcasting and strides in one call
    check_op(BINARY[name], t(X(5, 4)), X(4, 1), atol=2e-5)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "row", "column", "zero-dim", "python-scalar",
                                    "cpu-scalar-tensor", "empty", "size-one-dims", "3d-permuted", "offset"])
def test_layouts(layout):
    cases = {
        "contiguous": (X(3, 4), X(3, 4)),
        "transposed": (t(X(4, 3)), t(X(4, 3))),
        "row": (X(3, 4), X(4)),
        "column": (X(3, 1), X(1, 4)),
        "zero-dim": (X(3, 4), X()),
        "python-scalar": (X(3, 4), 2.5),
        "cpu-scalar-tensor": (X(3, 4), Input(torch.tensor(1.5), grad=False)),
        "empty": (X(0, 4), X(4)),
        "size-one-dims": (X(1, 3, 1), X(2, 1, 1)),
        "3d-permuted": (Input(X(2, 3, 4), lambda v: v.permute(2, 0, 1)), X(4, 2, 1)),
        "offset": (Input(X(5, 4), lambda v: v[2:]), Input(X(5, 4), lambda v: v[1:4])),
    }
    a, b = cases[layout]
    for fn in (lambda x, y: x + y, lambda x, y: x * y - y, lambda x, y: (x > y).float() + x):
        check_op(fn, a, b)


def test_zero_dim_tensors():
    check_op(lambda a, b: a * b + 1, X(), X())


def test_inplace_ops_on_views(strict):
    base = torch.randn(4, 6)
    d = base.to("opencl")
    for v_cpu, v_dev in ((base[1], d[1]), (base[:, 2], d[:, 2]), (base.t()[::2], d.t()[::2])):
        v_cpu.mul_(3).add_(1)
        v_dev.mul_(3).add_(1)
    torch.testing.assert_close(d.cpu(), base)
    d[:, 0].zero_()
    base[:, 0].zero_()
    d[2:] = 7.0
    base[2:] = 7.0
    torch.testing.assert_close(d.cpu(), base)


COMPARISONS = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_comparisons_give_bool(name):
    a = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    out = check_op(COMPARISONS[name], a, torch.tensor([2.0, 2.0, 2.0]), grad=False)
    assert out.dtype == torch.bool
    check_op(lambda x: COMPARISONS[name](x, 2), a, grad=False)


def test_integer_and_bool_arithmetic():
    i = torch.arange(-6, 6).reshape(3, 4)
    check_op(lambda x: x * 3 - 1, i)
    check_op(lambda x: x.int() + x.short(), i)
    check_op(lambda x: x.abs(), i)
    check_op(lambda x: x / 4, i)  # true division of ints is float
    check_op(lambda x: (x > 0) + (x < 3), i)
    check_op(lambda x: x.to(torch.uint8) + 250, i)  # wraps like torch


def test_ternary_ops():
    check_op(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), X(3, 4), t(X(4, 3)), X(4))
    check_op(lambda a, b, c: torch.addcdiv(a, b, c.abs() + 1, value=-2), X(3, 4), X(3, 4), X(1, 4))
    check_op(lambda a, b, w: torch.lerp(a, b, w), X(3, 4), X(3, 4), torch.rand(3, 4))
    check_op(lambda a, lo, hi: torch.clamp(a, lo, hi), X(3, 4), X(4) - 1, X(3, 1) + 1)


def test_where_and_masked_fill():
    a, b = X(3, 4), X(4)
    mask = torch.rand(3, 4) > 0.5
    check_op(lambda x, y, m: torch.where(m, x, y), a, b, mask)
    check_op(lambda x, m: torch.where(m, x, 0.0), a, mask)
    check_op(lambda x, m: torch.where(m, 2, x), a, mask)
    check_op(lambda x, m: x.masked_fill(m, -1.5), a, mask)
    check_op(lambda x, m: x.masked_fill(m[0], float("-inf")), a, mask)
    check_op(lambda x, m, v: x.masked_fill(m, v), a, mask, Input(torch.tensor(3.0), grad=False))


def test_activation_backward_ops_directly():
    g, x = X(4, 5), X(4, 5)
    y = torch.sigmoid(x)
    check_op(lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.0), g, x, grad=False)
    # the direct path (same shape, dtype, dense) and torch's structured one (broadcast, transposed,
    # mixed dtypes) give CPU torch's results
    check_op(lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.25), g, x, grad=False)
    check_op(lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.0), g, X(5), grad=False)
    check_op(lambda g, x: torch.ops.aten.threshold_backward(g.t(), x.t(), 0.0), g, x, grad=False)
    check_op(lambda g, x: torch.ops.aten.threshold_backward(g, x.half(), 0.0), g, x, grad=False, atol=1e-3)
    check_op(lambda g, y: torch.ops.aten.sigmoid_backward(g, y), g, y, grad=False)
    check_op(lambda g, y: torch.ops.aten.tanh_backward(g, y), g, y.tanh(), grad=False)
    # hardtanh_backward and hardswish_backward: the direct path, a broadcast either way, a transposed pair and
    # promoted dtypes (a half gradient of a float input comes back float, as in torch)
    for op, params in ((torch.ops.aten.hardtanh_backward, (-0.5, 0.5)), (torch.ops.aten.hardswish_backward, ())):
        check_op(lambda g, x: op(g, x * 3, *params), g, x, grad=False)
        check_op(lambda g, x: op(g, x * 3, *params), g, X(5), grad=False)
        check_op(lambda g, x: op(g, x * 3, *params), X(5), x, grad=False)
        check_op(lambda g, x: op(g.t(), x.t() * 3, *params), g, x, grad=False)
        check_op(lambda g, x: op(g.half(), x * 3, *params), g, x, grad=False, atol=1e-3)
        check_op(lambda g, x: op(g, (x * 3).half(), *params), g, x, grad=False, atol=1e-2)
    check_op(lambda g, x: torch.ops.aten.leaky_relu_backward(g, x, 0.1, False), g, x, grad=False)


def test_float16_storage_and_compute():
    h = torch.randn(3, 5).half()
    check_op(lambda x: x * 2 + 1, Input(h, grad=False), atol=1e-3)
    check_op(lambda x: x.float(), Input(h, grad=False))
    check_op(lambda x: x.half(), X(3, 5))


def test_inplace_arithmetic_keeps_torch_rules(strict):
    i = torch.arange(4, device="opencl")
    i.add_(2).mul_(3)
    assert i.cpu().tolist() == [6, 9, 12, 15]
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(1.5)
    with pytest.raises(RuntimeError, match="Subtraction"):
        (i > 1).sub_(1)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.ones(3, device="opencl").add_(torch.ones(2, 3, device="opencl"))
    f = torch.ones(2, 3, device="opencl")
    f.add_(torch.arange(3.0, device="opencl"), alpha=2).div_(torch.tensor(2.0)).sub_(0.5)
    assert f.cpu().tolist() == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]

    x = torch.arange(6.0, device="opencl")
    with pytest.raises(RuntimeError, match="single memory location|overlap"):
        x[1:].add_(x[:-1])
    x.mul_(x)  # the same view is fine
    assert x.cpu().tolist() == [0.0, 1.0, 4.0, 9.0, 16.0, 25.0]



@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_a_number_added_in_place_to_an_integer_tensor_keeps_its_dtype(dtype, strict):
    """A step counter (``num_batches_tracked.add_(1)``) and its kin, 0-dim, 1-d and strided, as CPU torch does
    them (uint8 and int8 wrap around); what torch refuses is refused."""
    for cpu in (torch.tensor(5, dtype=dtype), torch.arange(7, dtype=dtype) * 17,
                (torch.arange(12, dtype=dtype) * 11).reshape(3, 4).t()):
        device = cpu.to("opencl")
        for op in (lambda t: t.add_(1), lambda t: t.add_(100, alpha=3), lambda t: t.sub_(7), lambda t: t.mul_(3)):
            op(cpu)
            op(device)
            assert device.dtype == dtype and torch.equal(device.cpu(), cpu)
        for refused in (lambda t: t.add_(1.5), lambda t: t.div_(2), lambda t: t.mul_(0.5)):
            with pytest.raises(RuntimeError, match="can't be cast"):
                refused(device)
    flags = torch.tensor([True, False], device="opencl")
    with pytest.raises(RuntimeError, match="can't be cast"):
        flags.add_(1)


def test_in_place_and_functional_dense_calls_share_their_plan(strict):
    """``a.add_(b)`` on contiguous operands takes the launch ``a + b`` has (its output is laid out like a), and
    gives the same bits; a strided self is keyed by its strides."""
    from tunecl.backend import state

    a, b = torch.randn(5, 7).to("opencl"), torch.randn(5, 7).to("opencl")
    expected = (a + b).cpu()
    launches = state.get().pointwise.launches
    before = len(launches)
    a.add_(b)
    assert len(launches) == before and torch.equal(a.cpu(), expected)
    c = torch.randn(7, 5).to("opencl").t()
    expected = c.cpu() * 2.0
    c.mul_(2.0)
    assert torch.equal(c.cpu(), expected) and c.stride() == (1, 5)


MORE = {
    "exp2": lambda x, y: torch.exp2(x), "atan2": torch.atan2, "remainder": lambda x, y: torch.remainder(x, y.abs() + 0.5),
    "remainder_scalar": lambda x, y: x % 0.7, "floor_divide": lambda x, y: torch.floor_divide(x, y.abs() + 0.5),
    "floor_divide_scalar": lambda x, y: x // 0.3, "softplus": lambda x, y: F.softplus(x * 10, beta=2, threshold=5),
    "elu": lambda x, y: F.elu(x, 0.7), "selu": lambda x, y: F.selu(x), "elu_inplace_result": lambda x, y: F.elu(x * 1, inplace=True),
    "mse_mean": F.mse_loss, "mse_sum": lambda x, y: F.mse_loss(x, y, reduction="sum"),
    "mse_none": lambda x, y: F.mse_loss(x, y, reduction="none"),
}


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_elementwise_ops(name):
    check_op(MORE[name], X(4, 5), X(4, 5), atol=2e-5, grad="floor_divide" not in name)  # no derivative


def test_predicates_and_bitwise():
    x = torch.tensor([1.0, float("inf"), float("-inf"), float("nan"), -2.0])
    for fn in (torch.isinf, torch.isposinf, torch.isneginf, torch.isfinite, torch.isnan):
        check_op(fn, x, grad=False)
    check_op(torch.bitwise_not, torch.arange(-3, 3), grad=False)
    check_op(torch.bitwise_not, torch.tensor([True, False]), grad=False)
    check_op(lambda a, b: a & b | (a ^ b), torch.arange(6), torch.arange(6).flip(0), grad=False)
    check_op(lambda a, b: torch.logical_and(a, b) | torch.logical_xor(a > 0, b), X(3, 4), X(3, 4) > 0, grad=False)


def _launched_plans(monkeypatch):
    """Every (plan, element offsets) the pointwise family launches from here on, in order."""
    from tunecl.backend import state

    family = state.get().pointwise
    plans, at_offsets = [], family.at_offsets

    def recording(plan, offsets):
        chosen = at_offsets(plan, offsets)
        plans.append((chosen[0], tuple(offsets)))
        return chosen

    monkeypatch.setattr(family, "at_offsets", recording)
    return plans


@pytest.mark.parametrize("count", [1, 3, 4, 5, 7, 8, 9, 1027])
def test_dense_float_ops_run_four_elements_per_work_item(count, strict, monkeypatch):
    """Dense float32 operands take the float4 variant, whose last work-item finishes a count that is
    not a multiple of 4 element by element; element offsets that are not multiples of 4 (views) take the
    scalar twin, since a float4 access there would be misaligned. Unary, binary with a scalar, ternary
    and in-place ops, each exactly CPU torch's result."""
    plans = _launched_plans(monkeypatch)
    a, b, c = (torch.randn(count + 6) for _ in range(3))
    da, db, dc = (x.to("opencl") for x in (a, b, c))
    for start in range(6):       # element offsets 0..5 of every operand
        sa, sb, sc = (x[start:start + count] for x in (a, b, c))
        ta, tb, tc = (x[start:start + count] for x in (da, db, dc))
        plans.clear()
        cases = [(torch.relu(ta), torch.relu(sa)), (torch.add(ta, tb, alpha=-1.5), torch.add(sa, sb, alpha=-1.5)),
                 (ta * 3.0, sa * 3.0), (torch.addcmul(ta, tb, tc, value=0.5), torch.addcmul(sa, sb, sc, value=0.5)),
                 (torch.ops.aten.threshold_backward(tb, ta, 0.0), torch.ops.aten.threshold_backward(sb, sa, 0.0))]
        for got, want in cases:
            assert torch.equal(got.cpu(), want)
        views = [(plan, offsets) for plan, offsets in plans if any(offsets)]
        assert all(not plan.vec for plan, offsets in views if any(o % 4 for o in offsets))
        assert start % 4 or count == 1 or all(plan.vec for plan, _ in plans)   # (one element: no dims)
        inplace, expect = dc.clone(), c.clone()
        inplace[start:start + count].mul_(tb).sub_(ta)
        expect[start:start + count].mul_(sb).sub_(sa)
        assert torch.equal(inplace.cpu(), expect)


def test_other_layouts_and_dtypes_keep_one_element_per_work_item(strict, monkeypatch):
    plans = _launched_plans(monkeypatch)
    x = torch.randn(8, 12)
    d = x.to("opencl")
    for got, want in [(d.t() + 1, x.t() + 1), (d[:, ::2] * 2, x[:, ::2] * 2), (d + d[:1], x + x[:1]),
                      (d.half() * 2, x.half() * 2), (d.long() + 1, x.long() + 1), (d > 0, x > 0)]:
        assert torch.equal(got.cpu(), want)
    assert plans and all(not plan.vec for plan, _ in plans if plan.signature[0] not in ("copy",))


def test_relu_after_an_add_runs_inside_it(strict, monkeypatch):
    """``out += identity; out.relu_()`` (a residual block): the add waits, held, and the relu folds into it
    as ``add_relu``; results are CPU torch's, NaN and broadcasting included, and a relu that does not follow
    the add directly, or of another tensor, runs on its own."""
    from tunecl.backend import state

    device = state.get().device
    folded, replace = [], device.replace_held
    monkeypatch.setattr(device, "replace_held", lambda tag, op="relu": folded.append(replace(tag, op)) or folded[-1])
    a, b, bias = torch.randn(3, 8, 5, 5), torch.randn(3, 8, 5, 5), torch.randn(8, 1, 1)
    a[0, 0, 0, :2] = torch.tensor([float("nan"), -0.0])
    cases = [
        (lambda x, y, c: x.add_(y).relu_(), [True]),
        (lambda x, y, c: x.add_(c, alpha=-2.0).relu_(), [True]),              # a broadcast input
        (lambda x, y, c: (x + y).relu_(), [True]),                            # out of place, then relu_
        (lambda x, y, c: x.add_(y).mul_(2.0).relu_(), [False]),               # another op between
        (lambda x, y, c: (x.add_(y), y.relu_())[0], [False]),                 # relu of another tensor
        (lambda x, y, c: (x[:, :4].add_(y[:, :4]).relu_(), x)[1], []),         # a view: not even tried
    ]
    for op, expected in cases:
        folded.clear()
        got = op(a.to("opencl"), b.to("opencl"), bias.to("opencl")).cpu()
        want = op(a.clone(), b.clone(), bias.clone())
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
        assert folded == expected, op


# -- hardtanh_ under autograd: the backward reads the result ----------------------------------------------
def _hardtanh_runs(device: str, make, bounds=(0.0, 6.0), create_graph: bool = False, nan: bool = False):
    """``make(leaf)`` gives the tensor hardtanh_ overwrites; returns the output, the leaf's gradient and
    (with ``create_graph``) the gradient of that gradient's weighted sum by the upstream gradient."""
    torch.manual_seed(0)
    base = 4 * torch.randn(3, 5, 7)   # hardtanh and its mask are exact: float32 on both sides
    base[0, 0, :6] = torch.tensor([0.0, 6.0, -0.0, -0.5, 0.7, float("nan") if nan else 1.0])
    leaf = base.to(device).requires_grad_()
    target = make(leaf)
    up = torch.randn(target.shape).to(device).requires_grad_(create_graph)
    out = torch.ops.aten.hardtanh_(target, *bounds)
    (grad,) = torch.autograd.grad(out, leaf, up, create_graph=create_graph)
    second = None
    if create_graph:
        (second,) = torch.autograd.grad((grad * grad.detach()).sum(), up)
        second = second.cpu()
    return out.detach().cpu(), grad.detach().cpu(), second


@pytest.mark.parametrize("make", [lambda x: x * 2, lambda x: (x * 2)[1:, ::2], lambda x: (x * 2).transpose(0, 2),
                                  lambda x: (x + 0)[:, 1]], ids=["dense", "strided view", "transposed", "slice"])
@pytest.mark.parametrize("bounds", [(0.0, 6.0), (-0.5, 0.7), (1.0, 1.0)])
def test_hardtanh_inplace_gradients_match_cpu(make, bounds):
    """Values and gradients as CPU torch gives them (whose backward reads a copy of the input), views
    included (their base gets the gradient through the view), the bounds themselves included."""
    got, want = _hardtanh_runs("opencl", make, bounds), _hardtanh_runs("cpu", make, bounds)
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_hardtanh_inplace_passes_the_gradient_of_nan_as_the_formula_on_the_input_does():
    """A NaN input: its result is NaN, so the mask read from the result passes its gradient where the
    device's hardtanh_backward of the input passes it (as CUDA's kernels do; CPU torch's vectorised loop
    zeroes it, so it is no reference here)."""
    _, grad, _ = _hardtanh_runs("opencl", lambda x: x * 2, nan=True)
    torch.manual_seed(0)
    base = 4 * torch.randn(3, 5, 7)
    base[0, 0, :6] = torch.tensor([0.0, 6.0, -0.0, -0.5, 0.7, float("nan")])
    upstream = torch.randn(3, 5, 7).to("opencl")
    want = 2 * torch.ops.aten.hardtanh_backward(upstream, base.to("opencl") * 2, 0.0, 6.0)
    assert torch.equal(grad, want.cpu())


def test_hardtanh_inplace_double_backward_matches_cpu():
    got, want = (_hardtanh_runs(d, lambda x: x * 2, create_graph=True) for d in ("opencl", "cpu"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_hardtanh_inplace_keeps_autograd_errors():
    leaf = torch.randn(4, device="opencl", requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        F.relu6(leaf, inplace=True)
    out = F.relu6(leaf * 2, inplace=True)
    out.add_(1)   # the result the backward reads is overwritten
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    with torch.no_grad():   # nothing recorded: no graph, the version still moves
        y = leaf * 1
        version = y._version
        F.relu6(y, inplace=True)
    assert y.grad_fn is None and y._version > version


def test_hardtanh_inplace_records_no_clone():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(2, 3, device="opencl", requires_grad=True)
    y = x * 2
    with Ops() as ops:
        F.relu6(y, inplace=True).sum().backward()
    assert torch.ops.aten.clone.default not in ops.seen and torch.ops.aten.hardtanh_.default in ops.seen


@pytest.fixture
def direct_calls_counted(monkeypatch):
    """Counts the device kernels the backend's autograd kernels call without the dispatcher, by op name."""
    from tunecl.backend import direct_calls

    counts = {"hardtanh_": 0, "hardtanh_backward": 0}
    for name in counts:
        kernel = direct_calls.kernels[name]

        def counting(*args, _kernel=kernel, _name=name):
            counts[_name] += 1
            return _kernel(*args)

        monkeypatch.setitem(direct_calls.kernels, name, counting)
    return counts


@pytest.mark.parametrize("make", [lambda x: x * 2, lambda x: (x * 2)[1:, ::2], lambda x: (x + 0)[:, 1]],
                         ids=["dense", "strided view", "slice"])
def test_hardtanh_inplace_calls_the_device_kernels_directly_with_the_dispatchers_results(
        make, direct_calls_counted, monkeypatch):
    """Plain tensors, no dispatch mode: the autograd kernel of ``hardtanh_`` calls the device's
    ``hardtanh_`` and its backward ``hardtanh_backward`` without the dispatcher, and values and gradients
    are bit for bit those of the dispatcher's route."""
    from tunecl.backend import direct_calls

    direct = _hardtanh_runs("opencl", make)
    assert direct_calls_counted == {"hardtanh_": 1, "hardtanh_backward": 1}
    monkeypatch.setattr(direct_calls, "ENABLED", False)
    dispatched = _hardtanh_runs("opencl", make)
    assert direct_calls_counted == {"hardtanh_": 1, "hardtanh_backward": 1}
    for a, b in zip(direct[:2], dispatched[:2]):
        assert torch.equal(a, b)


def test_hardtanh_inplace_called_directly_moves_the_version_as_the_dispatcher_does(direct_calls_counted):
    """The version bump that ``ADInplaceOrView`` makes: with and without grad mode, a tensor that another
    node saved and ``hardtanh_`` then overwrote fails that node's backward."""
    leaf = torch.randn(4, device="opencl", requires_grad=True)
    for grad_mode in (True, False):
        y = leaf * 2
        z = y * y   # saves y
        version = y._version
        with torch.set_grad_enabled(grad_mode):
            F.relu6(y, inplace=True)
        assert y._version > version
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()
    assert direct_calls_counted["hardtanh_"] == 2


def test_hardtanh_inplace_of_a_negative_view_goes_through_the_dispatcher(direct_calls_counted):
    """A lazily negated view is materialised by its dispatch key before any kernel: that call takes the
    dispatcher, and gives CPU torch's values."""
    results = []
    for device in ("cpu", "opencl"):
        y = torch.tensor([-1.0, 3.0, 8.0], device=device) * 1
        view = torch._neg_view(y)
        F.relu6(view, inplace=True)
        results.append((y.cpu(), view.cpu()))
    assert direct_calls_counted["hardtanh_"] == 0
    for a, b in zip(*results):
        assert torch.equal(a, b)
