// conv_implicit_gemm_mma.cl — conv_implicit_gemm_mma_tf32 and conv_implicit_gemm_mma_f16: convolution as
// an implicit GEMM on NVIDIA tensor cores with fp32 accumulation, NCHW tensors, any stride, padding,
// dilation and groups, all three directions: fp32 tensors with TF32 inputs (conv_implicit_gemm_mma_tf32),
// or half tensors (conv_implicit_gemm_mma_f16, MMA_F16 = 1; the bias stays fp32). Per group g
// (dimension 2 of the launch), C[GM x GN] = A[GM x GK] * B[GK x GN], exactly as conv_implicit_gemm.cl
// (same geometry macros, same gathers, same kernel arguments, same epilogue; its banner has the GEMM of
// each direction).
//
// Decomposition: a work-group of WARPS_M x WARPS_N warps (1-D local size WGS = 32 * warps) computes an
// MWG x NWG tile of C, stepping through its share of GK by KWG. Every step all threads gather the A
// and B tiles from the tensors into registers (zeros outside them: im2col fused into the loads, no
// workspace), round them to TF32 and store them into local memory; then warp w multiplies its warp
// tile of (MWG / WARPS_M) x (NWG / WARPS_N) as a grid of MT x NT mma.m16n8k8 tiles whose accumulators
// live in registers (fragment layout: gemm_mma.cl's banner). A is gathered with neighbouring threads
// along GK (contiguous in w and dy) and kept GK-contiguous in local memory; B is gathered along GN
// (pixels) for fwd / bwd_data and kept GN-contiguous, along GK (pixels) for bwd_weight and kept
// GK-contiguous — the local layouts of gemm_mma.cl's TRANS_A = 0 and TRANS_B = 0 / 1.
// SPLIT > 1 splits GK over SPLIT work-groups (dimension 2 = G * SPLIT) that write partial sums to the
// workspace; conv_common.cl's split_reduce adds them in a fixed order (deterministic, no atomics).
//
// Shared code: the gathers and the epilogue mirror conv_implicit_gemm.cl, the TF32 rounding, the mma,
// its emulation and the fragment reads mirror gemm_mma.cl. They are copies, not includes: a program is
// built (and cached) from one source text, whose hash is the kernel's identity.
//
// Numerics: each element of A and B is rounded to TF32 (cvt.rna.tf32.f32) once, when stored into
// local memory; products of TF32 values are exact in fp32 and summed in fp32 by the mma. The bias and
// beta * out are added in fp32. The host records results as precision "tf32".
// MMA_F16: the half bits of A and B are gathered and stored unconverted (a product of two halves is
// exact in fp32) and summed in fp32 by mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32; the result
// (+ bias, + beta * out read with vload_half) is computed in fp32 and rounded once to half, to nearest
// even (vstore_half_rte); SPLIT partial sums stay fp32 in the workspace and split_reduce (OUT_HALF)
// rounds their sum once. The fragments are gemm_mma.cl's MMA_F16 ones: counted in k pairs (one .f16x2
// register: the even k in the lower 16 bits), the m16n8k16 tables are the m16n8k8 TF32 ones, so the
// index logic below is shared — an mma step is MMA_K = 8 * KPW deep (KPW = 2 halves per register) and
// every k below a fragment counts registers. A GK-contiguous tile gives a register in one 32-bit read
// (KPAIR: two in one 64-bit read); the GN-contiguous B tile packs two halves of neighbouring rows.
// The host records results as precision "fp32" (exact inputs, fp32 sums, as the converted route).
//
// Variants (named #if branches; the host passes -DNAME=VALUE):
//   STAGES   1: gather, barrier, multiply, barrier; 2: double buffering, the next tile is gathered into
//            registers while the current one is multiplied, one barrier per step.
//   KPAIR    1: a lane holds k = 2t, 2t + 1 of each 8-deep step (64-bit reads of GK-contiguous tiles);
//            0: k = t, t + 4.
//   PAD      1: local rows padded so that a warp's fragment reads hit 32 different banks; 0: none.
//   MMA_F16  1: half x, w, dy and outputs with the f16 mma (conv_implicit_gemm_mma_f16; KWG counts
//            halves: 16, 32, 64); 0: fp32 tensors with TF32 inputs (conv_implicit_gemm_mma_tf32).
//   MMA_STUB host-internal, for tests on devices without tensor cores: plain OpenCL C computes the same
//            fragments instead of the PTX (slow; checks every index of this file except the PTX).
//
// The kernel ends with out = result (+ bias[k] in fwd) (+ beta * out; beta == 0 never reads out),
// rounded once to half with MMA_F16.

// ---- problem geometry (the host passes all of them; defaults only let the file compile alone) ----
#include "conv_geometry.cl"  // CONV_N, CONV_C, ..., DIRECTION, CONV_P, CONV_Q

// ---- tunables ----
#ifndef MWG
  #define MWG 32        // tile rows (GM) per work-group: a multiple of 16 * WARPS_M
#endif
#ifndef NWG
  #define NWG 32        // tile columns (GN) per work-group: a multiple of 8 * WARPS_N
#endif
#ifndef MMA_F16
  #define MMA_F16 0     // 1 = half tensors with the f16 mma (conv_implicit_gemm_mma_f16); 0 = fp32, TF32
#endif
#ifndef KWG
  #define KWG 16        // reduction step (GK) staged in local memory: 8, 16, 32 (f16: 16, 32, 64)
#endif
#ifndef WARPS_M
  #define WARPS_M 1     // warps per work-group along GM
#endif
#ifndef WARPS_N
  #define WARPS_N 1     // warps per work-group along GN
#endif
#ifndef STAGES
  #define STAGES 2      // local-memory buffers per tile: 1, or 2 (register-prefetched double buffering)
#endif
#ifndef SPLIT
  #define SPLIT 1       // work-groups sharing one reduction; > 1 writes partial sums to the workspace
#endif
#ifndef MMA_STUB
  #define MMA_STUB 0    // host-internal: 1 = plain OpenCL C instead of PTX (tests without tensor cores)
#endif

// ---- derived: the GEMM ----
#include "conv_gemm_view.cl"  // CG, KG, RS, HW, PQ, GM, GN, GK, OUT_SIZE of DIRECTION
#define KCHUNK ((((GK + SPLIT - 1) / SPLIT + KWG - 1) / KWG) * KWG)   // GK per split, whole steps

// ---- derived: warps and mma tiles ----
#include "mma_warp_tiles.cl"  // WGS, WTM, WTN, MT, NT, KPW, MMA_K, PADDING(kcontig), K_LO(t), K_HI(t)

// ---- derived: tile gathers (as conv_implicit_gemm.cl with THREADS = WGS) ----
#define A_TK ((WGS < KWG) ? WGS : KWG)          // threads along GK
#define A_TM (WGS / A_TK)                       // threads along GM
#define A_LANES (KWG / A_TK)                    // GK indices per thread
#define A_ROWS (MWG / A_TM)                     // GM indices per thread
#if DIRECTION == 2
  #define B_TK ((WGS < KWG) ? WGS : KWG)
  #define B_TN (WGS / B_TK)
#else
  #define B_TN ((WGS < NWG) ? WGS : NWG)
  #define B_TK (WGS / B_TN)
#endif
#define B_LANES (KWG / B_TK)                    // GK indices per thread
#define B_COLS (NWG / B_TN)                     // GN indices per thread

// ---- derived: local tiles (gemm_mma.cl's layouts: A GK-contiguous, B GN- or GK-contiguous) ----
#define A_KCONTIG 1
#if DIRECTION == 2
  #define B_KCONTIG 1
#else
  #define B_KCONTIG 0
#endif
#define ALD (KWG + PADDING(1))              // local row length of the A tile (MWG rows of GK)
#if B_KCONTIG
  #define BLD (KWG + PADDING(1))            // NWG rows of GK
  #define B_TILE (NWG * BLD)
  #define BLM(k, n) ((n) * BLD + (k))
#else
  #define BLD (NWG + PADDING(0))            // KWG rows of GN
  #define B_TILE (KWG * BLD)
  #define BLM(k, n) ((k) * BLD + (n))
#endif
#define A_TILE (MWG * ALD)
#define ALM(m, k) ((m) * ALD + (k))


// Element types: GTYPE of the gathered tensors (and of the registers the gathers fill), LTYPE of the
// local tiles, CTYPE of the output. MMA_F16 moves the bits of halves as ushort (no conversion before
// the mma); the output is half for vload/vstore_half.
#if MMA_F16
  #define GTYPE ushort
  #define LTYPE ushort
  #define CTYPE half
  #define LOAD_OUT(p, i) vload_half(i, p)
  #define STORE_OUT(x, p, i) vstore_half_rte(x, i, p)
#else
  #define GTYPE float
  #define LTYPE uint
  #define CTYPE float
  #define LOAD_OUT(p, i) ((p)[i])
  #define STORE_OUT(x, p, i) ((p)[i] = (x))
#endif
#define ZERO ((GTYPE)0)                        // +0 in either type

// MMA_F16 unrolls the gathers (and the loops over a thread's gathered columns) explicitly: with twice
// as many elements per tile, clang for NVPTX left their registers in local memory (a stack frame in
// ptxas's report); TF32 keeps the loops it was verified and timed with.
#if MMA_F16
  #define UNROLL_F16 _Pragma("unroll")
#else
  #define UNROLL_F16
#endif

#define FAR_OUTSIDE (-(1 << 28))               // a coordinate that fails every bounds check

// ---- the tensor-core instructions ------------------------------------------------------------------
#include "mma_core.cl"  // Mma, ToTF32, MMA_PARAMS / MMA_ARGS (and their plain-C stand-ins with MMA_STUB)

// ---- tensors -> registers (the im2col gathers of conv_implicit_gemm.cl) ----------------------------

// GlobalToPrivateA: this thread's share of the A tile at reduction step k0, a_apm[l][i] =
// A[m0 + a_row0 + i*A_TM][k0 + a_lane0 + l*A_TK] (zero outside A or past k_end)
void GlobalToPrivateA(__global const GTYPE *a_agm, const int a_offset, const int g, const int m0,
                      const int k0, const int k_end, const int a_lane0, const int a_row0,
                      GTYPE a_apm[A_LANES][A_ROWS]) {
  UNROLL_F16
  for (int l = 0; l < A_LANES; l++) {
    const int gk = k0 + a_lane0 + l * A_TK;
#if DIRECTION == 0
    UNROLL_F16
    for (int i = 0; i < A_ROWS; i++) {
      const int m = m0 + a_row0 + i * A_TM;
      a_apm[l][i] = (gk < k_end && m < GM) ? a_agm[a_offset + (g * KG + m) * GK + gk] : ZERO;
    }
#elif DIRECTION == 1
    const int k = gk / RS, rs = gk % RS;
    UNROLL_F16
    for (int i = 0; i < A_ROWS; i++) {
      const int m = m0 + a_row0 + i * A_TM;
      a_apm[l][i] = (gk < k_end && m < GM) ? a_agm[a_offset + ((g * KG + k) * CG + m) * RS + rs] : ZERO;
    }
#else
    const int n = gk / PQ, pq = gk % PQ;
    UNROLL_F16
    for (int i = 0; i < A_ROWS; i++) {
      const int m = m0 + a_row0 + i * A_TM;
      a_apm[l][i] = (gk < k_end && m < GM) ? a_agm[a_offset + (n * CONV_K + g * KG + m) * PQ + pq] : ZERO;
    }
#endif
  }
}

// GlobalToPrivateB: this thread's share of the B tile at step k0, b_apm[l][j] =
// B[k0 + b_lane0 + l*B_TK][n0 + b_col0 + j*B_TN], gathered from the tensor (zero outside it)
void GlobalToPrivateB(__global const GTYPE *b_agm, const int b_offset, const int k0, const int k_end,
                      const int b_lane0, const int *col_base_apm, const int *col_h_apm,
                      const int *col_w_apm, GTYPE b_apm[B_LANES][B_COLS]) {
  UNROLL_F16
  for (int l = 0; l < B_LANES; l++) {
    const int gk = k0 + b_lane0 + l * B_TK;
    const bool k_in = gk < k_end;
#if DIRECTION == 0
    const int c = gk / RS, r = (gk % RS) / CONV_S, s = gk % CONV_S;
    const int delta = c * HW + r * DIL_H * CONV_W + s * DIL_W;
    UNROLL_F16
    for (int j = 0; j < B_COLS; j++) {
      const int ih = col_h_apm[j] + r * DIL_H, iw = col_w_apm[j] + s * DIL_W;
      b_apm[l][j] = (k_in && ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W)
                        ? b_agm[b_offset + col_base_apm[j] + delta] : ZERO;
    }
#elif DIRECTION == 1
    const int k = gk / RS, r = (gk % RS) / CONV_S, s = gk % CONV_S;
    UNROLL_F16
    for (int j = 0; j < B_COLS; j++) {
      const int hp = col_h_apm[j] - r * DIL_H, wp = col_w_apm[j] - s * DIL_W;
      b_apm[l][j] = (k_in && hp >= 0 && wp >= 0 && hp % STRIDE_H == 0 && wp % STRIDE_W == 0 &&
                     hp / STRIDE_H < CONV_P && wp / STRIDE_W < CONV_Q)
          ? b_agm[b_offset + col_base_apm[j] + k * PQ + (hp / STRIDE_H) * CONV_Q + wp / STRIDE_W] : ZERO;
    }
#else
    const int n = gk / PQ, p = (gk % PQ) / CONV_Q, q = gk % CONV_Q;
    const int h0 = p * STRIDE_H - PAD_H, w0 = q * STRIDE_W - PAD_W;
    const int lane_base = n * CONV_C * HW + h0 * CONV_W + w0;
    UNROLL_F16
    for (int j = 0; j < B_COLS; j++) {
      const int ih = h0 + col_h_apm[j], iw = w0 + col_w_apm[j];
      b_apm[l][j] = (k_in && ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W)
                        ? b_agm[b_offset + lane_base + col_base_apm[j]] : ZERO;
    }
#endif
  }
}

// ---- registers -> local memory, rounded to TF32 (MMA_F16: the half bits as they are) -------------------

#if MMA_F16
  #define TO_LOCAL(x) (x)
#else
  #define TO_LOCAL(x) ToTF32(x)
#endif

void PrivateToLocalA(GTYPE a_apm[A_LANES][A_ROWS], __local LTYPE *alm, const int a_lane0, const int a_row0) {
  UNROLL_F16
  for (int l = 0; l < A_LANES; l++)
    UNROLL_F16
    for (int i = 0; i < A_ROWS; i++) { alm[ALM(a_row0 + i * A_TM, a_lane0 + l * A_TK)] = TO_LOCAL(a_apm[l][i]); }
}

void PrivateToLocalB(GTYPE b_apm[B_LANES][B_COLS], __local LTYPE *blm, const int b_lane0, const int b_col0) {
  UNROLL_F16
  for (int l = 0; l < B_LANES; l++)
    UNROLL_F16
    for (int j = 0; j < B_COLS; j++) { blm[BLM(b_lane0 + l * B_TK, b_col0 + j * B_TN)] = TO_LOCAL(b_apm[l][j]); }
}

// ---- local memory -> fragments -> mma (as gemm_mma.cl with ASYNC 0) ----------------------------------

// A local word is its fragment register as it is (the local tiles hold TF32 already, or halves).
#define FRAG(word) word
// The fragment register of A row m holding k .. k + KPW - 1 (B column n: FRAG_B), k a multiple of KPW.
// MMA_F16: one 32-bit read where GK is contiguous, else two halves of neighbouring rows packed (the even
// k in the lower 16 bits).
#if MMA_F16
  #define FRAG_A(alm, m, k) (*((const __local uint*)((alm) + ALM(m, k))))
#else
  #define FRAG_A(alm, m, k) ((alm)[ALM(m, k)])
#endif
#if MMA_F16 && B_KCONTIG
  #define FRAG_B(blm, k, n) (*((const __local uint*)((blm) + BLM(k, n))))
#elif MMA_F16
  #define FRAG_B(blm, k, n) ((uint)(blm)[BLM(k, n)] | ((uint)(blm)[BLM((k) + 1, n)] << 16))
#else
  #define FRAG_B(blm, k, n) ((blm)[BLM(k, n)])
#endif

#include "mma_fragments.cl"  // LocalToPrivateA, LocalToPrivateB, MultiplyTile

// ---- the kernel -------------------------------------------------------------------------------------

__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
#if MMA_F16
void conv_implicit_gemm_mma_f16(
#else
void conv_implicit_gemm_mma_tf32(
#endif
                                 __global const GTYPE *a_agm, const int a_offset,
                                 __global const GTYPE *b_agm, const int b_offset,
                                 __global CTYPE *out_agm, const int out_offset,
                                 __global float *ws_agm,
                                 __global const float *bias_agm, const int bias_offset, const int use_bias,
                                 const float beta) {
  __local LTYPE alm[STAGES * A_TILE] __attribute__((aligned(16)));
  __local LTYPE blm[STAGES * B_TILE] __attribute__((aligned(16)));

  const int tid = get_local_id(0);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int g8 = lane >> 2;   // the fragment row group (g in gemm_mma.cl; g is the conv group here)
  const int t = lane & 3;
  const int wm0 = (warp / WARPS_N) * WTM;   // the warp tile inside the work-group tile
  const int wn0 = (warp % WARPS_N) * WTN;
#if MMA_STUB
  __local uint mma_words[WARPS_M * WARPS_N * MMA_WORDS];
  __local uint* wsm = mma_words + warp * MMA_WORDS;
#endif

  CONV_GEMM_TILE

  // ---- what stays fixed for this thread's gathers during the whole GK loop ----
  GATHER_LANES
  int col_base_apm[B_COLS], col_h_apm[B_COLS], col_w_apm[B_COLS];
  UNROLL_F16
  for (int j = 0; j < B_COLS; j++) {
    const int col = n0 + b_col0 + j * B_TN;
    B_COLUMN
  }

  ZERO_ACCUMULATORS(cpm)

  GTYPE a_reg[A_LANES][A_ROWS], b_reg[B_LANES][B_COLS];
#if STAGES == 2
  // Prologue: step 0 into buffer 0. Then per step: gather the next step into registers, multiply this
  // one, store the next into the other buffer, one barrier (it also protects the buffer read before).
  GlobalToPrivateA(a_agm, a_offset, g, m0, k_begin, k_end, a_lane0, a_row0, a_reg);
  GlobalToPrivateB(b_agm, b_offset, k_begin, k_end, b_lane0, col_base_apm, col_h_apm, col_w_apm, b_reg);
  PrivateToLocalA(a_reg, alm, a_lane0, a_row0);
  PrivateToLocalB(b_reg, blm, b_lane0, b_col0);
  barrier(CLK_LOCAL_MEM_FENCE);
  int cur = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += KWG) {
    const bool next = k0 + KWG < k_end;
    if (next) {
      GlobalToPrivateA(a_agm, a_offset, g, m0, k0 + KWG, k_end, a_lane0, a_row0, a_reg);
      GlobalToPrivateB(b_agm, b_offset, k0 + KWG, k_end, b_lane0, col_base_apm, col_h_apm, col_w_apm, b_reg);
    }
    MultiplyTile(cpm, alm + cur * A_TILE, blm + cur * B_TILE, wm0, wn0, g8, t MMA_ARGS);
    if (next) {
      PrivateToLocalA(a_reg, alm + (cur ^ 1) * A_TILE, a_lane0, a_row0);
      PrivateToLocalB(b_reg, blm + (cur ^ 1) * B_TILE, b_lane0, b_col0);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    cur ^= 1;
  }
#else
  for (int k0 = k_begin; k0 < k_end; k0 += KWG) {
    GlobalToPrivateA(a_agm, a_offset, g, m0, k0, k_end, a_lane0, a_row0, a_reg);
    GlobalToPrivateB(b_agm, b_offset, k0, k_end, b_lane0, col_base_apm, col_h_apm, col_w_apm, b_reg);
    PrivateToLocalA(a_reg, alm, a_lane0, a_row0);
    PrivateToLocalB(b_reg, blm, b_lane0, b_col0);
    barrier(CLK_LOCAL_MEM_FENCE);
    MultiplyTile(cpm, alm, blm, wm0, wn0, g8, t MMA_ARGS);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#endif

  // ---- StoreC: accumulator r of mma tile (i, j) is C[m0 + wm0 + i*16 + g8 + 8*(r/2)][n0 + wn0 + j*8 + 2t + r%2]
  #pragma unroll
  for (int i = 0; i < MT; ++i) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm0 + i * 16 + g8 + 8 * h;
      if (m >= GM) { continue; }
      float b = 0.0f;
#if DIRECTION == 0
      if (SPLIT == 1 && use_bias) { b = bias_agm[bias_offset + g * KG + m]; }
#endif
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + wn0 + j * 8 + 2 * t + e;
          if (col >= GN) { continue; }
          OUT_INDEX(index, g, m, col)
          const float acc = cpm[i][j][2 * h + e];
#if SPLIT > 1
          ws_agm[split * OUT_SIZE + index] = acc;
#else
          const float value = acc + b;
          STORE_OUT((beta != 0.0f) ? value + beta * LOAD_OUT(out_agm, out_offset + index) : value, out_agm,
                    out_offset + index);
#endif
        }
      }
    }
  }
}
