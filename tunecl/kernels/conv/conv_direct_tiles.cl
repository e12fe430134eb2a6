// conv_direct_tiles.cl — what the direct convolutions (conv_direct.cl, conv_depthwise.cl) share,
// included with #include "conv_direct_tiles.cl" after conv_geometry.cl and TP, TQ, WGP, WGQ, SPLIT are defined:
//   TILE_P, TILE_Q   output rows / columns of a work-group's tile (fwd; dx rows / columns in bwd_data);
//   IN_TP, IN_TQ     rows / columns of the input patch a forward tile reads;
//   DY_TP, DY_TQ     rows / columns of the dy patch a bwd_data tile reads (upper bounds);
//   FLOOR_DIV(a, b)  floor division for a possibly negative numerator and a positive divisor;
//   finish()         a result with beta * out added (beta == 0 never reads out);
//   STORE_DW(index, value)  bwd_weight's weight gradient `value` at `index`: into the workspace's slice of
//                    this split (SPLIT > 1, DW_SIZE elements each) or finished into dw.
#ifndef CONV_DIRECT_TILES_CL
#define CONV_DIRECT_TILES_CL

#define TILE_P (WGP * TP)
#define TILE_Q (WGQ * TQ)
#define IN_TP ((TILE_P - 1) * STRIDE_H + (CONV_R - 1) * DIL_H + 1)
#define IN_TQ ((TILE_Q - 1) * STRIDE_W + (CONV_S - 1) * DIL_W + 1)
#define DY_TP ((TILE_P - 1 + (CONV_R - 1) * DIL_H) / STRIDE_H + 2)
#define DY_TQ ((TILE_Q - 1 + (CONV_S - 1) * DIL_W) / STRIDE_W + 2)

#define FLOOR_DIV(a, b) (((a) >= 0) ? ((a) / (b)) : -((-(a) + (b) - 1) / (b)))

inline float finish(float value, __global const float *out_agm, const int index, const float beta) {
  return (beta != 0.0f) ? value + beta * out_agm[index] : value;
}

#if SPLIT > 1
  #define STORE_DW(index, value) ws_agm[split * DW_SIZE + index] = value;
#else
  #define STORE_DW(index, value) dw_agm[dw_offset + index] = finish(value, dw_agm, dw_offset + index, beta);
#endif

#endif
