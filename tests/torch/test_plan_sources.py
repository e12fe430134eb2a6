"""``tunecl db coverage`` names the sources the backend serves: a tiny net runs on the device, and the
source of each conv/GEMM plan in ``stats()`` is the one :mod:`tunecl.tools.plan_sources` gives for the
same tuning DB and shipped folder."""

from __future__ import annotations

import dataclasses

import torch

from tunecl import config, kernels
from tunecl.backend import state
from tunecl.db import TuningDB, exchange, shipped
from tunecl.search.workload import extract
from tunecl.tools.plan_sources import plan_source


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, padding=1),
        torch.nn.Conv2d(4, 6, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(6, 5))


def _default_record(db, fingerprint, problem, stored_as=None):
    """Record the default config of the first family that applies to ``problem`` (so it builds), under
    ``stored_as`` (another batch's problem) or ``problem``."""
    device = state.get().device
    family = next(a for a in kernels.algorithms_at(problem.kind, {"fp32"}) if a.applies(problem, device))
    db.record(fingerprint, stored_as or problem, family.name, family.version, family.default(problem, device),
              time_s=1e-4)


def test_each_plan_comes_from_the_source_the_coverage_names(fresh_plans, fresh_stats, tmp_path, monkeypatch):
    workload = extract(_net(), batch=2, image_size=8)
    convs = sorted((p for p in workload if p.kind == "conv"), key=lambda p: p.c * 10 + p.k)
    (fc,) = [p for p in workload if p.kind == "gemm"]
    first, second, last = convs                     # 3->4, 4->4, 4->6 (1x1)
    fingerprint = state.get().device.fingerprint
    with TuningDB(config.get().db_url) as db:
        _default_record(db, fingerprint, first)                                     # user
        _default_record(db, fingerprint, second, dataclasses.replace(second, n=4))  # user-near-batch
    with TuningDB(str(tmp_path / "ship.sqlite")) as ship:
        _default_record(ship, fingerprint, fc)                                      # shipped
        (tmp_path / "shipped").mkdir()
        (tmp_path / "shipped" / "here.json").write_text(exchange.dumps(ship.export()))
    monkeypatch.setenv("TUNECL_SHIPPED_DB", str(tmp_path / "shipped"))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)   # strict fp32: the coverage's "fp32"
    shipped.clear_cache()
    try:
        with torch.no_grad():
            _net().to("opencl")(torch.randn(2, 3, 8, 8).to("opencl")).cpu()
        served = {key: plan["source"] for key, plan in fresh_stats()["plans"].items()}
        with TuningDB(config.get().db_url) as db:
            named = {p.key: plan_source(db, fingerprint, p, "fp32").source for p in workload}
    finally:
        shipped.clear_cache()
    assert named == {first.key: "user", second.key: "user-near-batch", last.key: "default", fc.key: "shipped"}
    assert served == named
