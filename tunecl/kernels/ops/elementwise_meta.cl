// elementwise_meta.cl — the by-value struct of sizes, strides and offsets (meta, IDX values) that the
// elementwise kernels (pointwise.cl, fused.cl) take, so one binary serves every shape of a rank; included
// with #include "elementwise_meta.cl" after NIN, NDIM and IDX are defined. Layout: [0] the element count
// (COUNT), [1 .. NDIM] the sizes (SIZE(d)), then NDIM strides for each of the NOPS operands (STRIDE(k, d);
// operand 0 is the output, k = 1 .. NIN the inputs), then one element offset per operand (OFFSET(k)).
#ifndef ELEMENTWISE_META_CL
#define ELEMENTWISE_META_CL

#define NOPS (NIN + 1)
#define META_LEN (1 + NDIM + NOPS * NDIM + NOPS)
typedef struct { IDX v[META_LEN]; } meta_t;
#define COUNT        m.v[0]
#define SIZE(d)      m.v[1 + (d)]
#define STRIDE(k, d) m.v[1 + NDIM + (k) * NDIM + (d)]
#define OFFSET(k)    m.v[1 + NDIM + NOPS * NDIM + (k)]

#endif
