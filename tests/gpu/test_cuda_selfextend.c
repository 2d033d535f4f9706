// RoPE inside attention on CUDA (the unrotated cache mode, exact
// self-extend: host/ops/selfextend.h) against the CPU reference op on random
// inputs: decode with split-K, prefill on tensor cores (F16 caches, >= 16
// tokens) and on attn_kernel (F32), normal and
// NeoX RoPE, partial rotation, YaRN with frequency factors, several (G, W),
// several sequences with empty and shared cells; and the KV store with no
// rotation (rp NULL) bit for bit; a whole tiny model (n_ctx_train 64, 100
// tokens) with G 2 W 16 in batches of 1 (CUDA graphs) and 25 against the CPU
// (logits within 1e-4 of max|logit| in batches of 1, f32 activations, as
// tests/gpu/test_forward_cuda.c; 1e-3 for the tensor-core prefill of the
// F16 cache, as there), and with two sequences with their own (G, W) in the
// same batches (forward_batch.se) likewise; G and W per query token
// (attn_args.q_se: several sequences with their own values in one call, both
// kernels) against one scalar call per (G, W), bit for bit on CUDA. Runs as
// test_emu_cuda_selfextend under the emulator (small shapes: it is slow).
//
// Tolerance, relative to max|v|: (1e-4 + 8 sqrt(n_kv) 2^-24). The output
// is a convex combination of V rows; moving one score by delta moves it by
// at most 2 delta max|v|. Both sides rotate q and K in float from the same
// angles (CUDA's cosf/sinf within 2 ulp, glibc's within 1: a rotated
// element differs by ~2e-7 of |x|), so a score of |s| <= ~10 over <= 128
// terms differs by ~3e-6, plus the dot products' other summation order
// (~1e-5); 1e-4 leaves margin. The n_kv-term sums add a random walk of
// roundings (the second term). A far key scored with the near rotation (or
// the reverse) moves outputs by ~1e-2 of max|v| and more.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "tests/context_helpers.h"
#include "tests/gpu/gpu_fixture.h"
#include "tests/rng_splitmix.h"
#include "tests/tiny_model.h"

TestSuite(cuda_se, .init = setup, .fini = teardown, .timeout = 900);

struct se_case {
    int n_tok, n_kv, n_head, n_head_kv, head_dim, n_rot;
    enum ggml_type tk, tv;
    enum rope_mode mode;
    bool yarn; // YaRN ramp + mscale + frequency factors
    int G, W;  // G 1: RoPE inside attention without grouping
    int n_seq; // 1: causal (cell c at position c); more: random layout
    const char *note;
};

static const struct se_case cases[] = {
    {1, 700, 4, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, ROPE_MODE_NORMAL, false, 4, 64, 1,
     "decode split-k G4 W64"},
    {1, 300, 4, 4, 32, 32, GGML_TYPE_F32, GGML_TYPE_F32, ROPE_MODE_NEOX, true, 3, 20, 1,
     "decode neox yarn G3 W20"},
    {20, 160, 4, 2, 32, 16, GGML_TYPE_F16, GGML_TYPE_F16, ROPE_MODE_NEOX, false, 2, 16, 1,
     "prefill tensor cores partial rotation G2 W16"},
    {33, 200, 4, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, ROPE_MODE_NORMAL, true, 4, 24, 2,
     "prefill tensor cores yarn multi-seq G4 W24"},
    {18, 150, 4, 4, 32, 32, GGML_TYPE_F32, GGML_TYPE_F32, ROPE_MODE_NORMAL, false, 3, 10, 1,
     "prefill f32 attn_kernel G3 W10"},
    {3, 200, 6, 2, 48, 48, GGML_TYPE_F16, GGML_TYPE_F32, ROPE_MODE_NORMAL, false, 8, 8, 3,
     "multi-seq G8 W8"},
    {2, 120, 4, 2, 32, 32, GGML_TYPE_F32, GGML_TYPE_F16, ROPE_MODE_NORMAL, true, 1, 0, 1,
     "G1: rope inside, no grouping"},
};

static void *cache_from(const float *f, enum ggml_type t, size_t n) {
    void *d = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        if (t == GGML_TYPE_F16)
            ((uint16_t *)d)[i] = quant_f32_to_fp16(f[i]);
        else
            ((float *)d)[i] = f[i];
    }
    return d;
}

static float *nrand_array(size_t n) {
    float *x = malloc(n * sizeof *x + 16);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)nrand();
    return x;
}

// The rope params of a case; freq_factors: [n_rot/2] on each backend (yarn).
static struct rope_params case_rope(const struct se_case *c) {
    struct rope_params rp = {
        .mode = c->mode,
        .n_rot = c->n_rot,
        .n_ctx_orig = 64,
        .freq_base = 10000.0f,
        .freq_scale = c->yarn ? 0.25f : 1.0f,
        .ext_factor = c->yarn ? 1.0f : 0.0f,
        .attn_factor = 1.0f,
        .beta_fast = 32.0f,
        .beta_slow = 1.0f,
    };
    return rp;
}

// Cell positions and sequences, query positions and sequences of a case.
static void case_layout(const struct se_case *c, int seq_words, int32_t *cell_pos,
                        uint64_t *cell_seq, int32_t *q_pos, int32_t *q_seq) {
    for (int i = 0; i < c->n_kv; i++) {
        if (c->n_seq == 1) {
            cell_pos[i] = i;
            cell_seq[(size_t)i * seq_words] = 1;
            continue;
        }
        cell_pos[i] = (rng_u64() % 10 == 0) ? -1 : irand(0, 2 * c->n_kv);
        if (cell_pos[i] < 0)
            continue;
        const int s = irand(0, c->n_seq - 1);
        cell_seq[(size_t)i * seq_words] |= 1ull << s;
        if (rng_u64() % 4 == 0)
            cell_seq[(size_t)i * seq_words] |= 1ull << irand(0, c->n_seq - 1);
    }
    for (int t = 0; t < c->n_tok; t++) {
        q_pos[t] = c->n_seq == 1 ? c->n_kv - c->n_tok + t : irand(c->n_kv, 2 * c->n_kv);
        q_seq[t] = c->n_seq == 1 ? 0 : irand(0, c->n_seq - 1);
    }
}

static double run_case(const struct se_case *c) {
    const int seq_words = 1;
    const size_t nq = (size_t)c->n_tok * c->n_head * c->head_dim;
    const size_t nk = (size_t)c->n_kv * c->n_head_kv * c->head_dim;
    float *q = nrand_array(nq), *kf = nrand_array(nk), *vf = nrand_array(nk);
    void *k = cache_from(kf, c->tk, nk), *v = cache_from(vf, c->tv, nk);
    int32_t *cell_pos = malloc(sizeof(int32_t) * c->n_kv), *q_pos = malloc(4 * c->n_tok);
    int32_t *q_seq = malloc(4 * c->n_tok);
    uint64_t *cell_seq = calloc((size_t)c->n_kv, sizeof(uint64_t));
    case_layout(c, seq_words, cell_pos, cell_seq, q_pos, q_seq);
    float ff[64];
    for (int i = 0; i < c->n_rot / 2; i++)
        ff[i] = 1.0f + 0.05f * (float)i;
    const size_t esz_k = c->tk == GGML_TYPE_F16 ? 2 : 4, esz_v = c->tv == GGML_TYPE_F16 ? 2 : 4;
    struct dbuf bq = dbuf_new(q, nq * 4), bk = dbuf_new(k, nk * esz_k),
                bv = dbuf_new(v, nk * esz_v);
    struct dbuf bcp = dbuf_new(cell_pos, 4 * (size_t)c->n_kv);
    struct dbuf bcs = dbuf_new(cell_seq, 8 * (size_t)c->n_kv);
    struct dbuf bqp = dbuf_new(q_pos, 4 * (size_t)c->n_tok),
                bqs = dbuf_new(q_seq, 4 * (size_t)c->n_tok);
    struct dbuf bff = dbuf_new(ff, sizeof ff);
    const size_t no = (size_t)c->n_tok * c->n_head * c->head_dim;
    struct dbuf bo = dbuf_new(NULL, no * 4);
    struct rope_params rc = case_rope(c), rg = rc;
    rc.freq_factors = c->yarn ? bff.c : NULL;
    rg.freq_factors = c->yarn ? bff.g : NULL;
    struct attn_args ac = {
        .out = bo.c,
        .q = bq.c,
        .k = bk.c,
        .v = bv.c,
        .type_k = c->tk,
        .type_v = c->tv,
        .cell_pos = bcp.c,
        .cell_seq = bcs.c,
        .seq_words = seq_words,
        .q_pos = bqp.c,
        .q_seq = bqs.c,
        .n_tok = c->n_tok,
        .n_kv = c->n_kv,
        .n_head = c->n_head,
        .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim,
        .head_dim_v = c->head_dim,
        .scale = 1.0f / sqrtf((float)c->head_dim),
        .rope = &rc,
        .se_g = c->G,
        .se_w = c->W,
    };
    struct attn_args ag = ac;
    ag.out = bo.g;
    ag.q = bq.g;
    ag.k = bk.g;
    ag.v = bv.g;
    ag.cell_pos = bcp.g;
    ag.cell_seq = bcs.g;
    ag.q_pos = bqp.g;
    ag.q_seq = bqs.g;
    ag.rope = &rg;
    OK(cpu, cpu->ops->attention(cpu, &ac));
    OK(gpu, gpu->ops->attention(gpu, &ag));
    float *oc = malloc(no * 4), *og = malloc(no * 4);
    OK(cpu, cpu->ops->download(cpu, oc, bo.c, no * 4));
    OK(gpu, gpu->ops->download(gpu, og, bo.g, no * 4));
    OK(gpu, gpu->ops->sync(gpu));
    float vmax = 0.0f;
    for (size_t i = 0; i < nk; i++) {
        const float a =
            c->tv == GGML_TYPE_F16 ? fabsf(quant_fp16_to_f32(((uint16_t *)v)[i])) : fabsf(vf[i]);
        vmax = a > vmax ? a : vmax;
    }
    double worst = 0;
    for (size_t i = 0; i < no; i++)
        worst = fmax(worst, fabs((double)oc[i] - og[i]));
    worst /= vmax;
    // Tensor cores (F16 caches, >= 16 tokens, head dims multiples of 16):
    // q * scale, the rotated K and P are rounded to f16; 3e-3 of max|v| as
    // test_cuda_ops.c's 2e-3 for the rotated-K kernel, plus the rotated K's
    // own rounding (2^-11 relative per element, ~3e-4 on a score).
    const bool tc =
        c->tk == GGML_TYPE_F16 && c->tv == GGML_TYPE_F16 && c->n_tok >= 16 && c->head_dim % 16 == 0;
    const double tol = 1e-4 + 8.0 * sqrt((double)c->n_kv) / 16777216.0 + (tc ? 3e-3 : 0.0);
    cr_log_info("self-extend attention %s: worst |cuda - cpu| / max|v| = %.3g (tol %.3g)\n",
                c->note, worst, tol);
    cr_expect_leq(worst, tol, "%s: %.3g > %.3g", c->note, worst, tol);
    struct dbuf *bs[] = {&bq, &bk, &bv, &bcp, &bcs, &bqp, &bqs, &bff, &bo};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        dbuf_free(bs[i]);
    free(q);
    free(kf);
    free(vf);
    free(k);
    free(v);
    free(cell_pos);
    free(cell_seq);
    free(q_pos);
    free(q_seq);
    free(oc);
    free(og);
    return worst;
}

Test(cuda_se, attention_matches_the_cpu_reference) {
    REQUIRE_GPU();
    rng_seed(13);
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        worst = fmax(worst, run_case(&cases[i]));
    cr_log_info("self-extend attention: worst over the cases %.3g of max|v|\n", worst);
}

// G and W per query token (attn_args.q_se): the tokens of several
// sequences, each with its own (G, W), in one call. The reference for a
// token is the call with its (G, W) as the scalar se_g / se_w (q_se NULL)
// for the whole batch: on the CUDA backend the token's rows must be the same
// bits (a row's scores, softmax and P.V do not depend on the other rows;
// attn_tc_kernel too: a wmma result element depends on its own row and
// column only), on the CPU backend within run_case's tolerance. Sequence s
// uses mix_gw[s]: G 1, two G > 1 with different W (one not a multiple of
// G, so that the key at i - j = W scores differently near and far), the
// first G again with another W (one pass, W per row), G 0 (read as 1).
// Blocks mix them (mix_layout).
static const int mix_gw[5][2] = {{1, 0}, {2, 8}, {3, 10}, {2, 16}, {0, 5}};

enum mix_layout {
    MIX_RANDOM,      // case_layout's random cells and sequences
    MIX_INTERLEAVED, // its random cells; token t of sequence t % n_seq
    MIX_DENSE,       // cell c: sequence c % n_seq at position c / n_seq (every
                     // position there, so every distance); token t of sequence
                     // t % n_seq at one of its last 4 positions (batched decode)
};

struct mix_case {
    struct se_case c; // G, W unused (per token); n_seq 5 (mix_gw)
    enum mix_layout layout;
};

static const struct mix_case mix_cases[] = {
    {{5, 300, 4, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, ROPE_MODE_NORMAL, false, 0, 0, 5,
      "decode split-k f16, dense"},
     MIX_DENSE},
    {{12, 200, 6, 2, 48, 32, GGML_TYPE_F32, GGML_TYPE_F16, ROPE_MODE_NEOX, true, 0, 0, 5,
      "attn_kernel f32/f16 neox yarn partial, random"},
     MIX_RANDOM},
    {{18, 150, 4, 2, 32, 32, GGML_TYPE_F32, GGML_TYPE_F32, ROPE_MODE_NORMAL, false, 0, 0, 5,
      "prefill f32 attn_kernel, interleaved"},
     MIX_INTERLEAVED},
    {{40, 160, 4, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, ROPE_MODE_NORMAL, true, 0, 0, 5,
      "prefill tensor cores BK 64 yarn, dense"},
     MIX_DENSE},
    {{20, 120, 4, 4, 128, 96, GGML_TYPE_F16, GGML_TYPE_F16, ROPE_MODE_NEOX, false, 0, 0, 5,
      "prefill tensor cores BK 32 neox partial, random"},
     MIX_RANDOM},
    {{7, 90, 4, 1, 32, 32, GGML_TYPE_F32, GGML_TYPE_F32, ROPE_MODE_NORMAL, false, 0, 0, 5,
      "decode f32 gqa 4, interleaved"},
     MIX_INTERLEAVED},
};

// Cells and queries of a mix case (seq_words 1).
static void mix_layout(const struct se_case *c, enum mix_layout layout, int32_t *cell_pos,
                       uint64_t *cell_seq, int32_t *q_pos, int32_t *q_seq) {
    case_layout(c, 1, cell_pos, cell_seq, q_pos, q_seq);
    for (int t = 0; layout != MIX_RANDOM && t < c->n_tok; t++)
        q_seq[t] = t % c->n_seq;
    if (layout != MIX_DENSE)
        return;
    for (int i = 0; i < c->n_kv; i++) {
        cell_pos[i] = i / c->n_seq;
        cell_seq[i] = 1ull << (i % c->n_seq);
    }
    for (int t = 0; t < c->n_tok; t++)
        q_pos[t] = c->n_kv / c->n_seq - 1 - irand(0, 3);
}

// One case's inputs on both backends; q_se [n_tok][2]: the (G, W) of each
// token's sequence, seq_gw[q_seq[t]] (also written to q_se_out).
struct mix_io {
    struct dbuf q, k, v, cp, cs, qp, qs, ff, se, o;
    float vmax;
    size_t no; // output floats
};

static struct mix_io mix_inputs(const struct se_case *c, enum mix_layout layout,
                                const int (*seq_gw)[2], int32_t *q_se) {
    const size_t nq = (size_t)c->n_tok * c->n_head * c->head_dim;
    const size_t nk = (size_t)c->n_kv * c->n_head_kv * c->head_dim;
    float *q = nrand_array(nq), *kf = nrand_array(nk), *vf = nrand_array(nk);
    void *k = cache_from(kf, c->tk, nk), *v = cache_from(vf, c->tv, nk);
    int32_t *cell_pos = malloc(4 * (size_t)c->n_kv), *q_pos = malloc(4 * (size_t)c->n_tok);
    int32_t *q_seq = malloc(4 * (size_t)c->n_tok);
    uint64_t *cell_seq = calloc((size_t)c->n_kv, sizeof(uint64_t));
    mix_layout(c, layout, cell_pos, cell_seq, q_pos, q_seq);
    for (int t = 0; t < c->n_tok; t++) {
        q_se[2 * t] = seq_gw[q_seq[t]][0];
        q_se[2 * t + 1] = seq_gw[q_seq[t]][1];
    }
    float ff[64];
    for (int i = 0; i < c->n_rot / 2; i++)
        ff[i] = 1.0f + 0.05f * (float)i;
    struct mix_io io;
    io.vmax = 0.0f;
    for (size_t i = 0; i < nk; i++) {
        const float a =
            c->tv == GGML_TYPE_F16 ? fabsf(quant_fp16_to_f32(((uint16_t *)v)[i])) : fabsf(vf[i]);
        io.vmax = a > io.vmax ? a : io.vmax;
    }
    const size_t ek = c->tk == GGML_TYPE_F16 ? 2 : 4, ev = c->tv == GGML_TYPE_F16 ? 2 : 4;
    io.q = dbuf_new(q, nq * 4);
    io.k = dbuf_new(k, nk * ek);
    io.v = dbuf_new(v, nk * ev);
    io.cp = dbuf_new(cell_pos, 4 * (size_t)c->n_kv);
    io.cs = dbuf_new(cell_seq, 8 * (size_t)c->n_kv);
    io.qp = dbuf_new(q_pos, 4 * (size_t)c->n_tok);
    io.qs = dbuf_new(q_seq, 4 * (size_t)c->n_tok);
    io.ff = dbuf_new(ff, sizeof ff);
    io.se = dbuf_new(q_se, 8 * (size_t)c->n_tok);
    io.no = (size_t)c->n_tok * c->n_head * c->head_dim;
    io.o = dbuf_new(NULL, io.no * 4);
    free(q);
    free(kf);
    free(vf);
    free(k);
    free(v);
    free(cell_pos);
    free(cell_seq);
    free(q_pos);
    free(q_seq);
    return io;
}

static void mix_free(struct mix_io *io) {
    struct dbuf *bs[] = {&io->q,  &io->k,  &io->v,  &io->cp, &io->cs,
                         &io->qp, &io->qs, &io->ff, &io->se, &io->o};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        dbuf_free(bs[i]);
}

// The case's attention on backend be (b: 0 CPU, 1 CUDA) with scalar G, W
// and q_se (the uploaded per-token values) or not, into out (host).
static void mix_call(struct backend *be, int b, const struct se_case *c, struct mix_io *io, int G,
                     int W, bool per_token, float *out) {
    struct rope_params rp = case_rope(c);
    rp.freq_factors = c->yarn ? (b ? io->ff.g : io->ff.c) : NULL;
    struct attn_args a = {
        .out = b ? io->o.g : io->o.c,
        .q = b ? io->q.g : io->q.c,
        .k = b ? io->k.g : io->k.c,
        .v = b ? io->v.g : io->v.c,
        .type_k = c->tk,
        .type_v = c->tv,
        .cell_pos = b ? io->cp.g : io->cp.c,
        .cell_seq = b ? io->cs.g : io->cs.c,
        .seq_words = 1,
        .q_pos = b ? io->qp.g : io->qp.c,
        .q_seq = b ? io->qs.g : io->qs.c,
        .n_tok = c->n_tok,
        .n_kv = c->n_kv,
        .n_head = c->n_head,
        .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim,
        .head_dim_v = c->head_dim,
        .scale = 1.0f / sqrtf((float)c->head_dim),
        .rope = &rp,
        .se_g = G,
        .se_w = W,
        .q_se = per_token ? (b ? io->se.g : io->se.c) : NULL,
    };
    OK(be, be->ops->attention(be, &a));
    OK(be, be->ops->download(be, out, a.out, io->no * 4));
    OK(be, be->ops->sync(be));
}

// A token's (G, W) as the kernels read them: G, W < 1 as 1; W unused at G 1.
static void mix_eff(const int32_t *gw, int *G, int *W) {
    *G = gw[0] < 1 ? 1 : gw[0];
    *W = *G == 1 ? 1 : (gw[1] < 1 ? 1 : gw[1]);
}

static bool mix_tc(const struct se_case *c) {
    return c->tk == GGML_TYPE_F16 && c->tv == GGML_TYPE_F16 && c->n_tok >= 16 &&
           c->head_dim % 16 == 0;
}

// The mixed call against one scalar call per distinct effective (G, W);
// returns the worst |cuda - cpu| / max|v| and counts differing CUDA bits.
static double run_mix_case(const struct mix_case *mc) {
    const struct se_case *c = &mc->c;
    const int n_tok = c->n_tok;
    int32_t *q_se = malloc(8 * (size_t)n_tok);
    struct mix_io io = mix_inputs(c, mc->layout, mix_gw, q_se);
    const size_t row = (size_t)c->n_head * c->head_dim; // a token's output floats
    float *mixed = malloc(io.no * 4), *rg = malloc(io.no * 4), *rc = malloc(io.no * 4);
    // scalar G, W that every token overrides
    mix_call(gpu, 1, c, &io, 5, 3, true, mixed);
    double worst = 0.0, worst_bits = 0.0;
    size_t differ = 0, checked = 0;
    for (int s = 0; s < c->n_seq; s++) {
        int G, W;
        mix_eff(mix_gw[s], &G, &W);
        bool seen = false; // an earlier sequence with the same effective (G, W)
        for (int s2 = 0; s2 < s; s2++) {
            int G2, W2;
            mix_eff(mix_gw[s2], &G2, &W2);
            seen = seen || (G2 == G && W2 == W);
        }
        if (seen)
            continue;
        mix_call(gpu, 1, c, &io, G, W, false, rg);
        mix_call(cpu, 0, c, &io, G, W, false, rc);
        for (int t = 0; t < n_tok; t++) {
            int Gt, Wt;
            mix_eff(&q_se[2 * t], &Gt, &Wt);
            if (Gt != G || Wt != W)
                continue;
            checked++;
            for (size_t i = t * row; i < (t + 1) * row; i++) {
                worst = fmax(worst, fabs((double)mixed[i] - rc[i]) / io.vmax);
                worst_bits = fmax(worst_bits, fabs((double)mixed[i] - rg[i]) / io.vmax);
            }
            differ += memcmp(mixed + t * row, rg + t * row, row * 4) != 0;
        }
    }
    const double tol = 1e-4 + 8.0 * sqrt((double)c->n_kv) / 16777216.0 + (mix_tc(c) ? 3e-3 : 0.0);
    cr_log_info(
        "self-extend per-token G/W, %s: %zu tokens, vs cuda scalar calls: %zu differ (worst "
        "%.3g of max|v|); vs cpu: %.3g (tol %.3g)\n",
        c->note, checked, differ, worst_bits, worst, tol);
    cr_expect_eq(checked, (size_t)n_tok, "%s: %zu of %d tokens checked", c->note, checked, n_tok);
    cr_expect_eq(differ, 0, "%s: %zu tokens differ from their scalar call", c->note, differ);
    cr_expect_leq(worst, tol, "%s: %.3g > %.3g", c->note, worst, tol);
    mix_free(&io);
    free(q_se);
    free(mixed);
    free(rg);
    free(rc);
    return worst;
}

Test(cuda_se, per_token_g_w_matches_scalar_calls) {
    REQUIRE_GPU();
    rng_seed(15);
    double worst = 0;
    for (size_t i = 0; i < sizeof mix_cases / sizeof mix_cases[0]; i++)
        worst = fmax(worst, run_mix_case(&mix_cases[i]));
    cr_log_info("self-extend per-token G/W: worst vs cpu over the cases %.3g of max|v|\n", worst);
}

// q_se with the same (G, W) for every token: the scalar call's bits.
Test(cuda_se, per_token_uniform_is_the_scalar_call) {
    REQUIRE_GPU();
    rng_seed(16);
    const int gw[3][2] = {{3, 10}, {1, 7}, {2, 16}};
    for (size_t i = 0; i < sizeof mix_cases / sizeof mix_cases[0]; i++) {
        const struct se_case *c = &mix_cases[i].c;
        const int *u = gw[i % 3];
        const int seq_gw[5][2] = {
            {u[0], u[1]}, {u[0], u[1]}, {u[0], u[1]}, {u[0], u[1]}, {u[0], u[1]}};
        int32_t *q_se = malloc(8 * (size_t)c->n_tok);
        struct mix_io io = mix_inputs(c, mix_cases[i].layout, seq_gw, q_se);
        float *a = malloc(io.no * 4), *b = malloc(io.no * 4);
        mix_call(gpu, 1, c, &io, 5, 3, true, a);
        mix_call(gpu, 1, c, &io, u[0], u[1], false, b);
        cr_expect_eq(memcmp(a, b, io.no * 4), 0,
                     "%s: uniform G %d W %d differs from the scalar call", c->note, u[0], u[1]);
        mix_free(&io);
        free(q_se);
        free(a);
        free(b);
    }
}

// rope_kv_store with rp NULL stores K and V as they are (bit for bit on
// both backends) and leaves k and q untouched.
Test(cuda_se, kv_store_without_rotation) {
    REQUIRE_GPU();
    rng_seed(14);
    const int n_tok = 5, n_head = 4, n_head_kv = 2, D = 32, n_ctx = 16;
    const size_t nk = (size_t)n_tok * n_head_kv * D, nq = (size_t)n_tok * n_head * D;
    float *k = nrand_array(nk), *v = nrand_array(nk), *q = nrand_array(nq);
    const int32_t pos[5] = {3, 9, 27, 81, 243}, cells[5] = {1, 4, 5, 9, 15};
    const enum ggml_type types[2] = {GGML_TYPE_F32, GGML_TYPE_F16};
    for (int ti = 0; ti < 2; ti++) {
        const enum ggml_type t = types[ti];
        const size_t esz = t == GGML_TYPE_F16 ? 2 : 4, cb = (size_t)n_ctx * n_head_kv * D * esz;
        struct dbuf bk = dbuf_new(k, nk * 4), bv = dbuf_new(v, nk * 4), bq = dbuf_new(q, nq * 4);
        struct dbuf bp = dbuf_new(pos, sizeof pos), bc = dbuf_new(cells, sizeof cells);
        struct dbuf kc = dbuf_new(NULL, cb), vc = dbuf_new(NULL, cb);
        struct backend *bes[2] = {cpu, gpu};
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            OK(be,
               be->ops->rope_kv_store(be, b ? bq.g : bq.c, n_head, b ? bk.g : bk.c, b ? bv.g : bv.c,
                                      b ? kc.g : kc.c, t, b ? vc.g : vc.c, t, b ? bp.g : bp.c,
                                      b ? bc.g : bc.c, n_tok, n_head_kv, D, D, NULL));
        }
        void *hk[2], *hv[2];
        float *hq = malloc(nq * 4);
        for (int b = 0; b < 2; b++) {
            hk[b] = malloc(cb);
            hv[b] = malloc(cb);
            OK(bes[b], bes[b]->ops->download(bes[b], hk[b], b ? kc.g : kc.c, cb));
            OK(bes[b], bes[b]->ops->download(bes[b], hv[b], b ? vc.g : vc.c, cb));
            OK(bes[b], bes[b]->ops->download(bes[b], hq, b ? bq.g : bq.c, nq * 4));
            OK(bes[b], bes[b]->ops->sync(bes[b]));
            cr_expect_eq(memcmp(hq, q, nq * 4), 0, "%s: q was rotated", bes[b]->ops->name);
        }
        cr_expect_eq(memcmp(hk[0], hk[1], cb), 0, "%s: K cells differ", ggml_type_name(t));
        cr_expect_eq(memcmp(hv[0], hv[1], cb), 0, "%s: V cells differ", ggml_type_name(t));
        // cell cells[1] holds token 1's K unrotated
        const size_t row = (size_t)n_head_kv * D;
        for (size_t e = 0; e < row; e++) {
            const float got = t == GGML_TYPE_F16
                                  ? quant_fp16_to_f32(((uint16_t *)hk[1])[cells[1] * row + e])
                                  : ((float *)hk[1])[cells[1] * row + e];
            const float want =
                t == GGML_TYPE_F16 ? quant_fp16_to_f32(quant_f32_to_fp16(k[row + e])) : k[row + e];
            cr_expect_eq(got, want, "%s: element %zu rotated", ggml_type_name(t), e);
        }
        for (int b = 0; b < 2; b++) {
            free(hk[b]);
            free(hv[b]);
        }
        free(hq);
        struct dbuf *bs[] = {&bk, &bv, &bq, &bp, &bc, &kc, &vc};
        for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
            dbuf_free(bs[i]);
    }
    free(k);
    free(v);
    free(q);
}

// Logits [n][V] of tokens 0..n-1 of seq 0 on one backend's model, G 2 W 16.
static void se_forward(struct model *m, int n_batch, const int32_t *tok, int n, float *out) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 128;
    cfg.n_batch = n_batch;
    cfg.se_g = 2;
    cfg.se_w = 16;
    struct context *c;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&c, m, &cfg, &err), 0, "%s: %s", m->be->ops->name, err.msg);
    const int V = m->hp.n_vocab;
    int32_t pos[128], seq[128] = {0};
    int8_t want[128];
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        want[t] = 1;
    }
    for (int i = 0; i < n; i += n_batch) {
        const int nb = n - i < n_batch ? n - i : n_batch;
        struct forward_batch b = {nb, tok + i, pos + i, seq + i, want + i, NULL};
        struct context_result res;
        cr_assert_eq(context_decode_logits(c, &b, &res, &err), 0, "%s: %s", m->be->ops->name,
                     err.msg);
        cr_assert_eq(res.n_rows, nb);
        memcpy(out + (size_t)i * V, res.logits, sizeof(float) * (size_t)nb * V);
    }
    context_free(c);
}

// Logits [2][n][V] of two sequences decoded side by side on one backend's
// model, each with its own exact self-extend (forward_batch.se): seq 0 reads
// tok with (2, 16), seq 1 reads tok reversed with (3, 8), n_batch / 2 tokens
// of each per batch (K cached unrotated, no context default).
static void se_forward_two(struct model *m, int n_batch, const int32_t *tok, int n, float *out) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 256;
    cfg.n_batch = n_batch;
    cfg.n_seq_max = 2;
    cfg.k_unrotated = true;
    struct context *c;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&c, m, &cfg, &err), 0, "%s: %s", m->be->ops->name, err.msg);
    const int V = m->hp.n_vocab, per = n_batch / 2;
    static const int32_t se_of[2][2] = {{2, 16}, {3, 8}};
    for (int i = 0; i < n; i += per) {
        int32_t bt[64], bp[64], bs[64], bse[128];
        int8_t want[64];
        int nb = 0;
        for (int s = 0; s < 2; s++)
            for (int t = i; t < i + per && t < n; t++, nb++) {
                bt[nb] = s ? tok[n - 1 - t] : tok[t];
                bp[nb] = t;
                bs[nb] = s;
                bse[2 * nb] = se_of[s][0];
                bse[2 * nb + 1] = se_of[s][1];
                want[nb] = 1;
            }
        struct forward_batch b = {nb, bt, bp, bs, want, bse};
        struct context_result res;
        cr_assert_eq(context_decode_logits(c, &b, &res, &err), 0, "%s: %s", m->be->ops->name,
                     err.msg);
        cr_assert_eq(res.n_rows, nb);
        for (int r = 0; r < nb; r++)
            memcpy(out + ((size_t)bs[r] * n + bp[r]) * V, context_row_logits(&res, r),
                   sizeof(float) * V);
    }
    context_free(c);
}

Test(cuda_se, whole_model_matches_the_cpu) {
    REQUIRE_GPU();
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.n_ctx_train = 64;
    c.n_layer = 1;
    char path[128];
    tiny_temp_path(path, sizeof path, "secuda");
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    gpu->act_q8 = false;
    struct model *mc, *mg;
    cr_assert_eq(model_load_file(&mc, path, cpu, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&mg, path, gpu, &err), 0, "%s", err.msg);
    const int n = 100, V = c.n_vocab;
    int32_t tok[100];
    for (int t = 0; t < n; t++)
        tok[t] = (t * 11 + 2) % V;
    float *lc = malloc(sizeof(float) * n * V), *lg = malloc(sizeof(float) * n * V);
    const int batches[2] = {1, 25};
    for (int bi = 0; bi < 2; bi++) {
        se_forward(mc, batches[bi], tok, n, lc);
        se_forward(mg, batches[bi], tok, n, lg);
        double scale = 1, worst = 0;
        for (int i = 0; i < n * V; i++) {
            scale = fmax(scale, fabs(lc[i]));
            worst = fmax(worst, fabs((double)lg[i] - lc[i]));
        }
        cr_log_info("self-extend model, batch %d: cuda vs cpu worst relative logit error %.3g\n",
                    batches[bi], worst / scale);
        const double tol = batches[bi] >= 16 ? 1e-3 : 1e-4;
        cr_expect_lt(worst / scale, tol, "batch %d: %.3g", batches[bi], worst / scale);
    }
    free(lc);
    free(lg);
    // Two sequences with their own G and W in the same batches: 1 token of
    // each (graphs, attn_kernel) and 13 of each (tensor cores: 26 tokens).
    lc = malloc(sizeof(float) * 2 * n * V);
    lg = malloc(sizeof(float) * 2 * n * V);
    const int pairs[2] = {2, 26};
    for (int bi = 0; bi < 2; bi++) {
        se_forward_two(mc, pairs[bi], tok, n, lc);
        se_forward_two(mg, pairs[bi], tok, n, lg);
        double scale = 1, worst = 0;
        for (int i = 0; i < 2 * n * V; i++) {
            scale = fmax(scale, fabs(lc[i]));
            worst = fmax(worst, fabs((double)lg[i] - lc[i]));
        }
        cr_log_info("own G/W per sequence, batch %d: cuda vs cpu worst relative error %.3g\n",
                    pairs[bi], worst / scale);
        const double tol = pairs[bi] >= 16 ? 1e-3 : 1e-4;
        cr_expect_lt(worst / scale, tol, "two sequences, batch %d: %.3g", pairs[bi], worst / scale);
    }
    free(lc);
    free(lg);
    model_free(mc);
    model_free(mg);
    tiny_weights_free(&w);
    unlink(path);
}
