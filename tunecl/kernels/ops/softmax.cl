// softmax.cl — softmax and log_softmax over one dim, and their backward, fp32.
//
// Tensors are contiguous and viewed as (outer, D, inner): the reduced dim has size D and stride
// inner. Each row (o, i) is normalised independently:
//   softmax:            y = exp(x - max) / sum(exp(x - max))
//   log_softmax:        y = x - max - log(sum(exp(x - max)))
//   softmax backward:   gx = y * (g - sum(g * y))
//   log_softmax bwd:    gx = g - exp(y) * sum(g)
//
// Variants (-D options):
//   MODE   0 softmax, 1 log_softmax, 2 softmax backward, 3 log_softmax backward
//   GROUP  0: one work-item per row (serial over D); N: one work-group of N items per row
//   IDX    index type (int or long)
// Arguments: out, a (x forward; g backward), b (y backward; unused forward), then
// outer, D, inner and the element offsets of out, a and b.

#ifndef MODE
  #define MODE 0
#endif
#ifndef GROUP
  #define GROUP 0
#endif
#ifndef IDX
  #define IDX int
#endif

#define MAX_NAN(m, v) (((v) > (m) || (v) != (v)) ? (v) : (m))   // NaN propagates, like torch

#if GROUP
  // tree-combine one value per work-item; every item gets the result
  #define GROUP_REDUCE(value, OPERATION)                          \
    partial[lid] = value;                                        \
    barrier(CLK_LOCAL_MEM_FENCE);                                \
    for (int s = GROUP / 2; s > 0; s >>= 1) {                    \
      if (lid < s) partial[lid] = OPERATION(partial[lid], partial[lid + s]); \
      barrier(CLK_LOCAL_MEM_FENCE);                              \
    }                                                            \
    value = partial[0];                                          \
    barrier(CLK_LOCAL_MEM_FENCE);
#else
  #define GROUP_REDUCE(value, OPERATION)
#endif
#define ADD(x, y) ((x) + (y))

__kernel void softmax(__global float *out, __global const float *a, __global const float *b,
                      const IDX outer, const IDX D, const IDX inner,
                      const IDX off_out, const IDX off_a, const IDX off_b)
{
#if GROUP
  const IDX row = (IDX)get_group_id(0);
  const int lid = (int)get_local_id(0);
  const IDX first = lid, step = GROUP;
  __local float partial[GROUP];
#else
  const IDX row = (IDX)get_global_id(0);
  if (row >= outer * inner) return;
  const IDX first = 0, step = 1;
#endif
  const IDX base = (row / inner) * D * inner + row % inner;
  __global float *y = out + off_out + base;
  __global const float *x = a + off_a + base;

#if MODE <= 1  // forward
  float m = -INFINITY;
  for (IDX d = first; d < D; d += step) m = MAX_NAN(m, x[d * inner]);
  GROUP_REDUCE(m, MAX_NAN)
  float sum = 0.0f;
  for (IDX d = first; d < D; d += step) sum += exp(x[d * inner] - m);
  GROUP_REDUCE(sum, ADD)
  #if MODE == 0
  const float scale = 1.0f / sum;
  for (IDX d = first; d < D; d += step) y[d * inner] = exp(x[d * inner] - m) * scale;
  #else
  const float shift = m + log(sum);
  for (IDX d = first; d < D; d += step) y[d * inner] = x[d * inner] - shift;
  #endif

#else  // backward: x is the output gradient g, o the forward output y
  __global const float *o = b + off_b + base;
  float sum = 0.0f;
  #if MODE == 2
  for (IDX d = first; d < D; d += step) sum += x[d * inner] * o[d * inner];
  GROUP_REDUCE(sum, ADD)
  for (IDX d = first; d < D; d += step) y[d * inner] = o[d * inner] * (x[d * inner] - sum);
  #else
  for (IDX d = first; d < D; d += step) sum += x[d * inner];
  GROUP_REDUCE(sum, ADD)
  for (IDX d = first; d < D; d += step) y[d * inner] = x[d * inner] - exp(o[d * inner]) * sum;
  #endif
#endif
}
