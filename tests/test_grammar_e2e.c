// The end-to-end gate of grammar-constrained sampling (issue #33): 100
// generations from the real SmolLM2-135M-Instruct (CPU backend) under a
// JSON schema's grammar, at temperature 0.8 with 100 seeds, decoded 20 at a
// time; every output must parse as JSON and validate against the schema: 0
// invalid. The grammar's cost per token is measured beside a twin sampler
// without a grammar fed the same logits, and logged. Skipped where the
// model is not in the cache.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "host/engine/constrain.h"
#include "tests/engine_helpers.h"
#include "tests/grammar_helpers.h"
#include "tools/default_model.h"
#include "tools/serve/json_schema.h"

#define N_GEN 100
#define N_PAR 20    // sequences decoded together
#define MAX_GEN 256 // tokens per output; the schema's bounds keep outputs far shorter
#define CTX_SEQ 352 // cells per sequence: the prompt and MAX_GEN

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 24},"
    "\"age\": {\"type\": \"integer\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 16}, "
    "\"maxItems\": 3}},"
    "\"required\": [\"name\", \"age\", \"tags\"], \"additionalProperties\": false}";

static const char PROMPT[] = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                             "<|im_start|>user\nDescribe a fictional person as a JSON object with "
                             "the keys name, age and tags.<|im_end|>\n<|im_start|>assistant\n";

struct gen {
    struct sampler *s, *plain; // with the grammar, and its twin without
    int32_t pos, next;
    bool done;
    int n_tok;
    char text[4096];
    size_t len;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double t_grammar, t_plain;
static long n_sampled;

// Samples g's next token from logits and takes it; times both samplers.
static void gen_step(struct gen *g, struct engine *e, const float *logits) {
    struct verr err = {0};
    double t0 = now_s();
    int32_t tok = -1;
    cr_assert_eq(sampler_sample_checked(g->s, logits, &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(sampler_accept_checked(g->s, tok, &err), 0, "%s", err.msg);
    double t1 = now_s();
    if (g->plain) { // the cost measured on the first wave
        sampler_accept(g->plain, sampler_sample(g->plain, logits));
        t_grammar += t1 - t0;
        t_plain += now_s() - t1;
        n_sampled++;
    }
    g->n_tok++;
    if (tokenizer_is_eog(e->tok, tok)) {
        g->done = true;
        return;
    }
    const char *piece;
    size_t n;
    cr_assert_eq(tokenizer_piece(e->tok, tok, false, &piece, &n, &err), 0);
    cr_assert_lt(g->len + n, sizeof g->text);
    memcpy(g->text + g->len, piece, n);
    g->len += n;
    g->next = tok;
    if (g->n_tok >= MAX_GEN)
        g->done = true;
}

// The output parses and holds exactly name (string), age (integer) and
// tags (up to 3 strings); NULL or what is wrong.
static const char *validate(const char *text) {
    static char why[128];
    cJSON *j = cJSON_Parse(text);
    if (!j)
        return "not JSON";
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(j, "age");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(j, "tags");
    const char *bad = NULL;
    if (!cJSON_IsObject(j) || cJSON_GetArraySize(j) != 3)
        bad = "not an object of 3 keys";
    else if (!cJSON_IsString(name))
        bad = "name is not a string";
    else if (!cJSON_IsNumber(age) || age->valuedouble != floor(age->valuedouble))
        bad = "age is not an integer";
    else if (!cJSON_IsArray(tags) || cJSON_GetArraySize(tags) > 3)
        bad = "tags is not an array of at most 3";
    for (const cJSON *t = tags ? tags->child : NULL; t && !bad; t = t->next)
        if (!cJSON_IsString(t))
            bad = "a tag is not a string";
    if (bad)
        snprintf(why, sizeof why, "%s", bad);
    cJSON_Delete(j);
    return bad ? why : NULL;
}

// One wave: n sequences from their prompts to their ends.
static void run_wave(struct engine *e, struct gen *gs, int n, const int32_t *prompt, int n_prompt) {
    struct verr err = {0};
    struct context_result res;
    cr_assert_eq(context_clear(e->ctx, &err), 0, "%s", err.msg);
    int32_t pos[N_PAR * 64], seq[N_PAR], tok[N_PAR];
    cr_assert_leq(n_prompt, N_PAR * 64);
    // The prompt once, as sequence 0; the others share its cells.
    int32_t seqs[N_PAR * 64];
    for (int t = 0; t < n_prompt; t++)
        pos[t] = t, seqs[t] = 0;
    const struct forward_batch pb = {.n_tok = n_prompt, .token = prompt, .pos = pos, .seq = seqs};
    cr_assert_eq(context_decode_logits(e->ctx, &pb, &res, &err), 0, "%s", err.msg);
    float *first = malloc((size_t)res.n_vocab * sizeof *first);
    memcpy(first, context_row_logits(&res, 0), (size_t)res.n_vocab * sizeof *first);
    for (int i = 0; i < n; i++) {
        if (i > 0)
            cr_assert_eq(context_seq_cp(e->ctx, 0, i, 0, n_prompt, &err), 0, "%s", err.msg);
        gs[i].pos = n_prompt;
        gen_step(&gs[i], e, first);
    }
    free(first);
    for (;;) {
        int m = 0, who[N_PAR];
        for (int i = 0; i < n; i++)
            if (!gs[i].done) {
                who[m] = i;
                tok[m] = gs[i].next;
                pos[m] = gs[i].pos++;
                seq[m++] = i;
            }
        if (m == 0)
            return;
        int8_t want[N_PAR];
        memset(want, 1, sizeof want);
        const struct forward_batch b = {
            .n_tok = m, .token = tok, .pos = pos, .seq = seq, .logits = want};
        cr_assert_eq(context_decode_logits(e->ctx, &b, &res, &err), 0, "%s", err.msg);
        cr_assert_eq(res.n_rows, m);
        for (int r = 0; r < m; r++)
            gen_step(&gs[who[res.batch_idx[r]]], e, context_row_logits(&res, r));
    }
}

Test(grammar_e2e, smollm2_json_schema_100_outputs_all_valid, .timeout = 900) {
    char path[1200];
    if (!gh_smollm2_path(path, sizeof path))
        cr_skip_test("%s not in the model cache (bash tools/model_cache.sh fetches it)",
                     TOOLS_DEFAULT_MODEL_FILE);
    const struct engine_test_cfg tc = {
        .n_ctx = N_PAR * CTX_SEQ, .n_batch = 128, .n_seq = N_PAR, .n_threads = 2};
    struct engine *e = engine_test_open(path, &tc);
    struct verr err = {0};
    struct grammar_vocab *v = NULL;
    double t0 = now_s();
    cr_assert_eq(constrain_vocab_new(&v, e->tok, &err), 0, "%s", err.msg);
    const double t_vocab = now_s() - t0;
    char *gbnf = NULL;
    cr_assert_eq(json_schema_text_to_gbnf(SCHEMA, strlen(SCHEMA), &gbnf, &err), 0, "%s", err.msg);
    struct grammar *g = NULL;
    cr_assert_eq(grammar_parse(&g, gbnf, strlen(gbnf), NULL, &err), 0, "%s\n%s", err.msg, gbnf);
    int32_t *prompt = NULL;
    int n_prompt = 0;
    cr_assert_eq(tokenizer_encode_alloc(e->tok, PROMPT, strlen(PROMPT), true, true, &prompt,
                                        &n_prompt, &err),
                 0, "%s", err.msg);
    static struct gen gs[N_PAR];
    int n_invalid = 0, n_tokens = 0;
    t_grammar = t_plain = 0;
    n_sampled = 0;
    const double t_start = now_s();
    for (int w = 0; w < N_GEN / N_PAR; w++) {
        memset(gs, 0, sizeof gs);
        for (int i = 0; i < N_PAR; i++) {
            struct sampler_params p;
            sampler_params_default(&p);
            p.seed = 1000u + (uint32_t)(w * N_PAR + i);
            if (w == 0)
                cr_assert_eq(sampler_create(&gs[i].plain, &p, e->m->hp.n_vocab, &err), 0);
            p.grammar = g;
            p.grammar_vocab = v;
            cr_assert_eq(sampler_create(&gs[i].s, &p, e->m->hp.n_vocab, &err), 0, "%s", err.msg);
        }
        run_wave(e, gs, N_PAR, prompt, n_prompt);
        for (int i = 0; i < N_PAR; i++) {
            gs[i].text[gs[i].len] = '\0';
            const char *why = validate(gs[i].text);
            if (why) {
                n_invalid++;
                cr_log_error("output %d (seed %d, %d tokens): %s:\n%s", w * N_PAR + i,
                             1000 + w * N_PAR + i, gs[i].n_tok, why, gs[i].text);
            }
            if (w == 0 && i < 3)
                cr_log_info("output %d: %s", i, gs[i].text);
            n_tokens += gs[i].n_tok;
            sampler_free(gs[i].s);
            sampler_free(gs[i].plain);
        }
    }
    cr_log_info("%d outputs, %d tokens in %.1f s; token trie built in %.0f ms", N_GEN, n_tokens,
                now_s() - t_start, t_vocab * 1e3);
    cr_log_info("sampling per token (%ld tokens): %.1f us with the grammar (sample + accept), "
                "%.1f us without",
                n_sampled, t_grammar / (double)n_sampled * 1e6, t_plain / (double)n_sampled * 1e6);
    cr_expect_eq(n_invalid, 0, "%d of %d outputs do not validate", n_invalid, N_GEN);
    free(prompt);
    grammar_free(g);
    free(gbnf);
    grammar_vocab_free(v);
    engine_close(e);
}
