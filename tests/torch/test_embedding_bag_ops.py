"""``F.embedding_bag`` / ``nn.EmbeddingBag`` on the device against CPU torch, forward and backward (weight and
per-sample weights): sum, mean and max bags, empty bags, ``padding_idx``, ``include_last_offset``,
``scale_grad_by_freq``, 2-d inputs, and the errors for bad offsets and indices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 0, 9, 4])
OFFSETS = torch.tensor([0, 2, 2, 5, 8])   # bag 1 is empty


def _weight() -> Input:
    return Input(torch.randn(10, 4, dtype=torch.float64).float())


def _fixed(t: torch.Tensor) -> Input:
    return Input(t, grad=False)


@pytest.mark.parametrize("mode, options", [(mode, options) for mode in ("sum", "mean", "max")
                                           for options in ({}, {"padding_idx": 4}, {"scale_grad_by_freq": True})
                                           if not (mode == "max" and options)]   # (torch refuses the frequency)
                         + [("max", {"padding_idx": 4})])
def test_bags(strict, mode, options):
    last = torch.cat((OFFSETS, torch.tensor([INDICES.numel()])))
    for extra, offsets in (({}, OFFSETS), ({"include_last_offset": True}, last)):
        if options.get("scale_grad_by_freq"):
            _check_frequency_scaled(mode, offsets, extra)
        else:
            check_op(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, **extra, **options), _weight(),
                     _fixed(INDICES), _fixed(offsets))


def _check_frequency_scaled(mode: str, offsets: torch.Tensor, extra: dict) -> None:
    """``scale_grad_by_freq``: the weight gradient is the unscaled one with each row divided by its index's
    count among the indices (torch's documented rule). CPU torch is the reference only for the forward: before
    2.14 its kernel divided some rows by another index's count (pytorch/pytorch#190063)."""
    check_op(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, scale_grad_by_freq=True, **extra), _weight(),
             _fixed(INDICES), _fixed(offsets), grad=False)
    weight = torch.randn(10, 4, dtype=torch.float64)
    plain = weight.clone().requires_grad_()
    cpu = F.embedding_bag(INDICES, plain, offsets, mode=mode, **extra)
    upstream = torch.randn(cpu.shape, dtype=torch.float64)
    cpu.backward(upstream)
    expected = plain.grad / torch.bincount(INDICES, minlength=10).clamp(min=1).unsqueeze(1)
    device = weight.float().to("opencl").requires_grad_()
    F.embedding_bag(INDICES.to("opencl"), device, offsets.to("opencl"), mode=mode, scale_grad_by_freq=True,
                    **extra).backward(upstream.float().to("opencl"))
    torch.testing.assert_close(device.grad.cpu().double(), expected, atol=1e-5, rtol=1e-5)


def test_per_sample_weights_2d_inputs_and_modules(strict):
    check_op(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p), _weight(),
             _fixed(INDICES), _fixed(OFFSETS), Input(torch.rand(10)))
    check_op(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=2), _weight(),
             _fixed(INDICES), _fixed(OFFSETS), Input(torch.rand(10)))
    two_d = torch.randint(0, 10, (3, 4))
    for mode in ("sum", "mean", "max"):
        check_op(lambda w, i: F.embedding_bag(i, w, mode=mode), _weight(), _fixed(two_d))
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean")
    check_op(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"), Input(bag.weight.detach()), _fixed(INDICES),
             _fixed(OFFSETS))
    check_op(lambda w, i, o: F.embedding_bag(i, w, o), _weight(), _fixed(torch.empty(0, dtype=torch.long)),
             _fixed(torch.tensor([0, 0])))   # no indices: empty bags


def test_ties_and_infinities_in_max_bags(strict):
    weight = torch.tensor([[1.0, 2.0], [1.0, -float("inf")], [0.0, 2.0]])
    check_op(lambda w, i, o: F.embedding_bag(i, w, o, mode="max"), Input(weight), _fixed(torch.tensor([0, 1, 2, 1])),
             _fixed(torch.tensor([0, 3])))


@pytest.mark.parametrize("call, error, message", [
    (lambda d: F.embedding_bag(torch.tensor([1, 2], device=d), torch.randn(5, 2, device=d),
                               torch.tensor([1], device=d)), RuntimeError, "offsets\\[0\\] has to be 0"),
    (lambda d: F.embedding_bag(torch.tensor([1, 2], device=d), torch.randn(5, 2, device=d),
                               torch.tensor([0, 3], device=d)), RuntimeError, "offsets\\[-1\\] can not be greater"),
    (lambda d: F.embedding_bag(torch.tensor([1, 7], device=d), torch.randn(5, 2, device=d),
                               torch.tensor([0], device=d)).cpu(), (RuntimeError, IndexError), "range"),
    (lambda d: F.embedding_bag(torch.tensor([1, 2], device=d), torch.randn(5, 2, device=d), torch.tensor([0], device=d),
                               mode="max", scale_grad_by_freq=True), ValueError, "frequency"),
])
def test_bad_calls_raise_errors(strict, call, error, message):
    for device in ("cpu", "opencl"):
        with pytest.raises(error, match=message):
            call(device)


def test_a_last_offset_short_of_the_indices_is_refused(strict):
    # torch documents the last offset as the number of indices (CSR); CPU torch's kernel treats a shorter one
    # differently per mode (and its mean's backward disagrees with its forward), so the device refuses it
    with pytest.raises(RuntimeError, match="must equal the number of indices"):
        F.embedding_bag(INDICES.to("opencl"), torch.randn(10, 4, device="opencl"), OFFSETS.to("opencl"),
                        include_last_offset=True)
