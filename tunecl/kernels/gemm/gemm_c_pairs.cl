// gemm_c_pairs.cl — C accesses of the tensor-core GEMM kernels (gemm_mma.cl, gemm_wgmma.cl), whose lanes
// hold pairs of neighbours in a row of C; included with #include "gemm_c_pairs.cl" after C_HALF (1 = C
// is half) and CSCALAR are defined.
//   LOAD_C, STORE_C     one element of C: fp32, or (C_HALF) half, converted exactly on loads and rounded
//                       to nearest even on stores;
//   LOAD_C2, STORE_C2   two neighbours of a row as a float2 (an aligned vector access);
//   STORE_C_PAIR(crow, n, r0, r1)  columns n and n + 1 of row crow = r0, r1 + beta * their old values
//                       (beta == 0 never reads C), those inside N; one vector access where both are
//                       inside and CSCALAR is 0. r0 and r1 are updated in place.
#ifndef GEMM_C_PAIRS_CL
#define GEMM_C_PAIRS_CL

#if C_HALF
  #define LOAD_C(p) vload_half(0, p)
  #define STORE_C(x, p) vstore_half_rte(x, 0, p)
  #define LOAD_C2(p) vload_half2(0, p)
  #define STORE_C2(v, p) vstore_half2_rte(v, 0, p)
#else
  #define LOAD_C(p) (*(p))
  #define STORE_C(x, p) (*(p) = (x))
  #define LOAD_C2(p) (*((__global float2*)(p)))
  #define STORE_C2(v, p) (*((__global float2*)(p)) = (v))
#endif

#define STORE_C_PAIR_SCALAR(crow, n, r0, r1)                                                \
  {                                                                                         \
    if (n < N) {                                                                            \
      if (beta != 0.0f) { r0 = fma(beta, LOAD_C(crow + n), r0); }                           \
      STORE_C(r0, crow + n);                                                                \
    }                                                                                       \
    if (n + 1 < N) {                                                                        \
      if (beta != 0.0f) { r1 = fma(beta, LOAD_C(crow + n + 1), r1); }                       \
      STORE_C(r1, crow + n + 1);                                                            \
    }                                                                                       \
  }
#if CSCALAR == 0
  #define STORE_C_PAIR(crow, n, r0, r1)                                                     \
    if (n + 2 <= N) {                                                                       \
      if (beta != 0.0f) {                                                                   \
        const float2 old = LOAD_C2(crow + n);                                               \
        r0 = fma(beta, old.x, r0);                                                          \
        r1 = fma(beta, old.y, r1);                                                          \
      }                                                                                     \
      STORE_C2((float2)(r0, r1), crow + n);                                                 \
    } else                                                                                  \
    STORE_C_PAIR_SCALAR(crow, n, r0, r1)
#else
  #define STORE_C_PAIR(crow, n, r0, r1) STORE_C_PAIR_SCALAR(crow, n, r0, r1)
#endif

#endif
