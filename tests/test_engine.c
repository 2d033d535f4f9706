// The generation engine (host/engine/) on the CPU backend with tiny models
// written by the test (tests/tiny_model.h):
// - context shift: after every shift, the logits the engine samples from
//   equal those of a fresh evaluation of exactly the kept tokens at
//   positions 0..k-1 (one-layer model, see below), f32 and f16 caches;
// - several prompts decoded together (--parallel) give, token for token,
//   what each prompt gives alone, with context shifts, self-extend,
//   sampling and prompts shared between samples;
// - bad input is refused with a clear message and the cache left as it was;
// - `vela run --help` / `vela eval --help` list the flags, and `vela run
//   --parallel N -f FILE` prints each prompt's text and the aggregate speed.
//
// Why one layer for the logits comparisons: a context shift (and a
// self-extend round) moves cached K by a rotation, which is exact for layer
// 0, whose K/V depend only on the token and its position. In deeper layers
// the cached K/V of a kept token were computed from hidden states that had
// attended to the tokens dropped since (or, for self-extend, had been
// computed at the positions before the regrouping), so a fresh evaluation of
// the kept tokens legitimately differs there; the K rotation itself is
// checked against direct RoPE for every layer by test_kv (kv_shift suite).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "host/engine/engine.h"
#include "host/forward/forward.h"
#include "host/split/context.h"
#include "tiny_model.h"
#include "tools/args.h"

// Logit tolerances, relative to the largest |logit| of the fresh evaluation
// (logits here are a few units). A wrong position gives errors of 0.3 to 0.4
// (the self-extend test measures it against plain positions each time).
// - F32 cache: 1e-5. Everything is float32; a shifted K went through one or
//   more extra rotations by delta (cos/sin of float32 angles, a few ulps each)
//   where the fresh evaluation rotates once to the final position, and the
//   engine's single-token decodes and the fresh multi-token batch may sum in
//   other orders. The worst seen is 3.8e-7 (context shift, 14 shifts) and
//   3.0e-7 (self-extend); the margin covers other CPUs' libm.
// - F16 cache: 3e-3. The fresh evaluation rounds K to f16 once; the engine's
//   K was rounded when stored and again after every shift that moved it
//   (2^-11 relative each; a kept token goes through up to ~14 shifts here),
//   and everything after attention inherits that. The worst seen is 3.5e-4
//   (context shift) and 1.9e-4 (self-extend).
#define TOL_F32 1e-5
#define TOL_F16 3e-3

static char *write_model(struct tiny_cfg *cfg, struct tiny_weights *w, const char *tag) {
    char *path = malloc(128);
    tiny_temp_path(path, 128, tag);
    struct verr err = {0};
    cr_assert_eq(tiny_write(cfg, path, w, &err), 0, "tiny_write: %s", err.msg);
    return path;
}

// A tiny llama with a SentencePiece vocabulary of 300 tokens; n_layer 0: the
// default depth.
static char *vocab_model(struct tiny_weights *w, int n_layer, const char *tag) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    if (n_layer)
        cfg.n_layer = n_layer;
    cfg.vocab = true;
    cfg.n_vocab = 300;
    return write_model(&cfg, w, tag);
}

// Undoes write_model.
static void remove_model(struct tiny_weights *w, char *path) {
    tiny_weights_free(w);
    unlink(path);
    free(path);
}

// n_par sequences; logits rows per decode: n_par, or n_batch when n_par is 0
// (engine_eval wants every row).
static struct engine *open_engine(const char *path, int n_ctx, int n_batch, enum ggml_type kv,
                                  int n_par) {
    struct args_model am;
    args_model_default(&am);
    am.model_path = path;
    am.backend = LOAD_BACKEND_CPU;
    am.n_threads = 2;
    am.n_ctx = n_ctx;
    am.n_batch = n_batch;
    am.type_k = am.type_v = kv;
    struct engine_config op;
    args_engine_config(&am, &op);
    op.ctx.n_seq_max = n_par > 0 ? n_par : 1;
    op.ctx.n_outputs_max = n_par > 0 ? n_par : n_batch;
    struct engine *e = NULL;
    struct verr err = {0};
    cr_assert_eq(engine_open(&e, &op, &err), 0, "engine_open: %s", err.msg);
    return e;
}

static double rel_err(const float *a, const float *ref, int n) {
    double worst = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - ref[i]));
        mx = fmax(mx, fabs((double)ref[i]));
    }
    return worst / mx;
}

// ---------------------------------------------------------------------------
// Context shift against a fresh evaluation of the kept tokens

struct shift_check {
    struct context *fresh; // a second context on the same weights
    int32_t ctx[64];       // the tokens the cache holds, in order, + the pending one
    int n;
    int n_keep; // llama-cli's: --keep + BOS
    int n_ctx;
    int n_shifts, n_checked, n_checked_after_shift;
    double worst_before, worst_after;
    float tol;
};

static int shift_event(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                       size_t len) {
    struct shift_check *c = user;
    cr_assert_eq(seq, 0);
    if (ev == ENGINE_EV_TOKEN && token >= 0) {
        cr_assert_lt(c->n, 64);
        c->ctx[c->n++] = token;
    } else if (ev == ENGINE_EV_SHIFT) {
        // The cache holds ctx[0..n-1) (the last token waits to be decoded);
        // llama-cli's shift at n_past = n - 1 when n_past + 1 >= n_ctx.
        int n_past = c->n - 1;
        cr_assert_eq(n_past + 1, c->n_ctx, "shift at n_past %d", n_past);
        int n_discard = (n_past - c->n_keep) / 2;
        cr_assert_eq(token, n_discard, "n_discard %d, llama-cli's %d", token, n_discard);
        memmove(c->ctx + c->n_keep, c->ctx + c->n_keep + n_discard,
                (size_t)(c->n - c->n_keep - n_discard) * sizeof(int32_t));
        c->n -= n_discard;
        c->n_shifts++;
    }
    (void)text;
    (void)len;
    return 0;
}

static int shift_logits(void *user, int seq, int32_t pos, const float *logits) {
    struct shift_check *c = user;
    cr_assert_eq(seq, 0);
    // The row comes from the token at `pos`: the kept tokens sit at 0..pos.
    cr_assert_eq(pos, c->n - 1, "row of position %d, %d tokens kept", pos, c->n);
    int32_t p[64], s[64] = {0};
    for (int t = 0; t < c->n; t++)
        p[t] = t;
    struct verr err = {0};
    cr_assert_eq(context_clear(c->fresh, &err), 0, "%s", err.msg);
    struct forward_batch b = {c->n, c->ctx, p, s, NULL, NULL};
    struct context_result res;
    cr_assert_eq(context_decode_logits(c->fresh, &b, &res, &err), 0, "%s", err.msg);
    double e = rel_err(logits, context_row_logits(&res, 0), res.n_vocab);
    c->n_checked++;
    if (c->n_shifts > 0) {
        c->n_checked_after_shift++;
        c->worst_after = fmax(c->worst_after, e);
    } else {
        c->worst_before = fmax(c->worst_before, e);
    }
    cr_assert_leq(e, c->tol, "position %d after %d shifts: relative logit error %.3g > %.3g", pos,
                  c->n_shifts, e, c->tol);
    return 0;
}

static void context_shift_case(enum ggml_type kv, float tol) {
    struct tiny_weights w;
    char *path = vocab_model(&w, 1, "eng_shift");
    const int n_ctx = 32;
    struct engine *e = open_engine(path, n_ctx, 32, kv, 1);

    struct shift_check c = {.n_ctx = n_ctx, .tol = tol};
    struct forward_config fcfg = *context_config(e->ctx);
    struct verr err = {0};
    cr_assert_eq(context_create(&c.fresh, e->weights, &fcfg, false, &err), 0, "%s", err.msg);
    const int32_t prompt[] = {1, 270, 280, 261, 290, 275, 263, 299}; // BOS first
    const int n_prompt = 8;
    memcpy(c.ctx, prompt, sizeof prompt);
    c.n = n_prompt;
    struct engine_gen_params g;
    engine_gen_params_default(&g);
    g.sp.temp = 0; // greedy
    g.n_predict = 200;
    g.n_keep = 3;
    c.n_keep = 3 + 1; // + BOS, as llama-cli
    g.ignore_eos = true;
    g.on_logits = shift_logits;
    g.logits_user = &c;
    struct engine_stats st;
    cr_assert_eq(engine_generate(e, prompt, n_prompt, &g, shift_event, &c, &st, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(st.n_gen, 200);
    cr_assert_eq(st.n_ctx_shifts, c.n_shifts);
    // 200 tokens through 31 usable cells, 13 dropped per shift
    cr_assert_geq(c.n_shifts, 10, "only %d shifts", c.n_shifts);
    cr_assert_eq(c.n_checked, 200);
    cr_assert_geq(c.n_checked_after_shift, 150);
    cr_log_info("context shift, %s cache: %d shifts, worst relative logit error %.3g before the "
                "first shift, %.3g after (tolerance %.0e)",
                ggml_type_name(kv), c.n_shifts, c.worst_before, c.worst_after, (double)tol);
    cr_assert_eq(context_cells_used(e->ctx), 0, "the finished sequence leaves no cell behind");
    context_free(c.fresh);
    engine_close(e);
    remove_model(&w, path);
}

Test(engine, context_shift_logits_match_fresh_eval_f32) {
    context_shift_case(GGML_TYPE_F32, TOL_F32);
}

Test(engine, context_shift_logits_match_fresh_eval_f16) {
    context_shift_case(GGML_TYPE_F16, TOL_F16);
}

// Without context shift the sequence stops at llama-cli's limit.
Test(engine, no_context_shift_stops_when_full) {
    struct tiny_weights w;
    char *path = vocab_model(&w, 0, "eng_full");
    struct engine *e = open_engine(path, 16, 16, GGML_TYPE_F32, 1);
    const int32_t prompt[] = {1, 270, 280};
    struct engine_gen_params g;
    engine_gen_params_default(&g);
    g.sp.temp = 0;
    g.ignore_eos = true;
    struct engine_stats st;
    struct verr err = {0};
    for (int k = 0; k < 2; k++) {
        g.ctx_shift = k == 0;
        g.n_predict = k == 0 ? -2 : 100; // -2: until the context is full, shift or not
        cr_assert_eq(engine_generate(e, prompt, 3, &g, NULL, NULL, &st, &err), 0, "%s", err.msg);
        // decodes stop once n_past + 1 >= 16: 3 prompt + 12 generated tokens
        // decoded, plus the last sampled one
        cr_expect_eq(st.n_gen, 13, "case %d: %d tokens", k, st.n_gen);
        cr_expect_eq(st.n_ctx_shifts, 0);
    }
    engine_close(e);
    remove_model(&w, path);
}

// ---------------------------------------------------------------------------
// Self-extend: the last batch's logits against the final positions given directly

struct rows_keep {
    int first_last; // first token of the last chunk seen
    int n_last;
    float *last; // [n][n_vocab] the last chunk's rows
    int n_vocab;
    int n_notes, n_div;
};

static int keep_rows(void *user, int first, int n, const float *logits) {
    struct rows_keep *k = user;
    k->first_last = first;
    k->n_last = n;
    memcpy(k->last, logits, (size_t)n * k->n_vocab * sizeof(float));
    return 0;
}

static int count_notes(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                       size_t len) {
    struct rows_keep *k = user;
    cr_assert_eq(ev, ENGINE_EV_NOTE);
    k->n_notes++;
    if (!strncmp(text, "div:", 4))
        k->n_div++;
    else
        cr_assert(!strncmp(text, "shift:", 6), "%.*s", (int)len, text);
    return 0;
}

// The worst rel_err of the kept rows against the first k->n_last rows of res.
static double worst_rows(const struct rows_keep *k, const struct context_result *res) {
    double worst = 0;
    for (int r = 0; r < k->n_last; r++)
        worst = fmax(worst, rel_err(k->last + (size_t)r * k->n_vocab, context_row_logits(res, r),
                                    k->n_vocab));
    return worst;
}

// Evaluates tokens (n <= n_ctx) with self-extend (ga_n, ga_w) in batches of
// n_batch; then the same tokens in one batch of a fresh context at the cells'
// final positions; returns the worst relative error over the last batch's
// rows. *pos_out: the final positions. *err_plain: the same last rows against
// an evaluation without self-extend (how much the positions matter).
static double selfextend_case(const char *path, enum ggml_type kv, int n, int n_batch, int ga_n,
                              int ga_w, int32_t *pos_out, double *err_plain) {
    struct engine *e = open_engine(path, n, n_batch, kv, 0);
    const int V = e->m->hp.n_vocab;
    int32_t *tok = malloc(sizeof(int32_t) * n);
    uint64_t s = 99;
    for (int t = 0; t < n; t++)
        tok[t] = 3 + (int32_t)((tiny_rand(&s) + 1) * 0.5 * (V - 4));
    struct rows_keep k = {.n_vocab = V, .last = malloc(sizeof(float) * n_batch * V)};
    struct engine_eval_params ep = {.ga_n = ga_n, .ga_w = ga_w, .cb = count_notes, .user = &k};
    struct verr err = {0};
    cr_assert_eq(engine_eval_ex(e, tok, n, &ep, keep_rows, &k, NULL, &err), 0, "%s", err.msg);
    cr_assert_gt(k.n_div, 0, "no self-extend round ran");
    cr_assert_eq(k.n_notes, 3 * k.n_div, "three lines per round (shift, div, shift)");
    // A fresh cache fills cells 0..n-1 in order: cell t holds token t.
    const struct kv_cache *cache = &context_stage(e->ctx, 0)->kv;
    cr_assert_eq(context_cells_used(e->ctx), n);
    for (int t = 0; t < n; t++) {
        cr_assert(kv_cell_has_seq(cache, t, 0));
        pos_out[t] = kv_cell_pos(cache, t);
    }

    // The same tokens at the final positions, given directly, in one batch.
    struct forward_config cfg = *context_config(e->ctx);
    cfg.n_batch = n;
    cfg.n_outputs_max = n;
    struct context *fresh;
    cr_assert_eq(context_create(&fresh, e->weights, &cfg, false, &err), 0, "%s", err.msg);
    int32_t *seq = calloc(n, sizeof(int32_t));
    int8_t *want = calloc(n, 1);
    for (int t = k.first_last; t < n; t++)
        want[t] = 1;
    struct forward_batch b = {n, tok, pos_out, seq, want, NULL};
    struct context_result res;
    cr_assert_eq(context_decode_logits(fresh, &b, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.n_rows, k.n_last);
    double worst = worst_rows(&k, &res);

    // Plain positions 0..n-1: the check above is not vacuous.
    int32_t *plain = malloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++)
        plain[t] = t;
    cr_assert_eq(context_clear(fresh, &err), 0, "%s", err.msg);
    b.pos = plain;
    cr_assert_eq(context_decode_logits(fresh, &b, &res, &err), 0, "%s", err.msg);
    *err_plain = worst_rows(&k, &res);

    context_free(fresh);
    free(plain);
    free(seq);
    free(want);
    free(k.last);
    free(tok);
    engine_close(e);
    return worst;
}

Test(engine, selfextend_last_batch_matches_final_positions) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.n_layer = 1;
    struct tiny_weights w;
    char *path = write_model(&cfg, &w, "eng_se");
    const struct {
        int n, n_batch, ga_n, ga_w;
        enum ggml_type kv;
        float tol;
    } cases[] = {
        {40, 4, 2, 8, GGML_TYPE_F32, TOL_F32},  {45, 5, 4, 16, GGML_TYPE_F32, TOL_F32},
        {64, 8, 2, 32, GGML_TYPE_F32, TOL_F32}, {40, 4, 2, 8, GGML_TYPE_F16, TOL_F16},
        {45, 5, 4, 16, GGML_TYPE_F16, TOL_F16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t pos[64];
        double plain;
        double e = selfextend_case(path, cases[i].kv, cases[i].n, cases[i].n_batch, cases[i].ga_n,
                                   cases[i].ga_w, pos, &plain);
        // The positions were regrouped: the last batch starts below n.
        cr_assert_lt(pos[cases[i].n - 1], cases[i].n - 1);
        cr_log_info("self-extend n %d, -b %d, -gan %d -gaw %d, %s cache: last position %d, "
                    "worst relative logit error %.3g (tolerance %.0e; %.3g against plain "
                    "positions)",
                    cases[i].n, cases[i].n_batch, cases[i].ga_n, cases[i].ga_w,
                    ggml_type_name(cases[i].kv), pos[cases[i].n - 1], e, (double)cases[i].tol,
                    plain);
        cr_expect_leq(e, cases[i].tol, "case %zu: %.3g", i, e);
        cr_expect_gt(plain, 10 * cases[i].tol, "case %zu: positions do not matter? %.3g", i, plain);
    }
    remove_model(&w, path);
}

// ---------------------------------------------------------------------------
// Several sequences in one cache against each alone

#define MAX_SEQ 8

struct collect {
    int32_t tok[MAX_SEQ][256];
    int n[MAX_SEQ];
    char why[MAX_SEQ][16];
    int n_done;
    int n_shift[MAX_SEQ];
};

static int collect_event(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                         size_t len) {
    struct collect *c = user;
    cr_assert(seq >= 0 && seq < MAX_SEQ);
    if (ev == ENGINE_EV_TOKEN && token >= 0) {
        cr_assert_lt(c->n[seq], 256);
        c->tok[seq][c->n[seq]++] = token;
    } else if (ev == ENGINE_EV_DONE) {
        cr_assert_eq(c->why[seq][0], '\0', "sequence %d ended twice", seq);
        snprintf(c->why[seq], sizeof c->why[seq], "%.*s", (int)len, text);
        c->n_done++;
    } else if (ev == ENGINE_EV_SHIFT) {
        c->n_shift[seq]++;
    }
    return 0;
}

// Runs prompts[0..n) with n_par slots in a cache of n_par * n_ctx_seq cells,
// then each prompt alone (seed + i) in a cache of n_ctx_seq cells, and
// compares the tokens and why each ended.
static void parallel_vs_solo(const char *path, const struct engine_prompt *prompts, int n,
                             int n_par, int n_ctx_seq, int n_batch,
                             const struct engine_gen_params *g, int *shifts_out, int *splits_out) {
    struct verr err = {0};
    struct engine *e = open_engine(path, n_par * n_ctx_seq, n_batch, GGML_TYPE_F16, n_par);
    struct collect *par = calloc(1, sizeof *par), *solo = calloc(1, sizeof *solo);
    struct engine_gen_params gp = *g;
    gp.n_parallel = n_par;
    struct engine_stats st;
    cr_assert_eq(engine_generate_batch(e, prompts, n, &gp, collect_event, par, &st, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(par->n_done, n);
    cr_assert_eq(st.n_seq, n);
    if (splits_out)
        *splits_out = st.n_batch_splits;
    cr_assert_eq(context_cells_used(e->ctx), 0, "finished sequences are removed");
    engine_close(e);

    e = open_engine(path, n_ctx_seq, n_batch, GGML_TYPE_F16, 1);
    int shifts = 0;
    for (int i = 0; i < n; i++) {
        struct collect one = {0};
        struct engine_gen_params g1 = *g;
        g1.n_parallel = 1;
        g1.sp.seed = g->sp.seed + (uint32_t)i;
        cr_assert_eq(engine_generate_batch(e, &prompts[i], 1, &g1, collect_event, &one, &st, &err),
                     0, "%s", err.msg);
        solo->n[i] = one.n[0];
        memcpy(solo->tok[i], one.tok[0], sizeof one.tok[0]);
        memcpy(solo->why[i], one.why[0], sizeof one.why[0]);
        cr_expect_eq(par->n_shift[i], one.n_shift[0], "prompt %d: %d shifts in parallel, %d alone",
                     i, par->n_shift[i], one.n_shift[0]);
        shifts += one.n_shift[0];
    }
    engine_close(e);
    for (int i = 0; i < n; i++) {
        cr_expect_str_eq(par->why[i], solo->why[i], "prompt %d ended on %s, alone on %s", i,
                         par->why[i], solo->why[i]);
        cr_expect_eq(par->n[i], solo->n[i], "prompt %d: %d tokens in parallel, %d alone", i,
                     par->n[i], solo->n[i]);
        for (int t = 0; t < par->n[i] && t < solo->n[i]; t++)
            if (par->tok[i][t] != solo->tok[i][t]) {
                cr_expect_fail("prompt %d: token %d is %d in parallel, %d alone", i, t,
                               par->tok[i][t], solo->tok[i][t]);
                break;
            }
    }
    if (shifts_out)
        *shifts_out = shifts;
    free(par);
    free(solo);
}

struct prompts5 {
    int32_t tok[5][24];
    struct engine_prompt p[5];
};

static void make_prompts(struct prompts5 *ps) {
    static const int len[5] = {7, 1, 20, 3, 12}; // different lengths, one spans 3 batches of 8
    uint64_t s = 7;
    for (int i = 0; i < 5; i++) {
        ps->tok[i][0] = 1; // BOS
        for (int t = 1; t < len[i]; t++)
            ps->tok[i][t] = 3 + (int32_t)((tiny_rand(&s) + 1) * 0.5 * 296);
        ps->p[i] = (struct engine_prompt){ps->tok[i], len[i]};
    }
}

static char *parallel_model(struct tiny_weights *w) {
    return vocab_model(w, 0, "eng_par");
}

// The parallel tests' start: the model, the five prompts and default
// generation parameters.
static char *parallel_setup(struct tiny_weights *w, struct prompts5 *ps,
                            struct engine_gen_params *g) {
    char *path = parallel_model(w);
    make_prompts(ps);
    engine_gen_params_default(g);
    return path;
}

Test(engine, parallel_greedy_with_shifts_matches_solo) {
    struct tiny_weights w;
    struct prompts5 ps;
    struct engine_gen_params g;
    char *path = parallel_setup(&w, &ps, &g);
    g.sp.temp = 0;
    g.n_predict = 40; // 32 cells per sequence: every sequence shifts at least once
    g.n_keep = 2;
    g.ignore_eos = true;
    int shifts = 0;
    int splits = 0;
    parallel_vs_solo(path, ps.p, 5, 3, 32, 8, &g, &shifts, &splits);
    cr_log_info("parallel greedy: %d shifts, %d batch splits", shifts, splits);
    cr_expect_geq(shifts, 5, "%d shifts", shifts);
    // the same, stopping at EOG: sequences end at different steps
    g.ignore_eos = false;
    g.n_predict = 25;
    parallel_vs_solo(path, ps.p, 5, 3, 32, 8, &g, NULL, NULL);
    remove_model(&w, path);
}

Test(engine, parallel_sampled_matches_solo_with_seed_plus_index) {
    struct tiny_weights w;
    struct prompts5 ps;
    struct engine_gen_params g;
    char *path = parallel_setup(&w, &ps, &g);
    g.sp.temp = 0.9f;
    g.sp.seed = 1234;
    g.sp.repeat_penalty = 1.1f;
    g.n_predict = 30;
    g.ignore_eos = true;
    parallel_vs_solo(path, ps.p, 5, 2, 32, 4, &g, NULL, NULL);
    remove_model(&w, path);
}

Test(engine, parallel_selfextend_matches_solo) {
    struct tiny_weights w;
    struct prompts5 ps;
    struct engine_gen_params g;
    char *path = parallel_setup(&w, &ps, &g);
    g.sp.temp = 0;
    g.n_predict = 40; // more than the 32 cells: ends on "context full"
    g.ga_n = 2;
    g.ga_w = 8;
    g.ignore_eos = true;
    parallel_vs_solo(path, ps.p, 5, 3, 32, 8, &g, NULL, NULL);
    remove_model(&w, path);
}

// N samples of one prompt share its cells: the prompt is read once.
Test(engine, samples_of_one_prompt_share_its_cells) {
    struct tiny_weights w;
    struct prompts5 ps;
    struct engine_gen_params g;
    char *path = parallel_setup(&w, &ps, &g);
    g.sp.temp = 0;
    g.n_predict = 10;
    g.ignore_eos = true;
    g.n_parallel = 3;
    struct verr err = {0};
    struct engine_stats st;
    struct collect *c = calloc(1, sizeof *c), *one = calloc(1, sizeof *one);
    struct engine *e = open_engine(path, 96, 8, GGML_TYPE_F16, 3);
    cr_assert_eq(
        engine_generate(e, ps.p[2].tokens, ps.p[2].n_tokens, &g, collect_event, c, &st, &err), 0,
        "%s", err.msg);
    cr_expect_eq(st.n_prompt, 20, "the prompt is read once, not %d tokens", st.n_prompt);
    cr_expect_eq(st.n_gen, 30);
    engine_close(e);
    e = open_engine(path, 32, 8, GGML_TYPE_F16, 1);
    g.n_parallel = 1;
    cr_assert_eq(
        engine_generate(e, ps.p[2].tokens, ps.p[2].n_tokens, &g, collect_event, one, &st, &err), 0,
        "%s", err.msg);
    for (int s = 0; s < 3; s++) {
        cr_expect_eq(c->n[s], one->n[0]);
        cr_expect(!memcmp(c->tok[s], one->tok[0], sizeof(int32_t) * one->n[0]),
                  "sample %d differs from the prompt alone", s);
    }
    engine_close(e);
    free(c);
    free(one);
    remove_model(&w, path);
}

// ---------------------------------------------------------------------------
// Bad input: a clear error, the cache as it was

struct cache_snap {
    int used, head;
    int32_t pos[32];
};

static struct cache_snap snap(const struct kv_cache *kv) {
    struct cache_snap s = {.used = kv->used, .head = kv->head};
    for (int c = 0; c < 32 && c < kv->cfg.n_ctx; c++)
        s.pos[c] = kv->pos[c];
    return s;
}

static void expect_unchanged(const struct kv_cache *kv, const struct cache_snap *before,
                             const char *what) {
    struct cache_snap now = snap(kv);
    cr_expect(now.used == before->used && now.head == before->head &&
                  !memcmp(now.pos, before->pos, sizeof now.pos),
              "%s changed the cache", what);
}

Test(engine, bad_input_leaves_cache_unchanged) {
    struct tiny_weights w;
    char *path = parallel_model(&w);
    struct engine *e = open_engine(path, 32, 8, GGML_TYPE_F32, 0);
    struct verr err = {0};
    int32_t tok[40];
    for (int t = 0; t < 40; t++)
        tok[t] = 3 + t;
    cr_assert_eq(engine_eval(e, tok, 10, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    const struct kv_cache *kv = &context_stage(e->ctx, 0)->kv;
    struct cache_snap before = snap(kv);
    cr_assert_eq(before.used, 10);
    struct engine_gen_params g;
    engine_gen_params_default(&g);
    struct engine_stats st;

    // llama-cli's limit: n_ctx - 4 tokens
    err.msg[0] = '\0';
    cr_expect_eq(engine_generate(e, tok, 29, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "prompt is too long (29 tokens, max 28)"), "%s", err.msg);
    expect_unchanged(kv, &before, "a long prompt");

    struct engine_prompt ps[3] = {{tok, 5}, {tok, 30}, {tok, 3}};
    cr_expect_eq(engine_generate_batch(e, ps, 3, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "prompt 1 is too long (30 tokens, max 28)"), "%s", err.msg);
    expect_unchanged(kv, &before, "a long prompt in a list");

    g.n_parallel = 2; // the context was opened for 1 sequence
    cr_expect_eq(engine_generate(e, tok, 3, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "--parallel 2: the context was opened for 1 sequences"), "%s",
              err.msg);
    expect_unchanged(kv, &before, "--parallel 2");

    g.n_parallel = 1;
    int32_t bad[3] = {1, 5000, 7};
    cr_expect_eq(engine_generate(e, bad, 3, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "token id 5000 is out of range"), "%s", err.msg);
    expect_unchanged(kv, &before, "a bad token id");

    g.ga_n = 3;
    g.ga_w = 8; // not a multiple of 3
    cr_expect_eq(engine_generate(e, tok, 3, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "multiple"), "%s", err.msg);
    expect_unchanged(kv, &before, "bad self-extend values");
    g.ga_n = 1;

    cr_expect_eq(engine_eval(e, tok, 33, NULL, NULL, NULL, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "33 tokens do not fit in the context of 32"), "%s", err.msg);
    expect_unchanged(kv, &before, "eval of more tokens than cells");

    struct engine_eval_params ep = {.ga_n = 2, .ga_w = 64};
    cr_expect_eq(engine_eval_ex(e, tok, 10, &ep, NULL, NULL, NULL, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "ga_w 64 must be <= n_ctx 32"), "%s", err.msg);
    expect_unchanged(kv, &before, "a self-extend width wider than the cache");

    // a sequence id outside the cache and a batch larger than it, at the forward pass
    int32_t pos[1] = {10}, seq[1] = {2};
    struct forward_batch b = {1, tok, pos, seq, NULL, NULL};
    cr_expect_eq(context_decode_logits(e->ctx, &b, NULL, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "sequence id 2"), "%s", err.msg);
    expect_unchanged(kv, &before, "a bad sequence id");

    // the cache stays usable: a good run after all that (a fixed seed and no
    // stop at EOS, so that exactly n_predict tokens come: with a random seed
    // the sampler picked EOS early now and then)
    g.n_predict = 4;
    g.ignore_eos = true;
    g.sp.seed = 7;
    cr_expect_eq(engine_generate(e, tok, 3, &g, NULL, NULL, &st, &err), 0, "%s", err.msg);
    cr_expect_eq(st.n_gen, 4);
    engine_close(e);

    // 2 sequences share 32 cells: 16 each, so prompts up to 12 tokens
    e = open_engine(path, 32, 8, GGML_TYPE_F32, 2);
    g.n_parallel = 2;
    cr_expect_eq(engine_generate(e, tok, 13, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "prompt is too long (13 tokens, max 12)"), "%s", err.msg);
    cr_expect_eq(context_cells_used(e->ctx), 0);
    engine_close(e);

    // more sequences than cells allow
    e = open_engine(path, 16, 8, GGML_TYPE_F32, 4);
    g.n_parallel = 4;
    cr_expect_eq(engine_generate(e, tok, 1, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "leaves 4 per sequence for --parallel 4"), "%s", err.msg);
    engine_close(e);
    remove_model(&w, path);
}

// ---------------------------------------------------------------------------
// The command line

static int run_vela(const char *args, char **out, char **errs) {
    const char *bin = getenv("VELA_BIN");
    char o[64], e[64], cmd[4096];
    tiny_temp_path(o, sizeof o, "eout");
    tiny_temp_path(e, sizeof e, "eerr");
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", bin ? bin : "./vela", args, o, e);
    int st = system(cmd);
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(k ? e : o, "rb");
        char *buf = calloc(1, 1 << 20);
        size_t n = f ? fread(buf, 1, (1 << 20) - 1, f) : 0;
        buf[n] = '\0';
        if (f)
            fclose(f);
        *(k ? errs : out) = buf;
    }
    unlink(o);
    unlink(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(engine_cli, help_lists_flags) {
    char *out, *err;
    cr_assert_eq(run_vela("run --help", &out, &err), 0);
    const char *run_flags[] = {
        "--parallel",         "-np",          "--file",     "--keep",        "--context-shift",
        "--no-context-shift", "--grp-attn-n", "-gan",       "--grp-attn-w",  "-gaw",
        "--ignore-eos",       "--n-predict",  "--ctx-size", "--cache-type-k"};
    for (size_t i = 0; i < sizeof run_flags / sizeof run_flags[0]; i++)
        cr_expect(strstr(out, run_flags[i]), "run --help does not mention %s", run_flags[i]);
    free(out);
    free(err);
    cr_assert_eq(run_vela("eval --help", &out, &err), 0);
    const char *eval_flags[] = {"--tokens",     "--logits-out", "--grp-attn-n", "-gan",
                                "--grp-attn-w", "-gaw",         "--batch-size", "--verbose"};
    for (size_t i = 0; i < sizeof eval_flags / sizeof eval_flags[0]; i++)
        cr_expect(strstr(out, eval_flags[i]), "eval --help does not mention %s", eval_flags[i]);
    free(out);
    free(err);
}

// Text after "[sequence i]\n" up to the next "\n[sequence " or the end.
static char *sequence_text(const char *out, int i) {
    char tag[32];
    snprintf(tag, sizeof tag, "[sequence %d]\n", i);
    const char *p = strstr(out, tag);
    if (!p)
        return NULL;
    p += strlen(tag);
    const char *end = strstr(p, "\n[sequence ");
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n && p[n - 1] == '\n')
        n--;
    return strndup(p, n);
}

Test(engine_cli, run_parallel_prompts_file) {
    struct tiny_weights w;
    char *path = parallel_model(&w);
    const char *lines[] = {"hello world", "ab", "a much longer prompt about many things", "xyz",
                           "the end"};
    char pf[64];
    tiny_temp_path(pf, sizeof pf, "prompts");
    FILE *f = fopen(pf, "w");
    for (int i = 0; i < 5; i++)
        fprintf(f, "%s\n%s", lines[i], i == 2 ? "\n" : ""); // a blank line is skipped
    fclose(f);
    char args[1024], *out, *err;
    snprintf(args, sizeof args,
             "run -m %s --backend cpu -t 2 --parallel 3 -f %s -c 192 -n 12 "
             "--temp 0",
             path, pf);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "total:") && strstr(err, "5 sequences, 3 at a time") &&
                  strstr(err, "tokens/s"),
              "%s", err);
    for (int i = 0; i < 5; i++) {
        char *par = sequence_text(out, i);
        cr_assert(par, "no [sequence %d] in %s", i, out);
        char *o1, *e1;
        snprintf(args, sizeof args, "run -m %s --backend cpu -t 2 -p '%s' -c 64 -n 12 --temp 0",
                 path, lines[i]);
        cr_assert_eq(run_vela(args, &o1, &e1), 0, "%s", e1);
        size_t n = strlen(o1);
        if (n && o1[n - 1] == '\n')
            o1[n - 1] = '\0';
        cr_expect_str_eq(par, o1, "prompt %d: parallel and alone differ", i);
        free(par);
        free(o1);
        free(e1);
    }
    free(out);
    free(err);

    static const struct {
        const char *before, *after; // flags around -f FILE
        int rc;
        const char *msg;
    } refused[] = {
        {"--parallel 300", "", 2, "--parallel: 300 is out of range"},
        {"--backend cpu --parallel 3", " -c 12", 1, "leaves 4 per sequence"},
        {"--backend cpu --parallel 2", " -c 80", 1, "prompt 2 is too long (54 tokens, max 36)"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(args, sizeof args, "run -m %s %s -f %s%s", path, refused[i].before, pf,
                 refused[i].after);
        cr_expect_eq(run_vela(args, &out, &err), refused[i].rc, "%s", args);
        cr_expect(strstr(err, refused[i].msg), "%s", err);
        free(out);
        free(err);
    }
    unlink(pf);
    remove_model(&w, path);
}

Test(engine_cli, context_shift_is_the_default) {
    struct tiny_weights w;
    char *path = parallel_model(&w);
    char args[1024], *out, *err;
    snprintf(args, sizeof args,
             "run -m %s --backend cpu -t 2 -p 'ab' -c 16 -n 40 --ignore-eos --temp 0 -v", path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "context shift: n_past = 15") && strstr(err, "context shifts:"), "%s",
              err);
    cr_expect(strstr(err, "/    40 tokens"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args,
             "run -m %s --backend cpu -t 2 -p 'ab' -c 16 -n 40 --ignore-eos --temp 0 "
             "--no-context-shift",
             path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "context full (16 tokens); context shift is off"), "%s", err);
    free(out);
    free(err);
    // self-extend on run prints the seed's lines with -v
    snprintf(args, sizeof args,
             "run -m %s --backend cpu -t 2 -p 'abcdefghij' -c 48 -n 20 -gan 2 -gaw 8 --temp 0 -v",
             path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    // the prompt (14 tokens) is one batch: the first round runs at n_past 14
    cr_expect(strstr(err, "vela: shift: [     0,     14] +      0 -> [     0,     14]") &&
                  strstr(err, "vela: div:   [     0,      8] /      2 -> [     0,      4]") &&
                  strstr(err, "vela: shift: [     8,     14] +     -4 -> [     4,     10]"),
              "%s", err);
    free(out);
    free(err);
    remove_model(&w, path);
}
