"""The device's random draws (random.cl): Philox4x32-10 against an independent reference, itself checked
on Random123's known-answer vectors; a graph's generator (key and counter in a buffer) and eager draws
(key by value)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from tunecl import runtime
from tunecl.kernels.ops.random import Random

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = np.uint64(0xFFFFFFFF)


def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on numpy arrays of counters (uint64 holding 32-bit words) and a key."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k = [np.uint64(k0), np.uint64(k1)]
    for _ in range(10):
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k[0]) & MASK, p1 & MASK,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k[1]) & MASK, p0 & MASK]
        k = [(k[0] + np.uint64(W0)) & MASK, (k[1] + np.uint64(W1)) & MASK]
    return tuple(int(x) for x in c) if c[0].ndim == 0 else c


@pytest.mark.parametrize("counter, key, expected", [   # Random123's kat_vectors, philox4x32_10
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_the_reference_gives_the_known_answers(counter, key, expected):
    assert philox(*counter, *key) == expected


@pytest.fixture(scope="module")
def device():
    return runtime.select_device()


@pytest.mark.parametrize("dtype, np_dtype, size", [("float32", np.float32, 4), ("bool", np.uint8, 1)])
def test_bernoulli_draws_are_the_philox_stream_and_the_counter_advances(device, dtype, np_dtype, size):
    """A captured graph's draw: key and counter in the state buffer, into float32 or bytes (dropout's bool
    mask); nothing outside the range is written."""
    random = Random(device)
    seed = 0x1234_5678_9ABC_DEF0 + (0x5 << 60)
    state = random.new_state(seed)
    n, p = 5000, 0.3
    out = device.alloc(size * (n + 7))
    cl.enqueue_copy(device.queue, out, np.full(n + 7, 7, dtype=np_dtype))
    random.bernoulli(out, 3, n, p, state, dtype)   # at an element offset
    random.bernoulli(out, 3 + 2000, n - 2000, p, state, dtype)   # the next draw continues the counter
    got = device.download(out, (n + 7,), np_dtype)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF

    def expected(first: int, count: int) -> np.ndarray:
        counter = np.arange(first, first + count, dtype=np.uint64)
        bits = philox(counter & MASK, counter >> np.uint64(32), 0, 0, k0, k1)[0]
        u = (bits >> np.uint64(8)).astype(np.float64) / 2.0**24
        return (u < p).astype(np_dtype)

    np.testing.assert_array_equal(got[3:3 + 2000], expected(0, 2000))
    np.testing.assert_array_equal(got[3 + 2000:3 + n], expected(n, n - 2000))
    assert (got[:3] == 7).all() and (got[3 + n:] == 7).all()
    state_words = device.download(state, (4,), np.uint32)
    assert (int(state_words[3]) << 32 | int(state_words[2])) == n + (n - 2000)
    assert abs(float(got[3:3 + n].mean()) - p) < 0.03
    with pytest.raises(ValueError, match="float32 or bool elements, not int32"):
        random.bernoulli(out, 0, n, p, state, "int32")


@pytest.mark.parametrize("dtype, np_dtype, size", [("float32", np.float32, 4), ("bool", np.uint8, 1)])
def test_keyed_bernoulli_draws_are_the_philox_stream_from_counter_zero(device, dtype, np_dtype, size):
    """Eager dropout's draw: the key passed by value, counters 0 .. n - 1, at an element offset, into
    float32 or bytes; nothing outside the range is written."""
    random = Random(device)
    key = 0x2F0E_1D2C_3B4A_5968
    n, p, offset = 4099, 0.7, 5
    out = device.alloc(size * (n + 2 * offset))
    fill = np.full(n + 2 * offset, 7, dtype=np_dtype)
    cl.enqueue_copy(device.queue, out, fill)
    random.bernoulli_keyed(out, offset, n, p, key, dtype)
    got = device.download(out, (n + 2 * offset,), np_dtype)
    counter = np.arange(n, dtype=np.uint64)
    bits = philox(counter & MASK, counter >> np.uint64(32), 0, 0, key & 0xFFFFFFFF, key >> 32)[0]
    expected = ((bits >> np.uint64(8)).astype(np.float64) / 2.0**24 < p).astype(np_dtype)
    np.testing.assert_array_equal(got[offset:offset + n], expected)
    assert (got[:offset] == 7).all() and (got[offset + n:] == 7).all()
    assert abs(float(got[offset:offset + n].mean()) - p) < 0.03
    with pytest.raises(ValueError, match="float32 or bool elements, not int32"):
        random.bernoulli_keyed(out, 0, n, p, key, "int32")
