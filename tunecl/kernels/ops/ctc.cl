// ctc.cl — the connectionist temporal classification loss in log space: torch's _ctc_loss (the alpha
// recursion and the negative log-likelihood) and _ctc_loss_backward (the beta recursion and the gradient
// wrt log_probs), with torch's CPU kernel's formulas and order of operations.
//
// log_probs x is (T, N, C) with any strides; targets are int64, sample n's labels at tg[off_n + k * stride]
// (off_n from info). The extended label sequence of a target of length L has width 2L + 1 positions:
// prime(s) = blank for even s, target[s / 2] for odd s. A label outside [0, C) reads as log-probability -inf
// (torch does not check targets; this keeps the reads in bounds).
//
// Kernels:
//   ctc_alpha  one work-group per sample n: log_alpha[n] (T, W) row by row (a barrier between time steps,
//              the positions of a row spread over the work-items), then nll[n] from the last row. Positions
//              the recursion does not reach (t >= input length, s >= 2L + 1) hold -inf.
//   ctc_beta   one work-group per sample n: log_beta[n] over t < input length, s < 2L + 1, from the last
//              row down; samples with zero_infinity and an infinite nll are skipped.
//   ctc_links  one work-item per target position j of a sample: links[n, j] = (the previous position of
//              the same label or -1, whether j is the label's last position).
//   ctc_grad   one work-item per (t, n, c) of the (T, N, C) contiguous gradient: the gradient of a label no
//              position contributes to, (exp(lp) - exp(-inf + nll - lp)) * grad_out[n]; 0 for t >= input
//              length and for samples with zero_infinity and an infinite nll.
//   ctc_grad_labels  then one work-item per (t, n, k), k <= target length: k = L for the blank, else target
//              position k when it is its label's last: the log-sum of log_alpha + log_beta over the label's
//              positions, descending s as torch collects them (through the links), and the label's gradient
//              (exp(lp) - exp(collected + nll - lp)) * grad_out[n]. Each label has one such item: the results
//              do not depend on the order of the work-items.
//
// Variants (-D options): REAL (float).
// info (long, (N, 3) contiguous): input length, target length, targets' element offset of the sample.
// meta (long): T, N, C, W (log_alpha's last dim, at least 2 * max target length + 1), blank, zero_infinity,
// then offset and t, n, c strides of log_probs, the targets' stride, offset and stride of nll, offset and
// stride of grad_out, then the offsets of log_alpha, log_beta, grad, info and links (contiguous; links is
// (N, W / 2, 2) long).

#ifndef REAL
  #define REAL float
#endif

typedef struct { long v[20]; } ctc_meta_t;
#define T_MAX     m.v[0]
#define N_BATCH   m.v[1]
#define C_LABELS  m.v[2]
#define W         m.v[3]
#define BLANK     m.v[4]
#define ZERO_INF  m.v[5]
#define LP_OFF    m.v[6]
#define LP_T      m.v[7]
#define LP_N      m.v[8]
#define LP_C      m.v[9]
#define TG_STRIDE m.v[10]
#define NLL_OFF   m.v[11]
#define NLL_S     m.v[12]
#define GO_OFF    m.v[13]
#define GO_S      m.v[14]
#define ALPHA_OFF m.v[15]
#define BETA_OFF  m.v[16]
#define GRAD_OFF  m.v[17]
#define INFO_OFF  m.v[18]
#define LINKS_OFF m.v[19]
#define LINKS_L   (m.v[3] / 2)   // the longest target the width W holds

#define NEG_INF (-INFINITY)

inline long prime(__global const long *tg, long off, long stride, long s, long blank)
{
  return (s & 1) ? tg[off + stride * (s >> 1)] : blank;
}

// log_probs[t, n, label] of the sample whose row starts at x (label outside [0, C): -inf)
inline REAL lp_at(__global const REAL *x, long t, long label, const ctc_meta_t m)
{
  return (label >= 0 && label < C_LABELS) ? x[t * LP_T + label * LP_C] : NEG_INF;
}

// log(exp(sum) + exp(x)) as torch's kernel collects a gradient's terms (the first term taken as it is)
inline REAL log_add(REAL sum, REAL x)
{
  if (sum == NEG_INF) return x;
  const REAL top = sum < x ? x : sum;
  return log(exp(sum - top) + exp(x - top)) + top;
}

// log(exp(a) + exp(b) + exp(c)) as torch's kernel forms it: shifted by the largest (0 when all are -inf)
inline REAL log_sum3(REAL a, REAL b, REAL c)
{
  REAL top = a;
  if (b > top) top = b;
  if (c > top) top = c;
  if (top == NEG_INF) top = 0;
  return log(exp(a - top) + exp(b - top) + exp(c - top)) + top;
}

__kernel void ctc_alpha(__global REAL *nll, __global REAL *alpha, __global const REAL *lp,
                        __global const long *tg, __global const long *info, const ctc_meta_t m)
{
  const long n = get_group_id(0);
  const long lid = get_local_id(0), items = get_local_size(0);
  __global const long *own = info + INFO_OFF + 3 * n;
  const long in_len = own[0], tg_len = own[1], tg_off = own[2];
  const long width = 2 * tg_len + 1;
  __global const REAL *x = lp + LP_OFF + n * LP_N;
  __global REAL *a = alpha + ALPHA_OFF + n * T_MAX * W;

  // row 0 (blank, then the first label) and -inf wherever the recursion does not write
  for (long i = lid; i < T_MAX * W; i += items) {
    const long t = i / W, s = i - t * W;
    if (t < in_len && s < width && t > 0) continue;
    REAL v = NEG_INF;
    if (t == 0 && in_len > 0 && s < 2 && s < width) v = lp_at(x, 0, prime(tg, tg_off, TG_STRIDE, s, BLANK), m);
    a[i] = v;
  }
  barrier(CLK_GLOBAL_MEM_FENCE);

  for (long t = 1; t < in_len; ++t) {
    __global const REAL *prev = a + (t - 1) * W;
    for (long s = lid; s < width; s += items) {
      const long label = prime(tg, tg_off, TG_STRIDE, s, BLANK);
      const REAL a2 = s > 0 ? prev[s - 1] : NEG_INF;
      const REAL a3 = (s > 1 && prime(tg, tg_off, TG_STRIDE, s - 2, BLANK) != label) ? prev[s - 2] : NEG_INF;
      a[t * W + s] = log_sum3(prev[s], a2, a3) + lp_at(x, t, label, m);
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
  }

  if (lid == 0) {
    REAL result;
    if (in_len == 0) {
      result = -(tg_len == 0 ? (REAL)0 : NEG_INF);
    } else if (tg_len == 0) {
      result = -a[(in_len - 1) * W];
    } else {
      const REAL l1 = a[(in_len - 1) * W + 2 * tg_len], l2 = a[(in_len - 1) * W + 2 * tg_len - 1];
      REAL top = l1 < l2 ? l2 : l1;
      if (top == NEG_INF) top = 0;
      result = -(log(exp(l1 - top) + exp(l2 - top)) + top);
    }
    nll[NLL_OFF + n] = result;
  }
}

__kernel void ctc_beta(__global REAL *beta, __global const REAL *nll, __global const REAL *lp,
                       __global const long *tg, __global const long *info, const ctc_meta_t m)
{
  const long n = get_group_id(0);
  const long lid = get_local_id(0), items = get_local_size(0);
  if (ZERO_INF && nll[NLL_OFF + n * NLL_S] == INFINITY) return;   // the whole work-group: its gradient is 0
  __global const long *own = info + INFO_OFF + 3 * n;
  const long in_len = own[0], tg_len = own[1], tg_off = own[2];
  const long width = 2 * tg_len + 1;
  if (in_len == 0) return;
  __global const REAL *x = lp + LP_OFF + n * LP_N;
  __global REAL *b = beta + BETA_OFF + n * T_MAX * W;

  const long last = in_len - 1;
  for (long s = lid; s < width; s += items) {
    b[last * W + s] = s >= width - 2 ? lp_at(x, last, prime(tg, tg_off, TG_STRIDE, s, BLANK), m) : NEG_INF;
  }
  barrier(CLK_GLOBAL_MEM_FENCE);

  for (long t = last - 1; t >= 0; --t) {
    __global const REAL *next = b + (t + 1) * W;
    for (long s = lid; s < width; s += items) {
      const long label = prime(tg, tg_off, TG_STRIDE, s, BLANK);
      const REAL b2 = s < width - 1 ? next[s + 1] : NEG_INF;
      const REAL b3 = (s < width - 2 && prime(tg, tg_off, TG_STRIDE, s + 2, BLANK) != label) ? next[s + 2]
                                                                                             : NEG_INF;
      b[t * W + s] = log_sum3(next[s], b2, b3) + lp_at(x, t, label, m);
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
  }
}

// (exp(lp) - exp(collected + nll - lp)) * grad_out[n], torch's gradient of log_probs[t, n, c]
inline REAL gradient(REAL collected, REAL x, REAL loss, __global const REAL *grad_out, long n, const ctc_meta_t m)
{
  return (exp(x) - exp(collected + loss - x)) * grad_out[GO_OFF + n * GO_S];
}

__kernel void ctc_grad(__global REAL *grad, __global const REAL *nll, __global const REAL *grad_out,
                       __global const REAL *lp, __global const long *info, const ctc_meta_t m)
{
  const long i = get_global_id(0);
  if (i >= T_MAX * N_BATCH * C_LABELS) return;
  const long c = i % C_LABELS, n = (i / C_LABELS) % N_BATCH, t = i / (C_LABELS * N_BATCH);
  const long in_len = info[INFO_OFF + 3 * n];
  const REAL loss = nll[NLL_OFF + n * NLL_S];
  grad[GRAD_OFF + i] = (t >= in_len || (ZERO_INF && loss == INFINITY))
      ? 0 : gradient(NEG_INF, lp[LP_OFF + t * LP_T + n * LP_N + c * LP_C], loss, grad_out, n, m);
}

__kernel void ctc_links(__global long *links, __global const long *tg, __global const long *info,
                        const ctc_meta_t m)
{
  const long i = get_global_id(0);
  if (i >= N_BATCH * LINKS_L) return;
  const long n = i / LINKS_L, j = i % LINKS_L;
  __global const long *own = info + INFO_OFF + 3 * n;
  const long tg_len = own[1], tg_off = own[2];
  if (j >= tg_len) return;
  const long label = tg[tg_off + j * TG_STRIDE];
  long before = -1, last = 1;
  for (long k = j - 1; k >= 0; --k) {
    if (tg[tg_off + k * TG_STRIDE] == label) { before = k; break; }
  }
  for (long k = j + 1; k < tg_len; ++k) {
    if (tg[tg_off + k * TG_STRIDE] == label) { last = 0; break; }
  }
  links[LINKS_OFF + 2 * i] = before;
  links[LINKS_OFF + 2 * i + 1] = last;
}

__kernel void ctc_grad_labels(__global REAL *grad, __global const REAL *alpha, __global const REAL *beta,
                              __global const REAL *nll, __global const REAL *grad_out, __global const REAL *lp,
                              __global const long *tg, __global const long *info, __global const long *links,
                              const ctc_meta_t m)
{
  const long i = get_global_id(0);
  if (i >= T_MAX * N_BATCH * (LINKS_L + 1)) return;
  const long k = i % (LINKS_L + 1), n = (i / (LINKS_L + 1)) % N_BATCH, t = i / ((LINKS_L + 1) * N_BATCH);
  __global const long *own = info + INFO_OFF + 3 * n;
  const long in_len = own[0], tg_len = own[1], tg_off = own[2];
  const REAL loss = nll[NLL_OFF + n * NLL_S];
  if (t >= in_len || k > tg_len || (ZERO_INF && loss == INFINITY)) return;
  __global const REAL *a = alpha + ALPHA_OFF + (n * T_MAX + t) * W;
  __global const REAL *b = beta + BETA_OFF + (n * T_MAX + t) * W;
  __global const long *link = links + LINKS_OFF + 2 * n * LINKS_L;
  const bool last_step = t == in_len - 1;
  // the last step has two positions reachable from the end, each assigned (the last label's after the final
  // blank's); earlier steps log-add every position of the label, from the highest s down
  long label;
  REAL collected = NEG_INF;
  if (k == tg_len) {   // the blank: every even position, and any label equal to it
    label = BLANK;
    if (last_step) {
      const long s = (tg_len > 0 && prime(tg, tg_off, TG_STRIDE, 2 * tg_len - 1, BLANK) == BLANK) ? 2 * tg_len - 1
                                                                                             : 2 * tg_len;
      collected = a[s] + b[s];
    } else {
      for (long s = 2 * tg_len; s >= 0; --s) {
        if (prime(tg, tg_off, TG_STRIDE, s, BLANK) == BLANK) collected = log_add(collected, a[s] + b[s]);
      }
    }
  } else {   // target position k, when it is its label's last (the blank's positions are the blank's)
    label = tg[tg_off + k * TG_STRIDE];
    if (label == BLANK || label < 0 || label >= C_LABELS || !link[2 * k + 1]) return;
    if (last_step) {
      if (k != tg_len - 1) return;   // no position of this label is reachable: ctc_grad's value stands
      collected = a[2 * k + 1] + b[2 * k + 1];
    } else {
      for (long j = k; j >= 0; j = link[2 * j]) collected = log_add(collected, a[2 * j + 1] + b[2 * j + 1]);
    }
  }
  grad[GRAD_OFF + (t * N_BATCH + n) * C_LABELS + label] =
      gradient(collected, lp[LP_OFF + t * LP_T + n * LP_N + label * LP_C], loss, grad_out, n, m);
}
