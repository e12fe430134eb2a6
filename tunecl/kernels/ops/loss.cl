// loss.cl — negative log-likelihood loss (the tail of cross-entropy), forward and backward, fp32.
//
// input x is (N, C) contiguous (a (C,) input is N = 1), target (N,) int64, optional weight (C,).
// A target equal to IGNORE, or outside [0, C), contributes nothing (torch raises for the latter;
// checking would need a device-to-host wait, so it is only kept memory-safe here).
//
// Kernels:
//   nll_none      out[n] = -w[t] * x[n, t]                        (reduction "none"), total_weight = 0
//   nll_reduce    one work-group: out = sum(-w[t] x[n, t]) (/ sum(w[t]) for "mean"), total_weight
//   nll_backward  gx[n, c] = c == t[n] ? -w[t] * g * scale : 0    (scale = 1 / total_weight for "mean")
//
// Variants (-D options):
//   HAS_WEIGHT  a class weight tensor is given        GROUP  work-group size of nll_reduce
//   MEAN        reduction is "mean"                    PER_SAMPLE_GRAD  g is (N,) (reduction "none")
//   IDX         index type (int or long)
// meta (IDX): N, C, ignore_index, then element offsets of out, total_weight, x, target, weight, g.

#ifndef GROUP
  #define GROUP 256
#endif
#ifndef IDX
  #define IDX int
#endif

typedef struct { IDX v[9]; } meta_t;
#define N         m.v[0]
#define C         m.v[1]
#define IGNORE    m.v[2]
#define OFF_OUT   m.v[3]
#define OFF_TW    m.v[4]
#define OFF_X     m.v[5]
#define OFF_T     m.v[6]
#define OFF_W     m.v[7]
#define OFF_G     m.v[8]

#ifdef HAS_WEIGHT
  #define WEIGHT(t) weight[OFF_W + (t)]
#else
  #define WEIGHT(t) 1.0f
#endif
#define VALID(t) ((t) != IGNORE && (t) >= 0 && (t) < C)

__kernel void nll_none(__global float *out, __global float *total_weight, __global const float *x,
                       __global const long *target, __global const float *weight, const meta_t m)
{
  const IDX n = (IDX)get_global_id(0);
  if (n == 0) total_weight[OFF_TW] = 0.0f;
  if (n >= N) return;
  const long t = target[OFF_T + n];
  out[OFF_OUT + n] = VALID(t) ? -WEIGHT(t) * x[OFF_X + n * C + t] : 0.0f;
}

__kernel void nll_reduce(__global float *out, __global float *total_weight, __global const float *x,
                         __global const long *target, __global const float *weight, const meta_t m)
{
  const int lid = (int)get_local_id(0);
  __local float loss_part[GROUP];
  __local float weight_part[GROUP];
  float loss = 0.0f, wsum = 0.0f;
  for (IDX n = lid; n < N; n += GROUP) {
    const long t = target[OFF_T + n];
    if (VALID(t)) {
      const float w = WEIGHT(t);
      loss -= w * x[OFF_X + n * C + t];
      wsum += w;
    }
  }
  loss_part[lid] = loss;
  weight_part[lid] = wsum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = GROUP / 2; s > 0; s >>= 1) {
    if (lid < s) {
      loss_part[lid] += loss_part[lid + s];
      weight_part[lid] += weight_part[lid + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) {
#ifdef MEAN
    out[OFF_OUT] = loss_part[0] / weight_part[0];
#else
    out[OFF_OUT] = loss_part[0];
#endif
    total_weight[OFF_TW] = weight_part[0];
  }
}

__kernel void nll_backward(__global float *grad_input, __global const float *total_weight,
                           __global const float *grad_output, __global const long *target,
                           __global const float *weight, const meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= N * C) return;
  const IDX n = i / C, c = i - n * C;
  const long t = target[OFF_T + n];
  float g = 0.0f;
  if (c == t && VALID(t)) {
#ifdef PER_SAMPLE_GRAD
    g = -WEIGHT(t) * grad_output[OFF_G + n];
#else
    g = -WEIGHT(t) * grad_output[OFF_G];
#endif
#ifdef MEAN
    g /= total_weight[OFF_TW];
#endif
  }
  grad_input[OFF_X + i] = g;
}
