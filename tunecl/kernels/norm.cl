// norm.cl — batch normalisation forward (train and eval) and backward, fp32.
//
// x is contiguous (N, C, L) (L = H*W for images); per-channel vectors (weight, bias, running and
// saved statistics) are contiguous (C,). M = N * L elements per channel.
//
// Per-channel sums are split over P work-groups per channel (a "partial" kernel on a 2-D grid of
// (GROUP * P, C) items, one work-group per (part, channel)), each writing its sums to scratch; a
// "finalize" kernel (one work-item per channel) adds the P partials in a fixed order, so results
// are the same run to run. With P = 1 the partial kernel finishes the channel itself. Part p of a
// channel covers its elements j in [p * chunk, min((p + 1) * chunk, M)), chunk = ceil(M / P),
// j = n * L + l; a work-item walks (n, l) by steps of GROUP without dividing.
//
// scratch (floats): [0, 2C) per-channel results of the backward reduction (sum(dy) at c,
// sum(dy (x - mean)) at C + c, read by bn_backward_apply); [2C, 2C + 2CP) the partials: first sum
// of part p of channel c at 2C + c P + p, second sum at 2C + CP + c P + p.
//
// Kernels (all take the same arguments; buffers a kernel does not use may be NULL):
//   bn_stats / bn_stats_finalize
//                     each part's S1 = sum(x - K) (K: the channel's first element) and M2 = sum((x -
//                     part mean)^2) (two passes); mean = K + S1/M, the parts' M2 combined by Chan et
//                     al.'s formula; var = M2/M (biased),
//                     1/sqrt(var + eps) into save_mean/save_invstd; with HAS_RUNNING also
//                     running = (1 - momentum) * running + momentum * stat (unbiased var)
//   bn_apply          y = (x - mean) * invstd * weight + bias, from the saved statistics or, with
//                     EVAL, from the running ones
//   bn_backward_reduce / bn_backward_finalize
//                     sum(dy) and sum(dy * (x - mean)) into scratch[c], scratch[C + c],
//                     grad_weight = sum(dy * (x - mean)) * invstd, grad_bias = sum(dy)
//   bn_backward_apply   train: gx = (dy - sum(dy)/M - (x - mean) invstd^2 sum(dy (x - mean))/M)
//                     * invstd * weight; EVAL: gx = dy * invstd * weight
// The elementwise kernels (bn_apply, bn_backward_apply) run on a 2-D grid: dim 1 over the rows
// r = n * C + c (c = r % C once per row), dim 0 over l within the row.
//
// Variants (-D options): GROUP (work-group size of the partial kernels, a power of two), IDX (int
// or long), HAS_WEIGHT, HAS_BIAS, HAS_RUNNING, EVAL (statistics come from running_mean/var),
// HAS_GW, HAS_GB.
// meta (IDX): N, C, L, then element offsets of x, y (or grad_input), weight, bias, running_mean,
// running_var, save_mean, save_invstd, dy, grad_weight, grad_bias, then P.

#ifndef GROUP
  #define GROUP 256
#endif
#ifndef IDX
  #define IDX int
#endif

typedef struct { IDX v[15]; } meta_t;
#define N       m.v[0]
#define C       m.v[1]
#define L       m.v[2]
#define OFF_X   m.v[3]
#define OFF_Y   m.v[4]
#define OFF_W   m.v[5]
#define OFF_B   m.v[6]
#define OFF_RM  m.v[7]
#define OFF_RV  m.v[8]
#define OFF_SM  m.v[9]
#define OFF_SI  m.v[10]
#define OFF_DY  m.v[11]
#define OFF_GW  m.v[12]
#define OFF_GB  m.v[13]
#define PARTS   m.v[14]

#define BN_ARGS __global const float *x, __global float *y, __global const float *weight,      \
                __global const float *bias, __global float *running_mean,                     \
                __global float *running_var, __global float *save_mean,                       \
                __global float *save_invstd, __global const float *dy,                        \
                __global float *grad_weight, __global float *grad_bias,                       \
                __global float *scratch, const float eps, const float momentum, const meta_t m

// the partials of channel c, part p
#define PART1(c, p) scratch[2 * C + (c) * PARTS + (p)]
#define PART2(c, p) scratch[2 * C + C * PARTS + (c) * PARTS + (p)]

#ifdef HAS_WEIGHT
  #define W(c) weight[OFF_W + (c)]
#else
  #define W(c) 1.0f
#endif
#ifdef HAS_BIAS
  #define B(c) bias[OFF_B + (c)]
#else
  #define B(c) 0.0f
#endif
#ifdef EVAL
  #define MEAN(c)   running_mean[OFF_RM + (c)]
  #define INVSTD(c) (1.0f / sqrt(running_var[OFF_RV + (c)] + eps))
#else
  #define MEAN(c)   save_mean[OFF_SM + (c)]
  #define INVSTD(c) save_invstd[OFF_SI + (c)]
#endif

// sum two values over the work-group (fixed order); every item gets the results
#define GROUP_SUM2(a, b, part)                                  \
  part[lid] = a;                                                \
  part[GROUP + lid] = b;                                        \
  barrier(CLK_LOCAL_MEM_FENCE);                                 \
  for (int s = GROUP / 2; s > 0; s >>= 1) {                     \
    if (lid < s) {                                              \
      part[lid] += part[lid + s];                               \
      part[GROUP + lid] += part[GROUP + lid + s];               \
    }                                                           \
    barrier(CLK_LOCAL_MEM_FENCE);                               \
  }                                                             \
  a = part[0];                                                  \
  b = part[GROUP];                                              \
  barrier(CLK_LOCAL_MEM_FENCE);

// The elements of a partial kernel's work-group (part, channel c): j = n * L + l of channel c, from
// `first` + lid by steps of GROUP while j < `end`; `off` is the element's position relative to a
// tensor's offset, (n * C + c) * L + l. A step of GROUP elements is qn rows plus ql positions
// (GROUP = qn * L + ql, ql < L), so the walk never divides.
#define PART_BEGIN(c)                                                                       \
  const IDX count = N * L;                                                                  \
  const IDX parts = (IDX)get_num_groups(0);                                                 \
  const IDX chunk = (count + parts - 1) / parts;                                            \
  const IDX first = (IDX)get_group_id(0) * chunk;                                           \
  const IDX end = min(first + chunk, count);                                                \
  const IDX qn = (IDX)GROUP / L;                                                            \
  const IDX ql = (IDX)GROUP - qn * L;                                                       \
  const IDX plane = C * L;                                                                  \
  const IDX row_step = qn * plane + ql;                                                     \
  const IDX wrap = plane - L;                                                               \
  IDX j = first + (IDX)lid;                                                                 \
  IDX l = j % L;                                                                            \
  IDX off = (j / L) * plane + (c) * L + l;
#define PART_STEP                                                                           \
  l += ql;                                                                                  \
  off += row_step;                                                                          \
  if (l >= L) {                                                                             \
    l -= L;                                                                                 \
    off += wrap;                                                                            \
  }

// mean, invstd and running statistics of channel c from its sum and sum((x - mean)^2)
inline void finish_stats(const IDX c, const float mean, const float m2,
                         __global float *running_mean, __global float *running_var,
                         __global float *save_mean, __global float *save_invstd,
                         const float eps, const float momentum, const meta_t m)
{
  const IDX count = N * L;
  save_mean[OFF_SM + c] = mean;
  save_invstd[OFF_SI + c] = 1.0f / sqrt(m2 / (float)count + eps);
#ifdef HAS_RUNNING
  running_mean[OFF_RM + c] = (1.0f - momentum) * running_mean[OFF_RM + c] + momentum * mean;
  running_var[OFF_RV + c] = (1.0f - momentum) * running_var[OFF_RV + c]
                            + momentum * m2 / (float)(count - 1);
#endif
}

// scratch, grad_weight and grad_bias of channel c from its sums
inline void finish_backward(const IDX c, const float sum_dy, const float sum_dy_xmu,
                            __global const float *running_var, __global const float *save_invstd,
                            __global float *grad_weight, __global float *grad_bias,
                            __global float *scratch, const float eps, const meta_t m)
{
  scratch[c] = sum_dy;
  scratch[C + c] = sum_dy_xmu;
#ifdef HAS_GW
  grad_weight[OFF_GW + c] = sum_dy_xmu * INVSTD(c);
#endif
#ifdef HAS_GB
  grad_bias[OFF_GB + c] = sum_dy;
#endif
}

// grid (GROUP * P, C'), C' <= C channels at a time. Two passes over the part's elements (the second
// mostly from cache): S1 = sum(x - K) with K the channel's first element (a shift that keeps the sum
// small when the mean is large next to the spread), then M2 = sum((x - part mean)^2).
__kernel void bn_stats(BN_ARGS)
{
  const int lid = (int)get_local_id(0);
  __local float part[2 * GROUP];
  for (IDX c = (IDX)get_group_id(1); c < C; c += (IDX)get_num_groups(1)) {
    const float K = N * L > 0 ? x[OFF_X + c * L] : 0.0f;
    float s1 = 0.0f, s2 = 0.0f;
    PART_BEGIN(c)
    const IDX j0 = j, l0 = l, off0 = off;
    for (; j < end; j += GROUP) {
      s1 += x[OFF_X + off] - K;
      PART_STEP
    }
    GROUP_SUM2(s1, s2, part)
    const float shifted = s1;
    const IDX n_part = end > first ? end - first : 0;
    const float mean = K + (n_part > 0 ? shifted / (float)n_part : 0.0f);
    j = j0;
    l = l0;
    off = off0;
    for (; j < end; j += GROUP) {
      const float d = x[OFF_X + off] - mean;
      s2 += d * d;
      PART_STEP
    }
    s1 = 0.0f;
    GROUP_SUM2(s1, s2, part)
    if (lid == 0) {
      if (get_num_groups(0) == 1)   // (an empty channel: NaN statistics, as sum / M gives)
        finish_stats(c, K + shifted / (float)count, count > 0 ? s2 : NAN, running_mean, running_var,
                     save_mean, save_invstd, eps, momentum, m);
      else {
        PART1(c, (IDX)get_group_id(0)) = shifted;
        PART2(c, (IDX)get_group_id(0)) = s2;
      }
    }
  }
}

// one work-item per channel: mean = K + (sum of the parts' S1) / M, M2 by Chan et al.'s combination,
// sum over parts of M2_p + n_p (mean_p - mean)^2, in part order
__kernel void bn_stats_finalize(BN_ARGS)
{
  const IDX c = (IDX)get_global_id(0);
  if (c >= C) return;
  const IDX count = N * L;
  const IDX chunk = (count + PARTS - 1) / PARTS;
  float shifted = 0.0f;
  for (IDX p = 0; p < PARTS; ++p) shifted += PART1(c, p);
  const float offset = shifted / (float)count;   // mean - K
  const float K = count > 0 ? x[OFF_X + c * L] : 0.0f;
  float m2 = count > 0 ? 0.0f : NAN;
  for (IDX p = 0; p < PARTS; ++p) {
    const IDX first = p * chunk;
    const IDX n_part = first < count ? min(chunk, count - first) : 0;
    if (n_part > 0) {
      const float delta = PART1(c, p) / (float)n_part - offset;
      m2 += PART2(c, p) + (float)n_part * delta * delta;
    }
  }
  finish_stats(c, K + offset, m2, running_mean, running_var, save_mean, save_invstd, eps, momentum, m);
}

// grid (GROUP * P, C'), C' <= C channels at a time
__kernel void bn_backward_reduce(BN_ARGS)
{
  const int lid = (int)get_local_id(0);
  __local float part[2 * GROUP];
  for (IDX c = (IDX)get_group_id(1); c < C; c += (IDX)get_num_groups(1)) {
    const float mean = MEAN(c);
    float sum_dy = 0.0f, sum_dy_xmu = 0.0f;
    PART_BEGIN(c)
    for (; j < end; j += GROUP) {
      const float g = dy[OFF_DY + off];
      sum_dy += g;
      sum_dy_xmu += g * (x[OFF_X + off] - mean);
      PART_STEP
    }
    GROUP_SUM2(sum_dy, sum_dy_xmu, part)
    if (lid == 0) {
      if (get_num_groups(0) == 1)
        finish_backward(c, sum_dy, sum_dy_xmu, running_var, save_invstd, grad_weight, grad_bias, scratch, eps, m);
      else {
        PART1(c, (IDX)get_group_id(0)) = sum_dy;
        PART2(c, (IDX)get_group_id(0)) = sum_dy_xmu;
      }
    }
  }
}

// one work-item per channel
__kernel void bn_backward_finalize(BN_ARGS)
{
  const IDX c = (IDX)get_global_id(0);
  if (c >= C) return;
  float sum_dy = 0.0f, sum_dy_xmu = 0.0f;
  for (IDX p = 0; p < PARTS; ++p) {
    sum_dy += PART1(c, p);
    sum_dy_xmu += PART2(c, p);
  }
  finish_backward(c, sum_dy, sum_dy_xmu, running_var, save_invstd, grad_weight, grad_bias, scratch, eps, m);
}

// The elementwise kernels: rows r = n * C + c over dim 1 (c = r % C once per row), positions l
// within the row over dim 0; element i = r * L + l.
__kernel void bn_apply(BN_ARGS)
{
  const IDX rows = N * C;
  const IDX l0 = (IDX)get_global_id(0), lstep = (IDX)get_global_size(0);
  for (IDX r = (IDX)get_global_id(1); r < rows; r += (IDX)get_global_size(1)) {
    const IDX c = r % C;
    const float mean = MEAN(c);
    const float scale = INVSTD(c) * W(c);
    const float shift = B(c);
    __global const float *xr = x + OFF_X + r * L;
    __global float *yr = y + OFF_Y + r * L;
    for (IDX l = l0; l < L; l += lstep) yr[l] = (xr[l] - mean) * scale + shift;
  }
}

__kernel void bn_backward_apply(BN_ARGS)
{
  const IDX rows = N * C;
  const IDX l0 = (IDX)get_global_id(0), lstep = (IDX)get_global_size(0);
  for (IDX r = (IDX)get_global_id(1); r < rows; r += (IDX)get_global_size(1)) {
    const IDX c = r % C;
    const float invstd = INVSTD(c);
    const float scale = invstd * W(c);
    __global const float *gr = dy + OFF_DY + r * L;
    __global float *yr = y + OFF_Y + r * L;
#ifdef EVAL
    for (IDX l = l0; l < L; l += lstep) yr[l] = gr[l] * scale;
#else
    const float mean = MEAN(c);
    const float count = (float)(N * L);
    const float a = scratch[c] / count;
    const float b = invstd * invstd * scratch[C + c] / count;
    __global const float *xr = x + OFF_X + r * L;
    for (IDX l = l0; l < L; l += lstep) yr[l] = (gr[l] - a - (xr[l] - mean) * b) * scale;
#endif
  }
}
