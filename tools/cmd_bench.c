// vela bench: prompt processing and generation throughput, the way
// llama-bench measures them.
//
// - ppN: N random tokens evaluated as one sequence from an empty cache, in
//   batches of -b, only the last token of each batch wanting logits.
// - tgN: N single-token decode steps from an empty cache (llama-bench's tg
//   starts from an empty context too). With --parallel P (P > 1) each step is
//   one batch of P tokens, one per sequence, and the figure is the aggregate
//   P * N / time.
// - At depth D (-d D, D > 0; "pp512 @ d4096", "tg128 @ d4096"): before the
//   test's first run the cache gets D random tokens of sequence 0 at
//   positions [0, D) (untimed), shared with sequences 1..P-1 by kv_seq_cp;
//   the test's tokens go at positions D, D + 1, ... on top of it. Each run
//   then starts from that same prefix: its own cells are removed after it
//   (kv_seq_rm of positions >= D, every sequence) instead of refilling as
//   llama-bench does (the same cells, and the K/V the prefix wrote are
//   untouched). D = 0 clears the cache before each run, as before.
// Each test runs once untimed (warm-up), then -r times; t/s is the mean and
// sample standard deviation over the repetitions. Timing covers the decode
// calls only (context_decode ends with a backend sync); tokens are random
// ids and nothing is sampled, as in llama-bench. By default the logits are
// reduced to their argmax on the backend (what greedy generation in vela
// does); --full-logits downloads every logits row, as llama.cpp's API does.
//
// Bandwidth: the bytes a run must read at least (every weight once per
// forward pass, plus each query's visible K/V cells once per batch), times
// runs per second. The fraction is of the GPU's peak (memory clock x bus
// width); the CPU backend has no peak to report.
//
// Several devices (--devices, --tensor-split, --split-mode, -ub): the model
// is loaded through the pipeline (host/split/pipeline.h) as `vela run` loads it.
// When the plan has more than one stage, each test gets one more run after
// the timed ones with the pipeline's timing hook on: it waits for each
// stage's work in turn (serialising the stages), so its per-stage times say
// where the time goes but are not throughput; t/s comes from the runs
// without it. --split-compare first runs every test with --split-mode none
// on the main device and reports split t/s / one-device t/s per test.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"
#include "kv/kv.h"
#include "tools/args.h"
#include "tools/bench_spec.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/default_model.h"
#include "tools/mkmodel/ftype.h"
#include "tools/progress.h"

#include "vela_commit.h" // generated at build time (cmake/vela_commit.cmake)

#define BENCH_MAX_PARALLEL CLI_BENCH_MAX_LIST
#define BENCH_MAX_DEPTHS CLI_BENCH_MAX_LIST

static void usage(FILE *out) {
    fprintf(out,
            "usage: vela bench -m MODEL [options]\n\n"
            "Measures prompt processing (ppN) and generation (tgN) throughput in tokens/s,\n"
            "as mean +- standard deviation over -r repetitions after one warm-up, and the\n"
            "memory bandwidth that implies. Output: a markdown table, or JSON with --json.\n\n");
    flags_help(out, &cli_flags, CLI_BENCH);
}

// --- statistics and formatting ----------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return n > 0 ? s / n : 0;
}

// Sample standard deviation (Bessel's correction, as llama-bench).
static double stddev_of(const double *v, int n) {
    if (n < 2)
        return 0;
    double m = mean_of(v, n), s = 0;
    for (int i = 0; i < n; i++)
        s += (v[i] - m) * (v[i] - m);
    return sqrt(s / (n - 1));
}

// "7B", "124M": the size label llama.cpp puts after the architecture.
static void size_label(int64_t n_params, char *buf, size_t cap) {
    if (n_params >= 1000000000)
        snprintf(buf, cap, "%.0fB", (double)n_params / 1e9);
    else if (n_params >= 1000000)
        snprintf(buf, cap, "%.0fM", (double)n_params / 1e6);
    else
        snprintf(buf, cap, "%.0fK", (double)n_params / 1e3);
}

static void upper(char *s) {
    for (; *s; s++)
        if (*s >= 'a' && *s <= 'z')
            *s = (char)(*s - 'a' + 'A');
}

static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *c = strchr(line, ':');
        if (!c)
            continue;
        c++;
        while (*c == ' ' || *c == '\t')
            c++;
        snprintf(buf, cap, "%s", c);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

// --- tests ---------------------------------------------------------------------

enum test_kind { TEST_PP, TEST_TG };

struct test {
    enum test_kind kind;
    int n_tokens;   // -p for pp, -n for tg (steps)
    int n_parallel; // tg: sequences; pp: 1
    int n_depth;    // tokens cached before the test's (-d)
    char name[48];  // "pp512", "tg128", "tg128 x32", "tg128 @ d4096"
    // results
    double *samples_ts; // [reps]
    double *samples_s;  // [reps] seconds per run
    double tokens;      // tokens a run processes
    double bytes;       // bytes a run reads at least
    double flops;       // floating point operations of a run
    // A split model: the extra run with the timing hook on (see the top).
    bool have_stages;
    double stage_ms[PLAN_MAX_DEVICES]; // [n_stages] wall time of each stage's work
    double xfer_ms;                    // hidden states between stages, results back
    double timed_run_ms;               // that run's decode time (timing on)
    // --split-compare: the same test with the model on one device.
    bool have_single;
    double single_ts, single_sd;
};

// A split model's layers live in its stages' models (m is stage 0's): the
// one holding layer il, or the first / last layer (embedding / head).
static const struct model *layer_model(const struct pipeline *pipe, int il) {
    const struct model *m = pipe->stage[0].m;
    for (int s = 0; s < pipe->n_stages; s++) {
        const struct model *sm = pipe->stage[s].m;
        if (sm && il >= sm->layer_begin && il < sm->layer_end)
            return sm;
    }
    return m; // a stage in another process: its shapes are not here
}

static const struct model *head_model(const struct pipeline *pipe) {
    return layer_model(pipe, pipe->stage[0].m->hp.n_layer - 1);
}

// Weight bytes and parameters of the whole model: every stage's, the
// embedding table counted once where a tied head loads it again.
static void model_totals(const struct pipeline *pipe, double *bytes, double *params) {
    *bytes = *params = 0;
    for (int s = 0; s < pipe->n_stages; s++) {
        const struct model *sm = pipe->stage[s].m;
        if (!sm)
            continue;
        *bytes += (double)sm->n_bytes;
        *params += (double)sm->n_params;
        if (sm->output_tied && sm->layer_begin > 0 && sm->layer_end == sm->hp.n_layer) {
            const struct backend_weight *w = &sm->tok_embd;
            *bytes -= (double)ggml_row_bytes(w->type, w->n_in) * (double)w->n_out;
            *params -= (double)w->n_in * (double)w->n_out;
        }
    }
}

// Bytes read by one forward pass over n_tok tokens, weights only: every
// matrix and norm once (of an expert stack, the experts the tokens are
// expected to use: model_layer_bytes_read), the embedding rows of the batch.
static double weight_bytes(const struct pipeline *smod, int n_tok) {
    const struct model *m = smod->stage[0].m;
    const struct model_hparams *hp = &m->hp;
    const struct model *mh = head_model(smod);
    double b = 0;
    for (int il = 0; il < hp->n_layer; il++)
        b += model_layer_bytes_read(hp, &layer_model(smod, il)->layers[il], n_tok);
    b += (double)ggml_row_bytes(mh->output.type, mh->output.n_in) * (double)mh->output.n_out;
    b += (double)hp->n_embd * sizeof(float); // output_norm
    b += (double)n_tok * (double)ggml_row_bytes(m->tok_embd.type, m->tok_embd.n_in);
    return b;
}

// Multiply-adds of the matrices a token goes through (x2 = flops), without
// the output head.
static double layer_matmul_params(const struct pipeline *smod) {
    const struct model *m = smod->stage[0].m;
    double p = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        double lb, lp;
        model_layer_size(&m->hp, &layer_model(smod, il)->layers[il], &lb, &lp);
        p += lp;
    }
    return p;
}

// The bytes and flops of a run, from the model's shapes (see the top).
static void test_cost(struct test *t, const struct pipeline *smod, enum ggml_type type_k,
                      enum ggml_type type_v, int n_batch) {
    const struct model *m = smod->stage[0].m;
    const struct model_hparams *hp = &m->hp;
    // K and V of one cell, all layers
    const double cell = (double)hp->n_layer * hp->n_head_kv *
                        ((double)hp->head_dim * ggml_row_bytes(type_k, 1) +
                         (double)hp->head_dim_v * ggml_row_bytes(type_v, 1));
    // flops of one query against one cell, all layers (q.k and p.v)
    const double attn = 2.0 * hp->n_layer * hp->n_head * ((double)hp->head_dim + hp->head_dim_v);
    const double mm = 2.0 * layer_matmul_params(smod);
    const struct model *mh = head_model(smod);
    const double head = 2.0 * (double)mh->output.n_in * (double)mh->output.n_out;
    const double d = t->n_depth;
    t->bytes = t->flops = 0;
    if (t->kind == TEST_PP) {
        const int p = t->n_tokens;
        t->tokens = p;
        for (int pos = 0; pos < p; pos += n_batch) {
            const int n = p - pos < n_batch ? p - pos : n_batch;
            t->bytes += weight_bytes(smod, n) + (d + pos + n) * cell;
            t->flops += head; // the last token of each batch wants logits
        }
        // query at position d + i sees d + i + 1 cells
        t->flops += mm * p + attn * (d * p + (double)p * (p + 1) / 2.0);
    } else {
        const int n = t->n_tokens, P = t->n_parallel;
        t->tokens = (double)n * P;
        // step s: every sequence sees d + s + 1 cells
        const double visible = d * n + (double)n * (n + 1) / 2.0;
        t->bytes = n * weight_bytes(smod, P) + P * visible * cell;
        t->flops = (mm + head) * t->tokens + attn * P * visible;
    }
}

// xorshift64*: a fixed token stream per repetition.
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

struct runner {
    struct context *ctx;
    uint8_t *how; // [n_batch] every row ARGMAX, or LOGITS (--full-logits)
    int n_vocab;
    int pp_batch;             // a pp test's tokens per decode (the context's may be larger)
    int32_t *tok, *pos, *seq; // [n_batch]
    int8_t *want;             // [n_batch]
};

static int decode(struct runner *r, int n, const int8_t *want, struct verr *err) {
    const struct forward_batch b = {
        .n_tok = n, .token = r->tok, .pos = r->pos, .seq = r->seq, .logits = want};
    const struct context_plan plan = {.batch = b, .how = r->how};
    return context_decode(r->ctx, &plan, NULL, err);
}

// The depth prefix of test t (untimed): the cache cleared, then n_depth
// random tokens of sequence 0 at positions [0, n_depth) in batches of the
// context's n_batch, only the last of each wanting logits, and the cells
// shared with sequences 1..n_parallel-1 (kv_seq_cp).
static int fill_depth(struct runner *r, const struct test *t, struct verr *err) {
    int rc = context_clear(r->ctx, err);
    uint64_t s = 0x5DEECE66Dull;
    const int nb = context_config(r->ctx)->n_batch;
    for (int p0 = 0; !rc && p0 < t->n_depth; p0 += nb) {
        const int n = t->n_depth - p0 < nb ? t->n_depth - p0 : nb;
        for (int i = 0; i < n; i++) {
            r->tok[i] = (int32_t)(rng_next(&s) % (uint64_t)r->n_vocab);
            r->pos[i] = p0 + i;
            r->seq[i] = 0;
        }
        rc = decode(r, n, NULL, err);
    }
    for (int j = 1; !rc && j < t->n_parallel; j++)
        rc = context_seq_cp(r->ctx, 0, j, 0, t->n_depth, err);
    return rc ? verr_wrap(err, "filling the cache to depth %d", t->n_depth) : 0;
}

// One run of test t on top of its depth prefix: from an empty cache at depth
// 0, else with every cell at a position >= n_depth removed first (a previous
// run's); *secs: the time spent decoding.
static int run_once(struct runner *r, const struct test *t, uint64_t seed, double *secs,
                    struct verr *err) {
    const int D = t->n_depth;
    int rc = D == 0 ? context_clear(r->ctx, err) : context_seq_rm(r->ctx, -1, D, -1, err);
    if (rc)
        return rc;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    const int V = r->n_vocab;
    double elapsed = 0;
    if (t->kind == TEST_PP) {
        const int nb = r->pp_batch;
        for (int p0 = 0; p0 < t->n_tokens; p0 += nb) {
            const int n = t->n_tokens - p0 < nb ? t->n_tokens - p0 : nb;
            for (int i = 0; i < n; i++) {
                r->tok[i] = (int32_t)(rng_next(&s) % (uint64_t)V);
                r->pos[i] = D + p0 + i;
                r->seq[i] = 0;
            }
            double t0 = now_s();
            rc = decode(r, n, NULL, err);
            elapsed += now_s() - t0;
            if (rc)
                return rc;
        }
    } else {
        const int P = t->n_parallel;
        for (int step = 0; step < t->n_tokens; step++) {
            for (int j = 0; j < P; j++) {
                r->tok[j] = (int32_t)(rng_next(&s) % (uint64_t)V);
                r->pos[j] = D + step;
                r->seq[j] = j;
                r->want[j] = 1;
            }
            double t0 = now_s();
            rc = decode(r, P, r->want, err);
            elapsed += now_s() - t0;
            if (rc)
                return rc;
        }
    }
    *secs = elapsed;
    return 0;
}

static int run_test(struct test *t, struct pipeline *smod, const struct args_model *am, int reps,
                    bool full_logits, bool stage_times, bool verbose, struct verr *err) {
    struct forward_config cfg;
    args_ctx_config(am, &cfg);
    forward_config_resolve(&cfg, &smod->stage[0].m->hp);
    // the cells: the depth prefix (shared by the sequences) and the test's
    int need = t->n_depth, batch;
    if (t->kind == TEST_PP) {
        need += t->n_tokens;
        batch = am->n_batch < t->n_tokens ? am->n_batch : t->n_tokens;
        cfg.n_seq_max = 1;
        cfg.n_outputs_max = 1;
    } else {
        need += t->n_tokens * t->n_parallel;
        batch = t->n_parallel;
        cfg.n_seq_max = t->n_parallel;
        cfg.n_outputs_max = t->n_parallel;
    }
    // the prefix is filled in batches of -b (at most the depth)
    const int fill = am->n_batch < t->n_depth ? am->n_batch : t->n_depth;
    cfg.n_batch = fill > batch ? fill : batch;
    cfg.n_ctx = am->n_ctx > need ? am->n_ctx : need;
    test_cost(t, smod, cfg.type_k, cfg.type_v, batch);

    struct runner r = {.n_vocab = smod->stage[0].m->hp.n_vocab, .pp_batch = batch};
    int rc = context_create(&r.ctx, smod, &cfg, false, err);
    if (rc)
        return verr_wrap(err, "%s", t->name);
    const size_t nb = (size_t)cfg.n_batch;
    if ((r.how = malloc(nb)))
        memset(r.how, full_logits ? FORWARD_ROW_LOGITS : FORWARD_ROW_ARGMAX, nb);
    r.tok = malloc(nb * sizeof *r.tok);
    r.pos = malloc(nb * sizeof *r.pos);
    r.seq = malloc(nb * sizeof *r.seq);
    r.want = malloc(nb);
    t->samples_ts = calloc((size_t)reps, sizeof *t->samples_ts);
    t->samples_s = calloc((size_t)reps, sizeof *t->samples_s);
    if (!r.how || !r.tok || !r.pos || !r.seq || !r.want || !t->samples_ts || !t->samples_s) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    double secs = 0, t0 = now_s();
    if (t->n_depth > 0 && (rc = fill_depth(&r, t, err))) {
        verr_wrap(err, "%s", t->name);
        goto out;
    }
    if (verbose && t->n_depth > 0)
        fprintf(stderr, "vela bench: %s: depth %d filled in %.3f s\n", t->name, t->n_depth,
                now_s() - t0);
    if ((rc = run_once(&r, t, 0, &secs, err))) { // warm-up
        verr_wrap(err, "%s: warm-up", t->name);
        goto out;
    }
    if (verbose)
        fprintf(stderr, "vela bench: %s: warm-up %.3f s\n", t->name, secs);
    for (int i = 0; i < reps; i++) {
        if ((rc = run_once(&r, t, (uint64_t)i + 1, &secs, err))) {
            verr_wrap(err, "%s: repetition %d", t->name, i + 1);
            goto out;
        }
        t->samples_s[i] = secs;
        t->samples_ts[i] = secs > 0 ? t->tokens / secs : 0;
        if (verbose)
            fprintf(stderr, "vela bench: %s: repetition %d: %.3f s, %.2f t/s\n", t->name, i + 1,
                    secs, t->samples_ts[i]);
    }
    if (stage_times && smod->n_stages > 1) {
        // One more run, not among the samples: the hook syncs after each
        // stage's work, which serialises the pipeline.
        struct pipeline *p = smod;
        memset(p->stage_ms, 0, sizeof p->stage_ms);
        p->xfer_ms = 0;
        p->n_decodes = 0;
        p->timing = true;
        rc = run_once(&r, t, (uint64_t)reps + 1, &secs, err);
        p->timing = false;
        if (rc) {
            verr_wrap(err, "%s: per-stage timing run", t->name);
            goto out;
        }
        t->have_stages = true;
        memcpy(t->stage_ms, p->stage_ms, sizeof t->stage_ms);
        t->xfer_ms = p->xfer_ms;
        t->timed_run_ms = 1e3 * secs;
        if (verbose)
            fprintf(stderr, "vela bench: %s: timing run: %.3f s, %ld decodes\n", t->name, secs,
                    p->n_decodes);
    }
out:
    free(r.tok);
    free(r.pos);
    free(r.seq);
    free(r.want);
    free(r.how);
    context_free(r.ctx);
    return rc;
}

// --- report --------------------------------------------------------------------------

struct report {
    const char *model_path;
    const struct model *m;
    char desc[160];      // "llama 7B Q4_0"
    const char *ftype;   // llama.cpp's name of general.file_type, or NULL
    const char *backend; // "cpu", "cuda"
    bool act_q8;         // backend.act_q8 (--matvec-act): "q8" after the name in the table
    int n_threads;
    char device_name[256];
    bool have_gpu;
    struct backend_device_info gpu; // stage 0's GPU
    double peak_bw_gbs; // bw_frac's denominator: the GPU's, or a split's distinct GPUs' summed
    double size_bytes, n_params; // the whole model (every stage)
    const struct pipeline *pipe; // the split (NULL: one device)
    const struct args_model *am; // the flags (split mode, devices)
    bool split_compare;
    bool no_stage_times;
    char single_device[48]; // --split-compare: the one device ("cpu", "cuda:0")
    int n_batch;
    enum ggml_type type_k, type_v;
    int reps;
    bool full_logits;
    // tensor count per weight type in the file
    int type_count[GGML_TYPE_COUNT];
};

static double test_mean_secs(const struct test *t, int reps) {
    return mean_of(t->samples_s, reps);
}

static double test_bw_gbs(const struct test *t, int reps) {
    double s = test_mean_secs(t, reps);
    return s > 0 ? t->bytes / s / 1e9 : 0;
}

static void print_table_header(const struct report *rp) {
    const bool cpu = !rp->have_gpu;
    printf("| %-30s | %10s | %10s | %-10s |%s %-14s | %20s | %9s |%s\n", "model", "size", "params",
           "backend", cpu ? "     threads |" : "", "test", "t/s", "GB/s",
           cpu ? "" : " % peak BW |");
    printf("| %.30s | %.10s: | %.10s: | %.10s |%s %.14s | %.20s: | %.9s: |%s\n",
           "------------------------------", "---------", "---------", "----------",
           cpu ? " ----------: |" : "", "--------------", "-------------------", "--------",
           cpu ? "" : " --------: |");
}

static void print_table_row(const struct report *rp, const struct test *t) {
    char size[32], params[32], ts[48], thr[32] = "", frac[32] = "", backend[32];
    // which decode mat-vec path ran (backend.act_q8)
    snprintf(backend, sizeof backend, "%s%s", rp->backend, rp->act_q8 ? " q8" : "");
    const double bytes = rp->size_bytes, np = rp->n_params;
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(size, sizeof size, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else
        snprintf(size, sizeof size, "%.2f MiB", bytes / (1024.0 * 1024));
    if (np >= 1e9)
        snprintf(params, sizeof params, "%.2f B", np / 1e9);
    else
        snprintf(params, sizeof params, "%.2f M", np / 1e6);
    snprintf(ts, sizeof ts, "%.2f ± %.2f", mean_of(t->samples_ts, rp->reps),
             stddev_of(t->samples_ts, rp->reps));
    const double bw = test_bw_gbs(t, rp->reps);
    if (!rp->have_gpu)
        snprintf(thr, sizeof thr, " %11d |", rp->n_threads);
    else if (rp->peak_bw_gbs > 0)
        snprintf(frac, sizeof frac, " %8.1f%% |", 100.0 * bw / rp->peak_bw_gbs);
    else
        snprintf(frac, sizeof frac, " %9s |", "-");
    // "±" is two bytes but one column: widen the field by one.
    printf("| %-30s | %10s | %10s | %-10s |%s %-14s | %21s | %9.2f |%s\n", rp->desc, size, params,
           backend, thr, t->name, ts, bw, frac);
    fflush(stdout);
}

static const char *split_mode_name(int mode) {
    return mode == LOAD_SPLIT_NONE ? "none" : mode == LOAD_SPLIT_ROW ? "row" : "layer";
}

static double stages_ms(const struct pipeline *p, const struct test *t) {
    double sum = 0;
    for (int s = 0; s < p->n_stages; s++)
        sum += t->stage_ms[s];
    return sum;
}

// The plan, then each test's per-stage time from its timing run.
static void print_split(const struct report *rp, const struct test *tests, int n_tests) {
    const struct pipeline *p = rp->pipe;
    char ub[48];
    if (p->n_ubatch > 0)
        snprintf(ub, sizeof ub, "%d tokens", p->n_ubatch);
    else
        snprintf(ub, sizeof ub, "auto (batch / stages)");
    printf("\nsplit: --split-mode layer, %d stages, micro-batch %s\n", p->n_stages, ub);
    // plan_text: one line per stage, then the transport
    for (const char *l = p->plan_text; *l;) {
        const size_t n = strcspn(l, "\n");
        printf("  %.*s\n", (int)n, l);
        l += n + (l[n] == '\n');
    }
    if (rp->no_stage_times)
        return;
    printf("\nper-stage time: one extra run per test after the timed ones, with the timing hook\n"
           "on; it waits for each stage in turn, serialising the pipeline, so these figures\n"
           "attribute time and the t/s above (runs without the hook) are the throughput.\n\n");
    printf("| %-14s | %5s | %-12s | %-9s | %10s | %6s |\n", "test", "stage", "device", "layers",
           "ms/run", "%");
    printf("| %.14s | ----: | %.12s | %.9s | %.10s: | %.6s: |\n", "--------------", "------------",
           "---------", "---------", "-----");
    for (int k = 0; k < n_tests; k++) {
        const struct test *t = &tests[k];
        if (!t->have_stages)
            continue;
        const double sum = stages_ms(p, t);
        for (int s = 0; s < p->n_stages; s++) {
            char layers[32];
            snprintf(layers, sizeof layers, "%d-%d", p->stage[s].l0, p->stage[s].l1 - 1);
            printf("| %-14s | %5d | %-12s | %-9s | %10.3f | %5.1f%% |\n", t->name, s,
                   p->stage[s].name, layers, t->stage_ms[s],
                   sum > 0 ? 100.0 * t->stage_ms[s] / sum : 0.0);
        }
        printf("| %-14s | %5s | %-12s | %-9s | %10.3f | %6s |\n", t->name, "xfer", "", "",
               t->xfer_ms, "");
    }
}

static void print_scaling(const struct report *rp, const struct test *tests, int n_tests) {
    printf("\nscaling: %d stages vs one device (%s, --split-mode none); ratio = split t/s / "
           "one-device t/s\n\n",
           rp->pipe ? rp->pipe->n_stages : 1, rp->single_device);
    printf("| %-14s | %20s | %20s | %7s |\n", "test", "1 device t/s", "split t/s", "ratio");
    printf("| %.14s | %.20s: | %.20s: | %.7s: |\n", "--------------", "-------------------",
           "-------------------", "------");
    for (int k = 0; k < n_tests; k++) {
        const struct test *t = &tests[k];
        if (!t->have_single)
            continue;
        char a[48], b[48];
        const double ts = mean_of(t->samples_ts, rp->reps);
        snprintf(a, sizeof a, "%.2f ± %.2f", t->single_ts, t->single_sd);
        snprintf(b, sizeof b, "%.2f ± %.2f", ts, stddev_of(t->samples_ts, rp->reps));
        printf("| %-14s | %21s | %21s | %7.2f |\n", t->name, a, b,
               t->single_ts > 0 ? ts / t->single_ts : 0.0);
    }
}

static void iso_date(char *buf, size_t cap) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

// The plan (t NULL) or one test's per-stage times: {"mode", "stages":
// [{"device", "layers": [l0, l1), "ms", "frac"}], "xfer_ms", ...}; frac is
// of the stages' summed time, so the fractions add up to 1.
static cJSON *split_json(const struct report *rp, const struct test *t) {
    const struct pipeline *p = rp->pipe;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", "layer");
    cJSON_AddNumberToObject(o, "n_stages", p->n_stages);
    if (!t) {
        cJSON_AddStringToObject(o, "transport", p->tp ? p->tp->ops->name : "");
        cJSON_AddNumberToObject(o, "n_ubatch", p->n_ubatch);
        // How the per-test stage figures were taken (see the top of this file).
        cJSON_AddStringToObject(o, "stage_times",
                                !rp->no_stage_times
                                    ? "one extra run per test after the timed ones, timing hook "
                                      "on (serialises the stages); t/s excludes it"
                                    : "off");
    }
    const double sum = t ? stages_ms(p, t) : 0;
    cJSON *arr = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < p->n_stages; s++) {
        cJSON *st = cJSON_CreateObject();
        cJSON_AddStringToObject(st, "device", p->stage[s].name);
        const int l[2] = {p->stage[s].l0, p->stage[s].l1};
        cJSON_AddItemToObject(st, "layers", cJSON_CreateIntArray(l, 2));
        if (t) {
            cJSON_AddNumberToObject(st, "ms", t->stage_ms[s]);
            cJSON_AddNumberToObject(st, "frac", sum > 0 ? t->stage_ms[s] / sum : 0);
        }
        cJSON_AddItemToArray(arr, st);
    }
    if (t) {
        cJSON_AddNumberToObject(o, "xfer_ms", t->xfer_ms);
        cJSON_AddNumberToObject(o, "run_ms", t->timed_run_ms);
    }
    return o;
}

// The device: the GPU's versions and shape, or the CPU's count.
static void json_device(cJSON *root, const struct report *rp) {
    cJSON *dev = cJSON_AddObjectToObject(root, "device");
    cJSON_AddStringToObject(dev, "name", rp->device_name);
    if (rp->have_gpu) {
        char v[32];
        snprintf(v, sizeof v, "%d.%d", rp->gpu.driver_version / 1000,
                 (rp->gpu.driver_version % 1000) / 10);
        cJSON_AddStringToObject(dev, "driver", v);
        snprintf(v, sizeof v, "%d.%d", rp->gpu.runtime_version / 1000,
                 (rp->gpu.runtime_version % 1000) / 10);
        cJSON_AddStringToObject(dev, "cuda_version", v);
        snprintf(v, sizeof v, "%d.%d", rp->gpu.cc_major, rp->gpu.cc_minor);
        cJSON_AddStringToObject(dev, "compute_capability", v);
        cJSON_AddNumberToObject(dev, "sm_count", rp->gpu.sm_count);
        cJSON_AddNumberToObject(dev, "mem_bytes", (double)rp->gpu.mem_bytes);
        cJSON_AddNumberToObject(dev, "l2_bytes", (double)rp->gpu.l2_bytes);
        if (rp->gpu.peak_bw_gbs > 0)
            cJSON_AddNumberToObject(dev, "peak_bw_gbs", rp->gpu.peak_bw_gbs);
        else
            cJSON_AddNullToObject(dev, "peak_bw_gbs");
    } else {
        cJSON_AddNullToObject(dev, "driver");
        cJSON_AddNullToObject(dev, "cuda_version");
        cJSON_AddNumberToObject(dev, "n_cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
        cJSON_AddNullToObject(dev, "peak_bw_gbs");
    }
}

// The model's shape and weight types.
static void json_model(cJSON *root, const struct report *rp) {
    const struct model *m = rp->m;
    const struct model_hparams *hp = &m->hp;
    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(mo, "path", rp->model_path);
    cJSON_AddStringToObject(mo, "name", m->name ? m->name : "");
    cJSON_AddStringToObject(mo, "desc", rp->desc);
    cJSON_AddStringToObject(mo, "arch", model_arch_name(hp->arch));
    cJSON_AddNumberToObject(mo, "size_bytes", rp->size_bytes);
    cJSON_AddNumberToObject(mo, "n_params", rp->n_params);
    cJSON_AddNumberToObject(mo, "n_embd", hp->n_embd);
    cJSON_AddNumberToObject(mo, "n_layer", hp->n_layer);
    cJSON_AddNumberToObject(mo, "n_head", hp->n_head);
    cJSON_AddNumberToObject(mo, "n_head_kv", hp->n_head_kv);
    cJSON_AddNumberToObject(mo, "head_dim", hp->head_dim);
    cJSON_AddNumberToObject(mo, "n_ff", hp->n_ff);
    cJSON_AddNumberToObject(mo, "n_vocab", hp->n_vocab);
    cJSON_AddStringToObject(mo, "weight_type", ggml_type_name(m->weight_type));
    if (rp->ftype)
        cJSON_AddStringToObject(mo, "ftype", rp->ftype);
    else
        cJSON_AddNullToObject(mo, "ftype");
    cJSON *wt = cJSON_AddObjectToObject(mo, "weight_types"); // type -> tensors of that type
    for (int i = 0; i < GGML_TYPE_COUNT; i++)
        if (rp->type_count[i] > 0)
            cJSON_AddNumberToObject(wt, ggml_type_name((uint32_t)i), rp->type_count[i]);
}

// How the tests ran: batch, threads, cache types, split flags.
static void json_params(cJSON *root, const struct report *rp) {
    cJSON *pa = cJSON_AddObjectToObject(root, "params");
    cJSON_AddNumberToObject(pa, "n_batch", rp->n_batch);
    cJSON_AddNumberToObject(pa, "n_threads", rp->have_gpu ? 0 : rp->n_threads);
    cJSON_AddStringToObject(pa, "matvec_act", rp->act_q8 ? "q8" : "f32");
    cJSON_AddStringToObject(pa, "type_k", ggml_type_name(rp->type_k));
    cJSON_AddStringToObject(pa, "type_v", ggml_type_name(rp->type_v));
    cJSON_AddNumberToObject(pa, "repetitions", rp->reps);
    cJSON_AddBoolToObject(pa, "full_logits", rp->full_logits);
    cJSON_AddStringToObject(pa, "split_mode", split_mode_name(rp->am->split_mode));
    if (rp->am->devices)
        cJSON_AddStringToObject(pa, "devices", rp->am->devices);
    else
        cJSON_AddNullToObject(pa, "devices");
    if (rp->am->tensor_split)
        cJSON_AddStringToObject(pa, "tensor_split", rp->am->tensor_split);
    else
        cJSON_AddNullToObject(pa, "tensor_split");
    cJSON_AddNumberToObject(pa, "n_ubatch", rp->am->n_ubatch);
}

// One test's figures.
static cJSON *json_test(const struct report *rp, const struct test *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "test", t->name);
    cJSON_AddStringToObject(o, "kind", t->kind == TEST_PP ? "pp" : "tg");
    cJSON_AddNumberToObject(o, "n_prompt", t->kind == TEST_PP ? t->n_tokens : 0);
    cJSON_AddNumberToObject(o, "n_gen", t->kind == TEST_TG ? t->n_tokens : 0);
    cJSON_AddNumberToObject(o, "n_parallel", t->n_parallel);
    cJSON_AddNumberToObject(o, "n_depth", t->n_depth);
    cJSON_AddNumberToObject(o, "n_tokens", t->tokens);
    cJSON_AddNumberToObject(o, "avg_ts", mean_of(t->samples_ts, rp->reps));
    cJSON_AddNumberToObject(o, "stddev_ts", stddev_of(t->samples_ts, rp->reps));
    cJSON_AddItemToObject(o, "samples_ts", cJSON_CreateDoubleArray(t->samples_ts, rp->reps));
    cJSON_AddNumberToObject(o, "avg_ms", 1e3 * mean_of(t->samples_s, rp->reps));
    cJSON_AddNumberToObject(o, "stddev_ms", 1e3 * stddev_of(t->samples_s, rp->reps));
    cJSON_AddNumberToObject(o, "bytes_per_run", t->bytes);
    const double bw = test_bw_gbs(t, rp->reps);
    cJSON_AddNumberToObject(o, "bw_gbs", bw);
    if (rp->have_gpu && rp->peak_bw_gbs > 0)
        cJSON_AddNumberToObject(o, "bw_frac", bw / rp->peak_bw_gbs);
    else
        cJSON_AddNullToObject(o, "bw_frac");
    const double s = test_mean_secs(t, rp->reps);
    cJSON_AddNumberToObject(o, "tflops", s > 0 ? t->flops / s / 1e12 : 0);
    if (rp->pipe && t->have_stages)
        cJSON_AddItemToObject(o, "split", split_json(rp, t));
    else
        cJSON_AddNullToObject(o, "split");
    return o;
}

// --split-compare: each test on the split beside the single device.
static void json_scaling(cJSON *root, const struct report *rp, const struct test *tests,
                         int n_tests) {
    if (rp->split_compare) {
        cJSON *sc = cJSON_AddArrayToObject(root, "scaling");
        for (int i = 0; i < n_tests; i++) {
            const struct test *t = &tests[i];
            if (!t->have_single)
                continue;
            const double ts = mean_of(t->samples_ts, rp->reps);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "test", t->name);
            cJSON_AddStringToObject(o, "single_device", rp->single_device);
            cJSON_AddNumberToObject(o, "single_ts", t->single_ts);
            cJSON_AddNumberToObject(o, "single_stddev_ts", t->single_sd);
            cJSON_AddNumberToObject(o, "n_stages", rp->pipe ? rp->pipe->n_stages : 1);
            cJSON_AddNumberToObject(o, "split_ts", ts);
            cJSON_AddNumberToObject(o, "split_stddev_ts", stddev_of(t->samples_ts, rp->reps));
            cJSON_AddNumberToObject(o, "ratio", t->single_ts > 0 ? ts / t->single_ts : 0);
            cJSON_AddItemToArray(sc, o);
        }
    }
}

static char *report_json(const struct report *rp, const struct test *tests, int n_tests) {
    char date[32];
    iso_date(date, sizeof date);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "commit", VELA_COMMIT);
    cJSON_AddStringToObject(root, "date", date);
    cJSON_AddStringToObject(root, "backend", rp->backend);
    json_device(root, rp);
    json_model(root, rp);
    json_params(root, rp);
    if (rp->pipe)
        cJSON_AddItemToObject(root, "split", split_json(rp, NULL));
    else
        cJSON_AddNullToObject(root, "split");
    cJSON *arr = cJSON_AddArrayToObject(root, "tests");
    for (int i = 0; i < n_tests; i++)
        cJSON_AddItemToArray(arr, json_test(rp, &tests[i]));
    json_scaling(root, rp, tests, n_tests);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

// --- the command -----------------------------------------------------------------------

// The tests, in llama-bench's order: for each depth, pp first, then tg for
// each --parallel; a depth D > 0 is " @ dD" after the name. Returns how many.
static int make_tests(int n_prompt, int n_gen, const int *par, int n_par, const int *depth,
                      int n_depth, struct test *tests) {
    int n = 0;
    for (int di = 0; di < n_depth; di++) {
        char at[24] = "";
        if (depth[di] > 0)
            snprintf(at, sizeof at, " @ d%d", depth[di]);
        if (n_prompt > 0) {
            struct test *t = &tests[n++];
            *t = (struct test){
                .kind = TEST_PP, .n_tokens = n_prompt, .n_parallel = 1, .n_depth = depth[di]};
            snprintf(t->name, sizeof t->name, "pp%d%s", n_prompt, at);
        }
        for (int k = 0; n_gen > 0 && k < n_par; k++) {
            struct test *t = &tests[n++];
            *t = (struct test){
                .kind = TEST_TG, .n_tokens = n_gen, .n_parallel = par[k], .n_depth = depth[di]};
            if (par[k] == 1)
                snprintf(t->name, sizeof t->name, "tg%d%s", n_gen, at);
            else
                snprintf(t->name, sizeof t->name, "tg%d x%d%s", n_gen, par[k], at);
        }
    }
    return n;
}

// The library's configuration for the flags and a context of n_ctx cells
// (0: the model's), batches of n_batch tokens (the plan's scratch: a tg
// test's batch is --parallel) and n_out logits rows.
static void bench_config(const struct args_model *a, int n_ctx, int n_batch, int n_out,
                         struct load_config *lc, struct forward_config *cfg) {
    args_load_config(a, lc);
    args_ctx_config(a, cfg);
    cfg->n_batch = n_batch;
    cfg->n_outputs_max = n_out;
    if (n_ctx > 0)
        cfg->n_ctx = n_ctx;
}

// Loads as `vela run` does (host/split/pipeline.h): one device with the memory
// check, or the stages of a split; n_ctx / n_batch / n_out: the largest
// context, batch and logits rows of the tests.
static int bench_load(const struct args_model *a, const struct gguf_file *f, int n_ctx, int n_batch,
                      int n_out, bool quiet, struct pipeline **sm, struct verr *err) {
    struct load_config lc;
    struct forward_config cfg;
    bench_config(a, n_ctx, n_batch, n_out, &lc, &cfg);
    struct load_progress lprog;
    load_progress_init(&lprog, "vela bench", quiet || a->no_progress);
    return pipeline_load_ex(&lc, &cfg, f, load_progress_update, &lprog, sm, err);
}

// The peak bandwidth a split over GPUs can draw on: each distinct GPU's
// once; 0 when a stage is not on a GPU (no peak), -1 on error.
static double split_peak_bw(const struct pipeline *p, struct verr *err) {
    double sum = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct backend_device *d = &p->stage[s].dev;
        if (d->kind != BACKEND_DEVICE_CUDA)
            return 0;
        bool seen = false;
        for (int t = 0; t < s; t++)
            seen |= p->stage[t].dev.kind == d->kind && p->stage[t].dev.ordinal == d->ordinal;
        if (seen)
            continue;
        struct backend_device_info info;
        if (backend_cuda_device_info(d->ordinal, &info, err))
            return -1;
        if (info.peak_bw_gbs <= 0)
            return 0;
        sum += info.peak_bw_gbs;
    }
    return sum;
}

// One `vela bench`: the flags, the tests and what each step finds for the next.
struct bench {
    struct args_model am;     // the flags
    struct args_model am_one; // --split-compare's other run: everything on the main device
    int n_prompt, n_gen, reps;
    bool json, full_logits, split_compare, no_stage_times;
    struct test *tests;
    int n_tests;
    struct backend_device devs[PLAN_MAX_DEVICES];
    struct backend_device dev_one[PLAN_MAX_DEVICES]; // the resolution may list several
    int n_devs;
    // The tests' largest context, batch and logits rows: what the load's
    // memory check (and a split's plan) must allow for.
    int load_ctx, load_batch, load_out, max_depth;
    long longest; // the most positions a sequence of a test reaches
};

// The flags that need more than the parser to judge; 0 or the usage status
// (printed). Fills b's tests and devices.
static int bench_check_flags(const struct cli *c, struct bench *b) {
    const struct args_model am = b->am;
    struct verr err = {0};
    if (!am.model_path) {
        fprintf(stderr, "vela bench: no model given (-m FILE)\n");
        return 2;
    }
    tools_note_synthetic("bench", am.model_path);
    if (b->n_prompt == 0 && b->n_gen == 0) {
        fprintf(stderr, "vela bench: nothing to measure (-p 0 and -n 0)\n");
        return 2;
    }
    // The tests, in llama-bench's order: for each depth pp first, then tg for
    // each --parallel.
    static struct test tests[BENCH_MAX_DEPTHS * (1 + BENCH_MAX_PARALLEL)];
    b->tests = tests;
    b->n_tests = make_tests(b->n_prompt, b->n_gen, c->bench.par, c->bench.n_par, c->bench.depth,
                            c->bench.n_depth, tests);

    // Under mpirun the other ranks serve one forward context each
    // (host/split/mpi.h) and bench makes one per test: refuse before they load.
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    if (!np)
        np = getenv("PMI_SIZE");
    if (np && atoi(np) > 1) {
        fprintf(stderr, "vela bench: does not run under mpirun; one process drives every stage "
                        "(--devices 0,1,...)\n");
        return 2;
    }
    // Split flags the parser cannot judge alone (--split-mode row, devices
    // that do not exist, more proportions than devices) are flag errors too.
    struct backend_device *devs = b->devs;
    int n_devs = 0;
    struct load_config lc_flags;
    args_load_config(&am, &lc_flags);
    if (pipeline_resolve_devices(&lc_flags, devs, &n_devs, &err)) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        return 2;
    }
    b->n_devs = n_devs;
    b->am_one = am;
    b->am_one.split_mode = LOAD_SPLIT_NONE;
    b->am_one.tensor_split = NULL;
    if (b->split_compare) {
        const struct args_model am_one = b->am_one;
        int n_one = 0;
        if (am.split_mode != LOAD_SPLIT_LAYER || n_devs < 2) {
            fprintf(stderr, "vela bench: --split-compare needs a layer split over several devices "
                            "(--devices 0,1, or cpu,cpu to try it on the CPU)\n");
            return 2;
        }
        struct load_config lc_one;
        args_load_config(&am_one, &lc_one);
        if (pipeline_resolve_devices(&lc_one, b->dev_one, &n_one, &err)) {
            fprintf(stderr, "vela bench: --split-compare: %s\n", err.msg);
            return 2;
        }
    }
    return 0;
}

// The context, batch and logits rows the tests need at most (b's load_*).
static void bench_sizes(const struct cli *c, struct bench *b) {
    const int n_prompt = b->n_prompt, n_gen = b->n_gen;
    int max_par = 1, max_depth = 0;
    for (int k = 0; k < c->bench.n_par; k++)
        max_par = c->bench.par[k] > max_par ? c->bench.par[k] : max_par;
    for (int k = 0; k < c->bench.n_depth; k++)
        max_depth = c->bench.depth[k] > max_depth ? c->bench.depth[k] : max_depth;
    int load_ctx = b->am.n_ctx, load_batch = 1, load_out = 1;
    long longest = 0;
    if (n_prompt > 0) {
        const long need = (long)max_depth + n_prompt;
        load_ctx = need > load_ctx ? (int)(need < (1L << 30) ? need : (1L << 30)) : load_ctx;
        load_batch = b->am.n_batch < n_prompt ? b->am.n_batch : n_prompt;
        longest = need;
    }
    if (n_gen > 0) {
        const long need = (long)max_depth + (long)n_gen * max_par;
        load_ctx = need > load_ctx ? (int)(need < (1L << 30) ? need : (1L << 30)) : load_ctx;
        load_batch = max_par > load_batch ? max_par : load_batch;
        load_out = max_par;
        longest = (long)max_depth + n_gen > longest ? (long)max_depth + n_gen : longest;
    }
    if (max_depth > 0) { // the prefix is filled in batches of -b
        const int fill = b->am.n_batch < max_depth ? b->am.n_batch : max_depth;
        load_batch = fill > load_batch ? fill : load_batch;
    }
    b->load_ctx = load_ctx;
    b->load_batch = load_batch;
    b->load_out = load_out;
    b->max_depth = max_depth;
    b->longest = longest;
}

// The file's tensor types and file type into rp, and with several devices
// the layout before any load, memory aside (the load checks it with the
// tests' exact sizes): more devices than layers and the like are flag
// errors. 0, or the exit status (printed).
static int bench_plan(const struct bench *b, const struct gguf_file *f, struct report *rp,
                      struct plan *pl) {
    const struct args_model am = b->am;
    const struct backend_device *devs = b->devs;
    const int n_devs = b->n_devs, load_ctx = b->load_ctx;
    struct verr err = {0};
    for (uint64_t k = 0; k < f->n_tensors; k++)
        if ((unsigned)f->tensors[k].type < GGML_TYPE_COUNT)
            rp->type_count[f->tensors[k].type]++;
    uint32_t ftype = 0;
    if (gguf_find_key(f, "general.file_type") >= 0 &&
        gguf_get_u32(f, "general.file_type", &ftype, NULL) == 0) {
        const struct ftype_info *fi = ftype_by_id((int)ftype); // llama-bench's name
        rp->ftype = fi ? fi->desc : NULL;
    }
    *pl = (struct plan){.n_stages = 1};
    if (n_devs > 1) {
        size_t unlimited[PLAN_MAX_DEVICES];
        for (int d = 0; d < n_devs; d++)
            unlimited[d] = BACKEND_MEM_UNLIMITED;
        struct load_config lc_plan;
        struct forward_config cfg_plan;
        bench_config(&am, load_ctx, am.n_batch, 0, &lc_plan, &cfg_plan);
        int rc = pipeline_plan(&lc_plan, &cfg_plan, f, devs, n_devs, unlimited, pl, NULL, 0, &err);
        if (rc) {
            fprintf(stderr, "vela bench: %s\n", err.msg);
            return rc == VERR_RANGE ? 2 : 1;
        }
    }
    return 0;
}

// --split-compare: every test on the main device alone first (the split
// run loads afterwards, never both at once). 0, or the exit status (printed).
static int bench_single(struct bench *b, const struct gguf_file *f, const struct plan *pl,
                        struct report *rp) {
    const struct args_model am = b->am, am_one = b->am_one;
    const int reps = b->reps, load_ctx = b->load_ctx, load_batch = b->load_batch;
    const int load_out = b->load_out;
    const bool json = b->json, full_logits = b->full_logits;
    struct test *tests = b->tests;
    struct verr err = {0};
    // A plan of one stage (--tensor-split 1,0) has nothing to compare.
    if (pl->n_stages < 2) {
        fprintf(stderr, "vela bench: --split-compare: the plan puts every layer on one "
                        "device (see --tensor-split)\n");
        return 2;
    }
    backend_device_name(&b->dev_one[0], rp->single_device, sizeof rp->single_device);
    struct pipeline *sm = NULL;
    if (bench_load(&am_one, f, load_ctx, load_batch, load_out, json, &sm, &err)) {
        fprintf(stderr, "vela bench: --split-compare (%s): %s\n", rp->single_device, err.msg);
        return 1;
    }
    int status = 0;
    for (int k = 0; k < b->n_tests && !status; k++) {
        struct test one = tests[k];
        one.samples_ts = one.samples_s = NULL;
        int rc = run_test(&one, sm, &am_one, reps, full_logits, false, am.verbose, &err);
        if (!rc) {
            tests[k].have_single = true;
            tests[k].single_ts = mean_of(one.samples_ts, reps);
            tests[k].single_sd = stddev_of(one.samples_ts, reps);
        }
        free(one.samples_ts);
        free(one.samples_s);
        if (rc) {
            fprintf(stderr, "vela bench: --split-compare (%s): %s\n", rp->single_device, err.msg);
            status = 1;
        } else if (am.verbose) {
            fprintf(stderr, "vela bench: %s on %s alone: %.2f t/s\n", tests[k].name,
                    rp->single_device, tests[k].single_ts);
        }
    }
    pipeline_free(sm);
    return status;
}

// The loaded model against the tests' context: self-extend's, or the
// model's unless -c asks for more. 0, or the exit status (printed).
static int bench_check_ctx(const struct bench *b, const struct model *m) {
    const struct args_model am = b->am;
    const int load_ctx = b->load_ctx, max_depth = b->max_depth;
    struct verr err = {0};
    if (args_selfextend_check(&am, &m->hp, load_ctx, (int)b->longest, stderr, &err)) {
        if (max_depth > 0)
            fprintf(stderr, "vela bench: -d %d: %s\n", max_depth, err.msg);
        else
            fprintf(stderr, "vela bench: %s\n", err.msg);
        return 1;
    }
    // A context beyond the model's would run for minutes on text the model
    // was never trained for: only when asked for with -c (or --self-extend,
    // checked above against its extended context).
    if (am.se_g <= 1 && m->hp.n_ctx_train > 0 && load_ctx > m->hp.n_ctx_train &&
        am.n_ctx < load_ctx) {
        char dflag[48] = "", cflag[48] = "";
        if (max_depth > 0)
            snprintf(dflag, sizeof dflag, "-d %d with ", max_depth);
        if (am.n_ctx > 0)
            snprintf(cflag, sizeof cflag, " and -c %d", am.n_ctx);
        fprintf(stderr,
                "vela bench: %s-p %d / -n %d need a context of %d tokens, beyond the model's %d "
                "(its context_length)%s: pass -c %d to run them anyway\n",
                dflag, b->n_prompt, b->n_gen, load_ctx, m->hp.n_ctx_train, cflag, load_ctx);
        return 2;
    }
    return 0;
}

// The report's description of the model, the backend and the device. 0, or
// the exit status (printed).
static int bench_describe(const struct bench *b, struct pipeline *sm, struct report *rp) {
    const struct args_model *am = &b->am;
    const struct model *m = sm->stage[0].m;
    struct backend *be = sm->stage[0].be;
    struct verr err = {0};
    rp->m = m;
    rp->am = am;
    rp->pipe = sm->n_stages > 1 ? sm : NULL;
    rp->split_compare = b->split_compare;
    rp->no_stage_times = b->no_stage_times;
    model_totals(sm, &rp->size_bytes, &rp->n_params);
    rp->backend = be->ops->name;
    rp->act_q8 = be->act_q8;
    rp->n_threads = be->n_threads;
    rp->n_batch = am->n_batch;
    rp->type_k = am->type_k;
    rp->type_v = am->type_v;
    char sz[32], ty[32];
    size_label((int64_t)rp->n_params, sz, sizeof sz);
    snprintf(ty, sizeof ty, "%s", rp->ftype ? rp->ftype : ggml_type_name(m->weight_type));
    if (!rp->ftype)
        upper(ty);
    snprintf(rp->desc, sizeof rp->desc, "%s %s %s", model_arch_name(m->hp.arch), sz, ty);
    if (strcmp(be->ops->name, "cuda")) {
        cpu_name(rp->device_name, sizeof rp->device_name);
        return 0;
    }
    if (backend_cuda_device_info(be->device, &rp->gpu, &err)) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        return 1;
    }
    rp->have_gpu = true;
    snprintf(rp->device_name, sizeof rp->device_name, "%s", rp->gpu.name);
    rp->peak_bw_gbs = rp->gpu.peak_bw_gbs;
    if (sm->n_stages > 1 && (rp->peak_bw_gbs = split_peak_bw(sm, &err)) < 0) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        return 1;
    }
    return 0;
}

// Runs the tests and prints the table (row by row) or the JSON. The exit status.
static int bench_run(struct bench *b, struct pipeline *sm, const struct report *rp) {
    const struct args_model am = b->am;
    const int reps = b->reps, n_tests = b->n_tests;
    const bool json = b->json, full_logits = b->full_logits, no_stage_times = b->no_stage_times;
    struct test *tests = b->tests;
    struct verr err = {0};
    if (!json)
        print_table_header(rp);
    for (int k = 0; k < n_tests; k++) {
        if (run_test(&tests[k], sm, &am, reps, full_logits, !no_stage_times, am.verbose, &err)) {
            fprintf(stderr, "vela bench: %s\n", err.msg);
            return 1;
        }
        if (!json)
            print_table_row(rp, &tests[k]);
    }
    if (json) {
        char *text = report_json(rp, tests, n_tests);
        if (!text) {
            fprintf(stderr, "vela bench: out of memory writing JSON\n");
            return 1;
        }
        printf("%s\n", text);
        cJSON_free(text);
    } else {
        if (rp->pipe)
            print_split(rp, tests, n_tests);
        if (b->split_compare)
            print_scaling(rp, tests, n_tests);
        printf("\nbuild: %s, device: %s\n", VELA_COMMIT, rp->device_name);
    }
    return 0;
}

// The speculative flags belong to --draft, which measures no pp test and
// prints no JSON. Returns -1 to go on, or the exit status.
static int bench_check_spec(struct cli *c) {
    struct engine_spec def;
    engine_spec_default(&def);
    const struct engine_spec *sp = &c->gp.spec;
    const bool spec_flags = c->draft.model || c->draft.type_given || c->draft.ngl >= 0 ||
                            sp->n_max != def.n_max || sp->n_min != def.n_min ||
                            sp->p_min != def.p_min;
    if (!c->bench.draft && spec_flags) {
        fprintf(stderr, "vela bench: -md, -ngld, --spec-type and --draft-* need --draft\n");
        return 2;
    }
    if (!c->bench.draft)
        return -1;
    if (c->bench.json || c->bench.split_compare || c->bench.n_gen == 0 || c->bench.p_given) {
        fprintf(stderr, "vela bench: --draft measures -n tokens (not 0) after its own prompts "
                        "of real text and prints a table (no -p, --json, --split-compare)\n");
        return 2;
    }
    if (!c->am.model_path) {
        fprintf(stderr, "vela bench: no model given (-m FILE)\n");
        return 2;
    }
    return tools_spec_resolve("bench", c);
}

int cmd_bench(int argc, char **argv) {
    static struct cli c; // large: off the stack
    cli_defaults(&c);
    int status = tools_parse("bench", CLI_BENCH, usage, &c, argc, argv, 0);
    if (status >= 0 || (status = bench_check_spec(&c)) >= 0)
        return status;
    if (c.bench.draft)
        return bench_spec_run(&c);
    static struct bench bench;
    struct bench *b = &bench;
    *b = (struct bench){.am = c.am,
                        .n_prompt = c.bench.n_prompt,
                        .n_gen = c.bench.n_gen,
                        .reps = c.bench.reps,
                        .json = c.bench.json,
                        .full_logits = c.bench.full_logits,
                        .split_compare = c.bench.split_compare,
                        .no_stage_times = c.bench.no_stage_times};
    if ((status = bench_check_flags(&c, b)))
        return status;
    bench_sizes(&c, b);
    const struct args_model am = b->am;
    const int load_ctx = b->load_ctx, load_batch = b->load_batch, load_out = b->load_out;
    const bool json = b->json;
    struct verr err = {0};
    struct gguf_file *f = NULL;
    struct pipeline *sm = NULL;
    struct report rp = {
        .model_path = am.model_path, .reps = b->reps, .full_logits = b->full_logits};
    struct plan pl;
    status = 1;
    if (gguf_open(&f, am.model_path, &err)) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        goto out;
    }
    if ((status = bench_plan(b, f, &rp, &pl)) ||
        (b->split_compare && (status = bench_single(b, f, &pl, &rp))))
        goto out;
    status = 1;
    if (bench_load(&am, f, load_ctx, load_batch, load_out, json, &sm, &err)) {
        fprintf(stderr, "vela bench: %s\n", err.msg);
        goto out;
    }
    gguf_close(f);
    f = NULL;
    if ((status = bench_check_ctx(b, sm->stage[0].m)))
        goto out;
    if (am.verbose && sm->n_stages > 1)
        fprintf(stderr, "vela bench: split plan:\n%s", sm->plan_text);
    if (!(status = bench_describe(b, sm, &rp)))
        status = bench_run(b, sm, &rp);
out:
    for (int k = 0; k < b->n_tests; k++) {
        free(b->tests[k].samples_ts);
        free(b->tests[k].samples_s);
    }
    pipeline_free(sm);
    gguf_close(f);
    return status;
}
