// conv_common.cl — helper kernels every convolution family may use; fp32, element offsets.
//
// split_reduce: out[i] = sum_{j < parts} ws[j*part_stride + i]  (+ bias[(i / bias_inner) % bias_k])
//               (+ beta * out[i]), summed in the fixed order j = 0, 1, ... so split reductions stay
//               deterministic run to run. beta == 0 never reads out.
// add_bias:     out[i] += bias[(i / bias_inner) % bias_k] for the families whose GEMM cannot fuse it.
//
// OUT_HALF 1: split_reduce's out is half (float16 problems): read with vload_half, the fp32 sum rounded
// once to nearest even; the workspace and the bias stay fp32.

#ifndef OUT_HALF
  #define OUT_HALF 0    // 1 = split_reduce writes a half output
#endif
#if OUT_HALF
  #define OUT_TYPE half
  #define LOAD_OUT(p, i) vload_half(i, p)
  #define STORE_OUT(x, p, i) vstore_half_rte(x, i, p)
#else
  #define OUT_TYPE float
  #define LOAD_OUT(p, i) ((p)[i])
  #define STORE_OUT(x, p, i) ((p)[i] = (x))
#endif

__kernel void split_reduce(__global OUT_TYPE *out_agm, const int out_offset,
                           __global const float *ws_agm, const int parts, const int part_stride,
                           const int n,
                           __global const float *bias_agm, const int bias_offset, const int use_bias,
                           const int bias_inner, const int bias_k, const float beta) {
  const int i = get_global_id(0);
  if (i >= n) { return; }
  float sum = 0.0f;
  for (int j = 0; j < parts; j++) {
    sum += ws_agm[j * part_stride + i];
  }
  if (use_bias) { sum += bias_agm[bias_offset + (i / bias_inner) % bias_k]; }
  if (beta != 0.0f) { sum += beta * LOAD_OUT(out_agm, out_offset + i); }
  STORE_OUT(sum, out_agm, out_offset + i);
}

__kernel void add_bias(__global float *out_agm, const int out_offset, const int n,
                       __global const float *bias_agm, const int bias_offset,
                       const int bias_inner, const int bias_k) {
  const int i = get_global_id(0);
  if (i < n) { out_agm[out_offset + i] += bias_agm[bias_offset + (i / bias_inner) % bias_k]; }
}
