"""The batched transpose kernel (``tunecl/kernels/transpose.cl``) against numpy: edge sizes (1, not
multiples of the 32 x 32 tile, one more than a tile), offsets, padded leading dimensions, gaps between
the matrices of a batch and a stride of 0 (one matrix, repeated by the caller's batch of 1)."""

from __future__ import annotations

import numpy as np
import pytest

from tunecl.kernels.transpose import Transpose


@pytest.mark.parametrize("rows, cols, batch, offset, pad, gap", [
    (1, 1, 1, 0, 0, 0),
    (1, 37, 2, 3, 0, 5),
    (37, 1, 1, 1, 2, 0),
    (32, 32, 1, 0, 0, 0),
    (33, 65, 3, 7, 5, 11),
    (100, 64, 2, 0, 0, 0),
    (257, 130, 1, 4, 6, 0),
])
def test_transpose_matches_numpy(device, rows, cols, batch, offset, pad, gap):
    rng = np.random.default_rng(rows * 1000 + cols)
    ld = cols + pad
    stride = rows * ld + gap
    flat = rng.standard_normal(offset + batch * stride + 8).astype(np.float32)
    src = device.upload(flat)
    out_words = batch * rows * cols
    sentinel = np.full(out_words + 16, np.nan, np.float32)
    out = device.upload(sentinel)
    Transpose(device).run(src, offset, ld, stride, rows, cols, batch, out).wait()
    got = device.download(out, sentinel.shape)
    for b in range(batch):
        start = offset + b * stride
        mat = np.stack([flat[start + r * ld: start + r * ld + cols] for r in range(rows)])
        np.testing.assert_array_equal(got[b * rows * cols:(b + 1) * rows * cols].reshape(cols, rows), mat.T)
    assert np.isnan(got[out_words:]).all(), "wrote past the packed result"
