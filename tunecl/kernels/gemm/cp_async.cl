// cp_async.cl — cp.async (PTX, sm_80+): global -> local copies that bypass the registers, with zero
// fill, and the commit groups that order them. Included (#include "cp_async.cl", expanded into the
// program text by tunecl.kernels.base.read_source) by gemm_tiled.cl, gemm_mma.cl and gemm_wgmma.cl, each of
// which keeps its own tile-copy helper (element type, local pointer or shared address) on top of it.
//
// The includer defines CP_ASYNC_STUB first: 1 on a device whose probe did not grant "cp_async" (tests
// of the kernels' buffer logic), where the includer copies with plain loads and stores instead, CpAsync
// is not defined, and commits and waits do nothing; 0 emits the PTX.
//
//   CpAsync(to, from, size, bytes)  copy `size` bytes (16, 8 or 4) from global `from` to the .shared
//                                   address `to` (the integer value of a __local pointer); only the
//                                   first `bytes` are read, the rest are zero-filled. 16-byte copies
//                                   bypass L1 (.cg); 8 and 4 exist only as .ca.
//   CpAsyncCommit()                 close the group of copies this thread issued since the last commit
//                                   (possibly none: an empty group keeps group counts aligned).
//   CpAsyncWait(in_flight)          wait until at most `in_flight` (0, 1 or 2; a compile-time constant)
//                                   of this thread's newest groups are still in flight; a barrier after
//                                   it makes every thread's landed copies visible.
#ifndef CP_ASYNC_CL
#define CP_ASYNC_CL

#if !CP_ASYNC_STUB
void CpAsync(const uint to, const __global void* from, const int size, const uint bytes) {
  if (size == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(to), "l"((ulong)from), "r"(bytes) : "memory");
  } else if (size == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
                 :: "r"(to), "l"((ulong)from), "r"(bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(to), "l"((ulong)from), "r"(bytes) : "memory");
  }
}
#endif

void CpAsyncCommit(void) {
  #if !CP_ASYNC_STUB
    asm volatile("cp.async.commit_group;" ::: "memory");
  #endif
}

void CpAsyncWait(const int in_flight) {
  #if !CP_ASYNC_STUB
    if (in_flight <= 0) {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    } else if (in_flight == 1) {
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 2;" ::: "memory");
    }
  #endif
}

#endif  // CP_ASYNC_CL
