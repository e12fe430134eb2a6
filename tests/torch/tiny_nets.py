"""Tiny models for ``tunecl bench`` / ``tunecl validate`` tests, named ``tiny_nets:FACTORY``.

This module must not import ``tunecl.backend``: the bench peer process imports it, and that process
has to stay free of the backend (the check that it does is part of what the tests exercise).
"""

from __future__ import annotations

import torch
from torch import nn


def tiny_cnn() -> nn.Module:
    """conv + bn + relu + pool, twice, then global pool and a linear layer: 3xHxW -> 5 classes."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 5))


class _Residual(nn.Module):
    """x + StochasticDepth(conv(x)): a dropped sample keeps its input, as in efficientnet's blocks."""

    def __init__(self, channels: int, p: float):
        from torchvision.ops import StochasticDepth

        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.drop = StochasticDepth(p, "row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.conv(x))


def dropout_cnn() -> nn.Module:
    """conv, bn, relu, then residual blocks with stochastic depth and dropout, all at p = 0.5."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        *(_Residual(8, 0.5) for _ in range(4)),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(8, 5))


class _OffOnDevice(nn.Module):
    """tiny_cnn whose output is 1% off on the opencl device: a broken backend, as validate sees it."""

    def __init__(self):
        super().__init__()
        self.net = tiny_cnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out * 1.01 if out.device.type == "opencl" else out


class _OffInside(nn.Module):
    """An identity that scales by 1.01 on the opencl device: a broken layer in the middle of a net."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.01 if x.device.type == "opencl" else x


def off_inside() -> nn.Module:
    """tiny_cnn with a layer after its first block (module "4") that is 1% off on the device."""
    layers = list(tiny_cnn())
    return nn.Sequential(*layers[:4], _OffInside(), *layers[4:])


class _Bessel(nn.Module):
    """A model with an op the backend has no kernel for (so it takes the CPU fallback)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.special.bessel_j0(x.mean((2, 3))))


def off_on_device() -> nn.Module:
    return _OffOnDevice()


def bessel_net() -> nn.Module:
    return _Bessel()
