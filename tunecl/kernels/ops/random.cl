// random.cl — counter-based random numbers on the device (Philox4x32-10, Salmon et al., SC'11): dropout's
// masks and bernoulli_(p). Element i of a draw is the first of Philox's four outputs for counter base + i.
//
// In a captured graph (tunecl/backend/graphs.py) the key and a 64-bit counter live in a device buffer, so
// every replay draws new numbers without the host; state (uint[4]): key0, key1, counter low, counter
// high, and `advance` moves the base past a draw's n elements. Eager draws pass a fresh key (drawn from
// torch's CPU generator) by value and count from 0.
//
// Kernels:
//   bernoulli_f32        out[i] = (u_i < p) ? 1 : 0 with u_i uniform in [0, 1) (24 bits), from the state
//   bernoulli_u8         the same into bytes (a bool mask)
//   bernoulli_keyed_f32  the same from the key k0, k1
//   bernoulli_keyed_u8   the same into bytes (a bool mask)
//   dropout_keyed_f32    eager dropout in one pass: mask[i] = (u_i < keep) as bernoulli_keyed_u8 draws it, and
//                        out[i] = x[i] * mask[i] * scale (the same arithmetic as the pointwise scale_mask)
//   advance              counter += n (one work-item)

#include "philox.cl"

// bernoulli_<suffix> (from the state) and bernoulli_keyed_<suffix> (from k0, k1) into elements of type T
#define BERNOULLI_KERNELS(suffix, T)                                                                      \
__kernel void bernoulli_##suffix(__global T *out, const long offset, const long n, const float p,        \
                                 __global const uint *state)                                             \
{                                                                                                        \
  const long i = get_global_id(0);                                                                       \
  if (i >= n) return;                                                                                    \
  const ulong base = ((ulong)state[3] << 32) | state[2];                                                 \
  out[offset + i] = (T)(uniform24(base + (ulong)i, state[0], state[1]) < p);                             \
}                                                                                                        \
                                                                                                         \
__kernel void bernoulli_keyed_##suffix(__global T *out, const long offset, const long n, const float p,  \
                                       const uint k0, const uint k1)                                     \
{                                                                                                        \
  const long i = get_global_id(0);                                                                       \
  if (i >= n) return;                                                                                    \
  out[offset + i] = (T)(uniform24((ulong)i, k0, k1) < p);                                                \
}

BERNOULLI_KERNELS(f32, float)
BERNOULLI_KERNELS(u8, uchar)

__kernel void dropout_keyed_f32(__global float *out, const long out_offset, __global uchar *mask,
                                const long mask_offset, __global const float *x, const long x_offset, const long n,
                                const float keep, const float scale, const uint k0, const uint k1)
{
  const long i = get_global_id(0);
  if (i >= n) return;
  const uchar kept = uniform24((ulong)i, k0, k1) < keep;
  mask[mask_offset + i] = kept;
  out[out_offset + i] = x[x_offset + i] * (float)kept * scale;
}

__kernel void advance(__global uint *state, const long n)
{
  const ulong base = (((ulong)state[3] << 32) | state[2]) + (ulong)n;
  state[2] = (uint)base;
  state[3] = (uint)(base >> 32);
}
