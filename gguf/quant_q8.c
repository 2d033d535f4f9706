// The q8_1 activation format and the integer dot product of weight rows with
// it: the CPU reference of cuda/matvec_q8.cu (contract and formulas in
// quant_q8.h). Written plainly, element by element, so that it checks the
// GPU's bit tricks (nibble unpacking, fifth bits, signed offsets) rather than
// sharing them. The weight layouts are those of gguf/quant.c.
#include "gguf/quant_q8.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "gguf/quant.h"

// The per-sub-block terms must be the exact float expressions of quant_q8.h
// (the GPU evaluates the same ones with __fmul_rn / __fadd_rn): GCC in ISO C
// mode never contracts a*b + c into an FMA; clang would on FMA targets.
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline uint16_t rd_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline float rd_f16(const uint8_t *p) {
    return quant_fp16_to_f32(rd_u16(p));
}
static inline void wr_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

int64_t quant_q8_1_row_bytes(int64_t n) {
    if (n < 0 || n % QUANT_Q8_1_BLOCK != 0)
        return 0;
    return n / QUANT_Q8_1_BLOCK * QUANT_Q8_1_BLOCK_BYTES;
}

static int check_q8_row(const char *what, const void *a, const void *b, int64_t n,
                        struct verr *err) {
    if (n < 0 || n % QUANT_Q8_1_BLOCK != 0)
        return verr_set(err, VERR_RANGE, "%s: row of %lld elements is not a multiple of %d", what,
                        (long long)n, QUANT_Q8_1_BLOCK);
    if (n > 0 && (!a || !b))
        return verr_set(err, VERR_RANGE, "%s: NULL buffer for a row of %lld elements", what,
                        (long long)n);
    return VERR_OK;
}

int quant_q8_1_row(const float *x, int64_t n, void *out, struct verr *err) {
    int rc = check_q8_row("quantize q8_1", x, out, n, err);
    if (rc)
        return rc;
    uint8_t *b = out;
    for (int64_t i = 0; i < n; i += QUANT_Q8_1_BLOCK, b += QUANT_Q8_1_BLOCK_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < QUANT_Q8_1_BLOCK; j++)
            amax = fmaxf(amax, fabsf(x[i + j]));
        const float d = amax / 127.0f;
        const uint16_t d16 = quant_f32_to_fp16(d);
        if ((d16 & 0x7fffu) == 0) {
            memset(b, 0, QUANT_Q8_1_BLOCK_BYTES);
            continue;
        }
        const float id = 1.0f / d;
        int sum = 0;
        for (int j = 0; j < QUANT_Q8_1_BLOCK; j++) {
            const float v = fminf(fmaxf(roundf(x[i + j] * id), -127.0f), 127.0f);
            const int q = (int)v;
            b[4 + j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        wr_u16(b, d16);
        wr_u16(b + 2, quant_f32_to_fp16(d * (float)sum));
    }
    return VERR_OK;
}

int quant_q8_1_dequantize_row(const void *xq, int64_t n, float *out, struct verr *err) {
    int rc = check_q8_row("dequantize q8_1", xq, out, n, err);
    if (rc)
        return rc;
    const uint8_t *b = xq;
    for (int64_t i = 0; i < n; i += QUANT_Q8_1_BLOCK, b += QUANT_Q8_1_BLOCK_BYTES) {
        const float d = rd_f16(b);
        for (int j = 0; j < QUANT_Q8_1_BLOCK; j++)
            out[i + j] = (float)(int8_t)b[4 + j] * d;
    }
    return VERR_OK;
}

bool quant_q8_1_dot_supported(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS:
    case GGML_TYPE_MXFP4:
        return true;
    default:
        return false;
    }
}

// 6-bit scale and min j (0..7) of a Q4_K / Q5_K scales[12] field (the layout
// of gguf/quant.c's k4_scale_min).
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// One 32-element sub-block of a weight row, decoded to integers: qw[32] and
// the float/integer factors of its term (which fields are used depends on the
// type, see term()).
struct wsub {
    int qw[32];
    float a, b;   // dw and m (legacy), d and dmin (K-quants), d (Q3_K, Q6_K)
    int sc0, sc1; // Q4_K/Q5_K: scale, min; Q2_K/Q3_K/Q6_K: scales of elements 0..15, 16..31;
                  // IQ4_XS: sc0 the group's scale
    int m0, m1;   // Q2_K: mins of elements 0..15, 16..31
};

static int fifth_bit(const uint8_t *qh, int e) {
    return (qh[e >> 3] >> (e & 7)) & 1;
}

// Sub-block j of the row (j counted from the row start).
static void decode_sub(enum ggml_type t, const uint8_t *row, int64_t j, struct wsub *w) {
    switch (t) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1: {
        const int q41 = t == GGML_TYPE_Q4_1;
        const uint8_t *b = row + j * (q41 ? 20 : 18), *qs = b + (q41 ? 4 : 2);
        w->a = rd_f16(b);
        w->b = q41 ? rd_f16(b + 2) : 0.0f;
        for (int l = 0; l < 16; l++) {
            w->qw[l] = (qs[l] & 0x0f) - (q41 ? 0 : 8);
            w->qw[l + 16] = (qs[l] >> 4) - (q41 ? 0 : 8);
        }
        break;
    }
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: {
        const int q51 = t == GGML_TYPE_Q5_1;
        const uint8_t *b = row + j * (q51 ? 24 : 22), *qh = b + (q51 ? 4 : 2), *qs = qh + 4;
        w->a = rd_f16(b);
        w->b = q51 ? rd_f16(b + 2) : 0.0f;
        for (int l = 0; l < 16; l++) {
            w->qw[l] = ((qs[l] & 0x0f) | (fifth_bit(qh, l) << 4)) - (q51 ? 0 : 16);
            w->qw[l + 16] = ((qs[l] >> 4) | (fifth_bit(qh, l + 16) << 4)) - (q51 ? 0 : 16);
        }
        break;
    }
    case GGML_TYPE_Q8_0: {
        const uint8_t *b = row + j * 34;
        w->a = rd_f16(b);
        w->b = 0.0f;
        for (int l = 0; l < 32; l++)
            w->qw[l] = (int8_t)b[2 + l];
        break;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        const int q5 = t == GGML_TYPE_Q5_K;
        const uint8_t *b = row + (j / 8) * (q5 ? 176 : 144);
        const int g = (int)(j % 8);
        const uint8_t *qs = b + (q5 ? 48 : 16) + 32 * (g / 2), *qh = b + 16;
        w->a = rd_f16(b);
        w->b = rd_f16(b + 2);
        k4_scale_min(b + 4, g, &w->sc0, &w->sc1);
        for (int l = 0; l < 32; l++) {
            int v = (qs[l] >> (4 * (g & 1))) & 0x0f;
            if (q5)
                v |= ((qh[l] >> g) & 1) << 4;
            w->qw[l] = v;
        }
        break;
    }
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: {
        // Sub-block g = 4h + s of a super-block: its 2-bit quants are bits
        // 2s.. of qs[32h + l]; groups 2g and 2g + 1 (gguf/quant.c).
        const int q3 = t == GGML_TYPE_Q3_K;
        const uint8_t *b = row + (j / 8) * (q3 ? 110 : 84);
        const int g = (int)(j % 8), h = g / 4, s = g % 4;
        const uint8_t *qs = b + (q3 ? 32 : 16) + 32 * h;
        if (q3) {
            w->a = rd_f16(b + 108);
            w->b = 0.0f;
            w->sc0 = quant_q3_k_scale(b + 96, 2 * g);
            w->sc1 = quant_q3_k_scale(b + 96, 2 * g + 1);
            w->m0 = w->m1 = 0;
        } else {
            w->a = rd_f16(b + 80);
            w->b = rd_f16(b + 82);
            w->sc0 = b[2 * g] & 0x0f;
            w->sc1 = b[2 * g + 1] & 0x0f;
            w->m0 = b[2 * g] >> 4;
            w->m1 = b[2 * g + 1] >> 4;
        }
        for (int l = 0; l < 32; l++) {
            int v = (qs[l] >> (2 * s)) & 3;
            if (q3)
                v -= ((b[l] >> g) & 1) ? 0 : 4; // hmask[l] bit g clear: subtract 4
            w->qw[l] = v;
        }
        break;
    }
    case GGML_TYPE_Q6_K: {
        const uint8_t *b = row + (j / 8) * 210;
        const int g = (int)(j % 8), h = g / 4, s = g % 4;
        const uint8_t *ql = b + 64 * h + 32 * (s & 1), *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192);
        w->a = rd_f16(b + 208);
        w->b = 0.0f;
        w->sc0 = sc[8 * h + 2 * s];
        w->sc1 = sc[8 * h + 2 * s + 1];
        for (int l = 0; l < 32; l++)
            w->qw[l] = (((ql[l] >> (4 * (s >> 1))) & 0x0f) | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
        break;
    }
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS: {
        // IQ4_NL: one group of 32 per block; IQ4_XS: group j % 8 of a
        // super-block, with its scale.
        const int xs = t == GGML_TYPE_IQ4_XS;
        const uint8_t *b = xs ? row + (j / 8) * 136 : row + j * 18;
        const uint8_t *qs = xs ? b + 8 + 16 * (j % 8) : b + 2;
        w->a = rd_f16(b);
        w->b = 0.0f;
        w->sc0 = xs ? quant_iq4_xs_scale(b, (int)(j % 8)) : 1;
        for (int l = 0; l < 16; l++) {
            w->qw[l] = quant_iq4_levels[qs[l] & 0x0f];
            w->qw[l + 16] = quant_iq4_levels[qs[l] >> 4];
        }
        break;
    }
    case GGML_TYPE_MXFP4: {
        const uint8_t *b = row + j * 17;
        w->a = quant_e8m0_half_to_f32(b[0]);
        w->b = 0.0f;
        for (int l = 0; l < 16; l++) {
            w->qw[l] = quant_mxfp4_levels[b[1 + l] & 0x0f];
            w->qw[l + 16] = quant_mxfp4_levels[b[1 + l] >> 4];
        }
        break;
    }
    default:
        memset(w, 0, sizeof *w);
        break;
    }
}

// The float term of one sub-block (quant_q8.h), from its integer sums.
static float term(enum ggml_type t, const struct wsub *w, int sumi, int sumi_hi, int sumq,
                  int sumq_hi, float dx) {
    switch (t) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_MXFP4:
        return (w->a * dx) * (float)sumi;
    case GGML_TYPE_IQ4_XS:
        return (w->a * dx) * (float)(w->sc0 * sumi);
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
        return (w->a * dx) * (float)sumi + (w->b * dx) * (float)sumq;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
        return (w->a * dx) * (float)(w->sc0 * sumi) - (w->b * dx) * (float)(w->sc1 * sumq);
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q6_K:
        return (w->a * dx) * (float)(w->sc0 * (sumi - sumi_hi) + w->sc1 * sumi_hi);
    case GGML_TYPE_Q2_K:
        return (w->a * dx) * (float)(w->sc0 * (sumi - sumi_hi) + w->sc1 * sumi_hi) -
               (w->b * dx) * (float)(w->m0 * (sumq - sumq_hi) + w->m1 * sumq_hi);
    default:
        return NAN;
    }
}

int quant_dot_q8_1(enum ggml_type wtype, const void *wrow, const void *xq, int64_t n, float *out,
                   struct verr *err) {
    if (!quant_q8_1_dot_supported(wtype))
        return verr_set(err, VERR_UNSUPPORTED, "dot q8_1: weight type %s (%d) is not supported",
                        ggml_type_name((uint32_t)wtype), (int)wtype);
    const struct ggml_type_info *ti = ggml_type_get((uint32_t)wtype);
    if (n < 0 || n % ti->block_size != 0)
        return verr_set(err, VERR_RANGE,
                        "dot q8_1 %s: row of %lld elements is not a multiple of the block size %u",
                        ti->name, (long long)n, ti->block_size);
    if (!out || (n > 0 && (!wrow || !xq)))
        return verr_set(err, VERR_RANGE, "dot q8_1 %s: NULL buffer", ti->name);
    const uint8_t *x = xq;
    double acc = 0.0;
    for (int64_t j = 0; j < n / QUANT_Q8_1_BLOCK; j++, x += QUANT_Q8_1_BLOCK_BYTES) {
        struct wsub w;
        decode_sub(wtype, wrow, j, &w);
        int sumi = 0, sumi_hi = 0, sumq = 0, sumq_hi = 0;
        for (int l = 0; l < 32; l++) {
            const int qx = (int8_t)x[4 + l];
            sumi += w.qw[l] * qx;
            sumq += qx;
            if (l >= 16) {
                sumi_hi += w.qw[l] * qx;
                sumq_hi += qx;
            }
        }
        acc += (double)term(wtype, &w, sumi, sumi_hi, sumq, sumq_hi, rd_f16(x));
    }
    *out = (float)acc;
    return VERR_OK;
}
