"""The batched transpose kernel (``tunecl/kernels/gemm/transpose.cl``) against numpy: edge sizes (1, not
multiples of the 32 x 32 tile, one more than a tile), offsets, padded leading dimensions, gaps between
the matrices of a batch and a stride of 0 (one matrix, repeated by the caller's batch of 1). Cases with
offset, leading dimension, stride, rows and cols all even run the paired (float2, 64 x 64) kernel, the
others the scalar one."""

from __future__ import annotations

import numpy as np
import pytest

from tunecl.kernels.gemm.transpose import Transpose


@pytest.mark.parametrize("rows, cols, batch, offset, pad, gap", [
    (1, 1, 1, 0, 0, 0),
    (1, 37, 2, 3, 0, 5),
    (37, 1, 1, 1, 2, 0),
    (32, 32, 1, 0, 0, 0),
    (33, 65, 3, 7, 5, 11),
    (100, 64, 2, 0, 0, 0),
    (257, 130, 1, 4, 6, 0),
    (2, 2, 1, 0, 0, 0),          # the paired kernel from here on
    (66, 130, 2, 4, 2, 6),
    (128, 64, 3, 2, 0, 2),
    (64, 192, 1, 0, 64, 0),
    (130, 2, 2, 0, 0, 8),
    (96, 34, 2, 6, 4, 3),        # an odd gap: pairs would be misaligned in the second matrix -> scalar
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
    transpose = Transpose(device)
    paired = not (offset % 2 or ld % 2 or (stride % 2 and batch > 1) or rows % 2 or cols % 2)
    paired_kernel, used = transpose._pairs, []
    transpose._pairs = lambda *args, **kwargs: used.append(1) or paired_kernel(*args, **kwargs)
    transpose.run(src, offset, ld, stride, rows, cols, batch, out).wait()
    assert bool(used) == paired
    got = device.download(out, sentinel.shape)
    for b in range(batch):
        start = offset + b * stride
        mat = np.stack([flat[start + r * ld: start + r * ld + cols] for r in range(rows)])
        np.testing.assert_array_equal(got[b * rows * cols:(b + 1) * rows * cols].reshape(cols, rows), mat.T)
    assert np.isnan(got[out_words:]).all(), "wrote past the packed result"
