// group_norm.cl — group norm's backward over contiguous float32 (N, C, HxW) data, C channels in G groups
// of D = C / G, with the forward's mean and rstd of shape (N, G) (torch's GroupNormKernel formulas).
//
// gn_channel_sums     one work-group of GROUP items per (n, c): ds = sum_hw dy * x, db = sum_hw dy, by a
//                     tree in local memory (fixed order: the same result run to run).
// gn_group_coeffs     one work-item per (n, g): with dsg = sum_c ds * gamma, dbg = sum_c db * gamma over the
//                     group's channels (gamma = 1 without a weight) and s = 1 / (D * HxW),
//                     c2 = (dbg * mean - dsg) * rstd^3 * s, c3 = -c2 * mean - dbg * rstd * s.
// gn_backward_input   one work-item per element: dx = rstd * gamma[c] * dy + c2 * x + c3.
// gn_backward_params  one work-item per channel c: grad_weight = sum_n (ds - db * mean) * rstd, grad_bias =
//                     sum_n db, over the batch in order.
// meta (IDX): N, C, HxW, G, then the element offsets of x, dy, mean, rstd, weight, dx, grad_weight,
// grad_bias, ds, db, c2, c3.
//
// Variants (-D options): IDX (int or long), GROUP (a power of two), HAS_WEIGHT, HAS_GW, HAS_GB.

#ifndef IDX
  #define IDX int
#endif
#ifndef GROUP
  #define GROUP 256
#endif

#include "local_sums.cl"  // GROUP_SUMS

typedef struct { IDX v[16]; } gn_meta_t;
#define GN_N   m.v[0]
#define GN_C   m.v[1]
#define GN_HW  m.v[2]
#define GN_G   m.v[3]
#define X_AT      (x + m.v[4])
#define DY_AT     (dy + m.v[5])
#define MEAN_AT   (mean + m.v[6])
#define RSTD_AT   (rstd + m.v[7])
#define WEIGHT_AT (weight + m.v[8])
#define DX_AT     (dx + m.v[9])
#define GW_AT     (grad_weight + m.v[10])
#define GB_AT     (grad_bias + m.v[11])
#define DS_AT     (ds + m.v[12])
#define DB_AT     (db + m.v[13])
#define C2_AT     (c2 + m.v[14])
#define C3_AT     (c3 + m.v[15])

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void gn_channel_sums(__global float *ds, __global float *db, __global const float *x, __global const float *dy,
                     const gn_meta_t m)
{
  __local float s1[GROUP], s2[GROUP];
  const IDX row = (IDX)get_group_id(0);
  const int lid = get_local_id(0);
  const IDX hw = GN_HW;
  __global const float *xr = X_AT + row * hw;
  __global const float *dyr = DY_AT + row * hw;
  float a = 0.0f, b = 0.0f;
  for (IDX j = lid; j < hw; j += GROUP) {
    a += dyr[j] * xr[j];
    b += dyr[j];
  }
  GROUP_SUMS(s1, s2, a, b)
  if (lid == 0) {
    DS_AT[row] = s1[0];
    DB_AT[row] = s2[0];
  }
}

__kernel void gn_group_coeffs(__global float *c2, __global float *c3, __global const float *ds,
                              __global const float *db, __global const float *mean, __global const float *rstd,
                              __global const float *weight, const gn_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);   // n * G + g
  if (i >= GN_N * GN_G) return;
  const IDX d = GN_C / GN_G, g = i % GN_G, n = i / GN_G;
  float dsg = 0.0f, dbg = 0.0f;
  for (IDX k = 0; k < d; ++k) {
    const IDX c = g * d + k;
#ifdef HAS_WEIGHT
    const float gamma = WEIGHT_AT[c];
#else
    const float gamma = 1.0f;
#endif
    dsg += DS_AT[n * GN_C + c] * gamma;
    dbg += DB_AT[n * GN_C + c] * gamma;
  }
  const float mu = MEAN_AT[i], inv = RSTD_AT[i];
  const float s = 1.0f / (float)(d * GN_HW);
  const float b = (dbg * mu - dsg) * inv * inv * inv * s;
  C2_AT[i] = b;
  C3_AT[i] = -b * mu - dbg * inv * s;
}

__kernel void gn_backward_input(__global float *dx, __global const float *x, __global const float *dy,
                                __global const float *rstd, __global const float *weight, __global const float *c2,
                                __global const float *c3, const gn_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  const IDX hw = GN_HW;
  if (i >= GN_N * GN_C * hw) return;
  const IDX nc = i / hw, c = nc % GN_C, n = nc / GN_C;
  const IDX ng = n * GN_G + c / (GN_C / GN_G);
#ifdef HAS_WEIGHT
  const float a = RSTD_AT[ng] * WEIGHT_AT[c];
#else
  const float a = RSTD_AT[ng];
#endif
  DX_AT[i] = a * DY_AT[i] + C2_AT[ng] * X_AT[i] + C3_AT[ng];
}

__kernel void gn_backward_params(__global float *grad_weight, __global float *grad_bias, __global const float *ds,
                                 __global const float *db, __global const float *mean, __global const float *rstd,
                                 const gn_meta_t m)
{
  const IDX c = (IDX)get_global_id(0);
  if (c >= GN_C) return;
  const IDX g = c / (GN_C / GN_G);
  float a = 0.0f, b = 0.0f;
  for (IDX n = 0; n < GN_N; ++n) {
    const IDX ng = n * GN_G + g;
    a += (DS_AT[n * GN_C + c] - DB_AT[n * GN_C + c] * MEAN_AT[ng]) * RSTD_AT[ng];
    b += DB_AT[n * GN_C + c];
  }
#ifdef HAS_GW
  GW_AT[c] = a;
#endif
#ifdef HAS_GB
  GB_AT[c] = b;
#endif
}
