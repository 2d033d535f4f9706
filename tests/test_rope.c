// RoPE / YaRN / KV shift of the CPU reference backend (host/backend/rope.c,
// host/backend/backend_cpu.c) against hand-computed values, against a naive
// implementation written here, and against the invariants a KV shift must
// keep (shift = rope at the new position, norm preserved, no drift).
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "host/ops/backend.h"
#include "host/backend/rope.h"
#include "tests/cpu_op_helpers.h"

// ---------------------------------------------------------------------------
// helpers

static struct rope_params rp_default(enum rope_mode mode, int n_rot, float base) {
    struct rope_params rp = {
        .mode = mode, .n_rot = n_rot, .n_ctx_orig = 4096, .freq_base = base,
        .freq_scale = 1.0f, .ext_factor = 0.0f, .attn_factor = 1.0f,
        .beta_fast = 32.0f, .beta_slow = 1.0f, .freq_factors = NULL,
    };
    return rp;
}

static void expect_near(double got, double want, double tol, const char *what, int idx) {
    cr_expect(fabs(got - want) <= tol, "%s[%d]: got %.9g want %.9g (tol %g)", what, idx, got,
              want, tol);
}

// ---------------------------------------------------------------------------
// YaRN correction dims and theta_scale: the seed values (shared/seeds/001_*)

Test(rope, seed_corr_dims_and_theta_scale) {
    float dims[2];
    rope_yarn_corr_dims(128, 4096, 10000.0f, 32.0f, 1.0f, dims);
    cr_expect_eq(dims[0], 20.0f, "corr dim lo %g", (double)dims[0]);
    cr_expect_eq(dims[1], 46.0f, "corr dim hi %g", (double)dims[1]);

    struct rope_params rp = rp_default(ROPE_MODE_NORMAL, 128, 10000.0f);
    struct rope_consts c;
    rope_consts_init(&c, &rp, true);
    // gdb prints 0.865964353 for powf(10000, -2/128); the float nearest it.
    cr_expect_eq(c.theta_scale, 0.865964353f, "theta_scale %.9g", (double)c.theta_scale);
    cr_expect_eq(c.mscale, 1.0f);

    // Clamping: beta_fast so large that the start dim is negative -> 0; a huge
    // trained context pushes the end dim past n_rot - 1 -> n_rot - 1.
    rope_yarn_corr_dims(128, 4096, 10000.0f, 1e6f, 1.0f, dims);
    cr_expect_eq(dims[0], 0.0f, "clamped lo %g", (double)dims[0]);
    rope_yarn_corr_dims(128, 1 << 30, 10000.0f, 32.0f, 1.0f, dims);
    cr_expect_eq(dims[1], 127.0f, "clamped hi %g", (double)dims[1]);
    // By hand: corr_dim(beta) = n * ln(n_ctx / (2 pi beta)) / (2 ln base);
    // n 64, ctx 2048, base 500000, beta 32: 64 * ln(10.186) / (2 * 13.122) = 5.66 -> floor 5;
    // beta 1: 64 * ln(325.95) / 26.245 = 14.11 -> ceil 15.
    rope_yarn_corr_dims(64, 2048, 500000.0f, 32.0f, 1.0f, dims);
    cr_expect_eq(dims[0], 5.0f, "lo %g", (double)dims[0]);
    cr_expect_eq(dims[1], 15.0f, "hi %g", (double)dims[1]);

    // mscale: attn_factor * (1 + 0.1 ln(1/freq_scale)) only with ext_factor != 0.
    rp.freq_scale = 0.25f;
    rp.attn_factor = 2.0f;
    rope_consts_init(&c, &rp, true);
    cr_expect_eq(c.mscale, 2.0f, "no YaRN: mscale = attn_factor");
    rp.ext_factor = 1.0f;
    rope_consts_init(&c, &rp, true);
    expect_near(c.mscale, 2.0 * (1.0 + 0.1 * log(4.0)), 1e-6, "mscale", 0);
    rope_consts_init(&c, &rp, false);
    cr_expect_eq(c.mscale, 1.0f, "a pure rotation has mscale 1");
}

Test(rope, ramp) {
    // 1 up to the low dim, 0 from the high dim, linear between.
    cr_expect_eq(rope_yarn_ramp(20.0f, 46.0f, 0), 1.0f);
    cr_expect_eq(rope_yarn_ramp(20.0f, 46.0f, 20), 1.0f);
    cr_expect_eq(rope_yarn_ramp(20.0f, 46.0f, 33), 0.5f);
    cr_expect_eq(rope_yarn_ramp(20.0f, 46.0f, 46), 0.0f);
    cr_expect_eq(rope_yarn_ramp(20.0f, 46.0f, 63), 0.0f);
    // hi == lo: the width is floored at 0.001, a step at lo.
    cr_expect_eq(rope_yarn_ramp(10.0f, 10.0f, 10), 1.0f);
    cr_expect_eq(rope_yarn_ramp(10.0f, 10.0f, 11), 0.0f);
}

// ---------------------------------------------------------------------------
// hand-computed rotations

// x = [1, 0, 0, 1, 5, 6], n_rot 4, base 100, pos 2: pair 0 turns by
// theta_0 = 2, pair 1 by theta_1 = 2 * 100^(-2/4) = 0.2; dims 4, 5 are copied.
Test(rope, hand_normal_and_neox) {
    struct backend *be = mk_backend(1);
    const int32_t pos = 2;
    const double c2 = cos(2.0), s2 = sin(2.0), c02 = cos(0.2), s02 = sin(0.2);
    // Angles this small come out of float math within a few ulps.
    const double tol = 1e-6;

    float x[6] = {1, 0, 0, 1, 5, 6};
    struct rope_params rp = rp_default(ROPE_MODE_NORMAL, 4, 100.0f);
    cr_assert_eq(be->ops->rope(be, x, &pos, 1, 1, 6, &rp), 0, "%s", be->err.msg);
    // normal: pairs (0,1) and (2,3). (1,0) by 2 -> (cos 2, sin 2);
    // (0,1) by 0.2 -> (-sin 0.2, cos 0.2).
    const double want_n[6] = {c2, s2, -s02, c02, 5, 6};
    for (int i = 0; i < 6; i++)
        expect_near(x[i], want_n[i], tol, "normal", i);

    float y[6] = {1, 0, 0, 1, 5, 6};
    rp.mode = ROPE_MODE_NEOX;
    cr_assert_eq(be->ops->rope(be, y, &pos, 1, 1, 6, &rp), 0, "%s", be->err.msg);
    // NeoX: pairs (0,2) and (1,3). (x0,x2) = (1,0) by 2 -> x0 = cos 2, x2 = sin 2;
    // (x1,x3) = (0,1) by 0.2 -> x1 = -sin 0.2, x3 = cos 0.2.
    const double want_x[6] = {c2, -s02, s2, c02, 5, 6};
    for (int i = 0; i < 6; i++)
        expect_near(y[i], want_x[i], tol, "neox", i);

    // Frequency factors divide theta: ff = {1, 2} turns pair 1 by 0.1 only.
    // attn_factor 3 without YaRN scales cos and sin by 3.
    const float ff[2] = {1.0f, 2.0f};
    float z[6] = {1, 0, 0, 1, 5, 6};
    rp.mode = ROPE_MODE_NORMAL;
    rp.freq_factors = ff;
    rp.attn_factor = 3.0f;
    cr_assert_eq(be->ops->rope(be, z, &pos, 1, 1, 6, &rp), 0, "%s", be->err.msg);
    const double want_f[6] = {3 * c2, 3 * s2, -3 * sin(0.1), 3 * cos(0.1), 5, 6};
    for (int i = 0; i < 6; i++)
        expect_near(z[i], want_f[i], 3 * tol, "freq_factors", i);

    // pos 0 is the identity; a negative position turns backwards.
    float w[4] = {0.5f, -0.25f, 1, 2};
    const int32_t p0 = 0, pm = -2;
    rp = rp_default(ROPE_MODE_NORMAL, 4, 100.0f);
    cr_assert_eq(be->ops->rope(be, w, &p0, 1, 1, 4, &rp), 0);
    const float w0[4] = {0.5f, -0.25f, 1, 2};
    cr_expect_arr_eq(w, w0, sizeof w, "pos 0 must not change x");
    float u[4] = {1, 0, 1, 0};
    cr_assert_eq(be->ops->rope(be, u, &pm, 1, 1, 4, &rp), 0);
    expect_near(u[1], -s2, tol, "negative pos", 1);
    expect_near(u[3], -s02, tol, "negative pos", 3);
    backend_destroy(be);
}

// The seed configuration with YaRN: n_rot 128, n_ctx_orig 4096, base 10000,
// beta 32/1 (corr dims {20, 46}), freq_scale 0.25, ext_factor 1. Every pair
// starts at (1, 0), so it ends at mscale * (cos theta_i, sin theta_i) with,
// by hand: theta_e = pos * 10000^(-2i/128); mix = 1 for i <= 20, 0 for i >= 46,
// 1 - (i-20)/26 between; theta = 0.25 theta_e (1 - mix) + theta_e mix;
// mscale = 1 + 0.1 ln 4 = 1.1386294.
Test(rope, hand_yarn) {
    struct backend *be = mk_backend(2);
    struct rope_params rp = rp_default(ROPE_MODE_NORMAL, 128, 10000.0f);
    rp.freq_scale = 0.25f;
    rp.ext_factor = 1.0f;
    const int32_t pos = 3;
    float x[128];
    for (int i = 0; i < 64; i++) {
        x[2 * i] = 1.0f;
        x[2 * i + 1] = 0.0f;
    }
    cr_assert_eq(be->ops->rope(be, x, &pos, 1, 1, 128, &rp), 0, "%s", be->err.msg);
    const double m = 1.0 + 0.1 * log(4.0);
    double worst = 0;
    for (int i = 0; i < 64; i++) {
        const double te = 3.0 * pow(10000.0, -2.0 * i / 128.0);
        double mix = 1.0 - (i - 20) / 26.0;
        mix = mix > 1 ? 1 : (mix < 0 ? 0 : mix);
        const double th = 0.25 * te * (1 - mix) + te * mix;
        // |theta| <= 3: float angle and cos/sin errors are a few 1e-7.
        const double e0 = fabs(x[2 * i] - m * cos(th)), e1 = fabs(x[2 * i + 1] - m * sin(th));
        worst = fmax(worst, fmax(e0, e1));
        cr_expect(e0 <= 2e-6 && e1 <= 2e-6, "pair %d: (%g, %g) want (%g, %g)", i,
                  (double)x[2 * i], (double)x[2 * i + 1], m * cos(th), m * sin(th));
    }
    // Spot values: pair 5 fully extrapolated (theta = theta_e), pair 33 half
    // way (theta = 0.625 theta_e), pair 60 fully interpolated (0.25 theta_e).
    expect_near(atan2(x[11], x[10]), 3.0 * pow(10000.0, -10.0 / 128), 1e-6, "pair5 angle", 5);
    expect_near(atan2(x[67], x[66]), 0.625 * 3.0 * pow(10000.0, -66.0 / 128), 1e-6,
                "pair33 angle", 33);
    expect_near(atan2(x[121], x[120]), 0.25 * 3.0 * pow(10000.0, -120.0 / 128), 1e-6,
                "pair60 angle", 60);
    cr_log_info("rope hand_yarn: worst |error| %.3g (tol 2e-6)", worst);
    backend_destroy(be);
}

// ---------------------------------------------------------------------------
// against a naive implementation

// The spec written out plainly. The angle of pair i is computed in float, as
// specified (the running product pos * theta_scale^i, the division by the
// frequency factor, the YaRN mix): at |pos| ~ 1e5 a float angle's last bit is
// ~0.008 rad, so the spec's float steps are part of what is being tested, not
// noise to be compared away. The magnitude, cos/sin and the rotation are
// done in double; pairs by mode; dims >= n_rot copied.
static void naive_rope_head(double *out, const float *x, int head_dim, int32_t pos,
                            const struct rope_params *rp, bool magnitude) {
    const int n = rp->n_rot, half = n / 2;
    const float theta_scale = powf(rp->freq_base, -2.0f / n);
    float dims[2];
    rope_yarn_corr_dims(n, rp->n_ctx_orig, rp->freq_base, rp->beta_fast, rp->beta_slow, dims);
    double m = magnitude ? rp->attn_factor : 1.0;
    if (magnitude && rp->ext_factor != 0.0f)
        m *= 1.0 + 0.1 * log(1.0 / rp->freq_scale);
    for (int d = 0; d < head_dim; d++)
        out[d] = x[d];
    float run = (float)pos;
    for (int i = 0; i < half; i++) {
        const float te = run / (rp->freq_factors ? rp->freq_factors[i] : 1.0f);
        run *= theta_scale;
        float th = rp->freq_scale * te;
        if (rp->ext_factor != 0.0f) {
            const float y = ((float)i - dims[0]) / fmaxf(0.001f, dims[1] - dims[0]);
            const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * rp->ext_factor;
            th = th * (1.0f - mix) + te * mix;
        }
        const int a = rp->mode == ROPE_MODE_NEOX ? i : 2 * i;
        const int b = rp->mode == ROPE_MODE_NEOX ? i + half : 2 * i + 1;
        const double x0 = x[a], x1 = x[b];
        out[a] = m * (x0 * cos((double)th) - x1 * sin((double)th));
        out[b] = m * (x0 * sin((double)th) + x1 * cos((double)th));
    }
}

struct rope_case {
    const char *name;
    enum rope_mode mode;
    bool yarn;
    bool ff;
};

static const struct rope_case rope_cases[] = {
    {"normal", ROPE_MODE_NORMAL, false, false},
    {"neox", ROPE_MODE_NEOX, false, false},
    {"yarn-normal", ROPE_MODE_NORMAL, true, false},
    {"yarn-neox", ROPE_MODE_NEOX, true, false},
    {"freq-factors", ROPE_MODE_NEOX, false, true},
};

static float case_ff[64];

static struct rope_params rp_case(const struct rope_case *rc, int n_rot) {
    struct rope_params rp = rp_default(rc->mode, n_rot, 10000.0f);
    if (rc->yarn) {
        rp.freq_scale = 0.25f;
        rp.ext_factor = 1.0f;
        rp.attn_factor = 1.0f;
    }
    if (rc->ff) {
        // llama3-style factors: 1 for fast pairs, up to 8 for slow ones.
        for (int i = 0; i < n_rot / 2; i++)
            case_ff[i] = 1.0f + 7.0f * (float)i / (float)(n_rot / 2 - 1);
        rp.freq_factors = case_ff;
    }
    return rp;
}

// Odd head_dim 33 (n_rot 32, dim 32 copied), 3 heads, 7 tokens, positions up
// to 100000 and negative ones; thread counts 1 and 3 must agree bit for bit.
Test(rope, random_vs_naive) {
    enum { T = 7, H = 3, D = 33, R = 32 };
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3);
    const int32_t pos[T] = {0, 1, 17, 4095, 100000, -37, 2500};
    for (size_t ci = 0; ci < sizeof rope_cases / sizeof rope_cases[0]; ci++) {
        const struct rope_case *rc = &rope_cases[ci];
        struct rope_params rp = rp_case(rc, R);
        rng_seed(ci + 1);
        float x[T * H * D], x1[T * H * D], x3[T * H * D];
        for (int i = 0; i < T * H * D; i++)
            x[i] = frand();
        memcpy(x1, x, sizeof x);
        memcpy(x3, x, sizeof x);
        cr_assert_eq(b1->ops->rope(b1, x1, pos, T, H, D, &rp), 0, "%s", b1->err.msg);
        cr_assert_eq(b3->ops->rope(b3, x3, pos, T, H, D, &rp), 0, "%s", b3->err.msg);
        cr_expect_arr_eq(x1, x3, sizeof x1, "%s: 1 vs 3 threads differ", rc->name);
        // Same float angles as the naive code; what differs is cosf/sinf vs
        // cos/sin of the same angle (<= 1 ulp) and float vs double rotation
        // arithmetic: a few float roundings of values <= 1.14 * 2 (mscale,
        // |x0| + |x1|), below 1e-6. Tol 2e-6.
        double worst = 0;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                double want[D];
                const size_t off = ((size_t)t * H + h) * D;
                naive_rope_head(want, x + off, D, pos[t], &rp, true);
                for (int d = 0; d < D; d++) {
                    const double e = fabs(x1[off + d] - want[d]);
                    worst = fmax(worst, e);
                    cr_expect(e <= 2e-6, "%s t%d h%d d%d: %.9g vs %.9g", rc->name, t, h, d,
                              (double)x1[off + d], want[d]);
                }
                cr_expect_eq(x1[off + D - 1], x[off + D - 1], "%s: dim past n_rot must be copied",
                             rc->name);
            }
        cr_log_info("rope %s vs naive: worst |error| %.3g (tol 2e-6)", rc->name, worst);
    }
    backend_destroy(b1);
    backend_destroy(b3);
}

// The float running product against exact angles pos * base^(-2i/n) in
// double: the running product gains ~1 ulp per pair, so the angle error is
// about pos * i * theta_scale^i * 6e-8 <= pos * 2.6 * 6e-8 (max of
// i*0.866^i is 2.6 at i = 7) ≈ 1.6e-7 * pos rad, plus the float rounding of
// the angle itself. At pos 4096 that is ~7e-4: this is the float32 limit
// llama.cpp shares, and it bounds what CUDA vs CPU comparisons may expect.
Test(rope, float_angle_error_vs_exact) {
    struct backend *be = mk_backend(1);
    struct rope_params rp = rp_default(ROPE_MODE_NORMAL, 128, 10000.0f);
    const int32_t ps[] = {1, 100, 4096, 32768};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        float x[128];
        for (int i = 0; i < 64; i++) {
            x[2 * i] = 1.0f;
            x[2 * i + 1] = 0.0f;
        }
        cr_assert_eq(be->ops->rope(be, x, &ps[k], 1, 1, 128, &rp), 0);
        double worst = 0;
        for (int i = 0; i < 64; i++) {
            const double th = ps[k] * pow(10000.0, -2.0 * i / 128.0);
            worst = fmax(worst, fmax(fabs(x[2 * i] - cos(th)), fabs(x[2 * i + 1] - sin(th))));
        }
        const double tol = 1e-6 + 2.5e-7 * ps[k];
        cr_expect(worst <= tol, "pos %d: worst %.3g > %.3g", ps[k], worst, tol);
        cr_log_info("rope pos %d vs exact double angles: worst %.3g (tol %.3g)", ps[k], worst,
                    tol);
    }
    backend_destroy(be);
}

// ---------------------------------------------------------------------------
// rope_kv_store

Test(rope, kv_store) {
    enum { T = 3, HK = 2, D = 10, DV = 6, NCTX = 8, R = 8 };
    for (int tk = 0; tk < 2; tk++) {
        for (int tv = 0; tv < 2; tv++) {
            const enum ggml_type type_k = tk ? GGML_TYPE_F16 : GGML_TYPE_F32;
            const enum ggml_type type_v = tv ? GGML_TYPE_F16 : GGML_TYPE_F32;
            const size_t ek = tk ? 2 : 4, ev = tv ? 2 : 4;
            struct backend *be = mk_backend(3);
            struct rope_params rp = rp_default(ROPE_MODE_NEOX, R, 10000.0f);
            rp.ext_factor = 1.0f;
            rp.freq_scale = 0.5f;
            rp.attn_factor = 1.5f;
            rng_seed(77 + tk * 2 + tv);
            float k[T * HK * D], kr[T * HK * D], v[T * HK * DV];
            float q[T * 2 * HK * D], qr[T * 2 * HK * D]; // GQA: twice the query heads
            for (int i = 0; i < T * HK * D; i++)
                k[i] = frand();
            for (int i = 0; i < T * 2 * HK * D; i++)
                q[i] = qr[i] = frand();
            for (int i = 0; i < T * HK * DV; i++)
                v[i] = frand();
            memcpy(kr, k, sizeof k);
            const int32_t pos[T] = {5, 900, 12}, cells[T] = {6, 0, 3};
            unsigned char kc[NCTX * HK * D * 4], vc[NCTX * HK * DV * 4];
            memset(kc, 0xAB, sizeof kc);
            memset(vc, 0xCD, sizeof vc);
            cr_assert_eq(be->ops->rope(be, kr, pos, T, HK, D, &rp), 0);
            cr_assert_eq(be->ops->rope(be, qr, pos, T, 2 * HK, D, &rp), 0);
            cr_assert_eq(be->ops->rope_kv_store(be, q, 2 * HK, k, v, kc, type_k, vc, type_v, pos,
                                                cells, T, HK, D, DV, &rp),
                         0, "%s", be->err.msg);
            cr_expect_arr_eq(k, kr, sizeof k, "k must be left rotated, exactly as rope");
            cr_expect_arr_eq(q, qr, sizeof q, "q must be rotated exactly as rope");
            for (int c = 0; c < NCTX; c++) {
                int t = -1;
                for (int i = 0; i < T; i++)
                    if (cells[i] == c)
                        t = i;
                const unsigned char *krow = kc + (size_t)c * HK * D * ek;
                const unsigned char *vrow = vc + (size_t)c * HK * DV * ev;
                if (t < 0) {
                    for (size_t b = 0; b < HK * D * ek; b++)
                        cr_expect_eq(krow[b], 0xAB, "cell %d of K touched", c);
                    for (size_t b = 0; b < HK * DV * ev; b++)
                        cr_expect_eq(vrow[b], 0xCD, "cell %d of V touched", c);
                    continue;
                }
                // Stored values are exactly the rotated K / V, rounded once to F16.
                for (int i = 0; i < HK * D; i++) {
                    const float want = kr[t * HK * D + i];
                    if (tk)
                        cr_expect_eq(((const uint16_t *)krow)[i], quant_f32_to_fp16(want));
                    else
                        cr_expect_eq(((const float *)krow)[i], want);
                }
                for (int i = 0; i < HK * DV; i++) {
                    const float want = v[t * HK * DV + i];
                    if (tv)
                        cr_expect_eq(((const uint16_t *)vrow)[i], quant_f32_to_fp16(want));
                    else
                        cr_expect_eq(((const float *)vrow)[i], want);
                }
            }
            backend_destroy(be);
        }
    }
}

// ---------------------------------------------------------------------------
// kv_shift

// Reads a cache row as float.
static void row_get(float *dst, const void *cache, enum ggml_type t, size_t off, int n) {
    for (int i = 0; i < n; i++)
        dst[i] = t == GGML_TYPE_F16 ? quant_fp16_to_f32(((const uint16_t *)cache)[off + i])
                                    : ((const float *)cache)[off + i];
}

static double norm2(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

// Shift configurations: normal, NeoX, YaRN (ext_factor 1, freq_scale 0.25,
// attn_factor 1.3 so that a wrongly applied magnitude would show), frequency
// factors. Shape: 2 layers, 16 cells, 2 KV heads, head_dim 34 with n_rot 32.
enum { SL = 2, SC = 16, SH = 2, SD = 34, SR = 32 };

struct shift_case {
    const char *name;
    enum rope_mode mode;
    bool yarn, ff;
};

static const struct shift_case shift_cases[] = {
    {"normal", ROPE_MODE_NORMAL, false, false},
    {"neox", ROPE_MODE_NEOX, false, false},
    {"yarn", ROPE_MODE_NORMAL, true, false},
    {"freq-factors", ROPE_MODE_NEOX, false, true},
};

static struct rope_params rp_shift(const struct shift_case *sc) {
    struct rope_params rp = rp_default(sc->mode, SR, 10000.0f);
    if (sc->yarn) {
        rp.ext_factor = 1.0f;
        rp.freq_scale = 0.25f;
        rp.attn_factor = 1.3f;
    }
    if (sc->ff) {
        for (int i = 0; i < SR / 2; i++)
            case_ff[i] = 1.0f + 7.0f * (float)i / (float)(SR / 2 - 1);
        rp.freq_factors = case_ff;
    }
    return rp;
}

// Stores k[l][c] (raw, [SL][SC][SH][SD]) rotated to pos[c] into every layer of
// the cache, through rope_kv_store.
static void fill_cache(struct backend *be, void *kc, enum ggml_type type_k, const float *k_raw,
                       const int32_t *pos, const struct rope_params *rp) {
    const size_t ek = type_k == GGML_TYPE_F16 ? 2 : 4;
    static float vbuf[SC * SH * SD];
    static unsigned char vcache[SC * SH * SD * 4];
    int32_t cells[SC];
    for (int c = 0; c < SC; c++)
        cells[c] = c;
    for (int l = 0; l < SL; l++) {
        float k[SC * SH * SD];
        memcpy(k, k_raw + (size_t)l * SC * SH * SD, sizeof k);
        cr_assert_eq(be->ops->rope_kv_store(be, NULL, 0, k, vbuf,
                                            (char *)kc + (size_t)l * SC * SH * SD * ek, type_k,
                                            vcache, GGML_TYPE_F32, pos, cells, SC, SH, SD, SD, rp),
                     0, "%s", be->err.msg);
    }
}

// rope(k, p) then shift by d equals rope(k, p + d). Positions up to 3000 and
// deltas in [-1500, 1500] (some 0). Tolerance, elements |k| <= 1 (|mscale k|
// <= 1.3): F32: both sides carry float angle errors of ~1.6e-7 * |pos| rad
// (see float_angle_error_vs_exact) on |p|, |d| and |p+d| <= 4500: ~2e-3 in
// the worst case, typically far less; tol 3e-3 * max|k|. F16 adds the f16
// rounding of both sides, 2 * 2^-11 relative (~1e-3): tol 5e-3 * max|k|.
// Cells with delta 0 must be bit-identical, every layer must be shifted, and
// the norm of each head must be kept (no mscale on a shift): F32 within 1e-5
// relative (a few float roundings per element), F16 within 2e-3 (the
// requantization, 2^-11 per element).
Test(rope, kv_shift_equals_rope_at_new_pos) {
    for (int threads = 1; threads <= 3; threads += 2) {
        struct backend *be = mk_backend(threads);
        for (size_t ci = 0; ci < sizeof shift_cases / sizeof shift_cases[0]; ci++) {
            for (int f16 = 0; f16 < 2; f16++) {
                const struct shift_case *sc = &shift_cases[ci];
                const enum ggml_type tk = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
                struct rope_params rp = rp_shift(sc);
                rng_seed(1000 + ci * 2 + f16);
                static float k_raw[SL * SC * SH * SD];
                for (int i = 0; i < SL * SC * SH * SD; i++)
                    k_raw[i] = frand();
                int32_t pos[SC], delta[SC], pos2[SC];
                for (int c = 0; c < SC; c++) {
                    pos[c] = irand(0, 3000);
                    delta[c] = (c % 5 == 0) ? 0 : irand(-1500, 1500);
                    pos2[c] = pos[c] + delta[c];
                }
                static unsigned char kc[SL * SC * SH * SD * 4], want[SL * SC * SH * SD * 4],
                    before[SL * SC * SH * SD * 4];
                fill_cache(be, kc, tk, k_raw, pos, &rp);
                fill_cache(be, want, tk, k_raw, pos2, &rp);
                memcpy(before, kc, sizeof kc);
                cr_assert_eq(be->ops->kv_shift(be, kc, tk, delta, SL, SC, SH, SD, &rp, 0), 0, "%s",
                             be->err.msg);
                const double tol = (f16 ? 5e-3 : 3e-3) * rp.attn_factor *
                                   (sc->yarn ? 1.0 + 0.1 * log(4.0) : 1.0);
                const double ntol = f16 ? 2e-3 : 1e-5;
                double worst = 0, worst_norm = 0;
                for (int l = 0; l < SL; l++)
                    for (int c = 0; c < SC; c++)
                        for (int h = 0; h < SH; h++) {
                            const size_t off = (((size_t)l * SC + c) * SH + h) * SD;
                            float a[SD], b[SD], o[SD];
                            row_get(a, kc, tk, off, SD);
                            row_get(b, want, tk, off, SD);
                            row_get(o, before, tk, off, SD);
                            if (delta[c] == 0) {
                                cr_expect_arr_eq(a, o, sizeof a,
                                                 "%s: cell %d with delta 0 changed", sc->name, c);
                                continue;
                            }
                            for (int d = 0; d < SD; d++) {
                                const double e = fabs(a[d] - b[d]);
                                worst = fmax(worst, e);
                                cr_expect(e <= tol, "%s %s l%d c%d h%d d%d: %.7g vs %.7g",
                                          sc->name, f16 ? "f16" : "f32", l, c, h, d,
                                          (double)a[d], (double)b[d]);
                            }
                            const double rel = fabs(norm2(a, SD) / norm2(o, SD) - 1.0);
                            worst_norm = fmax(worst_norm, rel);
                            cr_expect(rel <= ntol, "%s: |k| changed by %.3g (l%d c%d h%d)",
                                      sc->name, rel, l, c, h);
                        }
                cr_log_info("kv_shift %s %s threads %d: worst |shift - rope(p+d)| %.3g (tol "
                            "%.3g), worst norm change %.3g (tol %.3g)",
                            sc->name, f16 ? "f16" : "f32", threads, worst, tol, worst_norm,
                            ntol);
            }
        }
        backend_destroy(be);
    }
}

// 100 shifts by small random deltas (|d| <= 8) from p0 = 500 against one rope
// at p0 + sum(d). F32: each shift adds a few float roundings (~2e-7 relative)
// and small-angle errors; over 100 shifts the element error stays below 1e-4
// and the norm within 2e-5 relative. F16: every shift rounds K to f16 again
// (u = 2^-11 per element). The hard worst case is (1+u)^100 - 1 ≈ 5%, but
// round-to-nearest errors are unbiased, so they add as a random walk:
// ~u*sqrt(100/3) ≈ 3e-3 per element (worst of 2176 elements measured ~1e-2),
// tol 2e-2; the norm drift averages over the 34 dims of a head, ~4e-4 per
// head (worst of 64 heads measured ~1.2e-3), tol 5e-3 — any systematic
// growth (a re-applied mscale of even 1.0001 per shift gives 1%) fails it.
Test(rope, kv_shift_no_drift) {
    struct backend *be = mk_backend(3);
    for (size_t ci = 0; ci < sizeof shift_cases / sizeof shift_cases[0]; ci++) {
        for (int f16 = 0; f16 < 2; f16++) {
            const struct shift_case *sc = &shift_cases[ci];
            const enum ggml_type tk = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
            struct rope_params rp = rp_shift(sc);
            rng_seed(5000 + ci * 2 + f16);
            static float k_raw[SL * SC * SH * SD];
            for (int i = 0; i < SL * SC * SH * SD; i++)
                k_raw[i] = frand();
            int32_t pos[SC], total[SC];
            for (int c = 0; c < SC; c++)
                pos[c] = total[c] = 500;
            static unsigned char kc[SL * SC * SH * SD * 4], want[SL * SC * SH * SD * 4],
                start[SL * SC * SH * SD * 4];
            fill_cache(be, kc, tk, k_raw, pos, &rp);
            memcpy(start, kc, sizeof kc);
            for (int it = 0; it < 100; it++) {
                int32_t delta[SC];
                for (int c = 0; c < SC; c++) {
                    delta[c] = irand(-8, 8);
                    total[c] += delta[c];
                }
                cr_assert_eq(be->ops->kv_shift(be, kc, tk, delta, SL, SC, SH, SD, &rp, 0), 0);
            }
            fill_cache(be, want, tk, k_raw, total, &rp);
            const double scale = rp.attn_factor * (sc->yarn ? 1.0 + 0.1 * log(4.0) : 1.0);
            const double tol = (f16 ? 2e-2 : 1e-4) * scale, ntol = f16 ? 5e-3 : 2e-5;
            double worst = 0, worst_norm = 0;
            for (int row = 0; row < SL * SC * SH; row++) {
                float a[SD], b[SD], o[SD];
                row_get(a, kc, tk, (size_t)row * SD, SD);
                row_get(b, want, tk, (size_t)row * SD, SD);
                row_get(o, start, tk, (size_t)row * SD, SD);
                for (int d = 0; d < SD; d++)
                    worst = fmax(worst, fabs(a[d] - b[d]));
                worst_norm = fmax(worst_norm, fabs(norm2(a, SD) / norm2(o, SD) - 1.0));
            }
            cr_expect(worst <= tol, "%s %s: 100 shifts drifted %.3g from rope(p0+sum d) (tol %.3g)",
                      sc->name, f16 ? "f16" : "f32", worst, tol);
            cr_expect(worst_norm <= ntol, "%s %s: norm drifted %.3g (tol %.3g)", sc->name,
                      f16 ? "f16" : "f32", worst_norm, ntol);
            cr_log_info("kv_shift 100x %s %s: worst element drift %.3g (tol %.3g), norm drift "
                        "%.3g (tol %.3g)",
                        sc->name, f16 ? "f16" : "f32", worst, tol, worst_norm, ntol);
        }
    }
    backend_destroy(be);
}

// Hand check of a shift: one cell, one head [1, 0, 0, 1, 7], n_rot 4, base
// 100, YaRN off, attn_factor 2 (must NOT apply): delta 2 turns pair 0 by 2 and
// pair 1 by 0.2, dim 4 untouched.
Test(rope, kv_shift_hand) {
    struct backend *be = mk_backend(1);
    struct rope_params rp = rp_default(ROPE_MODE_NORMAL, 4, 100.0f);
    rp.attn_factor = 2.0f;
    float k[5] = {1, 0, 0, 1, 7};
    const int32_t delta = 2;
    cr_assert_eq(be->ops->kv_shift(be, k, GGML_TYPE_F32, &delta, 1, 1, 1, 5, &rp, 0), 0, "%s",
                 be->err.msg);
    const double want[5] = {cos(2.0), sin(2.0), -sin(0.2), cos(0.2), 7};
    for (int i = 0; i < 5; i++)
        expect_near(k[i], want[i], 1e-6, "shift", i);
    backend_destroy(be);
}

Test(rope, bad_params) {
    struct backend *be = mk_backend(1);
    float x[8] = {0};
    const int32_t pos = 1;
    struct rope_params rp = rp_default(ROPE_MODE_NORMAL, 3, 10000.0f);
    cr_expect_eq(be->ops->rope(be, x, &pos, 1, 1, 8, &rp), VERR_RANGE, "odd n_rot");
    cr_expect(strstr(be->err.msg, "n_rot") != NULL, "message: %s", be->err.msg);
    rp.n_rot = 10;
    cr_expect_eq(be->ops->rope(be, x, &pos, 1, 1, 8, &rp), VERR_RANGE, "n_rot > head_dim");
    rp.n_rot = 8;
    rp.mode = (enum rope_mode)1;
    cr_expect_eq(be->ops->rope(be, x, &pos, 1, 1, 8, &rp), VERR_UNSUPPORTED, "mode 1");
    rp.mode = ROPE_MODE_NORMAL;
    rp.freq_scale = 0.0f;
    cr_expect_eq(be->ops->rope(be, x, &pos, 1, 1, 8, &rp), VERR_RANGE, "freq_scale 0");
    rp.freq_scale = 1.0f;
    cr_expect_eq(be->ops->kv_shift(be, x, GGML_TYPE_Q4_K, &pos, 1, 1, 1, 8, &rp, 0),
                 VERR_UNSUPPORTED, "q4_K cache: not a cache type");
    cr_expect_eq(be->ops->kv_shift(be, x, GGML_TYPE_Q8_0, &pos, 1, 1, 1, 8, &rp, 0), VERR_RANGE,
                 "q8_0 cache of 8-element rows: not whole blocks");
    cr_expect(strstr(be->err.msg, "not whole q8_0 blocks") != NULL, "message: %s", be->err.msg);
    cr_expect_eq(be->ops->rope(be, x, &pos, 1, 1, 8, &rp), 0, "valid params: %s", be->err.msg);
    backend_destroy(be);
}
