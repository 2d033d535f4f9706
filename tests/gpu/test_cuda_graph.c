// Decode steps recorded into CUDA graphs and replayed (host/forward/forward.c,
// "graphs") against the same steps run op by op: two sequences decoding
// token by token (steps of 2 and 1 tokens) from short prompts across several
// BACKEND_KV_BUCKET windows of n_kv, with a context shift of each sequence on
// the way (a pending K shift applied eagerly before a replay, cells freed in
// the middle of the window and reused). Logits, argmax ids and sampled ids
// must be bit-identical with graphs on and off: the replayed kernels are the
// eager ones with the same arguments except n_kv, and attention's result does
// not depend on n_kv within a bucket (host/ops/backend.h). The same again with K
// cached unrotated and each sequence attending with its own exact
// self-extend G and W (forward_batch.se, uploaded before every replay).
// Programmatic dependent launch (backend_cuda_set_pdl, cuda/launch.cuh) must
// not change a bit either: with graphs on, the script with PDL on against
// the same script with it off. The environment's variant picks (VELA_PDL,
// VELA_MATVEC_Q8, VELA_MATVEC_F16) are checked against the setters.
// Skips itself without a CUDA device.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/backend_cuda.h" // backend_cuda_set_pdl, a variant under test
#include "cuda/matvec.h"       // CUDA_MV_STREAM
#include "cuda/matvec_q8.h"    // CUDA_MVQ_PIPE, CUDA_MVQ_STREAM
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "tests/context_helpers.h"
#include "tests/tiny_model.h"
#ifdef VELA_EMU
#include <cuda_runtime_api.h> // the emulator's emu_pdl_launches, emu_kernel_runs
#endif

#define N_STEPS 480
#define MAX_ROWS (N_STEPS * 2 + 2)

enum mode { MODE_LOGITS, MODE_ARGMAX, MODE_SAMPLE };

struct result {
    float *logits; // [MAX_ROWS][n_vocab] (MODE_LOGITS)
    int32_t *ids;  // [MAX_ROWS] (MODE_ARGMAX, MODE_SAMPLE)
    int n_rows;
    struct forward_graph_stats st;
};

// Every row of the batch as mode says (SAMPLE rows with sp [rows]).
static void decode_or_die(struct context *c, enum mode mode, const struct forward_batch *b,
                          const struct sample_params *sp, struct context_result *res) {
    struct verr err = {0};
    static const enum forward_row how[] = {
        [MODE_LOGITS] = FORWARD_ROW_LOGITS,
        [MODE_ARGMAX] = FORWARD_ROW_ARGMAX,
        [MODE_SAMPLE] = FORWARD_ROW_SAMPLE,
    };
    int rc = test_ctx_decode_all(c, b, how[mode], mode == MODE_SAMPLE ? sp : NULL, res, &err);
    cr_assert_eq(rc, 0, "decode: %s", err.msg);
}

static void keep_outputs(const struct context_result *res, enum mode mode, struct result *r) {
    const int V = res->n_vocab;
    for (int o = 0; o < res->n_rows; o++) {
        cr_assert_lt(r->n_rows, MAX_ROWS);
        if (mode == MODE_LOGITS)
            memcpy(r->logits + (size_t)r->n_rows * V, context_row_logits(res, o),
                   sizeof(float) * V);
        else
            r->ids[r->n_rows] = res->ids[o];
        r->n_rows++;
    }
}

// se: NULL (the default rotated cache), or each sequence's (G, W) on an
// unrotated cache.
static void run_script(struct model *m, bool graphs, enum mode mode, const int (*se)[2],
                       struct result *r) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 1024; // buckets of 256: four windows
    cfg.n_batch = 64;
    cfg.n_seq_max = 2;
    cfg.no_graph = !graphs;
    cfg.k_unrotated = se != NULL;
    struct context *c;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&c, m, &cfg, &err), 0, "%s", err.msg);
    const struct forward_ctx *fc = context_stage(c, 0); // the one stage: its cache and graphs
    cr_assert_eq(fc->graphs_on, graphs, "graphs_on %d", fc->graphs_on);
    const int V = m->hp.n_vocab;
    r->n_rows = 0;

    // prompts (more than FORWARD_GRAPH_MAX_TOK tokens: always eager)
    int32_t n_past[2] = {0, 0}, last[2] = {0, 0};
    static const int plen[2] = {24, 40};
    for (int s = 0; s < 2; s++) {
        int32_t tok[64], pos[64], seq[64], bse[128];
        for (int t = 0; t < plen[s]; t++) {
            tok[t] = (t * 11 + 3 + s * 17) % V;
            pos[t] = t;
            seq[t] = s;
            bse[2 * t] = se ? se[s][0] : 0;
            bse[2 * t + 1] = se ? se[s][1] : 0;
        }
        struct forward_batch b = {plen[s], tok, pos, seq, NULL, se ? bse : NULL};
        struct sample_params sp = {
            .temp = 0.9f, .top_k = 20, .top_p = 0.95f, .min_p = 0.02f, .u = 0.5};
        struct context_result res;
        decode_or_die(c, mode, &b, &sp, &res);
        keep_outputs(&res, mode, r);
        last[s] = mode == MODE_LOGITS ? tok[plen[s] - 1] : res.ids[0];
        n_past[s] = plen[s];
    }

    for (int step = 0; step < N_STEPS; step++) {
        if (step == 150 || step == 300) { // llama-cli's context shift, one sequence at a time
            const int s = step == 150 ? 0 : 1;
            int32_t discard = 0;
            cr_assert_eq(test_ctx_shift(c, s, 4, n_past[s], &discard, &err), 0, "%s", err.msg);
            n_past[s] -= discard;
        }
        int32_t tok[2], pos[2], seq[2], bse[4];
        int n = 0;
        for (int s = 0; s < 2; s++) {
            if (s == 0 && step % 7 == 3)
                continue; // a step of seq 1 alone: another graph shape
            tok[n] = mode == MODE_LOGITS ? (step * 7 + s * 13 + 5) % V : last[s];
            pos[n] = n_past[s];
            seq[n] = s;
            bse[2 * n] = se ? se[s][0] : 0;
            bse[2 * n + 1] = se ? se[s][1] : 0;
            n++;
        }
        const int8_t want[2] = {1, 1};
        struct sample_params sp[2];
        for (int i = 0; i < 2; i++)
            sp[i] = (struct sample_params){.temp = 0.9f,
                                           .top_k = 20,
                                           .top_p = 0.95f,
                                           .min_p = 0.02f,
                                           .u = (double)((step * 37 + i * 11) % 97) / 97.0};
        struct forward_batch b = {n, tok, pos, seq, want, se ? bse : NULL};
        struct context_result res;
        decode_or_die(c, mode, &b, sp, &res);
        keep_outputs(&res, mode, r);
        for (int i = 0; i < n; i++) {
            if (mode != MODE_LOGITS)
                last[seq[i]] = res.ids[i];
            n_past[seq[i]]++;
        }
    }
    cr_log_info("graphs %s, mode %d: n_kv %d at the end; %lld recorded, %lld replays, %lld eager "
                "graph-eligible steps, %d live",
                graphs ? "on" : "off", (int)mode, kv_n_kv(&fc->kv),
                (long long)fc->graph_stats.recorded, (long long)fc->graph_stats.replays,
                (long long)fc->graph_stats.eager, fc->graph_stats.live);
    cr_assert_gt(kv_n_kv(&fc->kv), 2 * BACKEND_KV_BUCKET, "the script must cross several buckets");
    r->st = context_graph_stats(c);
    context_free(c);
}

// A tiny llama (every matrix of wtype) on the CUDA backend and the results
// of two runs of the script, on and off.
struct rig {
    char path[128];
    struct tiny_weights w;
    struct backend *gpu;
    struct model *m;
    struct result on, off;
};

static void rig_open(struct rig *g, const char *tag, enum ggml_type wtype) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    tiny_temp_path(g->path, sizeof g->path, tag);
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.n_ctx_train = 1024;
    c.wtype = wtype;
    struct verr err = {0};
    cr_assert_eq(tiny_write(&c, g->path, &g->w, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(&g->gpu, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&g->m, g->path, g->gpu, &err), 0, "%s", err.msg);
    const int V = g->m->hp.n_vocab;
    g->on = g->off = (struct result){0};
    g->on.logits = malloc(sizeof(float) * MAX_ROWS * V);
    g->off.logits = malloc(sizeof(float) * MAX_ROWS * V);
    g->on.ids = malloc(sizeof(int32_t) * MAX_ROWS);
    g->off.ids = malloc(sizeof(int32_t) * MAX_ROWS);
    cr_assert(g->on.logits && g->off.logits && g->on.ids && g->off.ids);
}

// on and off bit-identical: the same kernels on the same inputs (see the top
// comment); what: what differs between them.
static void rig_expect_identical(const struct rig *g, enum mode mode, const char *what) {
    const int V = g->m->hp.n_vocab;
    cr_assert_eq(g->on.n_rows, g->off.n_rows);
    for (int r = 0; r < g->on.n_rows; r++) {
        if (mode == MODE_LOGITS)
            cr_assert_eq(memcmp(g->on.logits + (size_t)r * V, g->off.logits + (size_t)r * V,
                                sizeof(float) * V),
                         0, "logits row %d differ with %s on and off", r, what);
        else
            cr_assert_eq(g->on.ids[r], g->off.ids[r], "row %d: id %d with %s, %d without", r,
                         g->on.ids[r], what, g->off.ids[r]);
    }
}

static void rig_close(struct rig *g) {
    free(g->on.logits);
    free(g->off.logits);
    free(g->on.ids);
    free(g->off.ids);
    model_free(g->m);
    backend_destroy(g->gpu);
    tiny_weights_free(&g->w);
    unlink(g->path);
}

static void compare_modes(enum mode mode, const int (*se)[2]) {
    struct rig g;
    rig_open(&g, "cugraph", GGML_TYPE_F32);
    run_script(g.m, false, mode, se, &g.off);
    run_script(g.m, true, mode, se, &g.on);
    rig_expect_identical(&g, mode, "graphs");
    cr_assert_eq(g.off.st.recorded, 0);
    cr_assert_eq(g.off.st.replays, 0);
    // most steps replay; the graphs are one per (shape, bucket) plus
    // re-recordings after the scratch grew: a handful, never one per step
    cr_assert_gt(g.on.st.replays, N_STEPS * 3 / 4, "%lld replays", (long long)g.on.st.replays);
    cr_assert_leq(g.on.st.recorded, 24, "%lld graphs recorded", (long long)g.on.st.recorded);
    cr_assert_leq(g.on.st.live, FORWARD_GRAPH_CACHE);
    rig_close(&g);
}

Test(cuda_graph, logits_on_off_identical) {
    compare_modes(MODE_LOGITS, NULL);
}

Test(cuda_graph, argmax_on_off_identical) {
    compare_modes(MODE_ARGMAX, NULL);
}

Test(cuda_graph, sample_on_off_identical) {
    compare_modes(MODE_SAMPLE, NULL);
}

// The two sequences' steps mix (4, 16) and (2, 40) rows in one attention.
Test(cuda_graph, self_extend_per_sequence_on_off_identical) {
    static const int se[2][2] = {{4, 16}, {2, 40}};
    compare_modes(MODE_LOGITS, se);
}

// The tiny model at path loaded on gpu (*m) and a context of 64 cells on it.
static struct context *tiny_ctx(struct backend *gpu, const char *path, struct model **m) {
    struct verr err = {0};
    cr_assert_eq(model_load_file(m, path, gpu, &err), 0, "%s", err.msg);
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    struct context *ctx;
    cr_assert_eq(test_ctx_wrap(&ctx, *m, &cfg, &err), 0, "%s", err.msg);
    return ctx;
}

Test(cuda_graph, env_turns_graphs_off) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    char path[128];
    tiny_temp_path(path, sizeof path, "cugraphenv");
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    struct backend *gpu;
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    struct model *m;
    struct context *ctx = tiny_ctx(gpu, path, &m);
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cr_expect(context_stage(ctx, 0)->graphs_on, "graphs are on by default on the CUDA backend");
    context_free(ctx);
    setenv("VELA_NO_CUDA_GRAPH", "1", 1);
    cr_assert_eq(test_ctx_wrap(&ctx, m, &cfg, &err), 0, "%s", err.msg);
    unsetenv("VELA_NO_CUDA_GRAPH");
    cr_expect(!context_stage(ctx, 0)->graphs_on, "VELA_NO_CUDA_GRAPH=1 turns graphs off");
    context_free(ctx);
    model_free(m);
    backend_destroy(gpu);
    tiny_weights_free(&w);
    unlink(path);
}

// The decode chain with PDL on and off, graphs on both times: wtype Q8_0
// runs the act_q8 chain (rms_norm_q8, the q8_1 quantize, the dp4a mat-vecs),
// F32 the f32 mat-vec; both the norm, RoPE/KV store and (MODE_ARGMAX) argmax.
static void compare_pdl(enum ggml_type wtype, enum mode mode) {
    struct rig g;
    rig_open(&g, "cugraphpdl", wtype);
    run_script(g.m, true, mode, NULL, &g.off);
    struct verr err = {0};
    const int rc = backend_cuda_set_pdl(g.gpu, 1, &err);
    if (rc == VERR_UNSUPPORTED)
        cr_skip_test("%s", err.msg); // a device below compute capability 9.0
    cr_assert_eq(rc, 0, "%s", err.msg);
#ifdef VELA_EMU
    const unsigned long long pdl0 = emu_pdl_launches();
#endif
    run_script(g.m, true, mode, NULL, &g.on);
#ifdef VELA_EMU
    // graphs are recorded with PDL on: their launches carry the attribute
    cr_assert_gt(emu_pdl_launches(), pdl0, "no launch with PDL");
    cr_log_info("%s: %llu launches with PDL", ggml_type_name(wtype), emu_pdl_launches() - pdl0);
#endif
    rig_expect_identical(&g, mode, "PDL");
    cr_assert_gt(g.on.st.replays, N_STEPS * 3 / 4, "%lld replays", (long long)g.on.st.replays);
    rig_close(&g);
}

Test(cuda_graph, pdl_on_off_identical_q8_0_logits) {
    compare_pdl(GGML_TYPE_Q8_0, MODE_LOGITS);
}

Test(cuda_graph, pdl_on_off_identical_f32_argmax) {
    compare_pdl(GGML_TYPE_F32, MODE_ARGMAX);
}

// VELA_PDL (read by backend_cuda_create): "1" turns PDL on (on devices of
// compute capability 9.0 and up; the emulator's is 9.0), "0" or unset leaves
// it off, anything else is refused with what was expected.
Test(cuda_graph, vela_pdl_env) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    struct verr err = {0};
    struct backend *gpu = NULL;
    static const char *bad[] = {"2", "on", "yes", "1 ", "-1", "01"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("VELA_PDL", bad[i], 1);
        err = (struct verr){0};
        cr_expect_eq(backend_cuda_create(&gpu, 0, &err), VERR_RANGE, "VELA_PDL=%s accepted",
                     bad[i]);
        cr_expect_null(gpu);
        cr_expect(strstr(err.msg, "VELA_PDL=") && strstr(err.msg, "expected 0 or 1"),
                  "VELA_PDL=%s: message '%s'", bad[i], err.msg);
    }
    char path[128];
    tiny_temp_path(path, sizeof path, "cugraphpdlenv");
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    struct tiny_weights w;
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    static const char *good[] = {"0", "", "1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("VELA_PDL", good[i], 1);
        cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "VELA_PDL=%s: %s", good[i], err.msg);
        // one decode step: its launches carry PDL with "1" only
        struct model *m;
        struct context *ctx = tiny_ctx(gpu, path, &m);
        int32_t tok = 3, pos = 0, seq = 0;
        struct forward_batch b = {1, &tok, &pos, &seq, NULL, NULL};
        struct context_result res;
#ifdef VELA_EMU
        const unsigned long long pdl0 = emu_pdl_launches();
#endif
        decode_or_die(ctx, MODE_ARGMAX, &b, NULL, &res);
#ifdef VELA_EMU
        const unsigned long long n_pdl = emu_pdl_launches() - pdl0;
        if (!strcmp(good[i], "1"))
            cr_expect_gt(n_pdl, 0, "VELA_PDL=1: no launch with PDL");
        else
            cr_expect_eq(n_pdl, 0, "VELA_PDL=%s: %llu launches with PDL", good[i], n_pdl);
#endif
        context_free(ctx);
        model_free(m);
        backend_destroy(gpu);
    }
    unsetenv("VELA_PDL");
    tiny_weights_free(&w);
    unlink(path);
    // backend_cuda_set_pdl refuses what is not 0 or 1
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    cr_expect_eq(backend_cuda_set_pdl(gpu, 2, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "expected 0 (off) or 1 (on)"), "%s", err.msg);
    backend_destroy(gpu);
}

// The logits of a short decode (a 4-token prompt, then 3 steps of one token)
// of the tiny model at path on gpu, into out [7][n_vocab] (every row the
// decode returns); returns the number of rows.
static int short_decode(struct backend *gpu, const char *path, float *out) {
    struct model *m;
    struct context *ctx = tiny_ctx(gpu, path, &m);
    const int V = m->hp.n_vocab;
    int32_t tok[4] = {3, 7, 11, 5}, pos[4] = {0, 1, 2, 3}, seq[4] = {0, 0, 0, 0};
    int rows = 0;
    for (int step = 0; step < 4; step++) {
        const int n = step == 0 ? 4 : 1;
        int32_t t1 = (step * 5 + 2) % V, p1 = 3 + step;
        struct forward_batch b = {n, step == 0 ? tok : &t1, step == 0 ? pos : &p1, seq, NULL, NULL};
        struct context_result res;
        decode_or_die(ctx, MODE_LOGITS, &b, NULL, &res);
        for (int o = 0; o < res.n_rows; o++) {
            cr_assert_lt(rows, 7);
            memcpy(out + (size_t)rows++ * V, context_row_logits(&res, o), sizeof(float) * V);
        }
    }
    cr_assert_geq(rows, 4, "a row per step at least");
    context_free(ctx);
    model_free(m);
    return rows;
}

// VELA_MATVEC_Q8 / VELA_MATVEC_F16 (read by backend_cuda_create, for `vela
// bench` runs of a variant): a value picks the kernel as the setters do, bit
// for bit the same logits (and, emulated, the streaming kernels run); unset
// or empty is the default kernel; anything else is refused, naming what was
// expected.
static void check_matvec_env(enum ggml_type wtype, const char *var, const char *value, int kernel,
                             int blocks, const char *kernel_name) {
    char path[128];
    tiny_temp_path(path, sizeof path, "cugraphmvenv");
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.wtype = wtype;
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    const size_t n = (size_t)7 * c.n_vocab;
    float *by_env = malloc(n * sizeof(float)), *by_set = malloc(n * sizeof(float));
    float *plain = malloc(n * sizeof(float));
    cr_assert(by_env && by_set && plain);
    struct backend *gpu;
    setenv(var, value, 1);
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s=%s: %s", var, value, err.msg);
    unsetenv(var);
#ifdef VELA_EMU
    const unsigned long long runs0 = emu_kernel_runs(kernel_name);
#endif
    const int rows = short_decode(gpu, path, by_env);
#ifdef VELA_EMU
    const unsigned long long runs = emu_kernel_runs(kernel_name) - runs0;
    cr_log_info("%s=%s: %llu runs of %s", var, value, runs, kernel_name);
    cr_expect_gt(runs, 0, "%s=%s: %s never ran", var, value, kernel_name);
#else
    (void)kernel_name;
#endif
    backend_destroy(gpu);

    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(short_decode(gpu, path, plain), rows);
    const int rc = !strcmp(var, "VELA_MATVEC_Q8")
                       ? backend_cuda_set_matvec_q8(gpu, kernel, blocks, &err)
                       : backend_cuda_set_matvec_f16(gpu, kernel, blocks, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(short_decode(gpu, path, by_set), rows);
    backend_destroy(gpu);
    const size_t n_out = (size_t)rows * c.n_vocab;
    cr_expect_eq(memcmp(by_env, by_set, n_out * sizeof(float)), 0,
                 "%s=%s and the setter give different logits", var, value);
    size_t differ = 0;
    for (size_t i = 0; i < n_out; i++)
        differ += memcmp(&by_env[i], &plain[i], sizeof(float)) != 0;
    cr_log_info("%s=%s: %zu of %zu logits differ from the default kernel's", var, value, differ,
                n_out);
    free(by_env);
    free(by_set);
    free(plain);
    tiny_weights_free(&w);
    unlink(path);
}

Test(cuda_graph, vela_matvec_env) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    static const struct {
        const char *var, *value;
    } bad[] = {
        {"VELA_MATVEC_Q8", "streams"}, {"VELA_MATVEC_Q8", "stream:0"},
        {"VELA_MATVEC_Q8", "pipe:65"}, {"VELA_MATVEC_Q8", "pipe:"},
        {"VELA_MATVEC_Q8", "pass:2"},  {"VELA_MATVEC_Q8", "stream:4x"},
        {"VELA_MATVEC_F16", "pipe"},   {"VELA_MATVEC_F16", "stream:-1"},
        {"VELA_MATVEC_F16", "1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(bad[i].var, bad[i].value, 1);
        struct verr err = {0};
        struct backend *gpu = NULL;
        cr_expect_eq(backend_cuda_create(&gpu, 0, &err), VERR_RANGE, "%s=%s accepted", bad[i].var,
                     bad[i].value);
        cr_expect_null(gpu);
        cr_expect(strstr(err.msg, bad[i].var) && strstr(err.msg, "expected pass"), "%s=%s: '%s'",
                  bad[i].var, bad[i].value, err.msg);
        unsetenv(bad[i].var);
    }
    check_matvec_env(GGML_TYPE_Q8_0, "VELA_MATVEC_Q8", "stream:4", CUDA_MVQ_STREAM, 4,
                     "matvec_q8_stream_kernel");
    check_matvec_env(GGML_TYPE_Q8_0, "VELA_MATVEC_Q8", "pipe", CUDA_MVQ_PIPE, 0,
                     "matvec_q8_pipe_kernel");
    check_matvec_env(GGML_TYPE_F16, "VELA_MATVEC_F16", "stream:2", CUDA_MV_STREAM, 2,
                     "matvec_stream_kernel");
}
