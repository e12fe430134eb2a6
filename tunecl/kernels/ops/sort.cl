// sort.cl — sort along one dim of a strided tensor (sort, topk): a bitonic sort of every line in
// global scratch, one launch per merge step.
//
// Each of the lines (line = a * B + b, operands addressed as offset + a * stride_a + b * stride_b +
// k * stride_scan) of L elements is padded to P = 2^ceil(log2 L) slots of (key, position) pairs in
// scratch. Pairs are ordered by key (NaN as the largest, as torch orders it), then by position, so the
// order is total: ties keep their input order (a stable sort), and the result is the same run to run.
// Padding slots (position >= L) go last.
//
// sort_init      keys[line * P + p] = (TK)in[line, p], pos = p (padding: pos = p, key unused)
// sort_step      one bitonic compare-exchange step (block size K, distance J) over every line
// sort_write     values[line, r] = in[line, pos[r]] (the element's bits, T) and indices[line, r] = pos[r],
//                for r < R (topk writes the first R)
// meta (IDX): lines x P, P, L, B, then offset, scan, a and b strides of in, then of values, then of
// indices, then R.
// isin_sorted    out[i] = (elements[i] is among the N sorted values) != INVERT, by binary search; contiguous
//                TK operands (NaN is never found: it equals nothing). Its own arguments: count, N.
// search_sorted  out[i] = the insertion point of values[i] in its row of N sorted values (row i / INNER, or
//                the one row where ROWS is 0): the first position whose value is not below it (lower
//                bound), or with RIGHT not at or below it (upper bound), by torch's comparisons (a NaN
//                value or boundary goes as torch's CPU kernel puts it). With SORTER the row's k-th value is
//                sorted[row * N + sorter[row * N + k]]. Contiguous TK operands, OUT_T results. Its own
//                arguments: count, INNER, N, ROWS.
//
// Variants (-D options): TI (input type), TK (key type: float or long), IS_FLOAT, HALF_INPUT (TI is
// read with vload_half), DESCENDING, T (an unsigned type of the element's size), IDX (int or long),
// INVERT, RIGHT, SORTER, OUT_T (int or long).

#ifndef IDX
  #define IDX int
#endif
#ifndef TI
  #define TI float
#endif
#ifndef TK
  #define TK float
#endif
#ifndef T
  #define T uint
#endif

typedef struct { IDX v[17]; } sort_meta_t;
#define S_TOTAL m.v[0]
#define S_P     m.v[1]
#define S_L     m.v[2]
#define S_B     m.v[3]
#define IN_AT(line, k)  (m.v[4] + ((line) / S_B) * m.v[6] + ((line) % S_B) * m.v[7] + (k) * m.v[5])
#define VAL_AT(line, k) (m.v[8] + ((line) / S_B) * m.v[10] + ((line) % S_B) * m.v[11] + (k) * m.v[9])
#define IND_AT(line, k) (m.v[12] + ((line) / S_B) * m.v[14] + ((line) % S_B) * m.v[15] + (k) * m.v[13])
#define S_R     m.v[16]

// whether (a, pa) goes before (b, pb)
inline int before(const TK a, const long pa, const TK b, const long pb, const long len)
{
  const int pad_a = pa >= len, pad_b = pb >= len;
  if (pad_a || pad_b) return pad_a == pad_b ? pa < pb : pad_b;
#ifdef IS_FLOAT
  const int nan_a = isnan(a), nan_b = isnan(b);
  if (nan_a != nan_b) {
  #ifdef DESCENDING
    return nan_a;
  #else
    return nan_b;
  #endif
  }
  if (!nan_a && a != b) {
#else
  if (a != b) {
#endif
#ifdef DESCENDING
    return a > b;
#else
    return a < b;
#endif
  }
  return pa < pb;
}

__kernel void sort_init(__global TK *keys, __global long *pos, __global const TI *in, const sort_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= S_TOTAL) return;
  const IDX line = i / S_P, p = i % S_P;
  pos[i] = p;
  if (p < S_L) {
#ifdef HALF_INPUT
    keys[i] = (TK)vload_half(IN_AT(line, p), in);
#else
    keys[i] = (TK)in[IN_AT(line, p)];
#endif
  } else {
    keys[i] = (TK)0;
  }
}

__kernel void sort_step(__global TK *keys, __global long *pos, const sort_meta_t m, const long block,
                        const long distance)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= S_TOTAL) return;
  const IDX p = i % S_P, q = p ^ (IDX)distance;
  if (q <= p) return;
  const IDX a = i, b = i - p + q;
  const TK ka = keys[a], kb = keys[b];
  const long pa = pos[a], pb = pos[b];
  const int up = (p & (IDX)block) == 0;
  const int swap = up ? before(kb, pb, ka, pa, S_L) : before(ka, pa, kb, pb, S_L);
  if (swap) {
    keys[a] = kb;
    keys[b] = ka;
    pos[a] = pb;
    pos[b] = pa;
  }
}

__kernel void sort_write(__global T *values, __global long *indices, __global const long *pos,
                         __global const T *in, const sort_meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= S_TOTAL) return;
  const IDX line = i / S_P, r = i % S_P;
  if (r >= S_R) return;
  const IDX p = (IDX)pos[i];
  values[VAL_AT(line, r)] = in[IN_AT(line, p)];
  indices[IND_AT(line, r)] = p;
}

__kernel void isin_sorted(__global uchar *out, __global const TK *elements, __global const TK *sorted,
                          const long count, const long n)
{
  const long i = get_global_id(0);
  if (i >= count) return;
  const TK x = elements[i];
  long lo = 0, hi = n;   // the first sorted value not below x
  while (lo < hi) {
    const long mid = lo + (hi - lo) / 2;
    if (sorted[mid] < x) lo = mid + 1; else hi = mid;
  }
  const int found = lo < n && sorted[lo] == x;
#ifdef INVERT
  out[i] = !found;
#else
  out[i] = found;
#endif
}

#ifndef OUT_T
  #define OUT_T long
#endif

__kernel void search_sorted(__global OUT_T *out, __global const TK *values, __global const TK *sorted,
                            __global const long *sorter, const long count, const long inner, const long n,
                            const long rows)
{
  const long i = get_global_id(0);
  if (i >= count) return;
  const TK x = values[i];
  const long base = rows ? (i / inner) * n : 0;
  long lo = 0, hi = n;
  while (lo < hi) {
    const long mid = lo + (hi - lo) / 2;
#ifdef SORTER
    const TK v = sorted[base + sorter[base + mid]];
#else
    const TK v = sorted[base + mid];
#endif
#ifdef RIGHT
    if (!(v > x)) lo = mid + 1; else hi = mid;
#else
    if (!(v >= x)) lo = mid + 1; else hi = mid;
#endif
  }
  out[i] = (OUT_T)lo;
}
