// capabilities.cl — probes of optional device features; probes.py runs each once per device model and
// driver, built alone (-DPROBE_MMA_TF32, -DPROBE_MMA_F16, -DPROBE_CP_ASYNC or -DPROBE_WGMMA) in a
// context of its own (a probe that faults cannot harm the device's working context), and grants the
// feature only when the probe compiles, runs and computes the expected result.
//
// probe_mma_tf32: one warp (a work-group of 32) computes D = A * B + C with one
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, the operands rounded with cvt.rna.tf32.f32.
// a: 16 x 8 row-major, b: 8 x 8 row-major, d: 16 x 8 row-major, holding C on entry and D on exit.
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32), g = lane / 4, t = lane % 4:
//   A: a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4)   (row, k)
//   B: b0 = (t, g), b1 = (t + 4, g)                                        (k, column)
//   C/D: c0 = (g, 2t), c1 = (g, 2t + 1), c2 = (g + 8, 2t), c3 = (g + 8, 2t + 1)
// The host's inputs make every element and every product distinct enough that a misplaced fragment
// element, a missing accumulate or a truncating conversion changes D.
//
// probe_mma_f16: one warp computes D = A * B + C with one mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32.
// a: 16 x 16 row-major halves, b: 16 x 8 row-major halves (the host passes their bits), d as above.
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .f16): every
// register holds two halves, the lower 16 bits the first (row, k) or (k, column) of the pair:
//   A: a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g + 8, 2t+8..2t+9)
//   B: b0 = (2t..2t+1, g), b1 = (2t+8..2t+9, g);  C/D as for m16n8k8.
//
// probe_cp_async: one warp copies 128 floats from global to local memory with cp.async (lanes 0-15:
// 16 bytes with .cg, lanes 16-23: 8 bytes with .ca, lanes 24-31: 4 bytes with .ca; every lane asks
// for fewer source bytes than it copies where `lane % 3 == 1`, so the rest must be zero-filled),
// waits for the copies, and writes the local words back out. It checks that a __local pointer cast to
// an integer is the .shared address cp.async wants, and the zero fill the GEMM uses at matrix edges.
//
// probe_wgmma: one warpgroup (a work-group of 128) computes D = A * B^T (64 x 64, fp32) with
// wgmma.mma_async m64n64k8 .tf32 or m64n64k16 .f16 from local memory, K = 128 bytes of k per row
// (32 TF32 / 64 halves: 4 wgmma), in the local layout and with the descriptors gemm_wgmma.cl builds
// (its banner): K-major or (f16, wgmma's transpose flags) MN-major tiles, no swizzle or a 32-, 64- or
// 128-byte swizzle, chosen per launch. a and b hold op(A) as 64 x K and op(B) as 64 (n) x K, row-major
// bytes; d receives D through the accumulator fragment (row 16 w + l / 4 + 8 ((i % 4) / 2), column
// 8 (i / 4) + 2 (l % 4) + i % 2 of thread 32 w + l); info[0] the local array's address modulo 1024
// (the swizzle assumes 1024-byte alignment).

// The mma probes' common part: lane (g, t)'s C fragment of d into c0 .. c3, one mma `instruction` on it
// with the fragments a0 .. a3 and b0, b1, and D back into d.
#define PROBE_MMA_ON_D(instruction)                                                                 \
  float c0 = d[g * 8 + 2 * t];                                                                    \
  float c1 = d[g * 8 + 2 * t + 1];                                                                \
  float c2 = d[(g + 8) * 8 + 2 * t];                                                              \
  float c3 = d[(g + 8) * 8 + 2 * t + 1];                                                          \
  asm volatile(instruction                                                                        \
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                            \
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)                                           \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                           \
  d[g * 8 + 2 * t] = c0;                                                                          \
  d[g * 8 + 2 * t + 1] = c1;                                                                      \
  d[(g + 8) * 8 + 2 * t] = c2;                                                                    \
  d[(g + 8) * 8 + 2 * t + 1] = c3;

#ifdef PROBE_MMA_TF32
uint ProbeToTF32(const float x) {
  uint r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__kernel void probe_mma_tf32(__global const float* a, __global const float* b, __global float* d) {
  const int lane = get_local_id(0);
  const int g = lane >> 2;
  const int t = lane & 3;
  const uint a0 = ProbeToTF32(a[g * 8 + t]);
  const uint a1 = ProbeToTF32(a[(g + 8) * 8 + t]);
  const uint a2 = ProbeToTF32(a[g * 8 + t + 4]);
  const uint a3 = ProbeToTF32(a[(g + 8) * 8 + t + 4]);
  const uint b0 = ProbeToTF32(b[t * 8 + g]);
  const uint b1 = ProbeToTF32(b[(t + 4) * 8 + g]);
  PROBE_MMA_ON_D("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ")
}
#endif  // PROBE_MMA_TF32

#ifdef PROBE_MMA_F16
// The halves at p[0] (lower 16 bits) and p[step] (upper) as one .f16x2 register.
uint ProbePack(__global const ushort* p, const int step) {
  return (uint)p[0] | ((uint)p[step] << 16);
}

__kernel void probe_mma_f16(__global const ushort* a, __global const ushort* b, __global float* d) {
  const int lane = get_local_id(0);
  const int g = lane >> 2;
  const int t = lane & 3;
  const uint a0 = ProbePack(a + g * 16 + 2 * t, 1);
  const uint a1 = ProbePack(a + (g + 8) * 16 + 2 * t, 1);
  const uint a2 = ProbePack(a + g * 16 + 2 * t + 8, 1);
  const uint a3 = ProbePack(a + (g + 8) * 16 + 2 * t + 8, 1);
  const uint b0 = ProbePack(b + (2 * t) * 8 + g, 8);
  const uint b1 = ProbePack(b + (2 * t + 8) * 8 + g, 8);
  PROBE_MMA_ON_D("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ")
}
#endif  // PROBE_MMA_F16

#ifdef PROBE_CP_ASYNC
__kernel void probe_cp_async(__global const float* src, __global float* dst) {
  __local float words[128] __attribute__((aligned(16)));
  const int lane = get_local_id(0);
  for (int i = lane; i < 128; i += 32) { words[i] = -1.0f; }  // anything not copied shows
  barrier(CLK_LOCAL_MEM_FENCE);
  const int short_source = lane % 3 == 1;
  if (lane < 16) {
    const uint to = (uint)(size_t)(words + 4 * lane);
    const uint bytes = short_source ? 8 : 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(to), "l"((ulong)(src + 4 * lane)), "r"(bytes) : "memory");
  } else if (lane < 24) {
    const uint to = (uint)(size_t)(words + 64 + 2 * (lane - 16));
    const uint bytes = short_source ? 4 : 8;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
                 :: "r"(to), "l"((ulong)(src + 64 + 2 * (lane - 16))), "r"(bytes) : "memory");
  } else {
    const uint to = (uint)(size_t)(words + 80 + (lane - 24));
    const uint bytes = short_source ? 0 : 4;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(to), "l"((ulong)(src + 80 + (lane - 24))), "r"(bytes) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lane; i < 128; i += 32) { dst[i] = words[i]; }
}
#endif  // PROBE_CP_ASYNC

#ifdef PROBE_WGMMA
#define PK 128  // bytes of k per row of each operand

// Byte offset of element (r, k) (r: row of A or column of B) in a 64-row tile, as gemm_wgmma.cl lays
// it out: K-major (rows of PK bytes) or MN-major (64 * elt bytes of r per k, kp rows of k).
uint ProbeOffset(const int r, const int k, const int mn, const int sw, const int elt) {
  const int kp = PK / elt;
  uint off;
  if (!mn) {
    const uint kb = k * elt;
    off = sw ? (kb / sw) * 64 * sw + r * sw + kb % sw
             : ((r / 8) * (PK / 16) + kb / 16) * 128 + (r % 8) * 16 + kb % 16;
  } else {
    const uint mb = r * elt;
    off = sw ? (mb / sw) * kp * sw + k * sw + mb % sw
             : (mb / 16) * kp * 16 + (k / 8) * 128 + (k % 8) * 16 + mb % 16;
  }
  return sw ? off ^ (((off >> 7) & (sw / 16 - 1)) << 4) : off;
}

// The descriptor of wgmma step s (k0 = s * 32 bytes of k) of the tile at shared address `tile`.
ulong ProbeDescriptor(const uint tile, const int s, const int mn, const int sw, const int elt) {
  const int kp = PK / elt;
  const int k0 = s * (32 / elt);
  const uint start = tile + ProbeOffset(0, k0, mn, sw, elt);
  const uint lbo = mn ? (sw ? kp * sw : 128) : (sw ? 16 : 128);
  const uint sbo = mn ? (sw ? 8 * sw : kp * 16) : (sw ? 8 * sw : (PK / 16) * 128);
  const ulong mode = sw == 128 ? 1 : sw == 64 ? 2 : sw == 32 ? 3 : 0;
  return (ulong)((start >> 4) & 0x3FFF) | ((ulong)((lbo >> 4) & 0x3FFF) << 16)
         | ((ulong)((sbo >> 4) & 0x3FFF) << 32) | (mode << 62);
}

// ARCH_ASM goes before each sm_90a-only instruction: probes.py builds this probe with TUNECL_ARCH_PTX=1
// (runtime.ARCH_PTX_OPTION), which hides them from NVIDIA's OpenCL compiler (it assembles for sm_90) as
// PTX comments; build.py's build_program restores them and assembles the PTX for sm_90a.
#if TUNECL_ARCH_PTX
  #define ARCH_ASM "//@arch "
#else
  #define ARCH_ASM ""
#endif

#define PROBE_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                    "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define PROBE_D32 PROBE_D8(0), PROBE_D8(8), PROBE_D8(16), PROBE_D8(24)
#define PROBE_WGMMA_ASM(shape_types, flags)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                         \
               ARCH_ASM "wgmma.mma_async.sync.aligned." shape_types " "                                      \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "             \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "   \
               "%32, %33, p, 1, 1" flags ";\n}\n"                                                    \
               : PROBE_D32 : "l"(desc_a), "l"(desc_b), "r"(1))

__kernel void probe_wgmma(__global const uchar* a, __global const uchar* b, __global float* out,
                          __global uint* info, const int f16, const int sw, const int a_mn,
                          const int b_mn) {
  __local uchar smem[2 * 64 * PK] __attribute__((aligned(1024)));
  const int tid = get_local_id(0);
  const int elt = f16 ? 2 : 4;
  const int kp = PK / elt;
  for (int e = tid; e < 64 * kp; e += 128) {
    const int r = e / kp, k = e % kp;
    const uint oa = ProbeOffset(r, k, a_mn, sw, elt), ob = 64 * PK + ProbeOffset(r, k, b_mn, sw, elt);
    for (int byte = 0; byte < elt; ++byte) {
      smem[oa + byte] = a[e * elt + byte];
      smem[ob + byte] = b[e * elt + byte];
    }
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  barrier(CLK_LOCAL_MEM_FENCE);
  const uint base = (uint)(size_t)smem;
  float d[32];
  #pragma unroll  // d stays in registers: the asynchronous wgmma writes them
  for (int i = 0; i < 32; ++i) { d[i] = 0.0f; }
  asm volatile(ARCH_ASM "wgmma.fence.sync.aligned;" ::: "memory");
  #pragma unroll
  for (int s = 0; s < 4; ++s) {
    const ulong desc_a = ProbeDescriptor(base, s, a_mn, sw, elt);
    const ulong desc_b = ProbeDescriptor(base + 64 * PK, s, b_mn, sw, elt);
    if (!f16) {
      PROBE_WGMMA_ASM("m64n64k8.f32.tf32.tf32", "");
    } else if (!a_mn && !b_mn) {
      PROBE_WGMMA_ASM("m64n64k16.f32.f16.f16", ", 0, 0");
    } else if (!a_mn) {
      PROBE_WGMMA_ASM("m64n64k16.f32.f16.f16", ", 0, 1");
    } else if (!b_mn) {
      PROBE_WGMMA_ASM("m64n64k16.f32.f16.f16", ", 1, 0");
    } else {
      PROBE_WGMMA_ASM("m64n64k16.f32.f16.f16", ", 1, 1");
    }
  }
  asm volatile(ARCH_ASM "wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile(ARCH_ASM "wgmma.wait_group.sync.aligned 0;" ::: "memory");
  #pragma unroll
  for (int i = 0; i < 32; ++i) { asm volatile("" : "+f"(d[i]) :: "memory"); }
  const int warp = tid / 32, lane = tid % 32;
  #pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * warp + lane / 4 + 8 * ((i % 4) / 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    out[row * 64 + col] = d[i];
  }
  if (tid == 0) { info[0] = base & 1023; }
}
#endif  // PROBE_WGMMA
