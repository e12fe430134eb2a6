// attention.cl — fused scaled-dot-product attention (flash-attention style), forward and backward.
//
// For each batch index bh = (b, h) and query row i:  O[i] = sum_j P[i, j] V[j] with
//   P[i, j] = softmax_j(scale * Q[i] . K[j] + bias[i, j]),
// where bias is -inf for a key a boolean mask excludes (false) or causality excludes (j > i: torch's
// top-left aligned lower triangle), the float mask's value when an additive mask is given, else 0.
// A row with every key excluded gives O = 0 and zero gradients, as torch's math path does.
// With dropout (DROPOUT 1), O[i] = sum_j P[i, j] Z[i, j] V[j] with Z[i, j] = 1 / keep where the uniform draw
// of score (bh, i, j) under the key (k0, k1) is below keep, else 0 (philox.cl: counter (bh*L + i)*S + j,
// the element a Bernoulli draw of the contiguous (B*H, L, S) mask would hold); the row log-sum-exp is the
// softmax's, before dropout. The backward draws the same numbers again: dV = (P Z)^T dO,
// dS = P * (Z dP - delta), with delta = dO . O as without dropout.
// The score matrix is never stored: a work-group takes BM query rows and loops over tiles of BN keys,
// keeping its rows' running maximum and sum (the online softmax) and the output in registers. Scores
// are kept in base 2 (scaled by log2(e)), so exp2 serves every exponential.
//
// attn_fwd       O (B, H, L, VD) and the row log-sum-exp LSE (natural log, contiguous (B*H, L); -inf for
//                a row without keys).
// attn_bwd_delta delta[bh, i] = dO[i] . O[i] (contiguous (B*H, L)), one work-item per row.
// attn_bwd_dq    dQ = scale * dS K over key tiles, per block of BM query rows: the scores are recomputed
//                from the saved LSE, P = exp(S - LSE), dP = dO V^T, dS = P * (dP - delta).
// attn_bwd_dkdv  dV = P^T dO and dK = scale * dS^T Q over query tiles, per block of BN keys (its threads
//                take keys as rows: BN = TM x (BN / TM), BM = TN x (BM / TN)).
// Each work-group's launch is (blocks x TM*TN, B*H); the two backward kernels write disjoint outputs,
// so no atomics are needed and results are the same run to run.
//
// Every tensor is read and written through strides: per operand a meta block of five values (element
// offset, then the strides of b, h, row and column; a mask's are 0 where it broadcasts). meta (IDX):
//   0 H, 1 L, 2 S, then the blocks of Q 3, K 8, V 13, O 18, MASK 23, dO 28, dQ 33, dK 38, dV 43, then the
//   element offsets of LSE 48 and delta 49.
//
// Variants (-D options):
//   HD, VD      head dims of Q/K and of V (any positive size)
//   DT          0 float32, 1 float16 (loaded and stored through vload_half/vstore_half; fp32 arithmetic)
//   MASK        0 none, 1 boolean (uchar, nonzero keeps), 2 additive (of the data type)
//   CAUSAL      1: keys after the query row are excluded (and their tiles skipped)
//   IDX         index type (int or long)
//   DROPOUT     1: dropout as above; the kernels (but attn_bwd_delta) take keep, k0, k1 after scale
#ifndef HD
  #define HD 64       // head dim of queries and keys
#endif
#ifndef VD
  #define VD HD       // head dim of values (and of the output)
#endif
#ifndef DT
  #define DT 0        // data type: 0 float32, 1 float16
#endif
#ifndef MASK
  #define MASK 0      // mask kind: 0 none, 1 boolean, 2 additive
#endif
#ifndef CAUSAL
  #define CAUSAL 0    // top-left aligned causal masking
#endif
#ifndef IDX
  #define IDX int     // index type
#endif
#ifndef DROPOUT
  #define DROPOUT 0   // 1: dropout on the probabilities, drawn on the device (philox.cl)
#endif
// tunables
#ifndef BM
  #define BM 32       // query rows per work-group (keys per work-group in attn_bwd_dkdv: BN)
#endif
#ifndef BN
  #define BN 32       // keys per tile (query rows per tile in attn_bwd_dkdv: BM)
#endif
#ifndef TM
  #define TM 8        // threads along the rows of a work-group
#endif
#ifndef TN
  #define TN 8        // threads along the keys of a tile and the columns of the output
#endif
#ifndef PAD
  #define PAD 1       // extra floats per local-memory row (bank conflicts)
#endif
#ifndef KVSHARE
  #define KVSHARE 0   // attn_fwd: 1 loads V into K's local tile once the scores are computed
#endif

#define WG (TM * TN)
#define LDQ (HD + PAD)
#define LDK (HD + PAD)
#define LDV (VD + PAD)
#define HCH ((HD + TN - 1) / TN)   // output columns per thread (of dQ, dK)
#define VCH ((VD + TN - 1) / TN)   // output columns per thread (of O, dV)

#if DT == 1
  #define T half
  #define LD(p, i) vload_half((i), (p))
  #define ST(p, i, x) vstore_half((x), (i), (p))
#else
  #define T float
  #define LD(p, i) ((p)[i])
  #define ST(p, i, x) ((p)[i] = (x))
#endif
#if MASK == 1
  #define MT uchar
#else
  #define MT T
#endif

#if DROPOUT
  #include "philox.cl"
  #define DROPOUT_ARGS , const float keep, const uint k0, const uint k1
  // the dropout factor of score (bh, qr, kc): 1 / keep where kept, else 0
  #define DROP(qr, kc) \
    (uniform24((ulong)(bh * L + (qr)) * (ulong)S + (ulong)(kc), k0, k1) < keep ? 1.0f / keep : 0.0f)
#else
  #define DROPOUT_ARGS
#endif

typedef struct { IDX v[50]; } attn_meta_t;
#define H_ m.v[0]
#define L_ m.v[1]
#define S_ m.v[2]
#define OFF(block) m.v[block]
#define SB(block) m.v[(block) + 1]
#define SH(block) m.v[(block) + 2]
#define SR(block) m.v[(block) + 3]
#define SC(block) m.v[(block) + 4]
#define QB 3
#define KB 8
#define VB 13
#define OB 18
#define MB 23
#define DOB 28
#define DQB 33
#define DKB 38
#define DVB 43
#define LSE_OFF m.v[48]
#define DELTA_OFF m.v[49]
// the element of operand block `blk` at batch (b, h)
#define BASE(blk, b, h) (OFF(blk) + (b) * SB(blk) + (h) * SH(blk))

// rows [row0, row0 + rows) x cols of a strided operand into local memory (row stride ld), times mul;
// rows at or past `valid` are zero
#define LOAD_ROWS(dst, ld, cols, src, base, srow, scol, row0, valid, rows, mul)                     \
  for (int e_ = (int)get_local_id(0); e_ < (rows) * (cols); e_ += WG) {                          \
    const int r_ = e_ / (cols), c_ = e_ - r_ * (cols);                                             \
    const IDX g_ = (IDX)(row0) + r_;                                                              \
    (dst)[r_ * (ld) + c_] = g_ < (valid) ? LD(src, (base) + g_ * (srow) + c_ * (scol)) * (mul) : 0.0f; \
  }

// the thread's tile of dot products over d < depth: acc[i][j] += A[tm + TM*i][d] * B[tn + TN*j][d] for its
// ra rows of A and rb rows of B (local tiles of row strides lda, ldb)
#define TILE_DOT(acc, ra, rb, A, lda, B, ldb, depth)                                                \
  for (int d_ = 0; d_ < (depth); ++d_) {                                                          \
    float a_[ra], b_[rb];                                                                         \
    for (int i_ = 0; i_ < (ra); ++i_) a_[i_] = (A)[(tm + TM * i_) * (lda) + d_];                  \
    for (int j_ = 0; j_ < (rb); ++j_) b_[j_] = (B)[(tn + TN * j_) * (ldb) + d_];                  \
    for (int i_ = 0; i_ < (ra); ++i_)                                                             \
      for (int j_ = 0; j_ < (rb); ++j_) (acc)[i_][j_] = fma(a_[i_], b_[j_], (acc)[i_][j_]);       \
  }

// the thread's tile of outer products over c < depth: acc[i][j] += W[tm + TM*i][c] * X[c][tn + TN*j] for its
// rows rows of W and its output columns tn + TN*j < cols (chunks of them; local tiles of row strides ldw, ldx)
#define TILE_OUTER(acc, rows, W, ldw, X, ldx, depth, cols, chunks)                                  \
  for (int c_ = 0; c_ < (depth); ++c_) {                                                          \
    float w_[rows];                                                                               \
    for (int i_ = 0; i_ < (rows); ++i_) w_[i_] = (W)[(tm + TM * i_) * (ldw) + c_];                \
    for (int j_ = 0; j_ < (chunks); ++j_) {                                                       \
      const int d_ = tn + TN * j_;                                                                \
      if ((cols) % TN == 0 || d_ < (cols)) {                                                      \
        const float x_ = (X)[c_ * (ldx) + d_];                                                    \
        for (int i_ = 0; i_ < (rows); ++i_) (acc)[i_][j_] = fma(w_[i_], x_, (acc)[i_][j_]);       \
      }                                                                                           \
    }                                                                                             \
  }

// the forward's row log-sum-exp (base 2) and delta of query rows [qb, qb + BM) into lrow and drow; 0 past L
#define LOAD_ROW_STATS(qb)                                                                          \
  for (int r_ = lid; r_ < BM; r_ += WG) {                                                         \
    const IDX qr_ = (qb) + r_;                                                                    \
    lrow[r_] = qr_ < L ? lse[LSE_OFF + bh * L + qr_] * M_LOG2E_F : 0.0f;                          \
    drow[r_] = qr_ < L ? delta[DELTA_OFF + bh * L + qr_] : 0.0f;                                  \
  }

// lid, tm, tn: this thread and its row and column in the TM x TN thread grid; bh, b, h: the work-group's
// (batch x head, batch, head); L, S: the query and key lengths
#define ATTN_THREAD_AND_HEAD                                                                        \
  const int lid = (int)get_local_id(0), tm = lid / TN, tn = lid - tm * TN;                        \
  const IDX bh = (IDX)get_group_id(1), b = bh / H_, h = bh - b * H_;                              \
  const IDX L = L_, S = S_;

// qb: the work-group's first query row, with its BM query rows in Qs scaled to base 2, and the mask's
// base and strides (mbase, msr, msc)
#define LOAD_QUERY_BLOCK                                                                            \
  const IDX qb = (IDX)get_group_id(0) * BM;                                                       \
  const IDX mbase = BASE(MB, b, h), msr = SR(MB), msc = SC(MB);                                   \
  LOAD_ROWS(Qs, LDQ, HD, q, BASE(QB, b, h), SR(QB), SC(QB), qb, L, BM, scale * M_LOG2E_F)

// the end of the keys that query rows [qb, qb + BM) see (causal: none after the block's last row)
#if CAUSAL
  #define KEY_END(qb) min(S, qb + BM)
#else
  #define KEY_END(qb) S
#endif

// the score s (base 2) of query row qr and key kc with the masks applied: -INFINITY where excluded
inline float masked_score(const float s, const IDX qr, const IDX kc, __global const MT *mask, const IDX mbase,
                          const IDX msr, const IDX msc, const IDX L, const IDX S)
{
  if (qr >= L || kc >= S) return -INFINITY;
#if CAUSAL
  if (kc > qr) return -INFINITY;
#endif
#if MASK == 1
  if (!mask[mbase + qr * msr + kc * msc]) return -INFINITY;
#elif MASK == 2
  return s + LD(mask, mbase + qr * msr + kc * msc) * M_LOG2E_F;
#endif
  return s;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attn_fwd(__global const T *q, __global const T *k, __global const T *v, __global const MT *mask,
              __global T *o, __global float *lse, const float scale DROPOUT_ARGS, const attn_meta_t m)
{
#define RM (BM / TM)
#define RN (BN / TN)
#define LDP (BN + PAD)
  __local float Qs[BM * LDQ];
#if KVSHARE
  __local float KVs[BN * (LDK > LDV ? LDK : LDV)];
  #define Ks KVs
  #define Vs KVs
#else
  __local float Ks[BN * LDK];
  __local float Vs[BN * LDV];
#endif
  __local float Ps[BM * LDP];
  __local float red[BM * TN];

  ATTN_THREAD_AND_HEAD
  LOAD_QUERY_BLOCK

  float acc[RM][VCH], mrow[RM], lpart[RM];
  for (int i = 0; i < RM; ++i) {
    mrow[i] = -INFINITY;
    lpart[i] = 0.0f;
    for (int j = 0; j < VCH; ++j) acc[i][j] = 0.0f;
  }
  const IDX kend = KEY_END(qb);
  for (IDX kb = 0; kb < kend; kb += BN) {
    LOAD_ROWS(Ks, LDK, HD, k, BASE(KB, b, h), SR(KB), SC(KB), kb, S, BN, 1.0f)
#if !KVSHARE
    LOAD_ROWS(Vs, LDV, VD, v, BASE(VB, b, h), SR(VB), SC(VB), kb, S, BN, 1.0f)
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    float s[RM][RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) s[i][j] = 0.0f;
    TILE_DOT(s, RM, RN, Qs, LDQ, Ks, LDK, HD)
    for (int i = 0; i < RM; ++i) {
      float mx = -INFINITY;
      for (int j = 0; j < RN; ++j) {
        s[i][j] = masked_score(s[i][j], qb + tm + TM * i, kb + tn + TN * j, mask, mbase, msr, msc, L, S);
        mx = fmax(mx, s[i][j]);
      }
      red[(tm + TM * i) * TN + tn] = mx;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if KVSHARE
    LOAD_ROWS(Vs, LDV, VD, v, BASE(VB, b, h), SR(VB), SC(VB), kb, S, BN, 1.0f)
#endif
    for (int i = 0; i < RM; ++i) {
      const int r = tm + TM * i;
      float mx = mrow[i];
      for (int t = 0; t < TN; ++t) mx = fmax(mx, red[r * TN + t]);
      const float base = mx == -INFINITY ? 0.0f : mx;   // a row without keys so far: p = 0
      const float alpha = exp2(mrow[i] - base);
      mrow[i] = mx;
      float sum = 0.0f;
      for (int j = 0; j < RN; ++j) {
        const float p = exp2(s[i][j] - base);
        sum += p;
#if DROPOUT
        Ps[r * LDP + tn + TN * j] = p == 0.0f ? 0.0f : p * DROP(qb + r, kb + tn + TN * j);
#else
        Ps[r * LDP + tn + TN * j] = p;
#endif
      }
      lpart[i] = lpart[i] * alpha + sum;
      for (int j = 0; j < VCH; ++j) acc[i][j] *= alpha;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    TILE_OUTER(acc, RM, Ps, LDP, Vs, LDV, BN, VD, VCH)
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int i = 0; i < RM; ++i) red[(tm + TM * i) * TN + tn] = lpart[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  const IDX obase = BASE(OB, b, h);
  for (int i = 0; i < RM; ++i) {
    const int r = tm + TM * i;
    const IDX qr = qb + r;
    if (qr >= L) continue;
    float l = 0.0f;
    for (int t = 0; t < TN; ++t) l += red[r * TN + t];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int j = 0; j < VCH; ++j) {
      const int d = tn + TN * j;
      if (VD % TN == 0 || d < VD) ST(o, obase + qr * SR(OB) + d * SC(OB), acc[i][j] * inv);
    }
    if (tn == 0) lse[LSE_OFF + bh * L + qr] = l > 0.0f ? (mrow[i] + log2(l)) * M_LN2_F : -INFINITY;
  }
#undef RM
#undef RN
#undef LDP
#if KVSHARE
  #undef Ks
  #undef Vs
#endif
}

__kernel void attn_bwd_delta(__global const T *dout, __global const T *o, __global float *delta, const IDX rows,
                             const attn_meta_t m)
{
  const IDX g = (IDX)get_global_id(0);
  if (g >= rows) return;
  const IDX L = L_, bh = g / L, qr = g - bh * L, b = bh / H_, h = bh - b * H_;
  const IDX dbase = BASE(DOB, b, h) + qr * SR(DOB), obase = BASE(OB, b, h) + qr * SR(OB);
  float sum = 0.0f;
  for (int d = 0; d < VD; ++d) sum = fma(LD(dout, dbase + d * SC(DOB)), LD(o, obase + d * SC(OB)), sum);
  delta[DELTA_OFF + g] = sum;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attn_bwd_dq(__global const T *q, __global const T *k, __global const T *v, __global const MT *mask,
                 __global const T *dout, __global const float *lse, __global const float *delta, __global T *dq,
                 const float scale DROPOUT_ARGS, const attn_meta_t m)
{
#define RM (BM / TM)
#define RN (BN / TN)
#define LDP (BN + PAD)
  __local float Qs[BM * LDQ];
  __local float dOs[BM * LDV];
  __local float Ks[BN * LDK];
  __local float Vs[BN * LDV];
  __local float Ds[BM * LDP];
  __local float lrow[BM], drow[BM];

  ATTN_THREAD_AND_HEAD
  LOAD_QUERY_BLOCK
  LOAD_ROWS(dOs, LDV, VD, dout, BASE(DOB, b, h), SR(DOB), SC(DOB), qb, L, BM, 1.0f)
  LOAD_ROW_STATS(qb)
  float acc[RM][HCH];
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < HCH; ++j) acc[i][j] = 0.0f;
  const IDX kend = KEY_END(qb);
  for (IDX kb = 0; kb < kend; kb += BN) {
    LOAD_ROWS(Ks, LDK, HD, k, BASE(KB, b, h), SR(KB), SC(KB), kb, S, BN, 1.0f)
    LOAD_ROWS(Vs, LDV, VD, v, BASE(VB, b, h), SR(VB), SC(VB), kb, S, BN, 1.0f)
    barrier(CLK_LOCAL_MEM_FENCE);
    float s[RM][RN], dp[RM][RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) s[i][j] = dp[i][j] = 0.0f;
    TILE_DOT(s, RM, RN, Qs, LDQ, Ks, LDK, HD)
    TILE_DOT(dp, RM, RN, dOs, LDV, Vs, LDV, VD)
    for (int i = 0; i < RM; ++i) {
      const int r = tm + TM * i;
      for (int j = 0; j < RN; ++j) {
        const float x = masked_score(s[i][j], qb + r, kb + tn + TN * j, mask, mbase, msr, msc, L, S);
        const float p = x == -INFINITY ? 0.0f : exp2(x - lrow[r]);
#if DROPOUT
        Ds[r * LDP + tn + TN * j] = p == 0.0f ? 0.0f : p * (dp[i][j] * DROP(qb + r, kb + tn + TN * j) - drow[r]);
#else
        Ds[r * LDP + tn + TN * j] = p * (dp[i][j] - drow[r]);
#endif
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    TILE_OUTER(acc, RM, Ds, LDP, Ks, LDK, BN, HD, HCH)
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const IDX dbase = BASE(DQB, b, h);
  for (int i = 0; i < RM; ++i) {
    const IDX qr = qb + tm + TM * i;
    if (qr >= L) continue;
    for (int j = 0; j < HCH; ++j) {
      const int d = tn + TN * j;
      if (HD % TN == 0 || d < HD) ST(dq, dbase + qr * SR(DQB) + d * SC(DQB), acc[i][j] * scale);
    }
  }
#undef RM
#undef RN
#undef LDP
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attn_bwd_dkdv(__global const T *q, __global const T *k, __global const T *v, __global const MT *mask,
                   __global const T *dout, __global const float *lse, __global const float *delta,
                   __global T *dk, __global T *dv, const float scale DROPOUT_ARGS, const attn_meta_t m)
{
#define RK (BN / TM)   // keys per thread
#define RQ (BM / TN)   // query rows per thread
#define LDT (BM + PAD)
  __local float Ks[BN * LDK];
  __local float Vs[BN * LDV];
  __local float Qs[BM * LDQ];
  __local float dOs[BM * LDV];
  __local float Pt[BN * LDT];
  __local float Dt[BN * LDT];
  __local float lrow[BM], drow[BM];

  ATTN_THREAD_AND_HEAD
  const IDX kb = (IDX)get_group_id(0) * BN;
  const IDX mbase = BASE(MB, b, h), msr = SR(MB), msc = SC(MB);
  const float qmul = scale * M_LOG2E_F;
  LOAD_ROWS(Ks, LDK, HD, k, BASE(KB, b, h), SR(KB), SC(KB), kb, S, BN, 1.0f)
  LOAD_ROWS(Vs, LDV, VD, v, BASE(VB, b, h), SR(VB), SC(VB), kb, S, BN, 1.0f)
  float ak[RK][HCH], av[RK][VCH];
  for (int i = 0; i < RK; ++i) {
    for (int j = 0; j < HCH; ++j) ak[i][j] = 0.0f;
    for (int j = 0; j < VCH; ++j) av[i][j] = 0.0f;
  }
#if CAUSAL
  const IDX qstart = kb / BM * BM;   // query rows before the block's first key see none of its keys
#else
  const IDX qstart = 0;
#endif
  for (IDX qb = qstart; qb < L; qb += BM) {
    LOAD_ROWS(Qs, LDQ, HD, q, BASE(QB, b, h), SR(QB), SC(QB), qb, L, BM, 1.0f)
    LOAD_ROWS(dOs, LDV, VD, dout, BASE(DOB, b, h), SR(DOB), SC(DOB), qb, L, BM, 1.0f)
    LOAD_ROW_STATS(qb)
    barrier(CLK_LOCAL_MEM_FENCE);
    float s[RK][RQ], dp[RK][RQ];
    for (int i = 0; i < RK; ++i)
      for (int j = 0; j < RQ; ++j) s[i][j] = dp[i][j] = 0.0f;
    TILE_DOT(s, RK, RQ, Ks, LDK, Qs, LDQ, HD)
    TILE_DOT(dp, RK, RQ, Vs, LDV, dOs, LDV, VD)
    for (int i = 0; i < RK; ++i) {
      const int c = tm + TM * i;
      for (int j = 0; j < RQ; ++j) {
        const int r = tn + TN * j;
        const float x = masked_score(s[i][j] * qmul, qb + r, kb + c, mask, mbase, msr, msc, L, S);
        const float p = x == -INFINITY ? 0.0f : exp2(x - lrow[r]);
#if DROPOUT
        const float z = p == 0.0f ? 0.0f : DROP(qb + r, kb + c);
        Pt[c * LDT + r] = p * z;
        Dt[c * LDT + r] = p * (dp[i][j] * z - drow[r]);
#else
        Pt[c * LDT + r] = p;
        Dt[c * LDT + r] = p * (dp[i][j] - drow[r]);
#endif
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    TILE_OUTER(av, RK, Pt, LDT, dOs, LDV, BM, VD, VCH)
    TILE_OUTER(ak, RK, Dt, LDT, Qs, LDQ, BM, HD, HCH)
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const IDX kbase = BASE(DKB, b, h), vbase = BASE(DVB, b, h);
  for (int i = 0; i < RK; ++i) {
    const IDX kc = kb + tm + TM * i;
    if (kc >= S) continue;
    for (int j = 0; j < HCH; ++j) {
      const int d = tn + TN * j;
      if (HD % TN == 0 || d < HD) ST(dk, kbase + kc * SR(DKB) + d * SC(DKB), ak[i][j] * scale);
    }
    for (int j = 0; j < VCH; ++j) {
      const int d = tn + TN * j;
      if (VD % TN == 0 || d < VD) ST(dv, vbase + kc * SR(DVB) + d * SC(DVB), av[i][j]);
    }
  }
#undef RK
#undef RQ
#undef LDT
}
