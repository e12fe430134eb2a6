// gemm_direct.cl — gemm_direct: C = alpha * op(A) * op(B) + beta * C, fp32, row-major (like torch),
// for small and skinny problems where tiles in local memory cost more than they save.
//
// Layout (as gemm_tiled.cl). A is M x K (lda >= K) or, with TRANS_A, K x M (lda >= M); B is K x N
// (ldb >= N) or, with TRANS_B, N x K (ldb >= K); C is M x N (ldc >= N); leading dimensions are row
// strides in elements; matrix b of a batch starts at buffer + offset + b * stride (0 broadcasts).
// Any M, N, K >= 1; beta == 0 never reads C.
//
// Decomposition. A work-group of KSL x NDIMD x MDIMD threads (dimension 0 = KSL*NDIMD with the K
// slices fastest, dimension 1 = MDIMD) computes an (MDIMD*MWID) x (NDIMD*NWID) block of C. A thread
// owns MWID x NWID outputs strided by MDIMD / NDIMD (neighbouring threads, neighbouring columns) and
// reads its operands straight from global memory, in chunks of VWK floats along K: a VWK-wide vector
// load where K is contiguous (A not transposed, B transposed), VWK scalars otherwise. With KSL > 1
// the K chunks are dealt round-robin to KSL threads (neighbours read neighbouring chunks of the same
// rows: coalesced when both operands are K-contiguous, as in torch.nn.Linear), whose partial sums
// are added through local memory at the end. Rows and columns past the matrix edge are clamped to
// the last one (no branch in the K loop); their results are never stored.
// Grid: dimension 0 = N blocks, 1 = M blocks, 2 = batch.
//
// Variants: TRANS_A / TRANS_B from the problem; VECA / VECB (host-internal) are 0 when the offset,
// leading dimension or batch stride of A / B is not a multiple of VWK, which turns the vector loads
// of that operand into scalar loads.

// ---- problem layout (from the problem, not tuned) -----------------------------------------------
#include "gemm_arguments.cl"  // TRANS_A, TRANS_B, GEMM_ARGUMENTS, GEMM_BATCH_OFFSETS

// ---- tunables ------------------------------------------------------------------------------------
#ifndef MDIMD
  #define MDIMD 8     // threads per work-group along M
#endif
#ifndef NDIMD
  #define NDIMD 8     // threads per work-group along N
#endif
#ifndef KSL
  #define KSL 4       // threads per work-group along K (split K inside the work-group), fastest
#endif
#ifndef MWID
  #define MWID 2      // outputs per thread along M (strided by MDIMD)
#endif
#ifndef NWID
  #define NWID 2      // outputs per thread along N (strided by NDIMD)
#endif
#ifndef VWK
  #define VWK 4       // floats per K chunk a thread loads per operand row: 1, 2, 4
#endif
#ifndef KWID
  #define KWID 2      // K chunks per unrolled loop iteration
#endif
#ifndef VECA
  #define VECA 1      // host-internal: 1 = A addresses allow VWK-wide vector loads (A not transposed)
#endif
#ifndef VECB
  #define VECB 1      // host-internal: 1 = B addresses allow VWK-wide vector loads (B transposed)
#endif

// ---- derived --------------------------------------------------------------------------------------
#define MWGD (MDIMD * MWID)               // C block per work-group along M
#define NWGD (NDIMD * NWID)               // C block per work-group along N
#define OUTS (MWID * NWID)                // outputs per thread
#define RSTRIDE (MDIMD * NDIMD * OUTS)    // floats per K slice in the reduction buffer

#if VECA && VWK > 1
  #define VECTOR_A true              // vector loads of A rows
#else
  #define VECTOR_A false
#endif
#if VECB && VWK > 1
  #define VECTOR_B true              // vector loads of B rows (B transposed)
#else
  #define VECTOR_B false
#endif

#define VTYPE_1 float
#define VTYPE_2 float2
#define VTYPE_4 float4
#define VTYPE_(w) VTYPE_##w
#define VTYPE(w) VTYPE_(w)
typedef VTYPE(VWK) floatK;
typedef union { floatK v; float s[VWK]; } vecK;

// VWK floats of a K-contiguous row from p: one vector load if `vector` (p is then VWK-aligned).
void GlobalToPrivateRow(float dst[VWK], const __global float* restrict p, const bool vector) {
  if (vector) {
    vecK u;
    u.v = *((const __global floatK*)p);
    #pragma unroll
    for (int e = 0; e < VWK; ++e) { dst[e] = u.s[e]; }
  } else {
    #pragma unroll
    for (int e = 0; e < VWK; ++e) { dst[e] = p[e]; }
  }
}

// One chunk of VWK values along K from k: this thread's A rows and B columns into registers, then
// acc += their products. arow / bcol are the offsets of this thread's (clamped) rows / columns.
void GlobalToPrivateMultiplyChunk(float acc[MWID][NWID], const __global float* restrict agm,
                                  const __global float* restrict bgm, const int arow[MWID],
                                  const int bcol[NWID], const int lda, const int ldb, const int k) {
  float apm[MWID][VWK];
  float bpm[NWID][VWK];
  #pragma unroll
  for (int i = 0; i < MWID; ++i) {
    #if TRANS_A
      #pragma unroll
      for (int e = 0; e < VWK; ++e) { apm[i][e] = agm[(k + e) * lda + arow[i]]; }
    #else
      GlobalToPrivateRow(apm[i], agm + arow[i] + k, VECTOR_A);
    #endif
  }
  #pragma unroll
  for (int j = 0; j < NWID; ++j) {
    #if TRANS_B
      GlobalToPrivateRow(bpm[j], bgm + bcol[j] + k, VECTOR_B);
    #else
      #pragma unroll
      for (int e = 0; e < VWK; ++e) { bpm[j][e] = bgm[(k + e) * ldb + bcol[j]]; }
    #endif
  }
  #pragma unroll
  for (int e = 0; e < VWK; ++e) {
    #pragma unroll
    for (int i = 0; i < MWID; ++i) {
      #pragma unroll
      for (int j = 0; j < NWID; ++j) { acc[i][j] = fma(apm[i][e], bpm[j][e], acc[i][j]); }
    }
  }
}

// The same for one value of K (the K % VWK tail).
void GlobalToPrivateMultiplyOne(float acc[MWID][NWID], const __global float* restrict agm,
                                const __global float* restrict bgm, const int arow[MWID],
                                const int bcol[NWID], const int lda, const int ldb, const int k) {
  float apm[MWID];
  #pragma unroll
  for (int i = 0; i < MWID; ++i) {
    #if TRANS_A
      apm[i] = agm[k * lda + arow[i]];
    #else
      apm[i] = agm[arow[i] + k];
    #endif
  }
  #pragma unroll
  for (int j = 0; j < NWID; ++j) {
    #if TRANS_B
      const float b = bgm[bcol[j] + k];
    #else
      const float b = bgm[k * ldb + bcol[j]];
    #endif
    #pragma unroll
    for (int i = 0; i < MWID; ++i) { acc[i][j] = fma(apm[i], b, acc[i][j]); }
  }
}

// C[m][n] = alpha * value + beta * C[m][n] if (m, n) is inside C; beta == 0 never reads C.
void PrivateToGlobalC(__global float* restrict cgm, const int m, const int n, const int M,
                      const int N, const int ldc, const float alpha, const float beta,
                      const float value) {
  if (m < M && n < N) {
    float r = alpha * value;
    if (beta != 0.0f) { r = fma(beta, cgm[m * ldc + n], r); }
    cgm[m * ldc + n] = r;
  }
}

__kernel void gemm_direct(GEMM_ARGUMENTS(float, float)) {
  GEMM_BATCH_OFFSETS

  const int ks = get_local_id(0) % KSL;
  const int tn = get_local_id(0) / KSL;
  const int tm = get_local_id(1);
  const int m0 = get_group_id(1) * MWGD + tm;
  const int n0 = get_group_id(0) * NWGD + tn;

  // Offsets of this thread's rows of A and columns of B, clamped inside the matrices.
  int arow[MWID];
  int bcol[NWID];
  #pragma unroll
  for (int i = 0; i < MWID; ++i) {
    const int m = min(m0 + i * MDIMD, M - 1);
    #if TRANS_A
      arow[i] = m;
    #else
      arow[i] = m * lda;
    #endif
  }
  #pragma unroll
  for (int j = 0; j < NWID; ++j) {
    const int n = min(n0 + j * NDIMD, N - 1);
    #if TRANS_B
      bcol[j] = n * ldb;
    #else
      bcol[j] = n;
    #endif
  }

  float acc[MWID][NWID];
  #pragma unroll
  for (int i = 0; i < MWID; ++i) {
    #pragma unroll
    for (int j = 0; j < NWID; ++j) { acc[i][j] = 0.0f; }
  }

  // Chunk q covers K [q*VWK, q*VWK + VWK); slice ks takes chunks ks, ks + KSL, ...
  const int chunks = K / VWK;
  int q = ks;
  for (; q + (KWID - 1) * KSL < chunks; q += KWID * KSL) {
    #pragma unroll
    for (int u = 0; u < KWID; ++u) {
      GlobalToPrivateMultiplyChunk(acc, agm, bgm, arow, bcol, lda, ldb, (q + u * KSL) * VWK);
    }
  }
  for (; q < chunks; q += KSL) {
    GlobalToPrivateMultiplyChunk(acc, agm, bgm, arow, bcol, lda, ldb, q * VWK);
  }
  for (int k = chunks * VWK + ks; k < K; k += KSL) {
    GlobalToPrivateMultiplyOne(acc, agm, bgm, arow, bcol, lda, ldb, k);
  }

  #if KSL > 1
    // Sum the KSL partial results of each output; slice s stores outputs s, s + KSL, ...
    __local float rlm[KSL * RSTRIDE];
    const int slot = (tm * NDIMD + tn) * OUTS;
    #pragma unroll
    for (int i = 0; i < MWID; ++i) {
      #pragma unroll
      for (int j = 0; j < NWID; ++j) { rlm[ks * RSTRIDE + slot + i * NWID + j] = acc[i][j]; }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int o = ks; o < OUTS; o += KSL) {
      float sum = 0.0f;
      #pragma unroll
      for (int s = 0; s < KSL; ++s) { sum += rlm[s * RSTRIDE + slot + o]; }
      PrivateToGlobalC(cgm, m0 + (o / NWID) * MDIMD, n0 + (o % NWID) * NDIMD, M, N, ldc, alpha, beta,
                       sum);
    }
  #else
    #pragma unroll
    for (int i = 0; i < MWID; ++i) {
      #pragma unroll
      for (int j = 0; j < NWID; ++j) {
        PrivateToGlobalC(cgm, m0 + i * MDIMD, n0 + j * NDIMD, M, N, ldc, alpha, beta, acc[i][j]);
      }
    }
  #endif
}
