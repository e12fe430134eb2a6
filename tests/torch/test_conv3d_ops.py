"""3-d convolutions, transposed or not, on the device (by the 2-d plans, one per depth tap) against CPU torch,
forward and backward (input, weight and bias): kernel, stride, padding, output padding and dilation differing per
dim, groups and depthwise, 1x1x1, a depth of one, views, float16, an empty batch, the modules and a video
ResNet."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

from tunecl import config



def _random(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64).float()


CASES = [
    ((2, 3, 5, 6, 7), (4, 3, 3, 3, 3), dict(padding=1)),
    ((1, 4, 6, 5, 5), (6, 2, 2, 3, 1), dict(stride=(2, 1, 2), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2)),
    ((2, 3, 4, 4, 4), (5, 3, 1, 1, 1), dict()),
    ((1, 2, 3, 8, 8), (3, 2, 3, 7, 7), dict(stride=(1, 2, 2), padding=(1, 3, 3))),   # a video stem
    ((2, 4, 1, 5, 5), (4, 1, 1, 3, 3), dict(padding=(0, 1, 1), groups=4)),            # depthwise, depth 1
    ((1, 3, 7, 3, 3), (2, 3, 3, 1, 1), dict(padding=(1, 0, 0), stride=(3, 1, 1))),    # a (2+1)-d temporal tap
]


@pytest.mark.parametrize("input_shape, weight_shape, options", CASES)
def test_conv3d(strict, input_shape, weight_shape, options):
    check_op(lambda x, w, b: F.conv3d(x, w, b, **options), Input(_random(*input_shape)),
             Input(_random(*weight_shape)), Input(_random(weight_shape[0])), atol=5e-5, rtol=1e-5, grad_atol=2e-4)
    check_op(lambda x, w: F.conv3d(x, w, **options), Input(_random(*input_shape)), Input(_random(*weight_shape)),
             atol=5e-5, rtol=1e-5, grad_atol=2e-4)


def test_views_modules_float16_and_empty(strict):
    check_op(lambda x, w: F.conv3d(x, w, padding=1), Input(_random(2, 5, 4, 6, 3), lambda v: v.permute(0, 4, 3, 1, 2)),
             Input(_random(2, 3, 3, 3, 3)), atol=5e-5, rtol=1e-5, grad_atol=2e-4)
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(3, 4, (3, 1, 3), padding=(1, 0, 1), bias=True)
    check_op(lambda x, w, b: F.conv3d(x, w, b, padding=(1, 0, 1)), Input(_random(2, 3, 4, 5, 6)),
             Input(conv.weight.detach()), Input(conv.bias.detach()), atol=5e-5, rtol=1e-5, grad_atol=2e-4)
    x, w = _random(1, 2, 3, 5, 5), _random(3, 2, 2, 3, 3)
    actual = F.conv3d(x.half().to("opencl"), w.half().to("opencl"), padding=1)
    torch.testing.assert_close(actual.cpu().float(), F.conv3d(x.half().float(), w.half().float(), padding=1),
                               atol=2e-2, rtol=2e-2)
    check_op(lambda x, w, b: F.conv3d(x, w, b, padding=1), Input(torch.empty(0, 3, 4, 4, 4)),
             Input(_random(2, 3, 3, 3, 3)), Input(_random(2)))


TRANSPOSED = [
    ((2, 4, 3, 4, 5), (4, 3, 2, 2, 2), dict(stride=2)),   # a 3-d U-Net's upsampling
    ((1, 4, 3, 5, 5), (4, 2, 3, 3, 3), dict(stride=(1, 2, 2), padding=1, output_padding=(0, 1, 1), groups=2)),
    ((2, 3, 2, 3, 3), (3, 5, 1, 3, 3), dict(padding=(0, 1, 1), dilation=(1, 2, 2))),
    ((1, 2, 3, 2, 2), (2, 2, 3, 1, 1), dict(stride=(2, 1, 1), output_padding=(1, 0, 0))),
]


@pytest.mark.parametrize("input_shape, weight_shape, options", TRANSPOSED)
def test_conv_transpose3d(strict, input_shape, weight_shape, options):
    bias = _random(weight_shape[1] * options.get("groups", 1))
    check_op(lambda x, w, b: F.conv_transpose3d(x, w, b, **options), Input(_random(*input_shape)),
             Input(_random(*weight_shape)), Input(bias), atol=5e-5, rtol=1e-5, grad_atol=2e-4)
    check_op(lambda x, w: F.conv_transpose3d(x, w, **options), Input(_random(*input_shape)),
             Input(_random(*weight_shape)), atol=5e-5, rtol=1e-5, grad_atol=2e-4)


def test_bad_calls_raise_torch_errors(strict):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError):
            F.conv3d(torch.randn(1, 2, 2, 2, 2, device=device), torch.randn(3, 2, 3, 3, 3, device=device))
        with pytest.raises(RuntimeError):
            F.conv3d(torch.randn(1, 2, 4, 4, 4, device=device), torch.randn(3, 5, 3, 3, 3, device=device))


def test_a_video_resnet_trains_on_the_device_as_accurately_as_cpu_float32(strict):
    # torchvision's video ResNet with one block per stage of each kind of 3-d convolution (3x3x3, 1x3x3 and
    # (2+1)-d) and the (2+1)-d stem: forward and backward against float64, next to CPU torch's float32
    from torchvision.models.video.resnet import (BasicBlock, Conv2Plus1D, Conv3DNoTemporal, Conv3DSimple,
                                                 R2Plus1dStem, VideoResNet)
    torch.manual_seed(0)
    net = VideoResNet(BasicBlock, [Conv3DSimple, Conv3DNoTemporal, Conv2Plus1D, Conv3DSimple], [1, 1, 1, 1],
                      R2Plus1dStem, num_classes=5)
    x = torch.randn(2, 3, 2, 8, 8)
    exact = copy.deepcopy(net).double()
    y = exact(x.double())
    upstream = torch.randn(y.shape, dtype=torch.float64)
    y.backward(upstream)

    def errors(model: torch.nn.Module, device: str) -> list[float]:
        out = model.to(device)(x.to(device))
        out.backward(upstream.float().to(device))
        pairs = [(out, y), *((p.grad, q.grad) for p, q in zip(model.parameters(), exact.parameters()))]
        return [((a.detach().cpu().double() - b).abs().max() / b.abs().max()).item() for a, b in pairs]

    cpu = errors(copy.deepcopy(net), "cpu")
    device = errors(copy.deepcopy(net), "opencl")
    for name, d, c in zip(["output", *(n for n, _ in net.named_parameters())], device, cpu):
        assert d <= 4 * c + 1e-5, f"{name}: {d:.2e} from float64, CPU float32 {c:.2e}"


def test_a_transposed_3d_convolution_with_output_padding_past_the_stride_takes_the_counted_cpu_route(fresh_stats):
    # output padding 2 >= stride 1, which torch allows below the dilation 3: no regular convolution maps the
    # larger output back to the input's size
    x, w = _random(1, 2, 3, 3, 3), _random(2, 2, 2, 2, 2)
    options = dict(dilation=3, output_padding=(2, 0, 0))
    with config.override(fallback="silent"):
        actual = F.conv_transpose3d(x.to("opencl"), w.to("opencl"), **options)
    torch.testing.assert_close(actual.cpu(), F.conv_transpose3d(x, w, **options), atol=1e-5, rtol=1e-5)
    assert fresh_stats()["fallback_ops"] == {"aten::convolution_overrideable": 1}
