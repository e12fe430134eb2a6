"""PyTorch's OpInfo database as a test suite for the opencl device.

Every OpInfo entry with float32 support: its float32 samples run on opencl and on the CPU under one seed,
and the outputs, then the gradients of the sum of the float outputs, must agree with
``torch.testing.assert_close``'s defaults (or a tolerance named, with its reason, in
``opinfo_expectations.py``). A sample may instead be refused with a clear error listed there. The CPU
fallback is allowed (``TUNECL_FALLBACK=silent``).

- Default run: a rotating slice of the ops (one of ``SLICES``, chosen by the day of the year, or by
  ``TUNECL_OPINFO_SLICE=k/n``), each with at most ``DEFAULT_SAMPLES`` samples.
- ``TUNECL_OPINFO=full``: every op with every sample (test_opinfo_full, marker ``opinfo_full``).
- ``TUNECL_OPINFO_REPORT=path`` appends one JSON line per op (outcome, samples, fallback calls).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")   # torch's test utilities need it

sys.path.insert(0, str(Path(__file__).parent))
import opinfo_check  # noqa: E402

SLICES = 16
DEFAULT_SAMPLES = 4
FULL = os.environ.get("TUNECL_OPINFO", "").lower() == "full"

OPS = {opinfo_check.op_id(op): op for op in opinfo_check.load_op_db()}


def _slice() -> tuple[int, int]:
    spec = os.environ.get("TUNECL_OPINFO_SLICE", "")
    if spec:
        k, _, n = spec.partition("/")
        if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
            raise ValueError(f"TUNECL_OPINFO_SLICE must be k/n with 0 <= k < n, not {spec!r}")
        return int(k), int(n)
    return datetime.date.today().timetuple().tm_yday % SLICES, SLICES


def slice_names(k: int, n: int) -> list[str]:
    """Every n-th op from the k-th, in name order (each slice mixes all kinds of ops)."""
    return [name for i, name in enumerate(sorted(OPS)) if i % n == k]


def _assert_outcome(name: str, max_samples: int | None) -> None:
    outcome = opinfo_check.check(OPS[name], max_samples=max_samples)
    report = os.environ.get("TUNECL_OPINFO_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(dataclasses.asdict(outcome)) + "\n")
    if outcome.kind == "skipped":
        pytest.skip(outcome.detail)
    assert outcome.kind != "failed", f"{name}: {outcome.detail}"
    assert outcome.kind in ("matched", "clear error"), outcome


@pytest.mark.parametrize("name", [] if FULL else slice_names(*_slice()))
def test_opinfo(name):
    _assert_outcome(name, DEFAULT_SAMPLES)


@pytest.mark.opinfo_full
@pytest.mark.skipif(not FULL, reason="the full OpInfo run needs TUNECL_OPINFO=full")
@pytest.mark.parametrize("name", sorted(OPS) if FULL else ["every op"])
def test_opinfo_full(name):
    _assert_outcome(name, None)


def test_slices_cover_every_op_once():
    names = [name for k in range(SLICES) for name in slice_names(k, SLICES)]
    assert sorted(names) == sorted(OPS)


def test_every_looser_tolerance_names_its_reason():
    expect = opinfo_check.expect
    assert set(expect.MUST_MATCH) <= set(OPS), sorted(set(expect.MUST_MATCH) - set(OPS))
    named = set(expect.TOLERANCES) | set(expect.GRAD_TOLERANCES)
    assert named <= set(expect.TOLERANCE_REASONS), sorted(named - set(expect.TOLERANCE_REASONS))
    assert named <= set(OPS), sorted(named - set(OPS))


def test_loading_the_op_database_leaves_torch_flags_settable():
    """torch's test utilities freeze torch.backends flags on import; later tests (and the TF32 policy's)
    set them."""
    assert not torch.backends.flags_frozen()
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not saved
    torch.backends.cudnn.allow_tf32 = saved
