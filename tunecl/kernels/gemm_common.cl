// gemm_common.cl — what every GEMM kernel shares, included with #include "gemm_common.cl" (expanded
// into the program text by tunecl.kernels.base.read_source, so compile caches key on all of it).
//
// gemm_tile_of_group(): the (row, column) tile index (gm, gn) this work-group computes. GM == 1: plain
// order, N tiles fastest (get_group_id(0) walks N). GM > 1: bands of GM tile rows, so that the
// work-groups running at the same time share A rows and B columns in the L2 cache.
#ifndef GEMM_COMMON_CL
#define GEMM_COMMON_CL

inline int2 gemm_tile_of_group(void) {
#if GM == 1
  return (int2)((int)get_group_id(1), (int)get_group_id(0));
#else
  const int ngn = get_num_groups(0);
  const int ngm = get_num_groups(1);
  const int linear = get_group_id(1) * ngn + get_group_id(0);
  const int band = linear / (GM * ngn);
  const int band_rows = min(ngm - band * GM, GM);
  const int in_band = linear - band * GM * ngn;
  return (int2)(band * GM + in_band % band_rows, in_band / band_rows);
#endif
}

#endif
