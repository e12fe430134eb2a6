// capabilities.cl — probes of optional device features; runtime.py runs each once per device model and
// driver, built alone (-DPROBE_MMA_TF32, -DPROBE_MMA_F16 or -DPROBE_CP_ASYNC) in a context of its own (a probe that
// faults cannot harm the device's working context), and grants the feature only when the probe
// compiles, runs and computes the expected result.
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
  float c0 = d[g * 8 + 2 * t];
  float c1 = d[g * 8 + 2 * t + 1];
  float c2 = d[(g + 8) * 8 + 2 * t];
  float c3 = d[(g + 8) * 8 + 2 * t + 1];
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  d[g * 8 + 2 * t] = c0;
  d[g * 8 + 2 * t + 1] = c1;
  d[(g + 8) * 8 + 2 * t] = c2;
  d[(g + 8) * 8 + 2 * t + 1] = c3;
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
  float c0 = d[g * 8 + 2 * t];
  float c1 = d[g * 8 + 2 * t + 1];
  float c2 = d[(g + 8) * 8 + 2 * t];
  float c3 = d[(g + 8) * 8 + 2 * t + 1];
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  d[g * 8 + 2 * t] = c0;
  d[g * 8 + 2 * t + 1] = c1;
  d[(g + 8) * 8 + 2 * t] = c2;
  d[(g + 8) * 8 + 2 * t + 1] = c3;
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
