"""The Winograd plan's split run: ``transform_weight`` once, then ``run_transformed`` from that U, gives
bit for bit what ``run`` gives (which test_conv.py checks against torch), for both F(m×m), both
directions that read the weight, with offsets in every buffer, and for plans of other batch sizes and
configs that share the ``transform_key``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tunecl import kernels, runtime
from tunecl.problems import ConvProblem
from tunecl.search.harness_conv import operand_shapes

NAMES = ("conv_winograd", "conv_winograd_f4")
BODY = "n=3,c=6,h=9,w=11,k=8,r=3,s=3,pad=1,groups=2"
OFFSET = 5


@pytest.fixture(scope="module")
def device():
    return runtime.select_device()


def _buffer(device, array: np.ndarray):
    return device.upload(np.concatenate([np.full(OFFSET, 7.0, np.float32), array.ravel()]))


def _download(device, buffer, shape) -> np.ndarray:
    return device.download(buffer, (OFFSET + int(np.prod(shape)),))[OFFSET:].reshape(shape)


@pytest.mark.parametrize("direction", ["fwd", "bwd_data"])
@pytest.mark.parametrize("name", NAMES)
def test_split_run_equals_run(device, name, direction):
    algorithm = kernels.algorithm(name)
    p = ConvProblem.parse(BODY).with_direction(direction)
    assert algorithm.applies(p, device)
    plan = algorithm.build(p, device, algorithm.default(p, device))
    rng = np.random.default_rng(1)
    a_shape, w_shape, out_shape = operand_shapes(p)
    a, w = rng.uniform(-1, 1, a_shape).astype(np.float32), rng.uniform(-1, 1, w_shape).astype(np.float32)
    out0 = rng.uniform(-1, 1, out_shape).astype(np.float32)
    fwd = direction == "fwd"
    bias = _buffer(device, rng.uniform(-1, 1, p.k).astype(np.float32)) if fwd else None
    kwargs = {"a_offset": OFFSET, "out_offset": OFFSET, "bias": bias, "bias_offset": OFFSET if fwd else 0,
              "beta": 0.5}
    a_buf, w_buf = _buffer(device, a), _buffer(device, w)

    whole = _buffer(device, out0)
    plan.run(a_buf, w_buf, whole, b_offset=OFFSET, **kwargs)

    u = _buffer(device, np.full(plan.u_floats, np.nan, np.float32))
    events = plan.transform_weight(w_buf, u, w_offset=OFFSET, u_offset=OFFSET)
    assert events
    split = _buffer(device, out0)
    events = plan.run_transformed(a_buf, u, split, u_offset=OFFSET, **kwargs)
    assert events
    again = _buffer(device, out0)
    plan.run_transformed(a_buf, u, again, u_offset=OFFSET, **kwargs)   # U is only read
    device.synchronize()
    expected = _download(device, whole, out_shape)
    np.testing.assert_array_equal(_download(device, split, out_shape), expected)
    np.testing.assert_array_equal(_download(device, again, out_shape), expected)
    head = device.download(u, (OFFSET,))
    assert (head == 7.0).all(), "the transform wrote before its offset"


@pytest.mark.parametrize("name", NAMES)
def test_plans_of_one_transform_key_share_u(device, name):
    """Another batch (other chunking) and another config read the U of the first plan."""
    algorithm = kernels.algorithm(name)
    p = ConvProblem.parse(BODY)
    first = algorithm.build(p, device, algorithm.default(p, device))
    other_batch = dataclasses.replace(p, n=1)
    configs = algorithm.space(other_batch, device).configs()
    config = next(c for c in configs if c != algorithm.default(other_batch, device))
    second = algorithm.build(other_batch, device, config)
    assert first.transform_key == second.transform_key and first.u_floats == second.u_floats
    assert first.transform_key != algorithm.build(p.with_direction("bwd_data"), device,
                                                  algorithm.default(p.with_direction("bwd_data"), device)).transform_key
    rng = np.random.default_rng(2)
    a_shape, w_shape, out_shape = operand_shapes(other_batch)
    a, w = rng.uniform(-1, 1, a_shape).astype(np.float32), rng.uniform(-1, 1, w_shape).astype(np.float32)
    a_buf, w_buf = device.upload(a), device.upload(w)
    u = device.alloc(4 * first.u_floats)
    first.transform_weight(w_buf, u)
    split, whole = device.alloc(4 * int(np.prod(out_shape))), device.alloc(4 * int(np.prod(out_shape)))
    second.run_transformed(a_buf, u, split)
    second.run(a_buf, w_buf, whole)
    device.synchronize()
    np.testing.assert_array_equal(device.download(split, out_shape), device.download(whole, out_shape))


def test_bias_outside_forward_is_rejected(device):
    algorithm = kernels.algorithm("conv_winograd")
    p = ConvProblem.parse(BODY).with_direction("bwd_data")
    plan = algorithm.build(p, device, algorithm.default(p, device))
    buf = device.alloc(4 * 4096)
    with pytest.raises(ValueError, match="bias"):
        plan.run_transformed(buf, buf, buf, bias=buf)
