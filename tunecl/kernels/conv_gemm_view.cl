// conv_gemm_view.cl — a convolution direction seen as one GEMM per group (GM x GN x GK, after
// conv_geometry.cl's macros), shared by the implicit-GEMM kernels: fwd is weights (GM = K/groups) times
// the im2col of the input (GN = N*P*Q, GK = C/groups*R*S); bwd_data is the transposed weights times
// the col2im view of dy (GM = C/groups, GN = N*H*W); bwd_weight is dy times the im2col of the input
// (GN = C/groups*R*S, GK = N*P*Q). OUT_SIZE is the output tensor's element count; CONV_GEMM_TILE and
// OUT_INDEX serve the kernels' tiles and stores.
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
#endif
