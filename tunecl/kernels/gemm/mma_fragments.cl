// mma_fragments.cl — the warp tile's accumulators, and local memory -> fragment registers -> mma, shared
// by gemm_mma.cl and conv_implicit_gemm_mma.cl; included with #include "mma_fragments.cl" after
// mma_core.cl and the local tile layout: ALM, BLM, A_KCONTIG, B_KCONTIG, and FRAG(word) /
// FRAG_A(alm, m, k) / FRAG_B(blm, k, n), the fragment register of a local word / of op(A) row m (op(B)
// column n) holding k .. k + KPW - 1.
#ifndef MMA_FRAGMENTS_CL
#define MMA_FRAGMENTS_CL

// cpm: the warp tile's accumulators (4 floats per lane of each of its MT x NT mma tiles), zeroed
#define ZERO_ACCUMULATORS(cpm)                                                                      \
  float cpm[MT][NT][4];                                                                           \
  _Pragma("unroll")                                                                               \
  for (int i = 0; i < MT; ++i) {                                                                  \
    _Pragma("unroll")                                                                             \
    for (int j = 0; j < NT; ++j) {                                                                \
      _Pragma("unroll")                                                                           \
      for (int r = 0; r < 4; ++r) { cpm[i][j][r] = 0.0f; }                                        \
    }                                                                                             \
  }

// This lane's A fragments of the warp's MT mma tiles (rows wm0 + i * 16 ...) at k step kk.
void LocalToPrivateA(const __local LTYPE* alm, uint apm[MT][4], const int wm0, const int kk, const int g,
                     const int t) {
  #pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int m = wm0 + i * 16 + g;
    #if A_KCONTIG && KPAIR
      const uint2 lo = *((const __local uint2*)(alm + ALM(m, kk + KPW * 2 * t)));
      const uint2 hi = *((const __local uint2*)(alm + ALM(m + 8, kk + KPW * 2 * t)));
      apm[i][0] = FRAG(lo.x);
      apm[i][2] = FRAG(lo.y);
      apm[i][1] = FRAG(hi.x);
      apm[i][3] = FRAG(hi.y);
    #else
      apm[i][0] = FRAG_A(alm, m, kk + KPW * K_LO(t));
      apm[i][1] = FRAG_A(alm, m + 8, kk + KPW * K_LO(t));
      apm[i][2] = FRAG_A(alm, m, kk + KPW * K_HI(t));
      apm[i][3] = FRAG_A(alm, m + 8, kk + KPW * K_HI(t));
    #endif
  }
}

// This lane's B fragments of the warp's NT mma tiles (columns wn0 + j * 8 ...) at k step kk.
void LocalToPrivateB(const __local LTYPE* blm, uint bpm[NT][2], const int wn0, const int kk, const int g,
                     const int t) {
  #pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = wn0 + j * 8 + g;
    #if B_KCONTIG && KPAIR
      const uint2 v = *((const __local uint2*)(blm + BLM(kk + KPW * 2 * t, n)));
      bpm[j][0] = FRAG(v.x);
      bpm[j][1] = FRAG(v.y);
    #else
      bpm[j][0] = FRAG_B(blm, kk + KPW * K_LO(t), n);
      bpm[j][1] = FRAG_B(blm, kk + KPW * K_HI(t), n);
    #endif
  }
}

// One KWG-deep tile: the warp tile's accumulators += its A rows x its B columns, MMA_K k at a time.
void MultiplyTile(float cpm[MT][NT][4], const __local LTYPE* alm, const __local LTYPE* blm, const int wm0,
                  const int wn0, const int g, const int t MMA_PARAMS) {
  // (The emulated mma keeps its loops rolled: unrolled, its barriers make PoCL's compile take minutes.)
  #if MMA_STUB == 0
  #pragma unroll
  #endif
  for (int kk = 0; kk < KWG; kk += MMA_K) {
    uint apm[MT][4];
    uint bpm[NT][2];
    LocalToPrivateA(alm, apm, wm0, kk, g, t);
    LocalToPrivateB(blm, bpm, wn0, kk, g, t);
    #if MMA_STUB == 0
    #pragma unroll
    #endif
    for (int i = 0; i < MT; ++i) {
      #if MMA_STUB == 0
      #pragma unroll
      #endif
      for (int j = 0; j < NT; ++j) { Mma(cpm[i][j], apm[i], bpm[j] MMA_ARGS); }
    }
  }
}

#endif
