// mkmodel: synthetic GGUF models (see mkmodel.h for the contract).
//
// Writing is a pipeline: the tensor data of the whole file is cut into jobs
// (a run of rows of one tensor, about MK_CHUNK_BYTES each) numbered in file
// order. Workers claim jobs in order, generate their rows into one of
// n_slots buffers and mark them ready; the calling thread writes ready jobs
// strictly in order and frees their slots. A worker may run at most n_slots
// jobs ahead of the writer, so memory stays at n_slots chunks.
//
// Every row draws its numbers from its own generator, seeded from (seed,
// tensor index, row index), so the bytes do not depend on which thread made
// which row.
#include "tools/mkmodel/mkmodel.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "host/model/arch.h"
#include "tools/mkmodel/ftype.h"
#include "tools/mkmodel/mkmodel_vocab.h"

// Chunks small enough to stay in cache between the worker that makes them and
// the writer that copies them out: 1 MiB measured 4x less kernel time than 4 MiB.
#define MK_CHUNK_BYTES ((size_t)1 << 20)
#define MK_MAX_DIM (1 << 20) // any one dimension
#define MK_MAX_LAYERS 4096
#define MK_MAX_THREADS 64

// --- defaults and presets ------------------------------------------------------

void mkmodel_config_default(struct mkmodel_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = MKMODEL_ARCH_LLAMA;
    cfg->n_embd = 256;
    cfg->n_layer = 4;
    cfg->n_head = 8;
    cfg->n_head_kv = 4;
    cfg->n_ff = 768;
    cfg->n_ctx = 2048;
    cfg->type = GGML_TYPE_F32;
    cfg->type_embd = cfg->type_output = cfg->type_attn = cfg->type_ffn = -1;
    cfg->mix = MKMODEL_MIX_NONE;
    cfg->rope_scaling = MKMODEL_ROPE_SCALING_NONE;
    cfg->rope_scale = 1.0f;
    cfg->seed = 42;
}

// Same order as `presets` below.
static const struct mkmodel_preset_info preset_info[] = {
    {"tiny",
     "llama, 256 x 4 layers, 8/4 heads, ff 768, generated vocab, F32 (runs instantly on a CPU)"},
    {"cpu-100m",
     "llama, 768 x 12 layers, 12/4 heads, ff 2048, vocab 16384, F32 (~100M parameters)"},
    {"qwen2-0.5b",
     "qwen2, 896 x 24 layers, 14/2 heads, ff 4864, vocab 151936, ctx 32768, tied, F16"},
    {"llama2-7b", "llama, 4096 x 32 layers, 32/32 heads, ff 11008, vocab 32000, ctx 4096, Q4_0"},
    {"llama3-8b", "llama, 4096 x 32 layers, 32/8 heads, ff 14336, vocab 128256, ctx 8192, "
                  "rope base 500000, Q4_0"},
    {"qwen3-30b-a3b", "qwen3moe, 2048 x 48 layers, 32/4 heads of 128, 128 experts of ff 768, "
                      "8 used, vocab 151936, ctx 40960, Q4_K"},
    {"mixtral-8x7b", "llama with experts, 4096 x 32 layers, 32/8 heads, 8 experts of ff "
                     "14336, 2 used, vocab 32000, ctx 32768, rope base 1e6, Q4_0"},
    {"tiny-qwen3moe", "qwen3moe, 256 x 4 layers, 8/4 heads, 8 experts of ff 128, 2 used, F32"},
    {"tiny-qwen2moe", "qwen2moe, 256 x 4 layers, 8/4 heads, 8 experts of ff 128, 2 used, shared "
                      "ff 256, F32"},
    {"tiny-mixtral", "llama with experts, 256 x 4 layers, 8/4 heads, 8 experts of ff 128, "
                     "2 used, F32"},
    {"gpt-oss-20b", "gpt-oss, 2880 x 24 layers, 64/8 heads of 64, 32 experts of ff 2880, 4 used, "
                    "window 128, vocab 201088, ctx 131072, YaRN 32x from 4096, MXFP4 experts, "
                    "Q8_0 rest"},
    {"tiny-gpt-oss", "gpt-oss, 256 x 4 layers, 8/4 heads of 64, 8 experts of ff 128, 2 used, "
                     "window 16, F32"},
    {NULL, NULL},
};

struct preset {
    enum mkmodel_arch arch;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    enum ggml_type type;
    float rope_freq_base;
    bool tied;
    int head_dim; // 0: n_embd / n_head
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    // gpt-oss's: the experts' type where not 0 (F32), a sliding window,
    // YaRN by `yarn` from n_ctx / yarn
    enum ggml_type type_ffn;
    int sliding_window, yarn;
};
#define MK_Q3MOE ((enum mkmodel_arch)MODEL_ARCH_QWEN3MOE)
#define MK_Q2MOE ((enum mkmodel_arch)MODEL_ARCH_QWEN2MOE)
#define MK_GPTOSS ((enum mkmodel_arch)MODEL_ARCH_GPTOSS)

static const struct preset presets[] = {
    {MKMODEL_ARCH_LLAMA, 256, 4, 8, 4, 768, 0, 2048, GGML_TYPE_F32, 10000.0f, false, 0, 0, 0, 0, 0,
     GGML_TYPE_F32, 0, 0},
    {MKMODEL_ARCH_LLAMA, 768, 12, 12, 4, 2048, 16384, 2048, GGML_TYPE_F32, 10000.0f, false, 0, 0, 0,
     0, 0, GGML_TYPE_F32, 0, 0},
    {MKMODEL_ARCH_QWEN2, 896, 24, 14, 2, 4864, 151936, 32768, GGML_TYPE_F16, 1000000.0f, true, 0, 0,
     0, 0, 0, GGML_TYPE_F32, 0, 0},
    {MKMODEL_ARCH_LLAMA, 4096, 32, 32, 32, 11008, 32000, 4096, GGML_TYPE_Q4_0, 10000.0f, false, 0,
     0, 0, 0, 0, GGML_TYPE_F32, 0, 0},
    {MKMODEL_ARCH_LLAMA, 4096, 32, 32, 8, 14336, 128256, 8192, GGML_TYPE_Q4_0, 500000.0f, false, 0,
     0, 0, 0, 0, GGML_TYPE_F32, 0, 0},
    {MK_Q3MOE, 2048, 48, 32, 4, 6144, 151936, 40960, GGML_TYPE_Q4_K, 1000000.0f, false, 128, 128, 8,
     768, 0, GGML_TYPE_F32, 0, 0},
    {MKMODEL_ARCH_LLAMA, 4096, 32, 32, 8, 14336, 32000, 32768, GGML_TYPE_Q4_0, 1000000.0f, false, 0,
     8, 2, 0, 0, GGML_TYPE_F32, 0, 0},
    {MK_Q3MOE, 256, 4, 8, 4, 768, 0, 2048, GGML_TYPE_F32, 0.0f, false, 0, 8, 2, 128, 0,
     GGML_TYPE_F32, 0, 0},
    {MK_Q2MOE, 256, 4, 8, 4, 768, 0, 2048, GGML_TYPE_F32, 0.0f, false, 0, 8, 2, 128, 256,
     GGML_TYPE_F32, 0, 0},
    {MKMODEL_ARCH_LLAMA, 256, 4, 8, 4, 128, 0, 2048, GGML_TYPE_F32, 0.0f, false, 0, 8, 2, 0, 0,
     GGML_TYPE_F32, 0, 0},
    {MK_GPTOSS, 2880, 24, 64, 8, 2880, 201088, 131072, GGML_TYPE_Q8_0, 150000.0f, false, 64, 32, 4,
     2880, 0, GGML_TYPE_MXFP4, 128, 32},
    {MK_GPTOSS, 256, 4, 8, 4, 128, 0, 2048, GGML_TYPE_F32, 0.0f, false, 64, 8, 2, 128, 0,
     GGML_TYPE_F32, 16, 0},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])
_Static_assert(N_PRESETS + 1 == sizeof preset_info / sizeof preset_info[0],
               "one preset_info entry per preset");

const struct mkmodel_preset_info *mkmodel_presets(void) {
    return preset_info;
}

int mkmodel_preset(struct mkmodel_config *cfg, const char *name, struct verr *err) {
    for (size_t i = 0; i < N_PRESETS; i++) {
        const struct preset *p = &presets[i];
        if (strcmp(preset_info[i].name, name) != 0)
            continue;
        cfg->arch = p->arch;
        snprintf(cfg->name, sizeof cfg->name, "vela-synthetic-%s", preset_info[i].name);
        cfg->n_embd = p->n_embd;
        cfg->n_layer = p->n_layer;
        cfg->n_head = p->n_head;
        cfg->n_head_kv = p->n_head_kv;
        cfg->n_ff = p->n_ff;
        cfg->n_vocab = p->n_vocab;
        cfg->n_ctx = p->n_ctx;
        cfg->head_dim = p->head_dim;
        cfg->n_expert = p->n_expert;
        cfg->n_expert_used = p->n_expert_used;
        cfg->n_ff_exp = p->n_ff_exp;
        cfg->n_ff_shexp = p->n_ff_shexp;
        cfg->n_rot = 0;
        cfg->norm_eps = 0;
        cfg->type = p->type;
        cfg->rope_freq_base = p->rope_freq_base;
        cfg->tied = p->tied;
        if (p->type_ffn != GGML_TYPE_F32)
            cfg->type_ffn = (int)p->type_ffn;
        cfg->sliding_window = p->sliding_window;
        if (p->yarn) {
            cfg->rope_scaling = MKMODEL_ROPE_SCALING_YARN;
            cfg->rope_scale = (float)p->yarn;
            cfg->yarn_orig_ctx = p->n_ctx / p->yarn;
        }
        return 0;
    }
    char list[512] = "";
    for (size_t i = 0; i < N_PRESETS; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, preset_info[i].name, sizeof list - strlen(list) - 1);
    }
    return verr_set(err, VERR_NOTFOUND, "--preset %s: unknown preset (known: %s)", name, list);
}

int mkmodel_vocab_base_size(void) {
    return mkvocab_base_size();
}

// --- resolving and checking a config -------------------------------------------

// The architecture's table; resolved configs always have one.
static const struct arch *mk_arch(const struct mkmodel_config *c) {
    return arch_get((enum model_arch)c->arch);
}

static void mk_note(const struct mkmodel_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void mk_note(const struct mkmodel_config *cfg, const char *fmt, ...) {
    if (!cfg->log)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cfg->log(cfg->cb_ctx, buf);
}

static int check_type(int t, bool optional, const char *flag, struct verr *err) {
    if (optional && t < 0)
        return 0;
    if (t < 0 || !quant_can_quantize((enum ggml_type)t)) // F32/F16/BF16 too
        return verr_set(err, VERR_UNSUPPORTED, "%s %s: not a weight type vela can write", flag,
                        t < 0 ? "(none)" : ggml_type_name((uint32_t)t));
    return 0;
}

static int check_dim(int v, int lo, int hi, const char *flag, struct verr *err) {
    if (v < lo || v > hi)
        return verr_set(err, VERR_RANGE, "%s %d: must be between %d and %d", flag, v, lo, hi);
    return 0;
}

// Size of the tokens array of a vocabulary file.
static int vocab_file_size(const char *path, int *n_out, struct verr *err) {
    struct gguf_file *f;
    if (gguf_open(&f, path, err))
        return verr_wrap(err, "--vocab");
    const struct gguf_array *a;
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &a, err);
    if (rc == 0 && (a->n == 0 || a->n > MK_MAX_DIM))
        rc = verr_set(err, VERR_RANGE, "%s: tokenizer.ggml.tokens has %llu tokens", path,
                      (unsigned long long)a->n);
    if (rc == 0)
        *n_out = (int)a->n;
    gguf_close(f);
    return rc ? verr_wrap(err, "--vocab") : 0;
}

// The expert counts and widths (see mkmodel.h): checked against what the
// architecture has (host/model/arch.h, struct arch_moe), defaults filled.
static int resolve_moe(struct mkmodel_config *c, const struct arch *a, struct verr *err) {
    int rc;
    if (c->n_expert == 0 && a->moe.required)
        c->n_expert = 8;
    if (c->n_expert == 0) {
        if (c->n_expert_used || c->n_ff_exp || c->n_ff_shexp)
            return verr_set(err, VERR_RANGE,
                            "--n-expert-used / --n-ff-exp / --n-ff-shexp without --n-expert");
        return 0;
    }
    if (!a->layer_moe)
        return verr_set(err, VERR_RANGE, "--n-expert %d: %s has no blocks with experts",
                        c->n_expert, a->name);
    if ((rc = check_dim(c->n_expert, 1, 1024, "--n-expert", err)))
        return rc;
    if (c->n_expert_used == 0)
        c->n_expert_used = c->n_expert < 2 ? c->n_expert : 2;
    if ((rc = check_dim(c->n_expert_used, 1, c->n_expert, "--n-expert-used", err)))
        return rc;
    if (!a->moe.ff_exp_key && c->n_ff_exp != 0 && c->n_ff_exp != c->n_ff)
        return verr_set(err, VERR_RANGE, "--n-ff-exp %d: %s's experts are --n-ff (%d) wide",
                        c->n_ff_exp, a->name, c->n_ff);
    if (c->n_ff_exp == 0)
        c->n_ff_exp = a->moe.ff_exp_key ? c->n_ff / c->n_expert_used : c->n_ff;
    if ((rc = check_dim(c->n_ff_exp, 1, MK_MAX_DIM, "--n-ff-exp", err)))
        return rc;
    if (!a->moe.shexp && c->n_ff_shexp != 0)
        return verr_set(err, VERR_RANGE, "--n-ff-shexp %d: %s has no shared expert", c->n_ff_shexp,
                        a->name);
    if (a->moe.shexp && c->n_ff_shexp == 0)
        c->n_ff_shexp = c->n_ff;
    return a->moe.shexp ? check_dim(c->n_ff_shexp, 1, MK_MAX_DIM, "--n-ff-shexp", err) : 0;
}

int mkmodel_resolve(const struct mkmodel_config *cfg, struct mkmodel_config *out,
                    struct verr *err) {
    struct mkmodel_config c = *cfg;
    c.name[sizeof c.name - 1] = '\0';
    int rc;
    const struct arch *a = mk_arch(&c);
    if (!a)
        return verr_set(err, VERR_RANGE, "--arch: unknown architecture id %d", (int)c.arch);
    if ((rc = check_dim(c.n_embd, 1, MK_MAX_DIM, "--n-embd", err)) ||
        (rc = check_dim(c.n_layer, 1, MK_MAX_LAYERS, "--n-layer", err)) ||
        (rc = check_dim(c.n_head, 1, MK_MAX_DIM, "--n-head", err)) ||
        (rc = check_dim(c.n_ff, 1, MK_MAX_DIM, "--n-ff", err)) ||
        (rc = check_dim(c.n_ctx, 1, 1 << 30, "--ctx", err)))
        return rc;
    if (c.n_head_kv == 0)
        c.n_head_kv = c.n_head;
    if ((rc = check_dim(c.n_head_kv, 1, c.n_head, "--n-head-kv", err)))
        return rc;
    if (c.n_head % c.n_head_kv != 0)
        return verr_set(err, VERR_RANGE, "--n-head-kv %d does not divide --n-head %d", c.n_head_kv,
                        c.n_head);
    if (c.head_dim == 0) {
        if (c.n_embd % c.n_head != 0)
            return verr_set(err, VERR_RANGE,
                            "--n-head %d does not divide --n-embd %d (give --head-dim)", c.n_head,
                            c.n_embd);
        c.head_dim = c.n_embd / c.n_head;
    }
    if ((rc = check_dim(c.head_dim, 1, MK_MAX_DIM, "--head-dim", err)))
        return rc;
    if ((int64_t)c.n_head * c.head_dim > MK_MAX_DIM)
        return verr_set(err, VERR_RANGE, "--n-head %d x --head-dim %d: more than %d", c.n_head,
                        c.head_dim, MK_MAX_DIM);
    if (c.n_rot == 0)
        c.n_rot = c.head_dim;
    if (c.n_rot < 0 || c.n_rot % 2 != 0)
        return verr_set(err, VERR_RANGE, "--n-rot %d: must be even and positive", c.n_rot);
    if (c.n_rot > c.head_dim)
        return verr_set(err, VERR_RANGE, "--n-rot %d: larger than the head dimension %d", c.n_rot,
                        c.head_dim);
    if (c.norm_eps == 0)
        c.norm_eps = a->synth_norm_eps;
    if (!(c.norm_eps > 0 && c.norm_eps < 1))
        return verr_set(err, VERR_RANGE, "--norm-eps %g: must be in (0, 1)", (double)c.norm_eps);
    if (c.rope_freq_base == 0)
        c.rope_freq_base = a->synth_rope_freq_base;
    if (!(c.rope_freq_base > 1 && isfinite(c.rope_freq_base)))
        return verr_set(err, VERR_RANGE, "--rope-freq-base %g: must be a finite number > 1",
                        (double)c.rope_freq_base);
    if (c.rope_scaling != MKMODEL_ROPE_SCALING_NONE &&
        c.rope_scaling != MKMODEL_ROPE_SCALING_LINEAR &&
        c.rope_scaling != MKMODEL_ROPE_SCALING_YARN)
        return verr_set(err, VERR_RANGE, "--rope-scaling: unknown type id %d", (int)c.rope_scaling);
    if (!(c.rope_scale > 0 && c.rope_scale <= 1024))
        return verr_set(err, VERR_RANGE, "--rope-scale %g: must be in (0, 1024]",
                        (double)c.rope_scale);
    if (c.yarn_orig_ctx == 0)
        c.yarn_orig_ctx = c.n_ctx;
    if ((rc = check_dim(c.yarn_orig_ctx, 1, 1 << 30, "--yarn-orig-ctx", err)))
        return rc;
    if (c.rope_freqs_factor == 0)
        c.rope_freqs_factor = 8.0f;
    if (!(c.rope_freqs_factor >= 1 && c.rope_freqs_factor <= 1024))
        return verr_set(err, VERR_RANGE, "--rope-freqs-factor %g: must be in [1, 1024]",
                        (double)c.rope_freqs_factor);
    if (c.rope_freqs_orig_ctx == 0)
        c.rope_freqs_orig_ctx = 8192;
    if ((rc = check_dim(c.rope_freqs_orig_ctx, 1, 1 << 30, "--rope-freqs-orig-ctx", err)))
        return rc;

    if ((c.sliding_window || c.swa_pattern || c.rope_freq_base_swa != 0) &&
        !a->block.sliding_window_pattern)
        return verr_set(err, VERR_RANGE,
                        "--sliding-window / --swa-pattern / --rope-freq-base-swa: %s has no "
                        "sliding-window layers",
                        a->name);
    if (c.sliding_window < 0 || c.swa_pattern < 0 ||
        !(c.rope_freq_base_swa == 0 ||
          (c.rope_freq_base_swa > 1 && isfinite(c.rope_freq_base_swa))))
        return verr_set(err, VERR_RANGE,
                        "--sliding-window %d, --swa-pattern %d must be >= 0, --rope-freq-base-swa "
                        "%g a finite number > 1",
                        c.sliding_window, c.swa_pattern, (double)c.rope_freq_base_swa);

    if (a->block.swa_required && c.sliding_window == 0)
        c.sliding_window = 128; // gpt-oss's

    if ((rc = resolve_moe(&c, a, err)))
        return rc;

    if (c.mix != MKMODEL_MIX_NONE) {
        const struct ftype_info *ft = ftype_by_id(c.mix);
        if (!ft)
            return verr_set(err, VERR_RANGE, "--mix: unknown llama.cpp file type id %d", c.mix);
        c.type = ft->base;
    }
    if ((rc = check_type((int)c.type, false, "--type", err)) ||
        (rc = check_type(c.type_embd, true, "--type-embd", err)) ||
        (rc = check_type(c.type_output, true, "--type-output", err)) ||
        (rc = check_type(c.type_attn, true, "--type-attn", err)) ||
        (rc = check_type(c.type_ffn, true, "--type-ffn", err)))
        return rc;

    if (c.vocab_path) {
        int n = 0;
        if ((rc = vocab_file_size(c.vocab_path, &n, err)))
            return rc;
        c.n_vocab = n;
    } else {
        int base = mkvocab_base_size();
        if (base < 0)
            return verr_set(err, VERR_NOMEM, "out of memory building the vocabulary");
        if (c.n_vocab == 0)
            c.n_vocab = base;
        if ((rc = check_dim(c.n_vocab, 1, MK_MAX_DIM, "--n-vocab", err)))
            return rc;
        if (c.n_vocab < base)
            return verr_set(err, VERR_RANGE,
                            "--n-vocab %d: smaller than the generated vocabulary (%d tokens); "
                            "give at least %d or --vocab FILE",
                            c.n_vocab, base, base);
    }
    if (c.n_threads < 0 || c.n_threads > MK_MAX_THREADS)
        return verr_set(err, VERR_RANGE, "--threads %d: must be between 0 and %d", c.n_threads,
                        MK_MAX_THREADS);
    if (c.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c.n_threads = n < 2 ? 2 : n > MK_MAX_THREADS ? MK_MAX_THREADS : (int)n;
    }
    if (c.name[0] == '\0')
        snprintf(c.name, sizeof c.name, "vela-synthetic-%s", a->name);
    if (c.weights == MKMODEL_WEIGHTS_AUTO)
        c.weights = mkmodel_count_params(&c) > MKMODEL_FAST_PARAMS ? MKMODEL_WEIGHTS_FAST
                                                                   : MKMODEL_WEIGHTS_EXACT;
    else if (c.weights != MKMODEL_WEIGHTS_EXACT && c.weights != MKMODEL_WEIGHTS_FAST)
        return verr_set(err, VERR_RANGE, "--fast-weights/--exact-weights: unknown mode id %d",
                        (int)c.weights);
    *out = c;
    return 0;
}

// --- the tensor plan --------------------------------------------------------------

struct mk_tensor {
    char name[64];
    enum arch_role role; // the architecture table's (host/model/arch.h)
    enum ggml_type type;
    uint32_t n_dims;
    int64_t ne[3];   // ne[0]: row length; ne[1]: rows (1 for vectors); ne[2]: experts (or 1)
    int64_t n_rows;  // ne[1] * ne[2]
    float mean, std; // of the generated values
    bool fast;       // written by the fast path (a matrix, weights FAST)
    size_t row_bytes;
    uint64_t nbytes;
};

// Type fallbacks seen while planning, reported once per (row length, from, to).
struct mk_fallback {
    int64_t ne0;
    enum ggml_type from, to;
    int count;
    char first[64];
};
#define MK_MAX_FALLBACKS 32

struct mk_plan_notes {
    struct mk_fallback fb[MK_MAX_FALLBACKS];
    int n;
};

static void note_fallback(struct mk_plan_notes *pn, int64_t ne0, enum ggml_type from,
                          enum ggml_type to, const char *name) {
    for (int i = 0; i < pn->n; i++)
        if (pn->fb[i].ne0 == ne0 && pn->fb[i].from == from && pn->fb[i].to == to) {
            pn->fb[i].count++;
            return;
        }
    if (pn->n == MK_MAX_FALLBACKS)
        return;
    struct mk_fallback *f = &pn->fb[pn->n++];
    f->ne0 = ne0;
    f->from = from;
    f->to = to;
    f->count = 1;
    snprintf(f->first, sizeof f->first, "%s", name);
}

static enum ggml_type choose_type(const struct mkmodel_config *c, struct mk_plan_notes *pn,
                                  enum arch_role cls, int layer, int64_t ne0, int64_t ne2,
                                  const char *name) {
    int over = -1;
    switch (cls) {
    case ARCH_ROLE_TOKEN_EMBD:
        over = c->type_embd >= 0 ? c->type_embd : c->tied ? c->type_output : -1;
        break;
    case ARCH_ROLE_OUTPUT:
        over = c->type_output;
        break;
    case ARCH_ROLE_ATTN_Q:
    case ARCH_ROLE_ATTN_K:
    case ARCH_ROLE_ATTN_V:
    case ARCH_ROLE_ATTN_O:
        over = c->type_attn;
        break;
    case ARCH_ROLE_FFN_GATE:
    case ARCH_ROLE_FFN_UP:
    case ARCH_ROLE_FFN_DOWN:
        over = c->type_ffn;
        break;
    default:
        return GGML_TYPE_F32; // norms, biases, rope factors
    }
    enum ggml_type t = c->type;
    if (over >= 0) {
        t = (enum ggml_type)over;
    } else if (c->mix != MKMODEL_MIX_NONE) {
        // llama-quantize's choice for this file type: every layer has one
        // attn_v, so the i-th attn_v and ffn_down are layer i's.
        const struct ftype_model m = {.n_layer = c->n_layer,
                                      .n_attn_v = c->n_layer,
                                      .n_head = c->n_head,
                                      .n_head_kv = c->n_head_kv,
                                      .tied = c->tied,
                                      .n_expert = c->n_expert};
        t = ftype_rule(ftype_by_id(c->mix), &m, ftype_role_of(name, 2), layer, ne0, ne2);
    }
    enum ggml_type f = ftype_fallback(t, ne0);
    if (f != t)
        note_fallback(pn, ne0, t, f, name);
    return f;
}

// The dims a table entry is written with: a vector and a one-row matrix
// (qwen2moe's ffn_gate_inp_shexp) 1, an expert stack 3, a matrix and a table
// of vectors (gpt-oss's expert biases) 2.
static uint32_t mk_n_dims(const struct arch_tensor *at) {
    if (at->ne[1] == ARCH_DIM_1)
        return 1;
    if (at->kind == ARCH_VECTOR)
        return 2;
    return at->ne[2] != ARCH_DIM_1 ? 3 : 2;
}

static void plan_add(struct mk_tensor *t, int *n, const struct mkmodel_config *c,
                     struct mk_plan_notes *pn, const struct arch_tensor *at, int layer,
                     const char *name, const int64_t ne[3], float mean, float std) {
    const int64_t ne0 = ne[0];
    struct mk_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->role = at->role;
    x->n_dims = mk_n_dims(at);
    x->ne[0] = ne0;
    x->ne[1] = ne[1];
    x->ne[2] = at->kind == ARCH_MATRIX ? ne[2] : 1;
    x->n_rows = x->ne[1] * x->ne[2];
    x->mean = mean;
    x->std = std;
    x->type = choose_type(c, pn, at->role, layer, ne0, x->ne[2], name);
    // fast_row has a case for every type vela runs; a type added to
    // quant_type_supported needs one there too.
    x->fast = c->weights == MKMODEL_WEIGHTS_FAST && at->kind == ARCH_MATRIX && mean == 0.0f &&
              quant_type_supported(x->type);
    x->row_bytes = ggml_row_bytes(x->type, ne0);
    x->nbytes = (uint64_t)x->row_bytes * (uint64_t)x->n_rows;
}

static void mk_dims(const struct mkmodel_config *c, struct arch_dims *d) {
    arch_dims_make(d, c->n_embd, c->n_vocab, c->n_ff, c->n_head, c->n_head_kv, c->head_dim,
                   c->head_dim, c->n_rot);
    arch_dims_set_moe(d, c->n_expert, c->n_ff_exp, c->n_ff_shexp);
}

// The block table of a resolved config (with experts when it has them).
static const struct arch_tensor *mk_layer_table(const struct mkmodel_config *c) {
    return arch_layer_table(mk_arch(c), c->n_expert > 0);
}

static int64_t mk_entry_size(const struct arch_dims *d, const struct arch_tensor *t) {
    return d->d[t->ne[0]] * d->d[t->ne[1]] * d->d[t->ne[2]];
}

// Whether a synthetic model has table entry t: every required tensor; of the
// optional ones, an untied head and the rope factors when asked for.
static bool mk_writes(const struct mkmodel_config *c, const struct arch_tensor *t) {
    if (!t->optional)
        return true;
    if (t->role == ARCH_ROLE_OUTPUT)
        return !c->tied;
    if (t->role == ARCH_ROLE_ROPE_FREQS)
        return c->rope_freqs;
    return false;
}

// The values a tensor is drawn from (see mkmodel.h): token_embd ~ N(0, 1),
// matrices ~ N(0, 1/n_in), the head ~ N(0, 4/n_embd), norms ~ N(1, 0.1^2),
// biases ~ N(0, 0.5^2); rope factors are computed (rope_freqs_row).
static void mk_init(const struct mkmodel_config *c, enum arch_role role, int64_t ne0, float *mean,
                    float *std) {
    const float sE = 1.0f / sqrtf((float)c->n_embd);
    *mean = 0;
    switch (role) {
    case ARCH_ROLE_TOKEN_EMBD:
        *std = 1.0f;
        return;
    case ARCH_ROLE_OUTPUT:
        *std = 2.0f * sE;
        return;
    case ARCH_ROLE_OUTPUT_NORM:
        // Tied: the head is token_embd itself, whose row t has a large dot
        // product with itself; weights of both signs in the final norm cancel
        // that in expectation (else greedy decoding repeats the input token) and
        // their size sets the logit spread (~2), as output.weight does untied.
        if (c->tied) {
            *std = 2.0f * sE;
            return;
        }
        *mean = 1.0f;
        *std = 0.1f;
        return;
    case ARCH_ROLE_NORM:
        *mean = 1.0f;
        *std = 0.1f;
        return;
    case ARCH_ROLE_BIAS:
        *std = 0.5f;
        return;
    case ARCH_ROLE_ROPE_FREQS:
        *std = 0;
        return;
    case ARCH_ROLE_ATTN_SINKS: // of the size of the scores, so they matter
        *std = 1.0f;
        return;
    default: // the matrices of a block
        *std = 1.0f / sqrtf((float)ne0);
        return;
    }
}

static void plan_entry(struct mk_tensor *t, int *n, const struct mkmodel_config *c,
                       struct mk_plan_notes *pn, const struct arch_dims *d,
                       const struct arch_tensor *at, int layer) {
    if (!mk_writes(c, at))
        return;
    char nm[64];
    if (at->place == ARCH_PLACE_LAYER)
        snprintf(nm, sizeof nm, "blk.%d.%s", layer, at->name);
    else
        snprintf(nm, sizeof nm, "%s", at->name);
    const int64_t ne[3] = {d->d[at->ne[0]], d->d[at->ne[1]], d->d[at->ne[2]]};
    float mean, std;
    mk_init(c, at->role, ne[0], &mean, &std);
    plan_add(t, n, c, pn, at, layer, nm, ne, mean, std);
}

static int count_entries(const struct arch_tensor *t) {
    int n = 0;
    while (t[n].name)
        n++;
    return n;
}

// The tensors of a resolved config in file order (the table's, host/model/arch.h);
// *out is malloc'd.
static int plan_build(const struct mkmodel_config *c, struct mk_tensor **out, int *n_out,
                      struct verr *err) {
    const struct arch *a = mk_arch(c);
    const struct arch_tensor *layer = mk_layer_table(c);
    int cap = count_entries(a->globals) + count_entries(layer) * c->n_layer;
    struct mk_tensor *t = malloc(sizeof *t * (size_t)cap);
    if (!t)
        return verr_set(err, VERR_NOMEM, "out of memory planning %d tensors", cap);
    int n = 0;
    struct mk_plan_notes pn = {.n = 0};
    struct arch_dims d;
    mk_dims(c, &d);
    for (const struct arch_tensor *at = a->globals; at->name; at++)
        if (at->place != ARCH_PLACE_LAST)
            plan_entry(t, &n, c, &pn, &d, at, 0);
    for (int l = 0; l < c->n_layer; l++)
        for (const struct arch_tensor *at = layer; at->name; at++)
            plan_entry(t, &n, c, &pn, &d, at, l);
    for (const struct arch_tensor *at = a->globals; at->name; at++)
        if (at->place == ARCH_PLACE_LAST)
            plan_entry(t, &n, c, &pn, &d, at, 0);
    for (int i = 0; i < pn.n; i++) {
        const struct mk_fallback *f = &pn.fb[i];
        if (f->count == 1)
            mk_note(c, "%s: row length %lld is not a multiple of %u (the %s block); using %s",
                    f->first, (long long)f->ne0, ggml_type_get(f->from)->block_size,
                    ggml_type_name(f->from), ggml_type_name(f->to));
        else
            mk_note(c,
                    "%d tensors (%s, ...): row length %lld is not a multiple of %u (the %s "
                    "block); using %s",
                    f->count, f->first, (long long)f->ne0, ggml_type_get(f->from)->block_size,
                    ggml_type_name(f->from), ggml_type_name(f->to));
    }
    *out = t;
    *n_out = n;
    return 0;
}

int64_t mkmodel_count_params(const struct mkmodel_config *c) {
    const struct arch *a = mk_arch(c);
    if (!a)
        return 0;
    struct arch_dims d;
    mk_dims(c, &d);
    int64_t global = 0, layer = 0;
    for (const struct arch_tensor *t = a->globals; t->name; t++)
        if (mk_writes(c, t))
            global += mk_entry_size(&d, t);
    for (const struct arch_tensor *t = mk_layer_table(c); t->name; t++)
        if (mk_writes(c, t))
            layer += mk_entry_size(&d, t);
    return global + c->n_layer * layer;
}

// --- random numbers ------------------------------------------------------------

static inline uint64_t mix64(uint64_t z) { // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// wyrand: one 64-bit state, one 64x64->128 multiply per draw.
static inline uint64_t rng_next(uint64_t *s) {
    *s += 0xa0761d6478bd642full;
    __uint128_t m = (__uint128_t)*s * (*s ^ 0xe7037ed1a0b428dbull);
    return (uint64_t)(m >> 64) ^ (uint64_t)m;
}

// Approximately N(0, 1): Irwin-Hall sum of the four 16-bit fields of one
// draw (mean 4 * 32767.5, variance 4 * (65536^2 - 1) / 12), standardized.
// Tails stop at +-3.46; good enough for weights and cheap (no log, no table).
static inline float rng_normal(uint64_t *s) {
    uint64_t x = rng_next(s);
    uint64_t p = (x & 0x0000FFFF0000FFFFull) + ((x >> 16) & 0x0000FFFF0000FFFFull);
    uint32_t sum = (uint32_t)p + (uint32_t)(p >> 32);
    return ((float)sum - 131070.0f) * (1.0f / 37837.22f);
}

// Llama 3.1's per-dimension frequency factors (as llama.cpp's converter
// computes them for rope_freqs.weight): 1 for short wavelengths, `factor`
// for long ones, a smooth blend between.
static void rope_freqs_row(const struct mkmodel_config *c, float *dst) {
    const double low_freq_factor = 1.0, high_freq_factor = 4.0;
    const double old_ctx = c->rope_freqs_orig_ctx, factor = c->rope_freqs_factor;
    const double low_wavelen = old_ctx / low_freq_factor, high_wavelen = old_ctx / high_freq_factor;
    for (int i = 0; i < c->n_rot / 2; i++) {
        double freq = 1.0 / pow(c->rope_freq_base, (2.0 * i) / c->n_rot);
        double wavelen = 2.0 * M_PI / freq;
        double f;
        if (wavelen < high_wavelen)
            f = 1.0;
        else if (wavelen > low_wavelen)
            f = factor;
        else {
            double smooth =
                (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        dst[i] = (float)f;
    }
}

// --- fast weights ---------------------------------------------------------------------
//
// Random but valid blocks, written without floats or a quantizer (see
// mkmodel.h). Quant bits come straight from the generator; each type's level
// distribution has a known variance `unit`, and the scales are set so that
// the dequantized values have std `std`:
//   Q8_0  q = +-m, m uniform 0..127 (sign-magnitude from one byte)
//   Q4_0  nibble n, x = (n - 8) d, n == 0 (-8) becomes 8 (0): -7..7, 0 twice
//   Q5_0  likewise, -15..15, 0 twice
//   Q4_1  x = n d + m with m = -7.5 d;  Q5_1 m = -15.5 d
//   Q4_K  x = d sc q - dmin m with dmin = 7.5 d, m = sc (sub-block mean 0),
//         sc uniform 32..63;  Q5_K dmin = 15.5 d
//   Q6_K  q - 32 in -31..31 (0 twice, as Q4_0), int8 scales +-(64..127)
//   Q2_K  x = d sc q - dmin m, q 0..3, dmin = 1.5 d, m = sc, sc uniform 8..15
//   Q3_K  q -3..3 (-4 becomes 0: 0 twice), 6-bit scales +-(16..31)
// so every type is symmetric or centred and its mean is 0 up to the f16
// rounding of m / dmin (< 1e-3 std). Each block's scale is the base scale
// times a gain from 16 levels over [0.75, 1.25]; Q4_0 / Q5_0 scales also take
// a random sign (as ggml's quantizer's do). Tensors with a mean (norms) or a
// type not listed never come here.

#define FAST_TAB 4096 // levels of the normal table (12 bits per value)

static float fast_normal[FAST_TAB]; // N(0, 1) quantiles, rescaled to rms exactly 1
static pthread_once_t fast_once = PTHREAD_ONCE_INIT;

static void fast_init(void) {
    // Quantile (i + 0.5) / FAST_TAB by bisection on Phi(x) = erfc(-x / sqrt 2) / 2;
    // the upper half mirrors the lower, so the table's mean is exactly 0.
    double ss = 0;
    for (int i = 0; i < FAST_TAB / 2; i++) {
        double p = (i + 0.5) / FAST_TAB, lo = -10, hi = 0;
        for (int it = 0; it < 64; it++) {
            double mid = 0.5 * (lo + hi);
            if (0.5 * erfc(-mid / M_SQRT2) < p)
                lo = mid;
            else
                hi = mid;
        }
        double x = 0.5 * (lo + hi);
        fast_normal[i] = (float)x;
        fast_normal[FAST_TAB - 1 - i] = (float)-x;
        ss += 2 * x * x;
    }
    float r = (float)(1.0 / sqrt(ss / FAST_TAB));
    for (int i = 0; i < FAST_TAB; i++)
        fast_normal[i] *= r;
}

// Variance of levels -nmax..nmax where 0 is drawn twice as often (2 nmax + 2 codes).
static double var_sym(int nmax) {
    double s = 0;
    for (int k = 1; k <= nmax; k++)
        s += 2.0 * k * k;
    return s / (2 * nmax + 2);
}

// Variance of n equally likely levels.
static double var_uniform(int n) {
    return ((double)n * n - 1) / 12;
}

// Mean square of the integers lo..hi.
static double mean_sq(int lo, int hi) {
    double s = 0;
    for (int k = lo; k <= hi; k++)
        s += (double)k * k;
    return s / (hi - lo + 1);
}

// The mean square of IQ4_NL's 16 levels.
static double iq4_mean_sq(void) {
    double s = 0;
    for (int k = 0; k < 16; k++)
        s += (double)quant_iq4_levels[k] * quant_iq4_levels[k];
    return s / 16;
}

// Block gain k (0..15) and the mean square of the 16 gains.
static inline float fast_gain(unsigned k) {
    return 0.75f + ((float)k + 0.5f) * (1.0f / 32.0f);
}
static double gain_ms(void) {
    double s = 0;
    for (unsigned k = 0; k < 16; k++)
        s += (double)fast_gain(k) * fast_gain(k);
    return s / 16;
}

// Variance of one dequantized value per unit of the block scale d (times the
// sub-block scale's mean square for K-quants), before the gain.
static double fast_unit_var(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_Q8_0:
        return var_sym(127);
    case GGML_TYPE_Q4_0:
        return var_sym(7);
    case GGML_TYPE_Q5_0:
        return var_sym(15);
    case GGML_TYPE_Q4_1:
        return var_uniform(16);
    case GGML_TYPE_Q5_1:
        return var_uniform(32);
    case GGML_TYPE_Q4_K:
        return var_uniform(16) * mean_sq(32, 63);
    case GGML_TYPE_Q5_K:
        return var_uniform(32) * mean_sq(32, 63);
    case GGML_TYPE_Q6_K:
        return var_sym(31) * mean_sq(64, 127);
    case GGML_TYPE_Q2_K:
        return var_uniform(4) * mean_sq(8, 15);
    case GGML_TYPE_Q3_K:
        return var_sym(3) * mean_sq(16, 31);
    case GGML_TYPE_IQ4_NL: // the block's sign is random: mean 0, variance the levels' mean square
        return iq4_mean_sq();
    case GGML_TYPE_IQ4_XS:
        return iq4_mean_sq() * mean_sq(16, 31);
    case GGML_TYPE_MXFP4: // the doubled E2M1 levels' mean square, times 2.5 for the two scales
        return 34.25 * 2.5;
    default:
        return 1;
    }
}

// The block scale before the gain that gives values of std `std`.
static float fast_base(enum ggml_type t, float std) {
    return (float)(std / sqrt(fast_unit_var(t) * gain_ms()));
}

static inline void put_f16(uint8_t *p, float v) {
    uint16_t h = quant_f32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static inline void fill_rand(uint64_t *s, uint8_t *p, size_t n) {
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t x = rng_next(s);
        memcpy(p, &x, 8);
    }
    if (n) {
        uint64_t x = rng_next(s);
        memcpy(p, &x, n);
    }
}

// Nibble 0 -> 8 in each of the 16 nibbles of x (value -8 becomes 0).
static inline uint64_t nib_zero_to_8(uint64_t x) {
    uint64_t t = x | (x >> 1);
    t |= t >> 2;
    return x | ((~t & 0x1111111111111111ull) << 3);
}

static void nib_remap16(uint8_t *qs) { // 16 bytes of packed nibbles
    for (int k = 0; k < 2; k++) {
        uint64_t x;
        memcpy(&x, qs + 8 * k, 8);
        x = nib_zero_to_8(x);
        memcpy(qs + 8 * k, &x, 8);
    }
}

// Q5_0 / Q5_1 high bits: bit j of qh is the fifth bit of element j (low
// nibble of qs[j]) and bit j + 16 that of element j + 16 (high nibble).
// Sets the fifth bit of every element whose nibble is 0 (Q5_0: -16 -> 0).
static void q5_remap(uint8_t *qh, const uint8_t *qs) {
    uint32_t z = 0;
    for (int j = 0; j < 16; j++) {
        z |= (uint32_t)((qs[j] & 0x0f) == 0) << j;
        z |= (uint32_t)((qs[j] >> 4) == 0) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh[k] |= (uint8_t)(z >> (8 * k));
}

// The 12 scale bytes of Q4_K / Q5_K from 8 scales and 8 mins of 6 bits (the
// inverse of quant.c's k4_scale_min).
static void k4_pack(uint8_t *s, const uint8_t sc[8], const uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

// One row of n values of type t into dst, from generator *s. Block types:
// base is fast_base(t, std); F32/F16/BF16: tab holds fast_table(t, std).
static void fast_row(enum ggml_type t, int64_t n, float base, uint64_t *s, const void *tab,
                     uint8_t *dst) {
    const struct ggml_type_info *ti = ggml_type_get(t);
    const int64_t nb = ti->quantized ? n / ti->block_size : 0;
    uint8_t *b = dst;
    switch (t) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16: {
        // Five 12-bit table indices per draw.
        const size_t es = t == GGML_TYPE_F32 ? 4 : 2;
        const uint8_t *tb = tab;
        int64_t i = 0;
        for (; i + 5 <= n; i += 5) {
            uint64_t x = rng_next(s);
            for (int k = 0; k < 5; k++, x >>= 12)
                memcpy(dst + es * (size_t)(i + k), tb + es * (x & (FAST_TAB - 1)), es);
        }
        for (uint64_t x = rng_next(s); i < n; i++, x >>= 12)
            memcpy(dst + es * (size_t)i, tb + es * (x & (FAST_TAB - 1)), es);
        break;
    }
    case GGML_TYPE_Q8_0:
        for (int64_t i = 0; i < nb; i++, b += 34) {
            uint64_t r = rng_next(s);
            put_f16(b, base * fast_gain(r & 15));
            fill_rand(s, b + 2, 32);
            for (int j = 0; j < 32; j++) { // sign-magnitude: +-(low 7 bits)
                uint8_t m = b[2 + j] & 0x7f, neg = (uint8_t)(b[2 + j] >> 7);
                b[2 + j] = (uint8_t)((m ^ (uint8_t)(0u - neg)) + neg);
            }
        }
        break;
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q5_0: {
        const bool q5 = t == GGML_TYPE_Q5_0;
        const size_t bs = q5 ? 22 : 18;
        for (int64_t i = 0; i < nb; i++, b += bs) {
            uint64_t r = rng_next(s);
            put_f16(b, (r & 16 ? -base : base) * fast_gain(r & 15));
            fill_rand(s, b + 2, bs - 2); // Q5_0: qh[4] then qs[16]
            if (q5)
                q5_remap(b + 2, b + 6);
            else
                nib_remap16(b + 2);
        }
        break;
    }
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1: {
        const bool q5 = t == GGML_TYPE_Q5_1;
        const size_t bs = q5 ? 24 : 20;
        for (int64_t i = 0; i < nb; i++, b += bs) {
            uint64_t r = rng_next(s);
            const float d = quant_fp16_to_f32(quant_f32_to_fp16(base * fast_gain(r & 15)));
            put_f16(b, d);
            put_f16(b + 2, (q5 ? -15.5f : -7.5f) * d);
            fill_rand(s, b + 4, bs - 4);
        }
        break;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        const bool q5 = t == GGML_TYPE_Q5_K;
        const size_t bs = q5 ? 176 : 144;
        for (int64_t i = 0; i < nb; i++, b += bs) {
            uint64_t r = rng_next(s);
            const float d = quant_fp16_to_f32(quant_f32_to_fp16(base * fast_gain(r & 15)));
            put_f16(b, d);
            put_f16(b + 2, (q5 ? 15.5f : 7.5f) * d);
            uint8_t sc[8];
            for (int j = 0; j < 8; j++)
                sc[j] = (uint8_t)(32 + ((r >> (4 + 5 * j)) & 31));
            k4_pack(b + 4, sc, sc); // m = sc: dmin m = (7.5 | 15.5) d sc, the level mean
            fill_rand(s, b + 16, bs - 16);
        }
        break;
    }
    case GGML_TYPE_Q6_K:
        for (int64_t i = 0; i < nb; i++, b += 210) {
            fill_rand(s, b, 192); // ql[128], qh[64]
            // Level 0 (-32) -> 32 (0): set the top bit of an all-zero 6-bit value.
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = b + 64 * h;
                uint8_t *qh = b + 128 + 32 * h;
                for (int sh = 0; sh < 4; sh++) {
                    const uint8_t *qls = ql + 32 * (sh & 1);
                    const int ls = 4 * (sh >> 1), hs = 2 * sh;
                    for (int l = 0; l < 32; l++)
                        if (((qls[l] >> ls) & 0x0f) == 0 && ((qh[l] >> hs) & 3) == 0)
                            qh[l] |= (uint8_t)(2u << hs);
                }
            }
            uint64_t r0 = rng_next(s), r1 = rng_next(s);
            for (int j = 0; j < 16; j++) { // 7 bits each: magnitude 64..127, sign
                unsigned v = (unsigned)((j < 8 ? r0 >> (7 * j) : r1 >> (7 * (j - 8))) & 127);
                int sc = 64 + (int)(v & 63);
                b[192 + j] = (uint8_t)(int8_t)(v & 64 ? -sc : sc);
            }
            put_f16(b + 208, base * fast_gain((unsigned)(r1 >> 60)));
        }
        break;
    case GGML_TYPE_Q2_K:
        for (int64_t i = 0; i < nb; i++, b += 84) {
            uint64_t r = rng_next(s);
            const float d = quant_fp16_to_f32(quant_f32_to_fp16(base * fast_gain(r & 15)));
            for (int g = 0; g < 16; g++) { // m = sc: dmin m = 1.5 d sc, the level mean
                const unsigned sc = 8 + (unsigned)((r >> (4 + 3 * g)) & 7);
                b[g] = (uint8_t)(sc | (sc << 4));
            }
            fill_rand(s, b + 16, 64);
            put_f16(b + 80, d);
            put_f16(b + 82, 1.5f * d);
        }
        break;
    case GGML_TYPE_Q3_K:
        for (int64_t i = 0; i < nb; i++, b += 110) {
            fill_rand(s, b, 96); // hmask[32], qs[64]
            // Level -4 (low bits 0, third bit clear) -> 0: set the third bit.
            for (int e = 0; e < 256; e++) {
                const int h = e / 128, sh = (e / 32) % 4, l = e % 32;
                if (((b[32 + 32 * h + l] >> (2 * sh)) & 3) == 0)
                    b[l] |= (uint8_t)(1u << (e / 32));
            }
            uint64_t r0 = rng_next(s), r1 = rng_next(s);
            int sc[16];
            for (int g = 0; g < 16; g++) { // 5 bits each: magnitude 16..31, sign
                const unsigned v = (unsigned)((g < 8 ? r0 >> (5 * g) : r1 >> (5 * (g - 8))) & 31);
                sc[g] = (v & 16) ? -(int)(16 + (v & 15)) : (int)(16 + (v & 15));
            }
            quant_q3_k_pack_scales(b + 96, sc);
            put_f16(b + 108, base * fast_gain((unsigned)(r1 >> 60)));
        }
        break;
    case GGML_TYPE_IQ4_NL: // the levels are not centred: a random sign per block
        for (int64_t i = 0; i < nb; i++, b += 18) {
            uint64_t r = rng_next(s);
            put_f16(b, (r & 16 ? -base : base) * fast_gain(r & 15));
            fill_rand(s, b + 2, 16);
        }
        break;
    case GGML_TYPE_IQ4_XS:
        for (int64_t i = 0; i < nb; i++, b += 136) {
            uint64_t r = rng_next(s);
            int sc[8];
            for (int g = 0; g < 8; g++) { // 5 bits each: magnitude 16..31, sign
                const unsigned v = (unsigned)((r >> (4 + 5 * g)) & 31);
                sc[g] = (v & 16) ? -(int)(16 + (v & 15)) : (int)(16 + (v & 15));
            }
            put_f16(b, base * fast_gain(r & 15));
            quant_iq4_xs_pack_scales(b, sc);
            fill_rand(s, b + 8, 128);
        }
        break;
    case GGML_TYPE_MXFP4: { // E8M0 scales 2^(e - 128), e one of two powers of two
        const int e0 = 128 + (int)lrintf(log2f(base * sqrtf((float)gain_ms())));
        for (int64_t i = 0; i < nb; i++, b += 17) {
            const int e = e0 + (int)(rng_next(s) & 1);
            b[0] = (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
            fill_rand(s, b + 1, 16);
        }
        break;
    }
    default:
        break; // not quant_type_supported: never called
    }
}

// The 4096 stored values of an F32/F16/BF16 tensor of std `std`.
static void fast_table(enum ggml_type t, float std, void *tab) {
    pthread_once(&fast_once, fast_init);
    for (int k = 0; k < FAST_TAB; k++) {
        float v = std * fast_normal[k];
        if (t == GGML_TYPE_F32)
            ((float *)tab)[k] = v;
        else if (t == GGML_TYPE_F16)
            ((uint16_t *)tab)[k] = quant_f32_to_fp16(v);
        else
            ((uint16_t *)tab)[k] = quant_f32_to_bf16(v);
    }
}

// --- the pipeline --------------------------------------------------------------------

struct mk_job {
    int tensor;
    int64_t row0, row1;
    size_t nbytes;
};

struct mk_pipe {
    const struct mkmodel_config *cfg;
    const struct mk_tensor *tensors;
    const struct mk_job *jobs;
    int64_t n_jobs;
    int n_slots;
    uint8_t **slot;    // [n_slots][slot_bytes]
    int64_t *slot_job; // [n_slots] job whose data the slot holds when ready, else -1
    int64_t next_job;  // next job a worker claims
    int64_t n_written; // jobs the writer has finished
    int64_t max_ne0;
    bool abort;
    struct verr err; // first worker error
    pthread_mutex_t mu;
    pthread_cond_t ready; // a slot became ready
    pthread_cond_t free_; // the writer freed a slot (or abort)
};

// A worker's buffers: a float row for the exact path, the fast path's
// per-tensor constants (made again when the tensor changes).
struct mk_gen {
    float *buf; // [max_ne0]
    int tensor; // whose base / tab these are; -1: none
    float base;
    union {
        float f32[FAST_TAB];
        uint16_t u16[FAST_TAB];
    } tab; // fast_table of an F32 (f32) or F16/BF16 (u16) tensor
};

static int gen_rows(const struct mkmodel_config *c, const struct mk_tensor *t, int ti, int64_t r0,
                    int64_t r1, struct mk_gen *g, uint8_t *dst, struct verr *err) {
    const int64_t n = t->ne[0];
    float *buf = g->buf;
    if (t->fast && g->tensor != ti) {
        g->tensor = ti;
        if (ggml_type_get(t->type)->quantized)
            g->base = fast_base(t->type, t->std);
        else
            fast_table(t->type, t->std, &g->tab);
    }
    for (int64_t r = r0; r < r1; r++, dst += t->row_bytes) {
        uint64_t s = mix64(c->seed ^ mix64(((uint64_t)ti << 40) ^ (uint64_t)r ^ 0x5bd1e995ull));
        if (t->fast) {
            fast_row(t->type, n, g->base, &s, &g->tab, dst);
            continue;
        }
        if (t->role == ARCH_ROLE_ROPE_FREQS) {
            rope_freqs_row(c, buf);
        } else {
            const float mean = t->mean, std = t->std;
            for (int64_t i = 0; i < n; i++)
                buf[i] = mean + std * rng_normal(&s);
        }
        switch (t->type) {
        case GGML_TYPE_F32:
            memcpy(dst, buf, (size_t)n * sizeof(float));
            break;
        case GGML_TYPE_F16:
            for (int64_t i = 0; i < n; i++) {
                uint16_t h = quant_f32_to_fp16(buf[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case GGML_TYPE_BF16:
            for (int64_t i = 0; i < n; i++) {
                uint16_t h = quant_f32_to_bf16(buf[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
            break;
        default:
            if (quant_quantize_row(t->type, buf, dst, n, err))
                return verr_wrap(err, "%s row %lld", t->name, (long long)r);
        }
    }
    return 0;
}

static void *worker_main(void *arg) {
    struct mk_pipe *p = arg;
    struct mk_gen *g = malloc(sizeof *g);
    float *buf = malloc(sizeof(float) * (size_t)p->max_ne0);
    struct verr err = {0};
    pthread_mutex_lock(&p->mu);
    if ((!buf || !g) && !p->abort) {
        p->abort = true;
        verr_set(&p->err, VERR_NOMEM, "out of memory for a row buffer");
        pthread_cond_broadcast(&p->ready);
        pthread_cond_broadcast(&p->free_);
    }
    if (g) {
        g->buf = buf;
        g->tensor = -1;
    }
    for (;;) {
        while (!p->abort && p->next_job < p->n_jobs && p->next_job - p->n_written >= p->n_slots)
            pthread_cond_wait(&p->free_, &p->mu);
        if (p->abort || p->next_job >= p->n_jobs)
            break;
        int64_t j = p->next_job++;
        pthread_mutex_unlock(&p->mu);
        const struct mk_job *job = &p->jobs[j];
        int s = (int)(j % p->n_slots);
        int rc = gen_rows(p->cfg, &p->tensors[job->tensor], job->tensor, job->row0, job->row1, g,
                          p->slot[s], &err);
        pthread_mutex_lock(&p->mu);
        if (rc) {
            if (!p->abort)
                p->err = err;
            p->abort = true;
            pthread_cond_broadcast(&p->free_);
        } else {
            p->slot_job[s] = j;
        }
        pthread_cond_broadcast(&p->ready);
    }
    pthread_mutex_unlock(&p->mu);
    free(buf);
    free(g);
    return NULL;
}

static void pipe_abort(struct mk_pipe *p) {
    pthread_mutex_lock(&p->mu);
    p->abort = true;
    pthread_cond_broadcast(&p->free_);
    pthread_cond_broadcast(&p->ready);
    pthread_mutex_unlock(&p->mu);
}

// Generates every tensor's data and streams it into `w` (after
// gguf_writer_begin), in declaration order.
static int pipe_run(const struct mkmodel_config *c, const struct mk_tensor *t, int n_tensors,
                    struct gguf_writer *w, struct verr *err) {
    int64_t n_jobs = 0, max_ne0 = 1;
    size_t slot_bytes = 1;
    uint64_t total = 0;
    for (int i = 0; i < n_tensors; i++) {
        int64_t per = (int64_t)(MK_CHUNK_BYTES / t[i].row_bytes);
        if (per < 1)
            per = 1;
        n_jobs += (t[i].n_rows + per - 1) / per;
        if (t[i].ne[0] > max_ne0)
            max_ne0 = t[i].ne[0];
        size_t b = (size_t)(per < t[i].n_rows ? per : t[i].n_rows) * t[i].row_bytes;
        if (b > slot_bytes)
            slot_bytes = b;
        total += t[i].nbytes;
    }
    struct mk_job *jobs = malloc(sizeof *jobs * (size_t)n_jobs);
    if (!jobs)
        return verr_set(err, VERR_NOMEM, "out of memory for %lld jobs", (long long)n_jobs);
    int64_t j = 0;
    for (int i = 0; i < n_tensors; i++) {
        int64_t per = (int64_t)(MK_CHUNK_BYTES / t[i].row_bytes);
        if (per < 1)
            per = 1;
        for (int64_t r = 0; r < t[i].n_rows; r += per) {
            int64_t r1 = r + per < t[i].n_rows ? r + per : t[i].n_rows;
            jobs[j++] = (struct mk_job){i, r, r1, (size_t)(r1 - r) * t[i].row_bytes};
        }
    }

    int n_workers = c->n_threads;
    struct mk_pipe p;
    memset(&p, 0, sizeof p);
    p.cfg = c;
    p.tensors = t;
    p.jobs = jobs;
    p.n_jobs = n_jobs;
    p.n_slots = 2 * n_workers + 2;
    p.max_ne0 = max_ne0;
    p.slot = calloc((size_t)p.n_slots, sizeof *p.slot);
    p.slot_job = malloc(sizeof *p.slot_job * (size_t)p.n_slots);
    pthread_t *th = calloc((size_t)n_workers, sizeof *th);
    int rc = 0;
    if (!p.slot || !p.slot_job || !th)
        rc = verr_set(err, VERR_NOMEM, "out of memory for the write pipeline");
    for (int s = 0; rc == 0 && s < p.n_slots; s++) {
        p.slot_job[s] = -1;
        if (!(p.slot[s] = malloc(slot_bytes)))
            rc = verr_set(err, VERR_NOMEM, "out of memory for %d buffers of %zu bytes", p.n_slots,
                          slot_bytes);
    }
    if (rc) {
        if (p.slot)
            for (int s = 0; s < p.n_slots; s++)
                free(p.slot[s]);
        free(p.slot);
        free(p.slot_job);
        free(th);
        free(jobs);
        return rc;
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.ready, NULL);
    pthread_cond_init(&p.free_, NULL);
    int started = 0;
    for (; started < n_workers; started++)
        if (pthread_create(&th[started], NULL, worker_main, &p) != 0)
            break;
    if (started == 0)
        rc = verr_set(err, VERR_NOMEM, "cannot start a worker thread");

    uint64_t done = 0;
    for (int64_t k = 0; rc == 0 && k < n_jobs; k++) {
        int s = (int)(k % p.n_slots);
        pthread_mutex_lock(&p.mu);
        while (!p.abort && p.slot_job[s] != k)
            pthread_cond_wait(&p.ready, &p.mu);
        bool failed = p.abort;
        pthread_mutex_unlock(&p.mu);
        if (failed) {
            rc = p.err.code ? p.err.code : VERR_IO;
            if (err)
                *err = p.err;
            break;
        }
        rc = gguf_writer_write_tensor_data(w, p.slot[s], jobs[k].nbytes, err);
        if (rc) {
            pipe_abort(&p);
            break;
        }
        done += jobs[k].nbytes;
        pthread_mutex_lock(&p.mu);
        p.slot_job[s] = -1;
        p.n_written = k + 1;
        pthread_cond_broadcast(&p.free_);
        pthread_mutex_unlock(&p.mu);
        if (c->progress &&
            (k + 1 == n_jobs || jobs[k + 1].tensor != jobs[k].tensor || (k & 15) == 15))
            c->progress(c->cb_ctx, done, total);
    }
    if (rc)
        pipe_abort(&p);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&p.free_);
    pthread_cond_destroy(&p.ready);
    pthread_mutex_destroy(&p.mu);
    for (int s = 0; s < p.n_slots; s++)
        free(p.slot[s]);
    free(p.slot);
    free(p.slot_job);
    free(th);
    free(jobs);
    return rc;
}

// --- metadata -------------------------------------------------------------------------

static int set_tokenizer_generated(struct gguf_writer *w, int n_vocab, struct verr *err) {
    struct mkvocab v;
    if (mkvocab_generate(&v, n_vocab))
        return verr_set(err, VERR_NOMEM, "out of memory building the vocabulary");
    int rc = 0;
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tokens,
                                  (uint64_t)v.n_tokens);
    rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v.token_type,
                              (uint64_t)v.n_tokens);
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges,
                                  (uint64_t)v.n_merges);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v.bos_id);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v.eos_id);
    rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    mkvocab_free(&v);
    if (rc)
        return verr_set(err, VERR_NOMEM, "cannot set the tokenizer metadata");
    return 0;
}

static int set_tokenizer_copied(struct gguf_writer *w, const char *path, struct verr *err) {
    struct gguf_file *f;
    if (gguf_open(&f, path, err))
        return verr_wrap(err, "--vocab");
    int rc = 0;
    for (uint64_t i = 0; i < f->n_kv && rc == 0; i++)
        if (!strncmp(f->kv[i].key, "tokenizer.", 10) &&
            gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].val))
            rc = verr_set(err, VERR_NOMEM, "--vocab %s: cannot copy key '%s'", path, f->kv[i].key);
    gguf_close(f);
    return rc;
}

static int set_metadata(struct gguf_writer *w, const struct mkmodel_config *c, bool quantized,
                        struct verr *err) {
    const char *a = mk_arch(c)->name;
    char k[128];
    int rc = 0;
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", a, s), k)
    rc |= gguf_writer_set_str(w, "general.architecture", a);
    rc |= gguf_writer_set_str(w, "general.name", c->name);
    int ft = c->mix != MKMODEL_MIX_NONE ? c->mix : ftype_id_of_type(c->type);
    if (ft >= 0)
        rc |= gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
    if (quantized)
        rc |= gguf_writer_set_u32(w, "general.quantization_version", 2);
    rc |= gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c->n_vocab);
    rc |= gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->n_ctx);
    rc |= gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd);
    rc |= gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->n_layer);
    rc |= gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff);
    rc |= gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head);
    rc |= gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    if ((int64_t)c->head_dim * c->n_head != c->n_embd) {
        rc |= gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
        rc |= gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    rc |= gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
    rc |= gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->n_rot);
    rc |= gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_freq_base);
    if (c->rope_scaling != MKMODEL_ROPE_SCALING_NONE) {
        rc |= gguf_writer_set_str(w, KEY("rope.scaling.type"),
                                  c->rope_scaling == MKMODEL_ROPE_SCALING_YARN ? "yarn" : "linear");
        rc |= gguf_writer_set_f32(w, KEY("rope.scaling.factor"), c->rope_scale);
        if (c->rope_scaling == MKMODEL_ROPE_SCALING_YARN)
            rc |= gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                                      (uint32_t)c->yarn_orig_ctx);
    }
    if (c->sliding_window > 0)
        rc |= gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)c->sliding_window);
    if (c->swa_pattern > 0)
        rc |= gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"),
                                  (uint32_t)c->swa_pattern);
    if (c->rope_freq_base_swa != 0)
        rc |= gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), c->rope_freq_base_swa);
    if (c->n_expert > 0) {
        const struct arch_moe *moe = &mk_arch(c)->moe;
        rc |= gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)c->n_expert);
        rc |= gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)c->n_expert_used);
        if (moe->ff_exp_key)
            rc |= gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c->n_ff_exp);
        if (moe->shexp)
            rc |= gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"),
                                      (uint32_t)c->n_ff_shexp);
    }
#undef KEY
    if (rc)
        return verr_set(err, VERR_NOMEM, "cannot set the model metadata");
    return c->vocab_path ? set_tokenizer_copied(w, c->vocab_path, err)
                         : set_tokenizer_generated(w, c->n_vocab, err);
}

int mkmodel_write(const struct mkmodel_config *cfg, const char *path, struct verr *err) {
    struct mkmodel_config c;
    int rc = mkmodel_resolve(cfg, &c, err);
    if (rc)
        return rc;
    if (c.vocab_path && cfg->n_vocab > 0 && cfg->n_vocab != c.n_vocab)
        mk_note(&c, "--vocab %s has %d tokens; n_vocab %d is replaced by it", c.vocab_path,
                c.n_vocab, cfg->n_vocab);
    // Useful shapes for testing vela, but llama.cpp refuses them: its llama
    // loader requires rope.dimension_count == head dim; its qwen2 graph
    // asserts it (GGML_ASSERT(n_embd_head == n_rot): an abort, not an error),
    // creates attn_q.weight as n_embd x n_embd (so head dim x n_head must be
    // n_embd), and has no rope_freqs.weight (a tensor it does not use is an
    // error).
    const struct arch *a = mk_arch(&c);
    const unsigned q = a->lcpp_quirks;
    if ((q & ARCH_LCPP_ROT_FULL) && c.n_rot != c.head_dim)
        mk_note(&c, "--n-rot %d != head dim %d: llama.cpp refuses such %s files", c.n_rot,
                c.head_dim, a->name);
    if ((q & ARCH_LCPP_ROT_ASSERT) && c.n_rot != c.head_dim)
        mk_note(&c,
                "--n-rot %d != head dim %d: llama.cpp's %s graph asserts n_rot == head dim "
                "and aborts on such files",
                c.n_rot, c.head_dim, a->name);
    if ((q & ARCH_LCPP_Q_SQUARE) && (int64_t)c.head_dim * c.n_head != c.n_embd)
        mk_note(&c,
                "--head-dim %d x --n-head %d != --n-embd %d: llama.cpp refuses such %s files "
                "(it expects attn_q.weight to be n_embd x n_embd)",
                c.head_dim, c.n_head, c.n_embd, a->name);
    if ((q & ARCH_LCPP_NO_ROPE_FREQS) && c.rope_freqs)
        mk_note(&c, "--rope-freqs with %s: llama.cpp refuses the extra rope_freqs.weight", a->name);
    struct mk_tensor *t = NULL;
    int n = 0;
    if ((rc = plan_build(&c, &t, &n, err)))
        return rc;
    bool quantized = false;
    for (int i = 0; i < n; i++)
        quantized |= ggml_type_get(t[i].type)->quantized;

    struct gguf_writer *w = gguf_writer_new();
    if (!w) {
        free(t);
        return verr_set(err, VERR_NOMEM, "out of memory for the GGUF writer");
    }
    rc = set_metadata(w, &c, quantized, err);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne, NULL, err);
    bool begun = false; // only a file this call created is removed on failure
    if (rc == 0)
        begun = (rc = gguf_writer_begin(w, path, err)) == 0;
    if (rc == 0)
        rc = pipe_run(&c, t, n, w, err);
    if (rc == 0)
        rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    free(t);
    if (rc && begun)
        unlink(path);
    if (rc && strncmp(err->msg, path, strlen(path)) != 0) // the writer's own name the file
        verr_wrap(err, "%s", path);
    return rc;
}
