// conv_pixel_passes.cl — how the data movement of the GEMM-backed convolutions (conv_1x1.cl,
// conv_im2col.cl) walks the pixels, included with #include "conv_pixel_passes.cl": a pass handles CHUNK_N
// images (derived by the host); a work-group of IWG work-items covers SPAN pixels, each work-item IPT of
// them, IWG apart (tunables).
#ifndef CONV_PIXEL_PASSES_CL
#define CONV_PIXEL_PASSES_CL

#ifndef CHUNK_N
  #define CHUNK_N 1     // images per pass
#endif
#ifndef IWG
  #define IWG 64        // work-items per work-group
#endif
#ifndef IPT
  #define IPT 1         // pixels (elements along the pixel dimension) per work-item
#endif
#define SPAN (IWG * IPT)

#endif
