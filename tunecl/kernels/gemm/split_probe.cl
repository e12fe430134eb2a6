// split_probe.cl — the probe of split_finish.cl's hand-off (tunecl/kernels/split_finish.py): ITEMS outputs
// per tile, PARTS work-groups per tile each store (part + 1) * round to every output's part, and the
// tile's last work-group writes the sums, round * PARTS * (PARTS + 1) / 2 where every part was read as
// stored.
#include "split_finish.cl"  // split_last, split_part

__kernel __attribute__((reqd_work_group_size(ITEMS, 1, 1)))
void split_probe(__global float *ws, __global float *out, __global int *counters, const int round) {
  const int tile = get_group_id(0), part = get_group_id(1), lid = get_local_id(0);
  const int tiles = get_num_groups(0);
  ws[(part * tiles + tile) * ITEMS + lid] = (float)((part + 1) * round);
  __local int last_flm;
  if (!split_last(counters + tile, &last_flm, PARTS)) { return; }
  float sum = 0.0f;
  for (int p = 0; p < PARTS; p++) { sum += split_part(ws, (p * tiles + tile) * ITEMS + lid); }
  out[tile * ITEMS + lid] = sum;
}
