// mma_core.cl — the warp-level tensor-core instructions gemm_mma.cl and conv_implicit_gemm_mma.cl
// share, included with #include "mma_core.cl" after MMA_STUB and MMA_F16 are defined:
//   Mma(c, a, b MMA_ARGS)  c += A * B for one 16 x 8 x 8 TF32 tile (MMA_F16: 16 x 8 x 16 halves), a
//                          warp-collective mma.sync (fragments: gemm_mma.cl's banner);
//   ToTF32(x)              x rounded to TF32 (not with MMA_F16);
// and with MMA_STUB the same operations in plain OpenCL C through MMA_WORDS local words per warp
// (MMA_PARAMS / MMA_ARGS add the stub's extra arguments to a caller's parameter and argument lists).
#ifndef MMA_CORE_CL
#define MMA_CORE_CL

// Mma(c, a, b): c += A * B by one warp-collective mma `instruction` on a lane's fragments.
#define MMA_FUNCTION(instruction)                                                                   \
  void Mma(float c[4], const uint a[4], const uint b[2]) {                                         \
    asm volatile(instruction                                                                      \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                          \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));             \
  }

#if MMA_STUB == 0 && MMA_F16
// c += A * B for one 16 x 8 x 16 tile of halves, a warp-collective instruction (fragments: banner).
MMA_FUNCTION("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ")
  #define MMA_PARAMS
  #define MMA_ARGS
#elif MMA_STUB == 0
// x rounded to TF32 (the bits of a float whose 13 low mantissa bits the mma ignores).
uint ToTF32(const float x) {
  uint r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// c += A * B for one 16 x 8 x 8 tile, a warp-collective instruction (fragments: see the banner).
MMA_FUNCTION("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ")
  #define MMA_PARAMS
  #define MMA_ARGS
#else
// The same two operations in plain OpenCL C. Rounding: adding half a TF32 ulp to the magnitude bits
// and clearing the 13 low bits rounds to nearest with ties away from zero (Inf and NaN kept).
uint ToTF32(const float x) {
  const uint u = as_uint(x);
  return (u & 0x7f800000u) == 0x7f800000u ? u : (u + 0x1000u) & 0xffffe000u;
}

#define MMA_WORDS 192   // local words per warp: 32 lanes x (4 A + 2 B) registers
// Each lane publishes its registers in its warp's words (wsm), then computes its four outputs from
// the registers of the lanes that hold the needed A and B elements, by the fragment tables (A(row, k)
// is register (row >= 8) + 2 (k >= 4) of lane (row % 8) * 4 + k % 4; B(k, col) is register k >= 4 of
// lane col * 4 + k % 4). Every lane of the work-group calls it the same number of times (barriers).
// MMA_F16: the same tables for register w = k / 2 of the pair; the half k % 2 of that register is
// converted exactly with vload_half from the little-endian word (lower 16 bits: even k), as the
// hardware reads an .f16x2; products are exact in fp32 and summed with fma like the TF32 ones.
void Mma(float c[4], const uint a[4], const uint b[2], __local uint* wsm, const int lane) {
  barrier(CLK_LOCAL_MEM_FENCE);  // the previous call's reads are done
  #pragma unroll
  for (int r = 0; r < 4; ++r) { wsm[lane * 4 + r] = a[r]; }
  wsm[128 + lane * 2] = b[0];
  wsm[128 + lane * 2 + 1] = b[1];
  barrier(CLK_LOCAL_MEM_FENCE);
  const int g = lane >> 2, t = lane & 3;
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r >> 1);
    const int col = 2 * t + (r & 1);
    float sum = c[r];
    #if MMA_F16
    for (int k = 0; k < 16; ++k) {
      const int w = k >> 1;
      const int aw = ((row & 7) * 4 + (w & 3)) * 4 + (row >> 3) + 2 * (w >> 2);
      const int bw = 128 + (col * 4 + (w & 3)) * 2 + (w >> 2);
      const float av = vload_half(2 * aw + (k & 1), (const __local half*)wsm);
      const float bv = vload_half(2 * bw + (k & 1), (const __local half*)wsm);
      sum = fma(av, bv, sum);
    }
    #else
    for (int k = 0; k < 8; ++k) {
      const uint av = wsm[((row & 7) * 4 + (k & 3)) * 4 + (row >> 3) + 2 * (k >> 2)];
      const uint bv = wsm[128 + (col * 4 + (k & 3)) * 2 + (k >> 2)];
      sum = fma(as_float(av), as_float(bv), sum);
    }
    #endif
    c[r] = sum;
  }
}
  #define MMA_PARAMS , __local uint* wsm, const int lane
  #define MMA_ARGS , wsm, lane
#endif

#endif
