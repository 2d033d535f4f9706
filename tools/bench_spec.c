// vela bench --draft (bench_spec.h).
#include "tools/bench_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/engine.h"
#include "tools/common.h"

static const char *const PROMPTS[] = {
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
    "    return a * b\n\ndef div(a, b):\n",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. January, February, March, "
    "April, May, June, July, August, September, October, November, December. Monday,",
    "Once upon a time, a robot named Max lived in a small town by the sea. Every day, Max",
    "Explain in simple words how a refrigerator keeps food cold, step by step.\n\n1.",
};
#define N_PROMPTS (int)(sizeof PROMPTS / sizeof *PROMPTS)

// One run's generated tokens, per sequence.
struct spec_out {
    int32_t *tok; // [n_seq][n_gen]
    int *n;       // [n_seq]
    int n_gen;
};

static int on_token(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                    size_t len) {
    struct spec_out *o = user;
    if (ev == ENGINE_EV_TOKEN && token >= 0 && o->n[seq] < o->n_gen)
        o->tok[(size_t)seq * o->n_gen + o->n[seq]++] = token;
    return 0;
}

struct spec_row {
    int n_par;
    double ts_plain, ts_spec; // mean over the repetitions
    int drafted, accepted;    // of the last speculating run
    bool same;
};

// One run of n prompts, greedy, speculating as sp says, into o; adds its
// tokens/s to *ts.
static int run_one(struct engine *e, const struct engine_prompt *p, int n, int n_gen,
                   const struct engine_spec *sp, struct spec_out *o, double *ts,
                   struct engine_stats *st) {
    struct engine_gen_params g;
    engine_gen_params_default(&g);
    g.n_predict = n_gen;
    g.n_parallel = n;
    g.ignore_eos = true;
    g.sp.temp = 0;
    g.spec = *sp;
    memset(o->n, 0, (size_t)n * sizeof *o->n);
    struct verr err = {0};
    if (engine_generate_batch(e, p, n, &g, on_token, o, st, &err)) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        return 1;
    }
    *ts += st->t_gen_ms > 0 ? 1e3 * st->n_gen / st->t_gen_ms : 0;
    return 0;
}

static int measure(struct engine *e, const struct cli *c, const struct engine_spec *sp,
                   const struct engine_prompt *p, int n, struct spec_out *a, struct spec_out *b,
                   struct spec_row *row) {
    const struct engine_spec none = {.type = ENGINE_SPEC_NONE};
    const int n_gen = c->bench.n_gen, reps = c->bench.reps;
    struct engine_stats st;
    *row = (struct spec_row){.n_par = n, .same = true};
    for (int r = 0; r < reps; r++) {
        if (run_one(e, p, n, n_gen, &none, a, &row->ts_plain, &st) ||
            run_one(e, p, n, n_gen, sp, b, &row->ts_spec, &st))
            return 1;
        row->drafted = st.n_drafted;
        row->accepted = st.n_accepted;
        for (int s = 0; s < n; s++)
            row->same = row->same && a->n[s] == b->n[s] &&
                        !memcmp(a->tok + (size_t)s * n_gen, b->tok + (size_t)s * n_gen,
                                (size_t)a->n[s] * sizeof *a->tok);
    }
    row->ts_plain /= reps;
    row->ts_spec /= reps;
    return 0;
}

static void print_row(const struct cli *c, const struct engine_spec *sp, const struct spec_row *w) {
    printf("| %-6s | %7d | %3d | %4d | %9.2f | %9.2f | %6.2fx | %7d | %8d | %7.1f%% | %-4s |\n",
           engine_spec_type_name(sp->type), sp->n_max, w->n_par, c->bench.n_gen, w->ts_plain,
           w->ts_spec, w->ts_plain > 0 ? w->ts_spec / w->ts_plain : 0, w->drafted, w->accepted,
           w->drafted ? 100.0 * w->accepted / w->drafted : 0.0, w->same ? "yes" : "NO");
    fflush(stdout);
}

// The prompts of n_max sequences, tokenized.
static int tokenize_prompts(struct engine *e, struct engine_prompt *p, int32_t **toks, int n_max) {
    struct verr err = {0};
    for (int s = 0; s < n_max; s++) {
        const char *t = PROMPTS[s % N_PROMPTS];
        int n = 0;
        if (tokenizer_encode_alloc(e->tok, t, strlen(t), true, false, &toks[s], &n, &err)) {
            fprintf(stderr, "vela bench: %s\n", err.msg);
            return 1;
        }
        p[s] = (struct engine_prompt){toks[s], n};
    }
    return 0;
}

static int bench_spec_engine(struct cli *c, int n_max, struct engine **e) {
    struct engine_config op;
    args_engine_config(&c->am, &op);
    op.ctx.n_seq_max = n_max;
    op.ctx.n_outputs_max = tools_spec_outputs(c, n_max, op.ctx.n_batch);
    if (op.ctx.n_ctx == 0)
        op.ctx.n_ctx = n_max * (c->bench.n_gen + 256);
    op.need_tokenizer = true;
    struct verr err = {0};
    if (engine_open(e, &op, &err)) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        return 1;
    }
    return tools_draft_open("bench", c, *e, n_max);
}

int bench_spec_run(struct cli *c) {
    if (c->gp.spec.type == ENGINE_SPEC_NONE)
        c->gp.spec.type = ENGINE_SPEC_NGRAM;
    int n_max = 0;
    for (int i = 0; i < c->bench.n_par; i++)
        n_max = c->bench.par[i] > n_max ? c->bench.par[i] : n_max;
    struct engine *e = NULL;
    struct engine_prompt *p = calloc((size_t)n_max, sizeof *p);
    int32_t **toks = calloc((size_t)n_max, sizeof *toks);
    struct spec_out a = {.n_gen = c->bench.n_gen}, b = a;
    a.tok = malloc((size_t)n_max * c->bench.n_gen * sizeof *a.tok);
    b.tok = malloc((size_t)n_max * c->bench.n_gen * sizeof *b.tok);
    a.n = calloc((size_t)n_max, sizeof *a.n);
    b.n = calloc((size_t)n_max, sizeof *b.n);
    int status = 1;
    if (!p || !toks || !a.tok || !b.tok || !a.n || !b.n) {
        fprintf(stderr, "vela bench: out of memory\n");
        goto out;
    }
    if (bench_spec_engine(c, n_max, &e) || tokenize_prompts(e, p, toks, n_max))
        goto out;
    printf("speculative decoding: %s%s%s, greedy, %d tokens a sequence, %d repetitions\n\n",
           c->am.model_path, c->draft.model ? ", draft " : "", c->draft.model ? c->draft.model : "",
           c->bench.n_gen, c->bench.reps);
    printf("| spec   | n_draft |  np |    n | plain t/s |  spec t/s | speedup | drafted | "
           "accepted |  accept%% | same |\n");
    printf("|--------|--------:|----:|-----:|----------:|----------:|--------:|--------:|"
           "---------:|---------:|------|\n");
    status = 0;
    for (int i = 0; i < c->bench.n_par && !status; i++) {
        struct spec_row row;
        status = measure(e, c, &c->gp.spec, p, c->bench.par[i], &a, &b, &row);
        if (!status)
            print_row(c, &c->gp.spec, &row);
        if (!status && !row.same) {
            fprintf(stderr, "vela bench: speculation changed the greedy output at -np %d\n",
                    row.n_par);
            status = 1;
        }
    }
out:
    for (int s = 0; toks && s < n_max; s++)
        free(toks[s]);
    free(toks);
    free(p);
    free(a.tok);
    free(b.tok);
    free(a.n);
    free(b.n);
    engine_close(e);
    return status;
}
