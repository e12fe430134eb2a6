// conv_depthwise.cl — depthwise convolution, fp32 NCHW: groups == C, K = M*C (channel multiplier M),
// weight K x 1 x R x S, any stride, padding, dilation and filter size; output channel k reads input
// channel k / M:
//
//   fwd        y[n,k,p,q]  = sum_{r,s} x[n, k/M, p*SH-PH+r*DH, q*SW-PW+s*DW] * w[k,0,r,s]
//   bwd_data   dx[n,c,h,w] = sum_{j<M,r,s} dy[n, c*M+j, (h+PH-r*DH)/SH, (w+PW-s*DW)/SW] * w[c*M+j,0,r,s]
//                            (terms only where both divisions are exact and land inside dy)
//   bwd_weight dw[k,0,r,s] = sum_{n,p,q} x[n, k/M, p*SH-PH+r*DH, q*SW-PW+s*DW] * dy[n,k,p,q]
//
// fwd and bwd_data: a work-group of WGQ x WGP work-items computes a (WGP*TP) x (WGQ*TQ) tile of one
// output plane (image n, channel k for fwd / c for bwd_data); a work-item takes TP x TQ pixels
// strided by the work-group shape. The filter taps sit in registers when there are at most
// TAPS_IN_REGISTERS of them. Variant LOCAL=1 stages the input patch the tile reads in local memory.
// bwd_weight: a work-group of RWG work-items reduces its slice of N*P*Q for TPT filter taps of one
// channel, then sums the work-items' partials with a fixed tree in local memory (deterministic);
// SPLIT > 1 writes partial sums to the workspace for conv_common.cl's split_reduce, or with SPLIT_FINISH
// the last of a channel's tap block's SPLIT work-groups adds them itself (split_finish.cl, same order).
//
// Every kernel ends with out = result (+ bias[k] in fwd) (+ beta * out; beta == 0 never reads out).

// ---- problem geometry (the host passes all of them; defaults only let the file compile alone) ----
#include "conv_geometry.cl"  // CONV_N, CONV_C, ..., DIRECTION, CONV_P, CONV_Q
// DIRECTION (0 fwd, 1 bwd_data, 2 bwd_weight) picks the one kernel this build contains.

// ---- tunables ----
#ifndef TP
  #define TP 1          // output rows per work-item (fwd, bwd_data)
#endif
#ifndef TQ
  #define TQ 2          // output columns per work-item (fwd, bwd_data)
#endif
#ifndef WGP
  #define WGP 4         // work-items per work-group along output rows
#endif
#ifndef WGQ
  #define WGQ 8         // work-items per work-group along output columns
#endif
#ifndef LOCAL
  #define LOCAL 0       // 1: stage the input patch of the tile in local memory
#endif
#ifndef RWG
  #define RWG 64        // work-items per work-group reducing N*P*Q (bwd_weight), a power of two
#endif
#ifndef TPT
  #define TPT 1         // filter taps per work-item (bwd_weight)
#endif
#ifndef SPLIT
  #define SPLIT 1       // work-groups sharing one reduction (bwd_weight); > 1 writes the workspace
#endif
#ifndef SPLIT_FINISH
  #define SPLIT_FINISH 0  // host-set: 1 = with SPLIT > 1 the last work-group of a tap block adds the parts
#endif

// ---- derived ----
#define MULT (CONV_K / CONV_C)                // channel multiplier
#define WG_SIZE (WGP * WGQ)
#define TAPS_IN_REGISTERS 64                  // filters with more taps are read from global memory
#if RS <= TAPS_IN_REGISTERS
  #define TAP(w_gm, w_apm, rs) w_apm[rs]
#else
  #define TAP(w_gm, w_apm, rs) w_gm[rs]
#endif

#include "conv_direct_tiles.cl"  // TILE_P, TILE_Q, IN_TP, IN_TQ, DY_TP, DY_TQ, FLOOR_DIV, finish()

#if DIRECTION == 0   // only the direction's kernel is compiled: the others' local arrays would
                     // count against this build's limits
// =================================================================================================
// forward: work-group (WGQ, WGP); dimension 2 enumerates image x output channel.

__kernel __attribute__((reqd_work_group_size(WGQ, WGP, 1)))
void conv_depthwise_fwd(__global const float *x_agm, const int x_offset,
                        __global const float *w_agm, const int w_offset,
                        __global float *y_agm, const int y_offset,
                        __global const float *bias_agm, const int bias_offset, const int use_bias,
                        const float beta) {
  const int lq = get_local_id(0), lp = get_local_id(1);
  const int q0 = get_group_id(0) * TILE_Q, p0 = get_group_id(1) * TILE_P;
  const int k = get_group_id(2) % CONV_K, n = get_group_id(2) / CONV_K;
  const __global float *x_gm = x_agm + x_offset + (n * CONV_C + k / MULT) * HW;
  const __global float *w_gm = w_agm + w_offset + k * RS;
#if RS <= TAPS_IN_REGISTERS
  float w_apm[RS];
  for (int rs = 0; rs < RS; rs++) { w_apm[rs] = w_gm[rs]; }
#endif
  float acc_apm[TP][TQ];
  for (int tp = 0; tp < TP; tp++)
    for (int tq = 0; tq < TQ; tq++) { acc_apm[tp][tq] = 0.0f; }

#if LOCAL
  __local float x_alm[IN_TP * IN_TQ];
  const int lid = lp * WGQ + lq;
  const int h_base = p0 * STRIDE_H - PAD_H, w_base = q0 * STRIDE_W - PAD_W;
  for (int e = lid; e < IN_TP * IN_TQ; e += WG_SIZE) {      // GlobalToLocalX, zero-padded
    const int ih = h_base + e / IN_TQ, iw = w_base + e % IN_TQ;
    x_alm[e] = (ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W) ? x_gm[ih * CONV_W + iw] : 0.0f;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int r = 0; r < CONV_R; r++) {
    for (int s = 0; s < CONV_S; s++) {
      const float wv = TAP(w_gm, w_apm, r * CONV_S + s);
      for (int tp = 0; tp < TP; tp++) {
        for (int tq = 0; tq < TQ; tq++) {
          const int ih = (tp * WGP + lp) * STRIDE_H + r * DIL_H;
          const int iw = (tq * WGQ + lq) * STRIDE_W + s * DIL_W;
          acc_apm[tp][tq] = fma(wv, x_alm[ih * IN_TQ + iw], acc_apm[tp][tq]);
        }
      }
    }
  }
#else
  for (int r = 0; r < CONV_R; r++) {
    for (int s = 0; s < CONV_S; s++) {
      const float wv = TAP(w_gm, w_apm, r * CONV_S + s);
      for (int tp = 0; tp < TP; tp++) {
        const int ih = (p0 + tp * WGP + lp) * STRIDE_H - PAD_H + r * DIL_H;
        if (ih < 0 || ih >= CONV_H) { continue; }
        for (int tq = 0; tq < TQ; tq++) {
          const int iw = (q0 + tq * WGQ + lq) * STRIDE_W - PAD_W + s * DIL_W;
          if (iw >= 0 && iw < CONV_W) { acc_apm[tp][tq] = fma(wv, x_gm[ih * CONV_W + iw], acc_apm[tp][tq]); }
        }
      }
    }
  }
#endif

  const float b = use_bias ? bias_agm[bias_offset + k] : 0.0f;
  for (int tp = 0; tp < TP; tp++) {                          // StoreY
    const int p = p0 + tp * WGP + lp;
    for (int tq = 0; tq < TQ; tq++) {
      const int q = q0 + tq * WGQ + lq;
      if (p < CONV_P && q < CONV_Q) {
        const int index = y_offset + ((n * CONV_K + k) * CONV_P + p) * CONV_Q + q;
        y_agm[index] = finish(acc_apm[tp][tq] + b, y_agm, index, beta);
      }
    }
  }
}

#elif DIRECTION == 1
// =================================================================================================
// backward data: work-group (WGQ, WGP) over a tile of dx; dimension 2 enumerates image x input channel;
// the reduction runs over the channel's M output channels and the filter taps.

__kernel __attribute__((reqd_work_group_size(WGQ, WGP, 1)))
void conv_depthwise_bwd_data(__global const float *dy_agm, const int dy_offset,
                             __global const float *w_agm, const int w_offset,
                             __global float *dx_agm, const int dx_offset, const float beta) {
  const int lq = get_local_id(0), lp = get_local_id(1);
  const int w0 = get_group_id(0) * TILE_Q, h0 = get_group_id(1) * TILE_P;
  const int c = get_group_id(2) % CONV_C, n = get_group_id(2) / CONV_C;
  float acc_apm[TP][TQ];
  for (int tp = 0; tp < TP; tp++)
    for (int tq = 0; tq < TQ; tq++) { acc_apm[tp][tq] = 0.0f; }
#if LOCAL
  __local float dy_alm[DY_TP * DY_TQ];
  const int lid = lp * WGQ + lq;
  const int p_lo = FLOOR_DIV(h0 + PAD_H - (CONV_R - 1) * DIL_H, STRIDE_H);
  const int q_lo = FLOOR_DIV(w0 + PAD_W - (CONV_S - 1) * DIL_W, STRIDE_W);
#endif

  for (int j = 0; j < MULT; j++) {
    const int k = c * MULT + j;
    const __global float *dy_gm = dy_agm + dy_offset + (n * CONV_K + k) * PQ;
    const __global float *w_gm = w_agm + w_offset + k * RS;
#if RS <= TAPS_IN_REGISTERS
    float w_apm[RS];
    for (int rs = 0; rs < RS; rs++) { w_apm[rs] = w_gm[rs]; }
#endif
#if LOCAL
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = lid; e < DY_TP * DY_TQ; e += WG_SIZE) {     // GlobalToLocalDy, zero outside dy
      const int p = p_lo + e / DY_TQ, q = q_lo + e % DY_TQ;
      dy_alm[e] = (p >= 0 && p < CONV_P && q >= 0 && q < CONV_Q) ? dy_gm[p * CONV_Q + q] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = 0; r < CONV_R; r++) {
      for (int s = 0; s < CONV_S; s++) {
        const float wv = TAP(w_gm, w_apm, r * CONV_S + s);
        for (int tp = 0; tp < TP; tp++) {
          const int hp = h0 + tp * WGP + lp + PAD_H - r * DIL_H - p_lo * STRIDE_H;  // >= 0
          if (hp % STRIDE_H != 0) { continue; }
          for (int tq = 0; tq < TQ; tq++) {
            const int wp = w0 + tq * WGQ + lq + PAD_W - s * DIL_W - q_lo * STRIDE_W;
            if (wp % STRIDE_W != 0) { continue; }
            acc_apm[tp][tq] = fma(wv, dy_alm[(hp / STRIDE_H) * DY_TQ + wp / STRIDE_W], acc_apm[tp][tq]);
          }
        }
      }
    }
#else
    for (int r = 0; r < CONV_R; r++) {
      for (int s = 0; s < CONV_S; s++) {
        const float wv = TAP(w_gm, w_apm, r * CONV_S + s);
        for (int tp = 0; tp < TP; tp++) {
          const int hp = h0 + tp * WGP + lp + PAD_H - r * DIL_H;
          if (hp < 0 || hp % STRIDE_H != 0 || hp / STRIDE_H >= CONV_P) { continue; }
          for (int tq = 0; tq < TQ; tq++) {
            const int wp = w0 + tq * WGQ + lq + PAD_W - s * DIL_W;
            if (wp < 0 || wp % STRIDE_W != 0 || wp / STRIDE_W >= CONV_Q) { continue; }
            acc_apm[tp][tq] = fma(wv, dy_gm[(hp / STRIDE_H) * CONV_Q + wp / STRIDE_W], acc_apm[tp][tq]);
          }
        }
      }
    }
#endif
  }

  for (int tp = 0; tp < TP; tp++) {                          // StoreDx
    const int h = h0 + tp * WGP + lp;
    for (int tq = 0; tq < TQ; tq++) {
      const int w = w0 + tq * WGQ + lq;
      if (h < CONV_H && w < CONV_W) {
        const int index = dx_offset + ((n * CONV_C + c) * CONV_H + h) * CONV_W + w;
        dx_agm[index] = finish(acc_apm[tp][tq], dx_agm, index, beta);
      }
    }
  }
}

#else
// =================================================================================================
// backward weight: dimension 0 enumerates output channel x tap block (RWG work-items each),
// dimension 1 the reduction split.
#define TAP_BLOCKS ((RS + TPT - 1) / TPT)
#define NPQ (CONV_N * PQ)
#define SPLIT_LEN ((NPQ + SPLIT - 1) / SPLIT)
#define DW_SIZE (CONV_K * RS)

#if SPLIT > 1 && SPLIT_FINISH
  #include "split_finish.cl"  // split_last, split_part
#endif

__kernel __attribute__((reqd_work_group_size(RWG, 1, 1)))
void conv_depthwise_bwd_weight(__global const float *x_agm, const int x_offset,
                               __global const float *dy_agm, const int dy_offset,
                               __global float *dw_agm, const int dw_offset,
                               __global float *ws_agm, const float beta) {
  const int lid = get_local_id(0);
  const int tb = get_group_id(0) % TAP_BLOCKS, k = get_group_id(0) / TAP_BLOCKS;
  const int split = get_group_id(1);
  const int i_end = min(NPQ, (split + 1) * SPLIT_LEN);
  int r_apm[TPT], s_apm[TPT];
  for (int t = 0; t < TPT; t++) {
    const int rs = min(tb * TPT + t, RS - 1);               // clamped: spare taps are never stored
    r_apm[t] = rs / CONV_S;
    s_apm[t] = rs % CONV_S;
  }
  float acc_apm[TPT];
  for (int t = 0; t < TPT; t++) { acc_apm[t] = 0.0f; }

  for (int i = split * SPLIT_LEN + lid; i < i_end; i += RWG) {
    const int n = i / PQ, pq = i % PQ;
    const int p = pq / CONV_Q, q = pq % CONV_Q;
    const float dv = dy_agm[dy_offset + (n * CONV_K + k) * PQ + pq];
    const __global float *x_gm = x_agm + x_offset + (n * CONV_C + k / MULT) * HW;
    for (int t = 0; t < TPT; t++) {
      const int ih = p * STRIDE_H - PAD_H + r_apm[t] * DIL_H, iw = q * STRIDE_W - PAD_W + s_apm[t] * DIL_W;
      if (ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W) { acc_apm[t] = fma(dv, x_gm[ih * CONV_W + iw], acc_apm[t]); }
    }
  }

  __local float red_alm[TPT][RWG];                         // ReduceLocal: a fixed tree
  for (int t = 0; t < TPT; t++) { red_alm[t][lid] = acc_apm[t]; }
  for (int width = RWG / 2; width > 0; width /= 2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < width) {
      for (int t = 0; t < TPT; t++) { red_alm[t][lid] += red_alm[t][lid + width]; }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int t = lid; t < TPT; t += RWG) {                   // StoreDw
    const int rs = tb * TPT + t;
    if (rs < RS) {
      const int index = k * RS + rs;
      STORE_DW(index, red_alm[t][0])
    }
  }
#if SPLIT > 1 && SPLIT_FINISH
  // the last of the SPLIT work-groups of this channel's tap block: split_reduce's sums of its taps (the
  // counters follow the parts in the workspace)
  __local int last_flm;
  if (!split_last((__global int *)(ws_agm + SPLIT * DW_SIZE) + get_group_id(0), &last_flm, SPLIT)) { return; }
  for (int t = lid; t < TPT; t += RWG) {
    const int rs = tb * TPT + t;
    if (rs < RS) {
      const int index = k * RS + rs;
      float sum = 0.0f;
      for (int s = 0; s < SPLIT; s++) { sum += split_part(ws_agm, s * DW_SIZE + index); }
      if (beta != 0.0f) { sum += beta * dw_agm[dw_offset + index]; }
      dw_agm[dw_offset + index] = sum;
    }
  }
#endif
}
#endif
