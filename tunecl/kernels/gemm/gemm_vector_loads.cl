// gemm_vector_loads.cl — the bounds-checked vector loads of the GEMM kernels' tiles (gemm_tiled.cl,
// gemm_mma.cl, gemm_simt.cl), included with #include "gemm_vector_loads.cl". GLOBAL_TO_PRIVATE_VEC
// defines one for an operand:
//   VEC NAME(const __global TYPE* restrict PTR, row, col, ld, rows, cols)
// returns WIDTH consecutive elements of row `row` from column `col` of a rows x cols matrix (rows ld
// elements apart), ZERO outside it, through UNION (a union of VEC v and TYPE s[WIDTH]). The aligned
// vector load is taken whenever the whole vector lies inside the matrix; READ(PTR, row, col, ld) reads
// one element, such as AT(p, row, col, ld), the element (row, col) of a row-major matrix.
// A_STORED(r, c) (B_STORED): the position of element (r, c) of this work-group's A (B) tile as it is
// stored, as GlobalToPrivateVec and the tile copies take it: global row, column, leading dimension,
// rows, columns (from the loaders' m0 / n0, k0, M / N, K and lda / ldb).
#ifndef GEMM_VECTOR_LOADS_CL
#define GEMM_VECTOR_LOADS_CL

#define AT(p, row, col, ld) (p)[(row) * (ld) + (col)]

#if TRANS_A
  #define A_STORED(r, c) k0 + r, m0 + c, lda, K, M
#else
  #define A_STORED(r, c) m0 + r, k0 + c, lda, M, K
#endif
#if TRANS_B
  #define B_STORED(r, c) n0 + r, k0 + c, ldb, N, K
#else
  #define B_STORED(r, c) k0 + r, n0 + c, ldb, K, N
#endif

#define GLOBAL_TO_PRIVATE_VEC(NAME, VEC, UNION, WIDTH, TYPE, PTR, READ, ZERO)                    \
  VEC NAME(const __global TYPE* restrict PTR, const int row, const int col,                      \
           const int ld, const int rows, const int cols) {                                       \
    UNION r;                                                                                     \
    if (row < rows && col + WIDTH <= cols) {                                                     \
      r.v = *((const __global VEC*)(PTR + row * ld + col));                                      \
    } else {                                                                                     \
      _Pragma("unroll")                                                                          \
      for (int e = 0; e < WIDTH; ++e) {                                                          \
        r.s[e] = (row < rows && col + e < cols) ? READ(PTR, row, col + e, ld) : ZERO;            \
      }                                                                                          \
    }                                                                                            \
    return r.v;                                                                                  \
  }

#endif
