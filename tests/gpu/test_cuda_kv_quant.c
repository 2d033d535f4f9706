// Quantized (and bf16) KV caches on CUDA against the CPU backend, op by op
// (docs/kv-cache.md): the store, attention on every kernel that reads a cache
// (attn_dec_kernel for 1..8 tokens at head dims 64/128, attn_kernel for 9..15
// tokens, other head dims and RoPE inside, attn_tc_kernel for >= 16 tokens),
// sliding windows, exact self-extend with an unrotated quantized K, and the
// context shift of a quantized K. Runs as test_emu_cuda_kv_quant under the
// emulator (with its racecheck / initcheck / memcheck) and on a GPU.
//
// Store: the blocks are the CPU quantizer's bit for bit, K unrotated (rp NULL)
// and rotated (the GPU's rotated K, which differs from the CPU's by cosf/sinf
// ulps, quantized on the host with quant_quantize_row).
// Attention: both backends read the same cache bytes and decode them to the
// same floats (cuda/kv_quant.cuh follows gguf/quant.c's roundings), so the
// tolerance is test_cuda_ops.c's for f32 caches, relative to max|v|:
// 3e-5 + 8 sqrt(n_kv) 2^-24 (scores summed in other orders, exp within
// 2 ulp, the n_kv-term sums' random walk); with RoPE inside 1e-4 + the same
// walk (test_cuda_selfextend.c: rotations from CUDA's cosf/sinf). On tensor
// cores (>= 16 tokens) the decoded tiles are rounded to f16 like q * scale and
// P: test_cuda_ops.c's 2e-3 of max|v| is added (K rounded to f16 moves a score
// by about as much as q's rounding does, ~3e-4; V's rounding moves an output
// by <= 2^-11 max|v|), 3e-3 with RoPE inside as test_cuda_selfextend.c.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention_args.h" // CUDA_ATTN_DECODE_SPLITK
#include "cuda/backend_cuda.h"   // backend_cuda_set_attn_decode
#include "gguf/quant.h"
#include "gguf/types.h"
#include "host/ops/backend.h"
#include "tests/gpu/gpu_fixture.h"
#include "tests/rng_splitmix.h"

TestSuite(cuda_kvq, .init = setup, .fini = teardown, .timeout = 900);

static const enum ggml_type kvq_types[] = {GGML_TYPE_BF16,  GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                                           GGML_TYPE_Q4_1,  GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                           GGML_TYPE_IQ4_NL};
#define N_KVQ_TYPES (sizeof kvq_types / sizeof kvq_types[0])

static float *nrand_array(size_t n, float sigma) {
    float *x = malloc(n * sizeof *x + 16);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = sigma * nrand();
    return x;
}

// n values (a multiple of the type's block) as a cache of type t (the CPU
// store's encoding), and the floats they decode to in *dec (when not NULL).
static void *encode(const float *x, enum ggml_type t, size_t n, float **dec) {
    const size_t bytes = ggml_row_bytes(t, (int64_t)n);
    void *c = malloc(bytes + 16);
    cr_assert_not_null(c);
    struct verr err = {0};
    cr_assert_eq(quant_quantize_row(t, x, c, (int64_t)n, &err), 0, "%s", err.msg);
    if (dec) {
        *dec = malloc(n * sizeof(float) + 16);
        cr_assert_eq(quant_dequantize_row(t, c, *dec, (int64_t)n, &err), 0, "%s", err.msg);
    }
    return c;
}

static void *download(struct backend *be, const void *p, size_t bytes) {
    void *h = malloc(bytes + 1);
    cr_assert_not_null(h);
    OK(be, be->ops->sync(be));
    OK(be, be->ops->download(be, h, p, bytes));
    OK(be, be->ops->sync(be));
    return h;
}

// ---------------------------------------------------------------------------
// rope_kv_store

static struct rope_params store_rope(void) {
    struct rope_params rp = {
        .mode = ROPE_MODE_NEOX,
        .n_rot = 64,
        .n_ctx_orig = 4096,
        .freq_base = 10000.0f,
        .freq_scale = 1.0f,
        .attn_factor = 1.0f,
        .beta_fast = 32.0f,
        .beta_slow = 1.0f,
    };
    return rp;
}

// Cells written by n_tok tokens of nh heads (K head dim hd, V hdv): GPU
// blocks == CPU blocks byte for byte without RoPE; with RoPE, the GPU cache
// == the CPU quantizer applied to the GPU's rotated K (and to V).
static void store_case(enum ggml_type tk, enum ggml_type tv, int hd, int hdv, bool rope) {
    const int n_tok = 5, nh = 3, n_ctx = 11;
    const int32_t pos[5] = {0, 7, 300, 4095, 12}, cells[5] = {3, 0, 10, 6, 7};
    const size_t nk = (size_t)n_tok * nh * hd, nv = (size_t)n_tok * nh * hdv;
    float *k = nrand_array(nk, 1.5f), *v = nrand_array(nv, 0.7f);
    for (int d = 0; d < 32; d++) { // a zero block and one with a single large value
        k[d] = 0.0f;
        v[32 + d] = d == 5 ? 40.0f : 0.01f * (float)d;
        // q8_0's scale 127 / 127 = 1: values on exact ties of its rounding
        k[32 + d] = d == 0 ? 127.0f : (float)(d - 16) + 0.5f;
    }
    const size_t kc_bytes = ggml_row_bytes(tk, (int64_t)n_ctx * nh * hd);
    const size_t vc_bytes = ggml_row_bytes(tv, (int64_t)n_ctx * nh * hdv);
    struct dbuf bk = dbuf_new(k, nk * 4), bv = dbuf_new(v, nv * 4);
    struct dbuf bkc = dbuf_new(NULL, kc_bytes), bvc = dbuf_new(NULL, vc_bytes);
    struct dbuf bpos = dbuf_new(pos, sizeof pos), bcell = dbuf_new(cells, sizeof cells);
    struct rope_params rp = store_rope();
    const struct rope_params *r = rope ? &rp : NULL;
    OK(cpu, cpu->ops->rope_kv_store(cpu, NULL, 0, bk.c, bv.c, bkc.c, tk, bvc.c, tv, bpos.c, bcell.c,
                                    n_tok, nh, hd, hdv, r));
    OK(gpu, gpu->ops->rope_kv_store(gpu, NULL, 0, bk.g, bv.g, bkc.g, tk, bvc.g, tv, bpos.g, bcell.g,
                                    n_tok, nh, hd, hdv, r));
    uint8_t *kc_c = download(cpu, bkc.c, kc_bytes), *kc_g = download(gpu, bkc.g, kc_bytes);
    uint8_t *vc_c = download(cpu, bvc.c, vc_bytes), *vc_g = download(gpu, bvc.g, vc_bytes);
    float *kg = download(gpu, bk.g, nk * 4);
    const size_t krow = ggml_row_bytes(tk, hd), vrow = ggml_row_bytes(tv, hdv);
    int bad = 0;
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < nh; h++) {
            const size_t row = (size_t)cells[t] * nh + h, th = (size_t)t * nh + h;
            const uint8_t *want = kc_c + row * krow;
            void *enc = NULL;
            if (rope) { // the CPU quantizer on the GPU's rotated row
                enc = encode(kg + th * hd, tk, (size_t)hd, NULL);
                want = enc;
            }
            if (memcmp(kc_g + row * krow, want, krow)) {
                if (bad++ < 5)
                    cr_log_error("%s K token %d head %d: blocks differ", ggml_type_name(tk), t, h);
            }
            free(enc);
            if (memcmp(vc_g + row * vrow, vc_c + row * vrow, vrow)) {
                if (bad++ < 5)
                    cr_log_error("%s V token %d head %d: blocks differ", ggml_type_name(tv), t, h);
            }
        }
    }
    cr_expect_eq(bad, 0, "store %s/%s hd %d/%d rope %d: %d rows differ", ggml_type_name(tk),
                 ggml_type_name(tv), hd, hdv, rope, bad);
    if (!rope) // cells no token wrote stay as the CPU's (zero) on both
        cr_expect_eq(memcmp(kc_c, kc_g, kc_bytes), 0, "%s: K cache bytes", ggml_type_name(tk));
    cr_log_info("store %s/%s hd %d/%d rope %d: %d of %d rows differ\n", ggml_type_name(tk),
                ggml_type_name(tv), hd, hdv, rope, bad, 2 * n_tok * nh);
    struct dbuf *bs[] = {&bk, &bv, &bkc, &bvc, &bpos, &bcell};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        dbuf_free(bs[i]);
    free(k), free(v), free(kc_c), free(kc_g), free(vc_c), free(vc_g), free(kg);
}

Test(cuda_kvq, store_blocks_are_the_cpu_quantizers) {
    REQUIRE_GPU();
    rng_seed(340);
    for (size_t i = 0; i < N_KVQ_TYPES; i++) {
        store_case(kvq_types[i], kvq_types[i], 64, 64, false);
        store_case(kvq_types[i], kvq_types[(i + 3) % N_KVQ_TYPES], 128, 64, true);
    }
    store_case(GGML_TYPE_F16, GGML_TYPE_Q4_0, 96, 128, true); // a float K beside a quantized V
    store_case(GGML_TYPE_Q8_0, GGML_TYPE_F32, 64, 96, false);
}

// ---------------------------------------------------------------------------
// attention

struct kvq_case {
    int n_tok, n_kv, n_head, n_head_kv, head_dim, head_dim_v;
    bool causal; // else two sequences, empty and shared cells
    int window;  // sliding window, 0: none
    int se_g;    // > 1: exact self-extend (RoPE inside, K unrotated), W 8; 1: RoPE inside
                 // without grouping; 0: no RoPE inside; -1: G per token (q_se), 2 and 4
    bool skew;   // K and V start one cell into their buffers (a cache layer's base is only
                 // as aligned as its rows: 2 bytes for the 18-byte blocks)
    const char *note;
};

static const struct kvq_case kvq_cases[] = {
    {1, 700, 8, 2, 128, 128, true, 0, 0, false, "decode hd128 gqa4 split"},
    {4, 300, 4, 4, 64, 64, false, 0, 0, true, "decode hd64 4 tokens 2 seqs skewed"},
    {2, 260, 16, 2, 64, 64, true, 100, 0, false, "decode hd64 gqa8 window"},
    {1, 1500, 4, 2, 256, 256, true, 0, 0, false, "decode hd256 split-k (attn_kernel)"},
    {12, 150, 6, 3, 96, 96, false, 0, 0, true, "12 tokens hd96 (attn_kernel) skewed"},
    {40, 120, 8, 2, 64, 64, true, 0, 0, true, "prefill hd64 (tensor cores) skewed"},
    {20, 100, 4, 4, 128, 128, true, 30, 0, false, "prefill hd128 window (tensor cores)"},
    {2, 300, 8, 2, 128, 128, true, 0, 4, false, "decode self-extend G4"},
    {3, 200, 4, 2, 64, 64, false, 0, 1, false, "decode rope inside 2 seqs"},
    {24, 90, 4, 2, 64, 64, true, 0, 2, false, "prefill self-extend G2 (tensor cores)"},
    {4, 150, 4, 2, 64, 64, true, 0, -1, false, "decode self-extend G per token"},
    {32, 100, 4, 2, 64, 64, true, 0, -1, false, "prefill self-extend G per token (tensor cores)"},
};

// The RoPE of the unrotated-cache cases.
static struct rope_params kvq_case_rope(void) {
    struct rope_params rp = store_rope();
    rp.mode = ROPE_MODE_NORMAL;
    return rp;
}

static void kvq_layout(const struct kvq_case *c, int32_t *cell_pos, uint64_t *cell_seq,
                       int32_t *q_pos, int32_t *q_seq) {
    for (int i = 0; i < c->n_kv; i++) {
        if (c->causal) {
            cell_pos[i] = i;
            cell_seq[i] = 1;
            continue;
        }
        cell_pos[i] = (rng_u64() % 10 == 0) ? -1 : irand(0, 2 * c->n_kv);
        cell_seq[i] = cell_pos[i] < 0 ? 0 : (1ull << irand(0, 1)) | (rng_u64() % 4 ? 0 : 3);
    }
    for (int t = 0; t < c->n_tok; t++) {
        q_pos[t] = c->causal ? c->n_kv - c->n_tok + t : irand(0, 2 * c->n_kv);
        q_seq[t] = c->causal ? 0 : irand(0, 1);
    }
}

// Sinks of kvq_attention's calls with them: head h takes [h % 4] (one far
// above any score, one near the log of a row's weight sum, zero, one below).
static const float kvq_sink_logits[4] = {12.0f, 3.0f, 0.0f, -4.0f};

// Case c with K of type tk and V of type tv on both backends, with sinks
// (attn_args.sinks) or without; returns the worst |cuda - cpu| / max|v| and
// checks it against the tolerance (the same with sinks: the output is the
// same convex combination times a factor <= 1). Sinks with RoPE inside (the
// self-extend cases): the CUDA backend must refuse them by name (0 returned).
static double kvq_attention(const struct kvq_case *c, enum ggml_type tk, enum ggml_type tv,
                            bool sinks) {
    const size_t nq = (size_t)c->n_tok * c->n_head * c->head_dim;
    const size_t nk = (size_t)c->n_kv * c->n_head_kv * c->head_dim;
    const size_t nv = (size_t)c->n_kv * c->n_head_kv * c->head_dim_v;
    float *q = nrand_array(nq, 1.0f), *kf = nrand_array(nk, 1.0f), *vf = nrand_array(nv, 1.0f);
    float *vdec = NULL;
    // skew: one more cell in front of the cache, the call's pointers past it
    const size_t ck = c->skew ? (size_t)c->n_head_kv * c->head_dim : 0;
    const size_t cv = c->skew ? (size_t)c->n_head_kv * c->head_dim_v : 0;
    float *kf2 = nrand_array(nk + ck, 1.0f), *vf2 = nrand_array(nv + cv, 1.0f);
    memcpy(kf2 + ck, kf, nk * 4);
    memcpy(vf2 + cv, vf, nv * 4);
    void *k = encode(kf2, tk, nk + ck, NULL), *v = encode(vf2, tv, nv + cv, &vdec);
    const size_t sk = ggml_row_bytes(tk, (int64_t)ck), sv = ggml_row_bytes(tv, (int64_t)cv);
    int32_t *cell_pos = malloc(4 * (size_t)c->n_kv), *q_pos = malloc(4 * (size_t)c->n_tok);
    int32_t *q_seq = malloc(4 * (size_t)c->n_tok);
    uint64_t *cell_seq = calloc((size_t)c->n_kv, 8);
    kvq_layout(c, cell_pos, cell_seq, q_pos, q_seq);
    struct dbuf bq = dbuf_new(q, nq * 4), bk = dbuf_new(k, ggml_row_bytes(tk, (int64_t)(nk + ck))),
                bv = dbuf_new(v, ggml_row_bytes(tv, (int64_t)(nv + cv)));
    int32_t *qse = malloc(8 * (size_t)c->n_tok);
    for (int t = 0; t < c->n_tok; t++) {
        qse[2 * t] = 2 + 2 * (t % 2);
        qse[2 * t + 1] = 8;
    }
    struct dbuf bse = dbuf_new(qse, 8 * (size_t)c->n_tok);
    float *sink = malloc(4 * (size_t)c->n_head);
    for (int h = 0; h < c->n_head; h++)
        sink[h] = kvq_sink_logits[h % 4];
    struct dbuf bsk = dbuf_new(sink, 4 * (size_t)c->n_head);
    struct dbuf bcp = dbuf_new(cell_pos, 4 * (size_t)c->n_kv),
                bcs = dbuf_new(cell_seq, 8 * (size_t)c->n_kv);
    struct dbuf bqp = dbuf_new(q_pos, 4 * (size_t)c->n_tok),
                bqs = dbuf_new(q_seq, 4 * (size_t)c->n_tok);
    const size_t no = (size_t)c->n_tok * c->n_head * c->head_dim_v;
    struct dbuf bo = dbuf_new(NULL, no * 4);
    struct rope_params rp = kvq_case_rope();
    struct attn_args ac = {
        .out = bo.c,
        .q = bq.c,
        .k = (char *)bk.c + sk,
        .v = (char *)bv.c + sv,
        .type_k = tk,
        .type_v = tv,
        .cell_pos = bcp.c,
        .cell_seq = bcs.c,
        .seq_words = 1,
        .q_pos = bqp.c,
        .q_seq = bqs.c,
        .n_tok = c->n_tok,
        .n_kv = c->n_kv,
        .n_head = c->n_head,
        .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim,
        .head_dim_v = c->head_dim_v,
        .scale = 1.0f / sqrtf((float)c->head_dim),
        .window = c->window,
        .rope = c->se_g != 0 ? &rp : NULL,
        .se_g = c->se_g > 0 ? c->se_g : 1,
        .se_w = 8,
        .q_se = c->se_g < 0 ? bse.c : NULL,
        .sinks = sinks ? bsk.c : NULL,
    };
    struct attn_args ag = ac;
    ag.sinks = sinks ? bsk.g : NULL;
    ag.out = bo.g, ag.q = bq.g, ag.k = (char *)bk.g + sk, ag.v = (char *)bv.g + sv;
    ag.q_se = c->se_g < 0 ? bse.g : NULL;
    ag.cell_pos = bcp.g, ag.cell_seq = bcs.g, ag.q_pos = bqp.g, ag.q_seq = bqs.g;
    OK(cpu, cpu->ops->attention(cpu, &ac));
    const bool refused = sinks && ag.rope; // no CUDA kernel joins the two
    if (refused) {
        cr_expect_eq(gpu->ops->attention(gpu, &ag), VERR_UNSUPPORTED,
                     "attention %s sinks: not refused", c->note);
        cr_expect_neq(strstr(gpu->err.msg, "sinks with RoPE inside"), NULL, "%s", gpu->err.msg);
    } else {
        OK(gpu, gpu->ops->attention(gpu, &ag));
    }
    float *oc = download(cpu, bo.c, no * 4), *og = download(gpu, bo.g, no * 4);
    float vmax = 0.0f;
    for (size_t i = cv; i < nv + cv; i++)
        vmax = fmaxf(vmax, fabsf(vdec[i]));
    double worst = 0.0;
    for (size_t i = 0; i < no && !refused; i++) {
        const double e = isfinite(og[i]) ? fabs((double)oc[i] - og[i]) : INFINITY;
        worst = e > worst ? e : worst;
    }
    worst /= vmax;
    const bool tc = c->n_tok >= 16;
    const double tol = (c->se_g != 0 ? 1e-4 : 3e-5) + 8.0 * sqrt((double)c->n_kv) / 16777216.0 +
                       (tc ? (c->se_g != 0 ? 3e-3 : 2e-3) : 0.0);
    cr_expect_leq(worst, tol, "attention %s %s/%s%s: worst %.3g > tol %.3g", c->note,
                  ggml_type_name(tk), ggml_type_name(tv), sinks ? " sinks" : "", worst, tol);
    if (refused)
        cr_log_info("attention %s %s/%s sinks: refused (%s)\n", c->note, ggml_type_name(tk),
                    ggml_type_name(tv), gpu->err.msg);
    else
        cr_log_info("attention %s %s/%s%s: worst |cuda - cpu| / max|v| = %.3g (tol %.3g)\n",
                    c->note, ggml_type_name(tk), ggml_type_name(tv), sinks ? " sinks" : "", worst,
                    tol);
    struct dbuf *bs[] = {&bq, &bk, &bv, &bcp, &bcs, &bqp, &bqs, &bo, &bse, &bsk};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        dbuf_free(bs[i]);
    free(q), free(kf), free(vf), free(kf2), free(vf2), free(vdec), free(k), free(v), free(oc);
    free(og), free(qse), free(sink);
    free(cell_pos), free(cell_seq), free(q_pos), free(q_seq);
    return worst;
}

// Every case with K = V = type t; logs the worst error per type.
static void kvq_attention_type(enum ggml_type t) {
    REQUIRE_GPU();
    rng_seed(341 + (uint64_t)t);
    double worst = 0.0;
    for (size_t i = 0; i < sizeof kvq_cases / sizeof kvq_cases[0]; i++) {
        const double w = kvq_attention(&kvq_cases[i], t, t, false);
        worst = w > worst ? w : worst;
    }
    cr_log_info("attention %s/%s: worst |cuda - cpu| / max|v| over %zu cases = %.3g\n",
                ggml_type_name(t), ggml_type_name(t), sizeof kvq_cases / sizeof kvq_cases[0],
                worst);
}

Test(cuda_kvq, attention_bf16) {
    kvq_attention_type(GGML_TYPE_BF16);
}
Test(cuda_kvq, attention_q8_0) {
    kvq_attention_type(GGML_TYPE_Q8_0);
}
Test(cuda_kvq, attention_q4_0) {
    kvq_attention_type(GGML_TYPE_Q4_0);
}
Test(cuda_kvq, attention_q4_1) {
    kvq_attention_type(GGML_TYPE_Q4_1);
}
Test(cuda_kvq, attention_q5_0) {
    kvq_attention_type(GGML_TYPE_Q5_0);
}
Test(cuda_kvq, attention_q5_1) {
    kvq_attention_type(GGML_TYPE_Q5_1);
}
Test(cuda_kvq, attention_iq4_nl) {
    kvq_attention_type(GGML_TYPE_IQ4_NL);
}

// K and V of different types, a float type beside a quantized one included.
Test(cuda_kvq, attention_mixed_types) {
    REQUIRE_GPU();
    rng_seed(350);
    const enum ggml_type pairs[][2] = {{GGML_TYPE_Q8_0, GGML_TYPE_Q4_0},
                                       {GGML_TYPE_F16, GGML_TYPE_Q5_1},
                                       {GGML_TYPE_IQ4_NL, GGML_TYPE_F32},
                                       {GGML_TYPE_BF16, GGML_TYPE_Q4_1}};
    const size_t cases[] = {0, 4, 5, 7};
    double worst = 0.0;
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const double w = kvq_attention(&kvq_cases[cases[i]], pairs[p][0], pairs[p][1], false);
            worst = w > worst ? w : worst;
        }
    cr_log_info("attention mixed K/V types: worst |cuda - cpu| / max|v| = %.3g\n", worst);
}

// The decode calls through the selectable split-K decode kernel
// (attn_kernel with its combine) instead of attn_dec_kernel.
Test(cuda_kvq, attention_decode_splitk_variant) {
    REQUIRE_GPU();
    struct verr err = {0};
    cr_assert_eq(backend_cuda_set_attn_decode(gpu, CUDA_ATTN_DECODE_SPLITK, &err), 0, "%s",
                 err.msg);
    rng_seed(355);
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_IQ4_NL};
    double worst = 0.0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t i = 0; i < sizeof kvq_cases / sizeof kvq_cases[0]; i++)
            if (kvq_cases[i].n_tok <= 8) {
                const double w = kvq_attention(&kvq_cases[i], types[ti], types[ti], false);
                worst = w > worst ? w : worst;
            }
    cr_assert_eq(backend_cuda_set_attn_decode(gpu, CUDA_ATTN_DECODE_AUTO, &err), 0, "%s", err.msg);
    cr_log_info("split-k decode variant: worst |cuda - cpu| / max|v| = %.3g\n", worst);
}

// Attention sinks (attn_args.sinks) over a quantized cache on every kernel
// the cases reach (attn_dec_kernel, attn_kernel, attn_tc_kernel; windows;
// the self-extend cases refused), then the decode cases again through the
// split-K variant (attn_kernel's combine).
Test(cuda_kvq, attention_sinks) {
    REQUIRE_GPU();
    struct verr err = {0};
    rng_seed(360);
    double worst = 0.0;
    for (int variant = 0; variant < 2; variant++) {
        cr_assert_eq(backend_cuda_set_attn_decode(
                         gpu, variant ? CUDA_ATTN_DECODE_SPLITK : CUDA_ATTN_DECODE_AUTO, &err),
                     0, "%s", err.msg);
        for (size_t i = 0; i < sizeof kvq_cases / sizeof kvq_cases[0]; i++)
            if (!variant || kvq_cases[i].n_tok <= 8) {
                const double w = kvq_attention(&kvq_cases[i], GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, true);
                worst = w > worst ? w : worst;
            }
    }
    cr_assert_eq(backend_cuda_set_attn_decode(gpu, CUDA_ATTN_DECODE_AUTO, &err), 0, "%s", err.msg);
    cr_log_info("attention sinks q8_0/q4_0: worst |cuda - cpu| / max|v| = %.3g\n", worst);
}

// A bf16 cache (block 1) whose head dim is not a multiple of 8: refused with
// the reason, not read out of bounds.
Test(cuda_kvq, attention_refuses_odd_head_dims) {
    REQUIRE_GPU();
    void *buf;
    OK(gpu, gpu->ops->alloc(gpu, 4096, &buf));
    const struct attn_args a = {
        .out = buf,
        .q = buf,
        .k = buf,
        .v = buf,
        .type_k = GGML_TYPE_BF16,
        .type_v = GGML_TYPE_BF16,
        .cell_pos = buf,
        .cell_seq = buf,
        .seq_words = 1,
        .q_pos = buf,
        .q_seq = buf,
        .n_tok = 1,
        .n_kv = 4,
        .n_head = 2,
        .n_head_kv = 1,
        .head_dim = 36,
        .head_dim_v = 36,
        .scale = 1.0f,
    };
    cr_expect_eq(gpu->ops->attention(gpu, &a), VERR_UNSUPPORTED);
    cr_expect(strstr(gpu->err.msg, "multiples of 8") != NULL, "message: %s", gpu->err.msg);
    gpu->ops->free(gpu, buf);
}

// ---------------------------------------------------------------------------
// kv_shift

// |x - decode(encode(x))| of one element, at most: B times the block's
// scale d (linear types: rounding to the nearest of levels d apart, or the
// clamp at the top level, <= d; iq4_nl: its widest level gap, 89 to 113,
// or the clamp past 113 of a block whose extreme is negative: <= 24 d).
static double kvq_step_bound(enum ggml_type t) {
    return t == GGML_TYPE_IQ4_NL ? 24.0 : t == GGML_TYPE_BF16 ? 0.0 : 1.0;
}

static float kvq_block_scale(enum ggml_type t, const uint8_t *row, int e) {
    if (t == GGML_TYPE_BF16)
        return 0.0f;
    const size_t bb = ggml_row_bytes(t, 32);
    const uint8_t *b = row + (size_t)(e / 32) * bb;
    return fabsf(quant_fp16_to_f32((uint16_t)(b[0] | (b[1] << 8))));
}

// The CPU and CUDA shifts each decode, rotate and encode again: the rotated
// floats differ by cosf/sinf ulps, so an element may land on a neighbouring
// level (or a block on a slightly different scale). Each side is within its
// own encoding error of the exact rotation: |cuda - cpu| <= B (d_cpu +
// d_gpu) + 2^-20 |x| (the rotations' difference, rope_tolerance in
// test_cuda_ops.c); bf16: 2 ulps of bf16 (2^-7 relative) instead of B d.
// Cells with delta 0 are untouched bit for bit. rot > 0: the K rows are
// Hadamard-rotated with that block (kv_shift's rot_block); the transforms
// are the same bits on both sides, but the rotations' difference is spread
// by H over the block: 2^-20 sqrt(rot) max|x| of the row instead.
static void shift_case(enum ggml_type t, int rot) {
    const int n_layer = 2, n_ctx = 9, nh = 2, hd = 64;
    const size_t n = (size_t)n_layer * n_ctx * nh * hd, row_n = (size_t)nh * hd;
    float *x = nrand_array(n, 1.0f);
    void *k = encode(x, t, n, NULL);
    const size_t bytes = ggml_row_bytes(t, (int64_t)n), row_b = ggml_row_bytes(t, (int64_t)row_n);
    const int32_t delta[9] = {0, 3, -2, 0, 100, 1, 0, -50, 7};
    struct dbuf bk = dbuf_new(k, bytes), bd = dbuf_new(delta, sizeof delta);
    struct rope_params rp = store_rope();
    OK(cpu, cpu->ops->kv_shift(cpu, bk.c, t, bd.c, n_layer, n_ctx, nh, hd, &rp, rot));
    OK(gpu, gpu->ops->kv_shift(gpu, bk.g, t, bd.g, n_layer, n_ctx, nh, hd, &rp, rot));
    uint8_t *kc = download(cpu, bk.c, bytes), *kg = download(gpu, bk.g, bytes);
    float *dc = malloc(row_n * 4), *dg = malloc(row_n * 4);
    const double B = kvq_step_bound(t);
    double worst = 0.0;
    int fails = 0, moved = 0;
    for (int l = 0; l < n_layer; l++) {
        for (int c = 0; c < n_ctx; c++) {
            const size_t off = ((size_t)l * n_ctx + c) * row_b;
            if (delta[c] == 0) {
                cr_expect_eq(memcmp(kc + off, (uint8_t *)k + off, row_b), 0, "cpu untouched");
                cr_expect_eq(memcmp(kg + off, (uint8_t *)k + off, row_b), 0,
                             "%s layer %d cell %d (delta 0) changed", ggml_type_name(t), l, c);
                continue;
            }
            moved += memcmp(kg + off, (uint8_t *)k + off, row_b) != 0;
            cr_assert_eq(quant_dequantize_row(t, kc + off, dc, (int64_t)row_n, NULL), 0);
            cr_assert_eq(quant_dequantize_row(t, kg + off, dg, (int64_t)row_n, NULL), 0);
            double row_max = 0.0;
            for (size_t e = 0; e < row_n; e++)
                row_max = fmax(row_max, fabs(dc[e]));
            for (size_t e = 0; e < row_n; e++) {
                const double d = fabs((double)dc[e] - dg[e]);
                double tol = B * (kvq_block_scale(t, kc + off, (int)e) +
                                  kvq_block_scale(t, kg + off, (int)e)) +
                             (rot ? sqrt(rot) * row_max : fabs(dc[e])) / 1048576.0;
                if (t == GGML_TYPE_BF16)
                    tol = (rot ? row_max : fabs(dc[e])) / 64.0 + 1e-30;
                const double ratio = tol > 0 ? d / tol : (d > 0 ? INFINITY : 0.0);
                worst = ratio > worst ? ratio : worst;
                if (d > tol && fails++ < 5)
                    cr_log_error("%s layer %d cell %d elem %zu: cpu %g cuda %g (tol %g)",
                                 ggml_type_name(t), l, c, e, dc[e], dg[e], tol);
            }
        }
    }
    cr_expect_eq(fails, 0, "%s kv_shift: %d elements out of tolerance", ggml_type_name(t), fails);
    cr_expect_eq(moved, n_layer * 6, "%s: every shifted row rewritten", ggml_type_name(t));
    cr_log_info("kv_shift %s, rotation block %d: worst |cuda - cpu| / tol = %.3g\n",
                ggml_type_name(t), rot, worst);
    dbuf_free(&bk);
    dbuf_free(&bd);
    free(x), free(k), free(kc), free(kg), free(dc), free(dg);
}

Test(cuda_kvq, kv_shift_requantizes_like_the_cpu) {
    REQUIRE_GPU();
    rng_seed(360);
    for (size_t i = 0; i < N_KVQ_TYPES; i++)
        shift_case(kvq_types[i], 0);
}

// A Hadamard-rotated quantized K (the attention rotation's blocks: 64, the
// whole head here; 32, smaller than a head).
Test(cuda_kvq, kv_shift_rotated_like_the_cpu) {
    REQUIRE_GPU();
    rng_seed(361);
    for (size_t i = 0; i < N_KVQ_TYPES; i++) {
        shift_case(kvq_types[i], 64);
        shift_case(kvq_types[i], 32);
    }
}

// ---------------------------------------------------------------------------
// hadamard

// The CUDA op is the CPU op to the bit (the same butterflies in the same
// order, the same host-computed scale): every block size, rows of one and
// several blocks, row counts that leave a partial chunk; and the refusals.
Test(cuda_kvq, hadamard_bit_exact) {
    REQUIRE_GPU();
    rng_seed(362);
    for (int block = 2; block <= BACKEND_HADAMARD_MAX; block *= 2) {
        const int shapes[][2] = {{1, block}, {7, block * 3}, {33, block}};
        for (int si = 0; si < 3; si++) {
            const int rows = shapes[si][0], n = shapes[si][1];
            const size_t bytes = (size_t)rows * n * sizeof(float);
            float *x = nrand_array((size_t)rows * n, 2.0f);
            struct dbuf b = dbuf_new(x, bytes);
            OK(cpu, cpu->ops->hadamard(cpu, b.c, rows, n, block));
            OK(gpu, gpu->ops->hadamard(gpu, b.g, rows, n, block));
            float *hc = download(cpu, b.c, bytes), *hg = download(gpu, b.g, bytes);
            cr_expect_eq(memcmp(hc, hg, bytes), 0,
                         "hadamard block %d, %d rows of %d: not the cpu's bits", block, rows, n);
            dbuf_free(&b);
            free(x), free(hc), free(hg);
        }
    }
    float *z = NULL;
    OK(gpu, gpu->ops->alloc(gpu, 64 * sizeof(float), (void **)&z));
    cr_expect_eq(gpu->ops->hadamard(gpu, z, 1, 48, 32), VERR_RANGE, "block not dividing the row");
    cr_expect_eq(gpu->ops->hadamard(gpu, z, 1, 48, 3), VERR_RANGE, "block not a power of two");
    cr_expect(strstr(gpu->err.msg, "power of two"), "%s", gpu->err.msg);
    gpu->ops->free(gpu, z);
}

// ---------------------------------------------------------------------------
// rope_kv_store_rot

struct rot_case {
    enum ggml_type tk, tv;
    int hd, hdv, n_rot; // n_rot 0: no RoPE (rp NULL, the unrotated cache mode)
    int rot_k, rot_v;
    bool with_q;
};

// The fused op against the op-by-op sequence its contract names, both on
// the GPU: q, k, v and both caches the same bits. Against the CPU's fused
// op: V and the V cache the same bits (no RoPE on V, the same butterflies);
// q and k within the rotations' difference spread by H over the block
// (2^-20 sqrt(rot_k) max|row|, as kv_shift_rotated_like_the_cpu), and the
// GPU's K cache the CPU quantizer applied to the GPU's rotated K.
static void rot_case(const struct rot_case *rc) {
    const int n_tok = 5, nh = 3, nq = 6, n_ctx = 9;
    const int32_t pos[5] = {0, 7, 300, 4095, 12}, cells[5] = {3, 0, 8, 6, 7};
    const size_t nqv = (size_t)n_tok * nq * rc->hd, nk = (size_t)n_tok * nh * rc->hd;
    const size_t nv = (size_t)n_tok * nh * rc->hdv;
    float *q = nrand_array(nqv, 1.0f), *k = nrand_array(nk, 1.5f), *v = nrand_array(nv, 0.7f);
    k[3] = 30.0f, v[5] = -20.0f; // outliers: what the rotation spreads
    const size_t kc_bytes = ggml_row_bytes(rc->tk, (int64_t)n_ctx * nh * rc->hd);
    const size_t vc_bytes = ggml_row_bytes(rc->tv, (int64_t)n_ctx * nh * rc->hdv);
    struct dbuf bq = dbuf_new(q, nqv * 4), bk = dbuf_new(k, nk * 4), bv = dbuf_new(v, nv * 4);
    struct dbuf sq = dbuf_new(q, nqv * 4), sk = dbuf_new(k, nk * 4), sv = dbuf_new(v, nv * 4);
    struct dbuf bkc = dbuf_new(NULL, kc_bytes), bvc = dbuf_new(NULL, vc_bytes);
    struct dbuf skc = dbuf_new(NULL, kc_bytes), svc = dbuf_new(NULL, vc_bytes);
    struct dbuf bpos = dbuf_new(pos, sizeof pos), bcell = dbuf_new(cells, sizeof cells);
    struct rope_params rp = store_rope();
    rp.n_rot = rc->n_rot;
    const struct rope_params *r = rc->n_rot ? &rp : NULL;
    const char *tk = ggml_type_name(rc->tk), *tv = ggml_type_name(rc->tv);
    OK(gpu, gpu->ops->rope_kv_store_rot(gpu, rc->with_q ? bq.g : NULL, nq, bk.g, bv.g, bkc.g,
                                        rc->tk, bvc.g, rc->tv, bpos.g, bcell.g, n_tok, nh, rc->hd,
                                        rc->hdv, r, rc->rot_k, rc->rot_v));
    OK(cpu, cpu->ops->rope_kv_store_rot(cpu, rc->with_q ? bq.c : NULL, nq, bk.c, bv.c, bkc.c,
                                        rc->tk, bvc.c, rc->tv, bpos.c, bcell.c, n_tok, nh, rc->hd,
                                        rc->hdv, r, rc->rot_k, rc->rot_v));
    // the sequence, op by op, on the GPU
    if (rc->rot_v)
        OK(gpu, gpu->ops->hadamard(gpu, sv.g, (int64_t)n_tok * nh, rc->hdv, rc->rot_v));
    if (r && rc->with_q)
        OK(gpu, gpu->ops->rope(gpu, sq.g, bpos.g, n_tok, nq, rc->hd, r));
    if (r)
        OK(gpu, gpu->ops->rope(gpu, sk.g, bpos.g, n_tok, nh, rc->hd, r));
    if (rc->rot_k && rc->with_q)
        OK(gpu, gpu->ops->hadamard(gpu, sq.g, (int64_t)n_tok * nq, rc->hd, rc->rot_k));
    if (rc->rot_k)
        OK(gpu, gpu->ops->hadamard(gpu, sk.g, (int64_t)n_tok * nh, rc->hd, rc->rot_k));
    OK(gpu, gpu->ops->rope_kv_store(gpu, NULL, 0, sk.g, sv.g, skc.g, rc->tk, svc.g, rc->tv, bpos.g,
                                    bcell.g, n_tok, nh, rc->hd, rc->hdv, NULL));
    struct {
        const char *what;
        struct dbuf *fused, *seq;
        size_t bytes;
    } same[] = {{"q", &bq, &sq, nqv * 4},
                {"k", &bk, &sk, nk * 4},
                {"v", &bv, &sv, nv * 4},
                {"K cache", &bkc, &skc, kc_bytes},
                {"V cache", &bvc, &svc, vc_bytes}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        uint8_t *a = download(gpu, same[i].fused->g, same[i].bytes);
        uint8_t *b = download(gpu, same[i].seq->g, same[i].bytes);
        cr_expect_eq(memcmp(a, b, same[i].bytes), 0,
                     "%s/%s hd %d/%d n_rot %d rot %d/%d q %d: fused %s is not the sequence's", tk,
                     tv, rc->hd, rc->hdv, rc->n_rot, rc->rot_k, rc->rot_v, rc->with_q,
                     same[i].what);
        free(a), free(b);
    }
    // against the CPU's fused op
    float *vg = download(gpu, bv.g, nv * 4), *vc = download(cpu, bv.c, nv * 4);
    uint8_t *vcg = download(gpu, bvc.g, vc_bytes), *vcc = download(cpu, bvc.c, vc_bytes);
    cr_expect_eq(memcmp(vg, vc, nv * 4), 0, "%s/%s: rotated v differs from the cpu's", tk, tv);
    cr_expect_eq(memcmp(vcg, vcc, vc_bytes), 0, "%s/%s: V cache differs from the cpu's", tk, tv);
    double worst = 0.0;
    const float *xs[2][2] = {{download(gpu, bq.g, nqv * 4), download(cpu, bq.c, nqv * 4)},
                             {download(gpu, bk.g, nk * 4), download(cpu, bk.c, nk * 4)}};
    const size_t rows[2] = {(size_t)n_tok * nq, (size_t)n_tok * nh};
    for (int w = 0; w < 2; w++) {
        for (size_t row = 0; row < rows[w]; row++) {
            const float *g = xs[w][0] + row * rc->hd, *c = xs[w][1] + row * rc->hd;
            double row_max = 0.0;
            for (int d = 0; d < rc->hd; d++)
                row_max = fmax(row_max, fabs(c[d]));
            const double tol = (rc->rot_k ? sqrt(rc->rot_k) : 1.0) * row_max / 1048576.0 + 1e-30;
            for (int d = 0; d < rc->hd; d++)
                worst = fmax(worst, fabs(g[d] - c[d]) / tol);
        }
    }
    cr_expect(worst <= 1.0, "%s/%s: rotated q/k |cuda - cpu| / tol = %.3g", tk, tv, worst);
    uint8_t *kcg = download(gpu, bkc.g, kc_bytes);
    const size_t krow = ggml_row_bytes(rc->tk, rc->hd);
    int bad = 0;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) {
            const size_t th = (size_t)t * nh + h, row = (size_t)cells[t] * nh + h;
            void *enc = encode(xs[1][0] + th * rc->hd, rc->tk, (size_t)rc->hd, NULL);
            bad += memcmp(kcg + row * krow, enc, krow) != 0;
            free(enc);
        }
    cr_expect_eq(bad, 0, "%s: %d K rows are not the cpu quantizer's of the gpu's rotated k", tk,
                 bad);
    cr_log_info("rope_kv_store_rot %s/%s hd %d/%d n_rot %d rot %d/%d q %d: fused == sequence; "
                "worst |cuda - cpu| / tol %.3g\n",
                tk, tv, rc->hd, rc->hdv, rc->n_rot, rc->rot_k, rc->rot_v, rc->with_q, worst);
    struct dbuf *bs[] = {&bq, &bk, &bv, &sq, &sk, &sv, &bkc, &bvc, &skc, &svc, &bpos, &bcell};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        dbuf_free(bs[i]);
    for (int w = 0; w < 2; w++)
        free((void *)xs[w][0]), free((void *)xs[w][1]);
    free(q), free(k), free(v), free(vg), free(vc), free(vcg), free(vcc), free(kcg);
}

Test(cuda_kvq, rope_kv_store_rot_is_the_sequence) {
    REQUIRE_GPU();
    rng_seed(363);
    const struct rot_case cases[] = {
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 128, 128, 128, 128, 64, true},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 64, 64, 32, 64, 64, true},     // partial rotary
        {GGML_TYPE_Q8_0, GGML_TYPE_F16, 128, 128, 128, 128, 0, true},   // V not rotated
        {GGML_TYPE_F16, GGML_TYPE_Q4_1, 64, 128, 64, 0, 64, true},      // K not rotated
        {GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, 64, 64, 0, 0, 64, false},    // no RoPE, V only
        {GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, 256, 64, 256, 256, 64, false}, // no q
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 128, 128, 128, 32, 32, true},  // blocks below a head
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        rot_case(&cases[i]);
}

Test(cuda_kvq, rope_kv_store_rot_refuses_bad_blocks) {
    REQUIRE_GPU();
    const int n_tok = 1, nh = 1, hd = 64;
    const int32_t pos[1] = {0}, cells[1] = {0};
    struct dbuf bk = dbuf_new(NULL, hd * 4), bv = dbuf_new(NULL, hd * 4);
    struct dbuf bkc = dbuf_new(NULL, ggml_row_bytes(GGML_TYPE_Q8_0, hd));
    struct dbuf bvc = dbuf_new(NULL, ggml_row_bytes(GGML_TYPE_Q8_0, hd));
    struct dbuf bpos = dbuf_new(pos, sizeof pos), bcell = dbuf_new(cells, sizeof cells);
    const int bad[][2] = {{48, 64}, {64, 3}, {128, 64}, {64, 2048}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct backend *bes[2] = {cpu, gpu};
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            void *k = b ? bk.g : bk.c, *v = b ? bv.g : bv.c;
            void *kc = b ? bkc.g : bkc.c, *vc = b ? bvc.g : bvc.c;
            const int32_t *p = b ? bpos.g : bpos.c, *c = b ? bcell.g : bcell.c;
            cr_expect_eq(be->ops->rope_kv_store_rot(be, NULL, 0, k, v, kc, GGML_TYPE_Q8_0, vc,
                                                    GGML_TYPE_Q8_0, p, c, n_tok, nh, hd, hd, NULL,
                                                    bad[i][0], bad[i][1]),
                         VERR_RANGE, "%s: rotation blocks %d/%d for head dim %d", be->ops->name,
                         bad[i][0], bad[i][1], hd);
            cr_expect(strstr(be->err.msg, "rotation blocks"), "%s", be->err.msg);
        }
    }
    struct dbuf *bs[] = {&bk, &bv, &bkc, &bvc, &bpos, &bcell};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        dbuf_free(bs[i]);
}

// A non-finite K or V value cannot be encoded in a block-quantized cache:
// the CPU store refuses it at once; the CUDA store marks it and the next
// sync fails with the lowest such token, once. Float caches (f16 here)
// store it as it is; q is not stored, so a NaN there marks nothing.
Test(cuda_kvq, store_of_non_finite_fails_the_sync) {
    REQUIRE_GPU();
    const int n_tok = 3, nh = 2, hd = 64;
    const int32_t pos[3] = {0, 1, 2}, cells[3] = {0, 1, 2};
    struct dbuf bpos = dbuf_new(pos, sizeof pos), bcell = dbuf_new(cells, sizeof cells);
    struct rope_params rp = store_rope();
    const struct {
        enum ggml_type tk, tv;
        int bad_at;   // index into k (>= 0), v (< 0: -1 - index), or q (nq + ...)
        int rot;      // through rope_kv_store_rot with blocks of 64
        int want_tok; // -1: no error
    } cases[] = {
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 2 * nh * hd + 5, 0, 2},         // K of token 2
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, -1 - (1 * nh * hd + 70), 0, 1}, // V of token 1
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 1 * nh * hd, 64, 1},            // rotated K of token 1
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, -1 - 3, 64, 0},                 // rotated V of token 0
        {GGML_TYPE_F16, GGML_TYPE_F16, 5, 0, -1},                        // a float cache holds it
        {GGML_TYPE_F16, GGML_TYPE_Q8_0, 5, 0, -1},                       // K is f16: stored as is
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t nk = (size_t)n_tok * nh * hd;
        float *k = nrand_array(nk, 1.0f), *v = nrand_array(nk, 1.0f), *q = nrand_array(nk, 1.0f);
        if (cases[i].bad_at >= 0)
            k[cases[i].bad_at] = i % 2 ? INFINITY : NAN;
        else
            v[-1 - cases[i].bad_at] = NAN;
        q[7] = NAN; // never stored
        struct dbuf bk = dbuf_new(k, nk * 4), bv = dbuf_new(v, nk * 4), bq = dbuf_new(q, nk * 4);
        struct dbuf bkc = dbuf_new(NULL, ggml_row_bytes(cases[i].tk, (int64_t)4 * nh * hd));
        struct dbuf bvc = dbuf_new(NULL, ggml_row_bytes(cases[i].tv, (int64_t)4 * nh * hd));
        if (cases[i].rot)
            OK(gpu, gpu->ops->rope_kv_store_rot(gpu, bq.g, nh, bk.g, bv.g, bkc.g, cases[i].tk,
                                                bvc.g, cases[i].tv, bpos.g, bcell.g, n_tok, nh, hd,
                                                hd, &rp, cases[i].rot, cases[i].rot));
        else
            OK(gpu, gpu->ops->rope_kv_store(gpu, bq.g, nh, bk.g, bv.g, bkc.g, cases[i].tk, bvc.g,
                                            cases[i].tv, bpos.g, bcell.g, n_tok, nh, hd, hd, &rp));
        const int rc = gpu->ops->sync(gpu);
        if (cases[i].want_tok < 0) {
            cr_expect_eq(rc, 0, "case %zu: %s", i, gpu->err.msg);
        } else {
            cr_expect_eq(rc, VERR_RANGE, "case %zu: the sync after a non-finite store", i);
            char want[32];
            snprintf(want, sizeof want, "token %d ", cases[i].want_tok);
            cr_expect(strstr(gpu->err.msg, want) && strstr(gpu->err.msg, "not finite"),
                      "case %zu: %s (want %s)", i, gpu->err.msg, want);
            cr_log_info("%s", gpu->err.msg);
        }
        OK(gpu, gpu->ops->sync(gpu)); // reported once
        struct dbuf *bs[] = {&bk, &bv, &bq, &bkc, &bvc};
        for (size_t j = 0; j < sizeof bs / sizeof bs[0]; j++)
            dbuf_free(bs[j]);
        free(k), free(v), free(q);
    }
    dbuf_free(&bpos);
    dbuf_free(&bcell);
}
