// A model split by layers into stages on one device (--devices cpu,cpu,...)
// through the in-process transport, against the same model on one backend:
// every decode's logits, with micro-batches of several sizes, after KV
// sequence ops (copy, remove, shift, divide), context shift and self-extend,
// and `vela eval --devices cpu,cpu` end to end. Bad input: more stages than
// layers, devices that do not exist, bad proportions, --split-mode row.
//
// Tolerance: 0, bit for bit. Each stage runs the very same CPU ops on the
// very same rows as the single backend does (a token's row of every matmul,
// norm and attention is computed alone, whatever else is in the batch), and
// the transport copies floats without converting them. Any difference is a
// bug in the split (a layer twice or never, a stale cache cell), not rounding.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "host/forward/forward.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"
#include "tests/args_config.h"
#include "tests/pipeline_helpers.h"
#include "tiny_model.h"
#include "tools/args.h"

static struct tiny_cfg cfg;
static struct tiny_weights weights;
static char model_path[128];

static void setup(void) {
    tiny_cfg_default(&cfg, "llama");
    cfg.n_layer = 4;
    cfg.vocab = true;
    cfg.n_vocab = 300;
    cfg.n_ctx_train = 64;
    tiny_temp_path(model_path, sizeof model_path, "pipe");
    struct verr err = {0};
    cr_assert_eq(tiny_write(&cfg, model_path, &weights, &err), 0, "%s", err.msg);
}

static void teardown(void) {
    tiny_weights_free(&weights);
    unlink(model_path);
}

TestSuite(pipeline, .init = setup, .fini = teardown);

// struct run, run_load, close_run, decode_seq and kv_script: tests/pipeline_helpers.h.

// devices NULL: the model on one CPU backend (model_load, the reference).
static int open_run(struct run *r, const char *devices, const char *split, int n_ubatch,
                    struct verr *err) {
    struct args_model a;
    args_model_default(&a);
    a.backend = LOAD_BACKEND_CPU;
    a.n_threads = 2;
    a.devices = devices;
    a.tensor_split = split;
    a.n_ubatch = n_ubatch;
    a.n_ctx = 64;
    a.n_batch = 8;
    a.type_k = a.type_v = GGML_TYPE_F32;
    return run_load(r, &a, model_path, err);
}

static void assert_same(const float *a, const float *b, size_t n, const char *what) {
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
    cr_assert_eq(worst, 0.0, "%s: worst logit difference %g (must be bit-identical)", what, worst);
}

Test(pipeline, stages_give_the_same_logits) {
    const int n = 21, V = cfg.n_vocab;
    struct run ref;
    struct verr err = {0};
    cr_assert_eq(open_run(&ref, NULL, NULL, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(ref.p->n_stages, 1);
    cr_assert_null(context_describe(ref.c));
    float *want = decode_seq(&ref, 0, 0, n, 8, 0);
    close_run(&ref);

    const char *devs[] = {"cpu,cpu", "cpu,cpu,cpu", "cpu,cpu,cpu,cpu"};
    const int ubs[] = {0, 1, 3, 8};
    for (size_t d = 0; d < 3; d++) {
        for (size_t u = 0; u < 4; u++) {
            struct run r;
            cr_assert_eq(open_run(&r, devs[d], NULL, ubs[u], &err), 0, "%s: %s", devs[d], err.msg);
            cr_assert_gt(r.p->n_stages, 1, "%s: not split", devs[d]);
            cr_assert_eq(r.p->n_stages, (int)d + 2);
            cr_assert_not_null(context_describe(r.c));
            float *got = decode_seq(&r, 0, 0, n, 8, 0);
            char what[64];
            snprintf(what, sizeof what, "--devices %s -ub %d", devs[d], ubs[u]);
            assert_same(got, want, (size_t)n * V, what);
            free(got);
            close_run(&r);
        }
    }
    free(want);
}

Test(pipeline, tensor_split_sets_the_ranges) {
    struct run r;
    struct verr err = {0};
    cr_assert_eq(open_run(&r, "cpu,cpu", "3,1", 0, &err), 0, "%s", err.msg);
    const struct pipeline *p = r.p;
    cr_assert_eq(p->n_stages, 2);
    cr_assert_eq(p->stage[0].l0, 0);
    cr_assert_eq(p->stage[0].l1, 3);
    cr_assert_eq(p->stage[1].l0, 3);
    cr_assert_eq(p->stage[1].l1, 4);
    // Each stage holds its own layers and cache only.
    cr_assert_eq(r.m->layer_begin, 0);
    cr_assert_eq(r.m->layer_end, 3);
    cr_assert_eq(context_stage(r.c, 0)->kv.cfg.n_layer, 3);
    cr_assert_null(r.m->output_norm, "the head is on the last stage");
    cr_assert_not_null(p->stage[1].m->output_norm);
    cr_assert_null(p->stage[1].m->layers[0].attn_norm, "layer 0 is not loaded on stage 1");
    cr_assert(strstr(context_describe(r.c), "layers 0-2 (3) +embed"), "%s", context_describe(r.c));
    close_run(&r);

    // "1,0": one device holds everything: a pipeline of one stage, no split.
    cr_assert_eq(open_run(&r, "cpu,cpu", "1,0", 0, &err), 0, "%s", err.msg);
    cr_assert_eq(r.p->n_stages, 1);
    cr_assert_null(context_describe(r.c));
    close_run(&r);
}

Test(pipeline, kv_ops_reach_every_stage) {
    const int V = cfg.n_vocab;
    struct run ref, r;
    struct verr err = {0};
    float *w1, *w2, *g1, *g2;
    cr_assert_eq(open_run(&ref, NULL, NULL, 0, &err), 0, "%s", err.msg);
    kv_script(&ref, &w1, &w2);
    close_run(&ref);
    cr_assert_eq(open_run(&r, "cpu,cpu,cpu", NULL, 2, &err), 0, "%s", err.msg);
    kv_script(&r, &g1, &g2);
    // Every stage's cache holds the front's cells.
    cr_assert_eq(r.p->n_stages, 3);
    for (int s = 1; s < r.p->n_stages; s++) {
        const struct kv_cache *k0 = &context_stage(r.c, 0)->kv, *ks = &context_stage(r.c, s)->kv;
        cr_assert_eq(ks->used, k0->used);
        cr_assert_eq(memcmp(ks->pos, k0->pos, sizeof(int32_t) * k0->cfg.n_ctx), 0);
    }
    close_run(&r);
    assert_same(g1, w1, (size_t)10 * V, "after seq cp / rm / add / div");
    assert_same(g2, w2, (size_t)27 * V, "context shift and self-extend");
    free(w1);
    free(w2);
    free(g1);
    free(g2);
}

Test(pipeline, per_stage_time_hook) {
    struct run r;
    struct verr err = {0};
    cr_assert_eq(open_run(&r, "cpu,cpu", NULL, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(r.p->n_stages, 2);
    r.p->timing = true;
    free(decode_seq(&r, 0, 0, 8, 8, 0));
    for (int s = 0; s < 2; s++)
        cr_assert_gt(r.p->stage_ms[s], 0.0, "stage %d", s);
    cr_assert_eq(r.p->n_decodes, 1);
    close_run(&r);
}

Test(pipeline, bad_input) {
    struct run r;
    struct verr err = {0};
    cr_assert_eq(open_run(&r, "cpu,cpu,cpu,cpu,cpu", NULL, 0, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "5 stages for a model of 4 layers"), "%s", err.msg);

    cr_assert_neq(open_run(&r, "cpu,7", NULL, 0, &err), 0);
    cr_assert(strstr(err.msg, "--devices") && strstr(err.msg, "7"), "%s", err.msg);

    cr_assert_eq(open_run(&r, "cpu,cpu,cpu", "1,1,1,1", 0, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "4 proportions for 3 devices"), "%s", err.msg);

    struct args_model a;
    args_model_default(&a);
    a.split_mode = LOAD_SPLIT_ROW;
    struct backend_device d[4];
    int n = 0;
    cr_assert_eq(pipeline_resolve_devices(lc_of(&a), d, &n, &err), VERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "row"), "%s", err.msg);

    // --split-mode none keeps one device (--main-gpu indexes --devices).
    a.split_mode = LOAD_SPLIT_NONE;
    a.devices = "cpu,cpu";
    a.device = 1;
    cr_assert_eq(pipeline_resolve_devices(lc_of(&a), d, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 1);
    a.device = 2;
    cr_assert_eq(pipeline_resolve_devices(lc_of(&a), d, &n, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "--main-gpu 2"), "%s", err.msg);
}

// --- the command line ---------------------------------------------------------

static int run_vela(const char *args, char **errs) {
    const char *bin = getenv("VELA_BIN") ? getenv("VELA_BIN") : "./vela";
    char e[64], cmd[4096];
    tiny_temp_path(e, sizeof e, "err");
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", bin, args, e);
    int st = system(cmd);
    FILE *f = fopen(e, "rb");
    *errs = calloc(1, 1 << 16);
    if (f) {
        size_t n = fread(*errs, 1, (1 << 16) - 1, f);
        (*errs)[n] = 0;
        fclose(f);
    }
    unlink(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void *read_all(const char *path, size_t *n) {
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "%s", path);
    *n = (size_t)sb.st_size;
    void *buf = malloc(*n + 1);
    FILE *f = fopen(path, "rb");
    cr_assert_eq(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

Test(pipeline, vela_eval_devices_cpu_cpu) {
    char l1[128], l2[128], args[1024], *errs;
    tiny_temp_path(l1, sizeof l1, "one");
    tiny_temp_path(l2, sizeof l2, "two");
    const char *toks = "1,5,9,33,70,2,8,100,250,7,7,3,42";
    snprintf(args, sizeof args, "eval -m %s --backend cpu --tokens %s -b 5 --logits-out %s",
             model_path, toks, l1);
    cr_assert_eq(run_vela(args, &errs), 0, "%s", errs);
    free(errs);
    snprintf(args, sizeof args,
             "eval -m %s --backend cpu --tokens %s -b 5 --logits-out %s --devices cpu,cpu",
             model_path, toks, l2);
    cr_assert_eq(run_vela(args, &errs), 0, "%s", errs);
    free(errs);
    size_t n1, n2;
    float *a = read_all(l1, &n1), *b = read_all(l2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(n1, sizeof(float) * 13 * cfg.n_vocab);
    assert_same(b, a, n1 / sizeof(float), "vela eval --devices cpu,cpu");
    free(a);
    free(b);
    unlink(l1);
    unlink(l2);

    // Bad flags: usage errors naming the flag.
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2 --tensor-split 1,x", model_path);
    cr_assert_eq(run_vela(args, &errs), 2);
    cr_assert(strstr(errs, "--tensor-split"), "%s", errs);
    free(errs);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2 --devices gpu0", model_path);
    cr_assert_eq(run_vela(args, &errs), 2);
    cr_assert(strstr(errs, "--devices"), "%s", errs);
    free(errs);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2 --devices cpu,cpu,cpu,cpu,cpu",
             model_path);
    cr_assert_neq(run_vela(args, &errs), 0);
    cr_assert(strstr(errs, "5 stages for a model of 4 layers"), "%s", errs);
    free(errs);
}

// Two and three processes, one stage each (mpirun, host/split/mpi.c; CPU ranks talk
// over the MPI transport): the same logits file as one process.
Test(pipeline, mpirun_ranks_give_the_same_logits) {
#ifndef VELA_HAVE_MPI
    cr_skip_test("built without MPI");
#else
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        cr_skip_test("mpirun not found");
    char l1[128], l2[128], args[1024], *errs;
    tiny_temp_path(l1, sizeof l1, "one");
    tiny_temp_path(l2, sizeof l2, "mpi");
    const char *toks = "1,5,9,33,70,2,8,100,250,7,7,3,42";
    snprintf(args, sizeof args, "eval -m %s --backend cpu -t 1 --tokens %s -b 5 --logits-out %s",
             model_path, toks, l1);
    cr_assert_eq(run_vela(args, &errs), 0, "%s", errs);
    free(errs);
    size_t n1;
    float *a = read_all(l1, &n1);
    const char *bin = getenv("VELA_BIN") ? getenv("VELA_BIN") : "./vela";
    for (int np = 2; np <= 3; np++) {
        char cmd[2048], e[64];
        tiny_temp_path(e, sizeof e, "mpierr");
        snprintf(cmd, sizeof cmd,
                 "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpirun "
                 "--oversubscribe -np %d %s eval -m %s --backend cpu -t 1 --tokens %s -b 5 "
                 "--logits-out %s >/dev/null 2>%s",
                 np, bin, model_path, toks, l2, e);
        int st = system(cmd);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            FILE *f = fopen(e, "rb");
            char msg[2048] = "";
            if (f) {
                msg[fread(msg, 1, sizeof msg - 1, f)] = 0;
                fclose(f);
            }
            unlink(e);
            cr_assert_fail("mpirun -np %d failed: %s", np, msg);
        }
        unlink(e);
        size_t n2;
        float *b = read_all(l2, &n2);
        cr_assert_eq(n1, n2);
        char what[64];
        snprintf(what, sizeof what, "mpirun -np %d", np);
        assert_same(b, a, n1 / sizeof(float), what);
        free(b);
        unlink(l2);
    }
    free(a);
    unlink(l1);
#endif
}

// The plan from a real file: its byte counts are what the stages load, and
// too little free memory is refused before anything is allocated.
Test(pipeline, plan_from_the_file) {
    struct args_model a;
    args_model_default(&a);
    a.n_ctx = 64;
    a.n_batch = 8;
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&f, model_path, &err), 0, "%s", err.msg);
    struct backend_device d[2] = {{BACKEND_DEVICE_CPU, 0}, {BACKEND_DEVICE_CPU, 0}};
    size_t unl[2] = {BACKEND_MEM_UNLIMITED, BACKEND_MEM_UNLIMITED};
    struct plan p;
    char text[1024];
    cr_assert_eq(pipeline_plan(lc_of(&a), ctx_of(&a, 0), f, d, 2, unl, &p, text, sizeof text, &err),
                 0, "%s", err.msg);
    cr_assert_eq(p.n_stages, 2);
    cr_assert(strstr(text, "stage 1: cpu"), "%s", text);
    struct run r;
    cr_assert_eq(open_run(&r, "cpu,cpu", NULL, 0, &err), 0, "%s", err.msg);
    // Weights: exactly what model_load_layers allocated on each stage.
    cr_assert_eq(p.stage[0].weight_bytes, r.m->n_bytes);
    cr_assert_eq(p.stage[1].weight_bytes, r.p->stage[1].m->n_bytes);
    close_run(&r);

    size_t tiny[2] = {64 << 10, 64 << 10}; // the model is ~0.7 MiB
    cr_assert_eq(
        pipeline_plan(lc_of(&a), ctx_of(&a, 0), f, d, 2, tiny, &p, text, sizeof text, &err),
        VERR_NOMEM);
    cr_assert(strstr(err.msg, "does not fit"), "%s", err.msg);
    gguf_close(f);
}
