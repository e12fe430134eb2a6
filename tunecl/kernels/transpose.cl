// transpose.cl — out = in^T for a batch of row-major matrices: out[b][c][r] = in[offset + b * stride +
// r * ld + c] for r < rows, c < cols; out is packed (cols x rows per matrix, matrix b at b * rows * cols).
// Used where a kernel reads an operand only in the other orientation (gemm_wgmma_tf32: TF32 wgmma takes
// K-major tiles only).
//
// A work-group of TILE x TROWS threads moves one TILE x TILE block through local memory: coalesced
// reads along c, coalesced writes along r; the tile's row padding of one element keeps the column reads
// free of bank conflicts. Any rows, cols >= 1 (edges are guarded).
// Grid: dimension 0 = column blocks x TILE, 1 = row blocks x TROWS, 2 = batch.

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
