// conv_implicit_gemm.cl — convolution as a tiled GEMM whose tiles are gathered straight from the
// NCHW tensors (im2col fused into the tile loads, no workspace), fp32, any stride, padding,
// dilation and groups. Per group g (dimension 2 of the launch), C[GM x GN] = A[GM x GK] * B[GK x GN]:
//
//   DIRECTION 0 fwd:        GM = K/G (k),  GN = N*P*Q (n,p,q), GK = C/G*R*S (c,r,s)
//                           A = w[k, c,r,s]        B = x[n, c, p*SH-PH+r*DH, q*SW-PW+s*DW]   C = y
//   DIRECTION 1 bwd_data:   GM = C/G (c),  GN = N*H*W (n,h,w), GK = K/G*R*S (k,r,s)
//                           A = w[k, c, r,s]       B = dy[n, k, (h+PH-r*DH)/SH, (w+PW-s*DW)/SW]
//                           (zero unless both divisions are exact and inside dy)             C = dx
//   DIRECTION 2 bwd_weight: GM = K/G (k),  GN = C/G*R*S (c,r,s), GK = N*P*Q (n,p,q)
//                           A = dy[n, k, p,q]      B = x[n, c, p*SH-PH+r*DH, q*SW-PW+s*DW]   C = dw
//
// A work-group of MDIMC x NDIMC work-items computes an MWG x NWG tile of C, stepping through GK by
// KWG: it gathers the A and B tiles into local memory (zeros outside the tensors), then each
// work-item accumulates (MWG/MDIMC) x (NWG/NDIMC) outputs, read from local memory as VWM- and
// VWN-wide vectors, rows and columns strided by the work-group so stores coalesce.
// Tiles travel global -> registers -> local memory; PREFETCH=1 issues the next step's global loads
// before this step's multiply-accumulate so their latency hides behind it.
// LPAD=1 pads the local rows by one vector: the GK-fast tile stores then spread over the banks.
// The gathers keep what is fixed for a work-item (the pixel of a B column, say) outside the GK loop.
// SPLIT > 1 splits GK over SPLIT work-groups (dimension 2 = G*SPLIT) that write partial sums to the
// workspace; conv_common.cl's split_reduce adds them in a fixed order (deterministic, no atomics), or with
// SPLIT_FINISH the last work-group of each tile adds them itself (split_finish.cl), in the same order.
//
// The GEMM operands are the plan contract's tensors swapped: a_agm (A) is the weight (dy for
// bwd_weight), b_agm (B) is x (dy for bwd_data).
//
// The kernel ends with out = result (+ bias[k] in fwd) (+ beta * out; beta == 0 never reads out).

// ---- problem geometry (the host passes all of them; defaults only let the file compile alone) ----
#include "conv_geometry.cl"  // CONV_N, CONV_C, ..., DIRECTION, CONV_P, CONV_Q

// ---- tunables ----
#ifndef MWG
  #define MWG 32        // tile rows (GM) per work-group
#endif
#ifndef NWG
  #define NWG 32        // tile columns (GN) per work-group
#endif
#ifndef KWG
  #define KWG 8         // reduction step (GK) staged in local memory
#endif
#ifndef MDIMC
  #define MDIMC 8       // work-items per work-group along GM
#endif
#ifndef NDIMC
  #define NDIMC 8       // work-items per work-group along GN
#endif
#ifndef VWM
  #define VWM 1         // vector width of local-memory reads along GM: 1, 2 or 4
#endif
#ifndef VWN
  #define VWN 1         // vector width of local-memory reads along GN: 1, 2 or 4
#endif
#ifndef SPLIT
  #define SPLIT 1       // work-groups sharing one reduction; > 1 writes partial sums to the workspace
#endif
#ifndef SPLIT_FINISH
  #define SPLIT_FINISH 0  // host-set: 1 = with SPLIT > 1 the last work-group of a tile adds the parts itself
#endif
#ifndef LPAD
  #define LPAD 0        // 1: pad local-memory rows by one vector (fewer bank conflicts when storing)
#endif
#ifndef PREFETCH
  #define PREFETCH 0    // 1: load the next reduction step into registers before multiplying this one
#endif

// ---- derived ----
#include "conv_gemm_view.cl"  // CG, KG, RS, HW, PQ, GM, GN, GK, OUT_SIZE of DIRECTION
#include "split_finish.cl"    // split_last, split_part
#define THREADS (MDIMC * NDIMC)
#define MWI (MWG / MDIMC)                      // outputs per work-item along GM
#define NWI (NWG / NDIMC)                      // outputs per work-item along GN
#define A_LD (MWG / VWM + LPAD)                // vectors per row of a_alm
#define B_LD (NWG / VWN + LPAD)                // vectors per row of b_alm
#define KCHUNK ((((GK + SPLIT - 1) / SPLIT + KWG - 1) / KWG) * KWG)   // GK per split, whole steps

// A tile loads: consecutive work-items take consecutive GK indices (contiguous in every direction)
#define A_TK ((THREADS < KWG) ? THREADS : KWG)  // work-items along GK
#define A_TM (THREADS / A_TK)                   // work-items along GM
#define A_LANES (KWG / A_TK)                    // GK indices per work-item
#define A_ROWS (MWG / A_TM)                     // GM indices per work-item
// B tile loads: along GN (pixels) for fwd and bwd_data, along GK (pixels) for bwd_weight
#if DIRECTION == 2
  #define B_TK ((THREADS < KWG) ? THREADS : KWG)
  #define B_TN (THREADS / B_TK)
#else
  #define B_TN ((THREADS < NWG) ? THREADS : NWG)
  #define B_TK (THREADS / B_TN)
#endif
#define B_LANES (KWG / B_TK)                    // GK indices per work-item
#define B_COLS (NWG / B_TN)                     // GN indices per work-item

#if VWM == 1
  typedef float realM;
  #define STORE_M(v, p) (*(p) = (v))
#elif VWM == 2
  typedef float2 realM;
  #define STORE_M(v, p) vstore2((v), 0, (p))
#elif VWM == 4
  typedef float4 realM;
  #define STORE_M(v, p) vstore4((v), 0, (p))
#endif
#if VWN == 1
  typedef float realN;
  #define STORE_N(v, p) (*(p) = (v))
#elif VWN == 2
  typedef float2 realN;
  #define STORE_N(v, p) vstore2((v), 0, (p))
#elif VWN == 4
  typedef float4 realN;
  #define STORE_N(v, p) vstore4((v), 0, (p))
#endif

#define FAR_OUTSIDE (-(1 << 28))               // a coordinate that fails every bounds check

// GlobalToPrivateA: this work-item's share of the A tile at reduction step k0, a_apm[l][i] =
// A[m0 + a_row0 + i*A_TM][k0 + a_lane0 + l*A_TK] (zero outside A or past k_end)
inline void GlobalToPrivateA(__global const float *a_agm, const int a_offset, const int g, const int m0,
                             const int k0, const int k_end, const int a_lane0, const int a_row0,
                             float a_apm[A_LANES][A_ROWS]) {
  for (int l = 0; l < A_LANES; l++) {
    const int kk = a_lane0 + l * A_TK;
    const int gk = k0 + kk;
#if DIRECTION == 0
    for (int i = 0; i < A_ROWS; i++) {
      const int m = a_row0 + i * A_TM;
      float v = 0.0f;
      if (gk < k_end && m0 + m < GM) { v = a_agm[a_offset + (g * KG + m0 + m) * GK + gk]; }
      a_apm[l][i] = v;
    }
#elif DIRECTION == 1
    const int k = gk / RS, rs = gk % RS;
    for (int i = 0; i < A_ROWS; i++) {
      const int m = a_row0 + i * A_TM;
      float v = 0.0f;
      if (gk < k_end && m0 + m < GM) { v = a_agm[a_offset + ((g * KG + k) * CG + m0 + m) * RS + rs]; }
      a_apm[l][i] = v;
    }
#else
    const int n = gk / PQ, pq = gk % PQ;
    for (int i = 0; i < A_ROWS; i++) {
      const int m = a_row0 + i * A_TM;
      float v = 0.0f;
      if (gk < k_end && m0 + m < GM) { v = a_agm[a_offset + (n * CONV_K + g * KG + m0 + m) * PQ + pq]; }
      a_apm[l][i] = v;
    }
#endif
  }
}

// GlobalToPrivateB: this work-item's share of the B tile at step k0, b_apm[l][j] =
// B[k0 + b_lane0 + l*B_TK][n0 + b_col0 + j*B_TN], gathered from the tensor (zero outside it)
inline void GlobalToPrivateB(__global const float *b_agm, const int b_offset, const int k0, const int k_end,
                             const int b_lane0, const int *col_base_apm, const int *col_h_apm,
                             const int *col_w_apm, float b_apm[B_LANES][B_COLS]) {
  for (int l = 0; l < B_LANES; l++) {
    const int kk = b_lane0 + l * B_TK;
    const int gk = k0 + kk;
    const bool k_in = gk < k_end;
#if DIRECTION == 0
    const int c = gk / RS, r = (gk % RS) / CONV_S, s = gk % CONV_S;
    const int delta = c * HW + r * DIL_H * CONV_W + s * DIL_W;
    for (int j = 0; j < B_COLS; j++) {
      const int ih = col_h_apm[j] + r * DIL_H, iw = col_w_apm[j] + s * DIL_W;
      float v = 0.0f;
      if (k_in && ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W) {
        v = b_agm[b_offset + col_base_apm[j] + delta];
      }
      b_apm[l][j] = v;
    }
#elif DIRECTION == 1
    const int k = gk / RS, r = (gk % RS) / CONV_S, s = gk % CONV_S;
    for (int j = 0; j < B_COLS; j++) {
      const int hp = col_h_apm[j] - r * DIL_H, wp = col_w_apm[j] - s * DIL_W;
      float v = 0.0f;
      if (k_in && hp >= 0 && wp >= 0 && hp % STRIDE_H == 0 && wp % STRIDE_W == 0 &&
          hp / STRIDE_H < CONV_P && wp / STRIDE_W < CONV_Q) {
        v = b_agm[b_offset + col_base_apm[j] + k * PQ + (hp / STRIDE_H) * CONV_Q + wp / STRIDE_W];
      }
      b_apm[l][j] = v;
    }
#else
    const int n = gk / PQ, p = (gk % PQ) / CONV_Q, q = gk % CONV_Q;
    const int h0 = p * STRIDE_H - PAD_H, w0 = q * STRIDE_W - PAD_W;
    const int lane_base = n * CONV_C * HW + h0 * CONV_W + w0;
    for (int j = 0; j < B_COLS; j++) {
      const int ih = h0 + col_h_apm[j], iw = w0 + col_w_apm[j];
      float v = 0.0f;
      if (k_in && ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W) {
        v = b_agm[b_offset + lane_base + col_base_apm[j]];
      }
      b_apm[l][j] = v;
    }
#endif
  }
}

__kernel __attribute__((reqd_work_group_size(MDIMC * NDIMC, 1, 1)))
void conv_implicit_gemm(__global const float *a_agm, const int a_offset,
                        __global const float *b_agm, const int b_offset,
                        __global float *out_agm, const int out_offset,
                        __global float *ws_agm,
                        __global const float *bias_agm, const int bias_offset, const int use_bias,
                        const float beta) {
  __local realM a_alm[KWG][A_LD];
  __local realN b_alm[KWG][B_LD];
  __local float *a_flm = (__local float *)a_alm;
  __local float *b_flm = (__local float *)b_alm;
#if SPLIT > 1 && SPLIT_FINISH
  __local int last_flm;
#endif

  const int tid = get_local_id(0);
  const int tm = tid % MDIMC, tn = tid / MDIMC;
  CONV_GEMM_TILE

  // ---- what stays fixed for this work-item's loads during the whole GK loop ----
  GATHER_LANES
  int col_base_apm[B_COLS], col_h_apm[B_COLS], col_w_apm[B_COLS];
  for (int j = 0; j < B_COLS; j++) {
    const int col = n0 + b_col0 + j * B_TN;
    B_COLUMN
  }

  float acc_apm[MWI][NWI];
  for (int i = 0; i < MWI; i++)
    for (int j = 0; j < NWI; j++) { acc_apm[i][j] = 0.0f; }

  float a_reg_apm[A_LANES][A_ROWS], b_reg_apm[B_LANES][B_COLS];
  GlobalToPrivateA(a_agm, a_offset, g, m0, k_begin, k_end, a_lane0, a_row0, a_reg_apm);
  GlobalToPrivateB(b_agm, b_offset, k_begin, k_end, b_lane0, col_base_apm, col_h_apm, col_w_apm, b_reg_apm);
  for (int k0 = k_begin; k0 < k_end; k0 += KWG) {
    // PrivateToLocal: a_alm[kk][m] = A[m0+m][k0+kk], b_alm[kk][col] = B[k0+kk][n0+col]
    for (int l = 0; l < A_LANES; l++)
      for (int i = 0; i < A_ROWS; i++) { a_flm[(a_lane0 + l * A_TK) * A_LD * VWM + a_row0 + i * A_TM] = a_reg_apm[l][i]; }
    for (int l = 0; l < B_LANES; l++)
      for (int j = 0; j < B_COLS; j++) { b_flm[(b_lane0 + l * B_TK) * B_LD * VWN + b_col0 + j * B_TN] = b_reg_apm[l][j]; }
    barrier(CLK_LOCAL_MEM_FENCE);
#if PREFETCH
    // the next step's global loads are in flight while this step multiplies
    if (k0 + KWG < k_end) {
      GlobalToPrivateA(a_agm, a_offset, g, m0, k0 + KWG, k_end, a_lane0, a_row0, a_reg_apm);
      GlobalToPrivateB(b_agm, b_offset, k0 + KWG, k_end, b_lane0, col_base_apm, col_h_apm, col_w_apm, b_reg_apm);
    }
#endif

    // ---- LocalToPrivate + multiply-accumulate ----
    for (int kk = 0; kk < KWG; kk++) {
      float a_apm[MWI], b_apm[NWI];
      for (int iv = 0; iv < MWI / VWM; iv++) { STORE_M(a_alm[kk][iv * MDIMC + tm], a_apm + iv * VWM); }
      for (int jv = 0; jv < NWI / VWN; jv++) { STORE_N(b_alm[kk][jv * NDIMC + tn], b_apm + jv * VWN); }
      for (int i = 0; i < MWI; i++)
        for (int j = 0; j < NWI; j++) { acc_apm[i][j] = fma(a_apm[i], b_apm[j], acc_apm[i][j]); }
    }
#if !PREFETCH
    if (k0 + KWG < k_end) {
      GlobalToPrivateA(a_agm, a_offset, g, m0, k0 + KWG, k_end, a_lane0, a_row0, a_reg_apm);
      GlobalToPrivateB(b_agm, b_offset, k0 + KWG, k_end, b_lane0, col_base_apm, col_h_apm, col_w_apm, b_reg_apm);
    }
#endif
    // the tiles are read: the next step may overwrite them. (At the end of the step rather than at the
    // start of the next: with the barrier first in the loop, PyPI's PoCL 3.0-rc2 computed
    // MWG 16, NWG 16, KWG 8, MDIMC 16, NDIMC 4 wrong; the same number of barriers either way.)
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  // ---- StoreC: element (i, j) of the work-item is C[m0 + mi][n0 + nj] ----
  for (int i = 0; i < MWI; i++) {
    const int m = m0 + ((i / VWM) * MDIMC + tm) * VWM + i % VWM;
    if (m >= GM) { continue; }
    float b = 0.0f;
#if DIRECTION == 0
    if (SPLIT == 1 && use_bias) { b = bias_agm[bias_offset + g * KG + m]; }
#endif
    for (int j = 0; j < NWI; j++) {
      const int col = n0 + ((j / VWN) * NDIMC + tn) * VWN + j % VWN;
      if (col >= GN) { continue; }
      OUT_INDEX(index, g, m, col)
#if SPLIT > 1
      ws_agm[split * OUT_SIZE + index] = acc_apm[i][j];
#else
      const float value = acc_apm[i][j] + b;
      out_agm[out_offset + index] = (beta != 0.0f) ? value + beta * out_agm[out_offset + index] : value;
#endif
    }
  }
#if SPLIT > 1 && SPLIT_FINISH
  // ---- the tile's last work-group adds the SPLIT parts, as split_reduce would (split_finish.cl): each of
  // its work-items the elements it stored; the tile's counter follows the parts in the workspace ----
  __global int *counters = (__global int *)(ws_agm + SPLIT * OUT_SIZE);
  if (!split_last(counters + (g * get_num_groups(1) + get_group_id(1)) * get_num_groups(0) + get_group_id(0),
                  &last_flm, SPLIT)) { return; }
  for (int i = 0; i < MWI; i++) {
    const int m = m0 + ((i / VWM) * MDIMC + tm) * VWM + i % VWM;
    if (m >= GM) { continue; }
    for (int j = 0; j < NWI; j++) {
      const int col = n0 + ((j / VWN) * NDIMC + tn) * VWN + j % VWN;
      if (col >= GN) { continue; }
      OUT_INDEX(index, g, m, col)
      float sum = 0.0f;
      for (int s = 0; s < SPLIT; s++) { sum += split_part(ws_agm, s * OUT_SIZE + index); }
#if DIRECTION == 0
      if (use_bias) { sum += bias_agm[bias_offset + g * KG + m]; }
#endif
      if (beta != 0.0f) { sum += beta * out_agm[out_offset + index]; }
      out_agm[out_offset + index] = sum;
    }
  }
#endif
}
