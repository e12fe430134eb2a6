// index.cl — gather and scatter along one dim of strided tensors.
//
//   gather   out[c] = src[c with c[dim] replaced by index[c]]       (iterates over out / index)
//   scatter  out[c with c[dim] replaced by index[c]] = src[c]       (iterates over index)
//
// The host describes every operand by strides over the iteration shape (NDIM dims, row-major);
// the indexed operand (src for gather, out for scatter) gets stride 0 along dim there, and its
// real stride along dim, TARGET_STRIDE, is added as index * TARGET_STRIDE. An index outside
// [0, DIM_SIZE) (negative ones too, as torch's gather, scatter and index_select refuse them) is skipped
// and sets fault[0] to 1: torch raises, and the host reports the fault at its next wait for the device,
// as CUDA reports a device-side assert.
//
// meta layout (IDX values): [0] element count, [1 .. NDIM] sizes, NDIM strides each of out, index
// and src, offsets of out, index and src, DIM_SIZE, TARGET_STRIDE.
//
// Variants (-D options): SCATTER (else gather), SRC_SCALAR (scatter a value instead of src),
// NDIM, IDX (int or long), T (element type), TIDX (index type: long or int).

#ifndef NDIM
  #define NDIM 1
#endif
#ifndef IDX
  #define IDX int
#endif
#ifndef T
  #define T float
#endif
#ifndef TIDX
  #define TIDX long
#endif

#define META_LEN (1 + 4 * NDIM + 5)
typedef struct { IDX v[META_LEN]; } meta_t;
#define COUNT          m.v[0]
#define SIZE(d)        m.v[1 + (d)]
#define STRIDE(k, d)   m.v[1 + NDIM + (k) * NDIM + (d)]
#define OFFSET(k)      m.v[1 + 4 * NDIM + (k)]
#define DIM_SIZE       m.v[4 + 4 * NDIM]
#define TARGET_STRIDE  m.v[5 + 4 * NDIM]

__kernel void index_kernel(__global T *out, __global const TIDX *index, __global const T *src,
                           const T value, const meta_t m, __global int *fault)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= COUNT) return;
  IDX o_out = OFFSET(0), o_idx = OFFSET(1), o_src = OFFSET(2);
  IDX rest = i;
  for (int d = NDIM - 1; d >= 0; --d) {
    const IDX c = (d == 0) ? rest : rest % SIZE(d);
    rest = (d == 0) ? 0 : rest / SIZE(d);
    o_out += c * STRIDE(0, d);
    o_idx += c * STRIDE(1, d);
    o_src += c * STRIDE(2, d);
  }
  const long k = (long)index[o_idx];
  if (k < 0 || k >= DIM_SIZE) {
    fault[0] = 1;
    return;
  }
#ifdef SCATTER
  #ifdef SRC_SCALAR
  out[o_out + (IDX)k * TARGET_STRIDE] = value;
  #else
  out[o_out + (IDX)k * TARGET_STRIDE] = src[o_src];
  #endif
#else
  out[o_out] = src[o_src + (IDX)k * TARGET_STRIDE];
#endif
}
