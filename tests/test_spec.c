// Speculative decoding in the step API (host/engine/spec.h): the n-gram
// drafter on hand-written histories, bad values refused, and on the real
// SmolLM2-135M-Instruct Q4_1 the output of speculating requests compared
// token for token with the same requests decoded without drafts: greedy,
// seeded sampling (the sampler draws the same values in the same order),
// one slot and several with speculating and plain requests mixed, and a
// context small enough to shift. Each comparison also asserts that drafts
// were verified and some kept, so it cannot pass without speculating. The
// CPU backend computes a row the same way whatever the batch
// (test_batch_invariance), so equality is exact.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/draft.h"
#include "host/engine/step.h"
#include "tests/engine_helpers.h"
#include "tests/grammar_helpers.h"
#include "tools/mkmodel/ftype.h"
#include "tools/quantize.h"

#define MAX_TOK 512

// ---------------------------------------------------------------------------
// The n-gram drafter

Test(spec, ngram_latest_occurrence_longest_suffix) {
    int32_t out[8];
    // 1 2 3 9 | 1 2 3 7 8 | 1 2 3: the last 3-gram 1 2 3 was last seen at
    // index 4, followed by 7 8 1 2 3 (capped at 4).
    const int32_t a[] = {1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3};
    cr_assert_eq(spec_ngram_draft(a, 12, 3, out, 4), 4);
    cr_assert(out[0] == 7 && out[1] == 8 && out[2] == 1 && out[3] == 2);
    // No 3-gram match for 5 2 3, but the 2-gram 2 3 at index 5: 7 8 1.
    const int32_t b[] = {1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 5, 2, 3};
    cr_assert_eq(spec_ngram_draft(b, 13, 3, out, 3), 3);
    cr_assert(out[0] == 7 && out[1] == 8 && out[2] == 1);
    // The continuation stops at the end of the history: 4 4 4 matches at
    // index 1 (the latest earlier start), followed by one token.
    const int32_t c[] = {4, 4, 4, 4, 4};
    cr_assert_eq(spec_ngram_draft(c, 5, 3, out, 8), 1);
    cr_assert_eq(out[0], 4);
    // Nothing repeats: no draft; single-token matches are not used.
    const int32_t d[] = {1, 2, 3, 4, 1};
    cr_assert_eq(spec_ngram_draft(d, 5, 3, out, 8), 0);
    cr_assert_eq(spec_ngram_draft(d, 1, 3, out, 8), 0);
}

Test(spec, bad_values_refused) {
    struct engine_spec sp;
    struct verr err = {0};
    engine_spec_default(&sp);
    cr_assert_eq(engine_spec_check(&sp, 512, &err), 0); // none passes
    sp.type = ENGINE_SPEC_NGRAM;
    cr_assert_eq(engine_spec_check(&sp, 512, &err), 0, "%s", err.msg);
    sp.n_max = 0;
    cr_assert_eq(engine_spec_check(&sp, 512, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "draft max 0"), "%s", err.msg);
    sp.n_max = 16;
    cr_assert_eq(engine_spec_check(&sp, 16, &err), VERR_RANGE); // not below the batch
    sp.n_min = 17;
    cr_assert_eq(engine_spec_check(&sp, 512, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "draft min 17"), "%s", err.msg);
    sp.n_min = 0;
    sp.p_min = 1.5f;
    cr_assert_eq(engine_spec_check(&sp, 512, &err), VERR_RANGE);
    sp.p_min = 0.5f;
    sp.ngram_n = 1;
    cr_assert_eq(engine_spec_check(&sp, 512, &err), VERR_RANGE);
    cr_assert_eq(engine_spec_type_parse("ngram"), ENGINE_SPEC_NGRAM);
    cr_assert_eq(engine_spec_type_parse("none"), ENGINE_SPEC_NONE);
    cr_assert_eq(engine_spec_type_parse("ngramm"), -1);
}

// ---------------------------------------------------------------------------
// SmolLM2: with drafts = without

static char model[1200];
// The target and draft model files of the comparisons.
static const char *target, *draft;

static void need_model(void) {
    if (!gh_smollm2_path(model, sizeof model))
        cr_skip_test("%s not in the model cache (bash tools/model_cache.sh fetches it)",
                     TOOLS_DEFAULT_MODEL_FILE);
    target = model;
}

static const char *const PROMPTS[] = {
    // Repeated text: the continuation repeats it, the n-gram drafts hold.
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    // Code whose next lines echo the earlier ones.
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    // A list to go on.
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
    // Free text, few repeats.
    "Once upon a time, in a small village by the sea, there lived",
};
#define N_PROMPTS (int)(sizeof PROMPTS / sizeof *PROMPTS)

struct out {
    int32_t tok[MAX_TOK];
    int n;
    char why[24];
    struct engine_req_stats st;
};

static int collect(void *user, const struct engine_req_event *ev) {
    struct out *o = user;
    if (ev->ev == ENGINE_EV_TOKEN && ev->token >= 0) {
        cr_assert_lt(o->n, MAX_TOK);
        o->tok[o->n++] = ev->token;
    } else if (ev->ev == ENGINE_EV_DONE) {
        snprintf(o->why, sizeof o->why, "%.*s", (int)ev->len, ev->text);
        o->st = *ev->stats;
    }
    return 0;
}

struct job {
    int prompt;
    enum engine_spec_type spec;
    float temp; // 0: greedy
    uint32_t seed;
};

// Runs the jobs together in an engine of n_slots slots of n_ctx_seq cells,
// n_predict tokens each (ignore_eos), into outs.
static void run_jobs(int n_slots, int n_ctx_seq, int n_predict, const struct job *jobs, int n_jobs,
                     struct out *outs) {
    const struct engine_test_cfg tc = {.n_ctx = n_slots * n_ctx_seq,
                                       .n_batch = 64,
                                       .n_seq = n_slots,
                                       .n_outputs = 64,
                                       .n_threads = 2};
    struct engine *e = engine_test_open(target, &tc);
    struct verr err = {0};
    bool need_draft = false;
    for (int j = 0; j < n_jobs; j++)
        need_draft |= jobs[j].spec == ENGINE_SPEC_DRAFT;
    if (need_draft) {
        const struct engine_test_cfg dc = {.n_ctx = n_slots * 2 * (ENGINE_SPEC_MAX + 1),
                                           .n_batch = 64,
                                           .n_seq = n_slots,
                                           .n_threads = 2};
        struct engine *d = engine_test_open(draft, &dc);
        cr_assert_eq(engine_draft_attach(e, d, &err), 0, "%s", err.msg);
    }
    struct engine_sched_config sc = {.n_slots = n_slots, .n_queue_max = n_jobs};
    cr_assert_eq(engine_sched_configure(e, &sc, &err), 0, "%s", err.msg);
    int32_t *toks[N_PROMPTS];
    int n_toks[N_PROMPTS];
    for (int p = 0; p < N_PROMPTS; p++)
        cr_assert_eq(tokenizer_encode_alloc(e->tok, PROMPTS[p], strlen(PROMPTS[p]), true, false,
                                            &toks[p], &n_toks[p], &err),
                     0, "%s", err.msg);
    for (int j = 0; j < n_jobs; j++) {
        struct engine_request r;
        engine_request_default(&r);
        r.tokens = toks[jobs[j].prompt];
        r.n_tokens = n_toks[jobs[j].prompt];
        r.n_predict = n_predict;
        r.ignore_eos = true;
        r.sp.temp = jobs[j].temp;
        r.sp.seed = jobs[j].seed;
        r.spec.type = jobs[j].spec;
        r.spec.n_max = 8;
        r.spec.p_min = 0.5f;
        memset(&outs[j], 0, sizeof outs[j]);
        r.cb = collect;
        r.user = &outs[j];
        cr_assert_eq(engine_submit(e, &r, NULL, &err), 0, "%s", err.msg);
    }
    engine_test_run_to_end(e);
    for (int p = 0; p < N_PROMPTS; p++)
        free(toks[p]);
    engine_close(e);
}

// got must be want, token for token, and end for the same reason.
static void expect_same(const struct out *want, const struct out *got, const char *what, int j) {
    cr_assert_eq(got->n, want->n, "%s job %d: %d tokens, %d without drafts", what, j, got->n,
                 want->n);
    for (int i = 0; i < want->n; i++)
        cr_assert_eq(got->tok[i], want->tok[i],
                     "%s job %d: token %d is %d, %d without drafts (%d drafted, %d kept)", what, j,
                     i, got->tok[i], want->tok[i], got->st.n_drafted, got->st.n_accepted);
    cr_assert_str_eq(got->why, want->why, "%s job %d", what, j);
}

// Each job alone (one slot, no drafts) is the reference for the same job
// run speculating with the others in n_slots slots.
static void check_jobs(const char *what, int n_slots, int n_ctx_seq, int n_predict,
                       const struct job *jobs, int n_jobs) {
    struct out *ref = calloc((size_t)n_jobs, sizeof *ref);
    struct out *got = calloc((size_t)n_jobs, sizeof *got);
    cr_assert(ref && got);
    for (int j = 0; j < n_jobs; j++) {
        struct job plain = jobs[j];
        plain.spec = ENGINE_SPEC_NONE;
        run_jobs(1, n_ctx_seq, n_predict, &plain, 1, &ref[j]);
        cr_assert_eq(ref[j].st.n_drafted, 0);
    }
    run_jobs(n_slots, n_ctx_seq, n_predict, jobs, n_jobs, got);
    int drafted = 0, kept = 0;
    for (int j = 0; j < n_jobs; j++) {
        expect_same(&ref[j], &got[j], what, j);
        if (!jobs[j].spec)
            cr_assert_eq(got[j].st.n_drafted, 0, "%s job %d drafts without asking", what, j);
        cr_assert_leq(got[j].st.n_accepted, got[j].st.n_drafted);
        drafted += got[j].st.n_drafted;
        kept += got[j].st.n_accepted;
        cr_log_info("%s job %d: %d tokens, %d drafted, %d kept, %d shifts", what, j, got[j].n,
                    got[j].st.n_drafted, got[j].st.n_accepted, got[j].st.n_ctx_shifts);
    }
    cr_assert_gt(drafted, 0, "%s: nothing was drafted", what);
    cr_assert_gt(kept, 0, "%s: no draft was kept", what);
    free(ref);
    free(got);
}

Test(spec, smollm2_greedy_one_slot, .timeout = 900) {
    need_model();
    const struct job jobs[] = {{0, ENGINE_SPEC_NGRAM, 0, 0},
                               {1, ENGINE_SPEC_NGRAM, 0, 0},
                               {2, ENGINE_SPEC_NGRAM, 0, 0},
                               {3, ENGINE_SPEC_NGRAM, 0, 0}};
    for (int j = 0; j < 4; j++)
        check_jobs("greedy, 1 slot", 1, 256, 48, &jobs[j], 1);
}

Test(spec, smollm2_greedy_slots_mixed, .timeout = 900) {
    need_model();
    // Speculating and plain requests together, more than the slots (a
    // queue), prompts read while others verify drafts.
    const struct job jobs[] = {{0, ENGINE_SPEC_NGRAM, 0, 0}, {3, ENGINE_SPEC_NONE, 0, 0},
                               {1, ENGINE_SPEC_NGRAM, 0, 0}, {2, ENGINE_SPEC_NONE, 0, 0},
                               {2, ENGINE_SPEC_NGRAM, 0, 0}, {0, ENGINE_SPEC_NONE, 0, 0}};
    check_jobs("greedy, 3 slots", 3, 256, 40, jobs, 6);
}

Test(spec, smollm2_seeded_sampling, .timeout = 900) {
    need_model();
    const struct job jobs[] = {{0, ENGINE_SPEC_NGRAM, 0.7f, 11},
                               {2, ENGINE_SPEC_NGRAM, 0.7f, 12},
                               {1, ENGINE_SPEC_NGRAM, 1.0f, 13}};
    check_jobs("temp > 0, 2 slots", 2, 256, 40, jobs, 3);
}

Test(spec, smollm2_greedy_context_shift, .timeout = 900) {
    need_model();
    // 96 cells per slot and 120 tokens after a prompt of about 40: shifts,
    // which must fall where they fall without drafts.
    const struct job jobs[] = {{0, ENGINE_SPEC_NGRAM, 0, 0}, {2, ENGINE_SPEC_NGRAM, 0, 0}};
    check_jobs("greedy, shifts", 2, 96, 120, jobs, 2);
}

static int no_logits(void *user, uint64_t id, int32_t pos, const float *logits) {
    (void)user, (void)id, (void)pos, (void)logits;
    return 0;
}

Test(spec, smollm2_requests_that_cannot_speculate_refused) {
    need_model();
    const struct engine_test_cfg tc = {.n_ctx = 256, .n_batch = 64, .n_seq = 1, .n_threads = 2};
    struct engine *e = engine_test_open(model, &tc);
    struct verr err = {0};
    const int32_t prompt[] = {1, 2, 3};
    struct engine_request r;
    engine_request_default(&r);
    r.tokens = prompt;
    r.n_tokens = 3;
    r.spec.type = ENGINE_SPEC_NGRAM;
    r.on_logits = no_logits;
    cr_assert_eq(engine_submit(e, &r, NULL, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "logits hook"), "%s", err.msg);
    r.on_logits = NULL;
    r.ga_n = 4;
    r.ga_w = 64;
    cr_assert_eq(engine_submit(e, &r, NULL, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "self-extend"), "%s", err.msg);
    r.ga_n = 1;
    r.spec.n_max = 64; // not below the batch of 64
    cr_assert_eq(engine_submit(e, &r, NULL, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "draft max 64"), "%s", err.msg);
    cr_assert_eq(engine_n_queued(e), 0);
    engine_close(e);
}

// ---------------------------------------------------------------------------
// A draft model: SmolLM2 requantized (vela quantize) to Q8_0 as the target
// and to a low-bit type as its draft.

static char q8_path[64], low_path[64];

static void make_copy(char *path, size_t cap, const char *type) {
    snprintf(path, cap, "/tmp/vela-spec-%d-%s.gguf", (int)getpid(), type);
    const struct quantize_opts o = {.in = model,
                                    .out = path,
                                    .ftype = ftype_find(type),
                                    .type_embd = -1,
                                    .type_output = -1,
                                    .allow_requantize = true,
                                    .n_threads = 2};
    cr_assert_not_null(o.ftype, "%s", type);
    struct verr err = {0};
    cr_assert_eq(quantize_file(&o, NULL, &err), 0, "vela quantize %s: %s", type, err.msg);
}

static void need_copies(const char *draft_type) {
    need_model();
    make_copy(q8_path, sizeof q8_path, "Q8_0");
    make_copy(low_path, sizeof low_path, draft_type);
    target = q8_path;
    draft = low_path;
}

static void drop_copies(void) {
    unlink(q8_path);
    unlink(low_path);
}

Test(spec, smollm2_q8_target_q2k_draft, .timeout = 900, .fini = drop_copies) {
    need_copies("Q2_K");
    const struct job one[] = {{0, ENGINE_SPEC_DRAFT, 0, 0}, {3, ENGINE_SPEC_DRAFT, 0, 0}};
    for (int j = 0; j < 2; j++)
        check_jobs("draft Q2_K, 1 slot", 1, 256, 40, &one[j], 1);
    // Draft, n-gram and plain requests together in 3 slots, one sampling.
    const struct job mixed[] = {{1, ENGINE_SPEC_DRAFT, 0, 0},
                                {2, ENGINE_SPEC_NGRAM, 0, 0},
                                {3, ENGINE_SPEC_DRAFT, 0.8f, 5},
                                {0, ENGINE_SPEC_NONE, 0, 0},
                                {0, ENGINE_SPEC_DRAFT, 0, 0}};
    check_jobs("draft Q2_K, 3 slots", 3, 256, 40, mixed, 5);
    // Past the draft's window (the least cells it takes, 130 per slot) and
    // through the target's shifts.
    const struct job shift[] = {{0, ENGINE_SPEC_DRAFT, 0, 0}, {2, ENGINE_SPEC_DRAFT, 0, 0}};
    check_jobs("draft Q2_K, shifts", 2, 96, 150, shift, 2);
}

Test(spec, draft_vocabulary_must_match) {
    need_model();
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.vocab = true;
    cfg.n_vocab = 300;
    char *tiny = engine_test_model(&cfg, "specvocab");
    const struct engine_test_cfg tc = {.n_ctx = 512, .n_batch = 64, .n_seq = 1, .n_threads = 2};
    struct engine *e = engine_test_open(model, &tc);
    struct engine *d = engine_test_open(tiny, &tc);
    struct verr err = {0};
    cr_assert_eq(engine_draft_attach(e, d, &err), VERR_FORMAT);
    cr_assert(strstr(err.msg, "300") && strstr(err.msg, "49152"), "%s", err.msg);
    cr_assert_null(e->draft);
    engine_close(d);
    // A request for draft speculation without a draft model.
    const int32_t prompt[] = {1, 2, 3};
    struct engine_request r;
    engine_request_default(&r);
    r.tokens = prompt;
    r.n_tokens = 3;
    r.spec.type = ENGINE_SPEC_DRAFT;
    cr_assert_eq(engine_submit(e, &r, NULL, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "no draft model"), "%s", err.msg);
    engine_close(e);
    unlink(tiny);
    free(tiny);
}

// ---------------------------------------------------------------------------
// Sampling with drafts: the output's distribution is the model's.
//
// On a tiny random model (V = 300), a logit bias of +30 on two tokens x and
// y with top_k 2 leaves the sampler those two at the model's odds (the same
// bias on both), at temp 1.5. The prompt x y x y x y x makes the n-gram
// drafter propose the alternation, so a draft is kept when the draw agrees
// and rejected when not. CHI_N requests (seeds 1000..) generate 3 tokens
// each; the counts of the 8 outcomes are compared with the exact
// probabilities p(t1) p(t2 | t1) p(t3 | t1 t2) from the model's logits
// (engine_eval of the 4 two-token prefixes), in float64, by Pearson's χ²
// with 7 degrees of freedom at α = 0.001 (critical value 24.32). Power: the
// test computes the noncentrality λ = N δ² (1/p_a + 1/p_b) of moving δ =
// 0.03 of probability between its two likeliest outcomes and requires λ >=
// 40, where a χ²(7, λ) exceeds 24.32 with probability about 0.96 (normal
// approximation of the noncentral χ²). Keeping every draft unread fails it.
#define CHI_N 8000
#define CHI_X 17
#define CHI_Y 42
#define CHI_TEMP 1.5
#define CHI_V 300

// The logits of x and y in the last 3 rows of an evaluated sequence.
struct xy_rows {
    int n_tok;
    double l[3][2];
};

static int keep_xy(void *user, int first, int n, const float *logits) {
    struct xy_rows *r = user;
    for (int i = 0; i < n; i++) {
        const int row = first + i - (r->n_tok - 3);
        if (row >= 0) {
            r->l[row][0] = logits[(size_t)i * CHI_V + CHI_X];
            r->l[row][1] = logits[(size_t)i * CHI_V + CHI_Y];
        }
    }
    return 0;
}

// p(y) of a row after top-k 2 over {x, y} and the temperature.
static double p_y(const double *l) {
    return 1.0 / (1.0 + exp((l[0] - l[1]) / CHI_TEMP));
}

// The exact probability of each outcome t1 t2 t3 (index: bit 2 t1, bit 1
// t2, bit 0 t3; bit set: y).
static void exact_probs(struct engine *e, const int32_t *prompt, int n_prompt, double *prob) {
    struct verr err = {0};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            int32_t seq[16];
            memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
            seq[n_prompt] = a ? CHI_Y : CHI_X;
            seq[n_prompt + 1] = b ? CHI_Y : CHI_X;
            struct xy_rows r = {.n_tok = n_prompt + 2};
            double t_ms;
            cr_assert_eq(engine_eval(e, seq, n_prompt + 2, keep_xy, &r, &t_ms, &err), 0, "%s",
                         err.msg);
            const double p1 = a ? p_y(r.l[0]) : 1 - p_y(r.l[0]);
            const double p2 = b ? p_y(r.l[1]) : 1 - p_y(r.l[1]);
            for (int c = 0; c < 2; c++)
                prob[a * 4 + b * 2 + c] = p1 * p2 * (c ? p_y(r.l[2]) : 1 - p_y(r.l[2]));
        }
}

struct chi_out {
    int32_t tok[3];
    int n;
};

static int chi_collect(void *user, const struct engine_req_event *ev) {
    struct chi_out *o = user;
    if (ev->ev == ENGINE_EV_TOKEN && ev->token >= 0 && o->n < 3)
        o->tok[o->n++] = ev->token;
    return 0;
}

Test(spec, sampling_distribution_is_the_models, .timeout = 600) {
    struct tiny_cfg cfg;
    tiny_cfg_default(&cfg, "llama");
    cfg.vocab = true;
    cfg.n_vocab = CHI_V;
    char *path = engine_test_model(&cfg, "specchi");
    const int n_slots = 8;
    const struct engine_test_cfg tc = {
        .n_ctx = n_slots * 32, .n_batch = 16, .n_seq = n_slots, .n_outputs = 16, .f32_cache = true};
    struct engine *e = engine_test_open(path, &tc);
    const int32_t prompt[] = {CHI_X, CHI_Y, CHI_X, CHI_Y, CHI_X, CHI_Y, CHI_X};
    const int n_prompt = 7;
    double prob[8];
    exact_probs(e, prompt, n_prompt, prob);
    struct verr err = {0};
    struct engine_sched_config sc = {.n_slots = n_slots, .n_queue_max = CHI_N};
    cr_assert_eq(engine_sched_configure(e, &sc, &err), 0, "%s", err.msg);
    const struct sampler_bias bias[2] = {{CHI_X, 30}, {CHI_Y, 30}};
    static struct chi_out outs[CHI_N];
    memset(outs, 0, sizeof outs);
    for (int i = 0; i < CHI_N; i++) {
        struct engine_request r;
        engine_request_default(&r);
        r.tokens = prompt;
        r.n_tokens = n_prompt;
        r.n_predict = 3;
        r.ignore_eos = true;
        r.sp.temp = (float)CHI_TEMP;
        r.sp.top_k = 2;
        r.sp.top_p = 1;
        r.sp.min_p = 0;
        r.sp.bias = bias;
        r.sp.n_bias = 2;
        r.sp.seed = 1000u + (uint32_t)i;
        r.spec.type = ENGINE_SPEC_NGRAM;
        r.spec.n_max = 2;
        r.cb = chi_collect;
        r.user = &outs[i];
        cr_assert_eq(engine_submit(e, &r, NULL, &err), 0, "%s", err.msg);
    }
    engine_test_run_to_end(e);
    const struct engine_stats *st = engine_sched_stats(e);
    int count[8] = {0};
    for (int i = 0; i < CHI_N; i++) {
        cr_assert_eq(outs[i].n, 3, "request %d: %d tokens", i, outs[i].n);
        int k = 0;
        for (int t = 0; t < 3; t++) {
            cr_assert(outs[i].tok[t] == CHI_X || outs[i].tok[t] == CHI_Y, "request %d: token %d", i,
                      outs[i].tok[t]);
            k = 2 * k + (outs[i].tok[t] == CHI_Y);
        }
        count[k]++;
    }
    double chi2 = 0, pa = 0, pb = 0;
    for (int k = 0; k < 8; k++) {
        const double want = CHI_N * prob[k];
        chi2 += (count[k] - want) * (count[k] - want) / want;
        cr_log_info("outcome %d%d%d: %d of %d, expected %.1f", k >> 2, (k >> 1) & 1, k & 1,
                    count[k], CHI_N, want);
        if (prob[k] > pa)
            pb = pa, pa = prob[k];
        else if (prob[k] > pb)
            pb = prob[k];
    }
    const double lambda = CHI_N * 0.03 * 0.03 * (1 / pa + 1 / pb);
    cr_log_info("chi2 %.2f (7 dof, critical 24.32 at 0.001); %d drafted, %d kept; power "
                "noncentrality %.1f",
                chi2, st->n_drafted, st->n_accepted, lambda);
    cr_assert_gt(st->n_accepted, 0, "no draft was kept");
    cr_assert_lt(st->n_accepted, st->n_drafted, "no draft was rejected");
    cr_assert_geq(lambda, 40, "the test has too little power at these probabilities");
    cr_assert_lt(chi2, 24.32, "chi2 %.2f: the output is not the model's distribution", chi2);
    engine_close(e);
    unlink(path);
    free(path);
}
