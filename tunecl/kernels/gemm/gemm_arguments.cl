// gemm_arguments.cl — what every GEMM kernel receives, included with #include "gemm_arguments.cl":
// the problem layout (from the problem, not tuned), the arguments of C = alpha * op(A) * op(B) + beta * C
// over a batch of matrices, and the step to this work-group's matrices of the batch.
#ifndef GEMM_ARGUMENTS_CL
#define GEMM_ARGUMENTS_CL

#ifndef TRANS_A
  #define TRANS_A 0   // 1 = A is stored K x M (op(A) = A^T)
#endif
#ifndef TRANS_B
  #define TRANS_B 0   // 1 = B is stored N x K (op(B) = B^T)
#endif

// The kernel arguments: A and B of element type AB_TYPE, C of C_TYPE; matrix b of the batch starts at
// buffer + offset + b * stride, rows are ld elements apart.
#define GEMM_ARGUMENTS(AB_TYPE, C_TYPE)                                                   \
  const int M, const int N, const int K, const float alpha, const float beta,             \
  const __global AB_TYPE* restrict agm, const long a_offset, const int lda,               \
  const long stride_a,                                                                    \
  const __global AB_TYPE* restrict bgm, const long b_offset, const int ldb,               \
  const long stride_b,                                                                    \
  __global C_TYPE* restrict cgm, const long c_offset, const int ldc,                      \
  const long stride_c

// agm, bgm and cgm moved to the matrices of this work-group's batch (grid dimension 2).
#define GEMM_BATCH_OFFSETS                                                                \
  const long batch = get_group_id(2);                                                     \
  agm += a_offset + batch * stride_a;                                                     \
  bgm += b_offset + batch * stride_b;                                                     \
  cgm += c_offset + batch * stride_c;

#endif
