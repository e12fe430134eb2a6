// upsample.cl — 2-d nearest and bilinear resampling of (N, C, H, W) tensors, forward and backward.
//
// The "large" side is the resampled one (OH x OW), the "small" side the input (IH x IW): the forward
// kernels read the small side and write the large one, the backward kernels read the large side's
// gradient and write the small side's. Both sides are strided (N, C, H, W) views.
// meta (IDX): count, C, OH, OW, IH, IW, then the offset and four strides of the source operand, then of
// the destination. sh, sw: each axis's source scale as torch's CPU kernels compute it (UpSample.h);
// a negative scale marks an axis of equal sizes, which torch copies one to one.
//
// up_nearest          out[n, c, oh, ow] = in[n, c, src(oh), src(ow)], src(o) = min(floor(o * s), I - 1)
//                     (EXACT: floor((o + 0.5) * s), nearest-exact). The elements are moved as raw bits
//                     (T: an unsigned type of the element's size), so one kernel serves every dtype.
// up_nearest_backward one work-item per input element: the sum of the gradients of the outputs that
//                     read it, added in the outputs' row-major order (the order of torch's CPU kernel, so
//                     results are the same run to run and match it bit for bit).
// up_bilinear         out = the bilinear blend of the four inputs around the source point, src(o) =
//                     s * o (ALIGN_CORNERS) or max(s * (o + 0.5) - 0.5, 0), float32.
// up_bilinear_backward one work-item per input element: sums each output's gradient times that
//                     input's weight in it, outputs in row-major order and the four corners in the
//                     order torch's CPU kernel adds them (no atomics: the same result run to run).
// The backward kernels scan a window of outputs around i / s on each axis, wide enough to hold every
// output that reads input i (a superset: each candidate's source index is recomputed and compared).
//
// Variants (-D options): T, IDX (int or long), EXACT, ALIGN_CORNERS.

#pragma OPENCL FP_CONTRACT OFF

#ifndef IDX
  #define IDX int
#endif
#ifndef T
  #define T uint
#endif

typedef struct { IDX v[16]; } up_meta_t;
#define UP_COUNT m.v[0]
#define UP_C     m.v[1]
#define UP_OH    m.v[2]
#define UP_OW    m.v[3]
#define UP_IH    m.v[4]
#define UP_IW    m.v[5]
#define SRC_AT(n, c, h, w) (m.v[6] + (n) * m.v[7] + (c) * m.v[8] + (h) * m.v[9] + (w) * m.v[10])
#define DST_AT(n, c, h, w) (m.v[11] + (n) * m.v[12] + (c) * m.v[13] + (h) * m.v[14] + (w) * m.v[15])

inline IDX nearest_source(const float s, const IDX o, const IDX in)
{
  if (s < 0.0f) return o;
#ifdef EXACT
  const IDX i = (IDX)floor(((float)o + 0.5f) * s);
#else
  const IDX i = (IDX)floor((float)o * s);
#endif
  return min(i, in - 1);
}

// the first and last output on an axis of `out` outputs that can read input i of `in` (a superset)
inline void output_window(const float s, const IDX i, const IDX in, const IDX out, const int reach, IDX *lo,
                          IDX *hi)
{
  if (s < 0.0f) {
    *lo = i;
    *hi = i;
  } else if (s == 0.0f) {   // align_corners onto one output: it reads input 0
    *lo = 0;
    *hi = out - 1;
  } else {
    *lo = max((IDX)0, (IDX)floor((float)(i - reach) / s) - 2);
    *hi = i == in - 1 ? out - 1 : min(out - 1, (IDX)ceil((float)(i + 1 + reach) / s) + 2);
  }
}

// input indices i0 <= i1 and weights l0 + l1 = 1 of output o on one axis (compute_source_index_and_lambda)
inline void linear_source(const float s, const IDX o, const IDX in, IDX *i0, IDX *i1, float *l0, float *l1)
{
  if (s < 0.0f) {
    *i0 = o;
    *i1 = o;
    *l0 = 1.0f;
    *l1 = 0.0f;
    return;
  }
#ifdef ALIGN_CORNERS
  const float real = s * (float)o;
#else
  float real = s * ((float)o + 0.5f) - 0.5f;
  real = real < 0.0f ? 0.0f : real;
#endif
  const IDX i = min((IDX)floor(real), in - 1);
  const float l = fmin(fmax(real - (float)i, 0.0f), 1.0f);
  *i0 = i;
  *i1 = i + (i < in - 1 ? 1 : 0);
  *l1 = l;
  *l0 = 1.0f - l;
}

// i: this work-item's element of the output, at (n, c, oh, ow); the work-items past the end return
#define UP_OUTPUT_ELEMENT                                                                           \
  const IDX i = (IDX)get_global_id(0);                                                            \
  if (i >= UP_COUNT) return;                                                                      \
  const IDX ow = i % UP_OW, oh = (i / UP_OW) % UP_OH, rest = i / (UP_OW * UP_OH);                 \
  const IDX c = rest % UP_C, n = rest / UP_C;

// i: this work-item's element of the input, at (n, c, ih, iw), and the outputs that may read it: rows
// h_lo .. h_hi, columns w_lo .. w_hi (output_window with `reach`)
#define UP_INPUT_ELEMENT(reach)                                                                     \
  const IDX i = (IDX)get_global_id(0);                                                            \
  if (i >= UP_COUNT) return;                                                                      \
  const IDX iw = i % UP_IW, ih = (i / UP_IW) % UP_IH, rest = i / (UP_IW * UP_IH);                 \
  const IDX c = rest % UP_C, n = rest / UP_C;                                                     \
  IDX h_lo, h_hi, w_lo, w_hi;                                                                     \
  output_window(sh, ih, UP_IH, UP_OH, reach, &h_lo, &h_hi);                                       \
  output_window(sw, iw, UP_IW, UP_OW, reach, &w_lo, &w_hi);

__kernel void up_nearest(__global T *out, __global const T *in, const up_meta_t m, const float sh,
                         const float sw)
{
  UP_OUTPUT_ELEMENT
  out[DST_AT(n, c, oh, ow)] = in[SRC_AT(n, c, nearest_source(sh, oh, UP_IH), nearest_source(sw, ow, UP_IW))];
}

__kernel void up_nearest_backward(__global float *grad_in, __global const float *grad_out, const up_meta_t m,
                                  const float sh, const float sw)
{
  UP_INPUT_ELEMENT(0)
  float acc = 0.0f;
  for (IDX oh = h_lo; oh <= h_hi; ++oh) {
    if (nearest_source(sh, oh, UP_IH) != ih) continue;
    for (IDX ow = w_lo; ow <= w_hi; ++ow) {
      if (nearest_source(sw, ow, UP_IW) == iw) acc += grad_out[SRC_AT(n, c, oh, ow)];
    }
  }
  grad_in[DST_AT(n, c, ih, iw)] = acc;
}

__kernel void up_bilinear(__global float *out, __global const float *in, const up_meta_t m, const float sh,
                          const float sw)
{
  UP_OUTPUT_ELEMENT
  IDX h0, h1, w0, w1;
  float hl0, hl1, wl0, wl1;
  linear_source(sh, oh, UP_IH, &h0, &h1, &hl0, &hl1);
  linear_source(sw, ow, UP_IW, &w0, &w1, &wl0, &wl1);
  const float top = wl0 * in[SRC_AT(n, c, h0, w0)] + wl1 * in[SRC_AT(n, c, h0, w1)];
  const float bottom = wl0 * in[SRC_AT(n, c, h1, w0)] + wl1 * in[SRC_AT(n, c, h1, w1)];
  out[DST_AT(n, c, oh, ow)] = hl0 * top + hl1 * bottom;
}

__kernel void up_bilinear_backward(__global float *grad_in, __global const float *grad_out, const up_meta_t m,
                                   const float sh, const float sw)
{
  UP_INPUT_ELEMENT(1)
  float acc = 0.0f;
  for (IDX oh = h_lo; oh <= h_hi; ++oh) {
    IDX h0, h1;
    float hl0, hl1;
    linear_source(sh, oh, UP_IH, &h0, &h1, &hl0, &hl1);
    if (h0 != ih && h1 != ih) continue;
    for (IDX ow = w_lo; ow <= w_hi; ++ow) {
      IDX w0, w1;
      float wl0, wl1;
      linear_source(sw, ow, UP_IW, &w0, &w1, &wl0, &wl1);
      if (w0 != iw && w1 != iw) continue;
      const float g = grad_out[SRC_AT(n, c, oh, ow)];
      if (h0 == ih && w0 == iw) acc += hl0 * wl0 * g;
      if (h0 == ih && w1 == iw) acc += hl0 * wl1 * g;
      if (h1 == ih && w0 == iw) acc += hl1 * wl0 * g;
      if (h1 == ih && w1 == iw) acc += hl1 * wl1 * g;
    }
  }
  grad_in[DST_AT(n, c, ih, iw)] = acc;
}
