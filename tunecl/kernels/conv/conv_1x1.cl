// conv_1x1.cl — the strided data movement of 1x1 convolutions (padding 0) computed as GEMMs by the
// GEMM family, fp32 NCHW. With stride 1 the GEMMs read and write the tensors in place and none of
// this runs; with stride SH x SW:
//
//   gather_strided   xs[nb*C*LD + c*LD + p*Q + q] = x[n0+nb, c, p*SH, q*SW]      (fwd, bwd_weight)
//   scatter_strided  dx[n0+nb, c, h, w] = dxs[nb*C*LD + c*LD + (h/SH)*Q + w/SW] where SH | h and
//                    SW | w, else 0 (+ beta * dx; beta == 0 never reads dx)       (bwd_data)
//
// for the CHUNK_N images n0 .. n0+CHUNK_N-1 of one pass. A work-item handles IPT pixels, IWG apart
// (IWG work-items per work-group), so neighbouring work-items touch neighbouring pixels.

// ---- problem geometry (the host passes all of them; defaults only let the file compile alone) ----
#include "conv_geometry.cl"  // CONV_N, CONV_C, ..., CONV_P, CONV_Q, HW, PQ
#include "conv_pixel_passes.cl"  // CHUNK_N, IWG, IPT, SPAN

// ---- layout of the workspace (derived by the host) ----
#ifndef LD
  #define LD 16         // elements between the rows (channels) of a gathered image, P*Q padded to 4
#endif

// launch: (ceil(PQ / SPAN) * IWG, C, CHUNK_N)
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void gather_strided(__global const float *x_agm, const int x_offset, const int n0,
                    __global float *xs_agm, const int xs_offset) {
  const int c = get_global_id(1), nb = get_global_id(2);
  const __global float *x_gm = x_agm + x_offset + ((n0 + nb) * CONV_C + c) * HW;
  __global float *xs_gm = xs_agm + xs_offset + (nb * CONV_C + c) * LD;
  const int first = get_group_id(0) * SPAN + get_local_id(0);
  for (int i = 0; i < IPT; i++) {
    const int pq = first + i * IWG;
    if (pq < PQ) { xs_gm[pq] = x_gm[(pq / CONV_Q) * STRIDE_H * CONV_W + (pq % CONV_Q) * STRIDE_W]; }
  }
}

// launch: (ceil(HW / SPAN) * IWG, C, CHUNK_N)
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void scatter_strided(__global const float *dxs_agm, __global float *dx_agm, const int dx_offset,
                     const int n0, const float beta) {
  const int c = get_global_id(1), nb = get_global_id(2);
  const __global float *dxs_gm = dxs_agm + (nb * CONV_C + c) * LD;
  const int first = get_group_id(0) * SPAN + get_local_id(0);
  for (int i = 0; i < IPT; i++) {
    const int hw = first + i * IWG;
    if (hw >= HW) { break; }
    const int h = hw / CONV_W, w = hw % CONV_W;
    const float v = (h % STRIDE_H == 0 && w % STRIDE_W == 0)
                        ? dxs_gm[(h / STRIDE_H) * CONV_Q + w / STRIDE_W] : 0.0f;
    const int index = dx_offset + ((n0 + nb) * CONV_C + c) * HW + hw;
    dx_agm[index] = (beta != 0.0f) ? v + beta * dx_agm[index] : v;
  }
}
