// conv_winograd.cl — the transforms of Winograd convolution F(M x M, 3 x 3) for 3x3 filters with
// stride 1 and dilation 1, fp32 NCHW; the ALPHA*ALPHA*G element-wise products between them
// (ALPHA = M + 2) are one batched GEMM of the GEMM family.
//
// Both directions are a forward convolution of an "in" tensor (CI channels, HI x WI) giving an
// "out" tensor (CO channels, HO x WO) with padding PH_IN x PW_IN (negative: crop):
//   fwd       in = x,  out = y,  filter f[co][ci] = w[co][ci]                    padding = pad
//   bwd_data  in = dy, out = dx, filter f[co][ci] = w[ci][co] rotated by 180°   padding = 2 - pad
// selected by FLIP (0 fwd, 1 bwd_data). Per group g, tile t of TILES_CHUNK (the chunk's images x
// TH x TW tiles of M x M outputs) and transform position xi < ALPHA*ALPHA:
//
//   winograd_filter  U[xi][g][co][ci] = (G f G^T)[xi]                                   (ALPHA x 3)
//   winograd_input   V[xi][g][ci][t]  = (B^T d B)[xi], d = the ALPHA x ALPHA input patch at
//                                       (M*ty - PH_IN, M*tx - PW_IN), zeros outside   (ALPHA x ALPHA)
//   (GEMM)           Z[xi][g][co][t]  = sum_ci U[xi][g][co][ci] * V[xi][g][ci][t]
//   winograd_output  out[n][co][M*ty + i][M*tx + j] = (A^T Z A)[i][j] (+ bias[co] in fwd)
//                                       (+ beta * out; beta == 0 never reads out)      (M x ALPHA)
//
// Variants: WINO_M = 2 selects F(2x2,3x3) (16 products, the transforms' coefficients are 0, ±1/2,
// ±1), WINO_M = 4 selects F(4x4,3x3) (36 products per 16 outputs instead of 16 per 4; coefficients
// up to 8, so rounding errors grow). A work-item transforms one tile of one channel; IWG work-items
// per work-group run along the tiles, so the planes of V and Z are read and written coalesced.

// ---- geometry of the forward convolution the kernels compute (the host passes all of them) ----
#ifndef GROUPS
  #define GROUPS 1      // channel groups
#endif
#ifndef CI
  #define CI 4          // "in" channels (C for fwd, K for bwd_data)
#endif
#ifndef CO
  #define CO 4          // "out" channels (K for fwd, C for bwd_data)
#endif
#ifndef HI
  #define HI 8          // "in" height
#endif
#ifndef WI
  #define WI 8          // "in" width
#endif
#ifndef HO
  #define HO 8          // "out" height
#endif
#ifndef WO
  #define WO 8          // "out" width
#endif
#ifndef PH_IN
  #define PH_IN 1       // rows of zero padding above the "in" tensor (negative: rows skipped)
#endif
#ifndef PW_IN
  #define PW_IN 1       // columns of zero padding left of the "in" tensor (negative: skipped)
#endif
#ifndef FLIP
  #define FLIP 0        // 0: filter = w (fwd); 1: filter = w transposed and rotated (bwd_data)
#endif
#ifndef CHUNK_N
  #define CHUNK_N 1     // images per pass
#endif
#ifndef T_LD
  #define T_LD 16       // elements between rows of V and Z: the chunk's tiles padded to 4
#endif

// ---- tunables ----
#ifndef WINO_M
  #define WINO_M 2      // outputs per tile side: 2 = F(2x2,3x3), 4 = F(4x4,3x3)
#endif
#ifndef IWG
  #define IWG 64        // work-items per work-group of the transforms
#endif

// ---- derived ----
#define ALPHA (WINO_M + 2)                    // transform tile side
#define XI (ALPHA * ALPHA)                    // transform positions = GEMMs per group
#define CIG (CI / GROUPS)
#define COG (CO / GROUPS)
#define TH ((HO + WINO_M - 1) / WINO_M)       // tile rows per image
#define TW ((WO + WINO_M - 1) / WINO_M)       // tile columns per image
#define TILES_CHUNK (CHUNK_N * TH * TW)

#if WINO_M == 2
__constant float G_acm[ALPHA][3] = {{1.0f, 0.0f, 0.0f}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f},
                                   {0.0f, 0.0f, 1.0f}};
__constant float BT_acm[ALPHA][ALPHA] = {{1.0f, 0.0f, -1.0f, 0.0f}, {0.0f, 1.0f, 1.0f, 0.0f},
                                        {0.0f, -1.0f, 1.0f, 0.0f}, {0.0f, 1.0f, 0.0f, -1.0f}};
__constant float AT_acm[WINO_M][ALPHA] = {{1.0f, 1.0f, 1.0f, 0.0f}, {0.0f, 1.0f, -1.0f, -1.0f}};
#elif WINO_M == 4
__constant float G_acm[ALPHA][3] = {
    {0.25f, 0.0f, 0.0f}, {-1.0f / 6.0f, -1.0f / 6.0f, -1.0f / 6.0f},
    {-1.0f / 6.0f, 1.0f / 6.0f, -1.0f / 6.0f}, {1.0f / 24.0f, 1.0f / 12.0f, 1.0f / 6.0f},
    {1.0f / 24.0f, -1.0f / 12.0f, 1.0f / 6.0f}, {0.0f, 0.0f, 1.0f}};
__constant float BT_acm[ALPHA][ALPHA] = {
    {4.0f, 0.0f, -5.0f, 0.0f, 1.0f, 0.0f}, {0.0f, -4.0f, -4.0f, 1.0f, 1.0f, 0.0f},
    {0.0f, 4.0f, -4.0f, -1.0f, 1.0f, 0.0f}, {0.0f, -2.0f, -1.0f, 2.0f, 1.0f, 0.0f},
    {0.0f, 2.0f, -1.0f, -2.0f, 1.0f, 0.0f}, {0.0f, 4.0f, 0.0f, -5.0f, 0.0f, 1.0f}};
__constant float AT_acm[WINO_M][ALPHA] = {
    {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f}, {0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.0f},
    {0.0f, 1.0f, 1.0f, 4.0f, 4.0f, 0.0f}, {0.0f, 1.0f, -1.0f, 8.0f, -8.0f, 1.0f}};
#endif

// launch: (round_up(CO * CIG, IWG)); U starts at u_offset of u_agm (the workspace, or a buffer that
// keeps the transformed filters of one weight version for later runs)
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void winograd_filter(__global const float *w_agm, const int w_offset, __global float *u_agm,
                     const int u_offset) {
  const int id = get_global_id(0);
  if (id >= CO * CIG) { return; }
  const int co = id / CIG, ci = id % CIG;             // co over all groups, ci within the group
  const int g = co / COG, col = co % COG;
  float f_apm[3][3];
  for (int r = 0; r < 3; r++) {
    for (int s = 0; s < 3; s++) {
#if FLIP
      // w is (CI) x (CO/G) x 3 x 3: in channel g*CIG+ci, out channel col, rotated by 180 degrees
      f_apm[r][s] = w_agm[w_offset + ((g * CIG + ci) * COG + col) * 9 + (2 - r) * 3 + (2 - s)];
#else
      f_apm[r][s] = w_agm[w_offset + (co * CIG + ci) * 9 + r * 3 + s];
#endif
    }
  }
  float gf_apm[ALPHA][3];                             // G f
  for (int i = 0; i < ALPHA; i++)
    for (int s = 0; s < 3; s++) {
      gf_apm[i][s] = G_acm[i][0] * f_apm[0][s] + G_acm[i][1] * f_apm[1][s] + G_acm[i][2] * f_apm[2][s];
    }
  for (int i = 0; i < ALPHA; i++)                     // (G f) G^T
    for (int j = 0; j < ALPHA; j++) {
      const float u = gf_apm[i][0] * G_acm[j][0] + gf_apm[i][1] * G_acm[j][1] + gf_apm[i][2] * G_acm[j][2];
      u_agm[u_offset + (((i * ALPHA + j) * GROUPS + g) * COG + col) * CIG + ci] = u;
    }
}

// launch: (round_up(TILES_CHUNK, IWG), CI); v_agm is the workspace at V's offset
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void winograd_input(__global const float *in_agm, const int in_offset, const int n0,
                    __global float *v_agm, const int v_offset) {
  const int t = get_global_id(0), c = get_global_id(1);
  if (t >= TILES_CHUNK) { return; }
  const int nb = t / (TH * TW), ty = (t / TW) % TH, tx = t % TW;
  const int h0 = ty * WINO_M - PH_IN, w0 = tx * WINO_M - PW_IN;
  const __global float *in_gm = in_agm + in_offset + ((n0 + nb) * CI + c) * HI * WI;
  float d_apm[ALPHA][ALPHA];
  for (int i = 0; i < ALPHA; i++)
    for (int j = 0; j < ALPHA; j++) {
      const int h = h0 + i, w = w0 + j;
      d_apm[i][j] = (h >= 0 && h < HI && w >= 0 && w < WI) ? in_gm[h * WI + w] : 0.0f;
    }
  float bd_apm[ALPHA][ALPHA];                         // B^T d
  for (int i = 0; i < ALPHA; i++)
    for (int j = 0; j < ALPHA; j++) {
      float sum = 0.0f;
      for (int k = 0; k < ALPHA; k++) { sum += BT_acm[i][k] * d_apm[k][j]; }
      bd_apm[i][j] = sum;
    }
  const int g = c / CIG, cl = c % CIG;
  for (int i = 0; i < ALPHA; i++)                     // (B^T d) B
    for (int j = 0; j < ALPHA; j++) {
      float sum = 0.0f;
      for (int k = 0; k < ALPHA; k++) { sum += bd_apm[i][k] * BT_acm[j][k]; }
      v_agm[v_offset + (((i * ALPHA + j) * GROUPS + g) * CIG + cl) * T_LD + t] = sum;
    }
}

// launch: (round_up(TILES_CHUNK, IWG), CO); z_agm is the workspace at Z's offset
__kernel __attribute__((reqd_work_group_size(IWG, 1, 1)))
void winograd_output(__global const float *z_agm, const int z_offset, const int n0,
                     __global float *out_agm, const int out_offset,
                     __global const float *bias_agm, const int bias_offset, const int use_bias,
                     const float beta) {
  const int t = get_global_id(0), c = get_global_id(1);
  if (t >= TILES_CHUNK) { return; }
  const int nb = t / (TH * TW), ty = (t / TW) % TH, tx = t % TW;
  const int g = c / COG, cl = c % COG;
  float z_apm[ALPHA][ALPHA];
  for (int i = 0; i < ALPHA; i++)
    for (int j = 0; j < ALPHA; j++) {
      z_apm[i][j] = z_agm[z_offset + (((i * ALPHA + j) * GROUPS + g) * COG + cl) * T_LD + t];
    }
  float az_apm[WINO_M][ALPHA];                        // A^T Z
  for (int i = 0; i < WINO_M; i++)
    for (int j = 0; j < ALPHA; j++) {
      float sum = 0.0f;
      for (int k = 0; k < ALPHA; k++) { sum += AT_acm[i][k] * z_apm[k][j]; }
      az_apm[i][j] = sum;
    }
  const float b = use_bias ? bias_agm[bias_offset + c] : 0.0f;
  for (int i = 0; i < WINO_M; i++) {                  // (A^T Z) A, stored inside the output
    const int h = ty * WINO_M + i;
    if (h >= HO) { break; }
    for (int j = 0; j < WINO_M; j++) {
      const int w = tx * WINO_M + j;
      if (w >= WO) { break; }
      float sum = 0.0f;
      for (int k = 0; k < ALPHA; k++) { sum += az_apm[i][k] * AT_acm[j][k]; }
      const int index = out_offset + (((n0 + nb) * CO + c) * HO + h) * WO + w;
      sum += b;
      out_agm[index] = (beta != 0.0f) ? sum + beta * out_agm[index] : sum;
    }
  }
}
