"""A batch norm's step count (``num_batches_tracked += 1``, made right before its training forward) is added
by the forward's first launch: the in-place add of an int to a 0-dim int64 tensor waits, held, and the
batch norm's statistics launch takes it. The counts, the outputs and the running statistics are those of
CPU torch and of the unfolded route (``pointwise.FOLD_STEP_COUNTS``); a read of the count, or any other op,
between the add and the batch norm launches the add by itself; graph replays count as eager steps do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tunecl.backend as backend
from tunecl import config
from tunecl.backend.ops import pointwise

from batch_norm_parts import forced_parts

DEV = torch.device("opencl")


@pytest.fixture(params=[1, 3], ids=lambda p: f"P{p}")
def parts(request):
    with forced_parts(request.param):
        yield request.param


def _model(momentum: float | None) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, momentum=momentum),
                               torch.nn.ReLU(inplace=True), torch.nn.Conv2d(4, 5, 1),
                               torch.nn.BatchNorm2d(5, momentum=momentum))


def _train(steps: int, momentum: float | None, fold: bool, monkeypatch) -> list[torch.Tensor]:
    """The state dict after ``steps`` forward and backward passes on the device, on the CPU."""
    monkeypatch.setattr(pointwise, "FOLD_STEP_COUNTS", fold)
    model = _model(momentum).to(DEV)
    x = torch.randn(3, 3, 7, 7, generator=torch.Generator().manual_seed(1))
    with config.override(fallback="error"):
        for _ in range(steps):
            model(x.to(DEV)).sum().backward()
    return [t.detach().cpu() for t in model.state_dict().values()]


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_counts_and_statistics_match_cpu_and_the_unfolded_route(monkeypatch, parts, momentum):
    """``momentum=None`` reads the count for its cumulative average (a read between the increment and the
    forward: the increment runs by itself there)."""
    backend.reset_stats()
    folded = _train(4, momentum, True, monkeypatch)
    fused = backend.stats()["eager_fusions"].get("step_count", 0)
    assert fused >= (4 if momentum == 0.1 else 0)   # (a signature's first call builds its launches)
    plain = _train(4, momentum, False, monkeypatch)
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)
    cpu = _model(momentum)
    x = torch.randn(3, 3, 7, 7, generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        cpu(x).sum().backward()
    for (name, e), a in zip(cpu.state_dict().items(), folded):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4, msg=name)
    assert folded[list(cpu.state_dict()).index("1.num_batches_tracked")].item() == 4


def test_a_count_at_an_offset_and_a_read_between(monkeypatch):
    """A 0-dim count inside a bigger int64 tensor gets its increments at its own element; reading it after
    the increment (before the batch norm) sees the new value."""
    counts = torch.zeros(3, dtype=torch.int64, device=DEV)
    count = counts[1]
    x = torch.randn(4, 3, 5, 5).to(DEV)
    rm, rv = torch.zeros(3, device=DEV), torch.ones(3, device=DEV)
    backend.reset_stats()
    with config.override(fallback="error"):
        for step in range(1, 5):
            count.add_(1)
            F.batch_norm(x, rm, rv, training=True)
        count.add_(2)
        assert count.item() == 6   # (read before any batch norm takes it)
        F.batch_norm(x, rm, rv, training=True)
    assert counts.cpu().tolist() == [0, 6, 0]
    assert backend.stats()["eager_fusions"].get("step_count", 0) >= 3


def _count_and_batch() -> tuple[torch.Tensor, ...]:
    """A 0-dim int64 count, a 2x3x4x4 batch and running statistics for it, on the device."""
    return (torch.zeros((), dtype=torch.int64, device=DEV), torch.randn(2, 3, 4, 4).to(DEV),
            torch.zeros(3, device=DEV), torch.ones(3, device=DEV))


def test_other_ops_between_launch_the_increment(monkeypatch):
    """An increment followed by anything but a training batch norm (another op, evaluation mode) runs by
    itself, in order."""
    count, x, rm, rv = _count_and_batch()
    with config.override(fallback="error"):
        for _ in range(3):
            count.add_(1)
            y = x * 2                                       # another op first
            F.batch_norm(y, rm, rv, training=True)
            count.add_(1)
            F.batch_norm(x, rm, rv, training=False)         # evaluation: no statistics launch
        doubled = count * 2
    assert count.item() == 6 and doubled.item() == 12


def test_graph_replays_count(monkeypatch):
    """A step captured after warm-up has the increment inside its batch norm launch: every replay counts."""
    bn = torch.nn.BatchNorm2d(3).to(DEV)
    x = torch.randn(2, 3, 4, 4).to(DEV)
    with config.override(fallback="error"):
        for _ in range(2):
            bn(x)
        backend.reset_stats()
        graph = torch.opencl.Graph()
        with torch.opencl.graph(graph):
            bn(x)
        assert backend.stats()["eager_fusions"].get("step_count", 0) == 1
        for _ in range(3):
            graph.replay()
        graph.reset()
    assert bn.num_batches_tracked.item() == 6


def test_a_batch_norm_that_takes_another_route_leaves_the_increment(monkeypatch):
    """A training batch norm that does not run its pre-built launches (a CPU weight among device operands:
    the CPU fallback) leaves the waiting increment to run by itself."""
    count, x, rm, rv = _count_and_batch()
    with config.override(fallback="silent"):
        for _ in range(2):
            count.add_(1)
            F.batch_norm(x, rm, rv, training=True)
        count.add_(1)
        F.batch_norm(x, rm, rv, weight=torch.ones(3), training=True)
    assert count.item() == 3
