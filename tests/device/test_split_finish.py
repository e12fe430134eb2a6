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

from tunecl.kernels.conv import conv_columns, conv_depthwise, conv_implicit_gemm
from tunecl.kernels.conv.conv_common import out_elements
from tunecl.problems import ConvProblem
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


# -- conv_1x1 / conv_im2col bwd_weight: the images of a chunk added in the GEMM's launch ------------------
COLUMNS_CASES = [("conv_1x1", "1x1_s1"), ("conv_1x1", "1x1_s2"), ("conv_im2col", "3x3_s1_odd"),
                 ("conv_im2col", "groups2")]


def columns_configs(device, algorithm, p, count: int = 3) -> list[dict]:
    """Up to ``count`` configs on gemm_tiled: the default, and others of different splits of K and tiles."""
    configs = list(algorithm.space(p, device).configs())
    picked = {}
    for c in [algorithm.default(p, device)] + configs[:: max(1, len(configs) // (4 * count))]:
        picked.setdefault((c.get("g_SPLITK", 1), c["g_MWG"], c["g_NWG"]), c)
    plain = [c for c in configs if not c.get("g_STREAMK") and not c.get("g_ASYNC")]
    return (list(picked.values())[:count] + [c for c in plain if c.get("g_SPLITK", 1) > 1][:1]
            + [c for c in configs if c.get("g_STREAMK")][:1])


@pytest.mark.parametrize("family,shape", COLUMNS_CASES)
def test_a_chunks_images_are_added_in_the_gemms_launch(device, monkeypatch, family, shape):
    """bwd_weight with several images per chunk: the GEMM's last work-group of each dW tile adds the
    images' products (and, with split K, the slices) in split_reduce's order: the same results bit for
    bit, with offsets, beta, and several chunks accumulating; one launch fewer."""
    algorithm = ALGORITHMS[family]
    p = problem(shape, "bwd_weight")
    for config in columns_configs(device, algorithm, p):
        monkeypatch.setattr(conv_columns, "FINISH_SPLITS", True)   # (run_both leaves it False)
        plan = algorithm.build(p, device, config)
        # a stream-K tail or a transposed copy of an operand keeps the separate launch
        plain = not config.get("g_STREAMK") and not config.get("g_ASYNC")
        assert plan.sums_images == plain == getattr(plan.gemm_plan, "sum_batch", False), config
        assert plan.workspace_bytes == 4 * (plan.layout.gathered_floats if plain else plan.layout.workspace_floats)
        finished, separate = run_both(device, monkeypatch, p, config, algorithm, conv_columns,
                                      seed=config["g_MWG"], offsets=3)
        np.testing.assert_array_equal(finished, separate, err_msg=f"{p.key} {config}")
        run_both(device, monkeypatch, p, config, algorithm, conv_columns, beta=0.5, seed=2)


@pytest.mark.parametrize("module_name", ["conv_1x1", "conv_im2col"])
def test_later_chunks_add_their_images_sum_onto_the_earlier_ones(device, monkeypatch, module_name):
    """Four images in chunks of two: each chunk's GEMM adds its two images, the second onto the first's
    result (beta 1 after the call's own beta), the same results bit for bit as the separate launch."""
    import importlib

    module = importlib.import_module(f"tunecl.kernels.conv.{module_name}")
    algorithm = module.ALGORITHMS[0]
    p = ConvProblem.parse("n=4,c=6,h=5,w=7,k=10,r=1,s=1,stride=2" if module_name == "conv_1x1"
                          else "n=4,c=3,h=6,w=5,k=8,r=3,s=3,pad=1").with_direction("bwd_weight")
    monkeypatch.setattr(module, "WORKSPACE_CAP", module.layout(p).workspace_floats * 4 // 2)
    module.layout.cache_clear()
    try:
        assert module.layout(p).chunk == 2
        config = algorithm.default(p, device)
        monkeypatch.setattr(conv_columns, "FINISH_SPLITS", True)
        assert algorithm.build(p, device, config).sums_images
        for beta in (0.0, 0.5):
            finished, separate = run_both(device, monkeypatch, p, config, algorithm, conv_columns, beta=beta,
                                          seed=7, offsets=1)
            np.testing.assert_array_equal(finished, separate)
    finally:
        monkeypatch.undo()
        module.layout.cache_clear()


def test_the_images_sum_leaves_its_counters_at_zero(device, monkeypatch):
    """Repeated and interleaved runs of two summing plans: each gives its own result every time, in one
    launch per run (stride 1: no gather), and every tile counter is zero after them."""
    monkeypatch.setattr(conv_columns, "FINISH_SPLITS", True)
    algorithm = ALGORITHMS["conv_1x1"]
    problems = [problem("1x1_s1", "bwd_weight"),
                ConvProblem.parse("n=4,c=8,h=5,w=6,k=20,r=1,s=1").with_direction("bwd_weight")]
    plans = [algorithm.build(q, device, algorithm.default(q, device)) for q in problems]
    results: list[list[np.ndarray]] = [[], []]
    rng = np.random.default_rng(0)
    for _ in range(3):
        for k, (q, plan) in enumerate(zip(problems, plans)):
            assert plan.sums_images
            a_shape, b_shape, out_shape = operand_shapes(q)
            a = np.random.default_rng(k).uniform(-1, 1, a_shape).astype(np.float32)
            b = np.random.default_rng(k + 10).uniform(-1, 1, b_shape).astype(np.float32)
            out = device.upload(rng.uniform(-1, 1, out_shape).astype(np.float32))
            assert len(plan.run(device.upload(a), device.upload(b), out)) == 1
            device.synchronize()
            results[k].append(device.download(out, out_shape))
    for k, plan in enumerate(plans):
        for got in results[k][1:]:
            np.testing.assert_array_equal(got, results[k][0])
        gemm = plan.gemm_plan
        parts = gemm.splitk * gemm.problem.batch * gemm.problem.m * -(-gemm.problem.n // 4) * 4
        counters = device.download(gemm.workspace, (gemm.workspace_bytes // 4,), np.int32)[parts:]
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


@pytest.mark.parametrize("family", ["conv_implicit_gemm", "conv_depthwise", "gemm_tiled", "conv_1x1"])
def test_a_device_that_fails_the_probe_takes_the_second_launch(device, monkeypatch, family):
    """Where the probe failed, every family builds its split plans with the separate reduction launch,
    and computes the same results."""
    from tunecl.kernels import split_finish
    from tunecl.kernels.gemm import gemm_tiled
    from tunecl.problems import GemmProblem

    monkeypatch.setitem(split_finish._verdicts, device, "failed here")
    if family == "conv_1x1":
        algorithm = ALGORITHMS[family]
        p = problem("1x1_s2", "bwd_weight")
        plan = algorithm.build(p, device, algorithm.default(p, device))
        assert not plan.sums_images and not getattr(plan.gemm_plan, "sum_batch", False)
        check(device, algorithm, p, algorithm.default(p, device), seed=4)
        return
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
