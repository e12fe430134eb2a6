// gemm_simt.cl — gemm_simt: C = alpha * op(A) * op(B) + beta * C, fp32, row-major (like torch),
// decomposed the way CUTLASS's SIMT SGEMM is (thread block -> warps -> lanes -> 4x4 sub-blocks).
//
// Layout. A is M x K (lda >= K) or, with TRANS_A, K x M (lda >= M); B is K x N (ldb >= N) or, with
// TRANS_B, N x K (ldb >= K); C is M x N (ldc >= N). Leading dimensions are row strides in elements.
// Matrix b of a batch starts at buffer + offset + b * stride (elements; a stride of 0 broadcasts).
// Any M, N, K >= 1: loads outside the matrices read zeros and stores outside are skipped, so the
// caller never pads. beta == 0 never reads C (it may hold NaN garbage).
//
// Decomposition. A work-group (1-D, THREADS work-items) computes one MWG x NWG tile of C. Its threads
// form WARPS_M x WARPS_N warps of LM x LN lanes; warp (wm, wn) owns the WM x WN warp tile at
// (wm * WM, wn * WN). A lane owns TM x TN = (WM / LM) x (WN / LN) outputs, not contiguous but split
// into VW x VW sub-blocks strided by the lane arrangement: along M its rows are
//     lane_m * VW + i * (LM * VW) + e,   i < TM / VW, e < VW
// (along N likewise), so that per k step a warp reads LM (LN) *adjacent* VW-vectors of the A (B) row
// from local memory: 128-bit reads (VW = 4), every bank once, broadcast between lanes. K is walked in
// KWG-deep tiles kept K-major in local memory (alm[k][m], blm[k][n]): A is transposed on its way in
// when it is stored M x K, B when it is stored N x K (scalar local stores; PAD skews those rows).
// Global loads: the A tile is MWG x KWG elements, read as VWA-wide vectors along A's contiguous
// dimension, vector v of the tile by thread v % THREADS (consecutive threads read consecutive
// vectors, so rows are read coalesced); likewise B with VWB. The lane layout inside a warp is
// row-major (LIL = 1) or CUTLASS's RowMajorInterleaved<2> (LIL = 2: lanes 2i, 2i+1 share a column
// of lanes), which narrows the addresses one quarter-warp touches.
// Pipelining. The next K tile is read from global memory into registers while the current one is
// multiplied, and stored to local memory before the last k step of the current tile. Fragments are
// register double-buffered: the operands of step k+1 are read from local memory before the FMAs of
// step k. DB = 1 double-buffers local memory too: one barrier per K tile.
// Grid: dimension 0 = N tiles (x THREADS work-items), 1 = M tiles, 2 = batch; GM re-orders the
// work-groups in bands of GM tile rows (L2 reuse).
//
// Variants (named #if branches; the host passes -DNAME=VALUE):
//   DB           1: two local buffers, one barrier per K tile; 0: one buffer, two barriers.
//   PAD          1: local rows are MWG + 4 (NWG + 4) floats long, so the transposed scalar stores of
//                one warp do not collide in a bank (CUTLASS's simt_transpose_padding for KWG = 8).
//   LIL          lane interleave (1 or 2), see above.
//   RWGS         1: declare reqd_work_group_size (NVIDIA then ignores -cl-nv-maxrregcount).
//   TRANS_A/B    problem layout, set by the host from the problem (not tuned).
//   CSCALAR      host-internal: 1 = scalar C accesses, for C offsets/ldc that are not VW-aligned.
// Global vector loads dereference floatN pointers (that is what makes compilers emit 128-bit loads),
// so they need aligned addresses: the host compiles VWA=1 / VWB=1 / CSCALAR=1 variants for calls whose
// offset, leading dimension or batch stride is not a multiple of the vector width.

// ---- problem layout (from the problem, not tuned) -----------------------------------------------
#include "gemm_arguments.cl"  // TRANS_A, TRANS_B, GEMM_ARGUMENTS, GEMM_BATCH_OFFSETS

// ---- tunables ------------------------------------------------------------------------------------
#ifndef MWG
  #define MWG 128     // C tile per work-group along M
#endif
#ifndef NWG
  #define NWG 128     // C tile per work-group along N
#endif
#ifndef KWG
  #define KWG 8       // depth of one K tile (local memory): 8, 16, 32
#endif
#ifndef WM
  #define WM 32       // warp tile along M (divides MWG)
#endif
#ifndef WN
  #define WN 64       // warp tile along N (divides NWG)
#endif
#ifndef LM
  #define LM 4        // lanes of a warp along M
#endif
#ifndef LN
  #define LN 8        // lanes of a warp along N (LM * LN lanes per warp; 32 on NVIDIA)
#endif
#ifndef LIL
  #define LIL 2       // lane interleave: 1 row-major lanes, 2 CUTLASS's RowMajorInterleaved<2>
#endif
#ifndef VW
  #define VW 4        // sub-block width: local reads of fragments and C accesses, 1, 2, 4
#endif
#ifndef VWA
  #define VWA 4       // global vector width of A along its contiguous dimension (K; M if TRANS_A)
#endif
#ifndef VWB
  #define VWB 4       // global vector width of B along its contiguous dimension (N; K if TRANS_B)
#endif
#ifndef DB
  #define DB 1        // double-buffered local memory
#endif
#ifndef PAD
  #define PAD 1       // pad local rows by 4 floats
#endif
#ifndef GM
  #define GM 8        // work-group order: bands of GM tile rows (1 = plain order)
#endif
#include "gemm_common.cl"  // gemm_tile_of_group()
#ifndef RWGS
  #define RWGS 0      // declare reqd_work_group_size
#endif
#ifndef CSCALAR
  #define CSCALAR 0   // host-internal: scalar C accesses
#endif

// ---- derived ----------------------------------------------------------------------------------------
#define LANES (LM * LN)
#define WARPS_M (MWG / WM)
#define WARPS_N (NWG / WN)
#define THREADS (WARPS_M * WARPS_N * LANES)
#define TM (WM / LM)                         // outputs per thread along M
#define TN (WN / LN)                         // outputs per thread along N
#define SUBM (TM / VW)                       // sub-blocks per thread along M
#define SUBN (TN / VW)
#define ALD (MWG + 4 * PAD)                  // local row length of A (K-major) and B
#define BLD (NWG + 4 * PAD)
#define A_LOADS (MWG * KWG / (VWA * THREADS)) // global vectors of the A tile per thread
#define B_LOADS (NWG * KWG / (VWB * THREADS))
#if TRANS_A
  #define A_ROW_VECTORS (MWG / VWA)          // vectors per stored row of the tile (rows along K)
#else
  #define A_ROW_VECTORS (KWG / VWA)          // rows along M
#endif
#if TRANS_B
  #define B_ROW_VECTORS (KWG / VWB)          // rows along N
#else
  #define B_ROW_VECTORS (NWG / VWB)          // rows along K
#endif

#if VW == 1
  typedef float floatV;
#elif VW == 2
  typedef float2 floatV;
#else
  typedef float4 floatV;
#endif
#if VWA == 1
  typedef float floatA;
#elif VWA == 2
  typedef float2 floatA;
#else
  typedef float4 floatA;
#endif
#if VWB == 1
  typedef float floatB;
#elif VWB == 2
  typedef float2 floatB;
#else
  typedef float4 floatB;
#endif
typedef union { floatV v; float s[VW]; } vecV;
typedef union { floatA v; float s[VWA]; } vecA;
typedef union { floatB v; float s[VWB]; } vecB;

// ---- global memory -> registers -> local memory ------------------------------------------------------

// GlobalToPrivateVecA (B): VWA (VWB) elements of a row of A (B); zeros outside the matrix.
// An element (row, col) of a row-major matrix, read as p[row * ld + col].
#define AT_FLAT(p, row, col, ld) p[row * ld + col]
#include "gemm_vector_loads.cl"  // GLOBAL_TO_PRIVATE_VEC
GLOBAL_TO_PRIVATE_VEC(GlobalToPrivateVecA, floatA, vecA, VWA, float, agm, AT_FLAT, 0.0f)
GLOBAL_TO_PRIVATE_VEC(GlobalToPrivateVecB, floatB, vecB, VWB, float, bgm, AT_FLAT, 0.0f)

// This thread's vector l of the X tile (A or B): vector v = tid + l * THREADS of the tile, at row `row`
// and column `col` of the tile as stored.
#define TILE_VECTOR(X)                                                                              \
  const int v = tid + l * THREADS;                                                                \
  const int row = v / X##_ROW_VECTORS;                                                            \
  const int col = (v % X##_ROW_VECTORS) * VW##X;

// GlobalToPrivateA (B): the A tile at (m0, k0) (the B tile at (k0, n0)), this thread's A_LOADS (B_LOADS)
// vectors into registers.
#define GLOBAL_TO_PRIVATE(X, x, mn, MN)                                                             \
  void GlobalToPrivate##X(const __global float* restrict x##gm, float##X x##reg[X##_LOADS], const int tid, \
                          const int mn##0, const int k0, const int MN, const int K, const int ld##x) { \
    _Pragma("unroll")                                                                             \
    for (int l = 0; l < X##_LOADS; ++l) {                                                         \
      TILE_VECTOR(X)                                                                              \
      x##reg[l] = GlobalToPrivateVec##X(x##gm, X##_STORED(row, col));                             \
    }                                                                                             \
  }

// PrivateToLocalA (B): this thread's A (B) vectors into local memory, K-major: alm[k * ALD + m]
// (blm[k * BLD + n]); a stored row along M (N) is a k row, one along K is stored transposed.
#define STORE_ROW(X, x) *((__local float##X*)(x##lm + row * X##LD + col)) = x##reg[l];
#define STORE_TRANSPOSED(X, x)                                                                      \
  vec##X u;                                                                                       \
  u.v = x##reg[l];                                                                                \
  _Pragma("unroll")                                                                               \
  for (int e = 0; e < VW##X; ++e) { x##lm[(col + e) * X##LD + row] = u.s[e]; }
#if TRANS_A
  #define A_TO_LOCAL STORE_ROW
#else
  #define A_TO_LOCAL STORE_TRANSPOSED
#endif
#if TRANS_B
  #define B_TO_LOCAL STORE_TRANSPOSED
#else
  #define B_TO_LOCAL STORE_ROW
#endif
#define PRIVATE_TO_LOCAL(X, x)                                                                      \
  void PrivateToLocal##X(const float##X x##reg[X##_LOADS], __local float* x##lm, const int tid) {  \
    _Pragma("unroll")                                                                             \
    for (int l = 0; l < X##_LOADS; ++l) {                                                         \
      TILE_VECTOR(X)                                                                              \
      X##_TO_LOCAL(X, x)                                                                          \
    }                                                                                             \
  }

GLOBAL_TO_PRIVATE(A, a, m, M)
PRIVATE_TO_LOCAL(A, a)
GLOBAL_TO_PRIVATE(B, b, n, N)
PRIVATE_TO_LOCAL(B, b)

// ---- local memory -> fragments -------------------------------------------------------------------

// Row k of the local A tile: this thread's TM values (SUBM vectors, LM * VW apart), from `abase`
// (= its warp's first row + lane_m * VW).
void LocalToPrivateA(const __local float* alm, float apm[TM], const int abase, const int k) {
  #pragma unroll
  for (int i = 0; i < SUBM; ++i) {
    vecV u;
    u.v = *((const __local floatV*)(alm + k * ALD + abase + i * (LM * VW)));
    #pragma unroll
    for (int e = 0; e < VW; ++e) { apm[i * VW + e] = u.s[e]; }
  }
}

void LocalToPrivateB(const __local float* blm, float bpm[TN], const int bbase, const int k) {
  #pragma unroll
  for (int j = 0; j < SUBN; ++j) {
    vecV u;
    u.v = *((const __local floatV*)(blm + k * BLD + bbase + j * (LN * VW)));
    #pragma unroll
    for (int e = 0; e < VW; ++e) { bpm[j * VW + e] = u.s[e]; }
  }
}

// ---- the multiply -----------------------------------------------------------------------------------

// One k step: the outer product of this thread's A and B fragments.
void MultiplyStep(float cpm[TM][TN], const float apm[TM], const float bpm[TN]) {
  #pragma unroll
  for (int mi = 0; mi < TM; ++mi) {
    #pragma unroll
    for (int ni = 0; ni < TN; ++ni) { cpm[mi][ni] = fma(apm[mi], bpm[ni], cpm[mi][ni]); }
  }
}

// ---- registers -> global memory (C) ---------------------------------------------------------------

// C = alpha * cpm + beta * C for this thread's outputs inside the matrix; beta == 0 never reads C.
void PrivateToGlobalC(float cpm[TM][TN], __global float* restrict cgm, const int mbase,
                      const int nbase, const int M, const int N, const int ldc,
                      const float alpha, const float beta) {
  #pragma unroll
  for (int i = 0; i < SUBM; ++i) {
    #pragma unroll
    for (int e = 0; e < VW; ++e) {
      const int m = mbase + i * (LM * VW) + e;
      if (m < M) {
        __global float* crow = cgm + m * ldc;
        #pragma unroll
        for (int j = 0; j < SUBN; ++j) {
          const int n = nbase + j * (LN * VW);
          #if CSCALAR == 0
          if (n + VW <= N) {
            vecV r;
            #pragma unroll
            for (int f = 0; f < VW; ++f) { r.s[f] = alpha * cpm[i * VW + e][j * VW + f]; }
            if (beta != 0.0f) {
              vecV old;
              old.v = *((__global floatV*)(crow + n));
              #pragma unroll
              for (int f = 0; f < VW; ++f) { r.s[f] = fma(beta, old.s[f], r.s[f]); }
            }
            *((__global floatV*)(crow + n)) = r.v;
          } else
          #endif
          {
            #pragma unroll
            for (int f = 0; f < VW; ++f) {
              if (n + f < N) {
                float r = alpha * cpm[i * VW + e][j * VW + f];
                if (beta != 0.0f) { r = fma(beta, crow[n + f], r); }
                crow[n + f] = r;
              }
            }
          }
        }
      }
    }
  }
}

// ---- the kernel -------------------------------------------------------------------------------------

#if RWGS
  #define WORK_GROUP_SIZE __attribute__((reqd_work_group_size(THREADS, 1, 1)))
#else
  #define WORK_GROUP_SIZE
#endif
__kernel WORK_GROUP_SIZE
void gemm_simt(GEMM_ARGUMENTS(float, float)) {
  GEMM_BATCH_OFFSETS

  const int2 tile = gemm_tile_of_group();  // gemm_common.cl: plain or GM-banded order
  GEMM_TILE_ORIGIN(tile)

  // Warp and lane coordinates; a thread's fragments start at abase (M) and bbase (N) of the tile.
  const int tid = get_local_id(0);
  const int warp = tid / LANES;
  const int lane = tid % LANES;
  const int warp_m = warp % WARPS_M;
  const int warp_n = warp / WARPS_M;
  const int lane_m = (lane / (LIL * LN)) * LIL + lane % LIL;
  const int lane_n = (lane % (LIL * LN)) / LIL;
  const int abase = warp_m * WM + lane_m * VW;
  const int bbase = warp_n * WN + lane_n * VW;

  __local float alm[(DB + 1) * KWG * ALD] __attribute__((aligned(16)));
  __local float blm[(DB + 1) * KWG * BLD] __attribute__((aligned(16)));
  floatA areg[A_LOADS];
  floatB breg[B_LOADS];
  float apm[2][TM];
  float bpm[2][TN];
  float cpm[TM][TN];
  #pragma unroll
  for (int mi = 0; mi < TM; ++mi) {
    #pragma unroll
    for (int ni = 0; ni < TN; ++ni) { cpm[mi][ni] = 0.0f; }
  }

  // The tile's corner in A and B, so that the K loop only moves two pointers and counts K down:
  // rows/columns are then relative to the tile (edges: mleft = M - m0, nleft = N - n0, kleft).
  #if TRANS_A
    agm += m0;
  #else
    agm += (long)m0 * lda;
  #endif
  #if TRANS_B
    bgm += (long)n0 * ldb;
  #else
    bgm += n0;
  #endif
  const int mleft = M - m0;
  const int nleft = N - n0;

  // Prologue: tile 0 into local buffer 0 and the fragments of its first k step into registers.
  GlobalToPrivateA(agm, areg, tid, 0, 0, mleft, K, lda);
  GlobalToPrivateB(bgm, breg, tid, 0, 0, nleft, K, ldb);
  PrivateToLocalA(areg, alm, tid);
  PrivateToLocalB(breg, blm, tid);
  barrier(CLK_LOCAL_MEM_FENCE);
  LocalToPrivateA(alm, apm[0], abase, 0);
  LocalToPrivateB(blm, bpm[0], bbase, 0);

  // Per K tile: fetch the next tile into registers, multiply k steps 0 .. KWG-2 reading the fragments
  // of step k+1 before the FMAs of step k; then store the next tile into local memory (the other
  // buffer with DB, else the same after a barrier), barrier, read the next tile's first fragments,
  // and do the last k step. The last tile also "fetches" a tile past K: every load of it is outside
  // the matrix, so it reads nothing and stores zeros, which keeps every barrier unconditional.
  const int tiles = (K + KWG - 1) / KWG;
  for (int t = 0; t < tiles; ++t) {
    #if DB
      const int cur = (t & 1) * KWG;
      const int nxt = KWG - cur;
    #else
      const int cur = 0;
      const int nxt = 0;
    #endif
    const __local float* acur = alm + cur * ALD;
    const __local float* bcur = blm + cur * BLD;
    #if TRANS_A
      agm += KWG * lda;
    #else
      agm += KWG;
    #endif
    #if TRANS_B
      bgm += KWG;
    #else
      bgm += KWG * ldb;
    #endif
    const int kleft = K - (t + 1) * KWG;   // K left from the next tile on (<= 0 past the end)
    GlobalToPrivateA(agm, areg, tid, 0, 0, mleft, kleft, lda);
    GlobalToPrivateB(bgm, breg, tid, 0, 0, nleft, kleft, ldb);

    #pragma unroll
    for (int k = 0; k < KWG - 1; ++k) {
      LocalToPrivateA(acur, apm[(k + 1) & 1], abase, k + 1);
      LocalToPrivateB(bcur, bpm[(k + 1) & 1], bbase, k + 1);
      MultiplyStep(cpm, apm[k & 1], bpm[k & 1]);
    }
    #if DB == 0
      barrier(CLK_LOCAL_MEM_FENCE);   // every thread is done reading the single buffer
    #endif
    PrivateToLocalA(areg, alm + nxt * ALD, tid);
    PrivateToLocalB(breg, blm + nxt * BLD, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    LocalToPrivateA(alm + nxt * ALD, apm[0], abase, 0);   // KWG is even: the last step uses slot 1
    LocalToPrivateB(blm + nxt * BLD, bpm[0], bbase, 0);
    MultiplyStep(cpm, apm[1], bpm[1]);
  }

  PrivateToGlobalC(cpm, cgm, m0 + abase, n0 + bbase, M, N, ldc, alpha, beta);
}
