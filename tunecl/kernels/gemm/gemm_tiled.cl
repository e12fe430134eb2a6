// gemm_tiled.cl — gemm_tiled: C = alpha * op(A) * op(B) + beta * C, fp32, row-major (like torch).
//
// Layout. A is M x K (lda >= K) or, with TRANS_A, K x M (lda >= M); B is K x N (ldb >= N) or, with
// TRANS_B, N x K (ldb >= K); C is M x N (ldc >= N). Leading dimensions are row strides in elements.
// Matrix b of a batch starts at buffer + offset + b * stride (elements; a stride of 0 broadcasts).
// Any M, N, K >= 1: loads outside the matrices read zeros and stores outside are skipped, so the
// caller never pads. beta == 0 never reads C (it may hold NaN garbage).
//
// Decomposition (CLBlast's Xgemm, written for row-major data and transposes in the kernel).
// A work-group of NDIMC x MDIMC threads (dimension 0 runs along N so that neighbouring threads store
// neighbouring C elements) computes one MWG x NWG tile of C; each thread owns MWI x NWI = (MWG/MDIMC)
// x (NWG/NDIMC) outputs in registers (cpm). K is walked in KWG-deep tiles: the A tile (MWG x KWG) and
// the B tile (KWG x NWG) are copied to local memory by all threads with VWA/VWB-wide vector loads,
// re-shaped as MDIMA x KDIMA (NDIMB x KDIMB) threads so that neighbouring threads read neighbouring
// addresses whatever the transposition; both tiles are stored K-major (alm[k][m], blm[k][n]) so the
// inner loop reads VWM/VWN-wide vectors along M and N and does an outer-product update.
// Grid: dimension 0 = N tiles, 1 = M tiles, 2 = batch (x SPLITK); GM re-orders the work-groups in
// bands.
//
// Split K (SPLITK > 1, for outputs with too few tiles to fill the device): SPLITK work-groups per C
// tile, slice s of the K range (whole KWG steps, KCHUNK = KWG * ceil(ceil(K / SPLITK) / KWG) each;
// trailing slices may be short or empty) along grid dimension 2 = SPLITK x batch, slice-major. The
// host then passes the plan's workspace as "C" (offset 0, ldc = N rounded up to 4, stride M * ldc,
// alpha 1, beta 0): slice s of matrix b writes its raw partial sums to workspace matrix
// s * batch + b. gemm_splitk_reduce then adds the SPLITK partial sums of each output in the fixed
// order s = 0, 1, ... (bit-identical run to run, no atomics) and applies alpha and beta: C is read
// once (beta != 0 only) and written once. With SPLITK_FINISH the kernel gets the real C (and alpha,
// beta) as six more arguments, and the last work-group of each C tile does that reduction itself
// (split_finish.cl: a counter per tile after the workspace's matrices), the same sums in the same order.
//
// Variants (named #if branches; the host passes -DNAME=VALUE):
//   SA / SB      1: stage the A / B tile in local memory; 0: each thread reads its values from global
//                memory (caches do the sharing).
//   DB           1: double-buffered local memory; the next tile is fetched into registers while the
//                current one is multiplied, one barrier per tile. 0: load, barrier, multiply, barrier.
//   ASYNC        0: copies through registers (DB above). 2, 3, 4: cp.async (PTX, devices whose probe
//                granted "cp_async") copies global memory straight into ASYNC local buffers: the
//                copies of the next ASYNC - 1 tiles are in flight while one is multiplied, no
//                registers held, matrix edges by cp.async's zero fill; one barrier per tile. Each
//                staged tile must be copied as it lies: A stored K x M (TRANS_A), B stored K x N (not
//                TRANS_B); the host transposes an operand stored the other way first.
//   ASYNC_STUB   host-internal, for tests on devices without cp.async: plain copies instead of PTX.
//   STRM / STRN  0: a thread's outputs are contiguous along M / N; 1: its vectors are strided by
//                MDIMC*VWM / NDIMC*VWN (neighbouring threads read neighbouring local memory).
//   PAD          1: local rows are padded by one vector (against bank conflicts of the transposed
//                stores).
//   RWGS         1: declare reqd_work_group_size (NVIDIA then ignores -cl-nv-maxrregcount).
//   TRANS_A/B    problem layout, set by the host from the problem (not tuned).
//   SPLITK       work-groups along K per C tile (1: the plain kernel, no workspace, one launch).
//   SPLITK_FINISH host-set, with SPLITK > 1: 1 = the last work-group of a tile adds the partial sums
//                (one launch; the kernel takes C, c_offset, ldc, stride_c, alpha, beta after the
//                workspace's arguments); 0 = gemm_splitk_reduce does (a second launch).
//   SUM_BATCH    host-set: 1 = one output matrix, the sum over the batch: C = alpha * sum_b op(A_b) op(B_b)
//                + beta * C (a convolution's weight gradient over a chunk of images). Every matrix b (and
//                K slice) writes its raw products to the workspace as with split K, and the last
//                work-group of each C tile adds them, b = 0, 1, ... outside, s = 0, 1, ... inside, and
//                writes C (the same six finishing arguments; stride_c of the real C is unused).
//   STREAMK      > 0: also compile gemm_streamk + gemm_streamk_fixup (a stream-K tail for outputs whose
//                tiles leave the last wave part-empty; see there). 0: gemm_tiled only.
//   CSCALAR      host-internal: 1 = scalar C accesses, for C offsets/ldc that are not VWN-aligned.
// Global vector loads dereference floatN pointers (what makes the compiler emit 128-bit loads), so
// they need aligned addresses: the host compiles VWA=1 / VWB=1 / CSCALAR=1 variants for calls whose
// offset, leading dimension or batch stride is not a multiple of the vector width.

// ---- problem layout (from the problem, not tuned) -----------------------------------------------
#include "gemm_arguments.cl"  // TRANS_A, TRANS_B, GEMM_ARGUMENTS, GEMM_BATCH_OFFSETS

// ---- tunables ------------------------------------------------------------------------------------
#ifndef MWG
  #define MWG 64      // tile size in M per work-group: 16 .. 256
#endif
#ifndef NWG
  #define NWG 64      // tile size in N per work-group: 16 .. 256
#endif
#ifndef KWG
  #define KWG 16      // depth in K of one tile step (local-memory tile): 8, 16, 32
#endif
#ifndef MDIMC
  #define MDIMC 16    // threads per work-group along M (compute layout)
#endif
#ifndef NDIMC
  #define NDIMC 16    // threads per work-group along N (compute layout)
#endif
#ifndef MDIMA
  #define MDIMA 64    // threads along M when loading the A tile (KDIMA = MDIMC*NDIMC/MDIMA along K)
#endif
#ifndef NDIMB
  #define NDIMB 16    // threads along N when loading the B tile (KDIMB = MDIMC*NDIMC/NDIMB along K)
#endif
#ifndef KWI
  #define KWI 2       // unroll factor of the k loop inside a tile (divides KWG)
#endif
#ifndef VWM
  #define VWM 4       // vector width along M of local-to-private reads of A: 1, 2, 4 (8)
#endif
#ifndef VWN
  #define VWN 4       // vector width along N of local-to-private reads of B and of C accesses
#endif
#ifndef VWA
  #define VWA 4       // vector width of global loads of A along its contiguous dim (K; M if TRANS_A)
#endif
#ifndef VWB
  #define VWB 4       // vector width of global loads of B along its contiguous dim (N; K if TRANS_B)
#endif
#ifndef STRM
  #define STRM 0      // 0 = a thread's M vectors are contiguous, 1 = strided by MDIMC*VWM
#endif
#ifndef STRN
  #define STRN 0      // 0 = a thread's N vectors are contiguous, 1 = strided by NDIMC*VWN
#endif
#ifndef SA
  #define SA 1        // 1 = stage A tiles in local memory, 0 = read A from global memory directly
#endif
#ifndef SB
  #define SB 1        // 1 = stage B tiles in local memory, 0 = read B from global memory directly
#endif
#ifndef DB
  #define DB 0        // 1 = double-buffered local memory with register prefetch of the next tile
#endif
#ifndef PAD
  #define PAD 0       // 1 = pad each local-memory row by one vector against bank conflicts
#endif
#ifndef GM
  #define GM 1        // work-group order: bands of GM tile rows along M (1 = plain row-by-row)
#endif
#include "gemm_common.cl"  // gemm_tile_of_group()
#ifndef RWGS
  #define RWGS 0      // 1 = declare reqd_work_group_size(NDIMC, MDIMC, 1)
#endif
#ifndef SPLITK_FINISH
  #define SPLITK_FINISH 0
#endif
#ifndef SUM_BATCH
  #define SUM_BATCH 0
#endif
#ifndef SPLITK
  #define SPLITK 1    // work-groups along K per C tile; > 1 writes partial sums to the workspace
#endif
#ifndef CSCALAR
  #define CSCALAR 0   // host-internal: 1 = scalar C accesses (unaligned C offset / ldc / stride)
#endif

// ---- derived (never passed from the host) --------------------------------------------------------
#define WGS (MDIMC * NDIMC)       // threads per work-group
#define MWI (MWG / MDIMC)         // outputs per thread along M
#define NWI (NWG / NDIMC)         // outputs per thread along N
#define KDIMA (WGS / MDIMA)       // threads along K when loading the A tile
#define KDIMB (WGS / NDIMB)       // threads along K when loading the B tile
#define MAX2(a, b) ((a) > (b) ? (a) : (b))

#if TRANS_A                        // A tile: vectors along M
  #define A_LOAD_M (MWG / (MDIMA * VWA))   // vectors per thread along M
  #define A_LOAD_K (KWG / KDIMA)           // vectors per thread along K
  #define ALD (MWG + PAD * MAX2(VWM, VWA)) // local row length of the A tile (alm[k][m])
#else                              // A tile: vectors along K, stored transposed
  #define A_LOAD_M (MWG / MDIMA)
  #define A_LOAD_K (KWG / (KDIMA * VWA))
  #define ALD (MWG + PAD * VWM)
#endif
#if TRANS_B                        // B tile: vectors along K, stored transposed
  #define B_LOAD_N (NWG / NDIMB)
  #define B_LOAD_K (KWG / (KDIMB * VWB))
  #define BLD (NWG + PAD * VWN)
#else                              // B tile: vectors along N
  #define B_LOAD_N (NWG / (NDIMB * VWB))
  #define B_LOAD_K (KWG / KDIMB)
  #define BLD (NWG + PAD * MAX2(VWN, VWB))
#endif
#define A_LOADS (A_LOAD_M * A_LOAD_K)     // vectors of the A tile per thread
#define B_LOADS (B_LOAD_N * B_LOAD_K)     // vectors of the B tile per thread

// Vector types by width; a union with a float array reads and writes lanes with constant indices.
#define VTYPE_1 float
#define VTYPE_2 float2
#define VTYPE_4 float4
#define VTYPE_8 float8
#define VTYPE_(w) VTYPE_##w
#define VTYPE(w) VTYPE_(w)
typedef VTYPE(VWA) floatA;
typedef VTYPE(VWB) floatB;
typedef VTYPE(VWM) floatM;
typedef VTYPE(VWN) floatN;
typedef union { floatA v; float s[VWA]; } vecA;
typedef union { floatB v; float s[VWB]; } vecB;
typedef union { floatM v; float s[VWM]; } vecM;
typedef union { floatN v; float s[VWN]; } vecN;

// ---- global memory -> registers -> local memory (staged tiles) ---------------------------------

// GlobalToPrivateVecA (B): VWA (VWB) elements of a row of A (B); zeros outside the matrix.
#include "gemm_vector_loads.cl"  // GLOBAL_TO_PRIVATE_VEC
GLOBAL_TO_PRIVATE_VEC(GlobalToPrivateVecA, floatA, vecA, VWA, float, agm, AT, 0.0f)
GLOBAL_TO_PRIVATE_VEC(GlobalToPrivateVecB, floatB, vecB, VWB, float, bgm, AT, 0.0f)

// The loaders of operand X (A or B) with x its lower-case name and mn (MN) its M or N side: this thread's
// coordinates mnx, kx in the loading layout (MNDIMX x KDIMX threads; neighbouring threads take neighbouring
// vectors along the stored rows), and vector (i, j) of its X_LOAD_MN x X_LOAD_K vectors at (mn, k).
// A tile stored with rows along M (A: TRANS_A; B: not TRANS_B) is loaded in vectors along M (N); one with
// rows along K in vectors along K, stored transposed (K-major) in local memory.
#define THREADS_ALONG_MN(X, x, mn, MN) const int mn##x = tid % MN##DIM##X, k##x = tid / MN##DIM##X;
#define THREADS_ALONG_K(X, x, mn, MN) const int k##x = tid % KDIM##X, mn##x = tid / KDIM##X;
#define GLOBAL_ALONG_MN(X, x, mn, MN)                                                               \
  const int mn = mn##0 + (mn##x + i * MN##DIM##X) * VW##X;                                        \
  const int k = k0 + k##x + j * KDIM##X;                                                          \
  x##reg[i * X##_LOAD_K + j] = GlobalToPrivateVec##X(x##gm, k, mn, ld##x, K, MN);
#define GLOBAL_ALONG_K(X, x, mn, MN)                                                                \
  const int mn = mn##0 + mn##x + i * MN##DIM##X;                                                  \
  const int k = k0 + (k##x + j * KDIM##X) * VW##X;                                                \
  x##reg[i * X##_LOAD_K + j] = GlobalToPrivateVec##X(x##gm, mn, k, ld##x, MN, K);
#define LOCAL_ALONG_MN(X, x, mn, MN)                                                                \
  const int mn = (mn##x + i * MN##DIM##X) * VW##X;                                                \
  const int k = k##x + j * KDIM##X;                                                               \
  *((__local float##X*)(x##lm + k * X##LD + mn)) = x##reg[i * X##_LOAD_K + j];
#define LOCAL_ALONG_K(X, x, mn, MN)                                                                 \
  const int mn = mn##x + i * MN##DIM##X;                                                          \
  const int k = (k##x + j * KDIM##X) * VW##X;                                                     \
  vec##X u;                                                                                       \
  u.v = x##reg[i * X##_LOAD_K + j];                                                               \
  _Pragma("unroll")                                                                               \
  for (int e = 0; e < VW##X; ++e) { x##lm[(k + e) * X##LD + mn] = u.s[e]; }
#if TRANS_A
  #define A_THREADS THREADS_ALONG_MN
  #define A_GLOBAL GLOBAL_ALONG_MN
  #define A_LOCAL LOCAL_ALONG_MN
#else
  #define A_THREADS THREADS_ALONG_K
  #define A_GLOBAL GLOBAL_ALONG_K
  #define A_LOCAL LOCAL_ALONG_K
#endif
#if TRANS_B
  #define B_THREADS THREADS_ALONG_K
  #define B_GLOBAL GLOBAL_ALONG_K
  #define B_LOCAL LOCAL_ALONG_K
#else
  #define B_THREADS THREADS_ALONG_MN
  #define B_GLOBAL GLOBAL_ALONG_MN
  #define B_LOCAL LOCAL_ALONG_MN
#endif
// The loops over this thread's vectors of the X tile, with `body` (X_GLOBAL or X_LOCAL) for each.
#define FOR_TILE_VECTORS(X, x, mn, MN, body)                                                        \
  X##_THREADS(X, x, mn, MN)                                                                       \
  _Pragma("unroll")                                                                               \
  for (int i = 0; i < X##_LOAD_##MN; ++i) {                                                       \
    _Pragma("unroll")                                                                             \
    for (int j = 0; j < X##_LOAD_K; ++j) {                                                        \
      body(X, x, mn, MN)                                                                          \
    }                                                                                             \
  }

// GlobalToPrivateA (B): the A tile at (m0, k0) (the B tile at (k0, n0)) into this thread's registers
// (its A_LOADS (B_LOADS) vectors of the tile).
#define GLOBAL_TO_PRIVATE(X, x, mn, MN)                                                             \
  void GlobalToPrivate##X(const __global float* restrict x##gm, float##X x##reg[X##_LOADS], const int tid, \
                          const int mn##0, const int k0, const int MN, const int K, const int ld##x) { \
    FOR_TILE_VECTORS(X, x, mn, MN, X##_GLOBAL)                                                    \
  }
// PrivateToLocalA (B): this thread's vectors of the A (B) tile into local memory, K-major
// (alm[k * ALD + m], blm[k * BLD + n]).
#define PRIVATE_TO_LOCAL(X, x, mn, MN)                                                              \
  void PrivateToLocal##X(const float##X x##reg[X##_LOADS], __local float* x##lm, const int tid) {  \
    FOR_TILE_VECTORS(X, x, mn, MN, X##_LOCAL)                                                     \
  }

#if SA
GLOBAL_TO_PRIVATE(A, a, m, M)
PRIVATE_TO_LOCAL(A, a, m, M)
#endif
#if SB
GLOBAL_TO_PRIVATE(B, b, n, N)
PRIVATE_TO_LOCAL(B, b, n, N)
#endif

// ---- global memory -> local memory with cp.async (ASYNC) ------------------------------------------

#ifndef ASYNC
  #define ASYNC 0     // local buffers filled by cp.async: 0 (registers instead), 2, 3, 4
#endif
#ifndef ASYNC_STUB
  #define ASYNC_STUB 0  // host-internal: 1 = plain copies instead of cp.async
#endif
#if ASYNC
#if (SA && !TRANS_A) || (SB && TRANS_B)
  #error "ASYNC copies tiles as they lie: A stored K x M (TRANS_A), B stored K x N"
#endif
#if ASYNC < 2 || ASYNC > 4
  #error "ASYNC is 0, 2, 3 or 4"
#endif
#define CP_ASYNC_STUB ASYNC_STUB
#include "cp_async.cl"  // CpAsync, CpAsyncCommit, CpAsyncWait

// Copy `width` floats (1, 2, 4) of row `row` from column `col` to lm[off]; elements outside rows x
// cols become zeros (cp.async copies `bytes` from the source and zero-fills the rest). cp.async takes
// the .shared address of the destination: the integer value of the __local pointer.
void AsyncCopy(__local float* lm, const int off, const __global float* restrict src, const int row,
               const int col, const int ld, const int rows, const int cols, const int width) {
  const int inside = row < rows ? clamp(cols - col, 0, width) : 0;
  const __global float* from = inside ? src + row * ld + col : src;
  #if ASYNC_STUB
    for (int e = 0; e < width; ++e) { lm[off + e] = e < inside ? from[e] : 0.0f; }
  #else
    CpAsync((uint)(size_t)(lm + off), from, 4 * width, 4 * inside);
  #endif
}

// Vector (i, j) of this thread's part of the X tile (stored with rows along M / N, as ASYNC needs) into
// buffer `buf`.
#define ASYNC_COPY(X, x, mn, MN)                                                                    \
  const int mn = (mn##x + i * MN##DIM##X) * VW##X;                                                \
  const int k = k##x + j * KDIM##X;                                                               \
  AsyncCopy(x##lm, buf * (KWG * X##LD) + k * X##LD + mn, x##gm, k0 + k, mn##0 + mn, ld##x, K, MN, VW##X);

// Start copying tile step k0 of the staged operands into buffer `buf`: this thread's vectors, laid out
// as GlobalToPrivateA/B lay them out (A rows along M, B rows along N).
void GlobalToLocalAsync(const __global float* restrict agm, const __global float* restrict bgm,
                        __local float* alm, __local float* blm, const int buf, const int tid,
                        const int m0, const int n0, const int k0, const int M, const int N, const int K,
                        const int lda, const int ldb) {
  #if SA
    FOR_TILE_VECTORS(A, a, m, M, ASYNC_COPY)
  #endif
  #if SB
    FOR_TILE_VECTORS(B, b, n, N, ASYNC_COPY)
  #endif
}
#endif  // ASYNC

// ---- per-thread output coordinates --------------------------------------------------------------

// Offset inside the tile of this thread's v-th VWM-vector along M (STRM) / VWN-vector along N (STRN).
#if STRM == 0
  #define M_OF(tm, v) (((tm) * (MWI / VWM) + (v)) * VWM)
#else
  #define M_OF(tm, v) (((tm) + (v) * MDIMC) * VWM)
#endif
#if STRN == 0
  #define N_OF(tn, v) (((tn) * (NWI / VWN) + (v)) * VWN)
#else
  #define N_OF(tn, v) (((tn) + (v) * NDIMC) * VWN)
#endif

// ---- operands of one k step into registers -------------------------------------------------------

// The element (mn, k) of op(X) in global memory: A_ELEMENT(m, k), B_ELEMENT(n, k).
#if TRANS_A
  #define A_ELEMENT(m, k) AT(agm, k, m, lda)
#else
  #define A_ELEMENT(m, k) AT(agm, m, k, lda)
#endif
#if TRANS_B
  #define B_ELEMENT(n, k) AT(bgm, n, k, ldb)
#else
  #define B_ELEMENT(n, k) AT(bgm, k, n, ldb)
#endif

// LocalToPrivateA (B): row k of the local A (B) tile, this thread's MWI (NWI) values.
#define LOCAL_TO_PRIVATE(X, x, mn, MN)                                                              \
  void LocalToPrivate##X(const __local float* x##lm, float x##pm[MN##WI], const int t##mn, const int k) { \
    _Pragma("unroll")                                                                             \
    for (int v = 0; v < MN##WI / VW##MN; ++v) {                                                   \
      vec##MN u;                                                                                  \
      u.v = *((const __local float##MN*)(x##lm + k * X##LD + MN##_OF(t##mn, v)));                 \
      _Pragma("unroll")                                                                           \
      for (int e = 0; e < VW##MN; ++e) { x##pm[v * VW##MN + e] = u.s[e]; }                        \
    }                                                                                             \
  }
// GlobalToPrivateDirectA (B): column k of A (row k of B) straight from global memory (zeros outside
// the matrix).
#define GLOBAL_TO_PRIVATE_DIRECT(X, x, mn, MN)                                                      \
  void GlobalToPrivateDirect##X(const __global float* restrict x##gm, float x##pm[MN##WI], const int t##mn, \
                                const int mn##0, const int k, const int MN, const int K, const int ld##x) { \
    _Pragma("unroll")                                                                             \
    for (int v = 0; v < MN##WI / VW##MN; ++v) {                                                   \
      _Pragma("unroll")                                                                           \
      for (int e = 0; e < VW##MN; ++e) {                                                          \
        const int mn = mn##0 + MN##_OF(t##mn, v) + e;                                             \
        x##pm[v * VW##MN + e] = (mn < MN && k < K) ? X##_ELEMENT(mn, k) : 0.0f;                   \
      }                                                                                           \
    }                                                                                             \
  }

#if SA
LOCAL_TO_PRIVATE(A, a, m, M)
#else
GLOBAL_TO_PRIVATE_DIRECT(A, a, m, M)
#endif
#if SB
LOCAL_TO_PRIVATE(B, b, n, N)
#else
GLOBAL_TO_PRIVATE_DIRECT(B, b, n, N)
#endif

// ---- the multiply ---------------------------------------------------------------------------------

// One KWG-deep tile: cpm += A_tile^T-slices x B_tile-slices, k unrolled by KWI.
void MultiplyTile(float cpm[MWI][NWI],
#if SA
                  const __local float* alm,
#else
                  const __global float* restrict agm, const int m0, const int M, const int lda,
#endif
#if SB
                  const __local float* blm,
#else
                  const __global float* restrict bgm, const int n0, const int N, const int ldb,
#endif
                  const int k0, const int K, const int tm, const int tn) {
  for (int kw = 0; kw < KWG; kw += KWI) {
    #pragma unroll
    for (int ki = 0; ki < KWI; ++ki) {
      const int k = kw + ki;
      float apm[MWI];
      float bpm[NWI];
      #if SA
        LocalToPrivateA(alm, apm, tm, k);
      #else
        GlobalToPrivateDirectA(agm, apm, tm, m0, k0 + k, M, K, lda);
      #endif
      #if SB
        LocalToPrivateB(blm, bpm, tn, k);
      #else
        GlobalToPrivateDirectB(bgm, bpm, tn, n0, k0 + k, N, K, ldb);
      #endif
      #pragma unroll
      for (int mi = 0; mi < MWI; ++mi) {
        #pragma unroll
        for (int ni = 0; ni < NWI; ++ni) {
          cpm[mi][ni] = fma(apm[mi], bpm[ni], cpm[mi][ni]);
        }
      }
    }
  }
}

// ---- registers -> global memory (C) ----------------------------------------------------------------

// C = alpha * cpm + beta * C for this thread's outputs inside the matrix; beta == 0 never reads C.
void PrivateToGlobalC(float cpm[MWI][NWI], __global float* restrict cgm, const int m0,
                      const int n0, const int tm, const int tn, const int M, const int N,
                      const int ldc, const float alpha, const float beta) {
  #pragma unroll
  for (int v = 0; v < MWI / VWM; ++v) {
    #pragma unroll
    for (int e = 0; e < VWM; ++e) {
      const int m = m0 + M_OF(tm, v) + e;
      const int mi = v * VWM + e;
      if (m < M) {
        #pragma unroll
        for (int w = 0; w < NWI / VWN; ++w) {
          const int n = n0 + N_OF(tn, w);
          __global float* crow = cgm + m * ldc;
          #if CSCALAR == 0
          if (n + VWN <= N) {
            vecN r;
            #pragma unroll
            for (int f = 0; f < VWN; ++f) { r.s[f] = alpha * cpm[mi][w * VWN + f]; }
            if (beta != 0.0f) {
              vecN old;
              old.v = *((__global floatN*)(crow + n));
              #pragma unroll
              for (int f = 0; f < VWN; ++f) { r.s[f] = fma(beta, old.s[f], r.s[f]); }
            }
            *((__global floatN*)(crow + n)) = r.v;
          } else
          #endif
          {
            #pragma unroll
            for (int f = 0; f < VWN; ++f) {
              if (n + f < N) {
                float r = alpha * cpm[mi][w * VWN + f];
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

// ---- one K range of one C tile -----------------------------------------------------------------------

#if ASYNC
  #define BUFFERS ASYNC
#else
  #define BUFFERS (DB + 1)
#endif
// The local tiles, declared in each kernel (OpenCL C declares __local arrays at kernel scope only).
#if SA
  #define DECLARE_LOCAL_A __local float alm[BUFFERS * KWG * ALD] __attribute__((aligned(32)));
#else
  #define DECLARE_LOCAL_A __local float* alm = 0;  /* not staged (GlobalToLocalAsync ignores it) */
#endif
#if SB
  #define DECLARE_LOCAL_B __local float blm[BUFFERS * KWG * BLD] __attribute__((aligned(32)));
#else
  #define DECLARE_LOCAL_B __local float* blm = 0;
#endif

// Arguments of MultiplyTile for the staged / direct operands.
#if SA
  #define A_ARGS(buf) alm + (buf) * (KWG * ALD)
#else
  #define A_ARGS(buf) agm, m0, M, lda
#endif
#if SB
  #define B_ARGS(buf) blm + (buf) * (KWG * BLD)
#else
  #define B_ARGS(buf) bgm, n0, N, ldb
#endif

// cpm += the (m0, n0) tile's product over K range [k_begin, k_end) (loads past k_end read zeros). agm
// and bgm point at the batch's matrices. The caller zeroes cpm; a caller that runs several ranges with
// the same local tiles puts a barrier between them.
void MultiplyRange(float cpm[MWI][NWI], const __global float* restrict agm,
                   const __global float* restrict bgm, __local float* alm, __local float* blm,
                   const int tid, const int tm, const int tn, const int m0, const int n0,
                   const int k_begin, const int k_end, const int M, const int N, const int lda,
                   const int ldb) {
  #if SA && !ASYNC
    floatA areg[A_LOADS];
  #endif
  #if SB && !ASYNC
    floatB breg[B_LOADS];
  #endif
  const int tiles = (k_end - k_begin + KWG - 1) / KWG;
  #if ASYNC
    // Prologue: tiles 0 .. ASYNC - 2, one commit group each (committed even when empty, so that "all
    // but the newest ASYNC - 2 groups" always means "up to tile t"). Per step: wait for tile t, one
    // barrier (everyone's copies of t are in; everyone has multiplied t - 1, so its buffer is free),
    // start the copies of tile t + ASYNC - 1 into that buffer, multiply tile t.
    #pragma unroll
    for (int s = 0; s < ASYNC - 1; ++s) {
      if (s < tiles) {
        GlobalToLocalAsync(agm, bgm, alm, blm, s, tid, m0, n0, k_begin + s * KWG, M, N, k_end, lda, ldb);
      }
      CpAsyncCommit();
    }
    for (int t = 0; t < tiles; ++t) {
      CpAsyncWait(ASYNC - 2);  // this thread's copies of tile t have landed (newer ones may not)
      barrier(CLK_LOCAL_MEM_FENCE);
      const int ahead = t + ASYNC - 1;
      if (ahead < tiles) {
        GlobalToLocalAsync(agm, bgm, alm, blm, ahead % ASYNC, tid, m0, n0, k_begin + ahead * KWG, M, N,
                           k_end, lda, ldb);
      }
      CpAsyncCommit();
      MultiplyTile(cpm, A_ARGS(t % ASYNC), B_ARGS(t % ASYNC), k_begin + t * KWG, k_end, tm, tn);
    }
  #elif DB && (SA || SB)
    // Prologue: tile 0 into buffer 0. Then per step: fetch tile t+1 into registers, multiply tile t,
    // store tile t+1 into the other buffer, one barrier (it also protects the buffer read at t-1).
    #if SA
      GlobalToPrivateA(agm, areg, tid, m0, k_begin, M, k_end, lda);
      PrivateToLocalA(areg, alm, tid);
    #endif
    #if SB
      GlobalToPrivateB(bgm, breg, tid, n0, k_begin, N, k_end, ldb);
      PrivateToLocalB(breg, blm, tid);
    #endif
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int t = 0; t < tiles; ++t) {
      const int cur = t & 1;
      const int k0 = k_begin + t * KWG;
      const bool next = t + 1 < tiles;
      if (next) {
        #if SA
          GlobalToPrivateA(agm, areg, tid, m0, k0 + KWG, M, k_end, lda);
        #endif
        #if SB
          GlobalToPrivateB(bgm, breg, tid, n0, k0 + KWG, N, k_end, ldb);
        #endif
      }
      MultiplyTile(cpm, A_ARGS(cur), B_ARGS(cur), k0, k_end, tm, tn);
      if (next) {
        #if SA
          PrivateToLocalA(areg, alm + (cur ^ 1) * (KWG * ALD), tid);
        #endif
        #if SB
          PrivateToLocalB(breg, blm + (cur ^ 1) * (KWG * BLD), tid);
        #endif
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  #else
    for (int t = 0; t < tiles; ++t) {
      const int k0 = k_begin + t * KWG;
      #if SA
        GlobalToPrivateA(agm, areg, tid, m0, k0, M, k_end, lda);
        PrivateToLocalA(areg, alm, tid);
      #endif
      #if SB
        GlobalToPrivateB(bgm, breg, tid, n0, k0, N, k_end, ldb);
        PrivateToLocalB(breg, blm, tid);
      #endif
      #if SA || SB
        barrier(CLK_LOCAL_MEM_FENCE);
      #endif
      MultiplyTile(cpm, A_ARGS(0), B_ARGS(0), k0, k_end, tm, tn);
      #if SA || SB
        barrier(CLK_LOCAL_MEM_FENCE);
      #endif
    }
  #endif
}

void ZeroC(float cpm[MWI][NWI]) {
  #pragma unroll
  for (int mi = 0; mi < MWI; ++mi) {
    #pragma unroll
    for (int ni = 0; ni < NWI; ++ni) { cpm[mi][ni] = 0.0f; }
  }
}

// ---- the kernels ------------------------------------------------------------------------------------

#if RWGS
  #define WORK_GROUP_SIZE __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
#else
  #define WORK_GROUP_SIZE
#endif
#define FINISHES ((SPLITK > 1 && SPLITK_FINISH) || SUM_BATCH)
#if FINISHES
  #include "split_finish.cl"  // split_last, split_part
  #define FINISH_ARGUMENTS , __global float* restrict outgm, const long out_offset, const int ldo, \
                             const long stride_o, const float out_alpha, const float out_beta
#else
  #define FINISH_ARGUMENTS
#endif
__kernel WORK_GROUP_SIZE void gemm_tiled(GEMM_ARGUMENTS(float, float) FINISH_ARGUMENTS) {
  #if FINISHES
    __local int last_flm;
    __global float* const wsgm = cgm + c_offset;   // workspace matrix z at wsgm + z * stride_c
  #endif
  #if SPLITK == 1
    const long batch = get_group_id(2);
    #if SUM_BATCH
      const int batches = get_num_groups(2);
    #endif
    const int k_begin = 0;
    const int k_end = K;
  #else
    // Slice-major: group z = slice * batches + batch; its partial C is workspace matrix z.
    const int batches = get_num_groups(2) / SPLITK;
    const int slice = get_group_id(2) / batches;
    const long batch = get_group_id(2) - slice * batches;
    const int kchunk = ((K + SPLITK - 1) / SPLITK + KWG - 1) / KWG * KWG;
    const int k_begin = min(K, slice * kchunk);
    const int k_end = min(K, k_begin + kchunk);
  #endif
  agm += a_offset + batch * stride_a;
  bgm += b_offset + batch * stride_b;
  #if SPLITK == 1
    cgm += c_offset + batch * stride_c;
  #else
    cgm += c_offset + get_group_id(2) * stride_c;
  #endif

  const int2 tile = gemm_tile_of_group();  // gemm_common.cl: plain or GM-banded order
  const int m0 = tile.x * MWG;
  const int n0 = tile.y * NWG;
  const int tn = get_local_id(0);
  const int tm = get_local_id(1);
  const int tid = tm * NDIMC + tn;
  DECLARE_LOCAL_A
  DECLARE_LOCAL_B

  float cpm[MWI][NWI];
  ZeroC(cpm);
  MultiplyRange(cpm, agm, bgm, alm, blm, tid, tm, tn, m0, n0, k_begin, k_end, M, N, lda, ldb);
  PrivateToGlobalC(cpm, cgm, m0, n0, tm, tn, M, N, ldc, alpha, beta);
  #if FINISHES
    // The tile's last work-group: gemm_splitk_reduce's sums for the tile's outputs (ldc, stride_c: the
    // workspace's), one output per work-item in turn; the counters follow the workspace's matrices.
    // With SUM_BATCH the tile's parts are all its work-groups along dimension 2, one counter per tile.
    #if SUM_BATCH
      __global int* counter = (__global int*)(wsgm + get_num_groups(2) * stride_c)
                              + get_group_id(1) * get_num_groups(0) + get_group_id(0);
    #else
      __global int* counter = (__global int*)(wsgm + get_num_groups(2) * stride_c)
                              + (batch * get_num_groups(1) + get_group_id(1)) * get_num_groups(0) + get_group_id(0);
    #endif
    if (split_last(counter, &last_flm, SUM_BATCH ? (int)get_num_groups(2) : SPLITK)) {
      const long slice_stride = batches * stride_c;
      for (int e = tid; e < MWG * NWG; e += MDIMC * NDIMC) {
        const int m = m0 + e / NWG;
        const int n = n0 + e % NWG;
        if (m < M && n < N) {
          #if SUM_BATCH
            // gemm_splitk_reduce's sum of each matrix, then split_reduce's over the matrices
            float sum = 0.0f;
            for (int b = 0; b < batches; ++b) {
              const __global float* w = wsgm + b * stride_c + (long)m * ldc + n;
              float part = split_part(w, 0);
              for (int s = 1; s < SPLITK; ++s) { part += split_part(w, s * slice_stride); }
              sum += part;
            }
            __global float* c = outgm + out_offset + (long)m * ldo + n;
          #else
            const __global float* w = wsgm + batch * stride_c + (long)m * ldc + n;
            float sum = split_part(w, 0);
            for (int s = 1; s < SPLITK; ++s) { sum += split_part(w, s * slice_stride); }
            __global float* c = outgm + out_offset + batch * stride_o + (long)m * ldo + n;
          #endif
          float r = out_alpha * sum;
          if (out_beta != 0.0f) { r = fma(out_beta, *c, r); }
          *c = r;
        }
      }
    }
  #endif
}

#ifndef STREAMK
  #define STREAMK 0   // work-groups per compute unit of the stream-K tail (0: no gemm_streamk)
#endif
#if STREAMK
// Stream-K (for outputs whose tiles leave the last wave of work-groups part-empty). The work is
// tiles x steps k steps (KWG deep), the tiles in gemm_tile_of_index order, batch-major. A 1-D grid of
// dp_tiles + G work-groups: group g < dp_tiles computes tile g whole (data-parallel, as gemm_tiled);
// the G stream-K groups share the k steps of the remaining tiles evenly, group j taking steps
// [base + j * S / G, base + (j + 1) * S / G) of them (base = dp_tiles * steps, S = what is left). The
// host makes dp_tiles a multiple of G (the whole waves), so fewer than G tiles are left and a group's
// steps touch at most two tiles: its first segment, and a second one in the next tile. A segment that
// is a whole tile goes to C; a part of a tile goes to the workspace as raw partial sums (MWG x NWG
// floats, rows of NWG): slot 2j for group j's first segment, 2j + 1 for its second.
// gemm_streamk_fixup then adds the parts of each split tile in group order (bit-identical run to run,
// no atomics, no waiting between work-groups) and applies alpha and beta. The host picks G = STREAMK x
// compute units, the work-groups resident at once, so that the stream-K groups share the last wave.
// Registers matter: on the H200, gemm_tiled's 4096^3 winner uses 119 (two work-groups per SM); looping
// over the segments took 168 and writing both out 136 (one work-group per SM), so the second segment's
// range goes through local memory (123).

// One segment: tile t's k steps [kb, ke), into C if whole, else into workspace slot `slot`.
void StreamKSegment(const int t, const int kb, const int ke, const int slot, const int M, const int N,
                    const int K, const float alpha, const float beta,
                    const __global float* restrict agm, const int lda, const long stride_a,
                    const __global float* restrict bgm, const int ldb, const long stride_b,
                    __global float* restrict cgm, const int ldc, const long stride_c,
                    __global float* restrict wgm, __local float* alm, __local float* blm,
                    const int tid, const int tm, const int tn) {
  const int ngm = (M + MWG - 1) / MWG;
  const int ngn = (N + NWG - 1) / NWG;
  const int steps = (K + KWG - 1) / KWG;
  const int batch = t / (ngm * ngn);
  const int2 tile = gemm_tile_of_index(t - batch * (ngm * ngn), ngm, ngn);
  const int m0 = tile.x * MWG;
  const int n0 = tile.y * NWG;
  float cpm[MWI][NWI];
  ZeroC(cpm);
  MultiplyRange(cpm, agm + batch * stride_a, bgm + batch * stride_b, alm, blm, tid, tm, tn, m0, n0,
                kb * KWG, min(K, ke * KWG), M, N, lda, ldb);
  const bool whole = kb == 0 && ke == steps;
  if (kb < ke) {  // an empty segment stores nothing
    PrivateToGlobalC(cpm, whole ? cgm + batch * stride_c : wgm + (long)slot * (MWG * NWG), whole ? m0 : 0,
                     whole ? n0 : 0, tm, tn, whole ? M : MWG, whole ? N : NWG, whole ? ldc : NWG,
                     whole ? alpha : 1.0f, whole ? beta : 0.0f);
  }
}

__kernel WORK_GROUP_SIZE void gemm_streamk(GEMM_ARGUMENTS(float, float), __global float* restrict wgm,
                                           const int batches, const int dp_tiles) {
  const int steps = (K + KWG - 1) / KWG;
  const int group = get_group_id(0);
  int begin, end;  // this group's k steps, counted over all tiles
  if (group < dp_tiles) {
    begin = group * steps;
    end = begin + steps;
  } else {
    const int j = group - dp_tiles;
    const int sk_groups = get_num_groups(0) - dp_tiles;
    const int per_matrix = ((M + MWG - 1) / MWG) * ((N + NWG - 1) / NWG);
    const long left = (long)(per_matrix * batches - dp_tiles) * steps;
    begin = dp_tiles * steps + (int)(j * left / sk_groups);
    end = dp_tiles * steps + (int)((j + 1) * left / sk_groups);
  }
  const int tn = get_local_id(0);
  const int tm = get_local_id(1);
  const int tid = tm * NDIMC + tn;
  DECLARE_LOCAL_A
  DECLARE_LOCAL_B
  agm += a_offset;
  bgm += b_offset;
  cgm += c_offset;
  // The second segment's steps go through local memory, so that nothing of it is computed ahead and
  // kept in registers through the first.
  __local int second[2];
  // A stream-K group without steps (fewer steps than groups) runs an empty segment of a valid tile: PoCL
  // 3.1 computed wrong results and corrupted its heap with this segment's barriers under an `if`.
  const int t = min(begin / steps, ((M + MWG - 1) / MWG) * ((N + NWG - 1) / NWG) * batches - 1);
  const int first_end = min(end, (t + 1) * steps);  // the end of begin's tile, or of the range
  if (tid == 0) {
    second[0] = first_end;
    second[1] = end;
  }
  StreamKSegment(t, begin - t * steps, first_end - t * steps, 2 * (group - dp_tiles), M, N, K, alpha, beta,
                 agm, lda, stride_a, bgm, ldb, stride_b, cgm, ldc, stride_c, wgm, alm, blm, tid, tm, tn);
  barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the first segment's local tiles
  const int from = second[0];
  const int to = second[1];
  if (from < to) {  // the rest of the group's steps: the start of the next tile
    StreamKSegment(from / steps, 0, to - from, 2 * (group - dp_tiles) + 1, M, N, K, alpha, beta, agm, lda,
                   stride_a, bgm, ldb, stride_b, cgm, ldc, stride_c, wgm, alm, blm, tid, tm, tn);
  }
}

// C = alpha * (the sum of a split tile's parts) + beta * C, four neighbouring outputs of a row per
// thread: thread i handles outputs 4 (i mod Q) .. + 3 of tile dp_tiles + i / Q (Q = MWG * NWG / 4, the
// tile's rows of NWG one after the other), so that the parts are read as float4 and the threads of a
// work-group cover a contiguous stretch of the workspace. A tile that one group computed whole is
// already in C: its threads do nothing. (One work-group per tile, each thread walking 64 outputs, took
// 0.09-0.27 ms on the H200 after a 4096^3 product; this takes 0.008-0.025.)
__kernel void gemm_streamk_fixup(const int M, const int N, const int K, const float alpha, const float beta,
                                 const __global float* restrict wgm, const int batches, const int dp_tiles,
                                 const int sk_groups, __global float* restrict cgm, const long c_offset,
                                 const int ldc, const long stride_c) {
  const int ngm = (M + MWG - 1) / MWG;
  const int ngn = (N + NWG - 1) / NWG;
  const int per_matrix = ngm * ngn;
  const int steps = (K + KWG - 1) / KWG;
  const int quads = MWG * NWG / 4;
  const int i = get_global_id(0);
  const int left_tiles = per_matrix * batches - dp_tiles;
  if (i >= left_tiles * quads) {
    return;
  }
  const int t = dp_tiles + i / quads;
  const int e = 4 * (i % quads);  // the first of this thread's outputs inside the tile
  const long left = (long)left_tiles * steps;
  const int first = (t - dp_tiles) * steps;  // the tile's k steps, counted from the stream-K base
  const int last = first + steps - 1;
  // The group holding step x is the largest j with j * left / sk_groups <= x.
  const int j_lo = (int)(((long)(first + 1) * sk_groups - 1) / left);
  const int j_hi = (int)(((long)(last + 1) * sk_groups - 1) / left);
  if (j_lo == j_hi) {
    return;
  }
  float4 sum = (float4)(0.0f);
  for (int j = j_lo; j <= j_hi; ++j) {
    const int jb = (int)(j * left / sk_groups);
    if (jb == (int)((j + 1) * left / sk_groups)) {
      continue;  // a group without steps wrote nothing
    }
    const long slot = 2 * (long)j + (jb < first);  // the group's first segment, or its second
    sum += *((const __global float4*)(wgm + slot * (MWG * NWG) + e));
  }
  const int batch = t / per_matrix;
  const int2 tile = gemm_tile_of_index(t - batch * per_matrix, ngm, ngn);
  const int m = tile.x * MWG + e / NWG;
  const int n = tile.y * NWG + e % NWG;
  if (m < M) {
    __global float* c = cgm + c_offset + batch * stride_c + (long)m * ldc;
    const float r[4] = {sum.x, sum.y, sum.z, sum.w};
    #pragma unroll
    for (int f = 0; f < 4; ++f) {
      if (n + f < N) {
        float v = alpha * r[f];
        if (beta != 0.0f) { v = fma(beta, c[n + f], v); }
        c[n + f] = v;
      }
    }
  }
}
#endif  // STREAMK

#if SPLITK > 1
// C = alpha * (sum of the SPLITK partial results in the workspace) + beta * C, one output per thread,
// the partial sums added in the fixed order s = 0, 1, ... Grid: dimension 0 = the M x N outputs
// (rounded up; row-major, so neighbouring threads touch neighbouring addresses), 1 = batch.
// Workspace matrix s * batches + b holds slice s of matrix b, with row stride ldw.
__kernel void gemm_splitk_reduce(const int M, const int N, const float alpha, const float beta,
                                 const __global float* restrict wgm, const int ldw,
                                 __global float* restrict cgm, const long c_offset, const int ldc,
                                 const long stride_c) {
  const int i = get_global_id(0);
  if (i >= M * N) { return; }
  const int m = i / N;
  const int n = i - m * N;
  const long batch = get_global_id(1);
  const long part = (long)M * ldw;                 // elements of one workspace matrix
  const long slice_stride = get_global_size(1) * part;
  const __global float* w = wgm + batch * part + m * ldw + n;
  float sum = w[0];
  #pragma unroll
  for (int s = 1; s < SPLITK; ++s) { sum += w[s * slice_stride]; }
  __global float* c = cgm + c_offset + batch * stride_c + m * ldc + n;
  float r = alpha * sum;
  if (beta != 0.0f) { r = fma(beta, *c, r); }
  *c = r;
}
#endif
