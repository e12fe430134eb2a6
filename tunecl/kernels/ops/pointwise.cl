// pointwise.cl — every elementwise op of the PyTorch backend, from one template.
//
// Computes out[i] = OP(x0, x1, x2) for every element i of an NDIM-dimensional iteration space
// (row-major). The host merges dims that are contiguous in every operand first, so dense tensors
// run with NDIM = 1. Input k is read through its own strides (0 along broadcast dims) or, with
// INk_SCALAR, is the scalar argument xk. Sizes, strides and element offsets travel in one by-value
// struct (meta), so one binary serves every shape of the same rank.
//
// meta layout (IDX values): [0] element count, [1 .. NDIM] sizes, then NDIM strides for each
// operand (out, in0, in1, in2 in that order), then one element offset per operand.
//
// Variants (-D options; the host builds OP from a table of expressions, one per op):
//   OP(a,b,c)     the expression; it may use s0..s3 (op parameters) and i (the linear index)
//   NIN           number of inputs, 0..3           NS   number of op parameters, 0..4
//   NDIM          rank of the iteration space      IDX  index type, int or long
//   TC            compute type (float, int, long)
//   TOUT, TINk    storage types of out and input k (float, half, long, int, short, char, uchar)
//   OUT_KIND      0 plain cast, 1 half (vstore_half_rte), 2 bool (v != 0), 3 integer via long
//   INk_KIND      0 plain load, 1 half (vload_half)
//   INk_SCALAR    input k is the scalar argument xk (type TC) instead of a buffer
//   VEC           float4 variant: NDIM 1, every buffer float with stride 1 and an element offset
//                 that is a multiple of 4 (the host checks this at each launch)

#ifndef NIN
  #define NIN 2          // inputs
#endif
#ifndef NS
  #define NS 1           // op parameters s0..s3
#endif
#ifndef NDIM
  #define NDIM 1         // rank after merging dims
#endif
#ifndef IDX
  #define IDX int        // index type
#endif
#ifndef TC
  #define TC float       // compute type
#endif
#ifndef TOUT
  #define TOUT float
#endif
#ifndef TIN0
  #define TIN0 float
#endif
#ifndef TIN1
  #define TIN1 float
#endif
#ifndef TIN2
  #define TIN2 float
#endif
#ifndef OUT_KIND
  #define OUT_KIND 0
#endif
#ifndef IN0_KIND
  #define IN0_KIND 0
#endif
#ifndef IN1_KIND
  #define IN1_KIND 0
#endif
#ifndef IN2_KIND
  #define IN2_KIND 0
#endif
#ifndef OP
  #define OP(a, b, c) ((a) + s0 * (b))   // add: the smoke-test default
#endif

#include "elementwise_meta.cl"  // meta_t, COUNT, SIZE, STRIDE, OFFSET, NOPS

#if IN0_KIND == 1
  #define LOAD0(p, o) vload_half((o), (p))
#else
  #define LOAD0(p, o) ((TC)(p)[o])
#endif
#if IN1_KIND == 1
  #define LOAD1(p, o) vload_half((o), (p))
#else
  #define LOAD1(p, o) ((TC)(p)[o])
#endif
#if IN2_KIND == 1
  #define LOAD2(p, o) vload_half((o), (p))
#else
  #define LOAD2(p, o) ((TC)(p)[o])
#endif

#if OUT_KIND == 1
  #define STORE(p, o, v) vstore_half_rte((v), (o), (p))
#elif OUT_KIND == 2
  #define STORE(p, o, v) ((p)[o] = (TOUT)((v) != (TC)0))
#elif OUT_KIND == 3
  #define STORE(p, o, v) ((p)[o] = (TOUT)(long)(v))
#else
  #define STORE(p, o, v) ((p)[o] = (TOUT)(v))
#endif

// The value of each input: a scalar argument or a strided load (operand k + 1 in meta).
#if NIN > 0 && defined(IN0_SCALAR)
  #define X0 x0
#elif NIN > 0
  #define X0 LOAD0(in0, o1)
#else
  #define X0 ((TC)0)
#endif
#if NIN > 1 && defined(IN1_SCALAR)
  #define X1 x1
#elif NIN > 1
  #define X1 LOAD1(in1, o2)
#else
  #define X1 ((TC)0)
#endif
#if NIN > 2 && defined(IN2_SCALAR)
  #define X2 x2
#elif NIN > 2
  #define X2 LOAD2(in2, o3)
#else
  #define X2 ((TC)0)
#endif

__kernel void pointwise(__global TOUT *out
#if NIN > 0 && defined(IN0_SCALAR)
                        , const TC x0
#elif NIN > 0
                        , __global const TIN0 *in0
#endif
#if NIN > 1 && defined(IN1_SCALAR)
                        , const TC x1
#elif NIN > 1
                        , __global const TIN1 *in1
#endif
#if NIN > 2 && defined(IN2_SCALAR)
                        , const TC x2
#elif NIN > 2
                        , __global const TIN2 *in2
#endif
#if NS > 0
                        , const TC s0
#endif
#if NS > 1
                        , const TC s1
#endif
#if NS > 2
                        , const TC s2
#endif
#if NS > 3
                        , const TC s3
#endif
                        , const meta_t m)
{
#ifdef VEC
  // Dense float operands (NDIM 1, unit strides, element offsets that are multiples of 4, so the
  // float4 accesses are aligned): four consecutive elements per work-item, one 16-byte load per
  // input and one store; the last work-item finishes a count that is not a multiple of 4 one by one.
  const IDX base = (IDX)get_global_id(0) * 4;
  if (base >= COUNT) return;
  const IDX o0 = OFFSET(0) + base;
#if NIN > 0 && !defined(IN0_SCALAR)
  const IDX o1 = OFFSET(1) + base;
#endif
#if NIN > 1 && !defined(IN1_SCALAR)
  const IDX o2 = OFFSET(2) + base;
#endif
#if NIN > 2 && !defined(IN2_SCALAR)
  const IDX o3 = OFFSET(3) + base;
#endif
  if (base + 4 <= COUNT) {
#if NIN > 0 && !defined(IN0_SCALAR)
    const float4 a0 = *(__global const float4 *)(in0 + o1);
    #define V0(c) a0.c
#else
    #define V0(c) X0
#endif
#if NIN > 1 && !defined(IN1_SCALAR)
    const float4 a1 = *(__global const float4 *)(in1 + o2);
    #define V1(c) a1.c
#else
    #define V1(c) X1
#endif
#if NIN > 2 && !defined(IN2_SCALAR)
    const float4 a2 = *(__global const float4 *)(in2 + o3);
    #define V2(c) a2.c
#else
    #define V2(c) X2
#endif
    float4 r;
    #define LANE(c, j) { const IDX i = base + (j); (void)i; r.c = (TC)(OP(V0(c), V1(c), V2(c))); }
    LANE(x, 0) LANE(y, 1) LANE(z, 2) LANE(w, 3)
    *(__global float4 *)(out + o0) = r;
  } else {
    for (IDX j = 0; base + j < COUNT; ++j) {
      const IDX i = base + j;
      (void)i;
#if NIN > 0 && !defined(IN0_SCALAR)
      const TC e0 = in0[o1 + j];
      #define W0 e0
#else
      #define W0 X0
#endif
#if NIN > 1 && !defined(IN1_SCALAR)
      const TC e1 = in1[o2 + j];
      #define W1 e1
#else
      #define W1 X1
#endif
#if NIN > 2 && !defined(IN2_SCALAR)
      const TC e2 = in2[o3 + j];
      #define W2 e2
#else
      #define W2 X2
#endif
      out[o0 + j] = (TOUT)(OP(W0, W1, W2));
    }
  }
#else
  const IDX i = (IDX)get_global_id(0);
  if (i >= COUNT) return;
  IDX o0 = OFFSET(0);
#if NIN > 0
  IDX o1 = OFFSET(1);
#endif
#if NIN > 1
  IDX o2 = OFFSET(2);
#endif
#if NIN > 2
  IDX o3 = OFFSET(3);
#endif
  IDX rest = i;
  for (int d = NDIM - 1; d >= 0; --d) {
    const IDX c = (d == 0) ? rest : rest % SIZE(d);
    rest = (d == 0) ? 0 : rest / SIZE(d);
    o0 += c * STRIDE(0, d);
#if NIN > 0
    o1 += c * STRIDE(1, d);
#endif
#if NIN > 1
    o2 += c * STRIDE(2, d);
#endif
#if NIN > 2
    o3 += c * STRIDE(3, d);
#endif
  }
  const TC v = (TC)(OP(X0, X1, X2));
  STORE(out, o0, v);
#endif
}
