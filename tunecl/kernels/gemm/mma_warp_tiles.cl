// mma_warp_tiles.cl — the warp tiling of the mma kernels (gemm_mma.cl, conv_implicit_gemm_mma.cl),
// included with #include "mma_warp_tiles.cl" after MWG, NWG, KWG, WARPS_M, WARPS_N and MMA_F16 are defined:
// the tunables KPAIR and PAD of both kernels, the derived sizes, the padding of local rows and the
// fragment registers' k.
#ifndef MMA_WARP_TILES_CL
#define MMA_WARP_TILES_CL

#ifndef KPAIR
  #define KPAIR 1   // 1 = a lane holds k = 2t, 2t + 1 of each 8-deep step; 0 = k = t, t + 4
#endif
#ifndef PAD
  #define PAD 1     // 1 = pad local rows against bank conflicts of the fragment reads
#endif

#define WGS (32 * WARPS_M * WARPS_N)   // threads per work-group
#define WTM (MWG / WARPS_M)            // warp tile rows
#define WTN (NWG / WARPS_N)            // warp tile columns
#define MT (WTM / 16)                  // mma tiles per warp along M (GM)
#define NT (WTN / 8)                   // mma tiles per warp along N (GN)
#if MMA_F16
  #define KPW 2                        // k values per fragment register (.f16x2)
#else
  #define KPW 1                        // (.tf32)
#endif
#define MMA_K (8 * KPW)                // depth of one mma

// Padding of a local row (in 32-bit words) so that a warp's fragment reads hit 32 different banks:
//   K contiguous, KPAIR:  64-bit reads at row g, column 2t; a half-warp spans rows g..g+3, so the row
//                         length must be an odd multiple of 8 (KWG = 8 already is one).
//   K contiguous, !KPAIR: reads at row g, column t: the row length must be an odd multiple of 4.
//   M/N contiguous, KPAIR: reads at row 2t (and 2t + 1), column g: an odd multiple of 4.
//   M/N contiguous, !KPAIR: reads at row t, column g: an odd multiple of 8.
// Every padded row length stays a multiple of 4 words, so the 128-bit stores stay aligned.
// MMA_F16 (in halves): K contiguous, the same rules in words (a word is a k pair): 16 halves or none
// (KPAIR), 8 (!KPAIR). M/N contiguous: 16-bit reads at rows 2t, 2t + 1 (!KPAIR: conflict-free when
// the row is an odd multiple of 4 words) or 4t .. 4t + 3 (KPAIR: two lanes' rows share banks);
// 8 halves serve both, keeping every row a multiple of 16 bytes for 128-bit stores and cp.async.
#if PAD && MMA_F16
  #define PADDING(kcontig) ((kcontig) ? (KPAIR ? ((KWG / 16) % 2 ? 0 : 16) : 8) : 8)
#elif PAD
  #define PADDING(kcontig) ((kcontig) ? (KPAIR ? ((KWG / 8) % 2 ? 0 : 8) : 4) : (KPAIR ? 4 : 8))
#else
  #define PADDING(kcontig) 0
#endif

// The register (k / KPW) of a lane's low and high registers inside an MMA_K-deep step.
#if KPAIR
  #define K_LO(t) (2 * (t))
  #define K_HI(t) (2 * (t) + 1)
#else
  #define K_LO(t) (t)
  #define K_HI(t) ((t) + 4)
#endif

#endif
