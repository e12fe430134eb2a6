// norm.cl — batch normalisation forward (train and eval) and backward, fp32.
//
// x is contiguous (N, C, L) (L = H*W for images); per-channel vectors (weight, bias, running and
// saved statistics) are contiguous (C,). M = N * L elements per channel.
//
// Loads of the big tensors (x, y, dy) are of VW floats at a time (vec_t): VW = 4 when L is a
// multiple of 4 and the host saw those tensors' offsets 4-aligned (every row of a channel then starts
// on a float4), else 1. Below, "vector" means VW consecutive floats of a row, LV = L / VW per row.
//
// Per-channel sums are split over P work-groups per channel (a "partial" kernel on a 2-D grid of
// (GROUP * P, C) items, one work-group per (part, channel)), each writing its results to scratch; a
// "finalize" kernel (one work-item per channel) combines the P partials in a fixed order, so results
// are the same run to run. With P = 1 the partial kernel finishes the channel itself. Part p of a
// channel covers its vectors j in [p * chunk, min((p + 1) * chunk, N * LV)), chunk = ceil(N * LV / P),
// j = n * LV + l; a work-item walks (n, l) by steps of GROUP without dividing, so adjacent work-items
// read adjacent vectors. The main loop loads UNROLL vectors per work-item before using any of them
// (several loads in flight per item), then a tail loop takes the rest one vector at a time.
//
// scratch (floats): [0, 2C) per-channel results of the backward reduction (sum(dy) at c,
// sum(dy (x - mean)) at C + c, read by bn_backward_apply); [2C, 2C + 2CP) the partials: first value
// of part p of channel c at 2C + c P + p, second at 2C + CP + c P + p.
//
// Kernels (all take the same arguments; buffers a kernel does not use may be NULL):
//   bn_stats / bn_stats_finalize
//                     one pass over the data: each work-item keeps (count, mean, M2) of d = x - K (K:
//                     the channel's first element, so d stays small next to a large mean) over its
//                     elements, taking UNROLL * VW (or, in the tail, VW) values at a time: their mean
//                     and M2 by two passes over registers, merged into the running triple by Chan et
//                     al.'s formula (one division per batch; stable whatever K is). The work-group
//                     merges its items' triples by a tree of the same formula, each part writes its
//                     mean of d and M2, and the finalize merges the parts: mean = K + sum(n_p mean_p)/M,
//                     M2 = sum(M2_p + n_p (mean_p - mean)^2) in part order; var = M2/M (biased),
//                     1/sqrt(var + eps) into save_mean/save_invstd; with HAS_RUNNING also
//                     running = (1 - momentum) * running + momentum * stat (unbiased var)
//   bn_apply          y = (x - mean) * invstd * weight + bias, from the saved statistics or, with
//                     EVAL, from the running ones; with RELU, relu(y), with RELU6, hardtanh(y, 0, 6) (the
//                     backend fuses an in-place relu or relu6 that follows the batch norm); with RESIDUAL,
//                     y + res before the activation (an in-place add of a residual res, read through act,
//                     that follows the batch norm: a residual block's `out += identity`); with SUM_OUT, y
//                     as without it and y + res into sum (masked_dy's place: a block's `x + bn(...)`, or
//                     `out += bn(...)` with sum = res), SUM_RELU / SUM_RELU6 applying relu / relu6 to it
//   bn_backward_reduce / bn_backward_finalize
//                     one pass: sum(dy) and sum(dy * (x - mean)) into scratch[c], scratch[C + c],
//                     grad_weight = sum(dy * (x - mean)) * invstd, grad_bias = sum(dy)
//   bn_backward_apply   train: gx = (dy - sum(dy)/M - (x - mean) invstd^2 sum(dy (x - mean))/M)
//                     * invstd * weight; EVAL: gx = dy * invstd * weight
// With FINISH (P > 1), bn_apply and bn_backward_apply do the finalize kernel's work themselves: each row
// merges its channel's partials as the finalize kernel does, and the item at row c (n = 0), position 0
// writes what the finalize kernel writes (the statistics, or scratch and the parameter gradients).
//   bn_stats_apply / bn_backward_reduce_apply
//                     with P = 1, the partial kernel and the elementwise one in one launch: each work-group
//                     finishes its channel as the partial kernel does, then (after a barrier that makes its
//                     global writes visible to the group) walks the channel's vectors again as bn_apply /
//                     bn_backward_apply would compute them: bit for bit the two launches' results
// With MASK_RELU or MASK_RELU6 both backward kernels read dy through the mask of the activation that
// followed the batch norm: dy where act (the relu's output, or relu6's input) is inside (0, inf) or (0, 6),
// else 0, as threshold_backward and hardtanh_backward compute it (NaN passes); act is laid out as dy. With
// WRITE_DY too the reduction also stores that masked dy into masked_dy (laid out as dy): the activation's
// backward done on the way, for the eager backend (its own launch dropped). With COUNT_BY=k the forward's
// first kernel (bn_stats or bn_stats_apply) also adds k to step_count (one work-item): the module's
// num_batches_tracked += k, done inside the batch norm's launch by the eager backend.
// The elementwise kernels (bn_apply, bn_backward_apply) run on a 2-D grid: dim 1 over the rows
// r = n * C + c (c = r % C once per row), dim 0 over the vectors l within the row.
//
// Variants (-D options): GROUP (work-group size of the partial kernels, a power of two), UNROLL
// (vector loads per work-item per main-loop step), VW (1 or 4), IDX (int or long), HAS_WEIGHT,
// HAS_BIAS, HAS_RUNNING, EVAL (statistics come from running_mean/var), HAS_GW, HAS_GB, MASK_RELU,
// MASK_RELU6, WRITE_DY, COUNT_BY, RELU, RELU6, RESIDUAL, SUM_OUT, SUM_RELU, SUM_RELU6 (the last six: bn_apply,
// bn_stats_apply).
// meta (IDX): N, C, L, then element offsets of x, y (or grad_input), weight, bias, running_mean,
// running_var, save_mean, save_invstd, dy, grad_weight, grad_bias, act, masked_dy, step_count (in longs),
// then P.

#ifndef GROUP
  #define GROUP 256
#endif
#ifndef UNROLL
  #define UNROLL 4
#endif
#ifndef VW
  #define VW 1
#endif
#ifndef IDX
  #define IDX int
#endif

#if VW == 4
  typedef float4 vec_t;
  #define HSUM(v) (((v).x + (v).y) + ((v).z + (v).w))
#elif VW == 1
  typedef float vec_t;
  #define HSUM(v) (v)
#else
  #error "VW must be 1 or 4"
#endif

typedef struct { IDX v[18]; } meta_t;
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
#define OFF_ACT m.v[14]
#define OFF_MDY m.v[15]
#define OFF_CNT m.v[16]
#define PARTS   m.v[17]

#define BN_ARGS __global const float *x, __global float *y, __global const float *weight,      \
                __global const float *bias, __global float *running_mean,                     \
                __global float *running_var, __global float *save_mean,                       \
                __global float *save_invstd, __global const float *dy,                        \
                __global float *grad_weight, __global float *grad_bias,                       \
                __global const float *act, __global float *masked_dy, __global long *step_count, \
                __global float *scratch, const float eps, const float momentum, const meta_t m

// dy at vector i of a tensor laid out as x, through the activation's mask (see the top)
#if defined(MASK_RELU)
  #define MASKED(g, a) select((g), (vec_t)(0.0f), (a) <= (vec_t)(0.0f))
#elif defined(MASK_RELU6)
  #define MASKED(g, a) select((g), (vec_t)(0.0f), ((a) <= (vec_t)(0.0f)) | ((a) >= (vec_t)(6.0f)))
#else
  #define MASKED(g, a) (g)
#endif
#if defined(MASK_RELU) || defined(MASK_RELU6)
  #define DY_AT(i) MASKED(dyv[i], actv[i])
#else
  #define DY_AT(i) dyv[i]
#endif

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

// y of vector v (bn_apply's formula; with RELU / RELU6 the activation folded in: torch's relu and
// hardtanh(v, 0, 6) as the elementwise kernel computes them, NaN and -0.0 pass through)
#if defined(RELU)
  #define ACTIVATED(v) relu_of(v)
#elif defined(RELU6)
  #define ACTIVATED(v) relu6_of(v)
#else
  #define ACTIVATED(v) (v)
#endif
#if defined(SUM_RELU)
  #define SUM_ACTIVATED(v) relu_of(v)
#elif defined(SUM_RELU6)
  #define SUM_ACTIVATED(v) relu6_of(v)
#else
  #define SUM_ACTIVATED(v) (v)
#endif
#define AFFINE(v, mean, scale, shift) (((v) - (mean)) * (scale) + (shift))
// what the elementwise pass writes at vector i of y (and, with SUM_OUT, of sum): the normalised value, with
// RESIDUAL plus the residual's vector i (added before the activation), with SUM_OUT that value plus the
// residual's written to sum (then relu or relu6 of it with SUM_RELU or SUM_RELU6; sum may be the residual
// itself, each item reads a vector before it writes it)
#if defined(RESIDUAL) && defined(SUM_OUT)
  #error "RESIDUAL and SUM_OUT exclude each other"
#elif defined(RESIDUAL)
  #define WRITE_NORMALISED(yv, i, v, mean, scale, shift) \
    (yv)[i] = ACTIVATED(AFFINE(v, mean, scale, shift) + resv[i])
#elif defined(SUM_OUT)
  #define WRITE_NORMALISED(yv, i, v, mean, scale, shift) \
    { const vec_t y_ = ACTIVATED(AFFINE(v, mean, scale, shift)); (yv)[i] = y_; sumv[i] = SUM_ACTIVATED(y_ + resv[i]); }
#else
  #define WRITE_NORMALISED(yv, i, v, mean, scale, shift) (yv)[i] = ACTIVATED(AFFINE(v, mean, scale, shift))
#endif
// the residual's (and sum's) vectors from vector `first` of the tensor on, laid out as y (act and masked_dy)
#if defined(SUM_OUT)
  #define RESIDUAL_ROW(first) __global const vec_t *resv = (__global const vec_t *)(act + OFF_ACT) + (first); \
                              __global vec_t *sumv = (__global vec_t *)(masked_dy + OFF_MDY) + (first);
#elif defined(RESIDUAL)
  #define RESIDUAL_ROW(first) __global const vec_t *resv = (__global const vec_t *)(act + OFF_ACT) + (first);
#else
  #define RESIDUAL_ROW(first)
#endif
inline vec_t relu_of(const vec_t v) { return select(v, (vec_t)(0.0f), v < (vec_t)(0.0f)); }
inline vec_t relu6_of(const vec_t v)
{
  const vec_t low = select(v, (vec_t)(0.0f), v < (vec_t)(0.0f));
  return select(low, (vec_t)(6.0f), low > (vec_t)(6.0f));
}
// grad_input of vector g of dy (masked) at x vector v in training (bn_backward_apply's formula)
#define INPUT_GRAD(g, v, mean, a, b, scale) (((g) - (a) - ((v) - (mean)) * (b)) * (scale))

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

// merge (nb, mb, m2b) (count, mean, sum of squared deviations of a batch) into the lvalues (n, mean,
// m2) by Chan et al.'s formula; an empty batch changes nothing
#define CHAN(n, mean, m2, nb, mb, m2b)                          \
  {                                                             \
    const float n_new_ = (n) + (nb);                            \
    if (n_new_ > 0.0f) {                                        \
      const float delta_ = (mb) - (mean);                       \
      const float r_ = (nb) / n_new_;                           \
      (mean) += delta_ * r_;                                    \
      (m2) += (m2b) + delta_ * delta_ * (n) * r_;               \
      (n) = n_new_;                                             \
    }                                                           \
  }

// The vectors of a partial kernel's work-group (part, channel c): j = n * LV + l of channel c, from
// `first` + lid by steps of GROUP while j < `end`; `off` is the vector's position relative to a
// tensor's (vector) base, (n * C + c) * LV + l. A step of GROUP vectors is qn rows plus ql positions
// (GROUP = qn * LV + ql, ql < LV), so the walk never divides. (L = 0: no vectors; LV1 keeps the
// divisions defined.)
#define PART_BEGIN(c)                                                                       \
  const IDX LV = L / VW;                                                                    \
  const IDX LV1 = max(LV, (IDX)1);                                                          \
  const IDX count = N * LV;                                                                 \
  const IDX parts = (IDX)get_num_groups(0);                                                 \
  const IDX chunk = (count + parts - 1) / parts;                                            \
  const IDX first = (IDX)get_group_id(0) * chunk;                                           \
  const IDX end = min(first + chunk, count);                                                \
  const IDX qn = (IDX)GROUP / LV1;                                                          \
  const IDX ql = (IDX)GROUP - qn * LV1;                                                     \
  const IDX plane = C * LV;                                                                 \
  const IDX row_step = qn * plane + ql;                                                     \
  const IDX wrap = plane - LV;                                                              \
  IDX j = first + (IDX)lid;                                                                 \
  IDX l = j % LV1;                                                                          \
  IDX off = (j / LV1) * plane + (c) * LV + l;
#define PART_STEP                                                                           \
  l += ql;                                                                                  \
  off += row_step;                                                                          \
  if (l >= LV) {                                                                            \
    l -= LV;                                                                                \
    off += wrap;                                                                            \
  }

// 1 / sqrt(var + eps) of a channel whose sum((x - mean)^2) is m2
inline float invstd_of(const float m2, const float eps, const meta_t m)
{
  return 1.0f / sqrt(m2 / (float)(N * L) + eps);
}

// mean, invstd and running statistics of channel c from its mean and sum((x - mean)^2)
inline void finish_stats(const IDX c, const float mean, const float m2,
                         __global float *running_mean, __global float *running_var,
                         __global float *save_mean, __global float *save_invstd,
                         const float eps, const float momentum, const meta_t m)
{
  const IDX count = N * L;
  save_mean[OFF_SM + c] = mean;
  save_invstd[OFF_SI + c] = invstd_of(m2, eps, m);
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

// bn_stats's pass over this work-group's part of channel c (see the top): the part's mean of d = x - K
// and its M2 at item 0 (the other items get partial values), K (the channel's first element) in *shift
inline float2 stats_part(const IDX c, const int lid, __global const float *x, __local float *part_n,
                         __local float *part_mean, __local float *part_m2, float *shift, const meta_t m)
{
  __global const vec_t *xv = (__global const vec_t *)(x + OFF_X);
  const float K = N * L > 0 ? x[OFF_X + c * L] : 0.0f;
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;   // of d = x - K over this item's elements
  PART_BEGIN(c)
  for (; j + (UNROLL - 1) * GROUP < end; j += UNROLL * GROUP) {
    vec_t d[UNROLL];
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      d[u] = xv[off];
      PART_STEP
    }
    vec_t s = (vec_t)(0.0f);
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      d[u] -= K;
      s += d[u];
    }
    const float mb = HSUM(s) * (1.0f / (float)(UNROLL * VW));
    vec_t q = (vec_t)(0.0f);
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const vec_t e = d[u] - mb;
      q += e * e;
    }
    CHAN(n, mean, m2, (float)(UNROLL * VW), mb, HSUM(q))
  }
  for (; j < end; j += GROUP) {
    const vec_t d = xv[off] - K;
    const float mb = HSUM(d) * (1.0f / (float)VW);
    const vec_t e = d - mb;
    CHAN(n, mean, m2, (float)VW, mb, HSUM(e * e))
    PART_STEP
  }
  // the work-group's tree merge (fixed order); item 0 ends with the part's triple
  part_n[lid] = n;
  part_mean[lid] = mean;
  part_m2[lid] = m2;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = GROUP / 2; s > 0; s >>= 1) {
    if (lid < s) {
      CHAN(n, mean, m2, part_n[lid + s], part_mean[lid + s], part_m2[lid + s])
      part_n[lid] = n;
      part_mean[lid] = mean;
      part_m2[lid] = m2;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  *shift = K;
  return (float2)(mean, m2);
}

// grid (GROUP * P, C'), C' <= C channels at a time; one pass over the part's elements (see the top)
// the step count's increment (COUNT_BY), by one work-item of the forward's first launch
#ifdef COUNT_BY
  #define COUNT_STEP() if (get_global_id(0) == 0 && get_global_id(1) == 0) step_count[OFF_CNT] += (long)(COUNT_BY)
#else
  #define COUNT_STEP()
#endif

__kernel void bn_stats(BN_ARGS)
{
  const int lid = (int)get_local_id(0);
  __local float part_n[GROUP], part_mean[GROUP], part_m2[GROUP];
  COUNT_STEP();
  for (IDX c = (IDX)get_group_id(1); c < C; c += (IDX)get_num_groups(1)) {
    float K;
    const float2 part = stats_part(c, lid, x, part_n, part_mean, part_m2, &K, m);
    if (lid == 0) {
      if (get_num_groups(0) == 1)   // (an empty channel: NaN statistics, as sum / M gives)
        finish_stats(c, N * L > 0 ? K + part.x : NAN, N * L > 0 ? part.y : NAN, running_mean, running_var,
                     save_mean, save_invstd, eps, momentum, m);
      else {
        PART1(c, (IDX)get_group_id(0)) = part.x;
        PART2(c, (IDX)get_group_id(0)) = part.y;
      }
    }
  }
}

// P = 1, grid (GROUP, C'): bn_stats, then bn_apply of the channel's vectors (see the top)
__kernel void bn_stats_apply(BN_ARGS)
{
  const int lid = (int)get_local_id(0);
  __local float part_n[GROUP], part_mean[GROUP], part_m2[GROUP];
  COUNT_STEP();
  __global const vec_t *xv = (__global const vec_t *)(x + OFF_X);
  __global vec_t *yv = (__global vec_t *)(y + OFF_Y);
  RESIDUAL_ROW(0)
  for (IDX c = (IDX)get_group_id(1); c < C; c += (IDX)get_num_groups(1)) {
    float K;
    const float2 part = stats_part(c, lid, x, part_n, part_mean, part_m2, &K, m);
    if (lid == 0)
      finish_stats(c, N * L > 0 ? K + part.x : NAN, N * L > 0 ? part.y : NAN, running_mean, running_var,
                   save_mean, save_invstd, eps, momentum, m);
    barrier(CLK_GLOBAL_MEM_FENCE);   // the statistics item 0 wrote, for the group
    const float mean = MEAN(c);
    const float scale = INVSTD(c) * W(c);
    const float shift = B(c);
    PART_BEGIN(c)
    for (; j < end; j += GROUP) {
      WRITE_NORMALISED(yv, off, xv[off], mean, scale, shift);
      PART_STEP
    }
  }
}

// the parts' (n_p, mean_p of x - K, M2_p) of channel c merged in part order (bn_stats_finalize's
// merge): (mean, M2) with mean = K + sum(n_p mean_p) / M, M2 = sum(M2_p + n_p (mean_p - mean)^2)
inline float2 merged_stats(const IDX c, __global const float *x, __global const float *scratch,
                           const meta_t m)
{
  const IDX count = N * L;
  const IDX vectors = N * (L / VW);
  const IDX chunk = (vectors + PARTS - 1) / PARTS;
  float shifted = 0.0f;
  for (IDX p = 0; p < PARTS; ++p) {
    const IDX first = p * chunk;
    const IDX n_part = first < vectors ? min(chunk, vectors - first) * VW : 0;
    if (n_part > 0) shifted += (float)n_part * PART1(c, p);
  }
  const float offset = shifted / (float)count;   // mean - K
  const float K = count > 0 ? x[OFF_X + c * L] : 0.0f;
  float m2 = count > 0 ? 0.0f : NAN;
  for (IDX p = 0; p < PARTS; ++p) {
    const IDX first = p * chunk;
    const IDX n_part = first < vectors ? min(chunk, vectors - first) * VW : 0;
    if (n_part > 0) {
      const float delta = PART1(c, p) - offset;
      m2 += PART2(c, p) + (float)n_part * delta * delta;
    }
  }
  return (float2)(K + offset, m2);
}

// one work-item per channel: merged_stats, then finish_stats
__kernel void bn_stats_finalize(BN_ARGS)
{
  const IDX c = (IDX)get_global_id(0);
  if (c >= C) return;
  const float2 stats = merged_stats(c, x, scratch, m);
  finish_stats(c, stats.x, stats.y, running_mean, running_var, save_mean, save_invstd, eps, momentum, m);
}

// bn_backward_reduce's pass over this work-group's part of channel c: (sum(dy), sum(dy (x - mean))) of
// the part, at every item
inline float2 backward_part(const IDX c, const int lid, __global const float *x, __global const float *dy,
                            __global const float *act, __global float *masked_dy, __local float *part,
                            const float mean, const meta_t m)
{
  __global const vec_t *xv = (__global const vec_t *)(x + OFF_X);
  __global const vec_t *dyv = (__global const vec_t *)(dy + OFF_DY);
  __global const vec_t *actv = (__global const vec_t *)(act + OFF_ACT);
  __global vec_t *mdyv = (__global vec_t *)(masked_dy + OFF_MDY);
  vec_t acc_dy = (vec_t)(0.0f), acc_dy_xmu = (vec_t)(0.0f);
  PART_BEGIN(c)
  for (; j + (UNROLL - 1) * GROUP < end; j += UNROLL * GROUP) {
    vec_t g[UNROLL], v[UNROLL];
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      g[u] = DY_AT(off);
      v[u] = xv[off];
#ifdef WRITE_DY
      mdyv[off] = g[u];
#endif
      PART_STEP
    }
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      acc_dy += g[u];
      acc_dy_xmu += g[u] * (v[u] - mean);
    }
  }
  for (; j < end; j += GROUP) {
    const vec_t g = DY_AT(off);
#ifdef WRITE_DY
    mdyv[off] = g;
#endif
    acc_dy += g;
    acc_dy_xmu += g * (xv[off] - mean);
    PART_STEP
  }
  float sum_dy = HSUM(acc_dy), sum_dy_xmu = HSUM(acc_dy_xmu);
  GROUP_SUM2(sum_dy, sum_dy_xmu, part)
  return (float2)(sum_dy, sum_dy_xmu);
}

// grid (GROUP * P, C'), C' <= C channels at a time; one pass, per-lane vector accumulators
__kernel void bn_backward_reduce(BN_ARGS)
{
  const int lid = (int)get_local_id(0);
  __local float part[2 * GROUP];
  for (IDX c = (IDX)get_group_id(1); c < C; c += (IDX)get_num_groups(1)) {
    const float2 sums = backward_part(c, lid, x, dy, act, masked_dy, part, MEAN(c), m);
    if (lid == 0) {
      if (get_num_groups(0) == 1)
        finish_backward(c, sums.x, sums.y, running_var, save_invstd, grad_weight, grad_bias, scratch, eps, m);
      else {
        PART1(c, (IDX)get_group_id(0)) = sums.x;
        PART2(c, (IDX)get_group_id(0)) = sums.y;
      }
    }
  }
}

// P = 1, grid (GROUP, C'): bn_backward_reduce, then bn_backward_apply of the channel's vectors (see the top)
__kernel void bn_backward_reduce_apply(BN_ARGS)
{
  const int lid = (int)get_local_id(0);
  __local float part[2 * GROUP];
  __global const vec_t *xv = (__global const vec_t *)(x + OFF_X);
  __global const vec_t *dyv = (__global const vec_t *)(dy + OFF_DY);
  __global const vec_t *actv = (__global const vec_t *)(act + OFF_ACT);
  __global vec_t *yv = (__global vec_t *)(y + OFF_Y);
  for (IDX c = (IDX)get_group_id(1); c < C; c += (IDX)get_num_groups(1)) {
    const float mean = MEAN(c);
    const float2 sums = backward_part(c, lid, x, dy, act, masked_dy, part, mean, m);
    if (lid == 0)
      finish_backward(c, sums.x, sums.y, running_var, save_invstd, grad_weight, grad_bias, scratch, eps, m);
    const float invstd = INVSTD(c);
    const float scale = invstd * W(c);
#ifndef EVAL
    const float total = (float)(N * L);
    const float a = sums.x / total;
    const float b = invstd * invstd * sums.y / total;
#endif
    PART_BEGIN(c)
    for (; j < end; j += GROUP) {
#ifdef EVAL
      yv[off] = DY_AT(off) * scale;
#else
      yv[off] = INPUT_GRAD(DY_AT(off), xv[off], mean, a, b, scale);
#endif
      PART_STEP
    }
  }
}

// the parts' sums of channel c added in part order (bn_backward_finalize's)
inline float2 merged_sums(const IDX c, __global const float *scratch, const meta_t m)
{
  float sum_dy = 0.0f, sum_dy_xmu = 0.0f;
  for (IDX p = 0; p < PARTS; ++p) {
    sum_dy += PART1(c, p);
    sum_dy_xmu += PART2(c, p);
  }
  return (float2)(sum_dy, sum_dy_xmu);
}

// one work-item per channel
__kernel void bn_backward_finalize(BN_ARGS)
{
  const IDX c = (IDX)get_global_id(0);
  if (c >= C) return;
  const float2 sums = merged_sums(c, scratch, m);
  finish_backward(c, sums.x, sums.y, running_var, save_invstd, grad_weight, grad_bias, scratch, eps, m);
}

// The elementwise kernels: rows r = n * C + c over dim 1 (c = r % C once per row), vectors l
// within the row over dim 0; vector i = r * LV + l.
__kernel void bn_apply(BN_ARGS)
{
  const IDX rows = N * C, LV = L / VW;
  const IDX l0 = (IDX)get_global_id(0), lstep = (IDX)get_global_size(0);
  for (IDX r = (IDX)get_global_id(1); r < rows; r += (IDX)get_global_size(1)) {
    const IDX c = r % C;
#ifdef FINISH
    const float2 stats = merged_stats(c, x, scratch, m);
    if (r == c && l0 == 0)
      finish_stats(c, stats.x, stats.y, running_mean, running_var, save_mean, save_invstd, eps, momentum, m);
    const float mean = stats.x;
    const float invstd = invstd_of(stats.y, eps, m);
#else
    const float mean = MEAN(c);
    const float invstd = INVSTD(c);
#endif
    const float scale = invstd * W(c);
    const float shift = B(c);
    __global const vec_t *xr = (__global const vec_t *)(x + OFF_X) + r * LV;
    __global vec_t *yr = (__global vec_t *)(y + OFF_Y) + r * LV;
    RESIDUAL_ROW(r * LV)
    for (IDX l = l0; l < LV; l += lstep) WRITE_NORMALISED(yr, l, xr[l], mean, scale, shift);
  }
}

__kernel void bn_backward_apply(BN_ARGS)
{
  const IDX rows = N * C, LV = L / VW;
  const IDX l0 = (IDX)get_global_id(0), lstep = (IDX)get_global_size(0);
  for (IDX r = (IDX)get_global_id(1); r < rows; r += (IDX)get_global_size(1)) {
    const IDX c = r % C;
#ifdef FINISH
    if (r == c && l0 == 0) {
      const float2 parts = merged_sums(c, scratch, m);
      finish_backward(c, parts.x, parts.y, running_var, save_invstd, grad_weight, grad_bias, scratch, eps, m);
    }
#endif
    const float invstd = INVSTD(c);
    const float scale = invstd * W(c);
    __global const vec_t *dyv = (__global const vec_t *)(dy + OFF_DY) + r * LV;
    __global const vec_t *actv = (__global const vec_t *)(act + OFF_ACT) + r * LV;
    __global vec_t *yr = (__global vec_t *)(y + OFF_Y) + r * LV;
#ifdef EVAL
    for (IDX l = l0; l < LV; l += lstep) yr[l] = DY_AT(l) * scale;
#else
    const float mean = MEAN(c);
    const float count = (float)(N * L);
#ifdef FINISH
    const float2 sums = merged_sums(c, scratch, m);
#else
    const float2 sums = (float2)(scratch[c], scratch[C + c]);
#endif
    const float a = sums.x / count;
    const float b = invstd * invstd * sums.y / count;
    __global const vec_t *xr = (__global const vec_t *)(x + OFF_X) + r * LV;
    for (IDX l = l0; l < LV; l += lstep) yr[l] = INPUT_GRAD(DY_AT(l), xr[l], mean, a, b, scale);
#endif
  }
}
