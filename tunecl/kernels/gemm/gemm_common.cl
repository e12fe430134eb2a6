// gemm_common.cl — what every GEMM kernel shares, included with #include "gemm_common.cl" (expanded
// into the program text by tunecl.kernels.base.read_source, so compile caches key on all of it).
//
// gemm_tile_of_index(linear, ngm, ngn): the (row, column) tile index (gm, gn) of the linear-th tile of
// an ngm x ngn grid of tiles. GM == 1: plain order, N tiles fastest. GM > 1: bands of GM tile rows, so
// that tiles computed at the same time share A rows and B columns in the L2 cache.
// gemm_tile_of_group(): the same for this work-group of a grid whose dimension 0 walks N tiles and
// dimension 1 M tiles.
// GEMM_TILE_ORIGIN(tile): gm, gn = the tile indices `tile` holds and m0, n0 = the first row and column
// of that MWG x NWG tile of C.
#ifndef GEMM_COMMON_CL
#define GEMM_COMMON_CL

inline int2 gemm_tile_of_index(const int linear, const int ngm, const int ngn) {
#if GM == 1
  return (int2)(linear / ngn, linear % ngn);
#else
  const int band = linear / (GM * ngn);
  const int band_rows = min(ngm - band * GM, GM);
  const int in_band = linear - band * GM * ngn;
  return (int2)(band * GM + in_band % band_rows, in_band / band_rows);
#endif
}

inline int2 gemm_tile_of_group(void) {
#if GM == 1
  return (int2)((int)get_group_id(1), (int)get_group_id(0));
#else
  return gemm_tile_of_index(get_group_id(1) * get_num_groups(0) + get_group_id(0), get_num_groups(1),
                            get_num_groups(0));
#endif
}

#define GEMM_TILE_ORIGIN(tile)                                                            \
  const int gm = tile.x;                                                                  \
  const int gn = tile.y;                                                                  \
  const int m0 = gm * MWG;                                                                \
  const int n0 = gn * NWG;

#endif
