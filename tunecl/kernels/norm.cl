// norm.cl — batch normalisation forward (train and eval) and backward, fp32.
//
// x is contiguous (N, C, L) (L = H*W for images); per-channel vectors (weight, bias, running and
// saved statistics) are contiguous (C,). M = N * L elements per channel.
//
// Kernels (all take the same arguments; buffers a kernel does not use may be NULL):
//   bn_stats          one work-group per channel: mean and 1/sqrt(var + eps) (biased var) into
//                     save_mean/save_invstd; with HAS_RUNNING also
//                     running = (1 - momentum) * running + momentum * stat (unbiased var)
//   bn_apply          y = (x - mean) * invstd * weight + bias, from the saved statistics or, with
//                     EVAL, from the running ones
//   bn_backward_reduce  one work-group per channel: sum(dy) and sum(dy * (x - mean)) into scratch,
//                     grad_weight = sum(dy * (x - mean)) * invstd, grad_bias = sum(dy)
//   bn_backward_apply   train: gx = (dy - sum(dy)/M - (x - mean) invstd^2 sum(dy (x - mean))/M)
//                     * invstd * weight; EVAL: gx = dy * invstd * weight
//
// Variants (-D options): GROUP (work-group size of the per-channel kernels), IDX (int or long),
// HAS_WEIGHT, HAS_BIAS, HAS_RUNNING, EVAL (statistics come from running_mean/var), HAS_GW, HAS_GB.
// meta (IDX): N, C, L, then element offsets of x, y (or grad_input), weight, bias, running_mean,
// running_var, save_mean, save_invstd, dy, grad_weight, grad_bias.

#ifndef GROUP
  #define GROUP 256
#endif
#ifndef IDX
  #define IDX int
#endif

typedef struct { IDX v[14]; } meta_t;
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

#define BN_ARGS __global const float *x, __global float *y, __global const float *weight,      \
                __global const float *bias, __global float *running_mean,                     \
                __global float *running_var, __global float *save_mean,                       \
                __global float *save_invstd, __global const float *dy,                        \
                __global float *grad_weight, __global float *grad_bias,                       \
                __global float *scratch, const float eps, const float momentum, const meta_t m

// element j of channel c (j in [0, M)), relative to a tensor's offset
#define AT(c, j) ((((j) / L) * C + (c)) * L + (j) % L)

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

// sum a value over the work-group; every item gets the result
#define GROUP_SUM(value, part)                                  \
  part[lid] = value;                                            \
  barrier(CLK_LOCAL_MEM_FENCE);                                 \
  for (int s = GROUP / 2; s > 0; s >>= 1) {                     \
    if (lid < s) part[lid] += part[lid + s];                    \
    barrier(CLK_LOCAL_MEM_FENCE);                               \
  }                                                             \
  value = part[0];                                              \
  barrier(CLK_LOCAL_MEM_FENCE);

__kernel void bn_stats(BN_ARGS)
{
  const IDX c = (IDX)get_group_id(0);
  const int lid = (int)get_local_id(0);
  __local float part[GROUP];
  const IDX count = N * L;
  float sum = 0.0f;
  for (IDX j = lid; j < count; j += GROUP) sum += x[OFF_X + AT(c, j)];
  GROUP_SUM(sum, part)
  const float mean = sum / (float)count;
  float m2 = 0.0f;
  for (IDX j = lid; j < count; j += GROUP) {
    const float d = x[OFF_X + AT(c, j)] - mean;
    m2 += d * d;
  }
  GROUP_SUM(m2, part)
  if (lid == 0) {
    save_mean[OFF_SM + c] = mean;
    save_invstd[OFF_SI + c] = 1.0f / sqrt(m2 / (float)count + eps);
#ifdef HAS_RUNNING
    running_mean[OFF_RM + c] = (1.0f - momentum) * running_mean[OFF_RM + c] + momentum * mean;
    running_var[OFF_RV + c] = (1.0f - momentum) * running_var[OFF_RV + c]
                              + momentum * m2 / (float)(count - 1);
#endif
  }
}

__kernel void bn_apply(BN_ARGS)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= N * C * L) return;
  const IDX c = (i / L) % C;
  y[OFF_Y + i] = (x[OFF_X + i] - MEAN(c)) * INVSTD(c) * W(c) + B(c);
}

__kernel void bn_backward_reduce(BN_ARGS)
{
  const IDX c = (IDX)get_group_id(0);
  const int lid = (int)get_local_id(0);
  __local float part[GROUP];
  const IDX count = N * L;
  const float mean = MEAN(c);
  float sum_dy = 0.0f, sum_dy_xmu = 0.0f;
  for (IDX j = lid; j < count; j += GROUP) {
    const float g = dy[OFF_DY + AT(c, j)];
    sum_dy += g;
    sum_dy_xmu += g * (x[OFF_X + AT(c, j)] - mean);
  }
  GROUP_SUM(sum_dy, part)
  GROUP_SUM(sum_dy_xmu, part)
  if (lid == 0) {
    scratch[c] = sum_dy;
    scratch[C + c] = sum_dy_xmu;
#ifdef HAS_GW
    grad_weight[OFF_GW + c] = sum_dy_xmu * INVSTD(c);
#endif
#ifdef HAS_GB
    grad_bias[OFF_GB + c] = sum_dy;
#endif
  }
}

__kernel void bn_backward_apply(BN_ARGS)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= N * C * L) return;
  const IDX c = (i / L) % C;
  const float invstd = INVSTD(c);
  const float g = dy[OFF_DY + i];
#ifdef EVAL
  y[OFF_Y + i] = g * invstd * W(c);
#else
  const float count = (float)(N * L);
  const float xmu = x[OFF_X + i] - MEAN(c);
  y[OFF_Y + i] = (g - scratch[c] / count - xmu * invstd * invstd * scratch[C + c] / count) * invstd * W(c);
#endif
}
