// reduce.cl — reductions over a set of dims: out[k] = FINAL(COMBINE over r of MAP(in[k, r])).
//
// The host splits the input's dims into kept dims (shared with the output) and reduced dims,
// merges each group, and passes sizes, strides and offsets in a by-value struct (meta). Output k
// is one element of the kept index space; r runs over the reduced index space (both row-major).
//
// meta layout (IDX values):
//   [0] K outputs, [1] R elements per output, KDIM kept sizes, RDIM reduced sizes,
//   KDIM input strides of kept dims, RDIM input strides of reduced dims, KDIM output strides,
//   KDIM strides of the second output, then offsets: input, output, second output.
//
// Variants (-D options):
//   MODE 0  plain: acc = IDENTITY; acc = COMBINE(acc, MAP(x)); out = FINAL(acc, n)  (n = R)
//   MODE 1  arg: the best element (BETTER): out = its value and out2 = its index, or out = its
//           index when there is no second output
//   MODE 2  variance, two passes: out = FINAL(m2 / max(R - p0, 0)), out2 = mean
//   GROUP   0: one work-item per output, serial loop; N: one work-group of N items per output
//   KDIM, RDIM  merged ranks of kept and reduced dims      IDX  index type (int or long)
//   TIN, TACC, TOUT, TOUT2  input, accumulator, output and second-output types
//   HAS_OUT2  the second output exists (arg indices, variance mean)
//   IN_HALF, OUT_HALF  input / output stored as half (accumulation is in float)

#ifndef MODE
  #define MODE 0
#endif
#ifndef GROUP
  #define GROUP 0
#endif
#ifndef KDIM
  #define KDIM 1
#endif
#ifndef RDIM
  #define RDIM 1
#endif
#ifndef IDX
  #define IDX int
#endif
#ifndef TIN
  #define TIN float
#endif
#ifndef TACC
  #define TACC float
#endif
#ifndef TOUT
  #define TOUT float
#endif
#ifndef TOUT2
  #define TOUT2 long
#endif
#ifndef IDENTITY
  #define IDENTITY 0
#endif
#ifndef MAP
  #define MAP(v) (v)
#endif
#ifndef COMBINE
  #define COMBINE(a, v) ((a) + (v))
#endif
#ifndef FINAL
  #define FINAL(a, n) (a)
#endif
#ifndef BETTER   // MODE 1: is (v, i) better than the best so far (bv, bi)? (argmax by default)
  #define BETTER(v, i, bv, bi) (ISNAN(bv) ? (ISNAN(v) && (i) < (bi)) \
                                          : (ISNAN(v) || (v) > (bv) || ((v) == (bv) && (i) < (bi))))
#endif
#define ISNAN(x) ((x) != (x))

#define META_LEN (2 + 2 * KDIM + 2 * RDIM + KDIM + KDIM + 3)
typedef struct { IDX v[META_LEN]; } meta_t;
#define NOUT      m.v[0]
#define NRED      m.v[1]
#define KSIZE(d)  m.v[2 + (d)]
#define RSIZE(d)  m.v[2 + KDIM + (d)]
#define KSTRIDE_IN(d)   m.v[2 + KDIM + RDIM + (d)]
#define RSTRIDE_IN(d)   m.v[2 + 2 * KDIM + RDIM + (d)]
#define KSTRIDE_OUT(d)  m.v[2 + 2 * KDIM + 2 * RDIM + (d)]
#define KSTRIDE_OUT2(d) m.v[2 + 3 * KDIM + 2 * RDIM + (d)]
#define OFF_IN    m.v[2 + 4 * KDIM + 2 * RDIM]
#define OFF_OUT   m.v[3 + 4 * KDIM + 2 * RDIM]
#define OFF_OUT2  m.v[4 + 4 * KDIM + 2 * RDIM]

// input offset of reduced element r (row-major over the reduced dims)
#define REDUCED_OFFSET(r, result)                                   \
  {                                                                 \
    IDX rest_ = (r);                                                \
    result = 0;                                                     \
    for (int d = RDIM - 1; d >= 0; --d) {                           \
      const IDX c_ = (d == 0) ? rest_ : rest_ % RSIZE(d);           \
      rest_ = (d == 0) ? 0 : rest_ / RSIZE(d);                      \
      result += c_ * RSTRIDE_IN(d);                                 \
    }                                                               \
  }

#ifdef IN_HALF
  #define LOAD(o) vload_half((o), in)
#else
  #define LOAD(o) ((TACC)in[o])
#endif
#ifdef OUT_HALF
  #define STORE_OUT(o, v) vstore_half_rte((float)(v), (o), out)
#else
  #define STORE_OUT(o, v) (out[o] = (TOUT)(v))
#endif

__kernel void reduce(__global TOUT *out,
#ifdef HAS_OUT2
                     __global TOUT2 *out2,
#endif
                     __global const TIN *in, const float p0, const meta_t m)
{
#if GROUP
  const IDX k = (IDX)get_group_id(0);
  const int lid = (int)get_local_id(0);
#else
  const IDX k = (IDX)get_global_id(0);
  if (k >= NOUT) return;
#endif
  // offsets of output k in the input, the output and the second output
  IDX o_in = OFF_IN, o_out = OFF_OUT, o_out2 = OFF_OUT2;
  {
    IDX rest = k;
    for (int d = KDIM - 1; d >= 0; --d) {
      const IDX c = (d == 0) ? rest : rest % KSIZE(d);
      rest = (d == 0) ? 0 : rest / KSIZE(d);
      o_in += c * KSTRIDE_IN(d);
      o_out += c * KSTRIDE_OUT(d);
      o_out2 += c * KSTRIDE_OUT2(d);
    }
  }
  const IDX n = NRED;
#if GROUP
  const IDX first = lid;
  const IDX step = GROUP;
#else
  const IDX first = 0;
  const IDX step = 1;
#endif

#if MODE == 0  // ---------------------------------------------------------------- plain
  TACC acc = IDENTITY;
  for (IDX r = first; r < n; r += step) {
    IDX o; REDUCED_OFFSET(r, o);
    const TACC v = LOAD(o_in + o);
    acc = COMBINE(acc, MAP(v));
  }
  #if GROUP
  __local TACC partial[GROUP];
  partial[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = GROUP / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] = COMBINE(partial[lid], partial[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid != 0) return;
  acc = partial[0];
  #endif
  STORE_OUT(o_out, FINAL(acc, (TACC)n));

#elif MODE == 1  // -------------------------------------------------------------- arg
  TACC best = IDENTITY;
  long best_i = LONG_MAX;
  for (IDX r = first; r < n; r += step) {
    IDX o; REDUCED_OFFSET(r, o);
    const TACC v = LOAD(o_in + o);
    if (BETTER(v, (long)r, best, best_i)) { best = v; best_i = r; }
  }
  #if GROUP
  __local TACC partial[GROUP];
  __local long partial_i[GROUP];
  partial[lid] = best;
  partial_i[lid] = best_i;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = GROUP / 2; s > 0; s >>= 1) {
    if (lid < s && BETTER(partial[lid + s], partial_i[lid + s], partial[lid], partial_i[lid])) {
      partial[lid] = partial[lid + s];
      partial_i[lid] = partial_i[lid + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid != 0) return;
  best = partial[0];
  best_i = partial_i[0];
  #endif
  #ifdef HAS_OUT2
  STORE_OUT(o_out, best);         // max.dim / min.dim: values and indices
  out2[o_out2] = (TOUT2)best_i;
  #else
  out[o_out] = (TOUT)best_i;      // argmax / argmin: indices only
  #endif

#else  // MODE == 2 --------------------------------------------------------- variance
  TACC sum = 0;
  for (IDX r = first; r < n; r += step) {
    IDX o; REDUCED_OFFSET(r, o);
    sum += LOAD(o_in + o);
  }
  #if GROUP
  __local TACC partial[GROUP];
  partial[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = GROUP / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  sum = partial[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  #endif
  const TACC mean = sum / (TACC)n;
  TACC m2 = 0;
  for (IDX r = first; r < n; r += step) {
    IDX o; REDUCED_OFFSET(r, o);
    const TACC d = LOAD(o_in + o) - mean;
    m2 += d * d;
  }
  #if GROUP
  partial[lid] = m2;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = GROUP / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid != 0) return;
  m2 = partial[0];
  #endif
  const TACC divisor = fmax((TACC)n - (TACC)p0, (TACC)0);
  STORE_OUT(o_out, FINAL(m2 / divisor, (TACC)n));
  #ifdef HAS_OUT2
  out2[o_out2] = (TOUT2)mean;
  #endif
#endif
}
