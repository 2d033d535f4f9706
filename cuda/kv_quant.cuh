// K/V cache rows of any cache type on the device: decoding for attention
// (runs of 8 elements, or one) and encoding for the KV store and the shift.
// The types are those of backend_cache_type_ok and
// backend_cache_type_quantized: f32, f16, bf16 and the 32-element blocks
// q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (llama.cpp's layouts, gguf/quant.c).
// The type is a run-time argument (one switch per run), so a kernel that
// reads "any cache" is instantiated once, not once per type.
//
// Decoding computes each value with gguf/quant.c's expression and roundings
// (mul_rn / add_rn: never fused into an FMA), so a row decodes to the bits
// the CPU backend's attention reads. Encoding is gguf/quant.c's quantizer
// (qz_* and the iq4_nl scale search) statement for statement, with the same
// roundings (float division is IEEE on the device; no FMA contraction), so
// the blocks are bit-identical to quant_quantize_row's for the same floats.
// Unlike quant_quantize_row it cannot fail: a non-finite value or one beyond
// the f16 block scale is stored as the arithmetic gives it (the CPU store
// refuses the token instead).
//
// Addressing is by element: element e of a cache (all rows back to back)
// lives in block e / block_size. Alignment: the element's (f32: 4 bytes,
// otherwise 2: blocks are read as 2-byte words), so a layer of a cache may
// start anywhere its rows do; runs of 8 start at a multiple of 8 (within one
// block).
#ifndef VELA_CUDA_KV_QUANT_CUH
#define VELA_CUDA_KV_QUANT_CUH

#include <float.h>

#include "cuda/dequant.cuh"

// Elements per block and bytes per block of cache type t (0 bytes: not a
// cache type).
static __host__ __device__ __forceinline__ int kvq_block(int t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16 ? 1 : 32;
}
static __host__ __device__ __forceinline__ int kvq_block_bytes(int t) {
    switch (t) {
    case GGML_TYPE_F32:
        return 4;
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
        return 2;
    case GGML_TYPE_Q8_0:
        return 34;
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_IQ4_NL:
        return 18;
    case GGML_TYPE_Q4_1:
        return 20;
    case GGML_TYPE_Q5_0:
        return 22;
    case GGML_TYPE_Q5_1:
        return 24;
    default:
        return 0;
    }
}
static __host__ __device__ __forceinline__ bool kvq_is_cache_type(int t) {
    return kvq_block_bytes(t) > 0;
}
// Bytes of a row of n elements (n a multiple of the block).
static __host__ __device__ __forceinline__ size_t kvq_row_bytes(int t, int64_t n) {
    return (size_t)(n / kvq_block(t)) * (size_t)kvq_block_bytes(t);
}

// The element type of a kernel instantiated for caches of any type (the
// types read at run time: cuda_attn.type_k / type_v).
struct kvq_any {};

// A cache of any type seen as a pointer to its elements: p + n is element
// e + n (as for a float or half pointer), read with kvq_get1.
struct kvq_ptr {
    const uint8_t *base;
    int type;
    size_t e;
};
static __device__ __forceinline__ kvq_ptr operator+(kvq_ptr p, size_t n) {
    p.e += n;
    return p;
}

// IQ4_NL's level k (gguf/quant.h, quant_iq4_levels), from the packed words
// of iq4_levels8: no table in local or constant memory.
static __device__ __forceinline__ int kvq_iq4_level(int k) {
    const uint32_t w = k < 4    ? 0xbfad9881u
                       : k < 8  ? 0xf6eaddcfu
                       : k < 12 ? 0x26190d01u
                                : 0x71594535u;
    return (int)(int8_t)(w >> (8 * (k & 3)));
}

// Elements e0 .. e0 + 7 of cache `base` of type t into v (e0 % 8 == 0).
static __device__ __forceinline__ void kvq_dequant8(int t, const uint8_t *base, size_t e0,
                                                    float *v) {
    if (t == GGML_TYPE_F32) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = ((const float *)base)[e0 + i];
        return;
    }
    if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint16_t h = ((const uint16_t *)base)[e0 + i];
            v[i] = t == GGML_TYPE_F16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
        }
        return;
    }
    const int bb = kvq_block_bytes(t), j0 = (int)(e0 & 31), lo = j0 & 15, hi = j0 >> 4;
    const uint8_t *b = base + (e0 >> 5) * bb;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b));
    switch (t) {
    case GGML_TYPE_Q8_0: {
        uint32_t q[2];
        ld_words_a2<2>(b + 2 + j0, q);
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = mul_rn((float)(int8_t)byte_at(q, i), d);
        return;
    }
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1: {
        const bool q1 = t == GGML_TYPE_Q4_1;
        const float m = q1 ? f16_bits_to_f32((uint16_t)ld_u16(b + 2)) : 0.0f;
        uint32_t q[2];
        ld_words_a2<2>(b + (q1 ? 4 : 2) + lo, q);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int n = hi ? byte_at(q, i) >> 4 : byte_at(q, i) & 0x0f;
            v[i] = q1 ? add_rn(mul_rn((float)n, d), m) : mul_rn((float)(n - 8), d);
        }
        return;
    }
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: {
        const bool q1 = t == GGML_TYPE_Q5_1;
        const float m = q1 ? f16_bits_to_f32((uint16_t)ld_u16(b + 2)) : 0.0f;
        const uint8_t *h = b + (q1 ? 4 : 2);
        const uint32_t qh = ld_u16(h) | (ld_u16(h + 2) << 16);
        uint32_t q[2];
        ld_words_a2<2>(h + 4 + lo, q);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int n = (hi ? byte_at(q, i) >> 4 : byte_at(q, i) & 0x0f) |
                          (int)(((qh >> (j0 + i)) & 1u) << 4);
            v[i] = q1 ? add_rn(mul_rn((float)n, d), m) : mul_rn((float)(n - 16), d);
        }
        return;
    }
    default: { // GGML_TYPE_IQ4_NL
        uint32_t q[2];
        ld_words_a2<2>(b + 2 + lo, q);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t l4, h4;
            iq4_levels8(q[k], &l4, &h4);
            const uint32_t s = hi ? h4 : l4;
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[4 * k + i] = mul_rn(d, (float)(int8_t)(s >> (8 * i)));
        }
        return;
    }
    }
}

// Element p.e of cache p (any e): the same value as kvq_dequant8's.
static __device__ __forceinline__ float kvq_get1(kvq_ptr p) {
    if (p.type == GGML_TYPE_F32)
        return ((const float *)p.base)[p.e];
    if (p.type == GGML_TYPE_F16)
        return f16_bits_to_f32(((const uint16_t *)p.base)[p.e]);
    if (p.type == GGML_TYPE_BF16)
        return bf16_bits_to_f32(((const uint16_t *)p.base)[p.e]);
    float v[8];
    kvq_dequant8(p.type, p.base, p.e & ~(size_t)7, v);
    float r = v[0];
#pragma unroll
    for (int i = 1; i < 8; i++)
        r = (int)(p.e & 7) == i ? v[i] : r; // a select, not a local-memory index
    return r;
}

// --- encoding: gguf/quant.c's quantizers, statement for statement ------------

static __device__ __forceinline__ float kvq_clampf(float v, float lo, float hi) {
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}
static __device__ __forceinline__ int kvq_trunc_clamp(float v, float top) {
    return (int)kvq_clampf(v, 0.0f, top);
}
static __device__ __forceinline__ int kvq_round_half_away(float v) {
    const int t = (int)v;
    const float frac = __fsub_rn(v, (float)t);
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}
static __device__ __forceinline__ void kvq_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}
static __device__ __forceinline__ uint16_t kvq_f16_bits(float f) {
    return __half_as_ushort(__float2half_rn(f));
}
static __device__ __forceinline__ float kvq_signed_absmax(const float *x) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            vmax = x[j];
        }
    }
    return vmax;
}
static __device__ __forceinline__ void kvq_minmax(const float *x, float *lo, float *hi) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < mn)
            mn = x[j];
        if (x[j] > mx)
            mx = x[j];
    }
    *lo = mn;
    *hi = mx;
}

// quant.c's iq4_nearest: the nearest level's index (the lower one on a tie).
static __device__ __forceinline__ int kvq_iq4_nearest(float v) {
    if (!(v > (float)kvq_iq4_level(0)))
        return 0;
    if (v >= (float)kvq_iq4_level(15))
        return 15;
    int lo = 0;
    for (int k = 1; k < 15; k++)
        lo += v >= (float)kvq_iq4_level(k);
    return __fsub_rn(v, (float)kvq_iq4_level(lo)) <= __fsub_rn((float)kvq_iq4_level(lo + 1), v)
               ? lo
               : lo + 1;
}

// quant.c's iq4_error (x^2-weighted squared error, in double).
static __device__ double kvq_iq4_error(const float *x, float d) {
    double e = 0.0;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        const double lv = kvq_iq4_level(kvq_iq4_nearest(__fmul_rn(x[j], id)));
        const double r = __dsub_rn((double)x[j], __dmul_rn((double)d, lv));
        e = __dadd_rn(e, __dmul_rn(__dmul_rn(__dmul_rn((double)x[j], (double)x[j]), r), r));
    }
    return e;
}

// quant.c's iq4_group_scale: 15 candidate scales, the least-squares d of each.
static __device__ float kvq_iq4_scale(const float *x) {
    const float vmax = kvq_signed_absmax(x);
    if (vmax == 0.0f)
        return 0.0f;
    float best_d = vmax / (float)kvq_iq4_level(0);
    double best_e = kvq_iq4_error(x, best_d);
    for (int t = -7; t <= 7; t++) {
        const float id = (float)(kvq_iq4_level(0) + t) / vmax;
        double sqx = 0.0, sq2 = 0.0;
        for (int j = 0; j < 32; j++) {
            const double q = kvq_iq4_level(kvq_iq4_nearest(__fmul_rn(x[j], id)));
            const double w = __dmul_rn((double)x[j], (double)x[j]);
            sqx = __dadd_rn(sqx, __dmul_rn(__dmul_rn(w, q), (double)x[j]));
            sq2 = __dadd_rn(sq2, __dmul_rn(__dmul_rn(w, q), q));
        }
        if (sq2 <= 0.0)
            continue;
        const float d = (float)(sqx / sq2);
        const double e = kvq_iq4_error(x, d);
        if (e < best_e) {
            best_e = e;
            best_d = d;
        }
    }
    return best_d;
}

// One block of 32 floats x into b (t a 32-element type): quant.c's qz_*.
static __device__ void kvq_quantize32(int t, const float *x, uint8_t *b) {
    if (t == GGML_TYPE_Q8_0) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        kvq_put_u16(b, kvq_f16_bits(d));
        for (int j = 0; j < 32; j++)
            b[2 + j] = (uint8_t)(int8_t)kvq_round_half_away(
                kvq_clampf(__fmul_rn(x[j], id), -127.0f, 127.0f));
        return;
    }
    if (t == GGML_TYPE_IQ4_NL) {
        const uint16_t d16 = kvq_f16_bits(kvq_iq4_scale(x));
        kvq_put_u16(b, d16);
        const float d = f16_bits_to_f32(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 16; j++)
            b[2 + j] = (uint8_t)(kvq_iq4_nearest(__fmul_rn(x[j], id)) |
                                 kvq_iq4_nearest(__fmul_rn(x[j + 16], id)) << 4);
        return;
    }
    // q4_0 / q5_0: d from the signed extreme; q4_1 / q5_1: d and min.
    const bool five = t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q5_1;
    const bool with_min = t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_1;
    const float top = five ? 31.0f : 15.0f;
    float d, mn = 0.0f, off;
    if (with_min) {
        float mx;
        kvq_minmax(x, &mn, &mx);
        d = __fsub_rn(mx, mn) / top;
        off = 0.5f;
    } else {
        d = kvq_signed_absmax(x) / (five ? -16.0f : -8.0f);
        off = five ? 16.5f : 8.5f;
    }
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    kvq_put_u16(b, kvq_f16_bits(d));
    if (with_min)
        kvq_put_u16(b + 2, kvq_f16_bits(mn));
    uint8_t *qs = b + (with_min ? 4 : 2) + (five ? 4 : 0);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const float x0 = with_min ? __fsub_rn(x[j], mn) : x[j];
        const float x1 = with_min ? __fsub_rn(x[j + 16], mn) : x[j + 16];
        const int q0 = kvq_trunc_clamp(__fadd_rn(__fmul_rn(x0, id), off), top);
        const int q1 = kvq_trunc_clamp(__fadd_rn(__fmul_rn(x1, id), off), top);
        qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    if (five) {
        uint8_t *h = b + (with_min ? 4 : 2);
        for (int k = 0; k < 4; k++)
            h[k] = (uint8_t)(qh >> (8 * k));
    }
}

// quant.c's f32 -> bf16 (round to nearest even, NaN kept quiet).
static __device__ __forceinline__ uint16_t kvq_bf16_bits(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

// Row x [n] (n a multiple of t's block) encoded into dst (the row's first
// byte), work shared by threads tid = 0 .. nth - 1: one element, or one
// block of 32, a thread at a time.
static __device__ __forceinline__ void kvq_store_row(int t, const float *x, uint8_t *dst, int n,
                                                     int tid, int nth) {
    if (t == GGML_TYPE_F32) {
        for (int i = tid; i < n; i += nth)
            ((float *)dst)[i] = x[i];
    } else if (t == GGML_TYPE_F16) {
        for (int i = tid; i < n; i += nth)
            ((__half *)dst)[i] = __float2half_rn(x[i]);
    } else if (t == GGML_TYPE_BF16) {
        for (int i = tid; i < n; i += nth)
            ((uint16_t *)dst)[i] = kvq_bf16_bits(x[i]);
    } else {
        const int bb = kvq_block_bytes(t);
        for (int blk = tid; blk < n / 32; blk += nth)
            kvq_quantize32(t, x + 32 * blk, dst + (size_t)blk * bb);
    }
}

#endif
