// conv_im2col.cl — the data movement of convolution through an explicit GEMM, fp32 NCHW; the GEMMs
// themselves are the GEMM family's plans. A chunk of CHUNK_N images is processed per pass.
//
//   im2col   col[nb*COL_IMAGE + (c*R*S + r*S + s)*COL_LD + p*Q + q]
//              = x[n0+nb, c, p*SH-PH+r*DH, q*SW-PW+s*DW]   (zero outside x): one C*R*S x P*Q matrix
//            per image (fwd, bwd_weight)
//   col2im   dx[n0+nb, c, h, w] = sum_{r,s} col[nb*COL_IMAGE + (c*R*S + r*S + s)*COL_LD + p*Q + q]
//            over the taps with p = (h+PH-r*DH)/SH and q = (w+PW-s*DW)/SW exact and inside dy: a
//            gather, so no atomics and a fixed summation order (+ beta * dx; beta == 0 never reads dx)
//
// A work-item handles IPT elements along the pixel dimension, IWG apart (IWG work-items per
// work-group), so neighbouring work-items touch neighbouring pixels and accesses coalesce.

// ---- problem geometry (the host passes all of them; defaults only let the file compile alone) ----
#include "conv_geometry.cl"  // CONV_N, CONV_C, ..., DIRECTION, CONV_P, CONV_Q
#include "conv_pixel_passes.cl"  // CHUNK_N, IWG, IPT, SPAN

// ---- layout of the workspace (derived by the host from the direction and the chunk) ----
#ifndef COL_LD
  #define COL_LD 64     // elements between rows of a column matrix (pixels, padded to 4)
#endif

#define COL_IMAGE (CONV_C * RS * COL_LD)      // elements between the images' column matrices

// launch: (ceil(PQ / SPAN) * IWG, C*R*S, CHUNK_N)
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void im2col(__global const float *x_agm, const int x_offset, const int n0, __global float *col_agm,
            const int col_offset) {
  const int crs = get_global_id(1), nb = get_global_id(2);
  const int c = crs / RS, r = (crs % RS) / CONV_S, s = crs % CONV_S;
  const __global float *x_gm = x_agm + x_offset + ((n0 + nb) * CONV_C + c) * HW;
  __global float *col_gm = col_agm + col_offset + nb * COL_IMAGE + crs * COL_LD;
  const int first = get_group_id(0) * SPAN + get_local_id(0);
  for (int i = 0; i < IPT; i++) {
    const int pq = first + i * IWG;
    if (pq < PQ) {
      const int ih = (pq / CONV_Q) * STRIDE_H - PAD_H + r * DIL_H;
      const int iw = (pq % CONV_Q) * STRIDE_W - PAD_W + s * DIL_W;
      col_gm[pq] = (ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W) ? x_gm[ih * CONV_W + iw] : 0.0f;
    }
  }
}

// launch: (ceil(HW / SPAN) * IWG, C, CHUNK_N)
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void col2im(__global const float *col_agm, __global float *dx_agm, const int dx_offset, const int n0,
            const float beta) {
  const int c = get_global_id(1), nb = get_global_id(2);
  const __global float *col_gm = col_agm + nb * COL_IMAGE + c * RS * COL_LD;
  const int first = get_group_id(0) * SPAN + get_local_id(0);
  for (int i = 0; i < IPT; i++) {
    const int hw = first + i * IWG;
    if (hw >= HW) { break; }
    const int h = hw / CONV_W, w = hw % CONV_W;
    float sum = 0.0f;
    for (int r = 0; r < CONV_R; r++) {
      const int hp = h + PAD_H - r * DIL_H;
      if (hp < 0 || hp % STRIDE_H != 0 || hp / STRIDE_H >= CONV_P) { continue; }
      for (int s = 0; s < CONV_S; s++) {
        const int wp = w + PAD_W - s * DIL_W;
        if (wp < 0 || wp % STRIDE_W != 0 || wp / STRIDE_W >= CONV_Q) { continue; }
        sum += col_gm[(r * CONV_S + s) * COL_LD + (hp / STRIDE_H) * CONV_Q + wp / STRIDE_W];
      }
    }
    const int index = dx_offset + ((n0 + nb) * CONV_C + c) * HW + hw;
    dx_agm[index] = (beta != 0.0f) ? sum + beta * dx_agm[index] : sum;
  }
}
