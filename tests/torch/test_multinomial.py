"""``torch.multinomial`` on the device: CPU torch's samples where its algorithm allows it, its frequencies
otherwise, and its errors (language models' sampling ``generate`` calls it once per token)."""

from __future__ import annotations

import pytest
import torch

DEV = torch.device("opencl")


def _both(probs: torch.Tensor, *args, seed: int = 5, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    want = torch.multinomial(probs, *args, **kwargs)
    torch.manual_seed(seed)
    got = torch.multinomial(probs.to(DEV), *args, **kwargs)
    assert got.device.type == "opencl"
    return want, got.cpu()


@pytest.mark.parametrize("shape, samples", [((7,), 1), ((7,), 3), ((3, 11), 1), ((3, 11), 3), ((1, 1), 1),
                                            ((4, 1000), 1), ((4, 1000), 3), ((2, 5), 1), ((2, 5), 4)])
def test_without_replacement_gives_the_cpu_samples_under_the_same_seed(strict, shape, samples):
    probs = torch.rand(shape) + 0.01
    probs[..., 0] = 0   # a category that is never drawn
    if shape[-1] == 1:
        probs.fill_(1)
    want, got = _both(probs, samples)
    assert got.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got, want)


def test_one_sample_with_replacement_and_a_float16_or_strided_input(strict):
    probs = torch.rand(4, 9)
    want, got = _both(probs, 1, replacement=True)
    assert torch.equal(got, want)
    want, got = _both(probs.half(), 2)
    assert torch.equal(got, want)
    torch.manual_seed(2)
    wide = torch.rand(6, 9)
    got = torch.multinomial(wide.to(DEV)[::2, 1:], 2).cpu()   # a strided view: samples of its categories
    assert got.shape == (3, 2) and got.min() >= 0 and got.max() < 8
    assert all(len(set(row)) == 2 for row in got.tolist())


def test_without_replacement_draws_distinct_categories_at_their_frequencies(strict):
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    torch.manual_seed(0)
    draws = torch.multinomial(probs.to(DEV).expand(4000, 4).contiguous(), 2).cpu()
    assert all(row[0] != row[1] for row in draws.tolist())
    assert not (draws == 3).any()
    first = torch.bincount(draws[:, 0], minlength=4).double() / 4000
    assert torch.allclose(first, probs.double(), atol=0.03)


@pytest.mark.parametrize("rows", [1, 3])
def test_with_replacement_gives_the_cpu_samples_at_each_category_s_probability(strict, rows):
    probs = torch.tensor([2.0, 0.0, 1.0, 5.0, 0.0, 2.0])   # unnormalised, zeros inside and at the end
    batch = probs.expand(rows, 6).contiguous() if rows > 1 else probs
    want, got = _both(batch, 6000, replacement=True, seed=1)
    assert got.shape == ((6000,) if rows == 1 else (rows, 6000)) and got.dtype == torch.int64
    assert torch.equal(got, want)
    for row in got.reshape(rows, -1):
        frequencies = torch.bincount(row, minlength=6).double() / 6000
        assert frequencies[1] == 0 and frequencies[4] == 0
        assert torch.allclose(frequencies, probs.double() / 10, atol=0.025), frequencies


def test_with_replacement_over_a_large_vocabulary_and_a_strided_input(strict):
    probs = torch.rand(4, 50257)
    probs[:, ::3] = 0
    want, got = _both(probs[:, 1:], 16, replacement=True)
    assert torch.equal(got, want)
    assert (probs[:, 1:].gather(1, got) > 0).all()


@pytest.mark.parametrize("case", [
    (lambda d: torch.ones(2, 2, 2, device=d), (1,), {}, "prob_dist must be 1 or 2 dim"),
    (lambda d: torch.ones(5, dtype=torch.int64, device=d), (1,), {}, "floating-point dtypes for input, got: Long"),
    (lambda d: torch.ones(5, device=d), (0,), {}, "cannot sample n_sample <= 0 samples"),
    (lambda d: torch.ones(5, device=d), (6,), {}, "n_sample > prob_dist.size"),
    (lambda d: torch.tensor([1.0, -1.0], device=d), (1,), {}, "inf`, `nan` or element < 0"),
    (lambda d: torch.tensor([1.0, float("nan")], device=d), (1,), {}, "inf`, `nan` or element < 0"),
    (lambda d: torch.zeros(2, 3, device=d), (1,), {}, r"sum of probabilities <= 0"),
    (lambda d: torch.tensor([1.0, -1.0], device=d), (3,), {"replacement": True}, "probability entry < 0"),
    (lambda d: torch.tensor([1.0, float("inf")], device=d), (3,), {"replacement": True}, "infinity or NaN"),
    (lambda d: torch.zeros(3, device=d), (2,), {"replacement": True}, r"sum of probabilities <= 0"),
])
def test_bad_input_raises_torch_errors(strict, case):
    make, args, kwargs, message = case
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(make("cpu"), *args, **kwargs)   # (the messages are CPU torch's)
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(make(DEV), *args, **kwargs)


def test_empty_batches_and_the_out_form(strict):
    assert torch.multinomial(torch.ones(0, 5, device=DEV), 2).shape == (0, 2)
    probs = torch.rand(3, 4)
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    torch.manual_seed(4)
    want = torch.multinomial(probs, 2)
    torch.manual_seed(4)
    result = torch.multinomial(probs.to(DEV), 2, out=out)
    assert result is out and torch.equal(out.cpu(), want)
    with pytest.raises(RuntimeError, match="expects Long tensor out, got: Float"):
        torch.multinomial(probs.to(DEV), 2, out=torch.empty(0, device=DEV))


def test_an_explicit_generator_decides_the_draws(strict):
    probs = torch.rand(2, 30)
    first = torch.multinomial(probs.to(DEV), 3, generator=torch.Generator().manual_seed(9)).cpu()
    again = torch.multinomial(probs.to(DEV), 3, generator=torch.Generator().manual_seed(9)).cpu()
    want = torch.multinomial(probs, 3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(first, again) and torch.equal(first, want)
