// transformer.cl — the ops transformers add to a CNN's set: the triangle masks (tril/triu), fp32 layer
// norm backward and the embedding backward.
//
// tri_kernel      out[b, r, c] = keep ? in[b, r, c] : 0, keep = c - r <= K (LOWER) or c - r >= K, over a
//                 batch of R x C matrices; in and out are strided (B, R, C) views (the host merges the
//                 batch dims into one or copies). Elements are moved as raw bits (T: an unsigned type of
//                 the element's size), so one kernel serves every dtype (zero is all bits clear in each).
//                 meta (IDX): count, R, C, K, then offset and the three strides of in, then of out.
//
// ln_forward      layer norm, one work-group of GROUP items per row r of N elements: mean[r] = sum(x) / N,
//                 then rstd[r] = 1 / sqrt(sum((x - mean)^2) / N + eps) (two passes over the row, each sum
//                 by a tree in local memory: the same result run to run), y = (x - mean) rstd, times
//                 weight[j] (HAS_WEIGHT), plus bias[j] (HAS_BIAS). Contiguous float32: x and y (M, N), weight
//                 and bias (N,), mean and rstd (M,). meta (IDX): the backward's, with bias in dy's place
//                 and y in dx's (OFF_B, OFF_Y).
// ln_backward_input   layer norm's input gradient, one work-group of GROUP items per row r of N
//                 elements: with xhat = (x - mean[r]) rstd[r] and g = dy * weight (dy without a weight),
//                 dx = rstd[r] (g - sum(g) / N - xhat sum(g xhat) / N), the two sums by a tree in local
//                 memory (fixed order: results are the same run to run).
// ln_backward_params  grad_weight[j] = sum_r dy xhat, grad_bias[j] = sum_r dy: work-groups of
//                 (PCOLS, PROWS) items, PCOLS adjacent columns each; an item sums the rows r = ly,
//                 ly + PROWS, ..., the PROWS partial sums are then added in a fixed order.
//                 Both take contiguous float32 data: x, dy and dx as (M, N), weight and the gradients
//                 (N,), mean and rstd (M,). meta (IDX): M, N, then the element offsets of x, dy,
//                 weight, mean, rstd, dx, grad_weight, grad_bias.
// emb_link        one work-item per vocabulary row v < V: scans the L indices in order and links the
//                 positions holding v into a list (first[v], then next[position]; -1 ends it), counting
//                 them into count[v]. Each entry is written by exactly one work-item: no atomics.
// emb_sum         one work-item per (feature d, row v): grad_weight[v, d] = the sum of grad[i, d] over v's
//                 positions i in order (divided by count[v] with SCALE; zero for v == padding_idx), so the
//                 result is the same run to run. grad is contiguous (L, D) float32, grad_weight (V, D).
//                 Both take meta (IDX): V, L, D, padding_idx (-1: none), then the element offsets of the
//                 indices, grad and grad_weight. TIDX: the indices' type (long or int).
//
// Variants (-D options): T, IDX (int or long), LOWER; GROUP (a power of two), HAS_WEIGHT, HAS_BIAS, HAS_GW, HAS_GB,
// PCOLS, PROWS; TIDX, SCALE.

#ifndef IDX
  #define IDX int
#endif
#ifndef T
  #define T uint
#endif

typedef struct { IDX v[12]; } tri_meta_t;

__kernel void tri_kernel(__global T *out, __global const T *in, const tri_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= m.v[0]) return;
  const IDX rows = m.v[1], cols = m.v[2], k = m.v[3];
  const IDX c = i % cols, rest = i / cols;
  const IDX r = rest % rows, b = rest / rows;
#ifdef LOWER
  const int keep = c - r <= k;
#else
  const int keep = c - r >= k;
#endif
  const IDX o = m.v[8] + b * m.v[9] + r * m.v[10] + c * m.v[11];
  out[o] = keep ? in[m.v[4] + b * m.v[5] + r * m.v[6] + c * m.v[7]] : (T)0;
}

#ifndef GROUP
  #define GROUP 256
#endif
#ifndef PCOLS
  #define PCOLS 32
#endif
#ifndef PROWS
  #define PROWS 8
#endif

typedef struct { IDX v[10]; } ln_meta_t;
#define LN_M     m.v[0]
#define LN_N     m.v[1]
#define OFF_X    m.v[2]
#define OFF_DY   m.v[3]
#define OFF_W    m.v[4]
#define OFF_MEAN m.v[5]
#define OFF_RSTD m.v[6]
#define OFF_DX   m.v[7]
#define OFF_GW   m.v[8]
#define OFF_GB   m.v[9]
#define OFF_B    OFF_DY   // (the forward's bias and output)
#define OFF_Y    OFF_DX
// the gradient reaching the normalised value x-hat at column j: dy, times the weight if there is one
#ifdef HAS_WEIGHT
  #define WEIGHTED_DY(j) dyr[j] * weight[OFF_W + j]
#else
  #define WEIGHTED_DY(j) dyr[j]
#endif
#include "local_sums.cl"  // GROUP_SUMS

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void ln_forward(__global float *y, __global float *mean, __global float *rstd, __global const float *x,
                __global const float *weight, __global const float *bias, const float eps, const ln_meta_t m)
{
  __local float s1[GROUP], s2[GROUP];
  const IDX r = (IDX)get_group_id(0);
  const int lid = get_local_id(0);
  const IDX n = LN_N;
  __global const float *xr = x + OFF_X + r * n;
  float a = 0.0f;
  for (IDX j = lid; j < n; j += GROUP) { a += xr[j]; }
  GROUP_SUMS(s1, s2, a, 0.0f)
  const float mu = s1[0] / (float)n;
  barrier(CLK_LOCAL_MEM_FENCE);   // every item has read s1[0] before the next sums overwrite it
  float b = 0.0f;
  for (IDX j = lid; j < n; j += GROUP) {
    const float d = xr[j] - mu;
    b = fma(d, d, b);
  }
  GROUP_SUMS(s1, s2, b, 0.0f)
  const float inv = 1.0f / sqrt(s1[0] / (float)n + eps);
  if (lid == 0) {
    mean[OFF_MEAN + r] = mu;
    rstd[OFF_RSTD + r] = inv;
  }
  __global float *yr = y + OFF_Y + r * n;
  for (IDX j = lid; j < n; j += GROUP) {
    float v = (xr[j] - mu) * inv;
#ifdef HAS_WEIGHT
    v *= weight[OFF_W + j];
#endif
#ifdef HAS_BIAS
    v += bias[OFF_B + j];
#endif
    yr[j] = v;
  }
}

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void ln_backward_input(__global float *dx, __global const float *x, __global const float *dy,
                       __global const float *weight, __global const float *mean, __global const float *rstd,
                       const ln_meta_t m)
{
  __local float s1[GROUP], s2[GROUP];
  const IDX r = (IDX)get_group_id(0);
  const int lid = get_local_id(0);
  const IDX n = LN_N;
  __global const float *xr = x + OFF_X + r * n;
  __global const float *dyr = dy + OFF_DY + r * n;
  const float mu = mean[OFF_MEAN + r], inv = rstd[OFF_RSTD + r];
  float a = 0.0f, b = 0.0f;
  for (IDX j = lid; j < n; j += GROUP) {
    const float g = WEIGHTED_DY(j);
    a += g;
    b += g * ((xr[j] - mu) * inv);
  }
  GROUP_SUMS(s1, s2, a, b)
  const float mean_g = s1[0] / (float)n, mean_gx = s2[0] / (float)n;
  __global float *dxr = dx + OFF_DX + r * n;
  for (IDX j = lid; j < n; j += GROUP) {
    const float g = WEIGHTED_DY(j);
    dxr[j] = inv * (g - mean_g - (xr[j] - mu) * inv * mean_gx);
  }
}

__kernel __attribute__((reqd_work_group_size(PCOLS, PROWS, 1)))
void ln_backward_params(__global float *grad_weight, __global float *grad_bias, __global const float *x,
                        __global const float *dy, __global const float *mean, __global const float *rstd,
                        const ln_meta_t m)
{
  __local float sw[PROWS][PCOLS], sb[PROWS][PCOLS];
  const int lx = get_local_id(0), ly = get_local_id(1);
  const IDX j = (IDX)get_group_id(0) * PCOLS + lx;
  const IDX n = LN_N;
  float a = 0.0f, b = 0.0f;
  if (j < n) {
    for (IDX r = ly; r < LN_M; r += PROWS) {
      const float d = dy[OFF_DY + r * n + j];
      a += d * ((x[OFF_X + r * n + j] - mean[OFF_MEAN + r]) * rstd[OFF_RSTD + r]);
      b += d;
    }
  }
  sw[ly][lx] = a;
  sb[ly][lx] = b;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (ly == 0 && j < n) {
    for (int k = 1; k < PROWS; ++k) {
      a += sw[k][lx];
      b += sb[k][lx];
    }
#ifdef HAS_GW
    grad_weight[OFF_GW + j] = a;
#endif
#ifdef HAS_GB
    grad_bias[OFF_GB + j] = b;
#endif
  }
}

#ifndef TIDX
  #define TIDX long
#endif

typedef struct { IDX v[7]; } emb_meta_t;

__kernel void emb_link(__global int *first, __global int *next, __global int *count, __global const TIDX *index,
                       const emb_meta_t m)
{
  const IDX v = (IDX)get_global_id(0);
  if (v >= m.v[0]) return;
  __global const TIDX *idx = index + m.v[4];
  const int positions = (int)m.v[1];
  int head = -1, prev = -1, n = 0;
  for (int i = 0; i < positions; ++i) {
    if ((IDX)idx[i] == v) {
      if (prev < 0) head = i; else next[prev] = i;
      prev = i;
      ++n;
    }
  }
  if (prev >= 0) next[prev] = -1;
  first[v] = head;
  count[v] = n;
}

__kernel void emb_sum(__global float *grad_weight, __global const float *grad, __global const int *first,
                      __global const int *next, __global const int *count, const emb_meta_t m)
{
  const IDX d = (IDX)get_global_id(0), v = (IDX)get_global_id(1);
  const IDX dims = m.v[2];
  if (d >= dims || v >= m.v[0]) return;
  float s = 0.0f;
  if (v != m.v[3]) {
    __global const float *g = grad + m.v[5] + d;
    for (int i = first[v]; i >= 0; i = next[i]) s += g[(IDX)i * dims];
#ifdef SCALE
    if (count[v] > 0) s /= (float)count[v];
#endif
  }
  grad_weight[m.v[6] + v * dims + d] = s;
}
