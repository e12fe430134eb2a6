"""``F.ctc_loss`` / ``nn.CTCLoss`` (aten ``_ctc_loss`` and ``_ctc_loss_backward``) on the device against CPU torch,
forward and backward: CPU torch in float64 as the reference of the device's float32 (and CPU float32 through
``check_op``), padded and concatenated targets, every reduction, ``zero_infinity`` with a target longer than its
input, blanks other than 0, repeated labels, lengths as lists and as tensors, int32 and int64 targets,
unbatched and non-contiguous inputs, inputs of one step, one label or empty targets, the aten ops directly
(their ``.out`` and ``.Tensor`` overloads too), and torch's errors. Every call runs with the CPU fallback forbidden."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

from tunecl import config

DEVICE = "opencl"
T, N, C = 7, 4, 5
INPUT_LENGTHS = [7, 6, 7, 3]
TARGET_LENGTHS = [3, 2, 4, 0]
PADDED = torch.tensor([[1, 1, 2, 0], [3, 4, 0, 0], [2, 2, 2, 1], [0, 0, 0, 0]])   # repeats need a blank between
# sample 2 (three 2s in a row, then a 1) needs 4 labels + 2 blanks = 6 <= 7 steps


def _log_probs(steps: int = T, batch: int = N, labels: int = C, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(steps, batch, labels, dtype=torch.float64, generator=generator).log_softmax(2)


def _concatenated(padded: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    return torch.cat([row[:length] for row, length in zip(padded, lengths)])


def against_float64(fn, log_probs: torch.Tensor, *args, view=lambda t: t, atol: float = 2e-5,
                    rtol: float = 2e-5) -> torch.Tensor:
    """``fn(view(log_probs), *args)`` on the device in float32 against CPU torch in float64, forward and the
    gradient of a random weighting of the result; tensors among ``args`` go to the device as they are."""
    with config.override(fallback="error"):
        expected_leaf = log_probs.detach().clone().requires_grad_(True)
        actual_leaf = log_probs.detach().float().to(DEVICE).requires_grad_(True)
        expected = fn(view(expected_leaf), *args)
        actual = fn(view(actual_leaf), *(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args))
        assert actual.device.type == DEVICE and actual.dtype == torch.float32
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual.detach().cpu().double(), expected.detach(), atol=atol, rtol=rtol,
                                   equal_nan=True)
        upstream = torch.randn(expected.shape, dtype=torch.float64)
        (expected * upstream).sum().backward()
        (actual * upstream.float().to(DEVICE)).sum().backward()
        torch.testing.assert_close(actual_leaf.grad.cpu().double(), expected_leaf.grad, atol=atol, rtol=rtol,
                                   equal_nan=True)
    return actual


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_loss_and_gradient(reduction, layout):
    targets = PADDED if layout == "padded" else _concatenated(PADDED, TARGET_LENGTHS)
    against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, TARGET_LENGTHS, reduction=reduction), _log_probs(),
                    targets)


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_impossible_alignments(reduction, zero_infinity, layout):
    """Sample 1's 4 labels do not fit its 3 steps and sample 2's repeats (2, 2, 2) need 5 steps of its 4: both
    losses are infinite (no error); zero_infinity makes them and their gradients 0, else the gradients are NaN."""
    targets = torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4], [2, 2, 2, 0]])
    target_lengths, input_lengths = [2, 4, 3], [7, 3, 4]
    if layout == "concatenated":
        targets = _concatenated(targets, target_lengths)
    result = against_float64(lambda x, y: F.ctc_loss(x, y, input_lengths, target_lengths, reduction=reduction,
                                                     zero_infinity=zero_infinity), _log_probs(batch=3), targets)
    if reduction == "none":
        assert result[0].isfinite()
        assert (result[1:] == 0).all() if zero_infinity else result[1:].isinf().all()


@pytest.mark.parametrize("blank", [1, C - 1])
def test_blank_other_than_0(blank):
    targets = torch.tensor([[0, 0, 2, 3], [3, 4, 4, 0], [2, 2, 1, 0], [4, 0, 2, 2]])
    targets = torch.where(targets == blank, (blank + 1) % C, targets)
    for reduction in ("none", "mean"):
        against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, [4, 3, 3, 2], blank=blank,
                                                reduction=reduction), _log_probs(), targets)


def test_targets_holding_the_blank():
    """torch does not refuse a target equal to the blank: its extended sequence has the blank twice in a row."""
    against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, [3, 2, 4, 1], reduction="none"), _log_probs(),
                    torch.tensor([[0, 1, 0, 0], [2, 0, 0, 0], [1, 0, 0, 2], [0, 0, 0, 0]]))


@pytest.mark.parametrize("lengths_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("lengths_device", ["cpu", DEVICE])
def test_lengths_as_tensors(lengths_dtype, lengths_device):
    lengths = [torch.tensor(v, dtype=lengths_dtype, device=lengths_device) for v in (INPUT_LENGTHS, TARGET_LENGTHS)]
    for targets in (PADDED, _concatenated(PADDED, TARGET_LENGTHS)):
        against_float64(lambda x, y: F.ctc_loss(x, y, *lengths, reduction="sum"), _log_probs(), targets)


@pytest.mark.parametrize("targets_dtype", [torch.int32, torch.int64])
def test_target_dtypes_and_cpu_targets(targets_dtype):
    targets = PADDED.to(targets_dtype)
    against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, TARGET_LENGTHS), _log_probs(), targets)
    against_float64(lambda x: F.ctc_loss(x, targets, INPUT_LENGTHS, TARGET_LENGTHS), _log_probs())   # on the CPU


def test_unbatched_input():
    log_probs = _log_probs(batch=1)[:, 0]
    targets = torch.tensor([1, 3, 3])
    for reduction in ("none", "mean", "sum"):
        against_float64(lambda x, y: F.ctc_loss(x, y, [T], [3], reduction=reduction), log_probs, targets)
    against_float64(lambda x, y, i, t: F.ctc_loss(x, y, i, t, reduction="none"), log_probs, targets[:2],
                    torch.tensor(T - 1), torch.tensor(2))


def test_non_contiguous_log_probs():
    batch_first = _log_probs(steps=N, batch=T)   # (N, T, C), seen as (T, N, C)
    against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, TARGET_LENGTHS, reduction="none"), batch_first,
                    PADDED, view=lambda t: t.transpose(0, 1))
    wide = _log_probs(labels=2 * C)   # every other label
    against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, TARGET_LENGTHS, reduction="sum"), wide,
                    _concatenated(PADDED, TARGET_LENGTHS), view=lambda t: t[..., ::2])
    strided_targets = torch.stack([PADDED, PADDED + 100], 2)[..., 0]   # (N, 4) with strides (8, 2)
    against_float64(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, TARGET_LENGTHS), _log_probs(), strided_targets)


@pytest.mark.parametrize("steps, batch, labels, targets, input_lengths, target_lengths", [
    (1, 1, 1, torch.zeros(1, 0, dtype=torch.long), [1], [0]),     # one step, only the blank
    (1, 2, 3, torch.tensor([[2], [1]]), [1, 1], [1, 0]),          # one step holds one label
    (4, 3, 3, torch.zeros(3, 0, dtype=torch.long), [4, 2, 0], [0, 0, 0]),   # empty targets; an empty input
    (4, 2, 3, torch.tensor([[1, 2], [2, 1]]), [0, 4], [2, 2]),   # an empty input with labels: infinite loss
    (5, 2, 4, torch.tensor([3, 1, 2]), [5, 5], [0, 3]),          # concatenated, the first sample empty
])
def test_small_and_empty_cases(steps, batch, labels, targets, input_lengths, target_lengths):
    for reduction in ("none", "mean"):
        for zero_infinity in (False, True):
            against_float64(lambda x, y: F.ctc_loss(x, y, input_lengths, target_lengths, reduction=reduction,
                                                    zero_infinity=zero_infinity),
                            _log_probs(steps, batch, labels), targets)


def test_float32_against_cpu_float32(strict):
    log_probs = _log_probs().float()
    check_op(lambda x, y: F.ctc_loss(x, y, INPUT_LENGTHS, TARGET_LENGTHS, reduction="none"), Input(log_probs),
             Input(PADDED, grad=False), atol=2e-5, rtol=2e-6)
    check_op(lambda x, y: torch.nn.CTCLoss(blank=2, zero_infinity=True)(x, y, torch.tensor(INPUT_LENGTHS),
                                                                         torch.tensor([3, 2, 4, 1])),
             Input(log_probs), Input(torch.tensor([[1, 1, 3, 0], [3, 4, 0, 0], [0, 3, 4, 1], [4, 0, 0, 0]]),
                                     grad=False), atol=2e-5, rtol=2e-6)


def test_aten_ops_directly(strict):
    """``_ctc_loss``'s log_alpha over the positions its recursion reaches, and ``_ctc_loss_backward`` with a
    stride-0 gradient and zero_infinity, against CPU float64."""
    log_probs = _log_probs()
    targets = torch.tensor([[1, 1, 2, 0], [1, 2, 3, 4], [2, 2, 2, 1], [0, 0, 0, 0]])
    input_lengths, target_lengths = [7, 3, 7, 2], [3, 4, 4, 0]
    expected = torch.ops.aten._ctc_loss(log_probs, targets, input_lengths, target_lengths, 0, False)
    actual = torch.ops.aten._ctc_loss(log_probs.float().to(DEVICE), targets.to(DEVICE, torch.int32), input_lengths,
                                      target_lengths, 0, False)
    torch.testing.assert_close(actual[0].cpu().double(), expected[0], atol=1e-5, rtol=1e-5)
    assert actual[1].shape == expected[1].shape == (N, T, 9)
    for b, (steps, length) in enumerate(zip(input_lengths, target_lengths)):
        torch.testing.assert_close(actual[1][b, :steps, :2 * length + 1].cpu().double(),
                                   expected[1][b, :steps, :2 * length + 1], atol=1e-5, rtol=1e-5)
    assert (actual[1][3, 2:] == float("-inf")).all() and (actual[1][0, :, 7:] == float("-inf")).all()
    for zero_infinity in (False, True):
        grad = torch.tensor([0.5], dtype=torch.float64).expand(N)
        want = torch.ops.aten._ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                                                 expected[0], expected[1], 0, zero_infinity)
        got = torch.ops.aten._ctc_loss_backward(grad.float().to(DEVICE), log_probs.float().to(DEVICE),
                                                targets.to(DEVICE), input_lengths, target_lengths, actual[0],
                                                actual[1], 0, zero_infinity)
        assert got.is_contiguous() and got.shape == want.shape
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-5, rtol=1e-5, equal_nan=True)
        assert (got[2:, 3] == 0).all() and (got[3:, 1] == 0).all()
        assert got[:3, 1].isnan().all() if not zero_infinity else (got[:, 1] == 0).all()


def test_out_and_tensor_overloads(strict):
    log_probs, targets = _log_probs().float().to(DEVICE), PADDED.to(DEVICE)
    lengths = [torch.tensor(v, device=DEVICE) for v in (INPUT_LENGTHS, TARGET_LENGTHS)]
    nll, log_alpha = torch.ops.aten._ctc_loss(log_probs, targets, INPUT_LENGTHS, TARGET_LENGTHS)
    out0, out1 = torch.empty(0, device=DEVICE), torch.empty(0, device=DEVICE)
    torch.ops.aten._ctc_loss.out(log_probs, targets, INPUT_LENGTHS, TARGET_LENGTHS, out0=out0, out1=out1)
    by_tensors = torch.ops.aten._ctc_loss.Tensor(log_probs, targets, *lengths)
    for got in ((out0, out1), by_tensors):
        assert torch.equal(got[0].cpu(), nll.cpu()) and torch.equal(got[1].cpu(), log_alpha.cpu())
    grad = torch.rand(N, device=DEVICE)
    want = torch.ops.aten._ctc_loss_backward(grad, log_probs, targets, INPUT_LENGTHS, TARGET_LENGTHS, nll,
                                             log_alpha, 0)
    out = torch.empty(0, device=DEVICE)
    torch.ops.aten._ctc_loss_backward.out(grad, log_probs, targets, INPUT_LENGTHS, TARGET_LENGTHS, nll, log_alpha, 0,
                                          out=out)
    by_tensors = torch.ops.aten._ctc_loss_backward.Tensor(grad, log_probs, targets, *lengths, nll, log_alpha, 0)
    assert torch.equal(out.cpu(), want.cpu()) and torch.equal(by_tensors.cpu(), want.cpu())


def test_results_are_the_same_run_to_run(strict):
    log_probs = _log_probs(steps=30, batch=3, labels=6).float().to(DEVICE).requires_grad_(True)
    targets = torch.randint(1, 6, (3, 12), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    runs = []
    for _ in range(2):
        loss = F.ctc_loss(log_probs, targets, [30, 25, 28], [12, 9, 11], reduction="sum")
        (gradient,) = torch.autograd.grad(loss, log_probs)
        runs.append((loss.cpu(), gradient.cpu()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_long_targets_against_float64():
    """Targets of 70 labels: extended sequences of 141 positions, more than one work-group spans at once."""
    generator = torch.Generator().manual_seed(2)
    targets = torch.randint(1, 8, (2, 70), generator=generator)
    against_float64(lambda x, y: F.ctc_loss(x, y, [160, 150], [70, 64], reduction="mean"),
                    _log_probs(steps=160, batch=2, labels=8), targets, atol=1e-4, rtol=1e-5)


def _lp(device: str, steps: int = 5, batch: int = 2, labels: int = 4, dtype: torch.dtype = torch.float32):
    return torch.randn(steps, batch, labels).log_softmax(2).to(device, dtype)


_ATEN = torch.ops.aten._ctc_loss
_TARGETS = torch.tensor([[1, 2], [3, 1]])


@pytest.mark.parametrize("call, error, message", [
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [5, 4], [2, 1], 4, False), RuntimeError, "blank must be in label range"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [5, 4], [2, 1], -1, False), RuntimeError, "blank must be in label"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [5], [2, 1], 0, False), RuntimeError,
     "input_lengths must be of size batch_size"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [5, 4], [2], 0, False), RuntimeError,
     "target_lengths must be of size batch_size"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [5, 4], [-1, 1], 0, False), RuntimeError,
     r"Expected target_lengths to have value at least 0, but got value -1 \(while checking"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [5, 4], [3, 1], 0, False), RuntimeError,
     "Expected tensor to have size at least 3 at dimension 1, but got size 2 for argument #2 'targets'"),
    (lambda d: _ATEN(_lp(d), _TARGETS.flatten().to(d), [5, 4], [2, 1], 0, False), RuntimeError,
     "Expected tensor to have size 3 at dimension 0, but got size 4 for argument #2 'targets'"),
    (lambda d: _ATEN(_lp(d), _TARGETS[:1].to(d), [5, 4], [2, 1], 0, False), RuntimeError,
     "Expected tensor to have size 2 at dimension 0, but got size 1"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [6, 4], [2, 1], 0, False), RuntimeError,
     "Expected input_lengths to have value at most 5, but got value 6"),
    (lambda d: _ATEN(_lp(d), _TARGETS.to(d), [-1, 4], [2, 1], 0, False), RuntimeError,
     "Expected input_lengths to have value at least 0, but got value -1"),
    (lambda d: _ATEN(_lp(d), _TARGETS.float().to(d), [5, 4], [2, 1], 0, False), RuntimeError,
     "Expected tensor for argument #2 'targets' to have scalar type Int; but got torch.FloatTensor"),
    (lambda d: _ATEN(_lp(d)[0], _TARGETS.to(d), [5, 4], [2, 1], 0, False), RuntimeError,
     "Expected 3-dimensional tensor, but got 2-dimensional tensor for argument #1 'log_probs'"),
    (lambda d: _ATEN(_lp(d), _TARGETS[None].to(d), [5, 4], [2, 1], 0, False), RuntimeError,
     "Expected 1 to 2 dimensions, but got 3-dimensional tensor for argument #2 'targets'"),
    (lambda d: _ATEN(_lp(d)[:, :0], _TARGETS[:0].to(d), [], [], 0, False), RuntimeError,
     "log_probs tensor must not be empty"),
    (lambda d: _ATEN(_lp(d, dtype=torch.float16), _TARGETS.to(d), [5, 4], [2, 1], 0, False), NotImplementedError,
     "not implemented for 'Half'"),
    (lambda d: F.ctc_loss(_lp(d), _TARGETS.to(d), torch.tensor([5.0, 4.0], device=d), torch.tensor([2, 1])),
     RuntimeError, "input_lengths must be integral"),
    (lambda d: F.ctc_loss(_lp(d), _TARGETS.to(d), torch.tensor([5, 4]), torch.tensor([2.0, 1.0], device=d)),
     RuntimeError, "target_lengths must be integral"),
    (lambda d: F.ctc_loss(_lp(d)[:0], _TARGETS.to(d), [0, 0], [0, 0]), RuntimeError,
     "log_probs tensor must not be empty"),
])
def test_bad_calls_raise_torch_errors(strict, call, error, message):
    for device in ("cpu", DEVICE):
        with pytest.raises(error, match=message):
            call(device)
