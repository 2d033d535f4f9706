// The kernels of the CPU q8 fast path (cpu_q8.h), written once and compiled
// once per ISA: the including file defines CPU_Q8_ROWS (the function's name)
// and CPU_Q8_VNNI (1: AVX-VNNI's vpdpbusd does the byte dots, 0: AVX2's
// vpmaddubsw + vpmaddwd), and is itself compiled for that ISA.
//
// The arithmetic, per 32-element sub-block of a weight row and a token (the
// names of quant_q8.h): the weights are unpacked to unsigned bytes u (Q8_0
// keeps its signed bytes, see below), the token's quants qx are signed bytes,
// and the exact integer sums give the term's integers:
//   S  = sum u*qx over the 32 elements, LO and HI its halves (elements 0..15,
//   16..31), sq = sum qx, sqh = sum qx over 16..31 (prepared with x)
//   Q4_0, Q5_0:  I = S - off*sq (off 8, 16: u = qw + off)   term = (d*dx)*I
//   Q8_0:        I = S (signed weights: |w| * sign(qx, w))   term = (d*dx)*I
//   Q4_1, Q5_1:  I = S, K = sq                 term = (d*dx)*I + (m*dx)*K
//   Q4_K, Q5_K:  I = sc*S, K = mn*sq           term = (d*dx)*I + (-dmin*dx)*K
//   Q6_K, Q3_K:  I = sc0*(LO - off*(sq-sqh)) + sc1*(HI - off*sqh)
//                (off 32, 4: u = qw + off)     term = (d*dx)*I
//   Q2_K:        I = sc0*LO + sc1*HI, K = m0*(sq-sqh) + m1*sqh
//                                              term = (d*dx)*I + (-dmin*dx)*K
//   IQ4_NL:      as Q8_0, the signed weights being the levels of the nibbles
//   MXFP4:       as IQ4_NL with its levels (-12..12), d = 2^(e-128) per block
//   IQ4_XS:      I = sc*S (S as Q8_0's)        term = (d*dx)*I
// which are the reference's integers and float expressions exactly
// (x + (-y) == x - y and (-a)*b == -(a*b) in IEEE arithmetic). vpmaddubsw
// adds pairs of u*qx into int16 with saturation: u <= 63 and |qx| <= 127 keep
// a pair below 16002; Q8_0's |w| <= 128 below 32512, so nothing saturates.
#include <immintrin.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "host/backend/cpu_q8.h"

#if !defined(CPU_Q8_ROWS) || !defined(CPU_Q8_FILL) || !defined(CPU_Q8_VNNI)
#error "define CPU_Q8_ROWS, CPU_Q8_FILL and CPU_Q8_VNNI before including cpu_q8_simd.h"
#endif

// How a type's integers become its term (the table above).
enum q8_kind {
    KIND_OFF,
    KIND_Q8_0,
    KIND_MIN,
    KIND_KQUANT,
    KIND_Q6_K,
    KIND_Q3_K,
    KIND_Q2_K,
    KIND_IQ4_XS
};

static inline __attribute__((always_inline)) enum q8_kind kind_of(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_MXFP4:
        return KIND_Q8_0;
    case GGML_TYPE_IQ4_XS:
        return KIND_IQ4_XS;
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
        return KIND_MIN;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
        return KIND_KQUANT;
    case GGML_TYPE_Q6_K:
        return KIND_Q6_K;
    case GGML_TYPE_Q3_K:
        return KIND_Q3_K;
    case GGML_TYPE_Q2_K:
        return KIND_Q2_K;
    default:
        return KIND_OFF;
    }
}

// One unpacked group of a row: its weights in the transposed layout of
// cpu_q8.h (u[m] holds bytes 4m..4m+3 of each of the 8 sub-blocks, so one
// byte-dot per m adds into one int32 lane per sub-block and no horizontal
// sums are needed) and the factors of the 8 terms, lane s for sub-block s.
// The factors are built in registers (no scalar stores read back as a
// vector, which stall store forwarding once per group).
struct q8_group {
    __m256i u[8]; // unsigned weights (Q8_0: see unpack_q8_0)
    __m256i s[8]; // Q8_0, IQ4_NL, IQ4_XS, MXFP4 on AVX2 only: the signed weights
    __m256 p;     // d (the scale of I)
    __m256 q;     // m or -dmin (the scale of K)
    __m256i c0;   // off, sc, or Q2_K/Q3_K/Q6_K's sc0 (elements 0..15)
    __m256i c1;   // mn, Q2_K/Q3_K/Q6_K's sc1 (elements 16..31), or IQ4_XS's scale
    __m256i c2;   // Q2_K's m0 (elements 0..15)
    __m256i c3;   // Q2_K's m1 (elements 16..31)
};

static inline float h2f(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | (p[1] << 8)));
}

static inline short ld16(const uint8_t *p) {
    return (short)(p[0] | (p[1] << 8));
}

// The f16 field at byte `off` of the 8 blocks (bs bytes each) from b, as
// floats (exact, as h2f); blocks s >= nsub give 0.
// A whole group (every group of a row but maybe the last) inserts the eight
// fields into a register one by one: filling a short[8] through a select and
// reading it back as one vector made GCC store the halves to the stack and
// load them again, a store-forwarding stall per group (Q4_0 and Q5_0 decode
// ran 20% slower than Q4_1, which reads twice the f16 fields).
static inline __attribute__((always_inline)) __m256 h2f8(const uint8_t *b, size_t bs, size_t off,
                                                         int nsub) {
    const uint8_t *p = b + off;
    if (nsub == 8)
        return _mm256_cvtph_ps(_mm_setr_epi16(ld16(p), ld16(p + bs), ld16(p + 2 * bs),
                                              ld16(p + 3 * bs), ld16(p + 4 * bs), ld16(p + 5 * bs),
                                              ld16(p + 6 * bs), ld16(p + 7 * bs)));
    short h[8];
    for (int s = 0; s < 8; s++)
        h[s] = s < nsub ? ld16(p + (size_t)s * bs) : 0;
    return _mm256_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]));
}

// Byte e of the result is 0x10 where bit e of qh is set, else 0.
static inline __m256i fifth_bits(uint32_t qh) {
    const __m256i which = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                            0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), which);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// 16 packed bytes -> 32 nibbles: low nibbles (elements 0..15), then high.
static inline __m256i nibbles16(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

// IQ4_NL / IQ4_XS (levels quant_iq4_levels), MXFP4 (quant_mxfp4_levels): 16
// packed bytes -> the 32 signed levels of their nibbles (one byte shuffle
// looks them up).
static inline __m256i levels16(const int8_t *levels, const uint8_t *qs) {
    const __m256i lv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels));
    return _mm256_shuffle_epi8(lv, nibbles16(qs));
}

// MXFP4's scales 2^(e-128) of the 8 blocks (17 bytes each) from b, exactly
// quant_e8m0_half_to_f32; blocks s >= nsub give 0.
static inline __attribute__((always_inline)) __m256 e8m0_8(const uint8_t *b, int nsub) {
    float d[8];
    for (int s = 0; s < 8; s++)
        d[s] = s < nsub ? quant_e8m0_half_to_f32(b[17 * s]) : 0.0f;
    return _mm256_setr_ps(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
}

// r[s] = the 8 dwords of sub-block s -> r[m] = dword m of every sub-block.
static inline __attribute__((always_inline)) void transpose8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2x128_si256(u[m], u[m + 4], 0x20);
        r[m + 4] = _mm256_permute2x128_si256(u[m], u[m + 4], 0x31);
    }
}

// Signed weights wg->s (natural layout) -> the transposed bytes the byte-dots
// take, and c0 (the offset those bytes carry). VNNI's vpdpbusd does not
// saturate: u = w + 128 (flip the sign bit), and the term's integer is
// S - 128 sq. AVX2's vpmaddubsw would saturate on w + 128: u = |w|, and the
// activations get w's sign (dot_group).
static inline __attribute__((always_inline)) void signed_weights(struct q8_group *wg) {
    transpose8(wg->s);
    for (int m = 0; m < 8; m++) {
#if CPU_Q8_VNNI
        wg->u[m] = _mm256_xor_si256(wg->s[m], _mm256_set1_epi8((char)0x80));
#else
        wg->u[m] = _mm256_abs_epi8(wg->s[m]);
#endif
    }
    wg->c0 = _mm256_set1_epi32(CPU_Q8_VNNI ? 128 : 0);
}

// Legacy 32-element blocks: sub-blocks s < nsub of group g (natural layout,
// before the transpose); the rest are zero with zero factors.
static inline __attribute__((always_inline)) void unpack_legacy(const enum ggml_type t,
                                                                const uint8_t *row, int64_t g,
                                                                int nsub, struct q8_group *wg) {
    const size_t bs = t == GGML_TYPE_Q4_0 || t == GGML_TYPE_IQ4_NL ? 18
                      : t == GGML_TYPE_MXFP4                       ? 17
                      : t == GGML_TYPE_Q4_1                        ? 20
                      : t == GGML_TYPE_Q5_0                        ? 22
                      : t == GGML_TYPE_Q5_1                        ? 24
                                                                   : 34;
    const uint8_t *b0 = row + (size_t)(8 * g) * bs;
    for (int s = 0; s < 8; s++) {
        if (s >= nsub) {
            wg->u[s] = wg->s[s] = _mm256_setzero_si256();
            continue;
        }
        const uint8_t *b = b0 + (size_t)s * bs;
        switch (t) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
            wg->u[s] = nibbles16(b + (t == GGML_TYPE_Q4_1 ? 4 : 2));
            break;
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1: {
            const int q51 = t == GGML_TYPE_Q5_1;
            uint32_t qh;
            memcpy(&qh, b + (q51 ? 4 : 2), 4);
            wg->u[s] = _mm256_or_si256(nibbles16(b + (q51 ? 8 : 6)), fifth_bits(qh));
            break;
        }
        case GGML_TYPE_IQ4_NL:
            wg->s[s] = levels16(quant_iq4_levels, b + 2);
            break;
        case GGML_TYPE_MXFP4:
            wg->s[s] = levels16(quant_mxfp4_levels, b + 1);
            break;
        default: // Q8_0
            wg->s[s] = _mm256_loadu_si256((const __m256i *)(b + 2));
            break;
        }
    }
    // The factors: d; m for Q4_1/Q5_1; the offset for Q4_0/Q5_0 (and Q8_0 on
    // VNNI). Past nsub the weights and d are 0, so those terms are 0.
    wg->p = t == GGML_TYPE_MXFP4 ? e8m0_8(b0, nsub) : h2f8(b0, bs, 0, nsub);
    wg->q =
        t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_1 ? h2f8(b0, bs, 2, nsub) : _mm256_setzero_ps();
    wg->c0 = _mm256_set1_epi32(t == GGML_TYPE_Q4_0 ? 8 : t == GGML_TYPE_Q5_0 ? 16 : 0);
    if (t == GGML_TYPE_Q8_0 || t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_MXFP4)
        signed_weights(wg);
    else
        transpose8(wg->u);
}

// IQ4_XS: group g is super-block g (d, scales_h, scales_l[4], qs[128]); the
// eight scales (gguf/quant.h's inline codec) built in registers.
static inline __attribute__((always_inline)) void unpack_iq4_xs(const uint8_t *row, int64_t g,
                                                                struct q8_group *wg) {
    const uint8_t *b = row + (size_t)g * 136;
    for (int s = 0; s < 8; s++)
        wg->s[s] = levels16(quant_iq4_levels, b + 8 + 16 * s);
    signed_weights(wg);
    wg->c1 = _mm256_setr_epi32(quant_iq4_xs_scale(b, 0), quant_iq4_xs_scale(b, 1),
                               quant_iq4_xs_scale(b, 2), quant_iq4_xs_scale(b, 3),
                               quant_iq4_xs_scale(b, 4), quant_iq4_xs_scale(b, 5),
                               quant_iq4_xs_scale(b, 6), quant_iq4_xs_scale(b, 7));
    wg->p = _mm256_set1_ps(h2f(b));
}

// Q4_K / Q5_K: group g is super-block g.
static inline __attribute__((always_inline)) void unpack_kquant(const bool q5, const uint8_t *row,
                                                                int64_t g, struct q8_group *wg) {
    const uint8_t *b = row + (size_t)g * (q5 ? 176 : 144), *qs = b + (q5 ? 48 : 16);
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (q5) {
            const __m256i h0 =
                _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), one);
            const __m256i h1 =
                _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k + 1)), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        wg->u[2 * k] = lo;
        wg->u[2 * k + 1] = hi;
    }
    transpose8(wg->u);
    // The 6-bit scales and mins of sub-blocks 0..3 and 4..7, four bytes per
    // word (gguf/quant.c's k4_scale_min for every j at once), widened in registers:
    // int32 arrays read back as vectors stalled on store forwarding (Q4_K
    // decode ran slower than Q6_K's).
    uint32_t w[3];
    memcpy(w, b + 4, 12);
    const uint32_t sc03 = w[0] & 0x3f3f3f3fu, mn03 = w[1] & 0x3f3f3f3fu;
    const uint32_t sc47 = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    const uint32_t mn47 = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    wg->c0 = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)sc03, (int)sc47, 0, 0));
    wg->c1 = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)mn03, (int)mn47, 0, 0));
    wg->p = _mm256_set1_ps(h2f(b));
    wg->q = _mm256_set1_ps(-h2f(b + 2));
}

// Q6_K: group g is super-block g (ql[128], qh[64], scales[16], d).
static inline __attribute__((always_inline)) void unpack_q6_k(const uint8_t *row, int64_t g,
                                                              struct q8_group *wg) {
    const uint8_t *b = row + (size_t)g * 210;
    const int8_t *sc = (const int8_t *)(b + 192);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const float d = h2f(b + 208);
    for (int s = 0; s < 8; s++) {
        const int h = s / 4, ss = s % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (ss & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        const __m256i lo =
            _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (ss >> 1))), m4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * ss)), m2);
        wg->u[s] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    // sc0 of sub-block s = 4h + ss is scales[8h + 2ss], sc1 the next one:
    // the even and the odd bytes of scales[16], widened.
    const __m128i scv = _mm_loadu_si128((const __m128i *)sc);
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    wg->c0 = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(scv, even)); // signed: not even_odd_u8
    wg->c1 = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(scv, odd));
    wg->p = _mm256_set1_ps(d);
    transpose8(wg->u);
}

// Q2_K / Q3_K: sub-block s = 4h + ss of super-block g has its 2-bit quants at
// bits 2ss.. of qs[32h + l] (gguf/quant.c); its groups are 2s and 2s + 1.
static inline __attribute__((always_inline)) __m256i plane2(const uint8_t *qs, int s) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (s / 4)));
    return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (s % 4))),
                            _mm256_set1_epi8(3));
}

// The even and the odd bytes of 16 (groups 2s and 2s + 1 of sub-block s),
// widened to int32.
static inline void even_odd_u8(__m128i v, __m256i *even, __m256i *odd) {
    const __m128i ev = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i od = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    *even = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, ev));
    *odd = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, od));
}

// Q2_K (scales[16]: 4-bit scale low, min high; qs[64]; d; dmin).
static inline __attribute__((always_inline)) void unpack_q2_k(const uint8_t *row, int64_t g,
                                                              struct q8_group *wg) {
    const uint8_t *b = row + (size_t)g * 84;
    for (int s = 0; s < 8; s++)
        wg->u[s] = plane2(b + 16, s);
    const __m128i sc = _mm_loadu_si128((const __m128i *)b), m4 = _mm_set1_epi8(0x0f);
    even_odd_u8(_mm_and_si128(sc, m4), &wg->c0, &wg->c1);
    even_odd_u8(_mm_and_si128(_mm_srli_epi16(sc, 4), m4), &wg->c2, &wg->c3);
    wg->p = _mm256_set1_ps(h2f(b + 80));
    wg->q = _mm256_set1_ps(-h2f(b + 82));
    transpose8(wg->u);
}

// Q3_K (hmask[32], qs[64], scales[12], d): u = level + 4 = the 2 low bits |
// hmask bit s << 2; the 16 signed 6-bit scales come out of the three scale
// words four at a time (gguf/quant_q8.c's q3_scale for every group).
static inline __attribute__((always_inline)) void unpack_q3_k(const uint8_t *row, int64_t g,
                                                              struct q8_group *wg) {
    const uint8_t *b = row + (size_t)g * 110;
    const __m256i hm = _mm256_loadu_si256((const __m256i *)b), one = _mm256_set1_epi8(1);
    for (int s = 0; s < 8; s++) {
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(s)), one);
        wg->u[s] = _mm256_or_si256(plane2(b + 32, s), _mm256_slli_epi16(hb, 2));
    }
    uint32_t w[3];
    memcpy(w, b + 96, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
    const __m128i v = _mm_setr_epi32((int)((w[0] & lo4) | ((w[2] & hi2) << 4)),
                                     (int)((w[1] & lo4) | (((w[2] >> 2) & hi2) << 4)),
                                     (int)(((w[0] >> 4) & lo4) | (((w[2] >> 4) & hi2) << 4)),
                                     (int)(((w[1] >> 4) & lo4) | (((w[2] >> 6) & hi2) << 4)));
    even_odd_u8(v, &wg->c0, &wg->c1);
    const __m256i bias = _mm256_set1_epi32(32);
    wg->c0 = _mm256_sub_epi32(wg->c0, bias);
    wg->c1 = _mm256_sub_epi32(wg->c1, bias);
    wg->p = _mm256_set1_ps(h2f(b + 108));
    transpose8(wg->u);
}

static inline __attribute__((always_inline)) void
unpack_group(const enum ggml_type t, const uint8_t *row, int64_t g, int nsub, struct q8_group *wg) {
    switch (t) {
    case GGML_TYPE_Q2_K:
        unpack_q2_k(row, g, wg);
        break;
    case GGML_TYPE_Q3_K:
        unpack_q3_k(row, g, wg);
        break;
    case GGML_TYPE_Q4_K:
        unpack_kquant(false, row, g, wg);
        break;
    case GGML_TYPE_Q5_K:
        unpack_kquant(true, row, g, wg);
        break;
    case GGML_TYPE_Q6_K:
        unpack_q6_k(row, g, wg);
        break;
    case GGML_TYPE_IQ4_XS:
        unpack_iq4_xs(row, g, wg);
        break;
    default:
        unpack_legacy(t, row, g, nsub, wg);
        break;
    }
}

// acc + the exact sums of u*x in each int32 lane (4 bytes each).
static inline __m256i dot4(__m256i acc, __m256i u, __m256i x) {
#if CPU_Q8_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

// One group of one token: adds the 8 sub-block terms to acc (lane s: s).
// xq is the token's group in the transposed layout (cpu_q8.h).
static inline __attribute__((always_inline)) void
dot_group(const enum q8_kind kind, const struct q8_group *wg, const int8_t *xq /* [256] */,
          const float *dx /* [8] */, const int32_t *sq /* [8] */, const int32_t *sqh /* [8] */,
          __m256 *acc) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int m = 0; m < 8; m++) {
        __m256i x = _mm256_load_si256((const __m256i *)(xq + 32 * m));
#if !CPU_Q8_VNNI
        if (kind == KIND_Q8_0 || kind == KIND_IQ4_XS)
            x = _mm256_sign_epi8(x, wg->s[m]);
#endif
        if (m < 4)
            lo = dot4(lo, wg->u[m], x);
        else
            hi = dot4(hi, wg->u[m], x);
    }
    const __m256i vsq = _mm256_load_si256((const __m256i *)sq);
    const __m256i c0 = wg->c0;
    const __m256 vdx = _mm256_load_ps(dx);
    __m256i ii;
    switch (kind) {
    case KIND_OFF:
        ii = _mm256_sub_epi32(_mm256_add_epi32(lo, hi), _mm256_mullo_epi32(c0, vsq));
        break;
    case KIND_Q8_0:
    case KIND_IQ4_XS:
#if CPU_Q8_VNNI
        ii = _mm256_sub_epi32(_mm256_add_epi32(lo, hi), _mm256_mullo_epi32(c0, vsq));
#else
        ii = _mm256_add_epi32(lo, hi);
#endif
        if (kind == KIND_IQ4_XS)
            ii = _mm256_mullo_epi32(wg->c1, ii);
        break;
    case KIND_KQUANT:
        ii = _mm256_mullo_epi32(c0, _mm256_add_epi32(lo, hi));
        break;
    case KIND_Q6_K:
    case KIND_Q3_K: {
        const int sh = kind == KIND_Q6_K ? 5 : 2; // off 32 or 4
        const __m256i vsqh = _mm256_load_si256((const __m256i *)sqh);
        const __m256i c1 = wg->c1;
        const __m256i a = _mm256_sub_epi32(lo, _mm256_slli_epi32(_mm256_sub_epi32(vsq, vsqh), sh));
        const __m256i b = _mm256_sub_epi32(hi, _mm256_slli_epi32(vsqh, sh));
        ii = _mm256_add_epi32(_mm256_mullo_epi32(c0, a), _mm256_mullo_epi32(c1, b));
        break;
    }
    case KIND_Q2_K:
        ii = _mm256_add_epi32(_mm256_mullo_epi32(c0, lo), _mm256_mullo_epi32(wg->c1, hi));
        break;
    default: // KIND_MIN
        ii = _mm256_add_epi32(lo, hi);
        break;
    }
    __m256 t = _mm256_mul_ps(_mm256_mul_ps(wg->p, vdx), _mm256_cvtepi32_ps(ii));
    if (kind == KIND_MIN || kind == KIND_KQUANT || kind == KIND_Q2_K) {
        __m256i kk = vsq;
        if (kind == KIND_KQUANT)
            kk = _mm256_mullo_epi32(wg->c1, vsq);
        if (kind == KIND_Q2_K) {
            const __m256i vsqh = _mm256_load_si256((const __m256i *)sqh);
            kk = _mm256_add_epi32(_mm256_mullo_epi32(wg->c2, _mm256_sub_epi32(vsq, vsqh)),
                                  _mm256_mullo_epi32(wg->c3, vsqh));
        }
        const __m256 tk = _mm256_mul_ps(_mm256_mul_ps(wg->q, vdx), _mm256_cvtepi32_ps(kk));
        t = _mm256_add_ps(t, tk);
    }
    *acc = _mm256_add_ps(*acc, t);
}

// The 8 lanes in a fixed pairwise order.
static inline float sum8(__m256 v) {
    _Alignas(32) float a[8];
    _mm256_store_ps(a, v);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// out[o] (+ bias, or accumulated) for row o and token t.
static inline __attribute__((always_inline)) void store_out(const struct cpu_q8_job *j, int t,
                                                            int64_t o, float s) {
    if (j->bias)
        s += j->bias[o];
    float *dst = j->out + (size_t)t * (size_t)j->n_out + o;
    *dst = j->accumulate ? *dst + s : s;
}

// acc[t] += the terms of row `row` with tokens t0 .. t0 + nt - 1, group by
// group: each group is unpacked once and dotted with every token.
static inline __attribute__((always_inline)) void dot_row(const enum ggml_type type,
                                                          const struct cpu_q8_x *x,
                                                          const uint8_t *row, int64_t nb, int t0,
                                                          int nt, __m256 *acc) {
    const enum q8_kind kind = kind_of(type);
    struct q8_group wg;
    for (int64_t g = 0; g < (nb + 7) / 8; g++) {
        const int nsub = nb - 8 * g < 8 ? (int)(nb - 8 * g) : 8;
        unpack_group(type, row, g, nsub, &wg);
        for (int t = 0; t < nt; t++) {
            const size_t tb = (size_t)(t0 + t) * (size_t)x->nb_pad + (size_t)(8 * g);
            dot_group(kind, &wg, x->qs + (size_t)(t0 + t) * (size_t)x->n_pad + 256 * g, x->dx + tb,
                      x->sq + tb, x->sqh + tb, &acc[t]);
        }
    }
}

// Tiles of CPU_Q8_TILE tokens. One token (decode) keeps its running sum in
// a register: the tile's acc[] lives on the stack, and its load-add-store
// per group was a store-forwarding chain on the decode path. Both run the
// same terms and additions, so a token's bits do not depend on the batch.
static inline __attribute__((always_inline)) void
rows_of_type(const enum ggml_type type, const struct cpu_q8_job *j, int64_t o0, int64_t o1) {
    const struct cpu_q8_x *x = j->x;
    const int64_t nb = j->n_in / QUANT_Q8_1_BLOCK;
    __m256 acc[CPU_Q8_TILE];
    for (int t0 = 0; t0 < x->n_tok; t0 += CPU_Q8_TILE) {
        const int nt = x->n_tok - t0 < CPU_Q8_TILE ? x->n_tok - t0 : CPU_Q8_TILE;
        for (int64_t o = o0; o < o1; o++) {
            const uint8_t *row = j->w + (size_t)o * j->row_bytes;
            if (nt == 1) {
                __m256 one = _mm256_setzero_ps();
                dot_row(type, x, row, nb, t0, 1, &one);
                store_out(j, t0, o, sum8(one));
                continue;
            }
            for (int t = 0; t < nt; t++)
                acc[t] = _mm256_setzero_ps();
            dot_row(type, x, row, nb, t0, nt, acc);
            for (int t = 0; t < nt; t++)
                store_out(j, t0 + t, o, sum8(acc[t]));
        }
    }
}

void CPU_Q8_ROWS(const struct cpu_q8_job *j, int64_t o0, int64_t o1) {
    switch (j->wtype) {
    case GGML_TYPE_Q4_0:
        rows_of_type(GGML_TYPE_Q4_0, j, o0, o1);
        break;
    case GGML_TYPE_Q4_1:
        rows_of_type(GGML_TYPE_Q4_1, j, o0, o1);
        break;
    case GGML_TYPE_Q5_0:
        rows_of_type(GGML_TYPE_Q5_0, j, o0, o1);
        break;
    case GGML_TYPE_Q5_1:
        rows_of_type(GGML_TYPE_Q5_1, j, o0, o1);
        break;
    case GGML_TYPE_Q8_0:
        rows_of_type(GGML_TYPE_Q8_0, j, o0, o1);
        break;
    case GGML_TYPE_Q4_K:
        rows_of_type(GGML_TYPE_Q4_K, j, o0, o1);
        break;
    case GGML_TYPE_Q5_K:
        rows_of_type(GGML_TYPE_Q5_K, j, o0, o1);
        break;
    case GGML_TYPE_Q6_K:
        rows_of_type(GGML_TYPE_Q6_K, j, o0, o1);
        break;
    case GGML_TYPE_Q2_K:
        rows_of_type(GGML_TYPE_Q2_K, j, o0, o1);
        break;
    case GGML_TYPE_Q3_K:
        rows_of_type(GGML_TYPE_Q3_K, j, o0, o1);
        break;
    case GGML_TYPE_IQ4_NL:
        rows_of_type(GGML_TYPE_IQ4_NL, j, o0, o1);
        break;
    case GGML_TYPE_IQ4_XS:
        rows_of_type(GGML_TYPE_IQ4_XS, j, o0, o1);
        break;
    case GGML_TYPE_MXFP4:
        rows_of_type(GGML_TYPE_MXFP4, j, o0, o1);
        break;
    default:
        break; // the caller checked quant_q8_1_dot_supported
    }
}

// ---------------------------------------------------------------------------
// The activations: quant_q8_1_row's blocks, bit for bit, written straight
// into the layout. Each step is the reference's: amax = max |x| ignoring
// NaN (vmaxps returns its second operand when the first is NaN), d and its
// f16 by the same scalar code, q = roundf(x * id) with ties away from zero
// (trunc, then one step outwards when the exact remainder is >= 0.5), then
// the clamps in the reference's order (NaN becomes -127).

static inline __m256 round_half_away(__m256 p) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 rem = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t)); // exact
    const __m256 step = _mm256_or_ps(_mm256_and_ps(p, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t,
                         _mm256_and_ps(_mm256_cmp_ps(rem, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

void CPU_Q8_FILL(struct cpu_q8_x *x, int t, const float *xt, int64_t n_in) {
    int8_t *qs = x->qs + (size_t)t * (size_t)x->n_pad;
    float *dx = x->dx + (size_t)t * (size_t)x->nb_pad;
    int32_t *sq = x->sq + (size_t)t * (size_t)x->nb_pad,
            *sqh = x->sqh + (size_t)t * (size_t)x->nb_pad;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < x->nb_pad; i++) {
        int8_t *grp = qs + (i / 8) * CPU_Q8_GROUP + (i % 8) * 4;
        float d = 0.0f;
        uint16_t d16 = 0;
        __m256 v[4];
        if (i < n_in / QUANT_Q8_1_BLOCK) {
            __m256 amax = _mm256_setzero_ps();
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_loadu_ps(xt + 32 * i + 8 * k);
                amax = _mm256_max_ps(_mm256_and_ps(v[k], absmask), amax);
            }
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
            d = _mm_cvtss_f32(m) / 127.0f;
            d16 = quant_f32_to_fp16(d);
        }
        if ((d16 & 0x7fffu) == 0) { // a zero block (and the padding)
            for (int m = 0; m < 8; m++)
                memset(grp + 32 * m, 0, 4);
            dx[i] = 0.0f;
            sq[i] = sqh[i] = 0;
            continue;
        }
        const __m256 id = _mm256_set1_ps(1.0f / d);
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            __m256 r = round_half_away(_mm256_mul_ps(v[k], id));
            r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
            q[k] = _mm256_cvtps_epi32(r);
        }
        // int32 x 32 -> int8 x 32 in element order, then word m to row m.
        const __m256i b = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _Alignas(32) int32_t words[8];
        _mm256_store_si256((__m256i *)words, b);
        for (int m = 0; m < 8; m++)
            memcpy(grp + 32 * m, &words[m], 4);
        dx[i] = quant_fp16_to_f32(d16);
        const __m256i hi = _mm256_add_epi32(q[2], q[3]);
        sqh[i] = hsum_epi32(hi);
        sq[i] = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), hi));
    }
}
