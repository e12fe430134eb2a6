// pool.cl — 2-D pooling over contiguous (P, H, W) planes (P = N * C), forward and backward, fp32.
//
// Kernels (one work-item per output element forward, per input element backward, so backward
// gathers instead of scattering: no atomics, deterministic):
//   max_forward         out = max over the window, idx = argmax as h * W + w (int64); NaN wins
//   max_backward        gx[h, w] = sum of g over windows whose idx is (h, w)
//   avg_forward         out = sum over the window / divisor (count_include_pad, divisor_override)
//   avg_backward        gx[h, w] = sum over windows containing (h, w) of g / divisor
//   adaptive_forward    out = mean over [floor(o*H/OH), ceil((o+1)*H/OH)) in each direction
//   adaptive_backward   gx[h, w] = sum over adaptive windows containing (h, w) of g / window area
//
// Variants: IDX (int or long). meta (IDX): P, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW,
// COUNT_INCLUDE_PAD, DIVISOR (0 = none), then element offsets of out, in, aux (indices).

#ifndef IDX
  #define IDX int
#endif

typedef struct { IDX v[18]; } meta_t;
#define P   m.v[0]
#define H   m.v[1]
#define W   m.v[2]
#define OH  m.v[3]
#define OW  m.v[4]
#define KH  m.v[5]
#define KW  m.v[6]
#define SH  m.v[7]
#define SW  m.v[8]
#define PH  m.v[9]
#define PW  m.v[10]
#define DH  m.v[11]
#define DW  m.v[12]
#define COUNT_INCLUDE_PAD m.v[13]
#define DIVISOR m.v[14]
#define OFF_OUT m.v[15]
#define OFF_IN  m.v[16]
#define OFF_AUX m.v[17]

#define POOL_ARGS __global float *out, __global const float *in, __global long *aux, const meta_t m

// floor division for possibly negative numerators (positive denominators)
#define FLOOR_DIV(a, b) (((a) >= 0) ? (a) / (b) : -((-(a) + (b) - 1) / (b)))

__kernel void max_forward(POOL_ARGS)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= P * OH * OW) return;
  const IDX p = i / (OH * OW), oh = (i / OW) % OH, ow = i % OW;
  __global const float *plane = in + OFF_IN + p * H * W;
  float best = -INFINITY;
  long best_i = -1;
  for (IDX kh = 0; kh < KH; ++kh) {
    const IDX h = oh * SH - PH + kh * DH;
    if (h < 0 || h >= H) continue;
    for (IDX kw = 0; kw < KW; ++kw) {
      const IDX w = ow * SW - PW + kw * DW;
      if (w < 0 || w >= W) continue;
      const float v = plane[h * W + w];
      if (best_i < 0 || v > best || v != v) {
        best = v;
        best_i = h * W + w;
        if (v != v) { kh = KH; break; }  // NaN: torch keeps the first one
      }
    }
  }
  out[OFF_OUT + i] = best;
  aux[OFF_AUX + i] = best_i;
}

__kernel void max_backward(POOL_ARGS)   // out = grad_input, in = grad_output, aux = indices
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= P * H * W) return;
  const IDX p = i / (H * W), h = (i / W) % H, w = i % W;
  const IDX oh0 = max(FLOOR_DIV(h + PH - (KH - 1) * DH + SH - 1, SH), (IDX)0);
  const IDX oh1 = min(FLOOR_DIV(h + PH, SH), OH - 1);
  const IDX ow0 = max(FLOOR_DIV(w + PW - (KW - 1) * DW + SW - 1, SW), (IDX)0);
  const IDX ow1 = min(FLOOR_DIV(w + PW, SW), OW - 1);
  const long me = h * W + w;
  float g = 0.0f;
  for (IDX oh = oh0; oh <= oh1; ++oh)
    for (IDX ow = ow0; ow <= ow1; ++ow) {
      const IDX o = p * OH * OW + oh * OW + ow;
      if (aux[OFF_AUX + o] == me) g += in[OFF_IN + o];
    }
  out[OFF_OUT + i] = g;
}

// the divisor of average-pool window (oh, ow), as torch computes it
inline float avg_divisor(IDX oh, IDX ow, const meta_t m)
{
  IDX h0 = oh * SH - PH, w0 = ow * SW - PW;
  IDX h1 = min(h0 + KH, H + PH), w1 = min(w0 + KW, W + PW);
  const IDX pool = (h1 - h0) * (w1 - w0);
  h0 = max(h0, (IDX)0); w0 = max(w0, (IDX)0);
  h1 = min(h1, H); w1 = min(w1, W);
  if (DIVISOR) return (float)DIVISOR;
  return (float)(COUNT_INCLUDE_PAD ? pool : (h1 - h0) * (w1 - w0));
}

__kernel void avg_forward(POOL_ARGS)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= P * OH * OW) return;
  const IDX p = i / (OH * OW), oh = (i / OW) % OH, ow = i % OW;
  __global const float *plane = in + OFF_IN + p * H * W;
  const IDX h0 = max(oh * SH - PH, (IDX)0), h1 = min(oh * SH - PH + KH, H);
  const IDX w0 = max(ow * SW - PW, (IDX)0), w1 = min(ow * SW - PW + KW, W);
  float sum = 0.0f;
  for (IDX h = h0; h < h1; ++h)
    for (IDX w = w0; w < w1; ++w) sum += plane[h * W + w];
  out[OFF_OUT + i] = sum / avg_divisor(oh, ow, m);
}

__kernel void avg_backward(POOL_ARGS)   // out = grad_input, in = grad_output
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= P * H * W) return;
  const IDX p = i / (H * W), h = (i / W) % H, w = i % W;
  const IDX oh0 = max(FLOOR_DIV(h + PH - KH + SH, SH), (IDX)0), oh1 = min(FLOOR_DIV(h + PH, SH), OH - 1);
  const IDX ow0 = max(FLOOR_DIV(w + PW - KW + SW, SW), (IDX)0), ow1 = min(FLOOR_DIV(w + PW, SW), OW - 1);
  float g = 0.0f;
  for (IDX oh = oh0; oh <= oh1; ++oh)
    for (IDX ow = ow0; ow <= ow1; ++ow) {
      // the window must really contain (h, w) (ceil_mode windows may stop short)
      const IDX hs = oh * SH - PH, ws = ow * SW - PW;
      if (h < hs || h >= hs + KH || w < ws || w >= ws + KW) continue;
      g += in[OFF_IN + p * OH * OW + oh * OW + ow] / avg_divisor(oh, ow, m);
    }
  out[OFF_OUT + i] = g;
}

#define START(o, in_size, out_size) (((o) * (in_size)) / (out_size))
#define END(o, in_size, out_size) ((((o) + 1) * (in_size) + (out_size) - 1) / (out_size))

__kernel void adaptive_forward(POOL_ARGS)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= P * OH * OW) return;
  const IDX p = i / (OH * OW), oh = (i / OW) % OH, ow = i % OW;
  __global const float *plane = in + OFF_IN + p * H * W;
  const IDX h0 = START(oh, H, OH), h1 = END(oh, H, OH), w0 = START(ow, W, OW), w1 = END(ow, W, OW);
  float sum = 0.0f;
  for (IDX h = h0; h < h1; ++h)
    for (IDX w = w0; w < w1; ++w) sum += plane[h * W + w];
  out[OFF_OUT + i] = sum / (float)((h1 - h0) * (w1 - w0));
}

__kernel void adaptive_backward(POOL_ARGS)   // out = grad_input, in = grad_output
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= P * H * W) return;
  const IDX p = i / (H * W), h = (i / W) % H, w = i % W;
  const IDX oh0 = START(h, OH, H), oh1 = END(h, OH, H), ow0 = START(w, OW, W), ow1 = END(w, OW, W);
  float g = 0.0f;
  for (IDX oh = oh0; oh < oh1; ++oh) {
    const IDX h0 = START(oh, H, OH), h1 = END(oh, H, OH);
    if (h < h0 || h >= h1) continue;
    for (IDX ow = ow0; ow < ow1; ++ow) {
      const IDX w0 = START(ow, W, OW), w1 = END(ow, W, OW);
      if (w < w0 || w >= w1) continue;
      g += in[OFF_IN + p * OH * OW + oh * OW + ow] / (float)((h1 - h0) * (w1 - w0));
    }
  }
  out[OFF_OUT + i] = g;
}
