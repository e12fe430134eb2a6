// split_finish.cl — a split reduction finished by its own kernel: the last work-group of a tile adds
// the parts, with no second launch.
//
// A kernel whose SPLIT work-groups per output tile each store a partial sum to a workspace (split K, or
// split over images) calls split_last() after its stores, with the tile's counter (an int, zero before the
// launch). Each work-group makes its stores visible device-wide, then counts itself on the counter; the
// work-group that counts last gets 1 (every work-item of it), resets the counter to zero for the next
// launch, and then reads every part of its tile through split_part() (a volatile load: the value in
// memory, not an earlier cached line) and writes the output. The parts are added in the fixed order
// 0, 1, ..., SPLIT - 1 whichever work-group finishes last, so results are the separate reduce launch's,
// bit for bit, run to run. The other work-groups get 0 and have nothing left to do.
//
// Every work-item of the work-group must call split_last() (it holds barriers). OpenCL 1.2 does not
// promise this hand-off on every device: a device uses it only where tunecl/kernels/split_finish.py's
// probe (split_probe.cl) finds it holds.

inline int split_last(__global int *counter, __local int *last_flm, const int parts) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);   // this work-item's partial stores, before the count
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  if (get_local_id(0) == 0 && get_local_id(1) == 0 && get_local_id(2) == 0) {
    const int last = atomic_inc(counter) == parts - 1;
    if (last) { atomic_xchg(counter, 0); }
    *last_flm = last;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const int last = *last_flm;
  if (last) { mem_fence(CLK_GLOBAL_MEM_FENCE); }   // the count, before the reads of the parts
  return last;
}

#define split_part(ws, index) (((volatile __global const float *)(ws))[index])
