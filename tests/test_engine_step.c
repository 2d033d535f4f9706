// The step API (host/engine/step.h) on the CPU backend with a tiny model
// written by the test (tests/tiny_model.h): requests submitted while others
// decode, cancelled in the middle, 64 requests with different sampling
// settings, shared prompts, stop tokens, bad input. The reference for every
// request is the same request run alone in an engine of one slot whose
// context is the per-slot context (n_ctx / n_slots): the tokens must be the
// same, exactly, greedy and seeded alike (each request samples with its own
// seeded sampler, and a sequence's logits do not depend on what else is in
// the batch on the CPU backend, which test_engine's parallel tests show too).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/step.h"
#include "tests/engine_helpers.h"

#define MAX_TOK 128
#define N_VOCAB 300

static char *model_path;

static void setup(void) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.vocab = true;
    cfg.n_vocab = N_VOCAB;
    model_path = engine_test_model(&cfg, "engstep");
}

static void teardown(void) {
    unlink(model_path);
    free(model_path);
}

TestSuite(engine_step, .init = setup, .fini = teardown);

// n_slots sequences of n_ctx_seq cells each; unrot: K cached unrotated
// (--kv-unrotated), so that requests may choose their own exact self-extend.
static struct engine *open_engine_kv(int n_ctx_seq, int n_batch, int n_slots, bool unrot) {
    const struct engine_test_cfg c = {.n_ctx = n_ctx_seq * n_slots,
                                      .n_batch = n_batch,
                                      .n_seq = n_slots,
                                      .f32_cache = true,
                                      .k_unrotated = unrot};
    return engine_test_open(model_path, &c);
}

static struct engine *open_engine(int n_ctx_seq, int n_batch, int n_slots) {
    return open_engine_kv(n_ctx_seq, n_batch, n_slots, false);
}

// What one request's callback saw.
struct req_out {
    uint64_t id;
    int32_t tok[MAX_TOK];
    int n;
    char why[24];
    int n_done;
    struct engine_req_stats st; // at DONE
    // optional: cancel itself from the callback after this many tokens (0: never)
    struct engine *e;
    int cancel_after;
};

static int collect(void *user, const struct engine_req_event *ev) {
    struct req_out *o = user;
    cr_assert_eq(o->n_done, 0, "request %llu: an event after DONE", (unsigned long long)o->id);
    cr_assert_eq(ev->id, o->id);
    if (ev->ev == ENGINE_EV_TOKEN && ev->token >= 0) {
        cr_assert_lt(o->n, MAX_TOK);
        o->tok[o->n++] = ev->token;
        if (o->cancel_after && o->n == o->cancel_after) {
            struct verr err = {0};
            cr_assert_eq(engine_cancel(o->e, o->id, &err), 0, "%s", err.msg);
        }
    } else if (ev->ev == ENGINE_EV_DONE) {
        snprintf(o->why, sizeof o->why, "%.*s", (int)ev->len, ev->text);
        o->st = *ev->stats;
        o->n_done++;
    }
    return 0;
}

static uint64_t submit(struct engine *e, const struct engine_request *r, struct req_out *o) {
    struct engine_request q = *r;
    q.cb = collect;
    q.user = o;
    struct verr err = {0};
    uint64_t id = 0;
    cr_assert_eq(engine_submit(e, &q, &id, &err), 0, "engine_submit: %s", err.msg);
    cr_assert_neq(id, 0);
    o->id = id;
    return id;
}

// The request alone on `solo` (one slot of the same per-slot context).
static void run_alone(struct engine *solo, const struct engine_request *r, struct req_out *o) {
    memset(o, 0, sizeof *o);
    submit(solo, r, o);
    engine_test_run_to_end(solo);
    cr_assert_eq(o->n_done, 1);
    cr_assert_eq(context_cells_used(solo->ctx), 0);
}

static void expect_same(const struct req_out *got, const struct req_out *alone, const char *what,
                        int i) {
    cr_expect_str_eq(got->why, alone->why, "%s %d ended on %s, alone on %s", what, i, got->why,
                     alone->why);
    cr_expect_eq(got->n, alone->n, "%s %d: %d tokens, alone %d", what, i, got->n, alone->n);
    for (int t = 0; t < got->n && t < alone->n; t++)
        if (got->tok[t] != alone->tok[t]) {
            cr_expect_fail("%s %d: token %d is %d, alone %d", what, i, t, got->tok[t],
                           alone->tok[t]);
            break;
        }
}

// A prompt of n tokens: BOS then pseudo-random ids.
static void make_prompt(int32_t *tok, int n, uint64_t seed) {
    uint64_t s = seed;
    tok[0] = 1;
    for (int t = 1; t < n; t++)
        tok[t] = 3 + (int32_t)((tiny_rand(&s) + 1) * 0.5 * (N_VOCAB - 4));
}

static struct engine_request greedy_request(const int32_t *tok, int n, int n_predict) {
    struct engine_request r;
    engine_request_default(&r);
    r.tokens = tok;
    r.n_tokens = n;
    r.sp.temp = 0;
    r.n_predict = n_predict;
    r.ignore_eos = true;
    return r;
}

// ---------------------------------------------------------------------------

Test(engine_step, submit_while_others_decode) {
    const int n_ctx_seq = 64, n_batch = 8;
    struct engine *e = open_engine(n_ctx_seq, n_batch, 3);
    int32_t pa[12], pb[20], pc[5];
    make_prompt(pa, 12, 1);
    make_prompt(pb, 20, 2);
    make_prompt(pc, 5, 3);
    struct engine_request ra = greedy_request(pa, 12, 30), rb = greedy_request(pb, 20, 25),
                          rc = greedy_request(pc, 5, 20);
    rb.sp.temp = 0.9f;
    rb.sp.seed = 77;
    rc.sp.temp = 1.2f;
    rc.sp.seed = 5;
    rc.sp.repeat_penalty = 1.2f; // penalties: its steps bring rows to the host
    struct req_out *a = calloc(3, sizeof *a), *b = a + 1, *c = a + 2;
    struct verr err = {0};
    uint64_t ida = submit(e, &ra, a);
    for (int k = 0; k < 6; k++)
        cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    cr_assert_eq(a->n, 5, "A: %d tokens after 6 steps (prompt 12 in chunks of 8)", a->n);
    // B joins the running batch: its first chunk rides with A's next token.
    uint64_t idb = submit(e, &rb, b);
    cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    struct engine_req_stats sa, sb;
    cr_assert_eq(engine_req_stats_get(e, ida, &sa), 0);
    cr_assert_eq(engine_req_stats_get(e, idb, &sb), 0);
    cr_expect_eq(sa.n_gen, 6);
    // The budget is n_batch tokens a step: A's token, then 7 of B's prompt.
    cr_expect_eq(sb.n_prompt_eval, n_batch - 1, "B's first chunk: %d tokens", sb.n_prompt_eval);
    cr_expect_eq(sb.n_gen, 0);
    cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    submit(e, &rc, c);
    engine_test_run_to_end(e);
    cr_assert_eq(context_cells_used(e->ctx), 0, "finished requests leave no cell behind");
    engine_close(e);

    struct engine *solo = open_engine(n_ctx_seq, n_batch, 1);
    struct req_out *alone = calloc(1, sizeof *alone);
    const struct engine_request *rs[3] = {&ra, &rb, &rc};
    for (int i = 0; i < 3; i++) {
        run_alone(solo, rs[i], alone);
        expect_same(&a[i], alone, "request", i);
        cr_expect_str_eq(a[i].why, "n_predict");
        cr_expect_eq(a[i].st.n_gen, rs[i]->n_predict);
        cr_expect_eq(a[i].st.n_prompt, rs[i]->n_tokens);
        cr_expect_eq(a[i].st.n_prompt_eval, rs[i]->n_tokens);
        cr_expect_geq(a[i].st.ttft_ms, 0);
        cr_expect_geq(a[i].st.tpot_ms, 0);
        cr_expect_geq(a[i].st.t_first_ms, a[i].st.t_start_ms);
        cr_expect_geq(a[i].st.t_start_ms, a[i].st.t_submit_ms);
    }
    cr_expect_eq(a[1].st.seed, 77);
    engine_close(solo);
    free(alone);
    free(a);
}

Test(engine_step, cancel_frees_cells_at_once) {
    const int n_ctx_seq = 64, n_batch = 8;
    struct engine *e = open_engine(n_ctx_seq, n_batch, 3);
    int32_t p[4][10];
    struct engine_request r[4];
    for (int i = 0; i < 4; i++) {
        make_prompt(p[i], 6 + i, 10 + i);
        r[i] = greedy_request(p[i], 6 + i, 40);
        r[i].sp.temp = 0.8f;
        r[i].sp.seed = 100 + i;
    }
    struct req_out *o = calloc(6, sizeof *o);
    struct verr err = {0};
    for (int i = 0; i < 3; i++)
        submit(e, &r[i], &o[i]);
    cr_assert_eq(engine_n_queued(e), 3, "requests wait for the next step");
    cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    cr_assert_eq(engine_n_active(e), 3);
    uint64_t id3 = submit(e, &r[3], &o[3]); // waits: three slots
    cr_assert_eq(engine_n_queued(e), 1);
    // A queued request is cancelled without ever running.
    cr_assert_eq(engine_cancel(e, id3, &err), 0, "%s", err.msg);
    cr_expect_str_eq(o[3].why, "cancelled");
    cr_expect_eq(o[3].n, 0);
    cr_assert_eq(engine_n_queued(e), 0);
    while (o[1].n < 7)
        cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    // B holds its prompt and every token but the last sampled one.
    const int b_cells = r[1].n_tokens + o[1].n - 1;
    const int used = context_cells_used(e->ctx);
    cr_assert_eq(engine_cancel(e, o[1].id, &err), 0, "%s", err.msg);
    cr_expect_str_eq(o[1].why, "cancelled", "done at once, not at the next step");
    cr_expect_eq(o[1].st.n_gen, 7);
    cr_expect_eq(context_cells_used(e->ctx), used - b_cells,
                 "cells used: %d before, %d after, B had %d", used, context_cells_used(e->ctx),
                 b_cells);
    cr_expect_eq(engine_n_active(e), 2);
    cr_expect_eq(engine_cancel(e, o[1].id, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "is not active or queued"), "%s", err.msg);
    // Its slot takes the next request; one cancels itself from its callback.
    submit(e, &r[3], &o[4]);
    o[5].e = e;
    o[5].cancel_after = 3;
    struct engine_request r5 = r[1];
    r5.sp.seed = 555;
    submit(e, &r5, &o[5]);
    engine_test_run_to_end(e);
    cr_expect_eq(context_cells_used(e->ctx), 0);
    cr_expect_str_eq(o[5].why, "cancelled");
    cr_expect_eq(o[5].n, 3, "cancelled from its callback after 3 tokens: %d", o[5].n);
    engine_close(e);

    struct engine *solo = open_engine(n_ctx_seq, n_batch, 1);
    struct req_out *alone = calloc(1, sizeof *alone);
    const int check[3] = {0, 2, 4};
    const struct engine_request *rs[3] = {&r[0], &r[2], &r[3]};
    for (int i = 0; i < 3; i++) {
        run_alone(solo, rs[i], alone);
        expect_same(&o[check[i]], alone, "request", check[i]);
    }
    // The cancelled ones gave a prefix of what they give alone.
    run_alone(solo, &r[1], alone);
    cr_expect(!memcmp(o[1].tok, alone->tok, sizeof(int32_t) * o[1].n));
    run_alone(solo, &r5, alone);
    cr_expect(!memcmp(o[5].tok, alone->tok, sizeof(int32_t) * o[5].n));
    engine_close(solo);
    free(alone);
    free(o);
}

// Request i of the 64: prompt length, sampling settings and lengths vary.
// penalties: off, every row may be picked on the backend (the sample op, its
// greedy rows included, or the argmax); on, steps with a penalized request
// bring every row to the host.
static void request_64(int i, bool penalties, int32_t *tok, struct engine_request *r) {
    int n = 1 + (i * 7) % 23;
    make_prompt(tok, n, 1000 + i);
    engine_request_default(r);
    r->tokens = tok;
    r->n_tokens = n;
    r->n_predict = 6 + (i * 5) % 17;
    r->ignore_eos = i % 3 != 0;
    r->n_keep = i % 5;
    r->sp.seed = 4000 + 13 * i;
    switch (i % 6) {
    case 0: // greedy
        r->sp.temp = 0;
        break;
    case 1: // greedy with a repeat penalty: rows come to the host
        r->sp.temp = 0;
        r->sp.repeat_penalty = penalties ? 1.3f : 1.0f;
        break;
    case 2:
        r->sp.temp = 0.7f;
        r->sp.top_k = 10;
        break;
    case 3:
        r->sp.temp = 1.5f;
        r->sp.top_k = 0;
        r->sp.top_p = 0.9f;
        r->sp.min_p = 0.02f;
        break;
    case 4:
        r->sp.temp = 1.0f;
        r->sp.top_k = 3;
        r->sp.frequency_penalty = penalties ? 0.5f : 0.0f;
        break;
    default:
        r->sp.temp = 2.0f;
        r->sp.top_k = 40;
        r->sp.seed = SAMPLER_SEED_RANDOM; // the seed it picked replays it alone
        break;
    }
    if (i % 16 == 7)
        r->n_predict = 60; // past the 40 cells of its slot: context shifts
    if (i % 16 == 9) {
        r->n_predict = 60;
        r->ctx_shift = false; // ends on "context full"
    }
    if (i % 16 == 11) { // self-extend: positions regrouped, ends when its cells are full
        r->n_predict = 60;
        r->ga_n = 2;
        r->ga_w = 8;
    }
}

static void sixty_four(bool penalties) {
    const int n_ctx_seq = 40, n_batch = 8, n_req = 64;
    struct engine *e = open_engine(n_ctx_seq, n_batch, 8);
    int32_t(*tok)[32] = calloc(n_req, sizeof *tok);
    struct engine_request *r = calloc(n_req, sizeof *r);
    struct req_out *o = calloc(n_req, sizeof *o);
    struct verr err = {0};
    // Half now; the rest one per step while the others decode.
    for (int i = 0; i < n_req; i++)
        request_64(i, penalties, tok[i], &r[i]);
    for (int i = 0; i < n_req / 2; i++)
        submit(e, &r[i], &o[i]);
    int rc, next = n_req / 2, steps = 0;
    while ((rc = engine_step(e, &err)) == 1 || next < n_req) {
        cr_assert_geq(rc, 0, "%s", err.msg);
        if (next < n_req)
            submit(e, &r[next], &o[next]), next++;
        steps++;
    }
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(context_cells_used(e->ctx), 0);
    const struct engine_stats *st = engine_sched_stats(e);
    cr_expect_eq(st->n_seq, n_req);
    cr_log_info("64 requests%s in %d steps: %d prompt + %d generated tokens (%d on the "
                "backend), %d context shifts, %d batch splits",
                penalties ? " (some with penalties)" : "", steps, st->n_prompt, st->n_gen,
                st->n_gen_backend, st->n_ctx_shifts, st->n_batch_splits);
    cr_expect_gt(st->n_ctx_shifts, 0);
    if (!penalties)
        cr_expect_gt(st->n_gen_backend, st->n_gen / 2, "%d of %d tokens on the backend",
                     st->n_gen_backend, st->n_gen);
    engine_close(e);

    struct engine *solo = open_engine(n_ctx_seq, n_batch, 1);
    struct req_out *alone = calloc(1, sizeof *alone);
    int n_greedy = 0, n_full = 0;
    for (int i = 0; i < n_req; i++) {
        cr_assert_eq(o[i].n_done, 1, "request %d never ended", i);
        struct engine_request ri = r[i];
        if (ri.sp.seed == SAMPLER_SEED_RANDOM)
            ri.sp.seed = o[i].st.seed;
        run_alone(solo, &ri, alone);
        expect_same(&o[i], alone, "request", i);
        n_greedy += r[i].sp.temp <= 0;
        n_full += !strcmp(o[i].why, "context full");
    }
    cr_expect_gt(n_full, 0);
    cr_log_info("64 requests (%d greedy) each equal to the request alone", n_greedy);
    engine_close(solo);
    free(alone);
    free(o);
    free(r);
    free(tok);
}

Test(engine_step, sixty_four_requests_match_each_alone) {
    sixty_four(false);
}

Test(engine_step, sixty_four_requests_with_penalties_match_each_alone) {
    sixty_four(true);
}

Test(engine_step, shared_prompt_and_stop_tokens) {
    const int n_ctx_seq = 48, n_batch = 8;
    struct engine *solo = open_engine(n_ctx_seq, n_batch, 1);
    int32_t p[14];
    make_prompt(p, 14, 42);
    struct engine_request r = greedy_request(p, 14, 20);
    struct req_out *o = calloc(4, sizeof *o);
    run_alone(solo, &r, &o[3]);
    // Stop on the fourth token: reported, then the request ends.
    struct engine_request rs = r;
    int32_t stop = o[3].tok[3];
    int first = 0;
    while (o[3].tok[first] != stop)
        first++;
    rs.stop_tokens = &stop;
    rs.n_stop_tokens = 1;
    struct engine *e = open_engine(n_ctx_seq, n_batch, 3);
    struct engine_request rt = r;
    rt.sp.temp = 0.8f;
    rt.sp.seed = 9;
    submit(e, &r, &o[0]);
    submit(e, &rs, &o[1]);
    submit(e, &rt, &o[2]);
    engine_test_run_to_end(e);
    expect_same(&o[0], &o[3], "request", 0);
    cr_expect_eq(o[0].st.n_prompt_eval, 14);
    // The same prompt, started in the same step: read once.
    cr_expect_eq(o[1].st.n_prompt_eval, 0, "shared: %d", o[1].st.n_prompt_eval);
    cr_expect_eq(o[2].st.n_prompt_eval, 0, "shared: %d", o[2].st.n_prompt_eval);
    cr_expect_eq(engine_sched_stats(e)->n_prompt, 14);
    cr_expect_str_eq(o[1].why, "stop token");
    cr_expect_eq(o[1].n, first + 1);
    cr_expect(!memcmp(o[1].tok, o[3].tok, sizeof(int32_t) * o[1].n));
    engine_close(e);
    struct req_out *alone = calloc(1, sizeof *alone);
    run_alone(solo, &rt, alone);
    expect_same(&o[2], alone, "request", 2);
    engine_close(solo);
    free(alone);
    free(o);
}

// Requests with their own exact self-extend (engine_request se_g / se_w) on
// a context caching K unrotated, decoded in the same steps: each gives what
// it gives alone. The same prompt with other values is read again (its
// logits differ), with the same values it is shared; kept cells serve a
// request with other values only below the smaller window.
Test(engine_step, requests_with_their_own_self_extend_match_each_alone) {
    const int n_ctx_seq = 96, n_batch = 8;
    struct engine *solo = open_engine_kv(n_ctx_seq, n_batch, 1, true);
    int32_t p[2][40];
    make_prompt(p[0], 40, 71);
    make_prompt(p[1], 40, 72);
    struct engine_request r[4];
    const int se[4][2] = {{2, 16}, {4, 8}, {0, 0}, {2, 16}};
    for (int i = 0; i < 4; i++) {
        r[i] = greedy_request(p[i == 2], 40, 24);
        r[i].se_g = se[i][0];
        r[i].se_w = se[i][1];
    }
    struct req_out *o = calloc(8, sizeof *o);
    for (int i = 0; i < 3; i++)
        run_alone(solo, &r[i], &o[4 + i]);
    cr_expect_neq(memcmp(o[4].tok, o[5].tok, sizeof o[4].tok), 0,
                  "(2, 16) and (4, 8) should differ on a 40-token prompt");
    struct engine *e = open_engine_kv(n_ctx_seq, n_batch, 4, true);
    for (int i = 0; i < 4; i++)
        submit(e, &r[i], &o[i]);
    engine_test_run_to_end(e);
    for (int i = 0; i < 4; i++)
        expect_same(&o[i], &o[4 + (i == 3 ? 0 : i)], "request", i);
    cr_expect_eq(o[1].st.n_prompt_eval, 40, "another G/W reads the prompt itself");
    cr_expect_eq(o[3].st.n_prompt_eval, 0, "the same G/W shares it");
    engine_close(e);

    // Prompt cache: kept cells of the (2, 16) request, then the same prompt
    // with (4, 8): positions 0..7 are reused; then without self-extend after
    // the (4, 8) request: 0..7 again.
    struct engine_request k[3] = {r[0], r[1], r[0]};
    k[2].se_g = 1;
    for (int i = 0; i < 3; i++)
        k[i].keep_cells = k[i].reuse_cells = true;
    struct req_out *ko = calloc(3, sizeof *ko);
    for (int i = 0; i < 3; i++) {
        submit(solo, &k[i], &ko[i]);
        engine_test_run_to_end(solo);
    }
    cr_expect_eq(ko[1].st.n_prompt_reused, 8, "reused %d", ko[1].st.n_prompt_reused);
    expect_same(&ko[1], &o[5], "reusing request", 1);
    cr_expect_eq(ko[2].st.n_prompt_reused, 8, "(4, 8) kept: %d", ko[2].st.n_prompt_reused);
    engine_close(solo);
    free(ko);
    free(o);
}

// ---------------------------------------------------------------------------
// Bad input: a clear error, nothing changed

struct state_snap {
    int used, head, n_active, n_queued;
    int32_t pos[64];
};

static struct state_snap snap(const struct engine *e) {
    const struct kv_cache *kv = &context_stage(e->ctx, 0)->kv;
    struct state_snap s = {.used = kv->used,
                           .head = kv->head,
                           .n_active = engine_n_active(e),
                           .n_queued = engine_n_queued(e)};
    for (int c = 0; c < 64 && c < kv->cfg.n_ctx; c++)
        s.pos[c] = kv->pos[c];
    return s;
}

static void refused(struct engine *e, const struct engine_request *r, int code, const char *msg) {
    struct state_snap before = snap(e);
    struct verr err = {0};
    uint64_t id = 99;
    cr_expect_eq(engine_submit(e, r, &id, &err), code, "%s: %s", msg, err.msg);
    cr_expect(strstr(err.msg, msg), "expected \"%s\" in \"%s\"", msg, err.msg);
    cr_expect_eq(id, 0);
    struct state_snap now = snap(e);
    cr_expect(!memcmp(&now, &before, sizeof now), "refusing \"%s\" changed the engine", msg);
}

Test(engine_step, bad_input_is_refused_and_changes_nothing) {
    struct engine *e = open_engine(32, 8, 2); // 32 cells per slot: prompts up to 28 tokens
    int32_t tok[40];
    make_prompt(tok, 40, 5);
    struct engine_request ok = greedy_request(tok, 10, 30);
    struct req_out *o = calloc(1, sizeof *o);
    submit(e, &ok, o);
    struct verr err = {0};
    for (int k = 0; k < 4; k++)
        cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    cr_assert_gt(context_cells_used(e->ctx), 0);

    struct engine_request r = ok;
    r.n_tokens = 0;
    refused(e, &r, VERR_RANGE, "the prompt is empty");
    r = ok;
    r.tokens = NULL;
    refused(e, &r, VERR_RANGE, "the prompt is empty");
    r = ok;
    r.n_tokens = 29;
    refused(e, &r, VERR_RANGE, "prompt is too long (29 tokens, max 28)");
    int32_t bad[3] = {1, N_VOCAB, 7};
    r = ok;
    r.tokens = bad;
    r.n_tokens = 3;
    refused(e, &r, VERR_RANGE, "token id 300 is out of range (n_vocab 300)");
    bad[1] = -1;
    refused(e, &r, VERR_RANGE, "token id -1 is out of range");
    r = ok;
    r.n_predict = -3;
    refused(e, &r, VERR_RANGE, "n_predict -3");
    r = ok;
    r.ga_n = 3;
    r.ga_w = 8;
    refused(e, &r, VERR_RANGE, "multiple");
    r = ok;
    int32_t stop = 5000;
    r.stop_tokens = &stop;
    r.n_stop_tokens = 1;
    refused(e, &r, VERR_RANGE, "stop token id 5000 is out of range");
    r.n_stop_tokens = ENGINE_MAX_STOP_TOKENS + 1;
    refused(e, &r, VERR_RANGE, "stop tokens: 0 ..");
    r = ok;
    r.sp.temp = NAN;
    refused(e, &r, VERR_RANGE, "not a finite number");
    r = ok;
    r.se_g = 4;
    r.se_w = 8;
    refused(e, &r, VERR_RANGE, "needs a context that caches K unrotated");
    r.se_g = -1;
    refused(e, &r, VERR_RANGE, "group size G = -1");
    cr_expect_eq(engine_cancel(e, 12345, &err), VERR_NOTFOUND);
    cr_expect_eq(engine_cancel(e, 0, &err), VERR_NOTFOUND);
    struct engine_sched_config c = {.n_slots = 1};
    cr_expect_eq(engine_sched_configure(e, &c, &err), VERR_RANGE, "configure while busy");
    cr_expect(strstr(err.msg, "only when it is idle"), "%s", err.msg);

    // The request that was running is untouched by all that.
    engine_test_run_to_end(e);
    engine_close(e);
    struct engine *solo = open_engine(32, 8, 1);
    struct req_out *alone = calloc(1, sizeof *alone);
    run_alone(solo, &ok, alone);
    expect_same(o, alone, "request", 0);
    engine_close(solo);

    // A full queue.
    e = open_engine(32, 8, 1);
    c = (struct engine_sched_config){.n_slots = 1, .n_queue_max = 2};
    cr_assert_eq(engine_sched_configure(e, &c, &err), 0, "%s", err.msg);
    c.n_slots = 2;
    cr_expect_eq(engine_sched_configure(e, &c, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "2 slots: the context was opened for 1 sequences"), "%s", err.msg);
    struct req_out *q = calloc(3, sizeof *q);
    submit(e, &ok, &q[0]);
    submit(e, &ok, &q[1]);
    r = ok;
    refused(e, &r, VERR_FULL, "the queue is full (2 requests waiting)");
    cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg); // one starts: room for one more
    submit(e, &ok, &q[2]);
    engine_test_run_to_end(e);
    for (int i = 0; i < 3; i++)
        expect_same(&q[i], alone, "queued request", i);
    engine_close(e);
    free(q);
    free(alone);
    free(o);
}

// engine_eval and the step API on one engine: eval is refused while requests
// run; the cells eval leaves do not disturb the next request.
Test(engine_step, eval_and_requests_take_turns) {
    struct engine *e = open_engine(32, 2, 2); // eval wants n_batch logits rows: 2
    int32_t tok[20];
    make_prompt(tok, 20, 8);
    struct engine_request r = greedy_request(tok, 9, 12);
    struct req_out *o = calloc(3, sizeof *o);
    struct verr err = {0};
    submit(e, &r, &o[0]);
    cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    cr_expect_eq(engine_eval(e, tok, 20, NULL, NULL, NULL, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "the engine is serving requests"), "%s", err.msg);
    struct engine_gen_params g;
    engine_gen_params_default(&g);
    struct engine_stats st;
    cr_expect_eq(engine_generate(e, tok, 3, &g, NULL, NULL, &st, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "the engine is serving requests"), "%s", err.msg);
    engine_test_run_to_end(e);
    // 20 cells of sequence 0 left by eval, then two requests at once.
    cr_assert_eq(engine_eval(e, tok, 20, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(context_cells_used(e->ctx), 20);
    submit(e, &r, &o[1]);
    struct engine_request r2 = greedy_request(tok + 3, 12, 16);
    submit(e, &r2, &o[2]);
    engine_test_run_to_end(e);
    cr_expect_eq(context_cells_used(e->ctx), 0);
    expect_same(&o[1], &o[0], "request", 1);
    struct engine *solo = open_engine(32, 2, 1);
    struct req_out *alone = calloc(1, sizeof *alone);
    run_alone(solo, &r2, alone);
    expect_same(&o[2], alone, "request", 2);
    // A step budget must leave room for prompts.
    struct engine_sched_config c = {.n_slots = 2, .n_step_tokens = 2};
    cr_expect_eq(engine_sched_configure(e, &c, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "step budget 2"), "%s", err.msg);
    c.n_step_tokens = 3;
    cr_expect_eq(engine_sched_configure(e, &c, &err), 0, "%s", err.msg);
    engine_close(solo);
    engine_close(e);
    free(alone);
    free(o);
}

// A request that takes every row (what engine_eval runs) beside generating
// ones: its rows are those of engine_eval on the tokens alone.
struct rows_out {
    float *rows; // [n][N_VOCAB]
    int n_seen, n_calls, stop_after;
};

static int keep_rows(void *user, uint64_t id, int first, int n, const float *logits) {
    struct rows_out *r = user;
    cr_assert_eq(first, r->n_seen, "rows arrive in order");
    memcpy(r->rows + (size_t)first * N_VOCAB, logits, sizeof(float) * n * N_VOCAB);
    r->n_seen += n;
    r->n_calls++;
    return r->stop_after && r->n_calls == r->stop_after;
}

static int eval_rows_cb(void *user, int first, int n, const float *logits) {
    memcpy((float *)user + (size_t)first * N_VOCAB, logits, sizeof(float) * n * N_VOCAB);
    return 0;
}

Test(engine_step, every_row_request_matches_eval) {
    const int n = 30, n_batch = 8;
    int32_t tok[30], pg[6];
    make_prompt(tok, n, 77);
    make_prompt(pg, 6, 78);
    float *ref = calloc((size_t)n * N_VOCAB, sizeof(float));
    struct verr err = {0};
    // Every row of a batch may be wanted: n_batch logits rows. The reference
    // is engine_eval on 32 cells; then 3 slots of 32 cells.
    struct args_model am;
    args_model_default(&am);
    am.model_path = model_path;
    am.backend = LOAD_BACKEND_CPU;
    am.n_threads = 2;
    am.n_batch = n_batch;
    am.type_k = am.type_v = GGML_TYPE_F32;
    struct engine_config op;
    am.n_ctx = 32;
    args_engine_config(&am, &op);
    op.ctx.n_outputs_max = n_batch;
    struct engine *e1 = NULL, *e = NULL;
    cr_assert_eq(engine_open(&e1, &op, &err), 0, "%s", err.msg);
    cr_assert_eq(engine_eval(e1, tok, n, eval_rows_cb, ref, NULL, &err), 0, "%s", err.msg);
    engine_close(e1);
    am.n_ctx = 96;
    args_engine_config(&am, &op);
    op.ctx.n_seq_max = 3;
    op.ctx.n_outputs_max = n_batch;
    cr_assert_eq(engine_open(&e, &op, &err), 0, "%s", err.msg);

    struct rows_out ro = {.rows = calloc((size_t)n * N_VOCAB, sizeof(float))};
    struct req_out *o = calloc(3, sizeof *o);
    struct engine_request g = greedy_request(pg, 6, 25);
    submit(e, &g, &o[0]);
    for (int k = 0; k < 3; k++)
        cr_assert_eq(engine_step(e, &err), 1, "%s", err.msg);
    struct engine_request r = greedy_request(tok, n, 0);
    r.on_rows = keep_rows;
    r.user = &ro;
    uint64_t id;
    cr_assert_eq(engine_submit(e, &r, &id, &err), 0, "%s", err.msg);
    struct engine_request g2 = g;
    g2.sp.temp = 0.9f;
    g2.sp.seed = 3;
    submit(e, &g2, &o[1]);
    engine_test_run_to_end(e);
    cr_assert_eq(ro.n_seen, n);
    double worst = 0, mx = 0;
    for (size_t i = 0; i < (size_t)n * N_VOCAB; i++) {
        worst = fmax(worst, fabs((double)ro.rows[i] - ref[i]));
        mx = fmax(mx, fabs((double)ref[i]));
    }
    // Same tokens at the same positions, F32 cache: only the order of sums
    // over cells may differ (other requests' cells sit between). Worst seen: 0.
    cr_expect_leq(worst / mx, 1e-6, "relative logit error %.3g", worst / mx);
    cr_log_info("every-row request beside 2 generating ones: %d rows in %d calls, worst relative "
                "error against engine_eval %.3g",
                ro.n_seen, ro.n_calls, worst / mx);
    cr_expect_eq(context_cells_used(e->ctx), 0);
    // A non-zero return ends it ("stopped") after the step.
    struct rows_out rs = {.rows = ro.rows, .stop_after = 2};
    r.user = &rs;
    cr_assert_eq(engine_submit(e, &r, &id, &err), 0, "%s", err.msg);
    engine_test_run_to_end(e);
    cr_expect_eq(rs.n_calls, 2);
    r.n_predict = 5;
    cr_expect_eq(engine_submit(e, &r, &id, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "generates nothing"), "%s", err.msg);
    engine_close(e);
    free(ro.rows);
    free(ref);
    free(o);
}

// A conversation's next turn (reuse_cells): the slot keeps the previous
// request's cells (keep_cells) and the new prompt, which repeats that
// request's prompt and generated tokens, decodes only what is new. Its
// tokens equal the same prompt decoded from an empty cache (greedy; the CPU
// backend computes a row the same way whatever the batch).
Test(engine_step, reuse_cells_decodes_only_the_new_part) {
    struct engine *e = open_engine(128, 16, 1);
    struct engine_request r;
    engine_request_default(&r);
    r.sp.temp = 0;
    int32_t p1[20];
    for (int t = 0; t < 20; t++)
        p1[t] = 1 + (t * 37) % (N_VOCAB - 1);
    r.tokens = p1;
    r.n_tokens = 20;
    r.n_predict = 6;
    r.keep_cells = true;
    struct req_out a = {0};
    submit(e, &r, &a);
    engine_test_run_to_end(e);
    cr_assert_eq(a.n, 6);
    // The next turn: the first turn's prompt, its answer but the last token
    // (sampled, never decoded), then 5 new tokens.
    int32_t p2[40];
    int n2 = 0;
    for (int t = 0; t < 20; t++)
        p2[n2++] = p1[t];
    for (int t = 0; t < 5; t++)
        p2[n2++] = a.tok[t];
    for (int t = 0; t < 5; t++)
        p2[n2++] = 2 + (t * 11) % (N_VOCAB - 2);
    r.tokens = p2;
    r.n_tokens = n2;
    r.reuse_cells = true;
    struct req_out b = {0};
    submit(e, &r, &b);
    engine_test_run_to_end(e);
    cr_expect_eq(b.st.n_prompt_eval, 5, "only the new tokens are decoded (%d were)",
                 b.st.n_prompt_eval);
    struct engine *fresh = open_engine(128, 16, 1);
    r.keep_cells = r.reuse_cells = false;
    struct req_out c = {0};
    submit(fresh, &r, &c);
    engine_test_run_to_end(fresh);
    cr_expect_eq(c.st.n_prompt_eval, n2);
    cr_assert_eq(b.n, c.n);
    for (int t = 0; t < c.n; t++)
        cr_expect_eq(b.tok[t], c.tok[t], "token %d", t);
    // A prompt that differs from the first token on reuses nothing.
    p2[0] = p2[0] == 5 ? 6 : 5;
    r.keep_cells = r.reuse_cells = true;
    struct req_out d = {0};
    submit(e, &r, &d);
    engine_test_run_to_end(e);
    cr_expect_eq(d.st.n_prompt_eval, n2);
    engine_close(fresh);
    engine_close(e);
}

// A prompt cache over several slots (what vela serve does): each request
// keeps its cells; a later one takes the free slot whose kept tokens share
// the longest prefix with its prompt and decodes only the rest, with the
// tokens it gives alone from an empty cache. A request that starts while
// the engine is otherwise idle leaves the other slots' kept cells alone; a
// request sharing its prompt's cells with another (same step) keeps the
// record of them too; a request without reuse_cells takes a slot that keeps
// nothing.
Test(engine_step, prompt_cache_picks_the_slot_with_the_longest_prefix) {
    const int n_ctx_seq = 96, n_batch = 16;
    struct engine *e = open_engine(n_ctx_seq, n_batch, 3);
    struct engine *solo = open_engine(n_ctx_seq, n_batch, 1);
    struct engine_sched_config sc = {.n_slots = 3, .slot_similarity = 0.5f};
    struct verr err = {0};
    cr_assert_eq(engine_sched_configure(e, &sc, &err), 0, "%s", err.msg);
    int32_t p[3][40];
    for (int k = 0; k < 3; k++)
        make_prompt(p[k], 40, 100 + k);
    struct req_out first[3] = {{0}};
    for (int k = 0; k < 3; k++) { // one at a time: each starts alone
        struct engine_request r = greedy_request(p[k], 30, 4);
        r.keep_cells = r.reuse_cells = true;
        submit(e, &r, &first[k]);
        engine_test_run_to_end(e);
        cr_expect_eq(first[k].st.n_prompt_reused, 0);
    }
    cr_expect_eq(context_cells_used(e->ctx), 3 * (30 + 3),
                 "every slot keeps its prompt and answer");
    // Prompt 1 (its first 30 tokens and 10 more) goes to prompt 1's slot.
    for (int round = 0; round < 2; round++) {
        const int k = round ? 0 : 1;
        struct engine_request r = greedy_request(p[k], 40, 5);
        r.keep_cells = r.reuse_cells = true;
        struct req_out got = {0}, alone;
        submit(e, &r, &got);
        engine_test_run_to_end(e);
        cr_expect_eq(got.st.n_prompt_reused, 30, "prompt %d: %d tokens reused", k,
                     got.st.n_prompt_reused);
        cr_expect_eq(got.st.n_prompt_eval, 10);
        r.keep_cells = r.reuse_cells = false;
        run_alone(solo, &r, &alone);
        expect_same(&got, &alone, "cached prompt", k);
    }
    // The same prompt twice in one step: the first reuses its slot's cells,
    // the second shares them (another slot) and keeps their record: a third
    // request with that prompt finds it in either.
    struct req_out a = {0}, b = {0}, c = {0}, alone;
    struct engine_request r = greedy_request(p[2], 36, 3);
    r.keep_cells = r.reuse_cells = true;
    submit(e, &r, &a);
    submit(e, &r, &b);
    engine_test_run_to_end(e);
    cr_expect_eq(a.st.n_prompt_reused, 30);
    cr_expect_eq(b.st.n_prompt_eval + b.st.n_prompt_reused, 0,
                 "the second copy shares the first's cells (eval %d, reused %d)",
                 b.st.n_prompt_eval, b.st.n_prompt_reused);
    r.keep_cells = r.reuse_cells = false;
    run_alone(solo, &r, &alone);
    expect_same(&a, &alone, "first copy", 0);
    expect_same(&b, &alone, "second copy", 1);
    // No reuse asked: it takes a slot and drops that slot's cells only.
    struct engine_request cold = greedy_request(p[0], 12, 2);
    submit(e, &cold, &c);
    engine_test_run_to_end(e);
    cr_expect_eq(c.st.n_prompt_reused, 0);
    cr_expect_eq(c.st.n_prompt_eval, 12);
    struct req_out d = {0};
    r.keep_cells = r.reuse_cells = true;
    submit(e, &r, &d);
    engine_test_run_to_end(e);
    cr_expect_eq(d.st.n_prompt_reused, 35, "still cached after a cold request (%d reused)",
                 d.st.n_prompt_reused);
    expect_same(&d, &alone, "after a cold request", 0);
    engine_close(solo);
    engine_close(e);
}

// logit_bias (sampler_params.bias): a greedy request that bans its own first
// token never gets it, and its rows come to the host (the backend's argmax
// and sample ops have no bias); a greedy request decoded beside it in the
// same steps keeps its argmax on the backend: what one request gets does not
// depend on another's sampler. Both give the tokens they give alone.
Test(engine_step, logit_bias_is_one_requests_own) {
    const int n_ctx_seq = 64, n_batch = 8, n_gen = 16;
    int32_t pa[10], pb[10];
    make_prompt(pa, 10, 4);
    make_prompt(pb, 10, 5);
    struct engine_request ra = greedy_request(pa, 10, n_gen), rb = greedy_request(pb, 10, n_gen);
    struct engine *solo = open_engine(n_ctx_seq, n_batch, 1);
    struct req_out *o = calloc(5, sizeof *o);
    submit(solo, &rb, &o[0]);
    engine_test_run_to_end(solo);
    cr_assert_eq(o[0].n, n_gen);
    struct sampler_bias ban = {o[0].tok[0], -INFINITY};
    rb.sp.bias = &ban;
    rb.sp.n_bias = 1;
    submit(solo, &rb, &o[1]); // B banning its own first token
    engine_test_run_to_end(solo);
    submit(solo, &ra, &o[2]); // A, no bias
    engine_test_run_to_end(solo);
    engine_close(solo);
    cr_assert_eq(o[1].n, n_gen);
    for (int i = 0; i < n_gen; i++)
        cr_expect_neq(o[1].tok[i], ban.token, "token %d is the banned one", i);
    cr_expect_eq(o[1].st.n_gen_backend, 0, "a biased request's rows come to the host");
    cr_expect_eq(o[2].st.n_gen_backend, o[2].st.n_gen, "greedy: the backend's argmax");

    struct engine *e = open_engine(n_ctx_seq, n_batch, 2);
    struct req_out *a = &o[3], *b = &o[4];
    submit(e, &ra, a);
    submit(e, &rb, b);
    engine_test_run_to_end(e);
    engine_close(e);
    cr_assert_eq(a->n, n_gen);
    cr_assert_eq(b->n, n_gen);
    cr_expect_eq(memcmp(a->tok, o[2].tok, sizeof(int32_t) * n_gen), 0, "A as alone");
    cr_expect_eq(memcmp(b->tok, o[1].tok, sizeof(int32_t) * n_gen), 0, "B as alone");
    cr_expect_eq(a->st.n_gen_backend, n_gen, "A keeps the backend's argmax beside B's host rows");
    cr_expect_eq(b->st.n_gen_backend, 0);
    free(o);
}
