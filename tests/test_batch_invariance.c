// Batch invariance as a tested property (docs/architecture.md, "Batch invariance"): on the CPU
// backend a request's logits, and so its tokens, are bit-identical whatever
// shares its batch, whatever the thread count, whichever thread runs which
// chunk, with or without solo spells, and wherever its cells sit in the KV
// cache.
//
// Reference: each request alone, in an engine of one slot whose context is
// the per-slot context, 2 threads, the pool left alone. Under test: the same
// requests through engines of 16 slots, submitted in waves while others
// decode, so that a step holds from 1 to 64 rows (generated tokens and
// prompt chunks, n_step_tokens 64), slots are reused and the cache fragments
// (a sequence's later cells below its earlier ones: kv_find_slot goes back
// to the first freed cell); with 1, 2 and 3 threads (3 on a 2-core machine
// are preempted for real) and the pool in chaos mode (VELA_POOL_CHAOS:
// workers delayed at random while holding a chunk, random solo spells).
// Every generated token's logits row is compared bit for bit; a failure
// names the request, the token and the worst |difference| of the run. The
// harness checks that the run did hold those conditions (batch sizes seen,
// a fragmented cache seen), so it cannot pass by not testing them.
//
// Each CPU path: AVX-VNNI (q8 kernels, AVX2 attention), AVX2
// (cpu_q8_pin(CPU_Q8_ISA_AVX2)), plain (cpu_q8_pin(CPU_Q8_ISA_NONE),
// cpu_attention_pin_plain(true): f32 activations), plain with q8
// activations (the reference q8_1 dots), and the AVX2 attention with f32
// activations; a path this CPU lacks is skipped and says so. On a tiny Q4_1 model
// (tests/tiny_model.h), and on SmolLM2-135M-Instruct Q4_1 with real text
// where bash tools/model_cache.sh has fetched it (skipped otherwise).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/backend/cpu_attention.h"
#include "host/backend/cpu_q8.h"
#include "host/engine/step.h"
#include "tests/arch_models.h"
#include "tests/engine_helpers.h"
#include "tools/default_model.h"
#include "tools/mkmodel/mkmodel.h"

#define BI_SLOTS 16
#define BI_STEP_TOKENS 64 // the most rows a step holds
#define BI_MAX_GEN 24

// One CPU path: the kernels it pins and whether this CPU has it.
struct bi_path {
    const char *name;
    enum cpu_q8_isa q8; // cpu_q8_pin
    bool attn_plain;    // cpu_attention_pin_plain
    int act;            // BACKEND_ACT_*
};

static const struct bi_path bi_paths[] = {
    {"avx-vnni", CPU_Q8_ISA_AVXVNNI, false, BACKEND_ACT_DEFAULT},
    {"avx2", CPU_Q8_ISA_AVX2, false, BACKEND_ACT_DEFAULT},
    {"plain f32", CPU_Q8_ISA_NONE, true, BACKEND_ACT_F32},
    {"plain q8_1", CPU_Q8_ISA_NONE, true, BACKEND_ACT_Q8},
    // The AVX2 attention kernels under f32 activations: q8 activations
    // round most of a small difference away, which hides one on a tiny model.
    {"avx2 attention, f32", CPU_Q8_ISA_AVXVNNI, false, BACKEND_ACT_F32},
};

// Pins p's kernels; false (and a note) when this CPU lacks the path.
static bool bi_path_enter(const struct bi_path *p) {
    cpu_q8_pin(CPU_Q8_ISA_AVXVNNI);
    const enum cpu_q8_isa isa = cpu_q8_isa();
    if ((!strcmp(p->name, "avx-vnni") && isa != CPU_Q8_ISA_AVXVNNI) ||
        (!strncmp(p->name, "avx2", 4) && isa == CPU_Q8_ISA_NONE)) {
        cr_log_info("path %s: skipped, this CPU lacks it (q8 kernels here: %s)", p->name,
                    cpu_q8_isa_name(isa));
        return false;
    }
    cpu_q8_pin(p->q8);
    cpu_attention_pin_plain(p->attn_plain);
    return true;
}

static void bi_path_leave(void) {
    cpu_q8_pin(CPU_Q8_ISA_AVXVNNI);
    cpu_attention_pin_plain(false);
    unsetenv("VELA_POOL_CHAOS");
}

// One request and what it gave.
struct bi_req {
    int32_t *prompt;
    int n_prompt, n_predict;
    int wave; // submitted after this many steps of the shared run
    int n_vocab;
    int32_t tok[BI_MAX_GEN];
    float *logits; // [BI_MAX_GEN][n_vocab] the row each token was drawn from
    int n, n_rows;
    bool done;
};

static int bi_on_token(void *user, const struct engine_req_event *ev) {
    struct bi_req *r = user;
    if (ev->ev == ENGINE_EV_TOKEN && ev->token >= 0 && r->n < BI_MAX_GEN)
        r->tok[r->n++] = ev->token;
    else if (ev->ev == ENGINE_EV_DONE)
        r->done = true;
    return 0;
}

static int bi_on_logits(void *user, uint64_t id, int32_t pos, const float *logits) {
    struct bi_req *r = user;
    if (r->n_rows < BI_MAX_GEN)
        memcpy(r->logits + (size_t)r->n_rows++ * r->n_vocab, logits,
               sizeof(float) * (size_t)r->n_vocab);
    return 0;
}

// What the shared runs went through, seen at the attention op.
static struct bi_seen {
    int min_rows, max_rows; // rows (tokens) of the steps
    int n_mixed;            // steps of 2..63 rows
    int n_fragmented;       // calls where some sequence's cells are out of position order
} bi_seen;

static struct backend_ops bi_ops, bi_base_ops;

// Whether some sequence of the call has a cell at a lower position after
// one at a higher position (cell order is not position order).
static bool bi_fragmented(const struct attn_args *a) {
    for (int t = 0; t < a->n_tok; t++) {
        const int s = a->q_seq[t];
        int32_t last = -1;
        for (int c = 0; c < a->n_kv; c++) {
            const uint64_t w = a->cell_seq[(size_t)c * a->seq_words + (size_t)(s / 64)];
            if (a->cell_pos[c] < 0 || !((w >> (s % 64)) & 1u))
                continue;
            if (a->cell_pos[c] < last)
                return true;
            last = a->cell_pos[c];
        }
    }
    return false;
}

static int bi_attention(struct backend *be, const struct attn_args *a) {
    bi_seen.min_rows = a->n_tok < bi_seen.min_rows ? a->n_tok : bi_seen.min_rows;
    bi_seen.max_rows = a->n_tok > bi_seen.max_rows ? a->n_tok : bi_seen.max_rows;
    bi_seen.n_mixed += a->n_tok > 1 && a->n_tok < BI_STEP_TOKENS;
    bi_seen.n_fragmented += bi_fragmented(a);
    return bi_base_ops.attention(be, a);
}

struct bi_engine_cfg {
    const char *model;
    int n_ctx_seq, n_slots, n_batch, n_threads, act;
    int type_k, type_v; // KV cache types when > 0 (engine_test_cfg)
};

static struct engine *bi_open(const struct bi_engine_cfg *c) {
    const struct engine_test_cfg tc = {.n_ctx = c->n_ctx_seq * c->n_slots,
                                       .n_batch = c->n_batch,
                                       .n_seq = c->n_slots,
                                       .n_threads = c->n_threads,
                                       .act = c->act,
                                       .type_k = c->type_k,
                                       .type_v = c->type_v};
    struct engine *e = engine_test_open(c->model, &tc);
    struct verr err = {0};
    struct engine_sched_config sc = {.n_slots = c->n_slots,
                                     .n_step_tokens = c->n_slots > 1 ? BI_STEP_TOKENS : 0};
    cr_assert_eq(engine_sched_configure(e, &sc, &err), 0, "%s", err.msg);
    return e;
}

static void bi_submit(struct engine *e, struct bi_req *r) {
    struct engine_request q;
    engine_request_default(&q);
    q.tokens = r->prompt;
    q.n_tokens = r->n_prompt;
    q.sp.temp = 0;
    q.n_predict = r->n_predict;
    q.ignore_eos = true;
    q.cb = bi_on_token;
    q.on_logits = bi_on_logits;
    q.user = r;
    r->n = r->n_rows = 0;
    r->done = false;
    uint64_t id;
    struct verr err = {0};
    cr_assert_eq(engine_submit(e, &q, &id, &err), 0, "engine_submit: %s", err.msg);
}

// Each request alone: the reference, into ref[i].
static void bi_run_alone(const struct bi_engine_cfg *c, struct bi_req *rs, int n) {
    struct bi_engine_cfg one = *c;
    one.n_slots = 1;
    one.n_threads = 2;
    one.n_batch = 16; // prompts in other chunks than in the shared runs
    unsetenv("VELA_POOL_CHAOS");
    struct engine *e = bi_open(&one);
    for (int i = 0; i < n; i++) {
        bi_submit(e, &rs[i]);
        engine_test_run_to_end(e);
        cr_assert(rs[i].done && rs[i].n == rs[i].n_predict && rs[i].n_rows == rs[i].n,
                  "request %d alone: %d tokens, %d rows of %d", i, rs[i].n, rs[i].n_rows,
                  rs[i].n_predict);
    }
    engine_close(e);
}

// The requests together (waves), with the pool in chaos mode seeded by
// seed; every request compared with its reference. Returns the rows that
// differ.
static int bi_run_shared(const struct bi_engine_cfg *c, const struct bi_req *ref, struct bi_req *rs,
                         int n, int seed, const char *what) {
    char sv[16];
    snprintf(sv, sizeof sv, "%d", seed);
    setenv("VELA_POOL_CHAOS", sv, 1);
    struct engine *e = bi_open(c);
    struct backend *be = e->weights->stage[0].be; // one stage: the CPU backend
    cr_assert_eq(e->weights->n_stages, 1);
    bi_base_ops = *be->ops;
    bi_ops = bi_base_ops;
    bi_ops.attention = bi_attention;
    be->ops = &bi_ops;
    struct verr err = {0};
    int next = 0, step = 0;
    for (;;) {
        while (next < n && rs[next].wave <= step)
            bi_submit(e, &rs[next++]);
        const int rc = engine_step(e, &err);
        cr_assert_geq(rc, 0, "engine_step: %s", err.msg);
        step++;
        if (rc == 0 && next == n)
            break;
        cr_assert_lt(step, 100000, "the engine never goes idle");
    }
    be->ops = &bi_base_ops;
    engine_close(e);
    unsetenv("VELA_POOL_CHAOS");

    int bad_rows = 0, bad_req = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        cr_assert(rs[i].done && rs[i].n_rows == rs[i].n, "%s: request %d did not finish", what, i);
        int first = -1;
        for (int t = 0; t < rs[i].n && t < ref[i].n; t++) {
            const float *g = rs[i].logits + (size_t)t * rs[i].n_vocab;
            const float *w = ref[i].logits + (size_t)t * ref[i].n_vocab;
            if (!memcmp(g, w, sizeof(float) * (size_t)rs[i].n_vocab))
                continue;
            bad_rows++;
            first = first < 0 ? t : first;
            for (int v = 0; v < rs[i].n_vocab; v++)
                worst = fmax(worst, fabs((double)g[v] - w[v]));
        }
        if (first >= 0 && bad_req++ < 4)
            cr_log_error("%s: request %d (prompt %d, %d tokens): logits of token %d differ "
                         "from the request alone (tokens %s from there)",
                         what, i, rs[i].n_prompt, rs[i].n, first,
                         memcmp(rs[i].tok, ref[i].tok, sizeof(int32_t) * (size_t)rs[i].n)
                             ? "differ"
                             : "still the same");
    }
    cr_expect_eq(bad_rows, 0,
                 "%s: %d logits rows of %d requests differ from each request alone (bit for "
                 "bit; worst |difference| %g)",
                 what, bad_rows, bad_req, worst);
    return bad_rows;
}

static void bi_req_alloc(struct bi_req *r, int n_vocab) {
    r->n_vocab = n_vocab;
    r->logits = malloc(sizeof(float) * (size_t)BI_MAX_GEN * (size_t)n_vocab);
    cr_assert(r->logits);
}

// Each path of the mask (bit p: bi_paths[p]) this CPU has: the reference,
// then the shared runs at each thread count. What the shared runs must have
// gone through is checked at the end.
static void bi_paths_run(const struct bi_engine_cfg *base, struct bi_req *ref, int n,
                         const int *threads, int n_threads, unsigned mask) {
    struct bi_req *got = calloc((size_t)n, sizeof *got);
    cr_assert(got);
    for (int i = 0; i < n; i++) {
        got[i] = ref[i];
        bi_req_alloc(&got[i], ref[i].n_vocab);
    }
    bi_seen = (struct bi_seen){.min_rows = 1 << 30};
    int n_run = 0;
    for (size_t p = 0; p < sizeof bi_paths / sizeof bi_paths[0]; p++) {
        if (!(mask >> p & 1u) || !bi_path_enter(&bi_paths[p]))
            continue;
        struct bi_engine_cfg c = *base;
        c.act = bi_paths[p].act;
        const double t0 = engine_now_ms();
        bi_run_alone(&c, ref, n);
        cr_log_info("%s alone: %.0f ms", bi_paths[p].name, engine_now_ms() - t0);
        for (int k = 0; k < n_threads; k++) {
            c.n_threads = threads[k];
            char what[64];
            snprintf(what, sizeof what, "%s, %d thread%s", bi_paths[p].name, threads[k],
                     threads[k] > 1 ? "s" : "");
            const double t0 = engine_now_ms();
            bi_run_shared(&c, ref, got, n, 1 + (int)p * 16 + k, what);
            cr_log_info("%s: %.0f ms", what, engine_now_ms() - t0);
            n_run++;
        }
        bi_path_leave();
    }
    cr_assert_gt(n_run, 0, "no CPU path ran");
    cr_log_info("steps of %d to %d rows (%d mixed), %d attention calls over a fragmented cache",
                bi_seen.min_rows, bi_seen.max_rows, bi_seen.n_mixed, bi_seen.n_fragmented);
    cr_expect_eq(bi_seen.min_rows, 1, "no step of a single row");
    cr_expect_geq(bi_seen.max_rows, BI_STEP_TOKENS * 3 / 4, "no step of many rows");
    cr_expect_gt(bi_seen.n_mixed, 0, "no step of mixed rows");
    cr_expect_gt(bi_seen.n_fragmented, 0, "the cache never fragmented");
    for (int i = 0; i < n; i++)
        free(got[i].logits);
    free(got);
}

// ---------------------------------------------------------------------------

// n requests of random prompts (1 to 40 tokens in [3, n_vocab), the first
// `bos` when >= 0) and lengths (2 to 20 tokens), the first 16 in wave 0 and
// the others joining in later waves; seeded.
static void bi_reqs_random(struct bi_req *ref, int n, uint64_t seed, int n_vocab, int bos) {
    memset(ref, 0, sizeof *ref * (size_t)n);
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        struct bi_req *r = &ref[i];
        r->n_prompt = 1 + (int)((tiny_rand(&s) + 1) * 0.5 * 39); // 1..40
        r->n_predict = 2 + (int)((tiny_rand(&s) + 1) * 0.5 * 18);
        r->wave = i < 16 ? 0 : 3 * (i - 14);
        r->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
        if (bos >= 0)
            r->prompt[0] = bos;
        for (int t = bos >= 0; t < r->n_prompt; t++)
            r->prompt[t] = 3 + (int32_t)((tiny_rand(&s) + 1) * 0.5 * (n_vocab - 4));
        bi_req_alloc(r, n_vocab);
    }
}

Test(batch_invariance, tiny_model_every_path_thread_count_and_schedule) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.vocab = true;
    cfg.n_vocab = 300;
    cfg.n_embd = 192; // q8 rows of 6 sub-blocks: a partial group of 256
    cfg.n_head = 6;   // 3 query heads per KV head, as SmolLM2's
    cfg.n_head_kv = 2;
    cfg.head_dim = 32; // the AVX2 P.V kernel's 32 dims
    cfg.n_rot = 32;
    cfg.n_ff = 256;
    cfg.wtype = GGML_TYPE_Q4_1;
    char *path = engine_test_model(&cfg, "batchinv");
    enum { N = 40 };
    struct bi_req ref[N];
    bi_reqs_random(ref, N, 77, cfg.n_vocab, 1);
    const struct bi_engine_cfg base = {
        .model = path, .n_ctx_seq = 64, .n_slots = BI_SLOTS, .n_batch = BI_STEP_TOKENS};
    const int threads[] = {1, 2, 3};
    bi_paths_run(&base, ref, N, threads, 3, 0x1fu);
    for (int i = 0; i < N; i++) {
        free(ref[i].prompt);
        free(ref[i].logits);
    }
    unlink(path);
    free(path);
}

// A model with experts (issue #32): qwen2moe, Q4_1, 8 experts of which 2
// per token, and the shared expert (whose gate goes through the host):
// each token's routing, expert mat-vecs and weighted sum must not depend on
// what else the step holds. 24 requests, 1 and 3 threads, every path.
Test(batch_invariance, moe_model_every_path) {
    struct mkmodel_config mc;
    arch_test_moe_config(&mc, MODEL_ARCH_QWEN2MOE, 128, 2, 128, 8, 2, GGML_TYPE_Q4_1);
    mc.n_ff_exp = 64;
    char path[] = "/tmp/vela_bi_moe_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&mc, path, &err), 0, "%s", err.msg);
    const int n_vocab = mkmodel_vocab_base_size();
    enum { N = 24 };
    struct bi_req ref[N];
    bi_reqs_random(ref, N, 91, n_vocab, -1);
    const struct bi_engine_cfg base = {
        .model = path, .n_ctx_seq = 64, .n_slots = BI_SLOTS, .n_batch = BI_STEP_TOKENS};
    const int threads[] = {1, 3};
    bi_paths_run(&base, ref, N, threads, 2, 0x1fu);
    for (int i = 0; i < N; i++) {
        free(ref[i].prompt);
        free(ref[i].logits);
    }
    unlink(path);
}

// The default model with real text: 16 prompts as in issue #31.
Test(batch_invariance, smollm2_real_text) {
    char path[4096];
    struct stat sb;
    if (tools_default_model_path(path, sizeof path) != 0 || stat(path, &sb) != 0 ||
        sb.st_size != TOOLS_DEFAULT_MODEL_BYTES)
        cr_skip_test("%s not in the model cache (bash tools/model_cache.sh fetches it)",
                     TOOLS_DEFAULT_MODEL_FILE);
    static const char *words[] = {"ocean",   "mountain", "coffee",  "robot", "winter", "library",
                                  "bicycle", "garden",   "thunder", "piano", "desert", "lantern",
                                  "volcano", "harbor",   "meadow",  "comet"};
    enum { N = 16 };
    struct bi_engine_cfg base = {
        .model = path, .n_ctx_seq = 128, .n_slots = BI_SLOTS, .n_batch = BI_STEP_TOKENS};
    // The tokenizer of a throwaway engine (one slot, no decode).
    struct bi_engine_cfg one = base;
    one.n_slots = 1;
    one.n_threads = 1;
    struct engine *e = bi_open(&one);
    struct bi_req ref[N];
    memset(ref, 0, sizeof ref);
    for (int i = 0; i < N; i++) {
        char text[128];
        snprintf(text, sizeof text, "Write one sentence about %s.", words[i]);
        struct verr err = {0};
        cr_assert_eq(tokenizer_encode_alloc(e->tok, text, strlen(text), true, false, &ref[i].prompt,
                                            &ref[i].n_prompt, &err),
                     0, "%s", err.msg);
        ref[i].n_predict = 6 + (i * 7) % 13; // 6..18: slots free at different steps
        ref[i].wave = i < 10 ? 0 : 4 * (i - 9);
        bi_req_alloc(&ref[i], e->m->hp.n_vocab);
    }
    engine_close(e);
    // What this CPU runs by default, at 3 threads (the tiny model covers the
    // other paths and thread counts; the plain ones take half a minute here).
    const enum cpu_q8_isa isa = cpu_q8_isa();
    const unsigned mask = isa == CPU_Q8_ISA_AVXVNNI ? 1u : isa == CPU_Q8_ISA_AVX2 ? 2u : 4u;
    const int threads[] = {3};
    bi_paths_run(&base, ref, N, threads, 1, mask);
    for (int i = 0; i < N; i++) {
        free(ref[i].prompt);
        free(ref[i].logits);
    }
}

// Quantized KV caches (issue #34): K q8_0 and V q4_1, so that attention
// dequantizes both; the store quantizes each token's row alone and
// attention reads the dequantized rows as an F32 cache, so nothing of the
// batch may reach a token's logits. 24 requests, 1 and 3 threads, every path.
Test(batch_invariance, quantized_kv_cache) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.vocab = true;
    cfg.n_vocab = 300;
    cfg.n_embd = 192;
    cfg.n_head = 6;
    cfg.n_head_kv = 2;
    cfg.head_dim = 32; // one block of q8_0 / q4_1 a head
    cfg.n_rot = 32;
    cfg.n_ff = 256;
    cfg.wtype = GGML_TYPE_Q4_1;
    char *path = engine_test_model(&cfg, "batchinv_kvq");
    enum { N = 24 };
    struct bi_req ref[N];
    memset(ref, 0, sizeof ref);
    uint64_t s = 34;
    for (int i = 0; i < N; i++) {
        struct bi_req *r = &ref[i];
        r->n_prompt = 1 + (int)((tiny_rand(&s) + 1) * 0.5 * 39); // 1..40
        r->n_predict = 2 + (int)((tiny_rand(&s) + 1) * 0.5 * 18);
        r->wave = i < 16 ? 0 : 3 * (i - 14);
        r->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
        r->prompt[0] = 1;
        for (int t = 1; t < r->n_prompt; t++)
            r->prompt[t] = 3 + (int32_t)((tiny_rand(&s) + 1) * 0.5 * (cfg.n_vocab - 4));
        bi_req_alloc(r, cfg.n_vocab);
    }
    const struct bi_engine_cfg base = {.model = path,
                                       .n_ctx_seq = 64,
                                       .n_slots = BI_SLOTS,
                                       .n_batch = BI_STEP_TOKENS,
                                       .type_k = GGML_TYPE_Q8_0,
                                       .type_v = GGML_TYPE_Q4_1};
    const int threads[] = {1, 3};
    bi_paths_run(&base, ref, N, threads, 2, 0x1fu);
    for (int i = 0; i < N; i++) {
        free(ref[i].prompt);
        free(ref[i].logits);
    }
    unlink(path);
    free(path);
}
