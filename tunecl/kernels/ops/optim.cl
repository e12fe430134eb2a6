// optim.cl — fused optimizer steps over up to SLOTS tensors per launch, fp32.
//
// One launch updates a chunk of parameters: dimension 1 of the NDRange picks the slot (tensor),
// dimension 0 strides over that tensor's elements. Buffers of unused slots are NULL with n = 0.
//
// Kernels:
//   adam_step  Adam / AdamW (ADAMW) as torch's fused kernels compute it, bias corrections from the
//              step count read on the device (no host sync; with GROUP_CORRECTIONS, the CPU layout of
//              one element per work-item, computed once per work-group):
//                g = maximize ? -g : g;  AdamW: p -= lr*wd*p,  Adam: g += wd*p   (if wd != 0)
//                m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  (AMSGRAD: vmax = max(vmax, v))
//                p -= lr/(1-b1^t) * m / (sqrt(v or vmax)/sqrt(1-b2^t) + eps)
//   sgd_step   SGD: g = maximize ? -g : g;  g += wd*p;  with MOMENTUM: buf = first ? g :
//              momentum*buf + (1-dampening)*g;  g = NESTEROV ? g + momentum*buf : buf;  p -= lr*g
//   Both, mixed precision (torch.amp.GradScaler), as torch's fused kernels: with FOUND_INF nothing is
//   updated when found_inf is 1; with GRAD_SCALE each gradient is first divided by the scale and
//   written back so (g = g / scale, before maximize).
//   foreach_map  o = MAP_EXPR(a, b, c, s0, s1) elementwise (torch's _foreach_* ops; MAP_EXPR is one of
//              the pointwise family's float expressions). Each of a, b, c is a tensor of the slot or,
//              with A_SCALAR / B_SCALAR / C_SCALAR, a number of the slot, or with A_ONE / B_ONE / C_ONE
//              a tensor of one element read for every element; s0 and s1 are numbers of the slot.
//   foreach_add_long  q += value over int64 tensors (a compiled graph's batch-norm step counts, one
//              launch for many of them)
//   foreach_chain  a chain of elementwise steps over NCOL columns (a compiled graph's run of _foreach_*
//              ops, tunecl.backend.foreach_fusion): the host passes the steps as fused.cl's Fk/STEPk
//              macros over the column values v0.. and earlier steps t0..; BEFORE the loop over a slot's
//              elements, once per work-group, the loads LD1(column) of the columns of one-element
//              tensors (read for every element) and the steps SV(k) computed from them and constants
//              alone, shared through local memory (SHARES, UNSHARES: NUNIFORM values); in the loop,
//              LOADS as LD(column, i), STEPS as SV(k) for the other steps, and STORES as
//              ST(column, step) for the columns written back. With NCONST, the kernel's first argument
//              holds NCONST floats, K(0) .. K(NCONST - 1), which the steps may read as numbers (an
//              eager run of foreach calls, tunecl.backend.foreach_runs, whose numbers change per call).
//
// Pointers: each slot's tensors are pointer arguments (FOR_SLOTS(*_SLOT)), each offset by its meta entry
// (in elements); or with ADDRESSES there are no pointer arguments and each meta entry is the tensor's
// device address (its buffer's address plus the offset, in bytes; tunecl.runtime.addresses), so a launch
// sets one by-value argument however many tensors it updates (NVIDIA: a launch's cost grows with its
// pointer arguments) and SLOTS is bounded only by the device's parameter bytes.
//
// meta (long): per slot, adam: n, offsets of p, g, m, v, vmax, step; sgd: n, offsets of p, g, buf;
// foreach_map: n, offsets of o, a, b, c; foreach_add_long: n, offset of q; foreach_chain: n, then each column's offset. foreach_map's
// numbers (float): per slot a, b, c, s0, s1.

#ifndef SLOTS
  #define SLOTS 8
#endif

#ifdef GRAD_SCALE
  #define GRAD_T __global float    // (the unscaled gradient is written back)
#else
  #define GRAD_T __global const float
#endif
#ifdef ADDRESSES
  // the pointers travel in the meta as device addresses (see the header): no pointer arguments
  #define ADAM_SLOT(k)
  #define ADAM_PICK(k)
  #define SGD_SLOT(k)
  #define SGD_PICK(k)
  #define MAP_SLOT(k)
  #define MAP_PICK(k)
  #define COUNT_SLOT(k)
  #define COUNT_PICK(k)
  // AT(T, base, v): a column's pointer, from the meta entry v of its slot
  #define AT(T, base, v) ((T *)(v))
#else
  #define ADAM_SLOT(k) , __global float *p##k, GRAD_T *g##k, __global float *m##k, \
                         __global float *v##k, __global float *vmax##k, __global const float *step##k
  #define ADAM_PICK(k) case k: p = p##k; g = g##k; mo = m##k; ve = v##k; vmax = vmax##k; st = step##k; break;
  #define SGD_SLOT(k)  , __global float *p##k, GRAD_T *g##k, __global float *buf##k
  #define SGD_PICK(k)  case k: p = p##k; g = g##k; buf = buf##k; break;
  #define MAP_SLOT(k)  , __global float *o##k, __global const float *ta##k, __global const float *tb##k, \
                         __global const float *tc##k
  #define MAP_PICK(k)  case k: o = o##k; ta = ta##k; tb = tb##k; tc = tc##k; break;
  #define COUNT_SLOT(k) , __global long *q##k
  #define COUNT_PICK(k) case k: q = q##k; break;
  #define AT(T, base, v) ((base) + (v))
#endif

// FOR_SLOTS(M) expands M(k) for every slot k < SLOTS: 1 .. 8, 16, 24 or 32 slots (above 8 only where the
// device takes that many parameter bytes: the host picks SLOTS, tunecl.kernels.ops.optim.slots_for)
#if !defined(ADDRESSES) && SLOTS > 8 && (SLOTS % 8 != 0 || SLOTS > 32)
  #error "SLOTS is 1 .. 8, 16, 24 or 32"
#endif
#define S1(M) M(0)
#if SLOTS > 1
  #define S2(M) S1(M) M(1)
#else
  #define S2(M) S1(M)
#endif
#if SLOTS > 2
  #define S3(M) S2(M) M(2)
#else
  #define S3(M) S2(M)
#endif
#if SLOTS > 3
  #define S4(M) S3(M) M(3)
#else
  #define S4(M) S3(M)
#endif
#if SLOTS > 4
  #define S5(M) S4(M) M(4)
#else
  #define S5(M) S4(M)
#endif
#if SLOTS > 5
  #define S6(M) S5(M) M(5)
#else
  #define S6(M) S5(M)
#endif
#if SLOTS > 6
  #define S7(M) S6(M) M(6)
#else
  #define S7(M) S6(M)
#endif
#if SLOTS > 7
  #define S8(M) S7(M) M(7)
#else
  #define S8(M) S7(M)
#endif
#define S16(M) S8(M) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define S24(M) S16(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
#define S32(M) S24(M) M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#if SLOTS == 32
  #define FOR_SLOTS(M) S32(M)
#elif SLOTS == 24
  #define FOR_SLOTS(M) S24(M)
#elif SLOTS == 16
  #define FOR_SLOTS(M) S16(M)
#else
  #define FOR_SLOTS(M) S8(M)
#endif

typedef struct { long v[7 * SLOTS]; } adam_meta_t;
typedef struct { long v[4 * SLOTS]; } sgd_meta_t;
typedef struct { long v[5 * SLOTS]; } map_meta_t;
typedef struct { float v[5 * SLOTS]; } map_numbers_t;
typedef struct { long v[2 * SLOTS]; } count_meta_t;

// LR_TENSOR: the learning rate is read from lr_t[lr_offset] (a device tensor a scheduler may update between
// steps, or between replays of a graph) instead of the lr_value argument.
#ifdef LR_TENSOR
  #define LR_PARAMS , __global const float *lr_t, const long lr_offset
  #define LR_VALUE (lr_t[lr_offset])
#else
  #define LR_PARAMS
  #define LR_VALUE lr_value
#endif
#ifdef GRAD_SCALE
  #define SCALE_PARAMS , __global const float *scale_t, const long scale_offset
  #define UNSCALE(grad, i) { grad = grad / scale_t[scale_offset]; g[i] = grad; }
#else
  #define SCALE_PARAMS
  #define UNSCALE(grad, i)
#endif
#ifdef FOUND_INF
  #define INF_PARAMS , __global const float *inf_t, const long inf_offset
  #define INF_FOUND (inf_t[inf_offset] == 1.0f)   // (the same for every work-item)
#else
  #define INF_PARAMS
  #define INF_FOUND false
#endif
#define STEP_PARAMS LR_PARAMS SCALE_PARAMS INF_PARAMS

__kernel void adam_step(const float lr_value, const float beta1, const float beta2, const float weight_decay,
                        const float eps, const adam_meta_t m FOR_SLOTS(ADAM_SLOT) STEP_PARAMS)
{
  const int slot = (int)get_global_id(1);
  __global float *p = 0, *mo = 0, *ve = 0, *vmax = 0;
  GRAD_T *g = 0;
  __global const float *st = 0;
  switch (slot) { FOR_SLOTS(ADAM_PICK) }
  // n = 0 (an unused slot, or FOUND_INF set) updates nothing. No work-item returns before the barrier
  // of GROUP_CORRECTIONS (the same for the whole work-group, which lies in one slot; PyPI's PoCL 3.0
  // corrupted the heap when a kernel could return before a barrier, even when none did).
  const long n = INF_FOUND ? 0 : m.v[7 * slot];
#ifdef GROUP_CORRECTIONS
  __local float corrections[2];   // one pow() pair per work-group rather than per work-item
  if (get_local_id(0) == 0 && n != 0) {
    const float step = AT(__global const float, st, m.v[7 * slot + 6])[0];
    corrections[0] = LR_VALUE / (1.0f - pow(beta1, step));
    corrections[1] = sqrt(1.0f - pow(beta2, step));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
#endif
  if (n == 0) return;
  const float lr = LR_VALUE;
  p = AT(__global float, p, m.v[7 * slot + 1]);
  g = AT(GRAD_T, g, m.v[7 * slot + 2]);
  mo = AT(__global float, mo, m.v[7 * slot + 3]);
  ve = AT(__global float, ve, m.v[7 * slot + 4]);
#ifdef AMSGRAD
  vmax = AT(__global float, vmax, m.v[7 * slot + 5]);
#endif
#ifdef GROUP_CORRECTIONS
  const float step_size = corrections[0];
  const float bc2_sqrt = corrections[1];
#else
  const float step = AT(__global const float, st, m.v[7 * slot + 6])[0];
  const float step_size = lr / (1.0f - pow(beta1, step));
  const float bc2_sqrt = sqrt(1.0f - pow(beta2, step));
#endif
  for (long i = get_global_id(0); i < n; i += get_global_size(0)) {
    float grad = g[i];
    UNSCALE(grad, i)
    float param = p[i];
#ifdef MAXIMIZE
    grad = -grad;
#endif
    if (weight_decay != 0.0f) {
#ifdef ADAMW
      param -= lr * weight_decay * param;
#else
      grad += weight_decay * param;
#endif
    }
    const float avg = beta1 * mo[i] + (1.0f - beta1) * grad;
    const float avg_sq = beta2 * ve[i] + (1.0f - beta2) * grad * grad;
    mo[i] = avg;
    ve[i] = avg_sq;
#ifdef AMSGRAD
    const float peak = fmax(vmax[i], avg_sq);
    vmax[i] = peak;
    const float denom = sqrt(peak) / bc2_sqrt + eps;
#else
    const float denom = sqrt(avg_sq) / bc2_sqrt + eps;
#endif
    p[i] = param - step_size * avg / denom;
  }
}

__kernel void sgd_step(const float lr_value, const float weight_decay, const float momentum, const float dampening,
                       const int first_step, const sgd_meta_t m FOR_SLOTS(SGD_SLOT) STEP_PARAMS)
{
  if (INF_FOUND) return;
  const float lr = LR_VALUE;
  const int slot = (int)get_global_id(1);
  __global float *p = 0, *buf = 0;
  GRAD_T *g = 0;
  switch (slot) { FOR_SLOTS(SGD_PICK) }
  const long n = m.v[4 * slot];
  if (n == 0) return;
  p = AT(__global float, p, m.v[4 * slot + 1]);
  g = AT(GRAD_T, g, m.v[4 * slot + 2]);
#ifdef MOMENTUM
  buf = AT(__global float, buf, m.v[4 * slot + 3]);
#endif
  for (long i = get_global_id(0); i < n; i += get_global_size(0)) {
    float grad = g[i];
    UNSCALE(grad, i)
#ifdef MAXIMIZE
    grad = -grad;
#endif
    if (weight_decay != 0.0f) grad += weight_decay * p[i];
#ifdef MOMENTUM
    const float b = first_step ? grad : momentum * buf[i] + (1.0f - dampening) * grad;
    buf[i] = b;
  #ifdef NESTEROV
    grad += momentum * b;
  #else
    grad = b;
  #endif
#endif
    p[i] -= lr * grad;
  }
}

#ifdef MAP_EXPR
__kernel void foreach_map(const map_numbers_t s, const map_meta_t m FOR_SLOTS(MAP_SLOT))
{
  const int slot = (int)get_global_id(1);
  __global float *o = 0;
  __global const float *ta = 0, *tb = 0, *tc = 0;
  switch (slot) { FOR_SLOTS(MAP_PICK) }
  const long n = m.v[5 * slot];
  o = AT(__global float, o, m.v[5 * slot + 1]);
  ta = AT(__global const float, ta, m.v[5 * slot + 2]);
  tb = AT(__global const float, tb, m.v[5 * slot + 3]);
  tc = AT(__global const float, tc, m.v[5 * slot + 4]);
  const float s0 = s.v[5 * slot + 3], s1 = s.v[5 * slot + 4];
  for (long i = get_global_id(0); i < n; i += get_global_size(0)) {
  #ifdef A_SCALAR
    const float a = s.v[5 * slot];
  #elif defined(A_ONE)
    const float a = ta[0];
  #else
    const float a = ta[i];
  #endif
  #ifdef B_SCALAR
    const float b = s.v[5 * slot + 1];
  #elif defined(B_ONE)
    const float b = tb[0];
  #else
    const float b = tb[i];
  #endif
  #ifdef C_SCALAR
    const float c = s.v[5 * slot + 2];
  #elif defined(C_ONE)
    const float c = tc[0];
  #else
    const float c = tc[i];
  #endif
    o[i] = MAP_EXPR;
  }
}
#endif

#ifdef NCOL
// COLS(X, k): X(0, k) .. X(NCOL - 1, k), for 1 to 8 columns
#define CR_1(X, k) X(0, k)
#define CR_2(X, k) CR_1(X, k) X(1, k)
#define CR_3(X, k) CR_2(X, k) X(2, k)
#define CR_4(X, k) CR_3(X, k) X(3, k)
#define CR_5(X, k) CR_4(X, k) X(4, k)
#define CR_6(X, k) CR_5(X, k) X(5, k)
#define CR_7(X, k) CR_6(X, k) X(6, k)
#define CR_8(X, k) CR_7(X, k) X(7, k)
#define COLS__(n, X, k) CR_##n(X, k)
#define COLS_(n, X, k) COLS__(n, X, k)
#define COLS(X, k) COLS_(NCOL, X, k)
#ifdef ADDRESSES
  #define CHAIN_SLOT(k)
  #define CHAIN_PICK(k)
#else
  #define CHAIN_ARG(j, k) , __global float *c##j##_##k
  #define CHAIN_SLOT(k) COLS(CHAIN_ARG, k)
  #define CHAIN_PICK_COLUMN(j, k) p##j = c##j##_##k;
  #define CHAIN_PICK(k) case k: COLS(CHAIN_PICK_COLUMN, k) break;
#endif
#define CHAIN_DECLARE(j, k) __global float *p##j = 0;
#define CHAIN_OFFSET(j, k) p##j = AT(__global float, p##j, m.v[(NCOL + 1) * slot + 1 + j]);
#define LD(j, index) const float v##j = p##j[index];
#define LD1(j) const float v##j = n > 0 ? p##j[0] : 0.0f;   // (a slot of empty tensors may have no buffers)
#define SHARE(k, value) shared[k] = value;
#define UNSHARE(k, value) const float value = shared[k];
#define SV(k) const float t##k = (float)(STEP##k);
#define ST(j, value) p##j[i] = value;
typedef struct { long v[(NCOL + 1) * SLOTS]; } chain_meta_t;
#ifdef NCONST
  // the steps' numbers passed by value (an eager run's: they change between calls, the kernel does not)
  typedef struct { float v[NCONST]; } chain_consts_t;
  #define CONSTS_ARG const chain_consts_t cs,
  #define K(q) cs.v[q]
#else
  #define CONSTS_ARG
#endif

__kernel void foreach_chain(CONSTS_ARG const chain_meta_t m FOR_SLOTS(CHAIN_SLOT))
{
  const int slot = (int)get_global_id(1);
  COLS(CHAIN_DECLARE, 0)
  switch (slot) { FOR_SLOTS(CHAIN_PICK) }
  const long n = m.v[(NCOL + 1) * slot];
  COLS(CHAIN_OFFSET, 0)
  __local float shared[NUNIFORM];
  if (get_local_id(0) == 0) {
    BEFORE
    SHARES
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  UNSHARES
  for (long i = get_global_id(0); i < n; i += get_global_size(0)) {
    LOADS
    STEPS
    STORES
  }
}
#endif

__kernel void foreach_add_long(const long value, const count_meta_t m FOR_SLOTS(COUNT_SLOT))
{
  const int slot = (int)get_global_id(1);
  __global long *q = 0;
  switch (slot) { FOR_SLOTS(COUNT_PICK) }
  const long n = m.v[2 * slot];
  q = AT(__global long, q, m.v[2 * slot + 1]);
  for (long i = get_global_id(0); i < n; i += get_global_size(0)) q[i] += value;
}
