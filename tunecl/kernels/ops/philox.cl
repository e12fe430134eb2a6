// philox.cl — Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of the device's random
// numbers: included by random.cl (dropout's masks, bernoulli_) and attention.cl (dropout inside the fused
// attention). A draw is the first of Philox's four outputs for a 64-bit counter under a 64-bit key, so
// element i of a draw (random.cl) and score (b*h, i, j) of an attention with dropout (attention.cl,
// counter (b*h*L + i)*S + j) are the same number under the same key.

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

uint philox_first(uint c0, uint c1, uint c2, uint c3, uint k0, uint k1)
{
  for (int round = 0; round < 10; ++round) {
    const uint hi0 = mul_hi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
    const uint hi1 = mul_hi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  return c0;
}

// uniform in [0, 1) from 24 bits of counter's draw under key k0, k1
float uniform24(const ulong counter, const uint k0, const uint k1)
{
  const uint bits = philox_first((uint)counter, (uint)(counter >> 32), 0u, 0u, k0, k1);
  return (float)(bits >> 8) * (1.0f / 16777216.0f);
}
