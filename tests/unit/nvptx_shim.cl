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

#include SOURCE
