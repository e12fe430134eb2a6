// scan.cl — inclusive prefix sums (cumsum) or products (cumprod) along one dim of a strided tensor.
//
// cumsum_lines    one work-group of GROUP items per line of L elements; line = a * B + b, each operand
//                 addressed as offset + a * stride_a + b * stride_b + k * stride_scan. Item t owns the
//                 contiguous chunk [t * ceil(L / GROUP), ...) of the line: it sums its chunk, the GROUP
//                 chunk sums are scanned in local memory (Hillis-Steele, a fixed order), then each item
//                 re-runs its chunk from the sum of the chunks before it and writes the prefixes. The
//                 same result run to run; floats round like a blocked scan (CUDA's cumsum accumulates
//                 float32 in float32 too). An item reads each element before writing it, so out may be in.
//                 meta (IDX): L, B, then offset, scan, a and b strides of in, then of out.
//
// Variants (-D options): TI (input type), TA (accumulate type), TO (output type), IDX (int or long),
// GROUP (a power of two), PRODUCT (products instead of sums: the same blocked order, identity 1).

#ifndef IDX
  #define IDX int
#endif
#ifndef TI
  #define TI float
#endif
#ifndef TA
  #define TA float
#endif
#ifndef TO
  #define TO float
#endif
#ifndef GROUP
  #define GROUP 64
#endif

#ifdef PRODUCT
  #define IDENTITY ((TA)1)
  #define COMBINE(a, b) ((a) * (b))
#else
  #define IDENTITY ((TA)0)
  #define COMBINE(a, b) ((a) + (b))
#endif

typedef struct { IDX v[10]; } scan_meta_t;

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void cumsum_lines(__global TO *out, __global const TI *in, const scan_meta_t m)
{
  __local TA part[GROUP];
  const IDX line = (IDX)get_group_id(0);
  const int lid = get_local_id(0);
  const IDX len = m.v[0], a = line / m.v[1], b = line % m.v[1];
  __global const TI *src = in + m.v[2] + a * m.v[4] + b * m.v[5];
  __global TO *dst = out + m.v[6] + a * m.v[8] + b * m.v[9];
  const IDX src_step = m.v[3], dst_step = m.v[7];
  const IDX chunk = (len + GROUP - 1) / GROUP;
  const IDX lo = min(len, (IDX)lid * chunk), hi = min(len, lo + chunk);
  TA sum = IDENTITY;
  for (IDX k = lo; k < hi; ++k) sum = COMBINE(sum, (TA)src[k * src_step]);
  part[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = 1; step < GROUP; step <<= 1) {
    const TA before = lid >= step ? part[lid - step] : IDENTITY;
    barrier(CLK_LOCAL_MEM_FENCE);
    part[lid] = COMBINE(part[lid], before);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  TA run = lid ? part[lid - 1] : IDENTITY;
  for (IDX k = lo; k < hi; ++k) {
    run = COMBINE(run, (TA)src[k * src_step]);
    dst[k * dst_step] = (TO)run;
  }
}
