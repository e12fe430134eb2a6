// conv_gemm_view.cl — a convolution direction seen as one GEMM per group (GM x GN x GK, after
// conv_geometry.cl's macros), shared by the implicit-GEMM kernels: fwd is weights (GM = K/groups) times
// the im2col of the input (GN = N*P*Q, GK = C/groups*R*S); bwd_data is the transposed weights times
// the col2im view of dy (GM = C/groups, GN = N*H*W); bwd_weight is dy times the im2col of the input
// (GN = C/groups*R*S, GK = N*P*Q). OUT_SIZE is the output tensor's element count.
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
#endif
