// transformer.cl — the ops transformers add to a CNN's set: the triangle masks (tril/triu).
//
// tri_kernel      out[b, r, c] = keep ? in[b, r, c] : 0, keep = c - r <= K (LOWER) or c - r >= K, over a
//                 batch of R x C matrices; in and out are strided (B, R, C) views (the host merges the
//                 batch dims into one or copies). Elements are moved as raw bits (T: an unsigned type of
//                 the element's size), so one kernel serves every dtype (zero is all bits clear in each).
//                 meta (IDX): count, R, C, K, then offset and the three strides of in, then of out.
//
// Variants (-D options): T, IDX (int or long), LOWER.

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
