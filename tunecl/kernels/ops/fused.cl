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
#include "elementwise_meta.cl"  // meta_t, COUNT, SIZE, STRIDE, OFFSET, NOPS

// REPEAT(n, X): X(0, 1) X(1, 2) ... X(n - 1, n), each k with k + 1, for a number n from 0 to 16 (as the
// host passes NIN and NSTEPS)
#define REPEAT_0(X)
#define REPEAT_1(X) X(0, 1)
#define REPEAT_2(X) REPEAT_1(X) X(1, 2)
#define REPEAT_3(X) REPEAT_2(X) X(2, 3)
#define REPEAT_4(X) REPEAT_3(X) X(3, 4)
#define REPEAT_5(X) REPEAT_4(X) X(4, 5)
#define REPEAT_6(X) REPEAT_5(X) X(5, 6)
#define REPEAT_7(X) REPEAT_6(X) X(6, 7)
#define REPEAT_8(X) REPEAT_7(X) X(7, 8)
#define REPEAT_9(X) REPEAT_8(X) X(8, 9)
#define REPEAT_10(X) REPEAT_9(X) X(9, 10)
#define REPEAT_11(X) REPEAT_10(X) X(10, 11)
#define REPEAT_12(X) REPEAT_11(X) X(11, 12)
#define REPEAT_13(X) REPEAT_12(X) X(12, 13)
#define REPEAT_14(X) REPEAT_13(X) X(13, 14)
#define REPEAT_15(X) REPEAT_14(X) X(14, 15)
#define REPEAT_16(X) REPEAT_15(X) X(15, 16)
#define REPEAT_(n, X) REPEAT_##n(X)
#define REPEAT(n, X) REPEAT_(n, X)

// input k: its pointer argument, its element offset o{k+1} (advanced per dim) and its value v{k}; step
// k's value t{k}
#define OFFSET_INIT(k) IDX o##k = OFFSET(k);
#define OFFSET_STEP(k) o##k += c * STRIDE(k, d);
#define INPUT_ARG(k, k1) , __global const float *in##k
#define INPUT_OFFSET_INIT(k, k1) OFFSET_INIT(k1)
#define INPUT_OFFSET_STEP(k, k1) OFFSET_STEP(k1)
#define INPUT_VALUE(k, k1) const TC v##k = in##k[o##k1];
#define STEP_VALUE(k, k1) const TC t##k = (TC)(STEP##k);

__kernel void fused(__global float *out
                    REPEAT(NIN, INPUT_ARG)
                    , const meta_t m)
{
  const IDX i = (IDX)get_global_id(0);
  if (i >= COUNT) return;
  OFFSET_INIT(0)
  REPEAT(NIN, INPUT_OFFSET_INIT)
  IDX rest = i;
  for (int d = NDIM - 1; d >= 0; --d) {
    const IDX c = (d == 0) ? rest : rest % SIZE(d);
    rest = (d == 0) ? 0 : rest / SIZE(d);
    OFFSET_STEP(0)
    REPEAT(NIN, INPUT_OFFSET_STEP)
  }
  REPEAT(NIN, INPUT_VALUE)
  // the steps, in order (each reads inputs and earlier steps only)
  REPEAT(NSTEPS, STEP_VALUE)
  out[o0] = RESULT;
}
