// gemm_mma.cl — gemm_mma_tf32 and gemm_mma_f16: C = alpha * op(A) * op(B) + beta * C on NVIDIA tensor
// cores with fp32 accumulation, row-major (like torch): fp32 A, B, C with TF32 inputs (gemm_mma_tf32), or
// half A, B, C (gemm_mma_f16, MMA_F16 = 1).
//
// Layout: as gemm_tiled.cl. A is M x K (lda >= K) or, with TRANS_A, K x M (lda >= M); B is K x N (ldb >= N)
// or, with TRANS_B, N x K (ldb >= K); C is M x N (ldc >= N); leading dimensions are row strides in
// elements; matrix b of a batch starts at buffer + offset + b * stride (a stride of 0 broadcasts).
// Any M, N, K >= 1: loads outside the matrices read zeros and stores outside are skipped, so the caller
// never pads. beta == 0 never reads C (it may hold NaN garbage).
//
// Numerics: each element of A and B is rounded to TF32 (10 explicit mantissa bits; cvt.rna.tf32.f32:
// to nearest, ties away from zero): once, when its tile is stored into local memory, or (ASYNC) when
// a lane reads it into a fragment; the products of two TF32 values are exact in fp32 and are summed in
// fp32 by mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32. This is what torch's allow_tf32
// permits; the host records results as precision "tf32".
// MMA_F16: A and B are half (their bits are copied, never converted: every product of two halves is
// exact in fp32), summed in fp32 by mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32; alpha * sum
// + beta * C is computed in fp32 and rounded once to half, to nearest even (vstore_half_rte), as torch
// does on CUDA.
//
// Decomposition. A work-group is WARPS_M x WARPS_N warps with a 1-D local size WGS = 32 * WARPS_M *
// WARPS_N: warp = local id / 32 and lane = local id % 32 (NVIDIA groups consecutive linear ids into
// warps). It computes one MWG x NWG tile of C. K is walked in KWG-deep steps: all threads copy the A
// tile and the B tile into local memory, VWA/VWB elements at a time along the matrices' contiguous
// dimension, in the orientation they have in global memory (a row stays a row, so the stores are
// vectors too) — through registers, rounded to TF32 on the way (ASYNC = 0), or with cp.async straight
// into one of STAGES buffers (ASYNC = 1: no registers held; the copies of the next STAGES - 1 tiles
// are in flight while a tile is multiplied; matrix edges use cp.async's zero fill). Warp w owns the warp tile
// of WTM x WTN = (MWG / WARPS_M) x (NWG / WARPS_N) elements at row (w / WARPS_N) * WTM, column
// (w % WARPS_N) * WTN, a grid of MT x NT mma tiles of 16 x 8 whose accumulators (4 floats per lane per
// mma tile) live in registers. Per 8-deep k step a lane reads its A fragments (4 values per 16 x 8 A
// tile) and B fragments (2 values per 8 x 8 B tile) from local memory and the warp issues MT * NT mma.
// Grid: dimension 0 = N tiles x WGS, 1 = M tiles, 2 = batch; GM re-orders the work-groups in bands.
//
// Fragments of mma.m16n8k8 with .tf32 (PTX ISA, "Matrix Fragments for mma.m16n8k8"), g = lane / 4,
// t = lane % 4, coordinates (row, column) of the 16 x 8 A, 8 x 8 B and 16 x 8 C/D tiles:
//   A: a0 = (g, t)   a1 = (g + 8, t)   a2 = (g, t + 4)   a3 = (g + 8, t + 4)
//   B: b0 = (t, g)   b1 = (t + 4, g)
//   C: c0 = (g, 2t)  c1 = (g, 2t + 1)  c2 = (g + 8, 2t)  c3 = (g + 8, 2t + 1)
// MMA_F16, mma.m16n8k16 with .f16 ("Matrix Fragments for mma.m16n8k16 with floating point type"):
// each A and B register is an .f16x2 holding two neighbours in k (the lower 16 bits the even k), and
// counting k in such pairs ("words", k = 2w, 2w + 1), the 16 x 16 A and 16 x 8 B tiles are 16 x 8 and
// 8 x 8 tiles of words with exactly the TF32 table above: a0 = (g, word t), a1 = (g + 8, word t),
// a2 = (g, word t + 4), a3 = (g + 8, word t + 4); b0 = (word t, g), b1 = (word t + 4, g); C as above.
// So one index logic serves both: a k step is MMA_K = 8 * KPW deep (KPW = elements per register: 1
// for TF32, 2 for f16) and every "k" below a fragment is counted in registers. A register of an
// operand stored with K contiguous is one 32-bit local read; with M (N) contiguous it is packed from
// two 16-bit reads of neighbouring rows.
// KPAIR relabels k inside each 8-deep step for A and B alike (a sum over k does not depend on the
// order of its terms): the registers of k = t and t + 4 then hold k = 2t and 2t + 1, so a lane's two k
// values are neighbours and a tile stored with K contiguous is read with one 64-bit load instead of two.
//
// Variants (named #if branches; the host passes -DNAME=VALUE):
//   ASYNC    0: global -> registers -> local memory; STAGES 1: load, barrier, multiply, barrier;
//            STAGES 2: double-buffered, the next tile is fetched into registers while the current one
//            is multiplied, one barrier per tile.
//            1: cp.async (PTX; a device whose probe granted "cp_async") into STAGES = 2..4 buffers,
//            one barrier per tile.
//   KPAIR    1: a lane holds k = 2t, 2t + 1 of each 8-deep step (see above); 0: k = t, t + 4.
//   PAD      1: local rows are padded so that the fragment reads of a warp hit 32 different banks
//            (the padding depends on the orientation and KPAIR, see PADDING); 0: no padding.
//   TRANS_A/B  problem layout, set by the host from the problem (not tuned).
//   CSCALAR  host-internal: 1 = scalar C accesses, for C offsets/ldc that are not even.
//   MMA_F16  1: half A, B, C and the f16 mma (gemm_mma_f16; KWG counts halves: 16, 32, 64);
//            0: fp32 A, B, C with TF32 inputs (gemm_mma_tf32).
//   MMA_STUB host-internal, for tests on devices without tensor cores: the PTX (cvt, mma, cp.async)
//            is replaced by plain OpenCL C that computes the same thing from the same per-lane
//            registers through local memory and barriers, and copies synchronously (slow; it checks
//            every index of this file except the PTX).
// Global vector loads need aligned addresses: the host compiles VWA=1 / VWB=1 / CSCALAR=1 variants for
// calls whose offset, leading dimension or batch stride is not a multiple of the vector width.

// ---- problem layout (from the problem, not tuned) -----------------------------------------------
#include "gemm_arguments.cl"  // TRANS_A, TRANS_B, GEMM_ARGUMENTS, GEMM_BATCH_OFFSETS

// ---- tunables ------------------------------------------------------------------------------------
#ifndef MWG
  #define MWG 64      // tile size in M per work-group: 16 .. 256, a multiple of 16 * WARPS_M
#endif
#ifndef NWG
  #define NWG 64      // tile size in N per work-group: 16 .. 256, a multiple of 8 * WARPS_N
#endif
#ifndef MMA_F16
  #define MMA_F16 0   // 1 = half A, B, C with the f16 mma (gemm_mma_f16); 0 = fp32 with TF32 inputs
#endif
#ifndef KWG
  #define KWG 16      // depth in K of one tile step (local-memory tile): 8, 16, 32 (f16: 16, 32, 64)
#endif
#ifndef WARPS_M
  #define WARPS_M 2   // warps per work-group along M
#endif
#ifndef WARPS_N
  #define WARPS_N 2   // warps per work-group along N
#endif
#ifndef VWA
  #define VWA 4       // vector width of global loads of A along its contiguous dim (K; M if TRANS_A):
                      // 1, 2, 4 (f16: also 8)
#endif
#ifndef VWB
  #define VWB 4       // vector width of global loads of B along its contiguous dim (N; K if TRANS_B)
#endif
#ifndef ASYNC
  #define ASYNC 0     // 1 = cp.async copies into local memory; 0 = copies through registers
#endif
#ifndef STAGES
  #define STAGES 2    // local-memory buffers of each tile: 1, 2 (ASYNC 0); 2, 3, 4 (ASYNC 1)
#endif
#ifndef GM
  #define GM 1        // work-group order: bands of GM tile rows along M (1 = plain row-by-row)
#endif
#include "gemm_common.cl"  // gemm_tile_of_group()
#ifndef CSCALAR
  #define CSCALAR 0   // host-internal: 1 = scalar C accesses (C offset / ldc / stride not even)
#endif
#ifndef MMA_STUB
  #define MMA_STUB 0  // host-internal: 1 = plain OpenCL C instead of PTX (tests without tensor cores)
#endif

// ---- derived (never passed from the host) --------------------------------------------------------
#include "mma_warp_tiles.cl"  // WGS, WTM, WTN, MT, NT, KPW, MMA_K, PADDING(kcontig), K_LO(t), K_HI(t)

// Local tiles keep the orientation of global memory: A_ROWS x A_COLS with A_COLS contiguous.
#if TRANS_A
  #define A_KCONTIG 0
  #define A_ROWS KWG
  #define A_COLS MWG
#else
  #define A_KCONTIG 1
  #define A_ROWS MWG
  #define A_COLS KWG
#endif
#if TRANS_B
  #define B_KCONTIG 1
  #define B_ROWS NWG
  #define B_COLS KWG
#else
  #define B_KCONTIG 0
  #define B_ROWS KWG
  #define B_COLS NWG
#endif

#define ALD (A_COLS + PADDING(A_KCONTIG))   // local row length of the A tile
#define BLD (B_COLS + PADDING(B_KCONTIG))   // local row length of the B tile
#define A_TILE (A_ROWS * ALD)               // elements (LTYPE) of one A tile in local memory
#define B_TILE (B_ROWS * BLD)
#if A_KCONTIG
  #define ALM(m, k) ((m) * ALD + (k))       // element (m, k) of op(A) in the local A tile
#else
  #define ALM(m, k) ((k) * ALD + (m))
#endif
#if B_KCONTIG
  #define BLM(k, n) ((n) * BLD + (k))       // element (k, n) of op(B) in the local B tile
#else
  #define BLM(k, n) ((k) * BLD + (n))
#endif
#define A_VECS_PER_ROW (A_COLS / VWA)
#define B_VECS_PER_ROW (B_COLS / VWB)
#define A_LOADS (A_ROWS * A_VECS_PER_ROW / WGS)   // vectors of the A tile per thread
#define B_LOADS (B_ROWS * B_VECS_PER_ROW / WGS)


// Element types: GTYPE of A and B in global memory, LTYPE of the local tiles, CTYPE of C. MMA_F16 moves
// the bits of halves as ushort (no conversion before the mma), and vectors of them as 32-bit words
// (PTX has no 8-wide vectors of 16-bit values: a ushort8 would become two 64-bit accesses instead of
// one 128-bit one); C is half for vload/vstore_half.
#if MMA_F16
  #define GTYPE ushort
  #define LTYPE ushort
  #define CTYPE half
  #define VTYPE_1 ushort
  #define VTYPE_2 uint
  #define VTYPE_4 uint2
  #define VTYPE_8 uint4
  #define UTYPE_1 ushort
  #define UTYPE_2 uint
  #define UTYPE_4 uint2
  #define UTYPE_8 uint4
#else
  #define GTYPE float
  #define LTYPE uint
  #define CTYPE float
  #define VTYPE_1 float
  #define VTYPE_2 float2
  #define VTYPE_4 float4
  #define UTYPE_1 uint
  #define UTYPE_2 uint2
  #define UTYPE_4 uint4
#endif
// Vector types by width; a union with an array reads and writes lanes with constant indices.
#define VTYPE_(w) VTYPE_##w
#define VTYPE(w) VTYPE_(w)
#define UTYPE_(w) UTYPE_##w
#define UTYPE(w) UTYPE_(w)
typedef VTYPE(VWA) floatA;   // (words of halves with MMA_F16: the name says "global side")
typedef VTYPE(VWB) floatB;
typedef UTYPE(VWA) uintA;    // (local side)
typedef UTYPE(VWB) uintB;
typedef union { floatA v; GTYPE s[VWA]; } vecA;
typedef union { floatB v; GTYPE s[VWB]; } vecB;
typedef union { uintA v; LTYPE s[VWA]; } uvecA;
typedef union { uintB v; LTYPE s[VWB]; } uvecB;

// ---- the tensor-core instructions ------------------------------------------------------------------
#include "mma_core.cl"  // Mma, ToTF32, MMA_PARAMS / MMA_ARGS (and their plain-C stand-ins with MMA_STUB)

// ---- global memory -> registers -> local memory (ASYNC 0) -----------------------------------------

// GlobalToPrivateVecA (B): VWA (VWB) elements of a row of A (B); zeros outside the matrix.
#include "gemm_vector_loads.cl"  // GLOBAL_TO_PRIVATE_VEC
GLOBAL_TO_PRIVATE_VEC(GlobalToPrivateVecA, floatA, vecA, VWA, GTYPE, agm, AT, (GTYPE)0)
GLOBAL_TO_PRIVATE_VEC(GlobalToPrivateVecB, floatB, vecB, VWB, GTYPE, bgm, AT, (GTYPE)0)

// This thread's vector i of the X tile (A or B): vector v = tid + i * WGS of the tile, at row r and column
// c of the tile as stored (neighbouring threads take neighbouring vectors of a row).
#define TILE_VECTOR(X)                                                                              \
  const int v = tid + i * WGS;                                                                    \
  const int r = v / X##_VECS_PER_ROW;                                                             \
  const int c = (v % X##_VECS_PER_ROW) * VW##X;

#if ASYNC == 0
// GlobalToPrivateA (B): the A tile at (m0, k0) (the B tile at (k0, n0)) into this thread's registers.
#define GLOBAL_TO_PRIVATE(X, x, mn, MN)                                                             \
  void GlobalToPrivate##X(const __global GTYPE* restrict x##gm, float##X x##reg[X##_LOADS], const int tid, \
                          const int mn##0, const int k0, const int MN, const int K, const int ld##x) { \
    _Pragma("unroll")                                                                             \
    for (int i = 0; i < X##_LOADS; ++i) {                                                         \
      TILE_VECTOR(X)                                                                              \
      x##reg[i] = GlobalToPrivateVec##X(x##gm, X##_STORED(r, c));                                 \
    }                                                                                             \
  }

// PrivateToLocalA (B): this thread's vectors of the A (B) tile, rounded to TF32 (MMA_F16: as they are),
// into local memory (same rows and columns).
#if MMA_F16
  #define STORE_TO_LOCAL(X, x) *((__local uint##X*)(x##lm + r * X##LD + c)) = x##reg[i];
#else
  #define STORE_TO_LOCAL(X, x)                                                                      \
    vec##X u;                                                                                     \
    uvec##X w;                                                                                    \
    u.v = x##reg[i];                                                                              \
    _Pragma("unroll")                                                                             \
    for (int e = 0; e < VW##X; ++e) { w.s[e] = ToTF32(u.s[e]); }                                  \
    *((__local uint##X*)(x##lm + r * X##LD + c)) = w.v;
#endif
#define PRIVATE_TO_LOCAL(X, x)                                                                      \
  void PrivateToLocal##X(const float##X x##reg[X##_LOADS], __local LTYPE* x##lm, const int tid) {  \
    _Pragma("unroll")                                                                             \
    for (int i = 0; i < X##_LOADS; ++i) {                                                         \
      TILE_VECTOR(X)                                                                              \
      STORE_TO_LOCAL(X, x)                                                                        \
    }                                                                                             \
  }

GLOBAL_TO_PRIVATE(A, a, m, M)
PRIVATE_TO_LOCAL(A, a)
GLOBAL_TO_PRIVATE(B, b, n, N)
PRIVATE_TO_LOCAL(B, b)
#endif  // ASYNC == 0

// ---- global memory -> local memory with cp.async (ASYNC) --------------------------------------------

#if ASYNC
#define CP_ASYNC_STUB MMA_STUB
#include "cp_async.cl"  // CpAsync, CpAsyncCommit, CpAsyncWait

// Copy `width` elements (4, 2 or 1 floats; 8, 4, 2 or 1 halves) of row `row` from column `col` to
// local memory at `dst`; elements outside rows x cols become zeros (cp.async copies `bytes` from the
// source and zero-fills the rest). cp.async takes the .shared address of the destination: the integer
// value of a __local pointer. It copies 4, 8 or 16 bytes: a single half is copied synchronously (the
// barrier before its tile is read orders it like the asynchronous copies).
void AsyncCopy(__local LTYPE* dst, const __global GTYPE* restrict src, const int row, const int col,
               const int ld, const int rows, const int cols, const int width) {
  const int inside = row < rows ? clamp(cols - col, 0, width) : 0;
  // with nothing to read, any valid address will do: the matrix's first element
  const __global GTYPE* from = inside ? src + row * ld + col : src;
  #if MMA_STUB
    #if MMA_F16
      for (int e = 0; e < width; ++e) { dst[e] = e < inside ? from[e] : (ushort)0; }
    #else
      for (int e = 0; e < width; ++e) { dst[e] = e < inside ? as_uint(from[e]) : 0u; }
    #endif
  #else
    const int size = sizeof(GTYPE) * width;
    if (size >= 4) {
      CpAsync((uint)(size_t)dst, from, size, sizeof(GTYPE) * inside);
    } else {
      *dst = inside ? *from : (LTYPE)0;
    }
  #endif
}

// GlobalToLocalAsyncA (B): start copying the A tile at (m0, k0) (the B tile at (k0, n0)) into `alm`
// (`blm`): this thread's vectors, as GlobalToPrivateA (B) loads them.
#define GLOBAL_TO_LOCAL_ASYNC(X, x, mn, MN)                                                         \
  void GlobalToLocalAsync##X(const __global GTYPE* restrict x##gm, __local LTYPE* x##lm, const int tid, \
                             const int mn##0, const int k0, const int MN, const int K, const int ld##x) { \
    _Pragma("unroll")                                                                             \
    for (int i = 0; i < X##_LOADS; ++i) {                                                         \
      TILE_VECTOR(X)                                                                              \
      AsyncCopy(x##lm + r * X##LD + c, x##gm, X##_STORED(r, c), VW##X);                           \
    }                                                                                             \
  }
GLOBAL_TO_LOCAL_ASYNC(A, a, m, M)
GLOBAL_TO_LOCAL_ASYNC(B, b, n, N)

#endif  // ASYNC

// ---- local memory -> fragments ----------------------------------------------------------------------

// A local word as a fragment register: already TF32 (ASYNC 0), or an fp32 value to round (ASYNC 1);
// (MMA_F16) a pair of halves as they are.
#if ASYNC && !MMA_F16
  #define FRAG(word) ToTF32(as_float(word))
#else
  #define FRAG(word) (word)
#endif

// The fragment register of op(A) row m holding k .. k + KPW - 1 (op(B) column n: FRAG_B), k a multiple
// of KPW. MMA_F16: one 32-bit read where K is contiguous, else two halves of neighbouring rows packed
// (the even k in the lower 16 bits).
#if MMA_F16 && A_KCONTIG
  #define FRAG_A(alm, m, k) (*((const __local uint*)((alm) + ALM(m, k))))
#elif MMA_F16
  #define FRAG_A(alm, m, k) ((uint)(alm)[ALM(m, k)] | ((uint)(alm)[ALM(m, (k) + 1)] << 16))
#else
  #define FRAG_A(alm, m, k) FRAG((alm)[ALM(m, k)])
#endif
#if MMA_F16 && B_KCONTIG
  #define FRAG_B(blm, k, n) (*((const __local uint*)((blm) + BLM(k, n))))
#elif MMA_F16
  #define FRAG_B(blm, k, n) ((uint)(blm)[BLM(k, n)] | ((uint)(blm)[BLM((k) + 1, n)] << 16))
#else
  #define FRAG_B(blm, k, n) FRAG((blm)[BLM(k, n)])
#endif

#include "mma_fragments.cl"  // LocalToPrivateA, LocalToPrivateB, MultiplyTile

// ---- registers -> global memory (C) ----------------------------------------------------------------

#define C_HALF MMA_F16  // C is half (rounded to nearest even on stores)
#include "gemm_c_pairs.cl"  // LOAD_C, STORE_C, LOAD_C2, STORE_C2, STORE_C_PAIR

// C = alpha * cpm + beta * C for this lane's outputs inside the matrix (c0, c1 and c2, c3 are pairs of
// neighbours in a row); beta == 0 never reads C.
void PrivateToGlobalC(float cpm[MT][NT][4], __global CTYPE* restrict cgm, const int mw, const int nw,
                      const int g, const int t, const int M, const int N, const int ldc, const float alpha,
                      const float beta) {
  #pragma unroll
  for (int i = 0; i < MT; ++i) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = mw + i * 16 + g + 8 * h;
      if (m < M) {
        __global CTYPE* crow = cgm + m * ldc;
        #pragma unroll
        for (int j = 0; j < NT; ++j) {
          const int n = nw + j * 8 + 2 * t;
          float r0 = alpha * cpm[i][j][2 * h];
          float r1 = alpha * cpm[i][j][2 * h + 1];
          STORE_C_PAIR(crow, n, r0, r1)
        }
      }
    }
  }
}

// ---- the kernel -------------------------------------------------------------------------------------

#if MMA_F16
__kernel void gemm_mma_f16(
#else
__kernel void gemm_mma_tf32(
#endif
                            GEMM_ARGUMENTS(GTYPE, CTYPE)) {
  GEMM_BATCH_OFFSETS

  const int2 tile = gemm_tile_of_group();  // gemm_common.cl: plain or GM-banded order
  GEMM_TILE_ORIGIN(tile)
  const int tid = get_local_id(0);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int wm0 = (warp / WARPS_N) * WTM;   // the warp tile inside the work-group tile
  const int wn0 = (warp % WARPS_N) * WTN;

  __local LTYPE alm[STAGES * A_TILE] __attribute__((aligned(16)));
  __local LTYPE blm[STAGES * B_TILE] __attribute__((aligned(16)));
  #if MMA_STUB
    __local uint mma_words[WARPS_M * WARPS_N * MMA_WORDS];
    __local uint* wsm = mma_words + warp * MMA_WORDS;
  #endif
  #if ASYNC == 0
    floatA areg[A_LOADS];
    floatB breg[B_LOADS];
  #endif

  ZERO_ACCUMULATORS(cpm)

  const int tiles = (K + KWG - 1) / KWG;
  #if ASYNC
    // Prologue: start tiles 0 .. STAGES - 2, one commit group each. Step t: wait for tile t, barrier
    // (everyone's copies of tile t are visible, and everyone is done with buffer (t - 1) % STAGES),
    // start tile t + STAGES - 1 into that buffer, multiply tile t. Groups are committed even when
    // empty, so that "all but the newest STAGES - 2 groups" always means "up to tile t".
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < tiles) {
        GlobalToLocalAsyncA(agm, alm + s * A_TILE, tid, m0, s * KWG, M, K, lda);
        GlobalToLocalAsyncB(bgm, blm + s * B_TILE, tid, n0, s * KWG, N, K, ldb);
      }
      CpAsyncCommit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
      CpAsyncWait(STAGES - 2);  // the oldest tile in flight (tile) has arrived
      barrier(CLK_LOCAL_MEM_FENCE);
      const int ahead = tile + STAGES - 1;
      if (ahead < tiles) {
        const int buf = ahead % STAGES;
        GlobalToLocalAsyncA(agm, alm + buf * A_TILE, tid, m0, ahead * KWG, M, K, lda);
        GlobalToLocalAsyncB(bgm, blm + buf * B_TILE, tid, n0, ahead * KWG, N, K, ldb);
      }
      CpAsyncCommit();
      const int cur = tile % STAGES;
      MultiplyTile(cpm, alm + cur * A_TILE, blm + cur * B_TILE, wm0, wn0, g, t MMA_ARGS);
    }
  #elif STAGES == 2
    // Prologue: tile 0 into buffer 0. Then per step: fetch tile t+1 into registers, multiply tile t,
    // store tile t+1 into the other buffer, one barrier (it also protects the buffer read at t-1).
    GlobalToPrivateA(agm, areg, tid, m0, 0, M, K, lda);
    GlobalToPrivateB(bgm, breg, tid, n0, 0, N, K, ldb);
    PrivateToLocalA(areg, alm, tid);
    PrivateToLocalB(breg, blm, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int tile = 0; tile < tiles; ++tile) {
      const int cur = tile & 1;
      const int k0 = tile * KWG;
      const bool next = tile + 1 < tiles;
      if (next) {
        GlobalToPrivateA(agm, areg, tid, m0, k0 + KWG, M, K, lda);
        GlobalToPrivateB(bgm, breg, tid, n0, k0 + KWG, N, K, ldb);
      }
      MultiplyTile(cpm, alm + cur * A_TILE, blm + cur * B_TILE, wm0, wn0, g, t MMA_ARGS);
      if (next) {
        PrivateToLocalA(areg, alm + (cur ^ 1) * A_TILE, tid);
        PrivateToLocalB(breg, blm + (cur ^ 1) * B_TILE, tid);
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  #else
    for (int tile = 0; tile < tiles; ++tile) {
      const int k0 = tile * KWG;
      GlobalToPrivateA(agm, areg, tid, m0, k0, M, K, lda);
      GlobalToPrivateB(bgm, breg, tid, n0, k0, N, K, ldb);
      PrivateToLocalA(areg, alm, tid);
      PrivateToLocalB(breg, blm, tid);
      barrier(CLK_LOCAL_MEM_FENCE);
      MultiplyTile(cpm, alm, blm, wm0, wn0, g, t MMA_ARGS);
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  #endif

  PrivateToGlobalC(cpm, cgm, m0 + wm0, n0 + wn0, g, t, M, N, ldc, alpha, beta);
}
