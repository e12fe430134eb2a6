// transpose.cl — out = in^T for a batch of row-major matrices: out[b][c][r] = in[offset + b * stride +
// r * ld + c] for r < rows, c < cols; out is packed (cols x rows per matrix, matrix b at b * rows * cols).
// Used where a kernel reads an operand only in the other orientation (gemm_wgmma_tf32: TF32 wgmma takes
// K-major tiles only).
//
// A work-group of TILE x TROWS threads moves one TILE x TILE block through local memory: coalesced
// reads along c, coalesced writes along r; the tile's row padding of one element keeps the column reads
// free of bank conflicts. Any rows, cols >= 1 (edges are guarded).
// Grid: dimension 0 = column blocks x TILE, 1 = row blocks x TROWS, 2 = batch.
//
// transpose_pairs does the same with float2 loads and stores and a 64 x 64 tile (PAIR_TILE), for layouts
// whose every pair is whole and 8-byte aligned: offset, ld, stride, rows and cols even (transpose.py
// checks; the buffers themselves are aligned). On the H200 it moved a 4096 x 4096 matrix in 0.040 ms
// against transpose's 0.046 (a buffer copy of the same bytes: 0.037).
// Grid: dimension 0 = PAIR_TILE-column blocks x TILE, 1 = PAIR_TILE-row blocks x TROWS, 2 = batch.

#define T float
#define TILE 32
#define TROWS 8

__kernel __attribute__((reqd_work_group_size(TILE, TROWS, 1)))
void transpose(__global const T* in, const long offset, const int ld, const long stride,
               __global T* out, const int rows, const int cols) {
  __local T tile[TILE][TILE + 1];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int c0 = get_group_id(0) * TILE, r0 = get_group_id(1) * TILE;
  const long b = get_global_id(2);
  __global const T* src = in + offset + b * stride;
  for (int j = ty; j < TILE; j += TROWS) {
    const int r = r0 + j, c = c0 + tx;
    if (r < rows && c < cols) { tile[j][tx] = src[(long)r * ld + c]; }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  __global T* dst = out + b * rows * cols;
  for (int j = ty; j < TILE; j += TROWS) {
    const int c = c0 + j, r = r0 + tx;
    if (r < rows && c < cols) { dst[(long)c * rows + r] = tile[tx][j]; }
  }
}

#define PAIR_TILE 64

__kernel __attribute__((reqd_work_group_size(TILE, TROWS, 1)))
void transpose_pairs(__global const T* in, const long offset, const int ld, const long stride,
                     __global T* out, const int rows, const int cols) {
  __local T tile[PAIR_TILE][PAIR_TILE + 1];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int c0 = get_group_id(0) * PAIR_TILE, r0 = get_group_id(1) * PAIR_TILE;
  const long b = get_global_id(2);
  __global const T* src = in + offset + b * stride;
  const int c = c0 + 2 * tx;  // even, and cols is even: the pair (c, c + 1) is whole or absent
  for (int j = ty; j < PAIR_TILE; j += TROWS) {
    const int r = r0 + j;
    if (r < rows && c < cols) {
      const float2 v = *(__global const float2*)(src + (long)r * ld + c);
      tile[j][2 * tx] = v.x;
      tile[j][2 * tx + 1] = v.y;
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  __global T* dst = out + b * rows * cols;
  const int r = r0 + 2 * tx;  // even, and rows is even
  for (int j = ty; j < PAIR_TILE; j += TROWS) {
    const int cc = c0 + j;
    if (r < rows && cc < cols) {
      *(__global float2*)(dst + (long)cc * rows + r) = (float2)(tile[2 * tx][j], tile[2 * tx + 1][j]);
    }
  }
}
