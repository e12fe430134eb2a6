// conv_geometry.cl — the convolution problem's geometry macros, included with
// #include "conv_geometry.cl" by the conv kernels that index NCHW tensors directly. The host passes
// all of them (-D); these defaults only let a file compile alone. CONV_P x CONV_Q is the output size.
// Derived: CG, KG (input, output channels per group), RS (filter taps), HW, PQ (input, output pixels).
#ifndef CONV_GEOMETRY_CL
#define CONV_GEOMETRY_CL
#ifndef CONV_N
  #define CONV_N 1      // batch
#endif
#ifndef CONV_C
  #define CONV_C 4      // input channels
#endif
#ifndef CONV_H
  #define CONV_H 8      // input height
#endif
#ifndef CONV_W
  #define CONV_W 8      // input width
#endif
#ifndef CONV_K
  #define CONV_K 4      // output channels
#endif
#ifndef CONV_R
  #define CONV_R 3      // filter height
#endif
#ifndef CONV_S
  #define CONV_S 3      // filter width
#endif
#ifndef STRIDE_H
  #define STRIDE_H 1    // vertical stride
#endif
#ifndef STRIDE_W
  #define STRIDE_W 1    // horizontal stride
#endif
#ifndef PAD_H
  #define PAD_H 1       // zero padding above and below
#endif
#ifndef PAD_W
  #define PAD_W 1       // zero padding left and right
#endif
#ifndef DIL_H
  #define DIL_H 1       // vertical dilation
#endif
#ifndef DIL_W
  #define DIL_W 1       // horizontal dilation
#endif
#ifndef GROUPS
  #define GROUPS 1      // channel groups
#endif
#ifndef DIRECTION
  #define DIRECTION 0   // 0 fwd, 1 bwd_data, 2 bwd_weight
#endif
#ifndef CONV_P
  #define CONV_P ((CONV_H + 2 * PAD_H - DIL_H * (CONV_R - 1) - 1) / STRIDE_H + 1)  // output height
#endif
#ifndef CONV_Q
  #define CONV_Q ((CONV_W + 2 * PAD_W - DIL_W * (CONV_S - 1) - 1) / STRIDE_W + 1)  // output width
#endif

#define CG (CONV_C / GROUPS)
#define KG (CONV_K / GROUPS)
#define RS (CONV_R * CONV_S)
#define HW (CONV_H * CONV_W)
#define PQ (CONV_P * CONV_Q)

#endif
