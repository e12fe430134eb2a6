// local_sums.cl — a work-group's sums of two values per work-item, by a fixed tree in local memory (the
// same result run to run), included with #include "local_sums.cl" by group_norm.cl and transformer.cl.
// GROUP_SUMS(s1, s2, a, b): s1[0] = the sum of every work-item's a, s2[0] of its b; s1 and s2 are __local
// arrays of GROUP floats (GROUP a power of two), lid the work-item's local id.
#ifndef LOCAL_SUMS_CL
#define LOCAL_SUMS_CL

#define GROUP_SUMS(s1, s2, a, b)                                                                    \
  s1[lid] = a;                                                                                    \
  s2[lid] = b;                                                                                    \
  barrier(CLK_LOCAL_MEM_FENCE);                                                                   \
  for (int step = GROUP / 2; step > 0; step >>= 1) {                                              \
    if (lid < step) {                                                                             \
      s1[lid] += s1[lid + step];                                                                  \
      s2[lid] += s2[lid + step];                                                                  \
    }                                                                                             \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                 \
  }

#endif
