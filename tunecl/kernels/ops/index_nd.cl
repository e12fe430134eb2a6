// index_nd.cl — advanced indexing: rows of a tensor picked by precomputed element offsets (x[i, j] with
// index tensors), written into (x[i, j] = v) or added into (x[i, j] += v, index_add), and nonzero.
//
// The host turns the index tensors into base[p], the element offset of the p-th indexed position in
// self (sum of index * stride over the indexed dims). The other dims ("rest", merged, at most four: R0..R3)
// are walked by strides. meta (IDX): count (positions x rest), rest count, R0..R3, then self's offset
// and four rest strides, then the other operand's offset, position stride and four rest strides, then
// base's offset.
//
// index_gather      other[p, r] = self[base[p] + r]   (T: an unsigned type of the element's size: bits)
// index_scatter     self[base[p] + r] = other[p, r]   (where positions repeat, which write lands is
//                   unspecified, as on CUDA)
// index_accumulate  self[base[p] + r] += other[p, r] by atomics (float: a compare-and-swap loop, int:
//                   atomic_add): where positions repeat, float sums depend on the order the additions
//                   land in, so results can differ in the last bit run to run (as CUDA's index_add).
// nonzero_write     for each element i of a contiguous uchar mask with mask[i] != 0, its coordinates
//                   (long, RANK of them, over the sizes in nz_meta) into row csum[i] - 1 of out, csum being
//                   the mask's inclusive prefix sum: rows in element order (as torch's nonzero).
//
// Variants (-D options): T, TA (accumulate: float or int), IDX (int or long), RANK.

#ifndef IDX
  #define IDX int
#endif
#ifndef T
  #define T uint
#endif
#ifndef TA
  #define TA float
#endif

typedef struct { IDX v[18]; } ind_meta_t;

#define REST_SPLIT                                                              \
  const IDX p = i / m.v[1];                                                     \
  IDX r = i % m.v[1];                                                           \
  const IDX r3 = r % m.v[5]; r /= m.v[5];                                       \
  const IDX r2 = r % m.v[4]; r /= m.v[4];                                       \
  const IDX r1 = r % m.v[3];                                                    \
  const IDX r0 = r / m.v[3];                                                    \
  const IDX self_at = m.v[6] + (IDX)base[m.v[17] + p] + r0 * m.v[7] + r1 * m.v[8] + r2 * m.v[9] + r3 * m.v[10]; \
  const IDX other_at = m.v[11] + p * m.v[12] + r0 * m.v[13] + r1 * m.v[14] + r2 * m.v[15] + r3 * m.v[16];

__kernel void index_gather(__global T *other, __global const T *self, __global const long *base,
                           const ind_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= m.v[0]) return;
  REST_SPLIT
  other[other_at] = self[self_at];
}

__kernel void index_scatter(__global T *self, __global const T *other, __global const long *base,
                            const ind_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= m.v[0]) return;
  REST_SPLIT
  self[self_at] = other[other_at];
}

__kernel void index_accumulate(__global TA *self, __global const TA *other, __global const long *base,
                               const ind_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= m.v[0]) return;
  REST_SPLIT
  const TA v = other[other_at];
#ifdef FLOAT_ADD
  volatile __global uint *word = (volatile __global uint *)(self + self_at);
  union { uint u; float f; } seen, next;
  seen.u = *word;
  for (;;) {
    next.f = seen.f + v;
    const uint was = atomic_cmpxchg(word, seen.u, next.u);
    if (was == seen.u) break;
    seen.u = was;
  }
#else
  atomic_add((volatile __global int *)(self + self_at), v);
#endif
}

#ifndef RANK
  #define RANK 1
#endif

typedef struct { IDX v[RANK + 1]; } nz_meta_t;   // count, then the sizes

__kernel void nonzero_write(__global long *out, __global const uchar *mask, __global const long *csum,
                            const nz_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= m.v[0] || !mask[i]) return;
  __global long *row = out + (csum[i] - 1) * RANK;
  IDX rest = i;
  for (int d = RANK - 1; d >= 0; --d) {
    row[d] = rest % m.v[1 + d];
    rest /= m.v[1 + d];
  }
}
