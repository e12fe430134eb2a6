"""``tunecl tune --attention`` results serve the backend's fused attention: the plans of both directions
come from the user tuning DB (the test's private ``TUNECL_DB``), at the tuned batch and at another one;
``tunecl.tools.plancheck`` verifies a net's attention plans with the tuner's harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tunecl.cli import main
from tunecl.problems import AttentionProblem

PROBLEM = AttentionProblem(2, 3, 21, 13, 8, 8, mask="float")


@pytest.fixture(autouse=True)
def fused_training(monkeypatch):
    """Calls that need gradients take the fused kernels here on any device (a CPU device trains on the math
    path otherwise: ``tunecl.kernels.attention.math_for_training``), so the fused backward is what is tested."""
    from tunecl.kernels import attention

    monkeypatch.setattr(attention, "math_for_training", lambda *args: False)


def _tune(problem: AttentionProblem, capsys) -> dict:
    spec = problem.key.removeprefix("attention:")
    assert main(["tune", "--attention", spec, "--trials", "2", "--min-time", "0.002", "--no-progress",
                 "--json"]) == 0
    winner = json.loads(capsys.readouterr().out)["winner"]
    assert winner["status"] == "ok" and winner["algorithm"] == "attention_flash"
    return winner["config"]


def _attention(batch: int) -> None:
    """The problem's attention at ``batch``, forward and backward, against CPU torch in float64."""
    p = PROBLEM
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(batch, p.heads, n, p.e, generator=g) for n in (p.l, p.s, p.s))
    mask = torch.randn(batch, 1, p.l, p.s, generator=g)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves64, attn_mask=mask.double())
    expected.sum().backward()
    leaves = [t.to("opencl").requires_grad_() for t in (q, k, v)]
    actual = F.scaled_dot_product_attention(*leaves, attn_mask=mask.to("opencl"))
    actual.sum().backward()
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip(leaves, leaves64):
        torch.testing.assert_close(got.grad.cpu().double(), want.grad, atol=4e-5, rtol=4e-5)


def test_tuned_attention_plans_serve_both_directions_at_any_batch(strict, fresh_plans, fresh_stats, capsys):
    tuned = {d: _tune(PROBLEM.with_direction(d), capsys) for d in ("fwd", "bwd")}
    _attention(PROBLEM.batch)
    plans = fresh_stats()["plans"]
    for direction, config in tuned.items():
        plan = plans[PROBLEM.with_direction(direction).key]
        assert (plan["source"], plan["algorithm"], plan["config"]) == ("user", "attention_flash", config)
    _attention(5)   # another batch: the near-batch lookup serves the stored configs
    plans = fresh_stats()["plans"]
    for direction, config in tuned.items():
        other = AttentionProblem(5, PROBLEM.heads, PROBLEM.l, PROBLEM.s, PROBLEM.e, PROBLEM.ev, mask="float",
                                 direction=direction)
        plan = plans[other.key]
        assert (plan["source"], plan["config"]) == ("user-near-batch", config)
        assert PROBLEM.with_direction(direction).key in plan["lookup"]


def test_plancheck_verifies_the_attention_plans_of_a_net(monkeypatch):
    """``python -m tunecl.tools.plancheck`` checks each attention plan of a net with the tuner's harness."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "device"))   # tiny_net
    from tunecl.tools.plancheck import check_net_plans

    checks = check_net_plans("tiny_net:build_transformer", batch=1, image_size=3, train=True)
    attention = {c.problem.rsplit("dir=", 1)[1] for c in checks if c.problem.startswith("attention:")}
    assert attention == {"fwd,dtype=float32", "bwd,dtype=float32"}
    assert [c for c in checks if c.error] == []
