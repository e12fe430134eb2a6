"""Losses, batch norm, pooling, cat and dropout on opencl vs CPU, forward and backward."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op, t

from tunecl import config, runtime
from tunecl.backend import copies, random_draws


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    x, target = torch.randn(6, 9), torch.randint(0, 9, (6,))
    check_op(lambda a, b: F.cross_entropy(a, b, reduction=reduction), x, target)
    weight = torch.rand(9)
    check_op(lambda a, b: F.cross_entropy(a, b, weight=weight.to(a.device), ignore_index=int(target[0]),
                                          reduction=reduction), x, target)


def test_nll_loss_of_one_sample_and_transposed_logits():
    check_op(lambda a, b: F.nll_loss(F.log_softmax(a, 0), b), torch.randn(5), torch.tensor(3))
    check_op(lambda a, b: F.cross_entropy(a, b), t(torch.randn(9, 4)), torch.randint(0, 9, (4,)))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm(training, affine):
    x = torch.randn(3, 4, 5, 6) * 2 + 1
    w, b = (torch.rand(4) + 0.5, torch.randn(4)) if affine else (None, None)
    stats = (torch.randn(4) * 0.1, torch.rand(4) + 0.5)

    def bn(v, *params):
        rm, rv = (s.clone().to(v.device) for s in stats)
        out = F.batch_norm(v, rm, rv, *params, training=training, momentum=0.3, eps=1e-4)
        return out, rm, rv  # the running statistics must be updated in place (training)
    check_op(bn, x, *([w, b] if affine else []), atol=3e-5)


def test_batch_norm_module_tracks_running_stats_and_1d_input(strict):
    for module, x in ((torch.nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5)), (torch.nn.BatchNorm1d(6), torch.randn(8, 6))):
        dev = type(module)(module.num_features).to("opencl")
        for _ in range(2):
            module(x)
            dev(x.to("opencl"))
        torch.testing.assert_close(dev.running_mean.cpu(), module.running_mean)
        torch.testing.assert_close(dev.running_var.cpu(), module.running_var)
        assert int(dev.num_batches_tracked) == 2


POOLS = {
    "max3s2p1": lambda v: F.max_pool2d(v, 3, 2, 1),
    "max2_indices": lambda v: F.max_pool2d(v, 2, return_indices=True),
    "max_dilated_ceil": lambda v: F.max_pool2d(v, 3, 2, 1, dilation=2, ceil_mode=True),
    "avg3s2p1": lambda v: F.avg_pool2d(v, 3, 2, 1),
    "avg_ceil_exclude_pad": lambda v: F.avg_pool2d(v, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg_divisor": lambda v: F.avg_pool2d(v, 2, divisor_override=3),
    "adaptive1": lambda v: F.adaptive_avg_pool2d(v, 1),
    "adaptive3x4": lambda v: F.adaptive_avg_pool2d(v, (3, 4)),
    "adaptive_up": lambda v: F.adaptive_avg_pool2d(v, (9, 11)),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling(name):
    check_op(POOLS[name], torch.randn(2, 3, 7, 9))


def test_pooling_of_3d_and_channels_last_input():
    check_op(POOLS["max3s2p1"], torch.randn(3, 8, 8))
    check_op(POOLS["avg3s2p1"], Input(torch.randn(2, 3, 6, 6), lambda v: v.contiguous(memory_format=torch.channels_last)))


def test_cat_and_stack():
    check_op(lambda a, b: torch.cat([a, b], 1), torch.randn(4, 3), t(torch.randn(2, 4)))
    check_op(lambda a, b: torch.cat([a, b]), torch.randn(2, 3), torch.randn(0, 3))
    check_op(lambda a, b: torch.stack([a, b], 2), torch.randn(2, 3), torch.randn(2, 3))
    check_op(lambda a, b: torch.cat([a, b.long()]), torch.randn(2), torch.arange(3))  # dtype promotion


def test_dropout_with_host_draws_matches_cpu_with_the_same_seed(strict):
    x = torch.randn(64, 32)
    with config.override(random="host"):
        for p in (0.2, 0.5):
            torch.manual_seed(7)
            expected = F.dropout(x, p)
            torch.manual_seed(7)
            xd = x.to("opencl").requires_grad_()
            actual = F.dropout(xd, p)
            torch.testing.assert_close(actual.cpu(), expected)
            actual.sum().backward()
            torch.testing.assert_close(xd.grad.cpu(), (expected != 0).float() / (1 - p))
    assert torch.equal(F.dropout(x.to("opencl"), 0.5, training=False).cpu(), x)


@config.override(random="device")
def test_eager_dropout_is_one_launch_drawing_the_keyed_bernoulli_mask(strict):
    """A contiguous float32 dropout is one launch that writes the mask and the output; its mask is the keyed
    Bernoulli draw under the call's key (the first number drawn after the seed), and its output is the
    pointwise scale_mask of the input by that mask, bit for bit."""
    from tunecl.backend import memory, random_draws, state
    from tunecl.profiling import KernelProfile

    x = torch.randn(37, 101)
    xd = torch.cat([torch.randn(3), x.flatten()]).to("opencl")[3:].view(37, 101)   # at a storage offset
    torch.manual_seed(5)
    with KernelProfile() as profile:
        out, mask = torch.ops.aten.native_dropout(xd, 0.3, True)
        torch.opencl.synchronize()
        launches = {row.name: row.launches for row in profile.summary()}
    assert launches == {"dropout_keyed_f32": 1}, launches
    torch.manual_seed(5)
    key = random_draws.key()
    drawn = memory.empty_contiguous((37, 101), torch.bool)
    state.get().random.bernoulli_keyed(memory.buffer_of(drawn), 0, drawn.numel(), 0.7, key, "bool")
    assert torch.equal(mask.cpu(), drawn.cpu())
    assert torch.equal(out.cpu(), torch.ops.aten.native_dropout_backward(xd, mask, 1 / 0.7).cpu())


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
@config.override(random="device")
def test_dropout_draws_on_the_device_reproducibly_from_the_cpu_generator(strict, p):
    """The default on GPUs: the mask is drawn on the device (no upload) under a key from torch's CPU
    generator: the same seed gives the same mask, successive calls new ones; the kept fraction is 1 - p,
    kept values are scaled by 1 / (1 - p) and the gradient goes through the same mask."""
    x = torch.rand(300, 101) + 0.5   # (no zeros: a zero output is a dropped element)
    torch.manual_seed(11)
    xd = x.to("opencl").requires_grad_()
    upload = copies.upload
    with mock.patch.object(copies, "upload", side_effect=AssertionError("a mask was uploaded")):
        out = F.dropout(xd, p)
    assert copies.upload is upload
    again = F.dropout(xd, p)
    torch.manual_seed(11)
    replay = F.dropout(xd.detach(), p)
    kept = (out != 0).cpu()
    assert torch.equal(replay.cpu(), out.detach().cpu())
    if 0 < p < 1:
        assert not torch.equal((again != 0).cpu(), kept)
        assert abs(kept.float().mean().item() - (1 - p)) < 4 * ((p * (1 - p)) / kept.numel()) ** 0.5
    else:
        assert kept.all() if p == 0 else not kept.any()
    scale = 0.0 if p == 1 else 1 / (1 - p)
    torch.testing.assert_close(out.detach().cpu(), x * kept * scale)
    out.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), kept.float() * scale)


@pytest.mark.parametrize("random", ["device", "host", "auto"])
def test_dropout_masks_follow_torch_random_state(strict, random):
    """get/set_rng_state of the CPU generator (a checkpoint's) reproduce device masks too; a bad
    TUNECL_RANDOM is a clear error."""
    x = torch.ones(1000, device="opencl")
    with config.override(random=random):
        state = torch.get_rng_state()
        first = F.dropout(x, 0.5)
        torch.set_rng_state(state)
        assert torch.equal(F.dropout(x, 0.5).cpu(), first.cpu())
    with config.override(random="sometimes"), pytest.raises(ValueError, match="TUNECL_RANDOM must be one of"):
        F.dropout(x, 0.5)


@config.override(random="device")
def test_bernoulli_of_float32_and_bool_draws_on_the_device_others_on_the_host(strict):
    torch.manual_seed(5)
    f = torch.empty(20_000, device="opencl").bernoulli_(0.25)
    b = torch.empty(20_000, device="opencl", dtype=torch.bool).bernoulli_(0.25)
    h = torch.empty(20_000, device="opencl", dtype=torch.float16).bernoulli_(0.25)
    torch.manual_seed(5)
    assert torch.equal(torch.empty(20_000, device="opencl").bernoulli_(0.25).cpu(), f.cpu())
    for drawn in (f, b, h):
        assert set(drawn.cpu().double().unique().tolist()) <= {0.0, 1.0}
        assert abs(drawn.cpu().double().mean().item() - 0.25) < 0.02
    with pytest.raises(RuntimeError, match="bernoulli_"):   # torch's own check of p
        torch.empty(5, device="opencl").bernoulli_(1.5)


def test_random_ops_use_the_cpu_generator(strict):
    """With host draws (the default on CPU devices), every random op draws the CPU's numbers (with device
    draws: all but dropout's and bernoulli_(p)'s, above)."""
    with config.override(random="host"):
        _random_ops_use_the_cpu_generator()
    # a model initialised on the device matches one initialised on the CPU either way
    with config.override(random="device"):
        torch.manual_seed(3)
        expected = torch.empty(5).normal_(2, 3)
        torch.manual_seed(3)
        assert torch.equal(torch.empty(5, device="opencl").normal_(2, 3).cpu(), expected)
    assert random_draws.on_host() == (runtime.select_device().fingerprint.device_type == "cpu")   # auto


def _random_ops_use_the_cpu_generator():
    torch.manual_seed(3)
    expected = [torch.randn(5), torch.rand(5), torch.randint(0, 10, (5,)), torch.empty(5).normal_(2, 3),
                torch.empty(5).bernoulli_(0.3), torch.randperm(6)]
    torch.manual_seed(3)
    dev = torch.device("opencl")
    actual = [torch.randn(5, device=dev), torch.rand(5, device=dev), torch.randint(0, 10, (5,), device=dev),
              torch.empty(5, device=dev).normal_(2, 3), torch.empty(5, device=dev).bernoulli_(0.3),
              torch.randperm(6, device=dev)]
    for e, a in zip(expected, actual):
        assert torch.equal(a.cpu(), e)


def test_conv2d_module_runs_on_the_device(fresh_stats, strict):
    """nn.Conv2d forward and backward through conv plans (tests/torch/test_conv.py has the details)."""
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 5, 5)
    dev = torch.nn.Conv2d(3, 4, 3, padding=1).to("opencl")
    dev.load_state_dict(conv.state_dict())
    out = dev(x.to("opencl"))
    out.sum().backward()
    expected = conv(x)
    expected.sum().backward()
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dev.weight.grad.cpu(), conv.weight.grad, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(dev.bias.grad.cpu(), conv.bias.grad, atol=1e-4, rtol=1e-5)
    assert not fresh_stats()["fallback_ops"]
    assert fresh_stats()["ops"]["aten::convolution_backward_overrideable"] == 1
