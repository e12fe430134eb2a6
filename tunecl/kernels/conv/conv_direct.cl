// conv_direct.cl — tiled direct convolution, fp32 NCHW, weight K x (C/G) x R x S, any stride,
// padding, dilation and groups, all three directions:
//
//   fwd        y[n,k,p,q]  = sum_{c<CG,r,s} x[n, g*CG+c, p*SH-PH+r*DH, q*SW-PW+s*DW] * w[k,c,r,s]
//   bwd_data   dx[n,c,h,w] = sum_{k<KG,r,s} dy[n, g*KG+k, (h+PH-r*DH)/SH, (w+PW-s*DW)/SW] * w[k,c,r,s]
//                            (terms only where both divisions are exact and land inside dy)
//   bwd_weight dw[k,c,r,s] = sum_{n,p,q} x[n, g*CG+c, p*SH-PH+r*DH, q*SW-PW+s*DW] * dy[n,k,p,q]
//
// fwd and bwd_data: a work-item computes TP x TQ output pixels (rows x columns, strided by the
// work-group shape WGP x WGQ so neighbouring work-items touch neighbouring pixels) for KPT output
// channels; WGK work-items along dimension 2 take consecutive channel blocks of one image.
// Variants: LOCAL=1 stages CCH reduction channels of the input patch the work-group's tile reads,
// and their weights, in local memory per step; LOCAL=0 reads global memory directly (caches do the
// reuse). UNROLL=1 asks the compiler to unroll the filter loops.
// bwd_weight: a work-group of RWG work-items reduces its slice of N*P*Q for KPT x CPT weights of one
// filter tap, then a tree in local memory sums the work-items' partials (fixed order: deterministic).
// SPLIT > 1 splits N*P*Q over SPLIT work-groups that write partial sums to the workspace, which
// conv_common.cl's split_reduce adds up in a fixed order.
//
// Every kernel ends with out = result (+ bias[k] in fwd) (+ beta * out; beta == 0 never reads out).

// ---- problem geometry (the host passes all of them; defaults only let the file compile alone) ----
#include "conv_geometry.cl"  // CONV_N, CONV_C, ..., DIRECTION, CONV_P, CONV_Q

// ---- tunables ----
#ifndef TP
  #define TP 1          // output rows per work-item (fwd, bwd_data)
#endif
#ifndef TQ
  #define TQ 4          // output columns per work-item (fwd, bwd_data)
#endif
#ifndef KPT
  #define KPT 4         // output channels per work-item
#endif
#ifndef CPT
  #define CPT 1         // input channels per work-item (bwd_weight)
#endif
#ifndef WGP
  #define WGP 4         // work-items per work-group along output rows
#endif
#ifndef WGQ
  #define WGQ 8         // work-items per work-group along output columns
#endif
#ifndef WGK
  #define WGK 1         // work-items per work-group along output channels
#endif
#ifndef LOCAL
  #define LOCAL 0       // 1: stage the input patch and weights in local memory
#endif
#ifndef CCH
  #define CCH 1         // reduction channels per local-memory step (LOCAL=1)
#endif
#ifndef UNROLL
  #define UNROLL 0      // 1: unroll the filter loops
#endif
#ifndef RWG
  #define RWG 64        // work-items per work-group reducing N*P*Q (bwd_weight), a power of two
#endif
#ifndef SPLIT
  #define SPLIT 1       // work-groups sharing one reduction (bwd_weight); > 1 writes the workspace
#endif

// ---- derived ----
#define KWG (WGK * KPT)                       // output channels of a work-group
#define WG_SIZE (WGP * WGQ * WGK)
#if UNROLL
  #define UNROLL_TAPS _Pragma("unroll")   // over the filter rows and columns
#else
  #define UNROLL_TAPS
#endif

#include "conv_direct_tiles.cl"  // TILE_P, TILE_Q, IN_TP, IN_TQ, DY_TP, DY_TQ, FLOOR_DIV, finish()

#if DIRECTION == 0   // only the direction's kernel is compiled: the others' local arrays would
                     // count against this build's limits
// =================================================================================================
// forward: work-group = (WGQ, WGP, WGK); dimension 2 enumerates images x groups x channel blocks.
#define KBLOCKS_FWD ((KG + KWG - 1) / KWG)

__kernel __attribute__((reqd_work_group_size(WGQ, WGP, WGK)))
void conv_direct_fwd(__global const float *x_agm, const int x_offset,
                     __global const float *w_agm, const int w_offset,
                     __global float *y_agm, const int y_offset,
                     __global const float *bias_agm, const int bias_offset, const int use_bias,
                     const float beta) {
  const int lq = get_local_id(0), lp = get_local_id(1), lk = get_local_id(2);
  const int q0 = get_group_id(0) * TILE_Q, p0 = get_group_id(1) * TILE_P;
  const int z = get_group_id(2);
  const int kb = z % KBLOCKS_FWD;
  const int g = (z / KBLOCKS_FWD) % GROUPS;
  const int n = z / (KBLOCKS_FWD * GROUPS);
  const int kl0 = kb * KWG + lk * KPT;                // first channel of this work-item, within the group
  const __global float *x_gm = x_agm + x_offset + (n * CONV_C + g * CG) * HW;
  const __global float *w_gm = w_agm + w_offset + (g * KG) * CG * RS;

  float acc_apm[KPT][TP][TQ];
  for (int kk = 0; kk < KPT; kk++)
    for (int tp = 0; tp < TP; tp++)
      for (int tq = 0; tq < TQ; tq++) { acc_apm[kk][tp][tq] = 0.0f; }

#if LOCAL
  __local float x_alm[CCH * IN_TP * IN_TQ];
  __local float w_alm[KWG * CCH * RS];
  const int lid = (lk * WGP + lp) * WGQ + lq;
  const int h_base = p0 * STRIDE_H - PAD_H, w_base = q0 * STRIDE_W - PAD_W;
  for (int c0 = 0; c0 < CG; c0 += CCH) {
    barrier(CLK_LOCAL_MEM_FENCE);
    // GlobalToLocalX: the zero-padded input patch of CCH channels
    for (int e = lid; e < CCH * IN_TP * IN_TQ; e += WG_SIZE) {
      const int cc = e / (IN_TP * IN_TQ), rem = e % (IN_TP * IN_TQ);
      const int ih = h_base + rem / IN_TQ, iw = w_base + rem % IN_TQ;
      float v = 0.0f;
      if (c0 + cc < CG && ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W) {
        v = x_gm[(c0 + cc) * HW + ih * CONV_W + iw];
      }
      x_alm[e] = v;
    }
    // GlobalToLocalW: the work-group's KWG channels x CCH channels x R x S weights
    for (int e = lid; e < KWG * CCH * RS; e += WG_SIZE) {
      const int kk = e / (CCH * RS), cc = (e / RS) % CCH, rs = e % RS;
      const int kl = kb * KWG + kk;
      w_alm[e] = (kl < KG && c0 + cc < CG) ? w_gm[(kl * CG + c0 + cc) * RS + rs] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int cc = 0; cc < CCH; cc++) {
      UNROLL_TAPS
      for (int r = 0; r < CONV_R; r++) {
        UNROLL_TAPS
        for (int s = 0; s < CONV_S; s++) {
          float w_apm[KPT];
          for (int kk = 0; kk < KPT; kk++) { w_apm[kk] = w_alm[((lk * KPT + kk) * CCH + cc) * RS + r * CONV_S + s]; }
          for (int tp = 0; tp < TP; tp++) {
            for (int tq = 0; tq < TQ; tq++) {
              const int ih = (tp * WGP + lp) * STRIDE_H + r * DIL_H;
              const int iw = (tq * WGQ + lq) * STRIDE_W + s * DIL_W;
              const float xv = x_alm[(cc * IN_TP + ih) * IN_TQ + iw];
              for (int kk = 0; kk < KPT; kk++) { acc_apm[kk][tp][tq] = fma(w_apm[kk], xv, acc_apm[kk][tp][tq]); }
            }
          }
        }
      }
    }
  }
#else
  for (int c = 0; c < CG; c++) {
    UNROLL_TAPS
    for (int r = 0; r < CONV_R; r++) {
      UNROLL_TAPS
      for (int s = 0; s < CONV_S; s++) {
        float w_apm[KPT];
        for (int kk = 0; kk < KPT; kk++) {
          w_apm[kk] = (kl0 + kk < KG) ? w_gm[((kl0 + kk) * CG + c) * RS + r * CONV_S + s] : 0.0f;
        }
        for (int tp = 0; tp < TP; tp++) {
          const int ih = (p0 + tp * WGP + lp) * STRIDE_H - PAD_H + r * DIL_H;
          for (int tq = 0; tq < TQ; tq++) {
            const int iw = (q0 + tq * WGQ + lq) * STRIDE_W - PAD_W + s * DIL_W;
            const float xv = (ih >= 0 && ih < CONV_H && iw >= 0 && iw < CONV_W)
                                 ? x_gm[c * HW + ih * CONV_W + iw] : 0.0f;
            for (int kk = 0; kk < KPT; kk++) { acc_apm[kk][tp][tq] = fma(w_apm[kk], xv, acc_apm[kk][tp][tq]); }
          }
        }
      }
    }
  }
#endif

  // StoreY
  for (int kk = 0; kk < KPT; kk++) {
    const int kl = kl0 + kk;
    if (kl >= KG) { break; }
    const int k = g * KG + kl;
    const float b = use_bias ? bias_agm[bias_offset + k] : 0.0f;
    for (int tp = 0; tp < TP; tp++) {
      const int p = p0 + tp * WGP + lp;
      for (int tq = 0; tq < TQ; tq++) {
        const int q = q0 + tq * WGQ + lq;
        if (p < CONV_P && q < CONV_Q) {
          const int index = y_offset + ((n * CONV_K + k) * CONV_P + p) * CONV_Q + q;
          y_agm[index] = finish(acc_apm[kk][tp][tq] + b, y_agm, index, beta);
        }
      }
    }
  }
}

#elif DIRECTION == 1
// =================================================================================================
// backward data: the same tiling over dx (rows h = TP x WGP, columns w = TQ x WGQ, KPT input channels
// per work-item); the reduction runs over the group's KG output channels and the filter taps.
#define CBLOCKS_BWD ((CG + KWG - 1) / KWG)

__kernel __attribute__((reqd_work_group_size(WGQ, WGP, WGK)))
void conv_direct_bwd_data(__global const float *dy_agm, const int dy_offset,
                          __global const float *w_agm, const int w_offset,
                          __global float *dx_agm, const int dx_offset, const float beta) {
  const int lq = get_local_id(0), lp = get_local_id(1), lk = get_local_id(2);
  const int w0 = get_group_id(0) * TILE_Q, h0 = get_group_id(1) * TILE_P;
  const int z = get_group_id(2);
  const int cb = z % CBLOCKS_BWD;
  const int g = (z / CBLOCKS_BWD) % GROUPS;
  const int n = z / (CBLOCKS_BWD * GROUPS);
  const int cl0 = cb * KWG + lk * KPT;                // first input channel of this work-item, in the group
  const __global float *dy_gm = dy_agm + dy_offset + (n * CONV_K + g * KG) * PQ;
  const __global float *w_gm = w_agm + w_offset + (g * KG) * CG * RS;

  float acc_apm[KPT][TP][TQ];
  for (int cc = 0; cc < KPT; cc++)
    for (int tp = 0; tp < TP; tp++)
      for (int tq = 0; tq < TQ; tq++) { acc_apm[cc][tp][tq] = 0.0f; }

#if LOCAL
  __local float dy_alm[CCH * DY_TP * DY_TQ];
  __local float w_alm[CCH * KWG * RS];
  const int lid = (lk * WGP + lp) * WGQ + lq;
  // first dy row / column any pixel of the tile reads
  const int p_lo = FLOOR_DIV(h0 + PAD_H - (CONV_R - 1) * DIL_H, STRIDE_H);
  const int q_lo = FLOOR_DIV(w0 + PAD_W - (CONV_S - 1) * DIL_W, STRIDE_W);
  for (int k0 = 0; k0 < KG; k0 += CCH) {
    barrier(CLK_LOCAL_MEM_FENCE);
    // GlobalToLocalDy: CCH channels of the dy patch, zero outside dy
    for (int e = lid; e < CCH * DY_TP * DY_TQ; e += WG_SIZE) {
      const int kk = e / (DY_TP * DY_TQ), rem = e % (DY_TP * DY_TQ);
      const int p = p_lo + rem / DY_TQ, q = q_lo + rem % DY_TQ;
      float v = 0.0f;
      if (k0 + kk < KG && p >= 0 && p < CONV_P && q >= 0 && q < CONV_Q) {
        v = dy_gm[(k0 + kk) * PQ + p * CONV_Q + q];
      }
      dy_alm[e] = v;
    }
    // GlobalToLocalW: CCH output channels x the work-group's KWG input channels x R x S
    for (int e = lid; e < CCH * KWG * RS; e += WG_SIZE) {
      const int kk = e / (KWG * RS), ci = (e / RS) % KWG, rs = e % RS;
      const int cl = cb * KWG + ci;
      w_alm[e] = (k0 + kk < KG && cl < CG) ? w_gm[((k0 + kk) * CG + cl) * RS + rs] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < CCH; kk++) {
      UNROLL_TAPS
      for (int r = 0; r < CONV_R; r++) {
        UNROLL_TAPS
        for (int s = 0; s < CONV_S; s++) {
          float w_apm[KPT];
          for (int cc = 0; cc < KPT; cc++) { w_apm[cc] = w_alm[(kk * KWG + lk * KPT + cc) * RS + r * CONV_S + s]; }
          for (int tp = 0; tp < TP; tp++) {
            // (h + PAD_H - r*DIL_H) - p_lo*STRIDE_H >= 0: its remainder decides whether the tap hits dy
            const int hp = h0 + tp * WGP + lp + PAD_H - r * DIL_H - p_lo * STRIDE_H;
            if (hp % STRIDE_H != 0) { continue; }
            for (int tq = 0; tq < TQ; tq++) {
              const int wp = w0 + tq * WGQ + lq + PAD_W - s * DIL_W - q_lo * STRIDE_W;
              if (wp % STRIDE_W != 0) { continue; }
              const float dv = dy_alm[(kk * DY_TP + hp / STRIDE_H) * DY_TQ + wp / STRIDE_W];
              for (int cc = 0; cc < KPT; cc++) { acc_apm[cc][tp][tq] = fma(w_apm[cc], dv, acc_apm[cc][tp][tq]); }
            }
          }
        }
      }
    }
  }
#else
  for (int k = 0; k < KG; k++) {
    UNROLL_TAPS
    for (int r = 0; r < CONV_R; r++) {
      UNROLL_TAPS
      for (int s = 0; s < CONV_S; s++) {
        float w_apm[KPT];
        for (int cc = 0; cc < KPT; cc++) {
          w_apm[cc] = (cl0 + cc < CG) ? w_gm[(k * CG + cl0 + cc) * RS + r * CONV_S + s] : 0.0f;
        }
        for (int tp = 0; tp < TP; tp++) {
          const int hp = h0 + tp * WGP + lp + PAD_H - r * DIL_H;
          if (hp < 0 || hp % STRIDE_H != 0 || hp / STRIDE_H >= CONV_P) { continue; }
          for (int tq = 0; tq < TQ; tq++) {
            const int wp = w0 + tq * WGQ + lq + PAD_W - s * DIL_W;
            if (wp < 0 || wp % STRIDE_W != 0 || wp / STRIDE_W >= CONV_Q) { continue; }
            const float dv = dy_gm[k * PQ + (hp / STRIDE_H) * CONV_Q + wp / STRIDE_W];
            for (int cc = 0; cc < KPT; cc++) { acc_apm[cc][tp][tq] = fma(w_apm[cc], dv, acc_apm[cc][tp][tq]); }
          }
        }
      }
    }
  }
#endif

  // StoreDx
  for (int cc = 0; cc < KPT; cc++) {
    const int cl = cl0 + cc;
    if (cl >= CG) { break; }
    for (int tp = 0; tp < TP; tp++) {
      const int h = h0 + tp * WGP + lp;
      for (int tq = 0; tq < TQ; tq++) {
        const int w = w0 + tq * WGQ + lq;
        if (h < CONV_H && w < CONV_W) {
          const int index = dx_offset + ((n * CONV_C + g * CG + cl) * CONV_H + h) * CONV_W + w;
          dx_agm[index] = finish(acc_apm[cc][tp][tq], dx_agm, index, beta);
        }
      }
    }
  }
}

#else
// =================================================================================================
// backward weight: one work-group per (group, KPT-channel block, CPT-channel block, filter tap) along
// dimension 0 and per reduction split along dimension 1.
#define KBLOCKS_BWW ((KG + KPT - 1) / KPT)
#define CBLOCKS_BWW ((CG + CPT - 1) / CPT)
#define NPQ (CONV_N * PQ)
#define SPLIT_LEN ((NPQ + SPLIT - 1) / SPLIT)
#define DW_SIZE (CONV_K * CG * RS)

__kernel __attribute__((reqd_work_group_size(RWG, 1, 1)))
void conv_direct_bwd_weight(__global const float *x_agm, const int x_offset,
                            __global const float *dy_agm, const int dy_offset,
                            __global float *dw_agm, const int dw_offset,
                            __global float *ws_agm, const float beta) {
  const int lid = get_local_id(0);
  int t = get_group_id(0);
  const int rs = t % RS;             t /= RS;
  const int cb = t % CBLOCKS_BWW;    t /= CBLOCKS_BWW;
  const int kb = t % KBLOCKS_BWW;
  const int g = t / KBLOCKS_BWW;
  const int r = rs / CONV_S, s = rs % CONV_S;
  const int split = get_group_id(1);
  const int i_end = min(NPQ, (split + 1) * SPLIT_LEN);

  float acc_apm[KPT][CPT];
  for (int kk = 0; kk < KPT; kk++)
    for (int cc = 0; cc < CPT; cc++) { acc_apm[kk][cc] = 0.0f; }

  for (int i = split * SPLIT_LEN + lid; i < i_end; i += RWG) {
    const int n = i / PQ, pq = i % PQ;
    const int p = pq / CONV_Q, q = pq % CONV_Q;
    const int ih = p * STRIDE_H - PAD_H + r * DIL_H, iw = q * STRIDE_W - PAD_W + s * DIL_W;
    if (ih < 0 || ih >= CONV_H || iw < 0 || iw >= CONV_W) { continue; }
    float x_apm[CPT];
    for (int cc = 0; cc < CPT; cc++) {
      const int cl = min(cb * CPT + cc, CG - 1);      // clamped: the spare lanes are never stored
      x_apm[cc] = x_agm[x_offset + ((n * CONV_C + g * CG + cl) * CONV_H + ih) * CONV_W + iw];
    }
    for (int kk = 0; kk < KPT; kk++) {
      const int kl = min(kb * KPT + kk, KG - 1);
      const float dv = dy_agm[dy_offset + (n * CONV_K + g * KG + kl) * PQ + pq];
      for (int cc = 0; cc < CPT; cc++) { acc_apm[kk][cc] = fma(dv, x_apm[cc], acc_apm[kk][cc]); }
    }
  }

  // ReduceLocal: a fixed tree over the RWG partials of each of the KPT x CPT weights
  __local float red_alm[KPT * CPT][RWG];
  for (int kk = 0; kk < KPT; kk++)
    for (int cc = 0; cc < CPT; cc++) { red_alm[kk * CPT + cc][lid] = acc_apm[kk][cc]; }
  for (int width = RWG / 2; width > 0; width /= 2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < width) {
      for (int e = 0; e < KPT * CPT; e++) { red_alm[e][lid] += red_alm[e][lid + width]; }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);

  // StoreDw: work-item e writes weight e of the block
  for (int e = lid; e < KPT * CPT; e += RWG) {
    const int kl = kb * KPT + e / CPT, cl = cb * CPT + e % CPT;
    if (kl < KG && cl < CG) {
      const int index = ((g * KG + kl) * CG + cl) * RS + rs;
      STORE_DW(index, red_alm[e][0])
    }
  }
}
#endif
