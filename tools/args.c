// Shared flag parsing for the model-running commands (see args.h).
#include "tools/args.h"
#include "host/split/context.h"
#include "host/split/mpi.h"
#include "host/split/plan.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool args_is(const char *arg, const char *name, const char *alias) {
    return !strcmp(arg, name) || (alias && !strcmp(arg, alias));
}

int args_value_str(int argc, char **argv, int *i, const char **out, struct verr *err) {
    if (*i + 1 >= argc)
        return verr_set(err, VERR_RANGE, "%s: missing value", argv[*i]);
    *out = argv[*i + 1];
    *i += 2;
    return 0;
}

int args_value_int(int argc, char **argv, int *i, long min, long max, int *out, struct verr *err) {
    const char *s = NULL;
    const char *flag = argv[*i];
    int rc = args_value_str(argc, argv, i, &s, err);
    if (rc)
        return rc;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not an integer", flag, s);
    if (v < min || v > max)
        return verr_set(err, VERR_RANGE, "%s: %ld is out of range [%ld, %ld]", flag, v, min, max);
    *out = (int)v;
    return 0;
}

int args_value_float(int argc, char **argv, int *i, float *out, struct verr *err) {
    const char *s = NULL;
    const char *flag = argv[*i];
    int rc = args_value_str(argc, argv, i, &s, err);
    if (rc)
        return rc;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return verr_set(err, VERR_RANGE, "%s: '%s' is not a number", flag, s);
    *out = v;
    return 0;
}

void args_model_default(struct args_model *a) {
    memset(a, 0, sizeof *a);
    a->backend = LOAD_BACKEND_AUTO;
    a->n_batch = 512;
    a->type_k = GGML_TYPE_F16;
    a->type_v = GGML_TYPE_F16;
    rope_overrides_default(&a->rope);
}

struct choice {
    const char *name;
    int value;
};

// The value of flag argv[*i] as one of n named choices; otherwise VERR_RANGE
// "FLAG: 'VALUE' is not KIND" (`flag` is the name the message uses).
static int value_choice(int argc, char **argv, int *i, const char *flag, const struct choice *c,
                        int n, const char *kind, int *out, struct verr *err) {
    const char *s = NULL;
    int rc = args_value_str(argc, argv, i, &s, err);
    if (rc)
        return rc;
    for (int k = 0; k < n; k++)
        if (!strcmp(s, c[k].name)) {
            *out = c[k].value;
            return 0;
        }
    return verr_set(err, VERR_RANGE, "%s: '%s' is not %s", flag, s, kind);
}

static int cache_type(int argc, char **argv, int *i, enum ggml_type *out, struct verr *err) {
    static const struct choice types[] = {{"f16", GGML_TYPE_F16}, {"f32", GGML_TYPE_F32}};
    int v = 0;
    int rc = value_choice(argc, argv, i, argv[*i], types, 2, "a supported cache type (f32, f16)",
                          &v, err);
    if (!rc)
        *out = (enum ggml_type)v;
    return rc;
}

// Returns 1 (consumed), 0 (not ours) or a negative error.
#define DONE(call)                                                                                 \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        return rc_ ? rc_ : 1;                                                                      \
    } while (0)

// --- several devices (host/pipeline.h) ---
static int parse_split_flags(struct args_model *a, int argc, char **argv, int *i,
                             struct verr *err) {
    const char *arg = argv[*i], *s = NULL;
    if (args_is(arg, "--split-mode", "-sm")) {
        // "row" is parsed so that pipeline setup can refuse it by name.
        static const struct choice modes[] = {
            {"layer", LOAD_SPLIT_LAYER}, {"none", LOAD_SPLIT_NONE}, {"row", LOAD_SPLIT_ROW}};
        DONE(value_choice(argc, argv, i, "--split-mode", modes, 3, "a split mode (layer, none)",
                          &a->split_mode, err));
    }
    if (args_is(arg, "--tensor-split", "-ts")) {
        int rc = args_value_str(argc, argv, i, &s, err);
        float v[PLAN_MAX_DEVICES];
        int n = 0;
        if (!rc)
            rc = plan_parse_split(s, v, PLAN_MAX_DEVICES, &n, err);
        if (rc)
            return rc;
        a->tensor_split = s;
        return 1;
    }
    if (args_is(arg, "--devices", "-dev")) {
        int rc = args_value_str(argc, argv, i, &s, err);
        struct backend_device d[PLAN_MAX_DEVICES];
        int n = 0;
        if (!rc)
            rc = plan_parse_devices(s, d, PLAN_MAX_DEVICES, &n, err);
        if (rc)
            return rc;
        a->devices = s;
        return 1;
    }
    if (args_is(arg, "--main-gpu", "-mg"))
        DONE(args_value_int(argc, argv, i, 0, 1024, &a->device, err));
    if (args_is(arg, "--ubatch-size", "-ub"))
        DONE(args_value_int(argc, argv, i, 0, 1L << 20, &a->n_ubatch, err));
    return 0;
}

// --self-extend G W (-se): both values are checked before either is set.
static int parse_selfextend(struct args_model *a, int argc, char **argv, int *i, struct verr *err) {
    const char *flag = argv[*i];
    if (!args_is(flag, "--self-extend", "-se"))
        return 0;
    if (*i + 2 >= argc)
        return verr_set(err, VERR_RANGE,
                        "%s: needs two values, G (group size) and W (neighbor window)", flag);
    int v[2];
    for (int k = 0; k < 2; k++) {
        const char *s = argv[*i + 1 + k];
        char *end;
        errno = 0;
        long x = strtol(s, &end, 10);
        if (end == s || *end || errno || x < 1 || x > (1L << 24))
            return verr_set(err, VERR_RANGE, "%s: %s = '%s' must be an integer in [1, %ld]", flag,
                            k ? "W (neighbor window)" : "G (group size)", s, 1L << 24);
        v[k] = (int)x;
    }
    a->se_g = v[0];
    a->se_w = v[1];
    *i += 3;
    return 1;
}

int args_selfextend_check(const struct args_model *a, const struct model_hparams *hp, int n_ctx,
                          int n_prompt, FILE *out, struct verr *err) {
    if (a->se_g < 1)
        return 0;
    int ext = 0;
    int rc = forward_selfextend_ctx(hp, a->se_g, a->se_w, &ext, err);
    if (rc)
        return rc;
    if (a->verbose && out)
        fprintf(out,
                "self-extend: G %d, W %d (exact, RoPE inside attention, K cached unrotated): "
                "usable context (n_ctx_train %d - W) * G + W = %d tokens, cache %d cells\n",
                a->se_g, a->se_w, hp->n_ctx_train, ext, n_ctx);
    if (n_prompt > ext)
        return verr_set(err, VERR_RANGE,
                        "self-extend: the prompt has %d tokens, more than the extended context "
                        "(%d - W %d) * G %d + W = %d",
                        n_prompt, hp->n_ctx_train, a->se_w, a->se_g, ext);
    return 0;
}

int args_parse_model(struct args_model *a, int argc, char **argv, int *i, struct verr *err) {
    const char *arg = argv[*i];
    int split_rc = parse_split_flags(a, argc, argv, i, err);
    if (split_rc)
        return split_rc;
    if ((split_rc = parse_selfextend(a, argc, argv, i, err)))
        return split_rc;
    if (args_is(arg, "-m", "--model"))
        DONE(args_value_str(argc, argv, i, &a->model_path, err));
    if (args_is(arg, "--backend", NULL)) {
        static const struct choice backends[] = {
            {"cpu", LOAD_BACKEND_CPU}, {"cuda", LOAD_BACKEND_CUDA}, {"auto", LOAD_BACKEND_AUTO}};
        int v = 0;
        int rc =
            value_choice(argc, argv, i, "--backend", backends, 3, "a backend (cpu, cuda)", &v, err);
        if (rc)
            return rc;
        a->backend = (enum load_backend)v;
        return 1;
    }
    if (args_is(arg, "--device", NULL))
        DONE(args_value_int(argc, argv, i, 0, 1024, &a->device, err));
    if (args_is(arg, "-t", "--threads"))
        DONE(args_value_int(argc, argv, i, 0, 4096, &a->n_threads, err));
    if (args_is(arg, "-c", "--ctx-size"))
        DONE(args_value_int(argc, argv, i, 0, 1L << 24, &a->n_ctx, err));
    if (args_is(arg, "-b", "--batch-size"))
        DONE(args_value_int(argc, argv, i, 1, 1L << 20, &a->n_batch, err));
    if (args_is(arg, "--cache-type-k", "-ctk"))
        DONE(cache_type(argc, argv, i, &a->type_k, err));
    if (args_is(arg, "--cache-type-v", "-ctv"))
        DONE(cache_type(argc, argv, i, &a->type_v, err));
    if (args_is(arg, "--rope-scaling", NULL)) {
        const char *s = NULL;
        int rc = args_value_str(argc, argv, i, &s, err);
        if (rc)
            return rc;
        int t = rope_scaling_from_name(s);
        if (t < 0)
            return verr_set(err, VERR_RANGE,
                            "--rope-scaling: '%s' is not a scaling type (none, linear, yarn)", s);
        a->rope.scaling = t;
        return 1;
    }
    if (args_is(arg, "--rope-scale", NULL)) {
        float v;
        int rc = args_value_float(argc, argv, i, &v, err);
        if (rc)
            return rc;
        if (!(v > 0))
            return verr_set(err, VERR_RANGE, "--rope-scale: %g must be > 0", v);
        a->rope.freq_scale = 1.0f / v;
        return 1;
    }
    if (args_is(arg, "--rope-freq-base", NULL)) {
        int rc = args_value_float(argc, argv, i, &a->rope.freq_base, err);
        if (!rc && a->rope.freq_base < 0)
            rc = verr_set(err, VERR_RANGE, "--rope-freq-base: %g must be >= 0 (0: the model's)",
                          a->rope.freq_base);
        return rc ? rc : 1;
    }
    if (args_is(arg, "--rope-freq-scale", NULL)) {
        int rc = args_value_float(argc, argv, i, &a->rope.freq_scale, err);
        if (!rc && a->rope.freq_scale < 0)
            rc = verr_set(err, VERR_RANGE, "--rope-freq-scale: %g must be >= 0 (0: the model's)",
                          a->rope.freq_scale);
        return rc ? rc : 1;
    }
    if (args_is(arg, "--yarn-orig-ctx", NULL))
        DONE(args_value_int(argc, argv, i, 0, INT_MAX, &a->rope.yarn_orig_ctx, err));
    if (args_is(arg, "--yarn-ext-factor", NULL))
        DONE(args_value_float(argc, argv, i, &a->rope.yarn_ext_factor, err));
    if (args_is(arg, "--yarn-attn-factor", NULL))
        DONE(args_value_float(argc, argv, i, &a->rope.yarn_attn_factor, err));
    if (args_is(arg, "--yarn-beta-fast", NULL))
        DONE(args_value_float(argc, argv, i, &a->rope.yarn_beta_fast, err));
    if (args_is(arg, "--yarn-beta-slow", NULL))
        DONE(args_value_float(argc, argv, i, &a->rope.yarn_beta_slow, err));
    if (args_is(arg, "--verbose", "-v")) {
        a->verbose = true;
        *i += 1;
        return 1;
    }
    if (args_is(arg, "--no-progress", NULL)) {
        a->no_progress = true;
        *i += 1;
        return 1;
    }
    if (args_is(arg, "--no-cuda-graph", NULL)) {
        a->no_cuda_graph = true;
        *i += 1;
        return 1;
    }
    if (args_is(arg, "--kv-unrotated", NULL)) {
        a->k_unrotated = true;
        *i += 1;
        return 1;
    }
    if (args_is(arg, "--matvec-act", NULL)) {
        static const struct choice acts[] = {{"q8", BACKEND_ACT_Q8}, {"f32", BACKEND_ACT_F32}};
        int rc = value_choice(argc, argv, i, "--matvec-act", acts, 2,
                              "an activation type (q8, f32)", &a->matvec_act, err);
        return rc ? rc : 1;
    }
    return 0;
}

void args_help_model(FILE *out) {
    args_help_model_ctx(out, NULL);
}

void args_help_model_ctx(FILE *out, const char *ctx_text) {
    fprintf(out,
            "model and backend:\n"
            "  -m, --model FILE          GGUF model to load (make one with 'vela mkmodel')\n"
            "  --backend cpu|cuda        backend (default: cuda when a GPU is usable, else cpu)\n"
            "  --device N                CUDA device ordinal (default: 0)\n"
            "  -t, --threads N           CPU threads (default: the physical cores it may use;\n"
            "                            more than those is taken, with a warning)\n");
    if (ctx_text)
        fprintf(out, "  -c, --ctx-size N          %s\n", ctx_text);
    else
        fprintf(out,
                "  -c, --ctx-size N          context size in tokens; 0 = the model's training "
                "context\n"
                "                            (its context_length), at most %d (default: 0); more "
                "than\n"
                "                            the training context is taken, with a warning unless "
                "RoPE\n"
                "                            scaling or self-extend extends it\n",
                FORWARD_CTX_CAP);
    fprintf(out,
            "  -b, --batch-size N        tokens per forward pass when processing a prompt "
            "(default: 512)\n"
            "  -ctk, --cache-type-k T    KV cache type for K: f32, f16 (default: f16)\n"
            "  -ctv, --cache-type-v T    KV cache type for V: f32, f16 (default: f16)\n"
            "  -v, --verbose             print model and context details\n"
            "  --no-progress             no progress bar while the weights load\n"
            "  --no-cuda-graph           run decode steps op by op instead of replaying CUDA "
            "graphs\n"
            "                            (also VELA_NO_CUDA_GRAPH=1)\n"
            "  --matvec-act q8|f32       activations of mat-vecs with quantized weights: q8 "
            "rounds them\n"
            "                            to 8 bits for integer dot products, as llama.cpp does "
            "(default;\n"
            "                            on the CPU for every batch, with AVX2/AVX-VNNI kernels), "
            "f32 keeps\n"
            "                            them exact (the CPU's float32 reference; its default "
            "without AVX2)\n"
            "several devices (split by layers, see README):\n"
            "  --devices LIST            devices of the stages: 0,1 / cuda0,cuda1 / cpu,cpu "
            "(default: every GPU)\n"
            "  -sm, --split-mode MODE    layer: contiguous layers per device (default); none: one "
            "device\n"
            "  -ts, --tensor-split A,B   proportions of layers per device (default: by free "
            "memory)\n"
            "  -mg, --main-gpu N         the device with --split-mode none (default: 0)\n"
            "  -ub, --ubatch-size N      micro-batch tokens in flight between stages (default: "
            "batch / stages)\n"
            "rope:\n"
            "  --rope-scaling none|linear|yarn  RoPE frequency scaling (default: the model's)\n"
            "  --rope-scale N            RoPE context scaling factor: sets freq scale to 1/N\n"
            "  --rope-freq-base N        RoPE base frequency (default: the model's)\n"
            "  --rope-freq-scale N       RoPE frequency scaling factor (default: the model's)\n"
            "  --yarn-orig-ctx N         YaRN original context size (default: the model's)\n"
            "  --yarn-ext-factor N       YaRN extrapolation mix factor (default: -1 = 1.0 for "
            "yarn, else 0)\n"
            "  --yarn-attn-factor N      YaRN magnitude scale (default: 1.0)\n"
            "  --yarn-beta-fast N        YaRN low correction dim (default: 32.0)\n"
            "  --yarn-beta-slow N        YaRN high correction dim (default: 1.0)\n"
            "  -se, --self-extend G W    exact self-extend: keys within W positions of a query "
            "keep their\n"
            "                            positions, farther ones are grouped by G (in one "
            "softmax). Extends\n"
            "                            the usable context to (n_ctx_train - W) * G + W and "
            "sizes the\n"
            "                            cache for it (unless -c); K is cached unrotated. -v "
            "prints it\n"
            "  --kv-unrotated            cache K without RoPE; attention rotates it (a context "
            "shift then\n"
            "                            rewrites no K; serve: requests may choose their own "
            "self_extend)\n");
}

int args_parse_sampler(struct sampler_params *s, int argc, char **argv, int *i, struct verr *err) {
    const char *arg = argv[*i];
    if (args_is(arg, "--temp", NULL))
        DONE(args_value_float(argc, argv, i, &s->temp, err));
    if (args_is(arg, "--top-k", NULL))
        DONE(args_value_int(argc, argv, i, INT_MIN, INT_MAX, &s->top_k, err));
    if (args_is(arg, "--top-p", NULL))
        DONE(args_value_float(argc, argv, i, &s->top_p, err));
    if (args_is(arg, "--min-p", NULL))
        DONE(args_value_float(argc, argv, i, &s->min_p, err));
    if (args_is(arg, "--repeat-penalty", NULL))
        DONE(args_value_float(argc, argv, i, &s->repeat_penalty, err));
    if (args_is(arg, "--repeat-last-n", NULL))
        DONE(args_value_int(argc, argv, i, -1, INT_MAX, &s->repeat_last_n, err));
    if (args_is(arg, "--presence-penalty", NULL))
        DONE(args_value_float(argc, argv, i, &s->presence_penalty, err));
    if (args_is(arg, "--frequency-penalty", NULL))
        DONE(args_value_float(argc, argv, i, &s->frequency_penalty, err));
    if (args_is(arg, "--seed", "-s")) {
        const char *flag = arg, *v = NULL;
        int rc = args_value_str(argc, argv, i, &v, err);
        if (rc)
            return rc;
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno || x < -1 || x > (long long)UINT32_MAX)
            return verr_set(err, VERR_RANGE,
                            "%s: '%s' is not a seed (0..4294967295, -1 for random)", flag, v);
        s->seed = x < 0 ? SAMPLER_SEED_RANDOM : (uint32_t)x;
        return 1;
    }
    return 0;
}

void args_help_sampler(FILE *out) {
    fprintf(out, "sampling (chain: penalties -> top-k -> top-p -> min-p -> temp -> dist):\n"
                 "  --temp N                  temperature; <= 0 is greedy (default: 0.8)\n"
                 "  --top-k N                 top-k sampling; <= 0 is off (default: 40)\n"
                 "  --top-p N                 top-p sampling; 1.0 is off (default: 0.95)\n"
                 "  --min-p N                 min-p sampling; 0.0 is off (default: 0.05)\n"
                 "  --repeat-penalty N        penalize repeated tokens; 1.0 is off (default: 1.0)\n"
                 "  --repeat-last-n N         tokens the penalties look back on; 0 off, -1 the "
                 "context (default: 64)\n"
                 "  --presence-penalty N      presence penalty; 0.0 is off (default: 0.0)\n"
                 "  --frequency-penalty N     frequency penalty; 0.0 is off (default: 0.0)\n"
                 "  -s, --seed N              RNG seed; -1 is random (default: -1)\n");
}

#undef DONE

void args_load_config(const struct args_model *a, struct load_config *lc) {
    load_config_default(lc);
    lc->model_path = a->model_path;
    lc->backend = a->backend;
    lc->main_device = a->device;
    lc->be.n_threads = a->n_threads;
    lc->be.act = (enum backend_act)a->matvec_act;
    lc->split_mode = (enum load_split_mode)a->split_mode;
    lc->devices = a->devices;
    lc->tensor_split = a->tensor_split;
    lc->n_ubatch = a->n_ubatch;
}

void args_ctx_config(const struct args_model *a, struct forward_config *fc) {
    forward_config_default(fc);
    fc->n_ctx = a->n_ctx;
    fc->n_batch = a->n_batch;
    fc->type_k = a->type_k;
    fc->type_v = a->type_v;
    fc->rope = a->rope;
    fc->no_graph = a->no_cuda_graph;
    fc->k_unrotated = a->k_unrotated;
    fc->se_g = a->se_g;
    fc->se_w = a->se_w;
}

void args_engine_config(const struct args_model *a, struct engine_config *c) {
    engine_config_default(c);
    args_load_config(a, &c->load);
    const int n_seq = c->ctx.n_seq_max;
    args_ctx_config(a, &c->ctx);
    c->ctx.n_seq_max = n_seq;
}

bool args_mpi_worker(int argc, char **argv, int *status) {
    *status = 0;
    if (!pipeline_mpi_is_worker())
        return false;
    struct args_model a;
    args_model_default(&a);
    struct verr err = {0};
    // argv[0] is vela, argv[1] the command; flags that are not the model's
    // (prompt, sampling, output files) belong to rank 0 and are skipped.
    for (int i = 2; i < argc;) {
        int rc = args_parse_model(&a, argc, argv, &i, &err);
        if (rc < 0) {
            fprintf(stderr, "vela (rank %s): %s\n", getenv("OMPI_COMM_WORLD_RANK"), err.msg);
            *status = 2;
            return true;
        }
        if (rc == 0)
            i++;
    }
    if (!a.model_path) {
        fprintf(stderr, "vela: MPI worker: no model (-m)\n");
        *status = 2;
        return true;
    }
    struct load_config lc;
    struct forward_config fc;
    args_load_config(&a, &lc);
    args_ctx_config(&a, &fc);
    if (context_serve_rank(&lc, &fc, &err)) {
        fprintf(stderr, "vela (rank %s): %s\n", getenv("OMPI_COMM_WORLD_RANK"), err.msg);
        *status = 1;
    }
    return true;
}
