// conv_gemm_view.cl — a convolution direction seen as one GEMM per group (GM x GN x GK, after
// conv_geometry.cl's macros), shared by the implicit-GEMM kernels: fwd is weights (GM = K/groups) times
// the im2col of the input (GN = N*P*Q, GK = C/groups*R*S); bwd_data is the transposed weights times
// the col2im view of dy (GM = C/groups, GN = N*H*W); bwd_weight is dy times the im2col of the input
// (GN = C/groups*R*S, GK = N*P*Q). OUT_SIZE is the output tensor's element count; CONV_GEMM_TILE,
// GATHER_LANES, B_COLUMN and OUT_INDEX serve the kernels' tiles, gathers and stores.
#ifndef CONV_GEMM_VIEW_CL
#define CONV_GEMM_VIEW_CL
#if DIRECTION == 0
  #define GM KG
  #define GN (CONV_N * PQ)
  #define GK (CG * RS)
  #define OUT_SIZE (CONV_N * CONV_K * PQ)
#elif DIRECTION == 1
  #define GM CG
  #define GN (CONV_N * HW)
  #define GK (KG * RS)
  #define OUT_SIZE (CONV_N * CONV_C * HW)
#else
  #define GM KG
  #define GN (CG * RS)
  #define GK (CONV_N * PQ)
  #define OUT_SIZE (CONV_K * CG * RS)
#endif

// A work-group's tile of the GEMM: n0, m0 (its first GN column and GM row), g (its group), split (its
// part of the reduction) and [k_begin, k_end) (that part of GK: KCHUNK per split, which the kernel defines).
#define CONV_GEMM_TILE                                                                              \
  const int n0 = get_group_id(0) * NWG, m0 = get_group_id(1) * MWG;                               \
  const int g = get_group_id(2) % GROUPS, split = get_group_id(2) / GROUPS;                       \
  const int k_begin = split * KCHUNK;                                                             \
  const int k_end = min(GK, k_begin + KCHUNK);

// index = the output tensor's element at GEMM row m, column col of group g
#if DIRECTION == 0
  #define OUT_INDEX(index, g, m, col) const int index = ((col / PQ) * CONV_K + g * KG + m) * PQ + col % PQ;
#elif DIRECTION == 1
  #define OUT_INDEX(index, g, m, col) const int index = ((col / HW) * CONV_C + g * CG + m) * HW + col % HW;
#else
  #define OUT_INDEX(index, g, m, col) const int index = (g * KG + m) * GN + col;
#endif

// This thread's first GK lane and GM row of the A gathers (a_lane0, a_row0; A_TK threads along GK) and
// first GK lane and GN column of the B gathers (b_lane0, b_col0; B_TK or B_TN threads along the tile's
// contiguous side), which the kernel defines
#if DIRECTION == 2
  #define GATHER_LANES                                                                              \
    const int a_lane0 = tid % A_TK, a_row0 = tid / A_TK;                                          \
    const int b_lane0 = tid % B_TK, b_col0 = tid / B_TK;
#else
  #define GATHER_LANES                                                                              \
    const int a_lane0 = tid % A_TK, a_row0 = tid / A_TK;                                          \
    const int b_col0 = tid % B_TN, b_lane0 = tid / B_TN;
#endif

// B column `col` (entry j of this thread's columns): the first input row and column its gathers read
// (col_h_apm[j], FAR_OUTSIDE past GN; col_w_apm[j]) and its base offset (col_base_apm[j])
#if DIRECTION == 0
  // an output pixel (n,p,q): its input window's top-left corner and base offset
  #define B_COLUMN                                                                                  \
    const int n = col / PQ, p = (col % PQ) / CONV_Q, q = col % CONV_Q;                            \
    col_h_apm[j] = (col < GN) ? p * STRIDE_H - PAD_H : FAR_OUTSIDE;                               \
    col_w_apm[j] = q * STRIDE_W - PAD_W;                                                          \
    col_base_apm[j] = (n * CONV_C + g * CG) * HW + (p * STRIDE_H - PAD_H) * CONV_W + q * STRIDE_W - PAD_W;
#elif DIRECTION == 1
  // an input pixel (n,h,w)
  #define B_COLUMN                                                                                  \
    const int n = col / HW, h = (col % HW) / CONV_W, w = col % CONV_W;                            \
    col_h_apm[j] = (col < GN) ? h + PAD_H : FAR_OUTSIDE;                                          \
    col_w_apm[j] = w + PAD_W;                                                                     \
    col_base_apm[j] = (n * CONV_K + g * KG) * PQ;
#else
  // a filter tap (c,r,s) of the weight gradient
  #define B_COLUMN                                                                                  \
    const int c = col / RS, r = (col % RS) / CONV_S, s = col % CONV_S;                            \
    col_h_apm[j] = (col < GN) ? r * DIL_H : FAR_OUTSIDE;                                          \
    col_w_apm[j] = s * DIL_W;                                                                     \
    col_base_apm[j] = (g * CG + c) * HW + r * DIL_H * CONV_W + s * DIL_W;
#endif
#endif
