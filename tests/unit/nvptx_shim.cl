// nvptx_shim.cl — lets clang compile an OpenCL C file for NVPTX without an OpenCL runtime library, so
// that test_gemm_mma_ptx.py can hand the PTX to NVIDIA's assembler (ptxas). Test support only: the
// work-item functions the kernels use, mapped to PTX special registers; `asm` spelled as clang's
// OpenCL mode wants it (NVIDIA's OpenCL compiler takes `asm`).
#define asm __asm__

static inline size_t shim_local_id(uint d) {
  return d == 0 ? __nvvm_read_ptx_sreg_tid_x() : d == 1 ? __nvvm_read_ptx_sreg_tid_y()
                                                        : __nvvm_read_ptx_sreg_tid_z();
}
static inline size_t shim_group_id(uint d) {
  return d == 0 ? __nvvm_read_ptx_sreg_ctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_ctaid_y()
                                                          : __nvvm_read_ptx_sreg_ctaid_z();
}
static inline size_t shim_num_groups(uint d) {
  return d == 0 ? __nvvm_read_ptx_sreg_nctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_nctaid_y()
                                                           : __nvvm_read_ptx_sreg_nctaid_z();
}
#define get_local_id shim_local_id
#define get_group_id shim_group_id
#define get_num_groups shim_num_groups
#define barrier(flags) __nvvm_bar_sync(0)
#define fma(a, b, c) __builtin_fmaf(a, b, c)
#define min(a, b) ((a) < (b) ? (a) : (b))
#define clamp(x, lo, hi) min(max((x), (lo)), (hi))
#define max(a, b) ((a) > (b) ? (a) : (b))

// Half conversions of C in gemm_mma_f16 (no OpenCL library is linked): PTX's cvt, which is what they
// compile to on NVIDIA (global pointers only: the kernels use them on C).
static inline float shim_half_to_float(const ushort h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
static inline ushort shim_float_to_half_rte(const float f) {
  ushort h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#define vload_half(off, p) shim_half_to_float(((const __global ushort*)(p))[off])
#define vload_half2(off, p) \
  ((float2)(vload_half(2 * (off), p), vload_half(2 * (off) + 1, p)))
#define vstore_half_rte(x, off, p) (((__global ushort*)(p))[off] = shim_float_to_half_rte(x))
#define vstore_half2_rte(v, off, p) \
  (vstore_half_rte((v).x, 2 * (off), p), vstore_half_rte((v).y, 2 * (off) + 1, p))

#include SOURCE
