"""A tiny model for workload and ``tune --net`` tests (loaded as ``tiny_net:build``)."""

import torch


def build() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, padding=1),
        torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, 5))
