// Integer mat-vec for decode (n_tok <= CUDA_MATVEC_MAX_TOK): activations
// quantized to q8_1 (cuda_quantize_q8_1), weights kept in their blocks, int8
// products with __dp4a, one float term per 32-element sub-block. The CPU
// reference is gguf/quant_q8.c (contract, block format and the exact float
// expression of each term in gguf/quant_q8.h): every per-sub-block term here
// is bit-identical to the reference's (same integers, same float products
// through __fmul_rn/__fadd_rn, so nvcc cannot fuse them); only the order in
// which the terms are added differs.
//
// Work split. A block of MVQ_WARPS warps owns MVQ_ROWS weight rows (a row
// pair; in SWIGLU mode the gate row and the up row of one output) and walks
// the whole row length; warp w takes the steps w, w + MVQ_WARPS, ... of
// MVQ_STEP sub-blocks (1024 elements) each, lane l the sub-block l of the
// step. At the end the warps' partial sums are added in a fixed order (warp
// 0..3) and the epilogue runs, so results do not depend on scheduling. That
// is the one-pass kernel; the pipelined kernel (below, struct
// cuda_mvq_plan) gives each block several row pairs, one after another, with
// the same split and order inside each pair: the same result bit for bit.
// The streaming kernel gives each warp whole row pairs instead, its own
// order (below).
//
// Loads (the kernel is meant to run at memory bandwidth; the activations are
// re-read by every row, the weights exactly once):
// - Activations: q8_1 blocks are 36 bytes, so a lane reading its own block
//   from global memory would make 9 strided 4-byte loads (each warp load
//   touching 9 cache lines). Instead each warp copies the step's 32 blocks per
//   token (1152 contiguous bytes) into its slice of shared memory with
//   coalesced 16-byte loads (4- or 8-byte where the row is less aligned),
//   and lane l then reads block l with nine 4-byte shared loads, conflict
//   free (word 9l + k: 9 is odd, so the 32 lanes hit 32 banks). The act
//   registers of one token serve all MVQ_ROWS rows.
// - Weights: the warp copies each row's step chunk (32 sub-blocks, e.g. 576
//   contiguous bytes for Q4_0 and for Q4_K) into shared memory the same way
//   (16-byte loads when the row is 16-byte aligned, i.e. when row_bytes is:
//   Q4_0 with n_in % 256 == 0, Q4_K and Q5_K always), then each lane reads
//   its block: the 2-byte aligned layouts (Q4_0 and IQ4_NL 18 B, Q5_0 22 B,
//   Q8_0 34 B, Q3_K 110 B, Q6_K 210 B) and Q4_1/Q5_1/Q2_K with 4-byte shared
//   loads re-aligned by __byte_perm (at most 2-way bank conflicts for block
//   strides of 4.5, 5.5, 8.5 words); Q4_K (144 B) and Q5_K (176 B)
//   super-blocks with 16-byte shared loads (the 8 lanes of a super-block
//   share its header and, in pairs, its quant bytes: broadcasts, no
//   conflicts); IQ4_XS (136 B, 8-byte aligned in shared memory) with 8-byte
//   loads: the header (d, scales_h, scales_l) broadcast to the super-block's
//   8 lanes, then each lane's own 16 quant bytes (conflict free: a half-warp
//   reads two super-blocks' 128 contiguous quant bytes). Loading K blocks
//   straight from global memory instead made each lane fetch 32 quant bytes
//   of which it uses 16 (two sub-blocks share them as low and high nibbles)
//   and the 8 lanes of a block the same header: 1.5x the sectors per
//   request of a coalesced copy (bench/README.md, emulated traffic).
// All loads of a step (weights of every row, then activations) are issued
// before the first __syncwarp, so each lane has several in flight.
//
// Signed weights (Q4_0, Q5_0, Q3_K, Q6_K): a byte a in [0, 2^k) becomes
// a - 2^(k-1) as (a + 0x80 - 2^(k-1)) ^ 0x80 per byte (no carry crosses
// bytes), so __dp4a sees the signed quants and no activation sum is needed.
// Types with a min (Q4_1, Q5_1, Q4_K, Q5_K) need sum(q_x): __dp4a with
// 0x01010101, once per token and sub-block (shared by the rows), and Q2_K,
// whose two 16-element groups have their own mins, also that of elements
// 16..31. The block's f16 s is not used.
//
// IQ4_NL / IQ4_XS: each nibble becomes its int8 level (-127..113) by byte
// permutes of the 16 levels held in 4 registers (dequant.cuh, iq4_levels8:
// 8 nibbles in 8 __byte_perm), so __dp4a sees the levels themselves; signed,
// no activation sum. MXFP4 the same with its doubled E2M1 levels (-12..12,
// mxfp4_levels8) and the E8M0 scale; its 17-byte blocks are staged and read
// a byte at a time. Its paths are compile-time branches on the type, so the
// other types' instantiations compile as they would without it.
#include "cuda/dequant.cuh"
#include "cuda/launch.cuh"
#include "cuda/matvec_q8.h"
#include "cuda/q8_1.cuh"

#include <atomic>

#include <cuda_pipeline_primitives.h>

extern "C" {
#include "gguf/quant_q8.h" // a C header without extern "C" guards of its own
}

#define MVQ_WARPS 4 // warps per block, splitting the row length
#define MVQ_ROWS 2  // weight rows per block (SWIGLU: its gate and up row)
static_assert(MVQ_ROWS == 2, "SWIGLU pairs one gate and one up row; the epilogue selects assume 2");
#define MVQ_STEP 32       // sub-blocks (of 32 elements) per warp step
#define MVQ_XQ_BYTES 36   // one q8_1 block (QUANT_Q8_1_BLOCK_BYTES)
#define MVQ_QUANT_WARPS 8 // q8_1 blocks per block of the quantize kernel

// ---------------------------------------------------------------------------
// quantize

// One warp per q8_1 block (lane = element), cuda/q8_1.cuh.
__global__ static void __launch_bounds__(MVQ_QUANT_WARPS *VELA_WARP)
    quantize_q8_1_kernel(uint8_t *__restrict__ xq /* [n_blocks][36] */,
                         const float *__restrict__ x /* [n_blocks][32] */, int64_t n_blocks) {
    cuda_pdl_wait();
    const int lane = threadIdx.x % VELA_WARP;
    for (int64_t b = (int64_t)blockIdx.x * MVQ_QUANT_WARPS + threadIdx.x / VELA_WARP; b < n_blocks;
         b += (int64_t)gridDim.x * MVQ_QUANT_WARPS)
        q8_1_store_warp(xq + b * MVQ_XQ_BYTES, x[b * 32 + lane], lane);
}

extern "C" int cuda_quantize_q8_1(void *xq, const float *x, int n_tok, int64_t n_in, bool pdl,
                                  cudaStream_t stream, struct verr *err) {
    if (n_tok < 0 || n_in <= 0 || n_in % 32 != 0)
        return verr_set(err, VERR_RANGE,
                        "quantize q8_1: n_tok %d, n_in %lld: need n_tok >= 0 and n_in a positive "
                        "multiple of 32",
                        n_tok, (long long)n_in);
    if (n_tok == 0)
        return VERR_OK;
    if (!xq || !x || ((uintptr_t)xq & 3u) != 0 || ((uintptr_t)x & 3u) != 0)
        return verr_set(err, VERR_RANGE,
                        "quantize q8_1: x %p and xq %p must be non-NULL and 4-byte aligned",
                        (const void *)x, xq);
    const int64_t n_blocks = (int64_t)n_tok * (n_in / 32);
    int64_t grid = (n_blocks + MVQ_QUANT_WARPS - 1) / MVQ_QUANT_WARPS;
    if (grid > 65535)
        grid = 65535; // grid-stride beyond
    cuda_launch(pdl, quantize_q8_1_kernel, (unsigned int)grid, MVQ_QUANT_WARPS * VELA_WARP, 0,
                stream, (uint8_t *)xq, x, n_blocks);
    VELA_CHECK_LAUNCH(err, "quantize_q8_1_kernel");
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// shared helpers

// Copies nbytes (even) from global src (2-byte aligned) to shared dst
// (16-byte aligned) with the warp: the widest unit that src and nbytes allow,
// lanes on consecutive units (coalesced), up to 4 loads in flight per lane.
template <typename U>
static __device__ __forceinline__ void
warp_copy_units(uint8_t *__restrict__ dst, const uint8_t *__restrict__ src, int n, int lane) {
    const U *s = (const U *)src;
    U *d = (U *)dst;
    for (int i = lane; i < n; i += 4 * VELA_WARP) {
        U v[4] = {};
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (i + k * VELA_WARP < n)
                v[k] = s[i + k * VELA_WARP];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (i + k * VELA_WARP < n)
                d[i + k * VELA_WARP] = v[k];
    }
}

static __device__ __forceinline__ void warp_copy(uint8_t *dst, const uint8_t *src, int nbytes,
                                                 int lane) {
    const uintptr_t a = (uintptr_t)src | (uintptr_t)nbytes;
    if ((a & 15u) == 0)
        warp_copy_units<uint4>(dst, src, nbytes / 16, lane);
    else if ((a & 7u) == 0)
        warp_copy_units<uint2>(dst, src, nbytes / 8, lane);
    else if ((a & 3u) == 0)
        warp_copy_units<uint32_t>(dst, src, nbytes / 4, lane);
    else
        warp_copy_units<uint16_t>(dst, src, nbytes / 2, lane);
}

// warp_copy of a weight chunk of type T: MXFP4's 17-byte blocks put a row
// (and a chunk's length) at odd byte counts, copied a byte at a time; the
// other types take warp_copy as it is.
template <int T>
static __device__ __forceinline__ void warp_copy_w(uint8_t *dst, const uint8_t *src, int nbytes,
                                                   int lane) {
    if constexpr (T == GGML_TYPE_MXFP4) {
        if ((((uintptr_t)src | (uintptr_t)nbytes) & 1u) != 0) {
            warp_copy_units<uint8_t>(dst, src, nbytes, lane);
            return;
        }
    }
    warp_copy(dst, src, nbytes, lane);
}

// NW little-endian words starting at a 2-byte aligned shared address: aligned
// 4-byte loads, shifted by 16 bits when p is 2 mod 4. Reads one word past the
// last (the shared slices are padded for it).
template <int NW> static __device__ __forceinline__ void sh_words(const uint8_t *p, uint32_t *w) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sel = ((uintptr_t)p & 2u) ? 0x5432u : 0x3210u;
    uint32_t lo = a[0];
#pragma unroll
    for (int k = 0; k < NW; k++) {
        const uint32_t hi = a[k + 1];
        w[k] = __byte_perm(lo, hi, sel);
        lo = hi;
    }
}

static __device__ __forceinline__ float sh_f16(const uint8_t *p) {
    return f16_bits_to_f32(*(const uint16_t *)p);
}

// Per byte: a in [0, 2^k) -> a - 2^(k-1) as a signed byte; bias = 0x80 - 2^(k-1)
// replicated (0x78787878 for k = 4, 0x70.. for 5, 0x60.. for 6).
static __device__ __forceinline__ int to_signed(uint32_t a, uint32_t bias) {
    return (int)((a + bias) ^ 0x80808080u);
}

// Bits 0..3 of x -> bit 4 of bytes 0..3 (the multiplier's shifts 4, 11, 18,
// 25 put bit i at 8i + 4; the four copies do not overlap, so nothing carries).
static __device__ __forceinline__ uint32_t spread_bit4(uint32_t x) {
    return ((x & 0xfu) * 0x02040810u) & 0x10101010u;
}

// One sub-block of a weight row in dp4a form: v[k] holds elements 4k..4k+3
// as bytes (signed for the offset types), plus the factors of its term.
struct mvq_w {
    int v[8];
    float a, b;   // dw, m (legacy) / d, dmin (K) / d (Q3_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4)
    int sc0, sc1; // Q4_K/Q5_K: scale, min; Q2_K/Q3_K/Q6_K: scales of elements 0..15, 16..31;
                  // IQ4_XS: sc0 the group's scale
    int m0, m1;   // Q2_K: mins of elements 0..15, 16..31
};

template <int T> struct mvq_traits {
    // The types with a dp4a decode here (quant_q8_1_dot_supported).
    static constexpr bool dp4a =
        T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1 ||
        T == GGML_TYPE_Q8_0 || T == GGML_TYPE_Q2_K || T == GGML_TYPE_Q3_K || T == GGML_TYPE_Q4_K ||
        T == GGML_TYPE_Q5_K || T == GGML_TYPE_Q6_K || T == GGML_TYPE_IQ4_NL ||
        T == GGML_TYPE_IQ4_XS || T == GGML_TYPE_MXFP4;
    // Sub-blocks per weight block.
    static constexpr int subs = qtype<T>::block / 32;
    static constexpr bool has_min =
        T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1 || T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K;
    // Bytes of one step's chunk of a row (MVQ_STEP sub-blocks).
    static constexpr int chunk = MVQ_STEP / subs * qtype<T>::bytes;
};

static __device__ __forceinline__ void words_of(uint4 a, uint4 b, uint32_t *w) {
    w[0] = a.x;
    w[1] = a.y;
    w[2] = a.z;
    w[3] = a.w;
    w[4] = b.x;
    w[5] = b.y;
    w[6] = b.z;
    w[7] = b.w;
}

// Decodes the lane's sub-block: p is its weight block (for the K types
// the super-block) in shared memory and j its index inside a K super-block.
template <int T>
static __device__ __forceinline__ void mvq_decode(const uint8_t *p, int j, mvq_w *o) {
    if (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        constexpr int qoff = T == GGML_TYPE_Q4_1 ? 4 : 2;
        uint32_t q[4];
        sh_words<4>(p + qoff, q);
        o->a = sh_f16(p);
        o->b = T == GGML_TYPE_Q4_1 ? sh_f16(p + 2) : 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t lo = q[k] & 0x0f0f0f0fu, hi = (q[k] >> 4) & 0x0f0f0f0fu;
            o->v[k] = T == GGML_TYPE_Q4_0 ? to_signed(lo, 0x78787878u) : (int)lo;
            o->v[k + 4] = T == GGML_TYPE_Q4_0 ? to_signed(hi, 0x78787878u) : (int)hi;
        }
    } else if (T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
        constexpr int hoff = T == GGML_TYPE_Q5_1 ? 4 : 2;
        uint32_t qh, q[4];
        sh_words<1>(p + hoff, &qh);
        sh_words<4>(p + hoff + 4, q);
        o->a = sh_f16(p);
        o->b = T == GGML_TYPE_Q5_1 ? sh_f16(p + 2) : 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t lo = (q[k] & 0x0f0f0f0fu) | spread_bit4(qh >> (4 * k));
            const uint32_t hi = ((q[k] >> 4) & 0x0f0f0f0fu) | spread_bit4(qh >> (16 + 4 * k));
            o->v[k] = T == GGML_TYPE_Q5_0 ? to_signed(lo, 0x70707070u) : (int)lo;
            o->v[k + 4] = T == GGML_TYPE_Q5_0 ? to_signed(hi, 0x70707070u) : (int)hi;
        }
    } else if (T == GGML_TYPE_Q8_0) {
        sh_words<8>(p + 2, (uint32_t *)o->v);
        o->a = sh_f16(p);
        o->b = 0.0f;
    } else if (T == GGML_TYPE_IQ4_NL || T == GGML_TYPE_IQ4_XS || T == GGML_TYPE_MXFP4) {
        // Group j's 16 quant bytes: words k of elements 4k..4k+3 (low
        // nibbles) and 16 + 4k.. (high nibbles).
        uint32_t q[4];
        if (T == GGML_TYPE_IQ4_NL) {
            sh_words<4>(p + 2, q);
            o->a = sh_f16(p);
        } else if (T == GGML_TYPE_MXFP4) {
            // e@0, qs[16]@1: 17-byte blocks sit at any byte offset of the
            // staged chunk, so byte loads.
#pragma unroll
            for (int k = 0; k < 4; k++)
                q[k] = (uint32_t)p[1 + 4 * k] | (uint32_t)p[2 + 4 * k] << 8 |
                       (uint32_t)p[3 + 4 * k] << 16 | (uint32_t)p[4 + 4 * k] << 24;
            o->a = e8m0_half_to_f32(p[0]);
        } else { // a super-block starts at 0 or 8 mod 16 in the staged chunk
            const uint2 h = *(const uint2 *)p; // d | scales_h << 16, scales_l[4]
            const uint2 q01 = *(const uint2 *)(p + 8 + 16 * j);
            const uint2 q23 = *(const uint2 *)(p + 16 + 16 * j);
            q[0] = q01.x;
            q[1] = q01.y;
            q[2] = q23.x;
            q[3] = q23.y;
            o->a = f16_bits_to_f32((uint16_t)(h.x & 0xffffu));
            o->sc0 = iq4xs_scale(h.x >> 16, h.y >> (8 * (j >> 1)), j);
        }
        o->b = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo, hi;
            if constexpr (T == GGML_TYPE_MXFP4)
                mxfp4_levels8(q[k], &lo, &hi);
            else
                iq4_levels8(q[k], &lo, &hi);
            o->v[k] = (int)lo;
            o->v[k + 4] = (int)hi;
        }
    } else if (T == GGML_TYPE_Q2_K || T == GGML_TYPE_Q3_K) {
        // Sub-block j = 4h + s: 2-bit quants at bits 2s.. of qs[32h + l];
        // groups 2j (elements 0..15) and 2j + 1.
        const int h = j >> 2, s = j & 3;
        uint32_t q[8];
        sh_words<8>(p + (T == GGML_TYPE_Q3_K ? 32 : 16) + 32 * h, q);
        if (T == GGML_TYPE_Q2_K) {
            const uint32_t sc2 = *(const uint16_t *)(p + 2 * j); // 4-bit scale | min << 4
            o->a = sh_f16(p + 80);
            o->b = sh_f16(p + 82);
            o->sc0 = (int)(sc2 & 0x0fu);
            o->m0 = (int)((sc2 >> 4) & 0x0fu);
            o->sc1 = (int)((sc2 >> 8) & 0x0fu);
            o->m1 = (int)(sc2 >> 12);
#pragma unroll
            for (int k = 0; k < 8; k++)
                o->v[k] = (int)((q[k] >> (2 * s)) & 0x03030303u);
        } else {
            uint32_t hm[8];
            sh_words<8>(p, hm);
            o->a = sh_f16(p + 108);
            o->b = 0.0f;
            o->sc0 = q3k_scale(p + 96, 2 * j);
            o->sc1 = q3k_scale(p + 96, 2 * j + 1);
            // level + 4 = the 2 low bits | hmask bit j << 2, then signed
#pragma unroll
            for (int k = 0; k < 8; k++)
                o->v[k] = to_signed(((q[k] >> (2 * s)) & 0x03030303u) |
                                        (((hm[k] >> j) & 0x01010101u) << 2),
                                    0x7c7c7c7cu);
        }
    } else if (T == GGML_TYPE_Q6_K) {
        const int n = j >> 2, s = j & 3;
        uint32_t ql[8], qh[8];
        sh_words<8>(p + 64 * n + 32 * (s & 1), ql);
        sh_words<8>(p + 128 + 32 * n, qh);
        const uint32_t sc = *(const uint16_t *)(p + 192 + 8 * n + 2 * s);
        o->a = sh_f16(p + 208);
        o->b = 0.0f;
        o->sc0 = (int)(int8_t)(sc & 0xffu);
        o->sc1 = (int)(int8_t)(sc >> 8);
        const int ls = 4 * (s >> 1), hs = 2 * s;
#pragma unroll
        for (int k = 0; k < 8; k++)
            o->v[k] = to_signed(
                ((ql[k] >> ls) & 0x0f0f0f0fu) | (((qh[k] >> hs) & 0x03030303u) << 4), 0x60606060u);
    } else { // Q4_K, Q5_K: 16-byte aligned in shared memory
        const uint4 *b = (const uint4 *)p;
        const uint4 hdr = b[0];
        const uint32_t s3[3] = {hdr.y, hdr.z, hdr.w};
        k4_scale_min(s3, j, &o->sc0, &o->sc1);
        o->a = f16_bits_to_f32((uint16_t)(hdr.x & 0xffffu));
        o->b = f16_bits_to_f32((uint16_t)(hdr.x >> 16));
        // Sub-blocks 2n, 2n+1: low and high nibbles of the same 32 bytes.
        const int qb = (T == GGML_TYPE_Q4_K ? 1 : 3) + 2 * (j >> 1);
        uint32_t q[8];
        words_of(b[qb], b[qb + 1], q);
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o->v[k] = (int)((q[k] >> shift) & 0x0f0f0f0fu);
        if (T == GGML_TYPE_Q5_K) {
            uint32_t h[8];
            words_of(b[1], b[2], h);
#pragma unroll
            for (int k = 0; k < 8; k++)
                o->v[k] |= (int)(((h[k] >> j) & 0x01010101u) << 4);
        }
    }
}

// The sub-block's float term (gguf/quant_q8.h), dx the activation scale.
template <int T>
// sumq, sumq_hi: the sums of the activation quants over the sub-block and
// over its elements 16..31 (computed for the types that use them).
static __device__ __forceinline__ float mvq_term(const mvq_w &w, const int *u, int sumq,
                                                 int sumq_hi, float dx) {
    if (T == GGML_TYPE_Q6_K || T == GGML_TYPE_Q3_K || T == GGML_TYPE_Q2_K) {
        int lo = 0, hi = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo = __dp4a(w.v[k], u[k], lo);
            hi = __dp4a(w.v[k + 4], u[k + 4], hi);
        }
        const float ti = mul_rn(mul_rn(w.a, dx), (float)(w.sc0 * lo + w.sc1 * hi));
        if (T != GGML_TYPE_Q2_K)
            return ti;
        return sub_rn(ti,
                      mul_rn(mul_rn(w.b, dx), (float)(w.m0 * (sumq - sumq_hi) + w.m1 * sumq_hi)));
    }
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 8; k++)
        sumi = __dp4a(w.v[k], u[k], sumi);
    if (T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1)
        return add_rn(mul_rn(mul_rn(w.a, dx), (float)sumi), mul_rn(mul_rn(w.b, dx), (float)sumq));
    if (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K)
        return sub_rn(mul_rn(mul_rn(w.a, dx), (float)(w.sc0 * sumi)),
                      mul_rn(mul_rn(w.b, dx), (float)(w.sc1 * sumq)));
    if (T == GGML_TYPE_IQ4_XS)
        return mul_rn(mul_rn(w.a, dx), (float)(w.sc0 * sumi));
    return mul_rn(mul_rn(w.a, dx), (float)sumi);
}

// silu(g) * u with the expression of elementwise.cu's swiglu, so the fused
// epilogue equals matvec + cuda_swiglu_apply bit for bit.
static __device__ __forceinline__ float mvq_silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// ---------------------------------------------------------------------------
// mat-vec

struct mvq_args {
    float *out[CUDA_MV_MAX_SEGS];        // [n_tok][n_out]
    const uint8_t *w[CUDA_MV_MAX_SEGS];  // [n_out][row_bytes]
    const float *bias[CUDA_MV_MAX_SEGS]; // [n_out] or NULL
    int64_t n_out[CUDA_MV_MAX_SEGS];
    // Row pairs (MVQ_ROWS rows: two outputs, or SWIGLU's gate and up row of
    // one output) are numbered across the segments: those of seg s are
    // [first_pair[s], first_pair[s+1]).
    unsigned int first_pair[CUDA_MV_MAX_SEGS + 1];
    const uint8_t *xq; // [n_tok][xq_row_bytes]
    size_t row_bytes, xq_row_bytes;
    int64_t n_in;
    int n_tok, epi;
    int warp_smem; // bytes of one warp's shared slice
    // Pipelined kernel only: row pairs per block, bytes of the resident
    // activations at the start of shared memory.
    int pairs_per_block, xs_bytes;
    // Expert mode (cuda_matvec_q8_experts; NULL ids: off): blockIdx.y is the
    // (token, slot) pair pair0 + blockIdx.y, n_tok is 1.
    const int32_t *ids;  // [n_pairs] expert of each pair
    size_t expert_bytes; // one expert's matrix: n_out[0] * row_bytes
    int n_expert, x_div, pair0;
};

// What a block of an expert-mode launch reads and writes instead of the
// plain launch's matrices and rows: expert e = ids[p] (clamped into
// [0, n_expert): a bad id reads another expert, never out of bounds),
// activations of row p / x_div, output row p. Plain launches: all zero
// offsets.
struct mvq_ex {
    size_t w_off;      // bytes added to every weight row pointer
    const uint8_t *xq; // the block's activations [n_tok][xq_row_bytes]
    size_t out_off;    // floats added to the output pointer
};

static __device__ __forceinline__ mvq_ex mvq_ex_of(const mvq_args &a) {
    mvq_ex x = {0, a.xq, 0};
    if (a.ids) {
        const int p = a.pair0 + (int)blockIdx.y;
        const int e = min(max(a.ids[p], 0), a.n_expert - 1);
        x.w_off = (size_t)e * a.expert_bytes;
        x.xq = a.xq + (size_t)(p / a.x_div) * a.xq_row_bytes;
        x.out_off = (size_t)p * (size_t)a.n_out[0];
    }
    return x;
}

// Sub-blocks of the step starting at sub-block sb0 of a row of n_sub.
static __device__ __forceinline__ int mvq_step_subs(int64_t n_sub, int64_t sb0) {
    return (int)(n_sub - sb0 < MVQ_STEP ? n_sub - sb0 : MVQ_STEP);
}

// Where row pair `pair` belongs: its segment and first output index. A pair
// past its segment's n_out (the last pair of an odd segment) repeats row o0
// and stores nothing, which keeps the inner loops free of row tests.
// Selects rather than indexing the parameter arrays with a run-time segment
// (that would copy them to the stack).
struct mvq_pair {
    int seg;
    int64_t o0;
};

static __device__ __forceinline__ mvq_pair mvq_pair_of(const mvq_args &a, unsigned int pair) {
    mvq_pair p;
    p.seg = (pair >= a.first_pair[1]) + (pair >= a.first_pair[2]);
    const unsigned int f = p.seg == 0 ? 0u : p.seg == 1 ? a.first_pair[1] : a.first_pair[2];
    // SWIGLU: the gate row o0 of seg 0 and the up row o0 of seg 1.
    p.o0 = CUDA_MV_GATED(a.epi) ? (int64_t)pair : (int64_t)(pair - f) * MVQ_ROWS;
    return p;
}

static __device__ __forceinline__ void mvq_rows_of(const mvq_args &a, mvq_pair p, size_t w_off,
                                                   const uint8_t *rows[MVQ_ROWS]) {
    const bool gated = CUDA_MV_GATED(a.epi);
    const uint8_t *const wseg = p.seg == 0 ? a.w[0] : p.seg == 1 ? a.w[1] : a.w[2];
    const int64_t nseg = p.seg == 0 ? a.n_out[0] : p.seg == 1 ? a.n_out[1] : a.n_out[2];
    rows[0] = (gated ? a.w[0] : wseg) + w_off + (size_t)p.o0 * a.row_bytes;
    rows[1] = gated ? a.w[1] + w_off + (size_t)p.o0 * a.row_bytes
                    : wseg + w_off + (size_t)(p.o0 + 1 < nseg ? p.o0 + 1 : p.o0) * a.row_bytes;
}

// One step of a warp: adds the terms of nsb (<= MVQ_STEP) sub-blocks of both
// staged rows to acc, lane l the sub-block l. ws: the rows' staged chunks
// [MVQ_ROWS][chunk + 16]; xs: token 0's q8_1 block of the step's first
// sub-block in shared memory, xs_tok bytes between tokens (a multiple of
// 36 bytes, so lane l's nine words stay on 32 distinct banks).
template <int T, int NT>
static __device__ __forceinline__ void mvq_step(float acc[MVQ_ROWS][NT], const uint8_t *ws,
                                                const uint8_t *xs, int xs_tok, int jb, int j,
                                                int n_tok, int lane) {
    typedef mvq_traits<T> tr;
    mvq_w wv[MVQ_ROWS];
#pragma unroll
    for (int r = 0; r < MVQ_ROWS; r++)
        mvq_decode<T>(ws + r * (tr::chunk + 16) + jb * qtype<T>::bytes, j, &wv[r]);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            const uint32_t *xb = (const uint32_t *)(xs + t * xs_tok + lane * MVQ_XQ_BYTES);
            const float dx = f16_bits_to_f32((uint16_t)(xb[0] & 0xffffu));
            int u[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                u[k] = (int)xb[1 + k];
            // Sums of the activation quants over elements 0..15 and 16..31,
            // shared by the rows.
            int sumq_lo = 0, sumq_hi = 0;
            if (tr::has_min || T == GGML_TYPE_Q2_K) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    sumq_lo = __dp4a(0x01010101, u[k], sumq_lo);
                    sumq_hi = __dp4a(0x01010101, u[k + 4], sumq_hi);
                }
            }
            const int sumq = sumq_lo + sumq_hi;
#pragma unroll
            for (int r = 0; r < MVQ_ROWS; r++)
                acc[r][t] += mvq_term<T>(wv[r], u, sumq, sumq_hi, dx);
        }
    }
}

// The warp's partial sums of a row pair into red[warp] (lane 0 writes).
template <int NT>
static __device__ __forceinline__ void mvq_to_red(float red[MVQ_ROWS][NT],
                                                  const float acc[MVQ_ROWS][NT], int lane) {
#pragma unroll
    for (int r = 0; r < MVQ_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = warp_sum(acc[r][t]);
            if (lane == 0)
                red[r][t] = s;
        }
}

// A row pair's results once every warp's partial sums are in red (after a
// __syncthreads): added in warp order 0..3, so results do not depend on
// scheduling, then the epilogue; threads tid < MVQ_ROWS * NT write.
template <int NT>
static __device__ __forceinline__ void mvq_store(const mvq_args &a, mvq_pair p, size_t out_off,
                                                 const float (*red)[MVQ_ROWS][NT], int tid) {
    if (CUDA_MV_GATED(a.epi)) {
        if (tid < a.n_tok) {
            float g = 0.0f, u = 0.0f;
#pragma unroll
            for (int w = 0; w < MVQ_WARPS; w++) {
                g += red[w][0][tid];
                u += red[w][1][tid];
            }
            a.out[0][out_off + (size_t)tid * a.n_out[0] + p.o0] =
                a.epi == CUDA_MV_GEGLU ? vela_gelu_mul(g, u) : mvq_silu_mul(g, u);
        }
    } else if (tid < MVQ_ROWS * NT) {
        float *const oseg = p.seg == 0 ? a.out[0] : p.seg == 1 ? a.out[1] : a.out[2];
        const float *const bseg = p.seg == 0 ? a.bias[0] : p.seg == 1 ? a.bias[1] : a.bias[2];
        const int64_t nseg = p.seg == 0 ? a.n_out[0] : p.seg == 1 ? a.n_out[1] : a.n_out[2];
        const int r = tid / NT, t = tid % NT;
        if (t < a.n_tok && p.o0 + r < nseg) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < MVQ_WARPS; w++)
                s += red[w][r][t];
            const int64_t o = p.o0 + r;
            if (bseg)
                s = s + bseg[o];
            float *dst = oseg + out_off + (size_t)t * nseg + o;
            *dst = a.epi == CUDA_MV_ADD ? *dst + s : s;
        }
    }
}

// The one-pass kernel: one row pair per block.
// Occupancy (sm_90, ptxas -v; bench/README.md's emulated report): 50% or
// more for every type (at most 64 registers per thread; Q5_K 56 with one
// token, the widest decode). Q2_K's 3..8-token instance spills 12 bytes
// (CUDA 13.0): its two mins per sub-block and row. Each lane keeps several independent loads in
// flight: a step's weight chunks of both rows and its activations are all
// requested before the first __syncwarp. But a block makes one such round
// trip per step and a 4096-wide row is one step per warp: at one token it
// measured 26-54% of the H200's bandwidth on large matrices, hence the
// pipelined kernel below.
template <int T, int NT>
__global__ static void __launch_bounds__(MVQ_WARPS *VELA_WARP) matvec_q8_kernel(const mvq_args a) {
    typedef mvq_traits<T> tr;
    extern __shared__ __align__(16) uint8_t mvq_smem[];
    __shared__ float red[MVQ_WARPS][MVQ_ROWS][NT];
    cuda_pdl_wait();
    const int warp = threadIdx.x / VELA_WARP, lane = threadIdx.x % VELA_WARP;

    const mvq_pair p = mvq_pair_of(a, blockIdx.x);
    const mvq_ex ex = mvq_ex_of(a);
    const uint8_t *rows[MVQ_ROWS];
    mvq_rows_of(a, p, ex.w_off, rows);

    uint8_t *xs = mvq_smem + (size_t)warp * a.warp_smem;          // [n_tok][MVQ_STEP][36]
    uint8_t *ws = xs + (size_t)a.n_tok * MVQ_STEP * MVQ_XQ_BYTES; // [MVQ_ROWS][chunk + 16]

    float acc[MVQ_ROWS][NT];
#pragma unroll
    for (int r = 0; r < MVQ_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;

    const int64_t n_sub = a.n_in / 32;
    for (int64_t sb0 = (int64_t)warp * MVQ_STEP; sb0 < n_sub; sb0 += MVQ_WARPS * MVQ_STEP) {
        const int nsb = mvq_step_subs(n_sub, sb0);
        const bool active = lane < nsb;
        // Weights: the lane's sub-block is block lane / subs, part lane % subs.
        const int64_t blk0 = sb0 / tr::subs; // first weight block of the step
        const int jb = lane / tr::subs, j = lane % tr::subs;
#pragma unroll
        for (int r = 0; r < MVQ_ROWS; r++)
            warp_copy_w<T>(ws + r * (tr::chunk + 16), rows[r] + blk0 * qtype<T>::bytes,
                           nsb / tr::subs * qtype<T>::bytes, lane);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < a.n_tok)
                warp_copy(xs + t * MVQ_STEP * MVQ_XQ_BYTES,
                          ex.xq + t * a.xq_row_bytes + sb0 * MVQ_XQ_BYTES, nsb * MVQ_XQ_BYTES,
                          lane);
        __syncwarp();
        if (active)
            mvq_step<T, NT>(acc, ws, xs, MVQ_STEP * MVQ_XQ_BYTES, jb, j, a.n_tok, lane);
        __syncwarp(); // the next step overwrites this warp's shared slice
    }

    mvq_to_red<NT>(red[warp], acc, lane);
    __syncthreads();
    mvq_store<NT>(a, p, ex.out_off, red, threadIdx.x);
}

// ---------------------------------------------------------------------------
// pipelined mat-vec (CUDA_MVQ_PIPE)
//
// A block owns pairs_per_block consecutive row pairs and walks them one
// after another; the warps split each row's length as in the one-pass kernel
// (warp w the steps w, w + 4, ...). Every warp works through its items, one
// (row pair, step) each, in order, through MVQ_PIPE_STAGES shared slots: the
// weight chunks of item i + STAGES - 1 are requested with cp.async (no
// registers held while they travel) before item i is decoded, so a warp
// keeps STAGES - 1 items of weights in flight the whole time instead of one
// round trip per block. The activations of every token are copied to shared
// memory once per block and serve all its rows: pairs_per_block times
// fewer activation reads from L2 than the one-pass kernel makes.

// Shared memory of the pipelined kernel: at most 96 KiB a block, which every
// GPU built for can give one (sm_86/89 opt in to 99 KiB, sm_80 163, sm_90
// 227): 8 tokens of a 4096-wide row (37 KiB of activations) fit, 2 of 14336.
#define MVQ_PIPE_MAX_SMEM (96 * 1024)

// Slots per warp: 4 for chunks of at most 640 bytes, else 3 (shared memory).
template <int T> struct mvq_pipe {
    static constexpr int stages = mvq_traits<T>::chunk <= 640 ? 4 : 3;
    static constexpr int slot = MVQ_ROWS * (mvq_traits<T>::chunk + 16); // bytes of one slot
};

// cp.async of nbytes from global src to shared dst, threads tid of nthreads
// on consecutive units of U bytes.
template <int U>
static __device__ __forceinline__ void copy_units_async(uint8_t *dst, const uint8_t *src,
                                                        int nbytes, int tid, int nthreads) {
    for (int i = tid * U; i < nbytes; i += nthreads * U)
        __pipeline_memcpy_async(dst + i, src + i, U);
}

// Queues the copy of nbytes from src to dst (shared memory) for the calling
// thread in the widest cp.async unit that src, dst and nbytes allow (a
// slot's second row starts 8 bytes off 16 for Q3_K and Q6_K). Returns false,
// copying nothing, when one of them is only 2-byte aligned (cp.async moves
// 4, 8 or 16 bytes).
static __device__ __forceinline__ bool copy_async(uint8_t *dst, const uint8_t *src, int nbytes,
                                                  int tid, int nthreads) {
    const uintptr_t al = (uintptr_t)src | (uintptr_t)dst | (uintptr_t)nbytes;
    if ((al & 15u) == 0)
        copy_units_async<16>(dst, src, nbytes, tid, nthreads);
    else if ((al & 7u) == 0)
        copy_units_async<8>(dst, src, nbytes, tid, nthreads);
    else if ((al & 3u) == 0)
        copy_units_async<4>(dst, src, nbytes, tid, nthreads);
    else
        return false;
    return true;
}

// Requests the weights of a warp's item into its slot: both rows' chunks of
// the step at sub-block sb0. Rows only 2-byte aligned are copied at once
// (correct, not overlapped).
template <int T>
static __device__ __forceinline__ void mvq_pipe_fetch(const mvq_args &a, unsigned int pair,
                                                      size_t w_off, int64_t sb0, uint8_t *slot,
                                                      int lane) {
    typedef mvq_traits<T> tr;
    const int nsb = mvq_step_subs(a.n_in / 32, sb0);
    const uint8_t *rows[MVQ_ROWS];
    mvq_rows_of(a, mvq_pair_of(a, pair), w_off, rows);
    const int64_t off = sb0 / tr::subs * qtype<T>::bytes;
    const int nbytes = nsb / tr::subs * qtype<T>::bytes;
#pragma unroll
    for (int r = 0; r < MVQ_ROWS; r++) {
        uint8_t *dst = slot + r * (tr::chunk + 16);
        if (!copy_async(dst, rows[r] + off, nbytes, lane, VELA_WARP))
            warp_copy_w<T>(dst, rows[r] + off, nbytes, lane);
    }
}

template <int T, int NT>
__global__ static void __launch_bounds__(MVQ_WARPS *VELA_WARP)
    matvec_q8_pipe_kernel(const mvq_args a) {
    typedef mvq_pipe<T> pp;
    constexpr int S = pp::stages;
    extern __shared__ __align__(16) uint8_t mvq_smem[];
    __shared__ float red[2][MVQ_WARPS][MVQ_ROWS][NT]; // by pair parity: one barrier per pair
    cuda_pdl_wait();
    const int warp = threadIdx.x / VELA_WARP, lane = threadIdx.x % VELA_WARP;
    const mvq_ex ex = mvq_ex_of(a);
    uint8_t *xs = mvq_smem; // [n_tok][n_in / 32][36], as in global memory
    uint8_t *slots = mvq_smem + a.xs_bytes + (size_t)warp * S * pp::slot;

    const unsigned int n_all = a.first_pair[CUDA_MV_MAX_SEGS];
    const unsigned int p_first = blockIdx.x * (unsigned int)a.pairs_per_block;
    const unsigned int left = n_all - p_first;
    const int n_pairs = (int)(left < (unsigned int)a.pairs_per_block ? left : a.pairs_per_block);
    const int64_t n_sub = a.n_in / 32;
    const int n_steps = (int)((n_sub + MVQ_STEP - 1) / MVQ_STEP);
    const int my_steps = warp < n_steps ? (n_steps - 1 - warp) / MVQ_WARPS + 1 : 0;
    const int jb = lane / mvq_traits<T>::subs, j = lane % mvq_traits<T>::subs; // as in mvq_step
    // Item (pair k, step s) of this warp: step warp + s * 4 of pair
    // p_first + k. fetch(k, s, slot): that item's weights into a slot,
    // where the item exists (k < n_pairs); an empty group otherwise.
    auto fetch = [&](int k, int s, int slot) {
        if (k < n_pairs)
            mvq_pipe_fetch<T>(a, p_first + (unsigned int)k, ex.w_off,
                              (int64_t)(warp + s * MVQ_WARPS) * MVQ_STEP, slots + slot * pp::slot,
                              lane);
        __pipeline_commit(); // empty groups keep the count uniform
    };
    // The item S - 1 after (k, s), found without a division: s + S - 1
    // carried into k (my_steps may be 1, so possibly more than once).
    auto fetch_ahead = [&](int k, int s, int slot) {
        s += S - 1;
        while (s >= my_steps) {
            s -= my_steps;
            k++;
        }
        fetch(k, s, slot + S - 1 < S ? slot + S - 1 : slot - 1);
    };

    // The activations go with the first group: waited for, then made
    // visible to every warp, before the first item.
    // (xq and its rows are 4-byte aligned, checked at launch: always queued)
    copy_async(xs, ex.xq, (int)(a.n_tok * a.xq_row_bytes), threadIdx.x, MVQ_WARPS * VELA_WARP);
    // Items 0 .. S - 2 (slots 0 .. S - 2), as fetch_ahead would walk them.
    {
        int k = 0, s = 0;
#pragma unroll
        for (int i = 0; i < S - 1; i++) {
            fetch(my_steps > 0 ? k : n_pairs, s, i);
            if (++s >= my_steps) {
                s = 0;
                k++;
            }
        }
    }
    __pipeline_wait_prior(S - 2);
    __syncthreads();

    int slot = 0; // of the item decoded next
    for (int k = 0; k < n_pairs; k++) {
        float acc[MVQ_ROWS][NT];
#pragma unroll
        for (int r = 0; r < MVQ_ROWS; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[r][t] = 0.0f;
        for (int s = 0; s < my_steps; s++) {
            fetch_ahead(k, s, slot);      // item i + S - 1, i being this one
            __pipeline_wait_prior(S - 1); // this lane's copies of item i have landed
            __syncwarp();                 // and the other lanes'
            const int64_t sb0 = (int64_t)(warp + s * MVQ_WARPS) * MVQ_STEP;
            if (lane < mvq_step_subs(n_sub, sb0))
                mvq_step<T, NT>(acc, slots + slot * pp::slot, xs + sb0 * MVQ_XQ_BYTES,
                                (int)a.xq_row_bytes, jb, j, a.n_tok, lane);
            slot = slot + 1 == S ? 0 : slot + 1;
            __syncwarp(); // item i + S, fetched next, reuses this slot
        }
        mvq_to_red<NT>(red[k & 1][warp], acc, lane);
        __syncthreads();
        // Pair k + 2 writes red[k & 1] again only after every thread has
        // passed the barrier of pair k + 1, i.e. after this read.
        mvq_store<NT>(a, mvq_pair_of(a, p_first + (unsigned int)k), ex.out_off, red[k & 1],
                      threadIdx.x);
    }
    __pipeline_wait_prior(0);
}

// Shared memory of the pipelined kernel: every token's activations (rounded
// to 16 bytes), then each warp's slots.
static size_t mvq_pipe_xs_bytes(int n_tok, int64_t n_in) {
    return ((size_t)n_tok * (size_t)(n_in / 32) * MVQ_XQ_BYTES + 15) & ~(size_t)15;
}

// ---------------------------------------------------------------------------
// streaming mat-vec (CUDA_MVQ_STREAM)
//
// A persistent grid of a few blocks per multiprocessor, MVS_WARPS warps each.
// Warp g of the grid's G (g = blockIdx.x * MVS_WARPS + warp) owns the row
// pairs g, g + G, g + 2G, ... whole: it walks every step of a pair (MVQ_STEP
// sub-blocks, lane l the sub-block l, as in the other kernels) through its
// own ring of S slots, requesting the weights of the item S - 1 ahead with
// cp.async (16-byte units where the rows are 16-byte aligned) before it
// decodes the current one. Items run on from one pair into the next, so the
// ring does not drain between rows and a warp keeps S - 1 items of weights in
// flight from its first row to its last. Every token's activations are
// copied into shared memory once, at the start, with the first items: the
// block's one barrier. A pair's sums are the warp's own (each lane's terms
// over the steps in order, then the butterfly across lanes), stored by its
// lanes with the epilogue: no partial sums cross warps, no block barrier in
// the loop. That order differs from the one-pass kernel's (four warps'
// partial sums), and is fixed: results do not depend on the plan's grid.
#define MVS_WARPS 8

// Shared memory of the streaming kernel: the activations (as the pipelined
// kernel's), then each warp's ring.
template <int T> static size_t mvs_smem(int n_tok, int64_t n_in) {
    return mvq_pipe_xs_bytes(n_tok, n_in) +
           (size_t)MVS_WARPS * mvq_pipe<T>::stages * mvq_pipe<T>::slot;
}

// The most shared memory a streaming block may take under plan.
static size_t mvs_smem_limit(const struct cuda_mvq_plan *plan) {
    return plan && plan->smem_per_block > 0 ? (size_t)plan->smem_per_block : MVQ_PIPE_MAX_SMEM;
}

// The epilogue of a warp's row pair: v[r][t] the sums of row r for token t
// (every lane holds them); lane r * NT + t (lane t for the gated epilogues)
// writes its output, as mvq_store does with the block's sums.
template <int NT>
static __device__ __forceinline__ void mvs_store(const mvq_args &a, mvq_pair p, size_t out_off,
                                                 const float v[MVQ_ROWS][NT], int lane) {
    if (CUDA_MV_GATED(a.epi)) {
        float g = 0.0f, u = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == t) {
                g = v[0][t];
                u = v[1][t];
            }
        if (lane < a.n_tok)
            a.out[0][out_off + (size_t)lane * a.n_out[0] + p.o0] =
                a.epi == CUDA_MV_GEGLU ? vela_gelu_mul(g, u) : mvq_silu_mul(g, u);
        return;
    }
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < MVQ_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == r * NT + t)
                s = v[r][t];
    float *const oseg = p.seg == 0 ? a.out[0] : p.seg == 1 ? a.out[1] : a.out[2];
    const float *const bseg = p.seg == 0 ? a.bias[0] : p.seg == 1 ? a.bias[1] : a.bias[2];
    const int64_t nseg = p.seg == 0 ? a.n_out[0] : p.seg == 1 ? a.n_out[1] : a.n_out[2];
    const int r = lane / NT, t = lane % NT;
    if (r < MVQ_ROWS && t < a.n_tok && p.o0 + r < nseg) {
        const int64_t o = p.o0 + r;
        if (bseg)
            s = s + bseg[o];
        float *dst = oseg + out_off + (size_t)t * nseg + o;
        *dst = a.epi == CUDA_MV_ADD ? *dst + s : s;
    }
}

template <int T, int NT>
__global__ static void __launch_bounds__(MVS_WARPS *VELA_WARP)
    matvec_q8_stream_kernel(const mvq_args a) {
    typedef mvq_pipe<T> pp;
    constexpr int S = pp::stages;
    extern __shared__ __align__(16) uint8_t mvq_smem[];
    cuda_pdl_wait();
    const int warp = threadIdx.x / VELA_WARP, lane = threadIdx.x % VELA_WARP;
    const mvq_ex ex = mvq_ex_of(a);
    uint8_t *slots = mvq_smem + a.xs_bytes + (size_t)warp * S * pp::slot;

    const unsigned int n_all = a.first_pair[CUDA_MV_MAX_SEGS];
    const unsigned int stride = gridDim.x * MVS_WARPS;
    const unsigned int g = blockIdx.x * MVS_WARPS + (unsigned int)warp;
    const int64_t n_sub = a.n_in / 32;
    const int n_steps = (int)((n_sub + MVQ_STEP - 1) / MVQ_STEP);
    const int jb = lane / mvq_traits<T>::subs, j = lane % mvq_traits<T>::subs; // as in mvq_step
    // The fetch cursor: step fs of pair fp (fp >= n_all: nothing left, an
    // empty group keeps the count of groups uniform).
    unsigned int fp = g;
    int fs = 0;
    auto fetch_next = [&](int slot) {
        if (fp < n_all) {
            mvq_pipe_fetch<T>(a, fp, ex.w_off, (int64_t)fs * MVQ_STEP, slots + slot * pp::slot,
                              lane);
            if (++fs == n_steps) {
                fs = 0;
                fp += stride;
            }
        }
        __pipeline_commit();
    };

    // The activations go with the first group: waited for, then made visible
    // to every warp (xq and its rows are 4-byte aligned, checked at launch:
    // always queued).
    copy_async(mvq_smem, ex.xq, (int)(a.n_tok * a.xq_row_bytes), threadIdx.x,
               MVS_WARPS * VELA_WARP);
#pragma unroll
    for (int i = 0; i < S - 1; i++)
        fetch_next(i);
    __pipeline_wait_prior(S - 2);
    __syncthreads();

    int slot = 0; // of the item decoded next; item i + S - 1 goes to the one before it
    for (unsigned int p = g; p < n_all; p += stride) {
        float acc[MVQ_ROWS][NT] = {};
        for (int s = 0; s < n_steps; s++) {
            fetch_next(slot == 0 ? S - 1 : slot - 1);
            __pipeline_wait_prior(S - 1); // this lane's copies of this item have landed
            __syncwarp();                 // and the other lanes'
            const int64_t sb0 = (int64_t)s * MVQ_STEP;
            if (lane < mvq_step_subs(n_sub, sb0))
                mvq_step<T, NT>(acc, slots + slot * pp::slot, mvq_smem + sb0 * MVQ_XQ_BYTES,
                                (int)a.xq_row_bytes, jb, j, a.n_tok, lane);
            slot = slot + 1 == S ? 0 : slot + 1;
            __syncwarp(); // the next fetch reuses this slot
        }
        float v[MVQ_ROWS][NT];
#pragma unroll
        for (int r = 0; r < MVQ_ROWS; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                v[r][t] = t < a.n_tok ? warp_sum(acc[r][t]) : 0.0f;
        mvs_store<NT>(a, mvq_pair_of(a, p), ex.out_off, v, lane);
    }
    __pipeline_wait_prior(0);
}

template <int T, int NT>
static int matvec_q8_launch(const mvq_args &a, unsigned int n_blocks, unsigned int n_y, int kernel,
                            size_t smem_limit, bool pdl, cudaStream_t stream, struct verr *err) {
    const dim3 grid(n_blocks, n_y);
    if (kernel != CUDA_MVQ_PASS) {
        const bool st = kernel == CUDA_MVQ_STREAM;
        const size_t smem = (size_t)a.xs_bytes + (size_t)(st ? MVS_WARPS : MVQ_WARPS) *
                                                     mvq_pipe<T>::stages * mvq_pipe<T>::slot;
        // Over the default 48 KiB (the pipelined kernel's static `red`
        // included, up to 512 bytes): opt in, to the streaming kernel's
        // limit or 96 KiB. raised[0]: pipelined, [1]: streaming.
        static std::atomic<int> raised[2][64];
        const int rc =
            st ? cuda_raise_smem(matvec_q8_stream_kernel<T, NT>, raised[1], smem, smem_limit, err)
               : cuda_raise_smem(matvec_q8_pipe_kernel<T, NT>, raised[0], smem, MVQ_PIPE_MAX_SMEM,
                                 err);
        if (rc)
            return rc;
        if (st)
            cuda_launch(pdl, matvec_q8_stream_kernel<T, NT>, grid, MVS_WARPS * VELA_WARP, smem,
                        stream, a);
        else
            cuda_launch(pdl, matvec_q8_pipe_kernel<T, NT>, grid, MVQ_WARPS * VELA_WARP, smem,
                        stream, a);
        VELA_CHECK_LAUNCH(err, st ? "matvec_q8_stream_kernel" : "matvec_q8_pipe_kernel");
        return VERR_OK;
    }
    const size_t smem = (size_t)MVQ_WARPS * a.warp_smem;
    cuda_launch(pdl, matvec_q8_kernel<T, NT>, grid, MVQ_WARPS * VELA_WARP, smem, stream, a);
    VELA_CHECK_LAUNCH(err, "matvec_q8_kernel");
    return VERR_OK;
}

template <int T> static bool mvq_pipe_fits(int n_tok, int64_t n_in) {
    return mvq_pipe_xs_bytes(n_tok, n_in) +
               (size_t)MVQ_WARPS * mvq_pipe<T>::stages * mvq_pipe<T>::slot <=
           MVQ_PIPE_MAX_SMEM;
}

// The kernel that runs type at n_tok x n_in under plan (enum cuda_mvq_kernel):
// the one asked for where its shared memory fits; the streaming kernel
// falls back to the pipelined kernel's rule.
template <int T> static int mvq_kernel_for(int n_tok, int64_t n_in, const cuda_mvq_plan *plan) {
    if (!plan)
        return CUDA_MVQ_PASS;
    if (plan->kernel == CUDA_MVQ_STREAM && mvs_smem<T>(n_tok, n_in) <= mvs_smem_limit(plan))
        return CUDA_MVQ_STREAM;
    if (plan->kernel != CUDA_MVQ_PASS && mvq_pipe_fits<T>(n_tok, n_in))
        return CUDA_MVQ_PIPE;
    return CUDA_MVQ_PASS;
}

extern "C" int cuda_matvec_q8_kernel(enum ggml_type type, int64_t n_in, int n_tok,
                                     const struct cuda_mvq_plan *plan) {
    if (!plan || plan->kernel < CUDA_MVQ_PASS || plan->kernel > CUDA_MVQ_STREAM || n_in <= 0 ||
        n_in % 32 || n_tok < 1 || n_tok > CUDA_MATVEC_MAX_TOK || !quant_q8_1_dot_supported(type))
        return CUDA_MVQ_PASS;
    auto pick = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        if constexpr (!mvq_traits<T>::dp4a)
            return CUDA_MVQ_PASS;
        else
            return mvq_kernel_for<T>(n_tok, n_in, plan);
    };
    return VELA_DISPATCH_QTYPE_MX(type, pick, CUDA_MVQ_PASS);
}

// Row pairs per block of the pipelined kernel: the pairs spread over
// sm_count * blocks_per_sm blocks, at most as many per multiprocessor as its
// shared memory holds at once (1 KiB of it reserved per block, and the
// kernel's static `red`), so that the grid is one wave
// (plan->pairs_per_block > 0 overrides).
static int mvq_pairs_per_block(const struct cuda_mvq_plan *plan, unsigned int n_pairs,
                               size_t smem) {
    if (plan->pairs_per_block > 0)
        return plan->pairs_per_block;
    int64_t bps = plan->blocks_per_sm > 0 ? plan->blocks_per_sm : CUDA_MVQ_PIPE_BLOCKS_PER_SM;
    const int64_t fit = plan->smem_per_sm > 0 ? plan->smem_per_sm / (int64_t)(smem + 1536) : bps;
    if (bps > fit)
        bps = fit > 0 ? fit : 1;
    const int64_t blocks = (plan->sm_count > 0 ? plan->sm_count : 1) * bps;
    const int64_t k = ((int64_t)n_pairs + blocks - 1) / blocks;
    return (int)(k > 0 ? k : 1);
}

// Blocks of the streaming kernel (cuda_stream_blocks): row pairs streamed,
// at most plan->pairs_per_block per warp where set.
static unsigned int mvs_blocks(const struct cuda_mvq_plan *plan, unsigned int n_pairs,
                               unsigned int n_y, size_t smem) {
    return cuda_stream_blocks(plan->sm_count, plan->smem_per_sm,
                              plan->blocks_per_sm > 0 ? plan->blocks_per_sm
                                                      : CUDA_MVQ_STREAM_BLOCKS_PER_SM,
                              n_pairs, n_y, smem, MVS_WARPS, plan->pairs_per_block);
}

// cuda_matvec_q8_segs, and with ex its expert mode (cuda_matvec_q8_experts).
static int mvq_segs(const struct cuda_mv_seg *segs, int n_seg, enum ggml_type type, int64_t n_in,
                    const void *xq, int n_tok, enum cuda_mv_epilogue epi,
                    const struct cuda_mvq_plan *plan, const struct cuda_mv_experts *ex,
                    cudaStream_t stream, struct verr *err) {
    if (ex && (n_tok != 1 || !ex->ids || ex->n_pairs < 0 || ex->n_expert < 1 || ex->x_div < 1 ||
               n_seg != (CUDA_MV_GATED(epi) ? 2 : 1)))
        return verr_set(err, VERR_RANGE,
                        "matvec q8 experts: n_tok %d, %d segments, ids %p, %d pairs, %d experts, "
                        "x_div %d: need one token, one segment (two gated), ids and positive "
                        "counts",
                        n_tok, n_seg, (const void *)ex->ids, ex->n_pairs, ex->n_expert, ex->x_div);
    if (ex && ex->n_pairs == 0)
        return VERR_OK;
    if (n_tok < 1 || n_tok > CUDA_MATVEC_MAX_TOK)
        return verr_set(err, VERR_RANGE, "matvec q8: n_tok %d outside [1, %d]", n_tok,
                        CUDA_MATVEC_MAX_TOK);
    if (!segs || n_seg < 1 || n_seg > CUDA_MV_MAX_SEGS)
        return verr_set(err, VERR_RANGE, "matvec q8: %d segments (need 1..%d)", n_seg,
                        CUDA_MV_MAX_SEGS);
    if (epi != CUDA_MV_STORE && epi != CUDA_MV_ADD && !CUDA_MV_GATED(epi))
        return verr_set(err, VERR_RANGE, "matvec q8: unknown epilogue %d", (int)epi);
    if (!quant_q8_1_dot_supported(type))
        return verr_set(err, VERR_UNSUPPORTED, "matvec q8: weight type %s is not supported",
                        ggml_type_name(type));
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    if (n_in <= 0 || row_bytes == 0)
        return verr_set(err, VERR_RANGE, "matvec q8: %s row of %lld elements is not whole blocks",
                        ggml_type_name(type), (long long)n_in);
    if (!xq || ((uintptr_t)xq & 3u) != 0)
        return verr_set(err, VERR_RANGE, "matvec q8: q8_1 activations %p are not 4-byte aligned",
                        xq);
    if (CUDA_MV_GATED(epi) &&
        (n_seg != 2 || segs[0].n_out != segs[1].n_out || segs[0].bias || segs[1].bias))
        return verr_set(err, VERR_RANGE,
                        "matvec q8: swiglu/geglu takes 2 segments of equal n_out and no bias");
    mvq_args a;
    memset(&a, 0, sizeof a);
    unsigned int n_pairs = 0;
    for (int s = 0; s < n_seg; s++) {
        const struct cuda_mv_seg *g = &segs[s];
        if (g->n_out < 0)
            return verr_set(err, VERR_RANGE, "matvec q8: segment %d has n_out %lld", s,
                            (long long)g->n_out);
        if (g->n_out > 0 && (!g->w || ((uintptr_t)g->w & 15u) != 0))
            return verr_set(err, VERR_RANGE,
                            "matvec q8: segment %d weights %p are not 16-byte aligned", s, g->w);
        const bool needs_out = !CUDA_MV_GATED(epi) || s == 0;
        if (g->n_out > 0 && needs_out && (!g->out || ((uintptr_t)g->out & 3u) != 0))
            return verr_set(err, VERR_RANGE,
                            "matvec q8: segment %d output %p is NULL or not 4-byte aligned", s,
                            (void *)g->out);
        if (g->bias && ((uintptr_t)g->bias & 3u) != 0)
            return verr_set(err, VERR_RANGE, "matvec q8: segment %d bias %p is not 4-byte aligned",
                            s, (const void *)g->bias);
        a.out[s] = g->out;
        a.w[s] = (const uint8_t *)g->w;
        a.bias[s] = g->bias;
        a.n_out[s] = g->n_out;
        a.first_pair[s] = n_pairs;
        const int64_t np =
            CUDA_MV_GATED(epi) ? (s == 0 ? g->n_out : 0) : (g->n_out + MVQ_ROWS - 1) / MVQ_ROWS;
        if (np > (int64_t)INT32_MAX - n_pairs)
            return verr_set(err, VERR_RANGE, "matvec q8: %lld output rows are too many",
                            (long long)g->n_out);
        n_pairs += (unsigned int)np;
    }
    for (int s = n_seg; s <= CUDA_MV_MAX_SEGS; s++)
        a.first_pair[s] = n_pairs;
    if (n_pairs == 0)
        return VERR_OK;
    if (plan && (plan->kernel < CUDA_MVQ_PASS || plan->kernel > CUDA_MVQ_STREAM ||
                 plan->sm_count < 0 || plan->smem_per_sm < 0 || plan->smem_per_block < 0 ||
                 plan->blocks_per_sm < 0 || plan->pairs_per_block < 0))
        return verr_set(err, VERR_RANGE,
                        "matvec q8: plan {kernel %d, sm_count %d, smem_per_sm %d, "
                        "smem_per_block %d, blocks_per_sm %d, pairs_per_block %d}: need kernel "
                        "0..2 and no negative counts",
                        plan->kernel, plan->sm_count, plan->smem_per_sm, plan->smem_per_block,
                        plan->blocks_per_sm, plan->pairs_per_block);
    a.xq = (const uint8_t *)xq;
    a.row_bytes = row_bytes;
    a.xq_row_bytes = (size_t)(n_in / 32) * MVQ_XQ_BYTES;
    a.n_in = n_in;
    a.n_tok = n_tok;
    a.epi = (int)epi;
    // Expert mode: the grid's y walks the pairs, at most 65535 per launch.
    const int n_y_all = ex ? ex->n_pairs : 1;
    if (ex) {
        a.ids = ex->ids;
        a.expert_bytes = (size_t)segs[0].n_out * row_bytes;
        a.n_expert = ex->n_expert;
        a.x_div = ex->x_div;
    }
    const size_t smem_limit = mvs_smem_limit(plan);
    // The expert mode (MoE decode, cuda/moe.cu beside it) launches without pdl.
    const bool pdl = plan && plan->pdl && !ex;
    auto run = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        typedef mvq_traits<T> tr;
        if constexpr (!tr::dp4a) { // refused above (quant_q8_1_dot_supported); no instance
            return verr_set(err, VERR_UNSUPPORTED, "matvec q8: weight type %s is not supported",
                            ggml_type_name(type));
        } else {
            // Shared slice per warp: activations, then the staged weight
            // chunks with 16 bytes of slack each (sh_words reads one word
            // past a block).
            a.warp_smem = n_tok * MVQ_STEP * MVQ_XQ_BYTES + MVQ_ROWS * (tr::chunk + 16);
            a.warp_smem = (a.warp_smem + 15) & ~15;
            // The kernel asked for where its shared memory (all tokens'
            // activations, the warps' slots) fits (mvq_kernel_for).
            a.xs_bytes = (int)mvq_pipe_xs_bytes(n_tok, n_in);
            const int kernel = mvq_kernel_for<T>(n_tok, n_in, plan);
            const unsigned int n_y_max = (unsigned int)(n_y_all < 65535 ? n_y_all : 65535);
            unsigned int n_blocks = n_pairs;
            if (kernel == CUDA_MVQ_STREAM) {
                n_blocks = mvs_blocks(plan, n_pairs, n_y_max, mvs_smem<T>(n_tok, n_in));
            } else if (kernel == CUDA_MVQ_PIPE) {
                a.pairs_per_block = mvq_pairs_per_block(
                    plan, n_pairs * n_y_max,
                    a.xs_bytes + (size_t)MVQ_WARPS * mvq_pipe<T>::stages * mvq_pipe<T>::slot);
                n_blocks =
                    (unsigned int)(((int64_t)n_pairs + a.pairs_per_block - 1) / a.pairs_per_block);
            }
            // NT is the register tile of tokens; n_tok 3..8 share the widest
            // (an NT = 4 instance made ptxas spill a few bytes for some types).
            for (int p0 = 0; p0 < n_y_all; p0 += 65535) {
                a.pair0 = p0;
                const unsigned int n_y =
                    (unsigned int)(n_y_all - p0 < 65535 ? n_y_all - p0 : 65535);
                int rc;
                if (n_tok == 1)
                    rc = matvec_q8_launch<T, 1>(a, n_blocks, n_y, kernel, smem_limit, pdl, stream,
                                                err);
                else if (n_tok == 2)
                    rc = matvec_q8_launch<T, 2>(a, n_blocks, n_y, kernel, smem_limit, pdl, stream,
                                                err);
                else
                    rc = matvec_q8_launch<T, CUDA_MATVEC_MAX_TOK>(a, n_blocks, n_y, kernel,
                                                                  smem_limit, pdl, stream, err);
                if (rc)
                    return rc;
            }
            return VERR_OK;
        }
    };
    return VELA_DISPATCH_QTYPE_MX(type, run, VERR_UNSUPPORTED);
}

extern "C" int cuda_matvec_q8_segs(const struct cuda_mv_seg *segs, int n_seg, enum ggml_type type,
                                   int64_t n_in, const void *xq, int n_tok,
                                   enum cuda_mv_epilogue epi, const struct cuda_mvq_plan *plan,
                                   cudaStream_t stream, struct verr *err) {
    return mvq_segs(segs, n_seg, type, n_in, xq, n_tok, epi, plan, NULL, stream, err);
}

extern "C" int cuda_matvec_q8_experts(const struct cuda_mv_seg *segs, int n_seg,
                                      enum ggml_type type, int64_t n_in, const void *xq,
                                      const struct cuda_mv_experts *ex, enum cuda_mv_epilogue epi,
                                      const struct cuda_mvq_plan *plan, cudaStream_t stream,
                                      struct verr *err) {
    if (!ex)
        return verr_set(err, VERR_RANGE, "matvec q8 experts: no expert ids");
    return mvq_segs(segs, n_seg, type, n_in, xq, 1, epi, plan, ex, stream, err);
}
