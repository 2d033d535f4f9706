// Sampling on the backend in the generation loop (host/engine/ with
// FORWARD_ROW_SAMPLE rows, host/split/context.h): with temp > 0 and no
// penalties, each step takes every row's draw from its sequence's seeded
// sampler before the decode and the backend's sample op picks the token, so
// no logits row comes to the host. The op path must give exactly the tokens of the host path
// (sampler_sample on downloaded logits), which an on_logits callback forces:
// same seed, same draws, same chain (the CPU op runs host/backend/sampler.c's chain).
// Checked for one sequence, --parallel samples of one prompt (their first
// step shares the prompt's row and is sampled on the host), a queue of
// prompts with continuous batching, context shifts, and a model split into
// two CPU stages (the head stage samples with the front's rows). Token
// equality is exact: both paths run the same float32 ops on the same logits.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/engine.h"
#include "tests/engine_helpers.h"

#define MAX_SEQ 8
#define MAX_TOK 256

static char *model_path;

static void setup(void) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.n_vocab = 96;
    cfg.n_ctx_train = 512;
    cfg.seed = 77;
    model_path = engine_test_model(&cfg, "engsample");
}

static void teardown(void) {
    unlink(model_path);
    free(model_path);
}

TestSuite(engine_sample, .init = setup, .fini = teardown);

static struct engine *open_engine(int n_ctx, int n_par, const char *devices) {
    const struct engine_test_cfg c = {
        .n_ctx = n_ctx, .n_batch = 16, .n_seq = n_par, .devices = devices};
    return engine_test_open(model_path, &c);
}

struct tokens {
    int32_t tok[MAX_SEQ][MAX_TOK];
    int n[MAX_SEQ];
};

static int collect(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                   size_t len) {
    struct tokens *t = user;
    if (ev == ENGINE_EV_TOKEN && token >= 0) {
        cr_assert_lt(seq, MAX_SEQ);
        cr_assert_lt(t->n[seq], MAX_TOK);
        t->tok[seq][t->n[seq]++] = token;
    }
    return 0;
}

static int rows_seen;
static int count_rows(void *user, int seq, int32_t pos, const float *logits) {
    rows_seen++;
    return 0;
}

struct run_cfg {
    int n_ctx, n_par, n_prompts, n_predict;
    bool batch; // engine_generate_batch over n_prompts prompts (else engine_generate)
    const char *devices;
    struct sampler_params sp;
};

// Runs the generation twice on one engine: the op path (no on_logits) and
// the host path (on_logits set); returns both runs' tokens and stats.
static void run_both(const struct run_cfg *c, struct tokens *dev, struct engine_stats *st_dev,
                     struct tokens *host, struct engine_stats *st_host) {
    struct engine *e = open_engine(c->n_ctx, c->n_par, c->devices);
    static const int32_t base[][7] = {{1, 5, 9, 13, 17, 21, 25},
                                      {2, 30, 31, 40},
                                      {3, 7, 11, 60, 61, 62},
                                      {4, 50},
                                      {5, 6, 70, 71, 72, 73, 74}};
    static const int lens[] = {7, 4, 6, 2, 7};
    struct engine_prompt ps[5];
    for (int i = 0; i < 5; i++)
        ps[i] = (struct engine_prompt){base[i], lens[i]};
    struct engine_gen_params g;
    engine_gen_params_default(&g);
    g.sp = c->sp;
    g.n_predict = c->n_predict;
    g.n_parallel = c->n_par;
    g.ignore_eos = true;
    struct verr err = {0};
    for (int pass = 0; pass < 2; pass++) {
        struct tokens *t = pass == 0 ? dev : host;
        struct engine_stats *st = pass == 0 ? st_dev : st_host;
        memset(t, 0, sizeof *t);
        g.on_logits = pass == 0 ? NULL : count_rows;
        rows_seen = 0;
        int rc = c->batch
                     ? engine_generate_batch(e, ps, c->n_prompts, &g, collect, t, st, &err)
                     : engine_generate(e, ps[0].tokens, ps[0].n_tokens, &g, collect, t, st, &err);
        cr_assert_eq(rc, 0, "generate: %s", err.msg);
        if (pass == 1)
            cr_assert_eq(rows_seen, st->n_gen, "the host path saw every row");
    }
    engine_close(e);
}

static void assert_same(const struct tokens *a, const struct tokens *b, int n_seq) {
    for (int s = 0; s < n_seq; s++) {
        cr_assert_eq(a->n[s], b->n[s], "sequence %d: %d tokens on the backend, %d on the host", s,
                     a->n[s], b->n[s]);
        for (int i = 0; i < a->n[s]; i++)
            cr_assert_eq(a->tok[s][i], b->tok[s][i],
                         "sequence %d token %d: %d sampled on the backend, %d on the host", s, i,
                         a->tok[s][i], b->tok[s][i]);
    }
}

static struct sampler_params sampled(uint32_t seed) {
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.seed = seed;
    sp.temp = 1.3f; // flat enough that the draws matter
    return sp;
}

Test(engine_sample, single_sequence_matches_host) {
    struct run_cfg c = {.n_ctx = 128, .n_par = 1, .n_predict = 40, .sp = sampled(42)};
    struct tokens dev, host;
    struct engine_stats sd, sh;
    run_both(&c, &dev, &sd, &host, &sh);
    assert_same(&dev, &host, 1);
    cr_assert_eq(sd.n_gen, 40);
    cr_assert_eq(sd.n_gen_backend, 40, "every token sampled on the backend");
    cr_assert_eq(sh.n_gen_backend, 0, "on_logits: every token sampled on the host");
    // The draws matter: a greedy run differs somewhere.
    struct run_cfg cg = c;
    cg.sp.temp = 0;
    struct tokens gd, gh;
    run_both(&cg, &gd, &sd, &gh, &sh);
    assert_same(&gd, &gh, 1);
    bool differs = false;
    for (int i = 0; i < 40; i++)
        differs |= gd.tok[0][i] != dev.tok[0][i];
    cr_assert(differs, "temperature 1.3 gave the greedy tokens: the test would not see the draws");
}

Test(engine_sample, chain_variants_match_host) {
    struct {
        int top_k;
        float top_p, min_p, temp;
    } v[] = {
        {0, 1.0f, 0.0f, 1.0f},   // plain dist
        {5, 1.0f, 0.0f, 0.7f},   // top_k only
        {0, 0.6f, 0.0f, 1.5f},   // top_p only
        {0, 1.0f, 0.2f, 2.0f},   // min_p only
        {40, 0.9f, 0.05f, 0.9f}, // all
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        struct run_cfg c = {.n_ctx = 128, .n_par = 1, .n_predict = 30, .sp = sampled(7 + k)};
        c.sp.top_k = v[k].top_k;
        c.sp.top_p = v[k].top_p;
        c.sp.min_p = v[k].min_p;
        c.sp.temp = v[k].temp;
        struct tokens dev, host;
        struct engine_stats sd, sh;
        run_both(&c, &dev, &sd, &host, &sh);
        assert_same(&dev, &host, 1);
        cr_assert_eq(sd.n_gen_backend, sd.n_gen, "variant %zu", k);
    }
}

Test(engine_sample, parallel_samples_match_host) {
    // Samples of one prompt share its cells: their first token comes from the
    // shared row (host path for that step), the rest from the sample op.
    struct run_cfg c = {.n_ctx = 256, .n_par = 3, .n_predict = 25, .sp = sampled(1234)};
    struct tokens dev, host;
    struct engine_stats sd, sh;
    run_both(&c, &dev, &sd, &host, &sh);
    assert_same(&dev, &host, 3);
    cr_assert_eq(sd.n_gen, 75);
    cr_assert_gt(sd.n_gen_backend, 60, "%d of %d on the backend", sd.n_gen_backend, sd.n_gen);
    cr_assert_eq(sh.n_gen_backend, 0);
    bool differ = false;
    for (int i = 0; i < 25; i++)
        differ |= dev.tok[0][i] != dev.tok[1][i];
    cr_assert(differ, "samples with seeds seed+i gave the same tokens");
}

Test(engine_sample, prompt_queue_with_context_shift_matches_host) {
    // 5 prompts through 2 slots (continuous batching: prompts start while
    // others generate, chunks and single tokens in one step), each sequence's
    // share of 40 cells shifting several times over 70 tokens.
    struct run_cfg c = {
        .n_ctx = 80, .n_par = 2, .n_prompts = 5, .n_predict = 70, .batch = true, .sp = sampled(99)};
    struct tokens dev, host;
    struct engine_stats sd, sh;
    run_both(&c, &dev, &sd, &host, &sh);
    assert_same(&dev, &host, 5);
    cr_assert_gt(sd.n_ctx_shifts, 0);
    cr_assert_eq(sd.n_ctx_shifts, sh.n_ctx_shifts);
    cr_assert_eq(sd.n_gen_backend, sd.n_gen);
}

Test(engine_sample, split_model_matches_host) {
    // Two CPU stages: the last stage's head samples with the front's rows.
    struct run_cfg c = {.n_ctx = 128,
                        .n_par = 2,
                        .n_prompts = 3,
                        .n_predict = 20,
                        .batch = true,
                        .devices = "cpu,cpu",
                        .sp = sampled(5)};
    struct tokens dev, host;
    struct engine_stats sd, sh;
    run_both(&c, &dev, &sd, &host, &sh);
    assert_same(&dev, &host, 3);
    cr_assert_eq(sd.n_gen_backend, sd.n_gen);
    // And the split model samples what the whole one does.
    struct run_cfg c1 = c;
    c1.devices = NULL;
    struct tokens one, one_h;
    run_both(&c1, &one, &sd, &one_h, &sh);
    assert_same(&dev, &one, 3);
}

Test(engine_sample, penalties_keep_the_host_path) {
    struct run_cfg c = {.n_ctx = 128, .n_par = 1, .n_predict = 20, .sp = sampled(3)};
    c.sp.repeat_penalty = 1.3f;
    struct tokens dev, host;
    struct engine_stats sd, sh;
    run_both(&c, &dev, &sd, &host, &sh);
    assert_same(&dev, &host, 1);
    cr_assert_eq(sd.n_gen_backend, 0, "penalties are applied on the host");
}
