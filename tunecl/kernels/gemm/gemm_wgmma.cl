// gemm_wgmma.cl — gemm_wgmma_tf32 and gemm_wgmma_f16: C = alpha * op(A) * op(B) + beta * C on Hopper's
// warpgroup tensor-core instruction (wgmma.mma_async, PTX, sm_90a) with fp32 accumulation, row-major
// like torch: fp32 A, B, C with TF32 inputs (gemm_wgmma_tf32), or half A, B, C (WGMMA_F16 = 1).
//
// Layout: as gemm_mma.cl. A is M x K (lda >= K) or, with TRANS_A, K x M (lda >= M); B is K x N (ldb >= N)
// or, with TRANS_B, N x K (ldb >= K); C is M x N (ldc >= N); matrix b of a batch starts at buffer +
// offset + b * stride (a stride of 0 broadcasts). Any M, N, K >= 1: copies outside the matrices fill
// zeros, stores outside are skipped. beta == 0 never reads C.
//
// Numerics: gemm_wgmma_tf32 copies the fp32 bits of A and B into local memory unchanged; the tensor
// cores use their TF32 part (the 13 low mantissa bits are ignored: at worst truncation, which the
// emulation below reproduces) and sum products in fp32. gemm_wgmma_f16 copies halves; products of halves
// are exact in fp32; alpha * sum + beta * C is computed in fp32 and rounded once to half (to nearest
// even).
//
// Decomposition. A work-group is WARPGROUPS warpgroups of 128 threads (4 consecutive warps) and computes
// one MWG x NWG tile of C; warpgroup w owns rows w * WG_ROWS .. + WG_ROWS (WG_ROWS = MWG / WARPGROUPS,
// MI = WG_ROWS / 64 wgmma tiles of 64 x NWG each). K is walked in KWG-deep steps through STAGES
// local-memory buffers filled by cp.async (the copies of the next STAGES - 1 steps are in flight while
// one is multiplied). Per step each warpgroup issues MI * KWG / KI wgmma.mma_async (KI = 8 for TF32,
// 16 for f16) reading A and B straight from local memory through matrix descriptors, then commits
// them; they run while the threads go on to wait for the next step's copies.
// Grid: dimension 0 = N tiles x WGS, 1 = M tiles, 2 = batch; GM orders work-groups in bands (L2).
//
// Local-memory layout (PTX ISA "Asynchronous Warpgroup Level Matrix Shared Memory Layout"). A tile of
// R rows (M for A, N for B) by KWG is stored either
//   K-major (k contiguous; always for TF32, whose wgmma has no transpose): core matrices of 8 rows x
//   16 bytes. SWIZZLE = 0: core matrix (row / 8, 16-byte chunk of k) at ((row / 8) * KCHUNKS + chunk)
//   * 128, row % 8 at 16 bytes each; descriptor LBO = 128 (next chunk in k), SBO = KCHUNKS * 128 (next
//   8 rows). SWIZZLE = S (32, 64, 128 bytes): columns of S bytes of k (atoms of 8 rows x S bytes),
//   column j at j * R * S, row r at r * S inside it, and the 16-byte chunks of every row permuted by
//   the swizzle: byte address bits [4, 4 + log2(S / 16)) ^= bits [7, ...) (CUTLASS's Swizzle<b, 4, 3>);
//   descriptor SBO = 8 * S, LBO unused (1).
//   MN-major (m or n contiguous; gemm_wgmma_f16 only, for an operand that is MN-contiguous in global
//   memory, with wgmma's transpose flag): core matrices of 8 k x 16 bytes of m/n. SWIZZLE = 0: core
//   matrix (16-byte chunk of m/n, k / 8) at chunk * KWG * 16 + (k / 8) * 128; LBO = 128 (next 8 k),
//   SBO = KWG * 16 (next 8 m/n). SWIZZLE = S: columns of S bytes of m/n, column j at j * KWG * S, k at
//   k * S inside it, swizzled as above; LBO = KWG * S (next column), SBO = 8 * S (next 8 k).
// Every tile starts at a multiple of 8 * SWIZZLE bytes of the local array, which is 1024-aligned: the
// swizzle is a function of the shared-memory address, so the phases agree.
// A descriptor (PTX ISA "Matrix Descriptor Format") is the 64-bit value: start address >> 4 in bits
// 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset 0 (bits 49-51), swizzle mode in 62-63
// (0 none, 1 128B, 2 64B, 3 32B). Within a swizzle column the descriptor of k step s starts s * 32 bytes
// further (the hardware swizzles the addresses it computes); the start address is the 32-bit
// shared-window address of the __local array (the integer value of a __local pointer, as cp.async
// takes it) plus the offset.
//
// Accumulator fragment of wgmma .m64nNk* with .f32 (PTX ISA, "Matrix fragments for wgmma ... D"):
// thread t of the warpgroup (warp w = t / 32, lane l = t % 32) holds N / 2 floats; d[i] is row
// 16 w + l / 4 + 8 ((i % 4) / 2), column 8 (i / 4) + 2 (l % 4) + i % 2 — the mma.m16n8 C fragment
// repeated over N / 8 column blocks, one 16-row band per warp.
//
// Ordering per K step (t): wait for this thread's copies of step t (cp.async.wait_group), make them
// visible to the tensor cores (fence.proxy.async), wait for this warpgroup's wgmma of step t - 1
// (wgmma.wait_group 0), barrier (everyone's copies of t are in, everyone's wgmma of t - 1 are done,
// so buffer (t - 1) % STAGES is free); wgmma.fence, issue step t's wgmma, commit; start the copies of
// step t + STAGES - 1 into buffer (t - 1) % STAGES.
// With INFLIGHT 1 the wgmma of step t - 1 may still run while step t's is issued: wait for this thread's
// copies of step t, fence.proxy.async, wgmma.wait_group 1 (step t - 2 done), barrier (everyone's copies
// of t are in, everyone's wgmma of t - 2 are done, so buffer (t - 2) % STAGES is free); wgmma.fence,
// issue step t's wgmma, commit; start the copies of step t + STAGES - 2 into buffer (t - 2) % STAGES.
// The tensor cores then never wait for the barrier; the copies run one step less ahead (STAGES >= 3).
//
// Variants (named #if branches; the host passes -DNAME=VALUE):
//   WGMMA_F16  1: half A, B, C (gemm_wgmma_f16); 0: fp32 with TF32 inputs (gemm_wgmma_tf32).
//   TRANS_A/B  problem layout (from the problem). K-contiguous operands are copied in vectors of
//              VWA/VWB elements; MN-contiguous ones in vectors along M/N into the MN-major layout
//              (f16) or, for TF32, element by element (4-byte cp.async) into the K-major layout.
//   SWIZZLE    0, 32, 64, 128: the layout above.
//   INFLIGHT   0, 1: wgmma groups left running across a K step (the ordering above; 1 needs STAGES >= 3).
//   CSCALAR    host-internal: 1 = scalar C accesses (C offset / ldc / stride not even).
//   WGMMA_STUB host-internal, for tests on devices without Hopper tensor cores: the PTX (cp.async,
//              fences, wgmma) is replaced by plain OpenCL C; the emulated wgmma decodes the very
//              descriptors the kernel built (start, LBO, SBO, swizzle mode) by the ISA's canonical
//              layouts and reads local memory through them, so the tests check the layout, the
//              descriptor encoding, the swizzle and the fragment mapping against numpy.

// ---- problem layout (from the problem, not tuned) -----------------------------------------------
#include "gemm_arguments.cl"  // TRANS_A, TRANS_B, GEMM_ARGUMENTS, GEMM_BATCH_OFFSETS
#ifndef WGMMA_F16
  #define WGMMA_F16 0 // 1 = half A, B, C (gemm_wgmma_f16); 0 = fp32 with TF32 inputs
#endif

// ---- tunables ------------------------------------------------------------------------------------
#ifndef MWG
  #define MWG 128     // tile rows per work-group: 64, 128, 256 (a multiple of 64 * WARPGROUPS)
#endif
#ifndef NWG
  #define NWG 128     // tile columns per work-group = the wgmma N: 32, 64, 128, 256
#endif
#ifndef KWG
  #define KWG 16      // depth of one K step in elements: TF32 8 .. 64, f16 16 .. 128
#endif
#ifndef WARPGROUPS
  #define WARPGROUPS 2  // warpgroups per work-group (along M): 1, 2
#endif
#ifndef STAGES
  #define STAGES 3    // local-memory buffers: 2, 3, 4
#endif
#ifndef INFLIGHT
  #define INFLIGHT 0  // wgmma groups left running across a K step: 0, 1 (needs STAGES >= 3)
#endif
#if INFLIGHT && STAGES < 3
  #error "INFLIGHT 1 needs STAGES >= 3"
#endif
// K steps the copies run ahead of the wgmma: the prologue fills this many buffers
#define AHEAD (STAGES - 1 - INFLIGHT)
#ifndef SWIZZLE
  #define SWIZZLE 64  // bytes of the swizzle pattern: 0 (none), 32, 64, 128
#endif
#ifndef VWA
  #define VWA 4       // elements per copy of A along its contiguous dimension: 1, 2, 4 (f16: 8)
#endif
#ifndef VWB
  #define VWB 4       // elements per copy of B along its contiguous dimension
#endif
#ifndef GM
  #define GM 1        // work-group order: bands of GM tile rows along M (1 = plain row-by-row)
#endif
#include "gemm_common.cl"  // gemm_tile_of_group()
#ifndef CSCALAR
  #define CSCALAR 0   // host-internal: 1 = scalar C accesses
#endif
#ifndef WGMMA_STUB
  #define WGMMA_STUB 0  // host-internal: 1 = plain OpenCL C instead of PTX (tests without Hopper)
#endif

// ---- derived (never passed from the host) --------------------------------------------------------
#define WGS (128 * WARPGROUPS)         // threads per work-group
#define WG_ROWS (MWG / WARPGROUPS)     // rows of C per warpgroup
#define MI (WG_ROWS / 64)              // wgmma tiles (64 rows each) per warpgroup
#define NACC (NWG / 2)                 // accumulators per thread and wgmma tile
#if WGMMA_F16
  #define ELT 2                        // bytes per element of A and B
  #define KI 16                        // depth of one wgmma
  #define GTYPE ushort
  #define CTYPE half
  #if TRANS_A
    #define A_MN 1                     // A stored MN-major in local memory (wgmma's transpose flag;
  #else                                // literal 0 / 1: the flags are immediates of the PTX text)
    #define A_MN 0
  #endif
  #if TRANS_B
    #define B_MN 0
  #else
    #define B_MN 1
  #endif
#else
  #define ELT 4
  #define KI 8
  #define GTYPE float
  #define CTYPE float
  #define A_MN 0
  #define B_MN 0
#endif
#define KSTEPS (KWG / KI)              // wgmma per K step and wgmma tile
#define KBYTES (KWG * ELT)             // bytes of k per row of a K-major tile
#define A_TILE_BYTES (MWG * KBYTES)
#define B_TILE_BYTES (NWG * KBYTES)
#define STAGE_BYTES (A_TILE_BYTES + B_TILE_BYTES)
#define SMEM_BYTES (STAGES * STAGE_BYTES)
#if SWIZZLE == 128
  #define SW_MODE 1
#elif SWIZZLE == 64
  #define SW_MODE 2
#elif SWIZZLE == 32
  #define SW_MODE 3
#else
  #define SW_MODE 0
#endif
// The global tiles: rows x cols with cols contiguous (as gemm_mma.cl).
#if TRANS_A
  #define A_ROWS KWG
  #define A_COLS MWG
#else
  #define A_ROWS MWG
  #define A_COLS KWG
#endif
#if TRANS_B
  #define B_ROWS NWG
  #define B_COLS KWG
#else
  #define B_ROWS KWG
  #define B_COLS NWG
#endif
#define A_VECS_PER_ROW (A_COLS / VWA)
#define B_VECS_PER_ROW (B_COLS / VWB)
#define A_LOADS (A_ROWS * A_VECS_PER_ROW / WGS)   // vectors of the A tile per thread
#define B_LOADS (B_ROWS * B_VECS_PER_ROW / WGS)
#define STR_(x) #x
#define STR(x) STR_(x)

// ---- the local-memory layout (banner) --------------------------------------------------------------

// The swizzle of SWIZZLE-byte patterns: chunk bits [4, 4 + log2(SWIZZLE / 16)) ^= address bits [7, ...).
uint Swizzle(const uint offset) {
  #if SWIZZLE
    return offset ^ (((offset >> 7) & (SWIZZLE / 16 - 1)) << 4);
  #else
    return offset;
  #endif
}

// Byte offset of element (mn, k) in a K-major tile of `rows` rows.
uint KMajorOffset(const int mn, const int k, const int rows) {
  const uint kb = k * ELT;
  #if SWIZZLE
    return Swizzle((kb / SWIZZLE) * rows * SWIZZLE + mn * SWIZZLE + kb % SWIZZLE);
  #else
    return ((mn / 8) * (KBYTES / 16) + kb / 16) * 128 + (mn % 8) * 16 + kb % 16;
  #endif
}

// Byte offset of element (mn, k) in an MN-major tile (KWG rows of k).
uint MnMajorOffset(const int mn, const int k) {
  const uint mb = mn * ELT;
  #if SWIZZLE
    return Swizzle((mb / SWIZZLE) * KWG * SWIZZLE + k * SWIZZLE + mb % SWIZZLE);
  #else
    return (mb / 16) * KWG * 16 + (k / 8) * 128 + (k % 8) * 16 + mb % 16;
  #endif
}

#define A_OFFSET(m, k) (A_MN ? MnMajorOffset(m, k) : KMajorOffset(m, k, MWG))
#define B_OFFSET(n, k) (B_MN ? MnMajorOffset(n, k) : KMajorOffset(n, k, NWG))

// The descriptor of the 64 (A) or NWG (B) rows from row r0 at k step k0 of a tile at shared address
// `tile`; (r0, k0) are multiples of 64 and KI, where the swizzle leaves the offset unchanged.
ulong Descriptor(const uint tile, const int r0, const int k0, const int rows, const int mn_major) {
  uint start, lbo, sbo;
  if (mn_major) {
    start = tile + MnMajorOffset(r0, k0);
    lbo = SWIZZLE ? KWG * SWIZZLE : 128;
    sbo = SWIZZLE ? 8 * SWIZZLE : KWG * 16;
  } else {
    start = tile + KMajorOffset(r0, k0, rows);
    lbo = SWIZZLE ? 16 : 128;
    sbo = SWIZZLE ? 8 * SWIZZLE : (KBYTES / 16) * 128;
  }
  return (ulong)((start >> 4) & 0x3FFF) | ((ulong)((lbo >> 4) & 0x3FFF) << 16)
         | ((ulong)((sbo >> 4) & 0x3FFF) << 32) | ((ulong)SW_MODE << 62);
}

// ---- the warpgroup MMA ---------------------------------------------------------------------------------

#if WGMMA_STUB == 0
// ARCH_ASM goes before each sm_90a-only instruction: GemmWgmma builds with TUNECL_ARCH_PTX=1, which hides
// them from NVIDIA's OpenCL compiler (it assembles for sm_90) as PTX comments; runtime.build_program
// restores them and assembles the PTX for sm_90a.
#if TUNECL_ARCH_PTX
  #define ARCH_ASM "//@arch "
#else
  #define ARCH_ASM ""
#endif

// The accumulator operand lists of one wgmma: d[0] .. d[NACC - 1] as "+f".
#define D8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                 "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define D16(d, i) D8(d, i), D8(d, i + 8)
#define D32(d, i) D16(d, i), D16(d, i + 16)
#define D64(d, i) D32(d, i), D32(d, i + 32)
#define D128(d, i) D64(d, i), D64(d, i + 64)
#if NACC == 16
  #define WGMMA_D_LIST \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
  #define WGMMA_TAIL "}, %16, %17, p, 1, 1"
  #define WGMMA_PRED "setp.ne.b32 p, %18, 0;\n"
  #define WGMMA_OUTS(d) D16(d, 0)
#elif NACC == 32
  #define WGMMA_D_LIST \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
  #define WGMMA_TAIL "}, %32, %33, p, 1, 1"
  #define WGMMA_PRED "setp.ne.b32 p, %34, 0;\n"
  #define WGMMA_OUTS(d) D32(d, 0)
#elif NACC == 64
  #define WGMMA_D_LIST \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
  #define WGMMA_TAIL "}, %64, %65, p, 1, 1"
  #define WGMMA_PRED "setp.ne.b32 p, %66, 0;\n"
  #define WGMMA_OUTS(d) D64(d, 0)
#elif NACC == 128
  #define WGMMA_D_LIST \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
  #define WGMMA_TAIL "}, %128, %129, p, 1, 1"
  #define WGMMA_PRED "setp.ne.b32 p, %130, 0;\n"
  #define WGMMA_OUTS(d) D128(d, 0)
#endif
#if WGMMA_F16
  #define WGMMA_OP ARCH_ASM "wgmma.mma_async.sync.aligned.m64n" STR(NWG) "k16.f32.f16.f16 {"
  #define WGMMA_FLAGS ", " STR(A_MN) ", " STR(B_MN) ";\n"
#else
  #define WGMMA_OP ARCH_ASM "wgmma.mma_async.sync.aligned.m64n" STR(NWG) "k8.f32.tf32.tf32 {"
  #define WGMMA_FLAGS ";\n"
#endif

// d += A * B for one 64 x NWG x KI tile, A and B from local memory through their descriptors; issued by
// all 128 threads of a warpgroup, completes asynchronously (WgmmaCommit / WgmmaWait).
void Wgmma(float d[NACC], const ulong desc_a, const ulong desc_b) {
  asm volatile("{\n.reg .pred p;\n" WGMMA_PRED WGMMA_OP WGMMA_D_LIST WGMMA_TAIL WGMMA_FLAGS "}\n"
               : WGMMA_OUTS(d)
               : "l"(desc_a), "l"(desc_b), "r"(1));
}

// Keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma (it does
// not know that wgmma.wait_group is what completes them): an empty asm that "writes" each of them.
void FenceAccumulators(float acc[MI][NACC]) {
  #pragma unroll
  for (int i = 0; i < MI; ++i) {
    #pragma unroll
    for (int j = 0; j < NACC; ++j) { asm volatile("" : "+f"(acc[i][j]) :: "memory"); }
  }
}

void WgmmaFence(void) { asm volatile(ARCH_ASM "wgmma.fence.sync.aligned;" ::: "memory"); }
void WgmmaCommit(void) { asm volatile(ARCH_ASM "wgmma.commit_group.sync.aligned;" ::: "memory"); }
void WgmmaWait(void) { asm volatile(ARCH_ASM "wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
void WgmmaWaitAllButOne(void) { asm volatile(ARCH_ASM "wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// cp.async writes are generic-proxy writes; the tensor cores read through the async proxy.
void ProxyFence(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
  #define WGMMA_PARAMS
  #define WGMMA_ARGS
#else
// The emulation: element (r, k) of a wgmma operand (A: r = row of the 64; B: r = column n) read
// through descriptor `desc` by the ISA's canonical layouts (in CUTLASS's notation, T = 16 / ELT):
//   K-major, no swizzle:  ((8, m), (T, 2)) : ((1T, SBO), (1, LBO))
//   K-major, S swizzle:   ((8, m), (T, 2)) : ((S/16 T, SBO), (1, T))
//   MN-major, no swizzle: ((T, 1, m), (8, k)) : ((1, T, SBO), (1T, LBO))
//   MN-major, S swizzle:  ((T, S/16, m), (8, k)) : ((1, T, LBO), (S/16 T, SBO))
// then the swizzle of the mode on the address. It decodes the bits, never the kernel's own layout
// helpers, so a layout and its descriptor must agree for the tests to pass.
float OperandElement(const __local uchar* smem, const ulong desc, const int r, const int k,
                     const int mn_major) {
  const uint start = (uint)(desc & 0x3FFF) << 4;
  const uint lbo = (uint)((desc >> 16) & 0x3FFF) << 4;
  const uint sbo = (uint)((desc >> 32) & 0x3FFF) << 4;
  const uint mode = (uint)(desc >> 62);
  const uint sw = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
  uint addr;
  if (!mn_major) {
    const uint kb = k * ELT;  // < 32: one wgmma reads 32 bytes of k per row
    addr = sw ? start + (r / 8) * sbo + (r % 8) * sw + kb
              : start + (r / 8) * sbo + (kb / 16) * lbo + (r % 8) * 16 + kb % 16;
  } else {
    const uint mb = r * ELT;
    addr = sw ? start + (mb / sw) * lbo + (k / 8) * sbo + (k % 8) * sw + mb % sw
              : start + (mb / 16) * sbo + (k / 8) * lbo + (k % 8) * 16 + mb % 16;
  }
  if (sw) { addr ^= ((addr >> 7) & (sw / 16 - 1)) << 4; }
  #if WGMMA_F16
    return vload_half(0, (const __local half*)(smem + addr));
  #else
    // TF32: the 13 low mantissa bits ignored (truncated: the larger of the two possible errors)
    return as_float(*((const __local uint*)(smem + addr)) & 0xFFFFE000u);
  #endif
}

// d += A * B, computed at once by each thread for its own fragment (banner).
void Wgmma(float d[NACC], const ulong desc_a, const ulong desc_b, const __local uchar* smem,
           const int wlane) {
  const int warp = wlane / 32, lane = wlane % 32;
  for (int i = 0; i < NACC; ++i) {
    const int row = 16 * warp + lane / 4 + 8 * ((i % 4) / 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    float sum = d[i];
    for (int k = 0; k < KI; ++k) {
      sum = fma(OperandElement(smem, desc_a, row, k, A_MN), OperandElement(smem, desc_b, col, k, B_MN),
                sum);
    }
    d[i] = sum;
  }
}
void FenceAccumulators(float acc[MI][NACC]) {}
void WgmmaFence(void) {}
void WgmmaCommit(void) {}
void WgmmaWait(void) {}
void WgmmaWaitAllButOne(void) {}
void ProxyFence(void) {}
  #define WGMMA_PARAMS , const __local uchar* smem, const int wlane
  #define WGMMA_ARGS , smem, wlane
#endif

// ---- global memory -> local memory (cp.async) ---------------------------------------------------------

#define CP_ASYNC_STUB WGMMA_STUB
#include "cp_async.cl"  // CpAsync, CpAsyncCommit, CpAsyncWait

// Copy `width` elements (1, 2, 4 or 8) of row `row` from column `col` to local byte offset `off`
// (shared address `addr`); elements outside rows x cols become zeros (cp.async's zero fill). A single
// half is copied synchronously (cp.async copies 4 bytes at least; the barrier orders it).
void AsyncCopy(__local uchar* smem, const uint addr, const uint off, const __global GTYPE* restrict src,
               const int row, const int col, const int ld, const int rows, const int cols,
               const int width) {
  const int inside = row < rows ? clamp(cols - col, 0, width) : 0;
  const __global GTYPE* from = inside ? src + row * ld + col : src;
  __local GTYPE* dst = (__local GTYPE*)(smem + off);
  #if WGMMA_STUB
    for (int e = 0; e < width; ++e) { dst[e] = e < inside ? from[e] : (GTYPE)0; }
  #else
    const int size = ELT * width;
    if (size >= 4) {
      CpAsync(addr + off, from, size, ELT * inside);
    } else {
      *dst = inside ? *from : (GTYPE)0;
    }
  #endif
}

// How a vector at row r, column c of the stored tile goes into the tile at byte offset `tile`: a row
// along K into a K-major tile, a row along M (N) into an MN-major one, or (TF32 along M / N) transposed
// into a K-major tile element by element.
#include "gemm_vector_loads.cl"  // A_STORED, B_STORED
#define COPY_K_MAJOR(X, x) AsyncCopy(smem, addr, tile + X##_OFFSET(r, c), x##gm, X##_STORED(r, c), VW##X);
#define COPY_MN_MAJOR(X, x) AsyncCopy(smem, addr, tile + X##_OFFSET(c, r), x##gm, X##_STORED(r, c), VW##X);
#define COPY_TRANSPOSED(X, x)                                                                       \
  _Pragma("unroll")                                                                               \
  for (int e = 0; e < VW##X; ++e) {                                                               \
    AsyncCopy(smem, addr, tile + X##_OFFSET(c + e, r), x##gm, X##_STORED(r, c + e), 1);           \
  }
#if TRANS_A && A_MN
  #define A_COPY COPY_MN_MAJOR
#elif TRANS_A
  #define A_COPY COPY_TRANSPOSED
#else
  #define A_COPY COPY_K_MAJOR
#endif
#if TRANS_B
  #define B_COPY COPY_K_MAJOR
#elif B_MN
  #define B_COPY COPY_MN_MAJOR
#else
  #define B_COPY COPY_TRANSPOSED
#endif

// GlobalToLocalA (B): start copying the A tile at (m0, k0) (the B tile at (k0, n0)) into the tile at
// byte offset `tile`: this thread's vectors v = tid + i * WGS (neighbouring threads, neighbouring
// vectors of a row), at row r and column c of the tile as stored.
#define GLOBAL_TO_LOCAL(X, x, mn, MN)                                                               \
  void GlobalToLocal##X(const __global GTYPE* restrict x##gm, __local uchar* smem, const uint addr, \
                        const uint tile, const int tid, const int mn##0, const int k0, const int MN, \
                        const int K, const int ld##x) {                                           \
    _Pragma("unroll")                                                                             \
    for (int i = 0; i < X##_LOADS; ++i) {                                                         \
      const int v = tid + i * WGS;                                                                \
      const int r = v / X##_VECS_PER_ROW;                                                         \
      const int c = (v % X##_VECS_PER_ROW) * VW##X;                                               \
      X##_COPY(X, x)                                                                              \
    }                                                                                             \
  }
GLOBAL_TO_LOCAL(A, a, m, M)
GLOBAL_TO_LOCAL(B, b, n, N)

// ---- registers -> global memory (C) ----------------------------------------------------------------

#define C_HALF WGMMA_F16  // C is half (rounded to nearest even on stores)
#include "gemm_c_pairs.cl"  // LOAD_C, STORE_C, LOAD_C2, STORE_C2, STORE_C_PAIR

// C = alpha * acc + beta * C for this thread's outputs inside the matrix (d[2j], d[2j + 1] are
// neighbours in a row); beta == 0 never reads C. m0: the warpgroup's first row.
void PrivateToGlobalC(float acc[MI][NACC], __global CTYPE* restrict cgm, const int m0, const int n0,
                      const int wlane, const int M, const int N, const int ldc, const float alpha,
                      const float beta) {
  const int warp = wlane / 32, lane = wlane % 32;
  #pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + mi * 64 + 16 * warp + lane / 4 + 8 * h;
      if (m < M) {
        __global CTYPE* crow = cgm + m * ldc;
        #pragma unroll
        for (int j = 0; j < NWG / 8; ++j) {
          const int n = n0 + 8 * j + 2 * (lane % 4);
          float r0 = alpha * acc[mi][4 * j + 2 * h];
          float r1 = alpha * acc[mi][4 * j + 2 * h + 1];
          STORE_C_PAIR(crow, n, r0, r1)
        }
      }
    }
  }
}

// ---- the kernel -------------------------------------------------------------------------------------

#if WGMMA_F16
__kernel void gemm_wgmma_f16(
#else
__kernel void gemm_wgmma_tf32(
#endif
                              GEMM_ARGUMENTS(GTYPE, CTYPE)) {
  GEMM_BATCH_OFFSETS

  const int2 tile = gemm_tile_of_group();  // gemm_common.cl: plain or GM-banded order
  GEMM_TILE_ORIGIN(tile)
  const int tid = get_local_id(0);
  const int wg = tid / 128;      // this thread's warpgroup
  const int wlane = tid % 128;   // its thread index inside the warpgroup
  const int wr0 = wg * WG_ROWS;  // the warpgroup's first row inside the tile

  // All tiles in one array: stage s holds A at s * STAGE_BYTES, B after it. The descriptors need its
  // shared-window address (the emulation: offsets from its start).
  __local uchar smem[SMEM_BYTES] __attribute__((aligned(1024)));
  #if WGMMA_STUB
    const uint addr = 0;
  #else
    const uint addr = (uint)(size_t)smem;
  #endif

  float acc[MI][NACC];
  #pragma unroll
  for (int i = 0; i < MI; ++i) {
    #pragma unroll
    for (int j = 0; j < NACC; ++j) { acc[i][j] = 0.0f; }
  }

  const int tiles = (K + KWG - 1) / KWG;
  // Prologue: steps 0 .. AHEAD - 1, one commit group each (committed even when empty, so that "all
  // but the newest AHEAD - 1 groups" always means "up to step t").
  #pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < tiles) {
      GlobalToLocalA(agm, smem, addr, s * STAGE_BYTES, tid, m0, s * KWG, M, K, lda);
      GlobalToLocalB(bgm, smem, addr, s * STAGE_BYTES + A_TILE_BYTES, tid, n0, s * KWG, N, K, ldb);
    }
    CpAsyncCommit();
  }
  for (int tile = 0; tile < tiles; ++tile) {
    CpAsyncWait(AHEAD - 1);  // this thread's copies of step `tile` have arrived
    ProxyFence();
    #if INFLIGHT
    WgmmaWaitAllButOne();
    #else
    WgmmaWait();
    #endif
    FenceAccumulators(acc);
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint a_tile = addr + (tile % STAGES) * STAGE_BYTES;
    const uint b_tile = a_tile + A_TILE_BYTES;
    WgmmaFence();
    #if WGMMA_STUB == 0
    #pragma unroll
    #endif
    for (int ks = 0; ks < KSTEPS; ++ks) {
      const ulong desc_b = Descriptor(b_tile, 0, ks * KI, NWG, B_MN);
      #pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        Wgmma(acc[mi], Descriptor(a_tile, wr0 + mi * 64, ks * KI, MWG, A_MN), desc_b WGMMA_ARGS);
      }
    }
    WgmmaCommit();
    FenceAccumulators(acc);
    const int ahead = tile + AHEAD;
    if (ahead < tiles) {
      const uint buf = (ahead % STAGES) * STAGE_BYTES;
      GlobalToLocalA(agm, smem, addr, buf, tid, m0, ahead * KWG, M, K, lda);
      GlobalToLocalB(bgm, smem, addr, buf + A_TILE_BYTES, tid, n0, ahead * KWG, N, K, ldb);
    }
    CpAsyncCommit();
  }
  WgmmaWait();
  FenceAccumulators(acc);

  PrivateToGlobalC(acc, cgm, m0 + wr0, n0, wlane, M, N, ldc, alpha, beta);
}
