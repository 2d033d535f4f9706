// RoPE with the YaRN ramp: the per-(position, pair) arithmetic of llama.cpp's
// ggml_rope_cache_init / rope_yarn, written once so that the CPU reference and
// the CUDA kernels compute the same angles the same way.
//
// The inline functions below are plain C that also compiles as CUDA C++
// (ROPE_HD adds __host__ __device__ under nvcc; nothing CUDA is included), so
// cuda/ may include this header and call them inside kernels; mirroring them
// by hand is equally fine. Bit-exact angles need -fmad=false for these lines
// (C11 host code is built without FP contraction).
//
// Pair i of a head (0 <= i < n_rot/2) is (2i, 2i+1) in normal mode and
// (i, i + n_rot/2) in NeoX mode; both modes use the same angle for pair i:
//   theta_extrap = pos * theta_scale^i / freq_factors[i]
//     where theta_scale = freq_base^(-2/n_rot) and theta_scale^i is formed by
//     i successive float multiplications starting from (float)pos, as
//     llama.cpp's CPU backend does (NOT powf(theta_scale, i): that differs in
//     the last bits and those bits grow with pos);
//   theta_interp = freq_scale * theta_extrap;
//   ext_factor == 0: theta = theta_interp;
//   else: mix = ramp(i) * ext_factor, theta = theta_interp*(1-mix) + theta_extrap*mix,
//         ramp(i) = 1 - clamp((i - corr_dims[0]) / max(0.001, corr_dims[1] - corr_dims[0]), 0, 1);
//   (cos, sin) = (cosf(theta), sinf(theta)) * mscale.
//   The rotation of a pair (x0, x1) is (x0*cos - x1*sin, x0*sin + x1*cos).
#ifndef VELA_HOST_ROPE_H
#define VELA_HOST_ROPE_H

#include <math.h>
#include <stdbool.h>

#include "host/ops/backend.h"

#ifdef __CUDACC__
#define ROPE_HD __host__ __device__
#else
#define ROPE_HD
#endif

// Constants of one rope call, derived from rope_params once.
struct rope_consts {
    float theta_scale;  // powf(freq_base, -2.0f / n_rot)
    float corr_dims[2]; // rope_yarn_corr_dims(...)
    float mscale;       // magnitude applied to cos and sin (1 for a pure rotation)
};

// The YaRN ramp of pair i: 1 below corr_dims[0], 0 above corr_dims[1].
static inline ROPE_HD float rope_yarn_ramp(float lo, float hi, int i) {
    // The comparisons are ordered as llama.cpp's MAX/MIN macros, so that even
    // degenerate inputs (NaN corr dims) give the same result.
    const float d = 0.001f > hi - lo ? 0.001f : hi - lo;
    const float y = ((float)i - lo) / d;
    const float lo_clamped = 0.0f > y ? 0.0f : y;
    return 1.0f - (1.0f < lo_clamped ? 1.0f : lo_clamped);
}

// The angle of pair i before the YaRN mix: pos * theta_scale^i by successive
// multiplications (bit-identical to the CPU reference's running product).
static inline ROPE_HD float rope_theta_extrap(float pos, float theta_scale, int i) {
    float theta = pos;
    for (int j = 0; j < i; j++)
        theta *= theta_scale;
    return theta;
}

// cos/sin of pair i given its extrapolated angle (already divided by the
// frequency factor). mscale is the final magnitude (rope_consts.mscale).
static inline ROPE_HD void rope_yarn_cos_sin(float theta_extrap, int i, float freq_scale,
                                             float ext_factor, const float corr_dims[2],
                                             float mscale, float *cos_out, float *sin_out) {
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (ext_factor != 0.0f) {
        const float mix = rope_yarn_ramp(corr_dims[0], corr_dims[1], i) * ext_factor;
        theta = theta_interp * (1.0f - mix) + theta_extrap * mix;
    }
    *cos_out = cosf(theta) * mscale;
    *sin_out = sinf(theta) * mscale;
}

// The magnitude factor: attn_factor * (1 + 0.1 ln(1/freq_scale)) when
// ext_factor != 0, attn_factor otherwise (same float steps as llama.cpp).
static inline ROPE_HD float rope_yarn_mscale(float attn_factor, float freq_scale,
                                             float ext_factor) {
    float mscale = attn_factor;
    if (ext_factor != 0.0f)
        mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
    return mscale;
}

// Checks rp against a head of head_dim floats: mode known, n_rot even and in
// [2, head_dim], freq_base > 0, freq_scale > 0 and finite values. `what` names
// the op in the message.
int rope_params_check(const struct rope_params *rp, int head_dim, const char *what,
                      struct verr *err);

// Fills c from rp. magnitude == false gives mscale = 1: a pure rotation (the
// KV shift, which must not scale K again).
void rope_consts_init(struct rope_consts *c, const struct rope_params *rp, bool magnitude);

// cs[i] = {cos, sin} of pair i at position pos, i in [0, n_rot/2): the
// per-position table of llama.cpp's ggml_rope_cache_init.
void rope_cache_fill(float *cs /* [n_rot/2][2] */, float pos, const struct rope_params *rp,
                     const struct rope_consts *c);

// Rotates the first n_rot dims of one head in place with a table from
// rope_cache_fill; dims n_rot.. are left as they are.
void rope_rotate_f32(float *x /* [head_dim] */, const float *cs /* [n_rot/2][2] */, int n_rot,
                     enum rope_mode mode);
// The same on an F16 row: each element is widened, rotated in float and
// rounded back (llama.cpp's F16 rope).
void rope_rotate_f16(uint16_t *x /* [head_dim] */, const float *cs /* [n_rot/2][2] */,
                     int n_rot, enum rope_mode mode);

#endif
