// fused.cl — a chain of elementwise ops in one pass: out[i] = the chain's last value at element i.
//
// The chain is a list of steps t0, t1, ... (at most 16), each one op of the pointwise family
// (pointwise.py's EXPRESSIONS) applied to the loaded inputs v0.. (at most 8), earlier steps and
// constants; the host passes each step's op as a function-like macro Fk(a,b,c,s0,s1,s2,s3) and its
// operands as STEPk = Fk(...), so the values between the steps stay in registers and never reach
// memory. Every input is float32, read through its own strides (0 along broadcast dims) over the
// NDIM-dimensional iteration space (row-major); the output is float32 with its own strides. Sizes,
// strides and element offsets travel in one by-value struct (meta), as in pointwise.cl, so one binary
// serves every shape of the same rank.
//
// meta layout (IDX values): [0] element count, [1 .. NDIM] sizes, then NDIM strides for each
// operand (out, in0 .. in{NIN-1} in that order), then one element offset per operand.
//
// Variants (-D options):
//   NIN       inputs, 1..8                 NSTEPS  steps, 1..16
//   NDIM      rank of the iteration space  IDX     index type, int or long
//   Fk, STEPk step k's op and its call     RESULT  the step written out (t{NSTEPS-1})

#ifndef NIN
  #define NIN 2          // inputs
#endif
#ifndef NDIM
  #define NDIM 1         // rank after merging dims
#endif
#ifndef IDX
  #define IDX int        // index type
#endif
#ifndef NSTEPS           // the smoke-test default: relu(v0 + v1)
  #define NSTEPS 2
  #define F0(a, b, c, s0, s1, s2, s3) ((a) + s0 * (b))
  #define STEP0 F0(v0, v1, 0, 1.0f, 0, 0, 0)
  #define F1(a, b, c, s0, s1, s2, s3) ((a) < 0 ? (TC)0 : (a))
  #define STEP1 F1(t0, 0, 0, 0, 0, 0, 0)
  #define RESULT t1
#endif

#define TC float         // what the pointwise expressions compute in
#define NOPS (NIN + 1)
#define META_LEN (1 + NDIM + NOPS * NDIM + NOPS)
typedef struct { IDX v[META_LEN]; } meta_t;
#define COUNT        m.v[0]
#define SIZE(d)      m.v[1 + (d)]
#define STRIDE(k, d) m.v[1 + NDIM + (k) * NDIM + (d)]
#define OFFSET(k)    m.v[1 + NDIM + NOPS * NDIM + (k)]

// input k: its pointer argument, its element offset o{k+1} (advanced per dim) and its value v{k}
#define INPUT_ARG(k) , __global const float *in##k
#define OFFSET_INIT(k) IDX o##k = OFFSET(k);
#define OFFSET_STEP(k) o##k += c * STRIDE(k, d);

__kernel void fused(__global float *out
#if NIN > 0
                    INPUT_ARG(0)
#endif
#if NIN > 1
                    INPUT_ARG(1)
#endif
#if NIN > 2
                    INPUT_ARG(2)
#endif
#if NIN > 3
                    INPUT_ARG(3)
#endif
#if NIN > 4
                    INPUT_ARG(4)
#endif
#if NIN > 5
                    INPUT_ARG(5)
#endif
#if NIN > 6
                    INPUT_ARG(6)
#endif
#if NIN > 7
                    INPUT_ARG(7)
#endif
                    , const meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= COUNT) return;
  OFFSET_INIT(0)
#if NIN > 0
  OFFSET_INIT(1)
#endif
#if NIN > 1
  OFFSET_INIT(2)
#endif
#if NIN > 2
  OFFSET_INIT(3)
#endif
#if NIN > 3
  OFFSET_INIT(4)
#endif
#if NIN > 4
  OFFSET_INIT(5)
#endif
#if NIN > 5
  OFFSET_INIT(6)
#endif
#if NIN > 6
  OFFSET_INIT(7)
#endif
#if NIN > 7
  OFFSET_INIT(8)
#endif
  IDX rest = i;
  for (int d = NDIM - 1; d >= 0; --d) {
    const IDX c = (d == 0) ? rest : rest % SIZE(d);
    rest = (d == 0) ? 0 : rest / SIZE(d);
    OFFSET_STEP(0)
#if NIN > 0
    OFFSET_STEP(1)
#endif
#if NIN > 1
    OFFSET_STEP(2)
#endif
#if NIN > 2
    OFFSET_STEP(3)
#endif
#if NIN > 3
    OFFSET_STEP(4)
#endif
#if NIN > 4
    OFFSET_STEP(5)
#endif
#if NIN > 5
    OFFSET_STEP(6)
#endif
#if NIN > 6
    OFFSET_STEP(7)
#endif
#if NIN > 7
    OFFSET_STEP(8)
#endif
  }
#if NIN > 0
  const TC v0 = in0[o1];
#endif
#if NIN > 1
  const TC v1 = in1[o2];
#endif
#if NIN > 2
  const TC v2 = in2[o3];
#endif
#if NIN > 3
  const TC v3 = in3[o4];
#endif
#if NIN > 4
  const TC v4 = in4[o5];
#endif
#if NIN > 5
  const TC v5 = in5[o6];
#endif
#if NIN > 6
  const TC v6 = in6[o7];
#endif
#if NIN > 7
  const TC v7 = in7[o8];
#endif
  // the steps, in order (each reads inputs and earlier steps only)
#if NSTEPS > 0
  const TC t0 = (TC)(STEP0);
#endif
#if NSTEPS > 1
  const TC t1 = (TC)(STEP1);
#endif
#if NSTEPS > 2
  const TC t2 = (TC)(STEP2);
#endif
#if NSTEPS > 3
  const TC t3 = (TC)(STEP3);
#endif
#if NSTEPS > 4
  const TC t4 = (TC)(STEP4);
#endif
#if NSTEPS > 5
  const TC t5 = (TC)(STEP5);
#endif
#if NSTEPS > 6
  const TC t6 = (TC)(STEP6);
#endif
#if NSTEPS > 7
  const TC t7 = (TC)(STEP7);
#endif
#if NSTEPS > 8
  const TC t8 = (TC)(STEP8);
#endif
#if NSTEPS > 9
  const TC t9 = (TC)(STEP9);
#endif
#if NSTEPS > 10
  const TC t10 = (TC)(STEP10);
#endif
#if NSTEPS > 11
  const TC t11 = (TC)(STEP11);
#endif
#if NSTEPS > 12
  const TC t12 = (TC)(STEP12);
#endif
#if NSTEPS > 13
  const TC t13 = (TC)(STEP13);
#endif
#if NSTEPS > 14
  const TC t14 = (TC)(STEP14);
#endif
#if NSTEPS > 15
  const TC t15 = (TC)(STEP15);
#endif
  out[o0] = RESULT;
}
