"""Tuning the fused attention family: the harness (torch float64 reference, guards, tolerances) accepts
correct configs and rejects wrong ones; ``tunecl tune --attention`` searches, verifies and stores."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tunecl.cli import main
from tunecl.db import TuningDB
from tunecl.kernels import attention
from tunecl.problems import AttentionProblem
from tunecl.search.evaluate import evaluate
from tunecl.search.harness_registry import harness_for
from tunecl.search.measure import TimingPolicy
from tunecl.search.result import Status

torch = pytest.importorskip("torch")

ALGORITHM = attention.ALGORITHMS[0]
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=2, max_repeats=5, timeout=20.0)
# lengths that are not multiples of the tiles, odd head dims, every mask kind, causality, half
PROBLEMS = [AttentionProblem(2, 3, 37, 21, 24, 24), AttentionProblem(1, 2, 21, 37, 5, 7, causal=True),
            AttentionProblem(1, 2, 19, 33, 16, 16, mask="bool"), AttentionProblem(2, 1, 33, 19, 8, 8, mask="float"),
            AttentionProblem(1, 2, 20, 17, 12, 12, dtype="float16"), AttentionProblem(1, 1, 1, 1, 1, 1)]


def _directions():
    return [p.with_direction(d) for p in PROBLEMS for d in ("fwd", "bwd")]


@pytest.mark.parametrize("problem", _directions(), ids=lambda p: p.key.removeprefix("attention:"))
def test_the_harness_accepts_the_default_config(device, problem):
    result = evaluate(ALGORITHM, problem, device, ALGORITHM.default(problem, device), policy=FAST)
    assert result.status is Status.OK, result.message
    assert result.times and min(result.times) > 0


class _Skewed:
    """A plan run with its score scale multiplied by ``scale_factor``."""

    def __init__(self, plan, scale_factor: float):
        self.plan, self.scale_factor = plan, scale_factor
        self.algorithm = plan.algorithm

    def run(self, ops, scale):
        return self.plan.run(ops, scale * self.scale_factor)


class _SkewedAlgorithm:
    """attention_flash with a bug: its plans scale the scores by ``scale_factor`` too much, or (``keys``)
    are built for fewer keys than the problem has, so the last ones are never seen."""

    name, version, kind = ALGORITHM.name, ALGORITHM.version, "attention"

    def __init__(self, scale_factor: float = 1.0, keys: int | None = None):
        self.scale_factor, self.keys = scale_factor, keys

    def space(self, problem, device):
        return ALGORITHM.space(problem, device)

    def build(self, problem, device, config):
        built = problem if self.keys is None else dataclasses.replace(problem, s=self.keys)
        return _Skewed(ALGORITHM.build(built, device, config), self.scale_factor)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("bug", ["scale", "lost key"])
def test_the_harness_rejects_a_score_scale_off_by_1e_3_and_a_lost_key(device, direction, bug):
    problem = AttentionProblem(1, 2, 40, 64, 32, 32, mask="bool", direction=direction)
    wrong = _SkewedAlgorithm(scale_factor=1.001) if bug == "scale" else _SkewedAlgorithm(keys=63)
    result = evaluate(wrong, problem, device, ALGORITHM.default(problem, device), policy=FAST)
    assert result.status is Status.WRONG_RESULT, result
    assert "elements wrong" in result.message


def test_the_harness_reads_each_output_through_its_guards(device):
    """Outputs start as NaN between NaN guards: every launch fills each element and nothing else."""
    problem = PROBLEMS[0].with_direction("bwd")
    harness = harness_for(problem, device)
    binding = harness.bind(ALGORITHM.build(problem, device, ALGORITHM.default(problem, device)))
    try:
        assert binding.check() is None
        data = harness._prepare()
        assert set(data["expected"]) == {"dq", "dk", "dv"}
        assert all((data["tolerance"][n] > 0).all() for n in ("dq", "dk", "dv"))
        # the tolerances stay far below what a lost key moves (about 1/S of the magnitudes)
        assert all(data["tolerance"][n].max() < 1e-3 for n in ("dq", "dk", "dv"))
    finally:
        binding.release()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_the_reference_is_the_same_computed_one_head_at_a_time(device, monkeypatch, direction):
    """The float64 reference and tolerances are computed in chunks of (batch, head) pairs (bounded
    memory for long sequences); chunks of one pair give the same arrays."""
    from tunecl.search import harness_attention

    problem = AttentionProblem(2, 3, 9, 11, 4, 6, mask="bool", direction=direction)
    whole = harness_for(problem, device)._prepare()
    monkeypatch.setattr(harness_attention, "CHUNK_SCORES", problem.l * problem.s)
    single = harness_for(problem, device)._prepare()
    for part in ("expected", "tolerance"):
        assert whole[part].keys() == single[part].keys()
        for name in whole[part]:
            assert whole[part][name].shape == single[part][name].shape
            torch.testing.assert_close(single[part][name], whole[part][name], rtol=1e-12, atol=0)
    for name in ("out", "lse") if direction == "bwd" else ():
        assert whole[name].tobytes() == single[name].tobytes()


def test_tune_attention_stores_verified_results_of_both_directions(device, tmp_path, capsys):
    db_path = tmp_path / "tuned.sqlite"
    keys = []
    for direction in ("fwd", "bwd"):
        spec = f"b=1,h=2,l=24,s=40,e=8,ev=16,causal=1,dir={direction}"
        assert main(["tune", "--attention", spec, "--trials", "3", "--min-time", "0.002", "--db", str(db_path),
                     "--no-progress", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["winner"]["status"] == "ok" and out["winner"]["algorithm"] == "attention_flash"
        keys.append(out["problem"])
    with TuningDB(str(db_path)) as db:
        for key in keys:
            problem = AttentionProblem.parse(key.removeprefix("attention:"))
            hit = db.lookup(device.fingerprint, problem)
            assert hit is not None and hit.algorithm == "attention_flash" and hit.time_s > 0
            assert ALGORITHM.space(problem, device).is_valid(hit.params)


def test_a_head_dim_no_kernel_takes_says_so(capsys):
    assert main(["tune", "--attention", "b=1,h=1,l=8,s=8,e=300", "--trials", "1", "--no-progress"]) == 1
    assert "attention" in capsys.readouterr().err
