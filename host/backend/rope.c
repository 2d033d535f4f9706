#include "host/backend/rope.h"

#include <math.h>

#include "gguf/quant.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

// The dimension at which the rotation of a pair completes `n_turns` full
// turns over n_ctx_orig positions: solving n_turns = n_ctx_orig /
// (2pi * base^(2x/n_dims)) for x. Float steps as llama.cpp's
// ggml_rope_yarn_corr_dim.
static float rope_yarn_corr_dim(int n_dims, int n_ctx_orig, float n_turns, float base) {
    return n_dims * logf(n_ctx_orig / (n_turns * 2 * (float)M_PI)) / (2 * logf(base));
}

void rope_yarn_corr_dims(int n_rot, int n_ctx_orig, float freq_base, float beta_fast,
                         float beta_slow, float dims[2]) {
    const float start = floorf(rope_yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base));
    const float end = ceilf(rope_yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base));
    // Ordered as llama.cpp's MAX(0, start) / MIN(n_rot - 1, end).
    dims[0] = 0 > start ? 0 : start;
    dims[1] = (float)(n_rot - 1) < end ? (float)(n_rot - 1) : end;
}

int rope_params_check(const struct rope_params *rp, int head_dim, const char *what,
                      struct verr *err) {
    if (!rp)
        return verr_set(err, VERR_RANGE, "%s: rope params are NULL", what);
    if (rp->mode != ROPE_MODE_NORMAL && rp->mode != ROPE_MODE_NEOX)
        return verr_set(err, VERR_UNSUPPORTED,
                        "%s: rope mode %d is not supported (0 normal, 2 NeoX)", what,
                        (int)rp->mode);
    if (rp->n_rot < 2 || rp->n_rot % 2 != 0 || rp->n_rot > head_dim)
        return verr_set(err, VERR_RANGE, "%s: n_rot %d must be even and in [2, head_dim %d]",
                        what, rp->n_rot, head_dim);
    if (!(rp->freq_base > 0.0f) || !isfinite(rp->freq_base))
        return verr_set(err, VERR_RANGE, "%s: freq_base %g must be finite and > 0", what,
                        (double)rp->freq_base);
    if (!(rp->freq_scale > 0.0f) || !isfinite(rp->freq_scale))
        return verr_set(err, VERR_RANGE, "%s: freq_scale %g must be finite and > 0", what,
                        (double)rp->freq_scale);
    if (!isfinite(rp->ext_factor) || !isfinite(rp->attn_factor))
        return verr_set(err, VERR_RANGE, "%s: ext_factor %g and attn_factor %g must be finite",
                        what, (double)rp->ext_factor, (double)rp->attn_factor);
    if (rp->ext_factor != 0.0f && (rp->n_ctx_orig <= 0 || !(rp->beta_fast > 0.0f) ||
                                   !(rp->beta_slow > 0.0f)))
        return verr_set(err, VERR_RANGE,
                        "%s: YaRN (ext_factor %g) needs n_ctx_orig > 0 (got %d) and "
                        "beta_fast, beta_slow > 0 (got %g, %g)",
                        what, (double)rp->ext_factor, rp->n_ctx_orig, (double)rp->beta_fast,
                        (double)rp->beta_slow);
    return VERR_OK;
}

void rope_consts_init(struct rope_consts *c, const struct rope_params *rp, bool magnitude) {
    c->theta_scale = powf(rp->freq_base, -2.0f / rp->n_rot);
    rope_yarn_corr_dims(rp->n_rot, rp->n_ctx_orig, rp->freq_base, rp->beta_fast, rp->beta_slow,
                        c->corr_dims);
    c->mscale = magnitude ? rope_yarn_mscale(rp->attn_factor, rp->freq_scale, rp->ext_factor)
                          : 1.0f;
}

void rope_cache_fill(float *cs, float pos, const struct rope_params *rp,
                     const struct rope_consts *c) {
    const int n_pairs = rp->n_rot / 2;
    float theta = pos; // the running product pos * theta_scale^i
    for (int i = 0; i < n_pairs; i++) {
        const float ff = rp->freq_factors ? rp->freq_factors[i] : 1.0f;
        rope_yarn_cos_sin(theta / ff, i, rp->freq_scale, rp->ext_factor, c->corr_dims, c->mscale,
                          &cs[2 * i], &cs[2 * i + 1]);
        theta *= c->theta_scale;
    }
}

void rope_rotate_f32(float *x, const float *cs, int n_rot, enum rope_mode mode) {
    const int n_pairs = n_rot / 2;
    // Pair i is (x[i*step0], x[i*step0 + off]).
    const int step0 = mode == ROPE_MODE_NEOX ? 1 : 2;
    const int off = mode == ROPE_MODE_NEOX ? n_pairs : 1;
    for (int i = 0; i < n_pairs; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        float *p0 = x + (size_t)i * step0, *p1 = p0 + off;
        const float x0 = *p0, x1 = *p1;
        *p0 = x0 * c - x1 * s;
        *p1 = x0 * s + x1 * c;
    }
}

void rope_rotate_f16(uint16_t *x, const float *cs, int n_rot, enum rope_mode mode) {
    const int n_pairs = n_rot / 2;
    const int step0 = mode == ROPE_MODE_NEOX ? 1 : 2;
    const int off = mode == ROPE_MODE_NEOX ? n_pairs : 1;
    for (int i = 0; i < n_pairs; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        uint16_t *p0 = x + (size_t)i * step0, *p1 = p0 + off;
        const float x0 = quant_fp16_to_f32(*p0), x1 = quant_fp16_to_f32(*p1);
        *p0 = quant_f32_to_fp16(x0 * c - x1 * s);
        *p1 = quant_f32_to_fp16(x0 * s + x1 * c);
    }
}
