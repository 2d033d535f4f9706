// A model split by layers over CUDA stages (host/split/pipeline.h) against the same
// model on one CUDA backend: every decode's logits, with micro-batches of
// several sizes, after KV sequence ops (copy, remove, shift, divide),
// context shift and self-extend, and a cleared cache on every stage; with
// F32 caches and vela's default F16 ones.
// - `--devices 0,0`: two stages on one GPU, the in-process transport;
// - `--devices 0,1` (and 0,1,2): one GPU per stage, the NCCL transport
//   (asserted to be the one chosen), with two GPUs or more; under the
//   emulator (test_emu_pipeline_cuda, VELA_EMU_DEVICES=3) through the NCCL
//   shim of tests/emu, the only place this path runs without several GPUs;
// - `--devices 0,0,1`: a GPU shared by two stages and another GPU, in-process.
// Bad input: a device that does not exist, more stages than layers.
// Skips itself without a CUDA device.
//
// Tolerance: 0, bit for bit. Each stage runs the very kernels the single
// backend runs on the very same rows: the batches here have at most
// CUDA_MATVEC_MAX_TOK (8) tokens, so every micro-batch size takes the
// mat-vec path whose rows do not depend on the other rows of the batch, and
// attention's split-K plan depends on the n_kv bucket only; the transports
// copy floats without converting them. Both sides record and replay each
// stage's small parts as CUDA graphs, which run the eager kernels with the
// same arguments (tests/gpu/test_cuda_graph.c). Any difference is a bug in
// the split (a layer twice or never, a stale cache cell, a transfer out of
// order).
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/forward/forward.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"
#include "kv/selfextend.h"
#include "tests/pipeline_helpers.h"
#include "tests/tiny_model.h"
#include "tools/args.h"

#ifdef VELA_EMU
#include <nccl.h> // the emulator's shim: emu_nccl_bytes_delivered
#endif

static struct tiny_cfg cfg;
static struct tiny_weights weights;
static char model_path[128];
static int n_gpu;

static void setup(void) {
    n_gpu = backend_cuda_device_count();
    if (n_gpu == 0)
        return; // every test skips
    tiny_cfg_default(&cfg, "llama");
    cfg.n_layer = 4;
    cfg.n_vocab = 96;
    cfg.n_ctx_train = 64;
    tiny_temp_path(model_path, sizeof model_path, "pipecuda");
    struct verr err = {0};
    cr_assert_eq(tiny_write(&cfg, model_path, &weights, &err), 0, "%s", err.msg);
}

static void teardown(void) {
    if (n_gpu == 0)
        return;
    tiny_weights_free(&weights);
    unlink(model_path);
}

TestSuite(pipeline_cuda, .init = setup, .fini = teardown);

#define REQUIRE_GPUS(n)                                                                            \
    do {                                                                                           \
        if (n_gpu == 0)                                                                            \
            cr_skip_test("no CUDA device present");                                                \
        if (n_gpu < (n))                                                                           \
            cr_skip_test("needs %d CUDA devices (%d present)", (n), n_gpu);                        \
    } while (0)

// struct run, run_load, close_run, decode_seq and kv_script: tests/pipeline_helpers.h.

// devices NULL: the model on one CUDA backend (device 0), the reference.
static int open_run(struct run *r, const char *devices, int n_ubatch, enum ggml_type kv_type,
                    struct verr *err) {
    struct args_model a;
    args_model_default(&a);
    a.backend = LOAD_BACKEND_CUDA;
    a.devices = devices;
    if (!devices)
        a.split_mode = LOAD_SPLIT_NONE; // else every visible GPU would get a stage
    a.n_ubatch = n_ubatch;
    a.n_ctx = 64;
    a.n_batch = 8;
    a.type_k = a.type_v = kv_type;
    a.no_progress = true;
    return run_load(r, &a, model_path, err);
}

static const char *transport_name(const struct run *r) {
    return r->p->tp ? r->p->tp->ops->name : "none";
}

static void assert_same(const float *a, const float *b, size_t n, const char *what) {
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) { // NaN counts as the worst
            worst = isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    cr_log_info("%s: worst logit difference %g", what, worst);
    cr_assert_eq(worst, 0.0, "%s: worst logit difference %g at %zu (must be bit-identical)", what,
                 worst, at);
}

// --- the reference, computed once per test process ------------------------------

#define N_TOK 21

static float *ref_plain, *ref_kv1, *ref_kv2;
static enum ggml_type ref_type;

static void reference(enum ggml_type kv_type) {
    if (ref_plain && ref_type == kv_type)
        return;
    free(ref_plain);
    free(ref_kv1);
    free(ref_kv2);
    struct run r;
    struct verr err = {0};
    cr_assert_eq(open_run(&r, NULL, 0, kv_type, &err), 0, "%s", err.msg);
    cr_assert_eq(r.p->n_stages, 1, "the reference runs on one stage");
    cr_assert_null(r.p->tp);
    ref_plain = decode_seq(&r, 0, 0, N_TOK, 8, 0);
    close_run(&r);
    cr_assert_eq(open_run(&r, NULL, 0, kv_type, &err), 0, "%s", err.msg);
    kv_script(&r, &ref_kv1, &ref_kv2);
    close_run(&r);
    ref_type = kv_type;
}

// One split against the reference with a KV cache of kv_type: plain
// decodes with each micro-batch size, then the KV script with the first.
static void check_split_kv(const char *devices, int n_stages, const char *transport, const int *ubs,
                           int n_ubs, enum ggml_type kv_type) {
    const int V = cfg.n_vocab;
    struct verr err = {0};
    reference(kv_type);
    for (int u = 0; u < n_ubs; u++) {
        struct run r;
        cr_assert_eq(open_run(&r, devices, ubs[u], kv_type, &err), 0, "%s: %s", devices, err.msg);
        cr_assert_gt(r.p->n_stages, 1, "%s: not split", devices);
        cr_assert_eq(r.p->n_stages, n_stages);
        cr_assert_not_null(context_describe(r.c), "%s: no split plan", devices);
        cr_assert_str_eq(transport_name(&r), transport, "--devices %s: transport %s\n%s", devices,
                         transport_name(&r), context_describe(r.c));
        cr_assert_null(strstr(context_describe(r.c), "unavailable"), "%s", context_describe(r.c));
        for (int s = 0; s < n_stages; s++)
            cr_assert_eq(r.p->stage[s].be->device, r.p->stage[s].dev.ordinal, "stage %d", s);
#ifdef VELA_EMU
        const unsigned long long nccl0 = emu_nccl_bytes_delivered();
#endif
        float *got = decode_seq(&r, 0, 0, N_TOK, 8, 0);
#ifdef VELA_EMU
        // Every micro-batch's hidden state crossed each stage boundary by NCCL.
        const unsigned long long hidden = (unsigned long long)N_TOK * cfg.n_embd * sizeof(float);
        if (!strcmp(transport, "nccl"))
            cr_assert_eq(emu_nccl_bytes_delivered() - nccl0, hidden * (unsigned)(n_stages - 1),
                         "bytes through NCCL");
#endif
        char what[96];
        snprintf(what, sizeof what, "--devices %s -ub %d (%s, %s KV)", devices, ubs[u], transport,
                 ggml_type_name(kv_type));
        assert_same(got, ref_plain, (size_t)N_TOK * V, what);
        free(got);
        close_run(&r);
    }
    struct run r;
    float *g1, *g2;
    cr_assert_eq(open_run(&r, devices, ubs[0], kv_type, &err), 0, "%s", err.msg);
    kv_script(&r, &g1, &g2);
    cr_assert_eq(r.p->n_stages, n_stages);
    for (int s = 1; s < r.p->n_stages; s++) {
        const struct kv_cache *k0 = &context_stage(r.c, 0)->kv, *ks = &context_stage(r.c, s)->kv;
        cr_assert_eq(ks->used, k0->used, "stage %d", s);
        cr_assert_eq(memcmp(ks->pos, k0->pos, sizeof(int32_t) * k0->cfg.n_ctx), 0, "stage %d", s);
    }
    close_run(&r);
    char what[96];
    snprintf(what, sizeof what, "--devices %s (%s KV): after seq cp / rm / add / div", devices,
             ggml_type_name(kv_type));
    assert_same(g1, ref_kv1, (size_t)10 * V, what);
    snprintf(what, sizeof what, "--devices %s (%s KV): context shift and self-extend", devices,
             ggml_type_name(kv_type));
    assert_same(g2, ref_kv2, (size_t)27 * V, what);
    free(g1);
    free(g2);
}

// F32 caches with the given micro-batch sizes, then vela's default F16
// cache (the f16 K/V store and shift kernels) with the first.
static void check_split(const char *devices, int n_stages, const char *transport, const int *ubs,
                        int n_ubs) {
    check_split_kv(devices, n_stages, transport, ubs, n_ubs, GGML_TYPE_F32);
    check_split_kv(devices, n_stages, transport, ubs, 1, GGML_TYPE_F16);
}

// (a) Two stages on one GPU: the in-process transport (NCCL wants one rank
// per GPU).
Test(pipeline_cuda, two_stages_on_one_gpu) {
    REQUIRE_GPUS(1);
    static const int ubs[] = {0, 1, 3, 8};
    check_split("0,0", 2, "in-process", ubs, 4);
}

// (b) One GPU per stage: NCCL, never a silent fall-back to in-process.
Test(pipeline_cuda, one_gpu_per_stage_nccl) {
    REQUIRE_GPUS(2);
#if defined(VELA_HAVE_NCCL) || defined(VELA_EMU)
    static const int ubs[] = {0, 3};
    check_split("0,1", 2, "nccl", ubs, 2);
    if (n_gpu >= 3)
        check_split("0,1,2", 3, "nccl", ubs, 1);
#else
    cr_skip_test("built without NCCL");
#endif
}

// Two stages share a GPU and a third is on another: in-process across GPUs.
Test(pipeline_cuda, shared_and_separate_gpus) {
    REQUIRE_GPUS(2);
    static const int ubs[] = {0};
    check_split("0,0,1", 3, "in-process", ubs, 1);
}

// context_clear (what the engine does before each run) must empty
// every stage's cache, K and V included: after a clear and one token at
// cell 0, no stage holds anything in cells 1.. of any layer.
static void check_clear(const char *devices) {
    struct run r;
    struct verr err = {0};
    cr_assert_eq(open_run(&r, devices, 0, GGML_TYPE_F32, &err), 0, "%s: %s", devices, err.msg);
    free(decode_seq(&r, 0, 0, 12, 8, 0));
    cr_assert_eq(context_clear(r.c, &err), 0, "%s", err.msg);
    free(decode_seq(&r, 0, 0, 1, 1, 5));
    cr_assert_gt(r.p->n_stages, 1, "--devices %s: not split", devices);
    for (int s = 0; s < r.p->n_stages; s++) {
        const struct forward_ctx *fc = context_stage(r.c, s);
        cr_assert_not_null(fc, "stage %d", s);
        const struct kv_cache *kv = &fc->kv;
        const int L = kv->cfg.n_layer, C = kv->cfg.n_ctx;
        for (int which = 0; which < 2; which++) {
            const size_t row = which ? kv->v_row_bytes : kv->k_row_bytes;
            const size_t bytes = row * (size_t)C * (size_t)L;
            unsigned char *h = malloc(bytes);
            struct backend *be = fc->be;
            cr_assert_eq(be->ops->download(be, h, which ? kv->v : kv->k, bytes), 0, "%s",
                         be->err.msg);
            cr_assert_eq(be->ops->sync(be), 0, "%s", be->err.msg);
            long stale = 0;
            for (int l = 0; l < L; l++)
                for (size_t b = row; b < row * (size_t)C; b++)
                    stale += h[(size_t)l * row * C + b] != 0;
            cr_expect_eq(stale, 0,
                         "--devices %s: stage %d: %ld bytes of %s in cells 1..%d survive "
                         "context_clear",
                         devices, s, stale, which ? "V" : "K", C - 1);
            free(h);
        }
    }
    close_run(&r);
}

Test(pipeline_cuda, kv_clear_reaches_every_stage) {
    REQUIRE_GPUS(1);
    check_clear("0,0");
    if (n_gpu >= 2)
        check_clear("0,1");
}

// (c) Bad input: clear errors, nothing loaded.
Test(pipeline_cuda, bad_input) {
    REQUIRE_GPUS(1);
    struct run r;
    struct verr err = {0};
    char devs[32];
    snprintf(devs, sizeof devs, "0,%d", n_gpu);
    cr_assert_eq(open_run(&r, devs, 0, GGML_TYPE_F32, &err), VERR_NOTFOUND, "%s", err.msg);
    char want[64];
    snprintf(want, sizeof want, "CUDA device %d does not exist", n_gpu);
    cr_assert(strstr(err.msg, want), "%s", err.msg);

    cr_assert_eq(open_run(&r, "0,0,0,0,0", 0, GGML_TYPE_F32, &err), VERR_RANGE, "%s", err.msg);
    cr_assert(strstr(err.msg, "5 stages for a model of 4 layers"), "%s", err.msg);

    // The NCCL transport itself refuses two stages on one GPU.
    struct backend *be[2];
    cr_assert_eq(backend_cuda_create(&be[0], 0, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(&be[1], 0, &err), 0, "%s", err.msg);
    struct transport *tp = NULL;
    cr_assert_neq(transport_nccl_create(&tp, be, 2, NULL, 0, &err), 0);
    cr_assert_null(tp);
    cr_log_info("NCCL over 0,0: %s", err.msg);
    backend_destroy(be[1]);
    backend_destroy(be[0]);
}
