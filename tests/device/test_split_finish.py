"""Split reductions finished inside their own kernel (``split_finish.cl``): the last work-group of each
output tile adds the parts, in the fixed order the separate ``split_reduce`` launch adds them.

Against the separate launch (``FINISH_SPLITS = False``) the results are bit for bit the same; against the
float64 reference they are within the fp32 bound (``test_conv.check``). The per-tile counters are zero
again after every launch, so a plan runs any number of times, and two plans do not disturb each other.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_conv import ALGORITHMS, check, problem

from tunecl.kernels.conv import conv_depthwise, conv_implicit_gemm
from tunecl.kernels.conv.conv_common import out_elements
from tunecl.search.harness_conv import operand_shapes

IMPLICIT = ALGORITHMS["conv_implicit_gemm"]
# (shape, direction): bwd_weight reduces over N*P*Q (where the backend splits), the others over C*R*S
CASES = [("3x3_s1_odd", "bwd_weight"), ("3x3_s2", "bwd_weight"), ("groups2", "bwd_weight"),
         ("depthwise_x2_5x5", "bwd_weight"), ("1x1_s2", "bwd_weight"), ("k1000", "fwd"),
         ("5x5", "bwd_data"), ("asymmetric", "fwd")]


def split_configs(device, p, count: int = 3) -> list[dict]:
    """Up to ``count`` valid configs of the implicit GEMM with SPLIT > 1, of different splits and tiles."""
    configs = [c for c in IMPLICIT.space(p, device).configs() if c["SPLIT"] > 1]
    if not configs:
        pytest.skip(f"no split config of conv_implicit_gemm on {p.key}")
    picked = {}
    for c in configs[:: max(1, len(configs) // (4 * count))]:
        picked.setdefault((c["SPLIT"], c["MWG"], c["NWG"]), c)
    return list(picked.values())[:count]


def run_both(device, monkeypatch, p, config, algorithm=IMPLICIT, module=conv_implicit_gemm,
             **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """The finishing kernel's result and the separate launch's, each checked against the reference."""
    monkeypatch.setattr(module, "FINISH_SPLITS", True)
    finished = check(device, algorithm, p, config, **kwargs)
    monkeypatch.setattr(module, "FINISH_SPLITS", False)
    separate = check(device, algorithm, p, config, **kwargs)
    return finished, separate


@pytest.mark.parametrize("shape", ["depthwise", "depthwise_x2_5x5"])
def test_depthwise_weight_gradients_finish_as_the_separate_launch(device, monkeypatch, shape):
    """conv_depthwise's bwd_weight: the last work-group of a channel's tap block adds the parts, the same
    sums bit for bit, with beta too; one launch, and the counters zero again after repeated runs."""
    depthwise = ALGORITHMS["conv_depthwise"]
    p = problem(shape, "bwd_weight")
    configs = [c for c in depthwise.space(p, device).configs() if c["SPLIT"] > 1]
    assert configs
    for config in configs[:: max(1, len(configs) // 4)][:4]:
        finished, separate = run_both(device, monkeypatch, p, config, depthwise, conv_depthwise,
                                      seed=config["SPLIT"], offsets=2)
        np.testing.assert_array_equal(finished, separate, err_msg=f"{p.key} {config}")
        run_both(device, monkeypatch, p, config, depthwise, conv_depthwise, beta=0.5, seed=1)
    monkeypatch.setattr(conv_depthwise, "FINISH_SPLITS", True)
    plan = depthwise.build(p, device, configs[0])
    assert plan.finish
    a_shape, b_shape, out_shape = operand_shapes(p)
    a, b = (device.upload(np.ones(s, np.float32)) for s in (a_shape, b_shape))
    out = device.alloc(4 * int(np.prod(out_shape)))
    for _ in range(3):
        assert len(plan.run(a, b, out)) == 1
    device.synchronize()
    parts = plan.config["SPLIT"] * out_elements(p)
    counters = device.download(plan.workspace, (plan.workspace_bytes // 4,), np.int32)[parts:]
    assert counters.size and not counters.any(), counters


@pytest.mark.parametrize("shape,direction", CASES)
def test_the_last_work_group_gives_the_separate_launchs_sums(device, monkeypatch, shape, direction):
    p = problem(shape, direction)
    for config in split_configs(device, p):
        finished, separate = run_both(device, monkeypatch, p, config, seed=config["SPLIT"], offsets=3)
        np.testing.assert_array_equal(finished, separate, err_msg=f"{p.key} {config}")


def test_bias_and_beta_are_added_after_the_parts(device, monkeypatch):
    p = problem("k1000", "fwd")
    for config in split_configs(device, p, count=2):
        run_both(device, monkeypatch, p, config, beta=0.5, use_bias=True, seed=1, offsets=5)


def test_one_launch_and_counters_back_at_zero_after_every_run(device, monkeypatch):
    """The plan enqueues one launch; runs of two plans interleaved give each its own result every time,
    and leave every tile counter zero."""
    monkeypatch.setattr(conv_implicit_gemm, "FINISH_SPLITS", True)
    first, second = problem("3x3_s1_odd", "bwd_weight"), problem("3x3_s2", "bwd_weight")
    configs = [split_configs(device, q, count=1)[0] for q in (first, second)]
    plans = [IMPLICIT.build(q, device, c) for q, c in zip((first, second), configs)]
    rng = np.random.default_rng(0)
    results: list[list[np.ndarray]] = [[], []]
    for _ in range(4):
        for k, (q, plan) in enumerate(zip((first, second), plans)):
            assert plan.finish
            a_shape, b_shape, out_shape = operand_shapes(q)
            a = np.random.default_rng(k).uniform(-1, 1, a_shape).astype(np.float32)
            b = np.random.default_rng(k + 10).uniform(-1, 1, b_shape).astype(np.float32)
            out = device.upload(rng.uniform(-1, 1, out_shape).astype(np.float32))
            events = plan.run(device.upload(a), device.upload(b), out)
            assert len(events) == 1
            device.synchronize()
            results[k].append(device.download(out, out_shape))
    for k, plan in enumerate(plans):
        for got in results[k][1:]:
            np.testing.assert_array_equal(got, results[k][0])
        parts = plan.config["SPLIT"] * out_elements(plan.problem)
        counters = device.download(plan.workspace, (plan.workspace_bytes // 4,), np.int32)[parts:]
        assert counters.size and not counters.any(), counters


# -- the probe that lets a device finish its splits (tunecl/kernels/split_finish.py) -----------------------
def test_the_probe_passes_on_this_device(device):
    from tunecl.kernels import split_finish

    assert split_finish._probe(device) == ""


def test_the_probe_catches_a_hand_off_that_reads_parts_too_early(device, monkeypatch):
    """A last work-group that does not wait for the others (it takes itself as last at once) reads parts
    not stored yet, or from the round before: the probe says so."""
    from tunecl.kernels import base, split_finish

    def early(package, name):
        text = base.read_source(package, name)
        return text.replace("atomic_inc(counter) == parts - 1", "(atomic_inc(counter), get_group_id(1) == 0)")

    monkeypatch.setattr(split_finish, "read_source", early)
    assert "read" in split_finish._probe(device)


@pytest.mark.parametrize("family", ["conv_implicit_gemm", "conv_depthwise", "gemm_tiled"])
def test_a_device_that_fails_the_probe_takes_the_second_launch(device, monkeypatch, family):
    """Where the probe failed, every family builds its split plans with the separate reduction launch,
    and computes the same results."""
    from tunecl.kernels import split_finish
    from tunecl.kernels.gemm import gemm_tiled
    from tunecl.problems import GemmProblem

    monkeypatch.setitem(split_finish._verdicts, device, "failed here")
    if family == "gemm_tiled":
        tiled = gemm_tiled.GemmTiled()
        p = GemmProblem(9, 10, 300)
        plan = tiled.build(p, device, {**tiled.default(p, device), "SPLITK": 4})
        assert not plan.splitk_finish
        buffers = device.alloc(4 * 9 * 300), device.alloc(4 * 300 * 10), device.alloc(4 * 9 * 10)
        assert len(plan.run(*buffers)) == 2
        return
    algorithm = ALGORITHMS[family]
    p = problem("depthwise" if family == "conv_depthwise" else "3x3_s2", "bwd_weight")
    config = next(c for c in algorithm.space(p, device).configs() if c["SPLIT"] > 1)
    assert not algorithm.build(p, device, config).finish
    check(device, algorithm, p, config, seed=4)
