// Model loading: hparams from metadata, tensor map checked against the
// shapes llama.cpp expects, weights uploaded through the backend.
#include "host/model/model.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"

const char *model_arch_name(enum model_arch arch) {
    const struct arch *a = arch_get(arch);
    return a ? a->name : "unknown";
}

int rope_scaling_from_name(const char *name) {
    if (!strcmp(name, "none"))
        return ROPE_SCALING_NONE;
    if (!strcmp(name, "linear"))
        return ROPE_SCALING_LINEAR;
    if (!strcmp(name, "yarn"))
        return ROPE_SCALING_YARN;
    return ROPE_SCALING_UNSPECIFIED;
}

const char *rope_scaling_name(enum rope_scaling_type t) {
    switch (t) {
    case ROPE_SCALING_NONE:
        return "none";
    case ROPE_SCALING_LINEAR:
        return "linear";
    case ROPE_SCALING_YARN:
        return "yarn";
    case ROPE_SCALING_UNSPECIFIED:
        break;
    }
    return "unspecified";
}

// --- metadata ------------------------------------------------------------------

static const char *file_name(const struct gguf_file *f) {
    return f->path ? f->path : "model";
}

// Reads {arch}.{suffix} as a positive int. Absent: *out = def when `required`
// is false, an error naming the key otherwise.
static int read_int_key(const struct gguf_file *f, const char *arch, const char *suffix,
                        bool required, int def, int *out, struct verr *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v = 0;
    int rc = gguf_get_u32(f, key, &v, err);
    if (rc == VERR_NOTFOUND) {
        if (required)
            return verr_set(err, VERR_NOTFOUND, "%s: missing key '%s'", file_name(f), key);
        *out = def;
        return 0;
    }
    if (rc)
        return rc;
    if (v > INT32_MAX)
        return verr_set(err, VERR_RANGE, "%s: key '%s' = %" PRIu32 " is too large", file_name(f),
                        key, v);
    *out = (int)v;
    return 0;
}

static int read_float_key(const struct gguf_file *f, const char *arch, const char *suffix,
                          bool required, float def, float *out, struct verr *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, out, err);
    if (rc == VERR_NOTFOUND) {
        if (required)
            return verr_set(err, VERR_NOTFOUND, "%s: missing key '%s'", file_name(f), key);
        *out = def;
        return 0;
    }
    return rc;
}

// {arch}.rope.scaling.*: type, factor (or rope.scale_linear), YaRN's
// original context and attention factor. llama.cpp: the type defaults to
// "linear", which with no factor is no scaling at all.
static int read_rope_scaling(const struct gguf_file *f, const char *arch, struct model_hparams *hp,
                             struct verr *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char *st = NULL;
    int rc = gguf_get_str(f, key, &st, err);
    if (rc == VERR_NOTFOUND) {
        hp->rope_scaling = ROPE_SCALING_LINEAR;
    } else if (rc) {
        return rc;
    } else {
        int t = rope_scaling_from_name(st);
        if (t < 0) {
            rc = verr_set(err, VERR_UNSUPPORTED,
                          "%s: %s = '%s' is not supported (none, linear, yarn)", file_name(f), key,
                          st);
            free(st);
            return rc;
        }
        free(st);
        hp->rope_scaling = (enum rope_scaling_type)t;
    }
    float factor = 0;
    if ((rc = read_float_key(f, arch, "rope.scaling.factor", false, 0, &factor, err)))
        return rc;
    if (factor == 0 && (rc = read_float_key(f, arch, "rope.scale_linear", false, 0, &factor, err)))
        return rc;
    if (factor < 0)
        return verr_set(err, VERR_RANGE, "%s: rope scaling factor %g must be > 0", file_name(f),
                        factor);
    hp->rope_freq_scale = factor == 0 ? 1.0f : 1.0f / factor;
    if ((rc = read_int_key(f, arch, "rope.scaling.original_context_length", false, hp->n_ctx_train,
                           &hp->n_ctx_orig_yarn, err)))
        return rc;
    return read_float_key(f, arch, "rope.scaling.attn_factor", false, 1.0f, &hp->rope_attn_factor,
                          err);
}

// Sliding-window attention, as llama.cpp's gemma3 and gpt-oss loaders read
// it: a window only when {arch}.attention.sliding_window is present and > 0
// (and the architecture has local layers; gpt-oss requires it); the pattern
// defaults to the architecture's, the local layers' RoPE base to 10000
// (gpt-oss: the file's base). A final logit
// soft-cap (which vela does not apply) is refused rather than ignored.
static int read_swa(const struct gguf_file *f, const char *arch, const struct arch *ad,
                    struct model_hparams *hp, struct verr *err) {
    int rc;
    float softcap = 0;
    if ((rc = read_float_key(f, arch, "final_logit_softcapping", false, 0, &softcap, err)))
        return rc;
    if (softcap != 0)
        return verr_set(err, VERR_UNSUPPORTED,
                        "%s: %s.final_logit_softcapping = %g: logit soft-capping is not supported",
                        file_name(f), arch, softcap);
    hp->sliding_window = 0;
    hp->swa_pattern = 0;
    const float base_swa = ad->block.swa_rope_trained ? hp->rope_freq_base : 10000.0f;
    hp->rope_freq_base_swa = base_swa;
    if (!ad->block.sliding_window_pattern)
        return 0;
    if ((rc = read_int_key(f, arch, "attention.sliding_window", ad->block.swa_required, 0,
                           &hp->sliding_window, err)) ||
        (rc = read_int_key(f, arch, "attention.sliding_window_pattern", false,
                           ad->block.sliding_window_pattern, &hp->swa_pattern, err)) ||
        (rc = read_float_key(f, arch, "rope.freq_base_swa", false, base_swa,
                             &hp->rope_freq_base_swa, err)))
        return rc;
    if (ad->block.swa_required && hp->sliding_window <= 0)
        return verr_set(err, VERR_RANGE, "%s: %s.attention.sliding_window = %d must be > 0",
                        file_name(f), arch, hp->sliding_window);
    if (!(hp->rope_freq_base_swa > 0))
        return verr_set(err, VERR_RANGE, "%s: %s.rope.freq_base_swa = %g must be > 0", file_name(f),
                        arch, hp->rope_freq_base_swa);
    return 0;
}

// Experts, as llama.cpp's loader reads them: {arch}.expert_count and
// expert_used_count (default 0); the experts' width (ff_exp_key: the
// expert_feed_forward_length key, default n_ff / k; else n_ff) and the
// shared expert's (expert_shared_feed_forward_length, default n_ff). A file
// with experts on an architecture without a table for them, k outside [1,
// n_expert], or expert groups (DeepSeek's routing, not implemented) is
// refused by key.
static int read_moe(const struct gguf_file *f, const char *arch, const struct arch *ad,
                    struct model_hparams *hp, struct verr *err) {
    int rc, groups = 0;
    if ((rc = read_int_key(f, arch, "expert_count", false, 0, &hp->n_expert, err)) ||
        (rc = read_int_key(f, arch, "expert_used_count", false, 0, &hp->n_expert_used, err)) ||
        (rc = read_int_key(f, arch, "expert_group_count", false, 0, &groups, err)))
        return rc;
    if (hp->n_expert == 0) {
        if (ad->moe.required)
            return verr_set(err, VERR_RANGE,
                            "%s: %s needs experts: key '%s.expert_count' is missing or 0",
                            file_name(f), arch, arch);
        if (hp->n_expert_used != 0)
            return verr_set(err, VERR_RANGE, "%s: %s.expert_used_count = %d without experts",
                            file_name(f), arch, hp->n_expert_used);
        return 0;
    }
    if (!ad->layer_moe)
        return verr_set(err, VERR_UNSUPPORTED,
                        "%s: %s.expert_count = %d: vela runs no %s blocks with experts",
                        file_name(f), arch, hp->n_expert, arch);
    if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
        return verr_set(err, VERR_RANGE,
                        "%s: %s.expert_used_count = %d must be in [1, expert_count = %d]",
                        file_name(f), arch, hp->n_expert_used, hp->n_expert);
    if (groups > 1)
        return verr_set(err, VERR_UNSUPPORTED,
                        "%s: %s.expert_group_count = %d: routing by expert groups is not supported",
                        file_name(f), arch, groups);
    hp->n_ff_exp = hp->n_ff;
    if (ad->moe.ff_exp_key && (rc = read_int_key(f, arch, "expert_feed_forward_length", false,
                                                 hp->n_ff / hp->n_expert_used, &hp->n_ff_exp, err)))
        return rc;
    if (ad->moe.shexp && (rc = read_int_key(f, arch, "expert_shared_feed_forward_length", false,
                                            hp->n_ff, &hp->n_ff_shexp, err)))
        return rc;
    if (hp->n_ff_exp <= 0 || (ad->moe.shexp && hp->n_ff_shexp <= 0))
        return verr_set(err, VERR_RANGE,
                        "%s: %s: expert feed-forward lengths must be > 0 (experts %d, shared %d)",
                        file_name(f), arch, hp->n_ff_exp, hp->n_ff_shexp);
    return 0;
}

int model_read_hparams(const struct gguf_file *f, struct model_hparams *hp, struct verr *err) {
    memset(hp, 0, sizeof *hp);
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", &arch, err);
    if (rc == VERR_NOTFOUND)
        return verr_set(err, VERR_NOTFOUND, "%s: missing key 'general.architecture'", file_name(f));
    if (rc)
        return rc;
    const struct arch *ad = arch_find(arch);
    if (!ad) {
        char names[256];
        rc = verr_set(err, VERR_UNSUPPORTED, "%s: unknown model architecture: '%s' (supported: %s)",
                      file_name(f), arch, arch_names(names, sizeof names));
        free(arch);
        return rc;
    }
    hp->arch = ad->id;
    hp->rope_mode = ad->rope_mode;
    hp->has_bias_qkv = ad->block.bias_qkv;

    if ((rc = read_int_key(f, arch, "context_length", true, 0, &hp->n_ctx_train, err)) ||
        (rc = read_int_key(f, arch, "embedding_length", true, 0, &hp->n_embd, err)) ||
        (rc = read_int_key(f, arch, "block_count", true, 0, &hp->n_layer, err)) ||
        (rc = read_int_key(f, arch, "feed_forward_length", true, 0, &hp->n_ff, err)) ||
        (rc = read_int_key(f, arch, "attention.head_count", true, 0, &hp->n_head, err)))
        goto out;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 ||
        hp->n_ctx_train <= 0) {
        rc = verr_set(err, VERR_RANGE,
                      "%s: bad hyperparameters: embedding_length %d, block_count %d, "
                      "feed_forward_length %d, head_count %d, context_length %d (all must be > 0)",
                      file_name(f), hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_ctx_train);
        goto out;
    }
    if ((rc = read_int_key(f, arch, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv,
                           err)))
        goto out;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv) {
        rc = verr_set(err, VERR_RANGE,
                      "%s: %s.attention.head_count_kv = %d must divide head_count = %d",
                      file_name(f), arch, hp->n_head_kv, hp->n_head);
        goto out;
    }
    int def_hd = hp->n_embd % hp->n_head ? 0 : hp->n_embd / hp->n_head;
    if ((rc = read_int_key(f, arch, "attention.key_length", false, def_hd, &hp->head_dim, err)) ||
        (rc = read_int_key(f, arch, "attention.value_length", false, def_hd, &hp->head_dim_v, err)))
        goto out;
    if (hp->head_dim <= 0 || hp->head_dim_v <= 0) {
        rc = verr_set(err, VERR_RANGE,
                      "%s: head dims must be > 0 (key_length %d, value_length %d; "
                      "embedding_length %d, head_count %d)",
                      file_name(f), hp->head_dim, hp->head_dim_v, hp->n_embd, hp->n_head);
        goto out;
    }
    if ((rc = read_int_key(f, arch, "rope.dimension_count", false, hp->head_dim, &hp->n_rot, err)))
        goto out;
    if (hp->n_rot <= 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim) {
        rc = verr_set(err, VERR_RANGE,
                      "%s: %s.rope.dimension_count = %d must be even, > 0 and <= the head "
                      "dim %d",
                      file_name(f), arch, hp->n_rot, hp->head_dim);
        goto out;
    }
    if ((rc = read_float_key(f, arch, "attention.layer_norm_rms_epsilon", true, 0, &hp->norm_eps,
                             err)) ||
        (rc = read_float_key(f, arch, "rope.freq_base", false, ad->rope_freq_base,
                             &hp->rope_freq_base, err)))
        goto out;
    if (!(hp->norm_eps >= 0) || !(hp->rope_freq_base > 0)) {
        rc = verr_set(err, VERR_RANGE, "%s: bad rms epsilon %g or rope freq base %g", file_name(f),
                      hp->norm_eps, hp->rope_freq_base);
        goto out;
    }

    if ((rc = read_rope_scaling(f, arch, hp, err)) || (rc = read_swa(f, arch, ad, hp, err)) ||
        (rc = read_moe(f, arch, ad, hp, err)))
        goto out;

    const struct gguf_tensor_info *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te) {
        rc = verr_set(err, VERR_NOTFOUND, "%s: missing tensor 'token_embd.weight'", file_name(f));
        goto out;
    }
    if (te->ne[1] <= 0 || te->ne[1] > INT32_MAX) {
        rc = verr_set(err, VERR_RANGE, "%s: token_embd.weight: bad vocabulary size %" PRId64,
                      file_name(f), te->ne[1]);
        goto out;
    }
    hp->n_vocab = (int)te->ne[1];
    rc = 0;
out:
    free(arch);
    return rc;
}

// --- tensors -------------------------------------------------------------------

static void format_shape(char *buf, size_t cap, int n, const int64_t *ne) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, i ? ", " : "", ne[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

// Finds `name` and checks its shape against want[0..n-1] (ggml order, ne0
// first; trailing dims of the file tensor must be 1, as llama.cpp checks).
static int tensor_check(const struct gguf_file *f, const char *name, int n, const int64_t *want,
                        bool optional, const struct gguf_tensor_info **out, struct verr *err) {
    *out = NULL;
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    char ws[96], fs[96];
    format_shape(ws, sizeof ws, n, want);
    if (!t) {
        if (optional)
            return 0;
        return verr_set(err, VERR_NOTFOUND, "%s: missing tensor '%s' (expected shape %s)",
                        file_name(f), name, ws);
    }
    bool ok = true;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) {
        int64_t w = i < n ? want[i] : 1;
        if (t->ne[i] != w)
            ok = false;
    }
    if (!ok) {
        int nd = (int)t->n_dims;
        if (nd < 1)
            nd = 1;
        if (nd > GGUF_MAX_DIMS)
            nd = GGUF_MAX_DIMS;
        format_shape(fs, sizeof fs, nd, t->ne);
        return verr_set(err, VERR_FORMAT, "%s: expected shape %s, found %s", name, ws, fs);
    }
    *out = t;
    return 0;
}

static int model_track(struct model *m, void *p, struct verr *err) {
    if (m->n_allocs == m->cap_allocs) {
        int cap = m->cap_allocs ? m->cap_allocs * 2 : 64;
        void **na = realloc(m->allocs, (size_t)cap * sizeof *na);
        if (!na)
            return verr_set(err, VERR_NOMEM, "out of host memory");
        m->allocs = na;
        m->cap_allocs = cap;
    }
    m->allocs[m->n_allocs++] = p;
    return 0;
}

// --- the load plan: every tensor's place in one backend allocation ------------

// Each tensor's offset in the stage's one weight allocation is a multiple of
// this: the quantized kernels read blocks with 16-byte vector loads, and 256
// is what cudaMalloc itself guarantees.
#define LOAD_ALIGN 256

// One tensor to bring to the backend: a range of the weight allocation
// filled from the mapped file, as is (matrices, F32 vectors) or converted to
// F32 (F16 / BF16 vectors).
struct load_item {
    const uint8_t *src;      // in the mapped file
    enum ggml_type src_type; // of a vector: F32, F16 or BF16
    bool vector;
    size_t off, bytes;  // range of the allocation
    const void **wdata; // a matrix: where its backend pointer goes
    float **vdata;      // a vector: where its backend pointer goes
};

struct load_plan {
    struct load_item *items; // [n], by ascending offset
    int n, cap;
    size_t arena; // bytes of the allocation, padding included
};

static int plan_add(struct model *m, struct load_plan *lp, const struct load_item *it,
                    struct verr *err) {
    if (lp->n == lp->cap) {
        int cap = lp->cap ? lp->cap * 2 : 64;
        struct load_item *ni = realloc(lp->items, (size_t)cap * sizeof *ni);
        if (!ni)
            return verr_set(err, VERR_NOMEM, "out of host memory");
        lp->items = ni;
        lp->cap = cap;
    }
    struct load_item *dst = &lp->items[lp->n++];
    *dst = *it;
    dst->off = (lp->arena + LOAD_ALIGN - 1) / LOAD_ALIGN * LOAD_ALIGN;
    lp->arena = dst->off + dst->bytes;
    m->n_bytes += dst->bytes;
    return 0;
}

// A matmul weight / embedding table of ggml shape [n_in, n_out], or an
// expert stack [n_in, n_out, n_mat] (n_dims 3): one weight of n_mat * n_out
// rows. An optional one that is absent leaves *w as it is (zero).
static int load_weight(struct model *m, struct load_plan *lp, const struct gguf_file *f,
                       const char *name, int n_dims, const int64_t want[3], bool optional,
                       struct backend_weight *w, struct verr *err) {
    const struct gguf_tensor_info *t;
    const int64_t n_in = want[0], n_out = want[1] * (n_dims == 3 ? want[2] : 1);
    int rc = tensor_check(f, name, n_dims, want, optional, &t, err);
    if (rc || !t)
        return rc;
    if (!quant_type_supported(t->type)) {
        char list[256] = "";
        for (int ty = 0; ty < GGML_TYPE_COUNT; ty++)
            if (quant_type_supported((enum ggml_type)ty))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         list[0] ? ", " : "", ggml_type_name((enum ggml_type)ty));
        return verr_set(err, VERR_UNSUPPORTED, "%s: weight type %s is not supported (%s)", name,
                        ggml_type_name(t->type), list);
    }
    size_t row = ggml_row_bytes(t->type, n_in);
    if (row == 0)
        return verr_set(err, VERR_FORMAT,
                        "%s: row length %" PRId64 " is not a multiple of the %s block size %u",
                        name, n_in, ggml_type_name(t->type), ggml_type_get(t->type)->block_size);
    size_t bytes = row * (size_t)n_out;
    if (t->nbytes < bytes)
        return verr_set(err, VERR_FORMAT, "%s: %" PRIu64 " bytes of data, expected %zu", name,
                        t->nbytes, bytes);
    struct load_item it = {.src = t->data, .bytes = bytes, .wdata = &w->data};
    if ((rc = plan_add(m, lp, &it, err)))
        return rc;
    w->data = NULL; // set when the allocation is made
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    m->n_params += n_in * n_out;
    return 0;
}

// A vector of want[0] floats, or a table of want[0] * want[1] (n_dims 2:
// per-expert biases): norm weights, biases, rope factors, stored as F32 on
// the backend whatever the file holds (F32, F16 or BF16).
static int load_vector(struct model *m, struct load_plan *lp, const struct gguf_file *f,
                       const char *name, int n_dims, const int64_t want[2], bool optional,
                       float **out, struct verr *err) {
    *out = NULL;
    const struct gguf_tensor_info *t;
    const int64_t n = want[0] * (n_dims == 2 ? want[1] : 1);
    int rc = tensor_check(f, name, n_dims, want, optional, &t, err);
    if (rc || !t)
        return rc;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16)
        return verr_set(err, VERR_UNSUPPORTED, "%s: type %s, expected f32 (or f16 / bf16)", name,
                        ggml_type_name(t->type));
    size_t esz = t->type == GGML_TYPE_F32 ? 4 : 2;
    if (t->nbytes < esz * (size_t)n)
        return verr_set(err, VERR_FORMAT, "%s: %" PRIu64 " bytes of data, expected %zu", name,
                        t->nbytes, esz * (size_t)n);
    struct load_item it = {.src = t->data,
                           .src_type = t->type,
                           .vector = true,
                           .bytes = (size_t)n * sizeof(float),
                           .vdata = out};
    if ((rc = plan_add(m, lp, &it, err)))
        return rc;
    m->n_params += n;
    return 0;
}

void model_arch_dims(const struct model_hparams *hp, struct arch_dims *dims) {
    arch_dims_make(dims, hp->n_embd, hp->n_vocab, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim,
                   hp->head_dim_v, hp->n_rot);
    arch_dims_set_moe(dims, hp->n_expert, hp->n_ff_exp, hp->n_ff_shexp);
}

const struct arch_tensor *model_layer_table(const struct model_hparams *hp) {
    return arch_layer_table(arch_get(hp->arch), hp->n_expert > 0);
}

// Dims a table entry is checked with: 3 for an expert stack, 2 for another
// matrix and a table of vectors, 1 for a vector and a one-row matrix (the
// file's 1-D tensor).
static int entry_dims(const struct arch_tensor *t) {
    if (t->ne[1] == ARCH_DIM_1)
        return 1;
    if (t->kind == ARCH_VECTOR)
        return 2;
    return t->ne[2] != ARCH_DIM_1 ? 3 : 2;
}

static void entry_shape(const struct arch_tensor *t, const struct arch_dims *d, int64_t want[3]) {
    for (int i = 0; i < 3; i++)
        want[i] = d->d[t->ne[i]];
}

// The file's name of table entry t: "blk.<il>.<suffix>" for a layer's.
static const char *entry_name(char *buf, size_t cap, const struct arch_tensor *t, int il) {
    if (t->place != ARCH_PLACE_LAYER)
        return t->name;
    snprintf(buf, cap, "blk.%d.%s", il, t->name);
    return buf;
}

// Whether a stage (first: it holds layer 0; last: the last layer) holds
// global t; tied: the head is token_embd.
static bool entry_on_stage(const struct arch_tensor *t, bool first, bool last, bool tied) {
    switch (t->place) {
    case ARCH_PLACE_FIRST:
        return first || (last && tied);
    case ARCH_PLACE_LAST:
        return last;
    case ARCH_PLACE_EVERY:
        return true;
    case ARCH_PLACE_LAYER:
        break;
    }
    return false;
}

// The head is tied to token_embd when the architecture's head matrix is
// absent from the file (or it has none).
static bool head_tied(const struct gguf_file *f, const struct arch *ad) {
    for (const struct arch_tensor *t = ad->globals; t->name; t++)
        if (t->role == ARCH_ROLE_OUTPUT)
            return gguf_find_tensor(f, t->name) == NULL;
    return true;
}

// Plans table entry t (of layer il when it is a layer's) into the field it
// fills: in m->layers[il] or in m.
static int load_entry(struct model *m, struct load_plan *lp, const struct gguf_file *f,
                      const struct arch_tensor *t, const struct arch_dims *d, int il,
                      struct verr *err) {
    char buf[96];
    const char *name = entry_name(buf, sizeof buf, t, il);
    uint8_t *base = t->place == ARCH_PLACE_LAYER ? (uint8_t *)&m->layers[il] : (uint8_t *)m;
    int64_t want[3];
    entry_shape(t, d, want);
    if (t->kind == ARCH_VECTOR)
        return load_vector(m, lp, f, name, entry_dims(t), want, t->optional,
                           (float **)(base + t->field), err);
    return load_weight(m, lp, f, name, entry_dims(t), want, t->optional,
                       (struct backend_weight *)(base + t->field), err);
}

static int check_entry(const struct gguf_file *f, const struct arch_tensor *t,
                       const struct arch_dims *d, int il, struct verr *err) {
    char buf[96];
    int64_t want[3];
    entry_shape(t, d, want);
    const struct gguf_tensor_info *info;
    return tensor_check(f, entry_name(buf, sizeof buf, t, il), entry_dims(t), want, t->optional,
                        &info, err);
}

// Shapes are checked before any backend memory is touched, so a bad file is
// refused quickly and without allocating gigabytes first.
static int check_all(const struct gguf_file *f, const struct model_hparams *hp, struct verr *err) {
    const struct arch *ad = arch_get(hp->arch);
    struct arch_dims d;
    model_arch_dims(hp, &d);
    int rc;
    for (const struct arch_tensor *t = ad->globals; t->name; t++)
        if ((rc = check_entry(f, t, &d, 0, err)))
            return rc;
    const struct arch_tensor *layer = model_layer_table(hp);
    for (int il = 0; il < hp->n_layer; il++)
        for (const struct arch_tensor *t = layer; t->name; t++)
            if ((rc = check_entry(f, t, &d, il, err)))
                return rc;
    return 0;
}

// --- moving the bytes ------------------------------------------------------------

#define LOAD_STAGING_DEFAULT ((size_t)64 << 20)

// Writes bytes [from, from + n) of item it's backend image to dst. A
// converted vector's range is whole floats: item offsets and chunk bounds
// are multiples of LOAD_ALIGN.
static void item_read(const struct load_item *it, size_t from, size_t n, uint8_t *dst) {
    if (!it->vector || it->src_type == GGML_TYPE_F32) {
        memcpy(dst, it->src + from, n);
        return;
    }
    const uint8_t *s = it->src + from / 2; // [n / 4] f16 or bf16
    for (size_t i = 0; i < n / 4; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        float v = it->src_type == GGML_TYPE_F16 ? quant_fp16_to_f32(h) : quant_bf16_to_f32(h);
        memcpy(dst + 4 * i, &v, 4);
    }
}

// buf [hi - lo] = bytes [lo, hi) of the allocation's image (padding zeroed);
// *cursor: the first item that may still overlap, advanced as chunks go by.
static void plan_fill(const struct load_plan *lp, int *cursor, uint8_t *buf, size_t lo, size_t hi) {
    int i = *cursor;
    while (i < lp->n && lp->items[i].off + lp->items[i].bytes <= lo)
        i++;
    *cursor = i;
    size_t p = lo;
    for (; i < lp->n && lp->items[i].off < hi; i++) {
        const struct load_item *it = &lp->items[i];
        size_t a = it->off > lo ? it->off : lo;
        size_t b = it->off + it->bytes < hi ? it->off + it->bytes : hi;
        if (a > p)
            memset(buf + (p - lo), 0, a - p);
        item_read(it, a - it->off, b - a, buf + (a - lo));
        p = b;
    }
    if (hi > p)
        memset(buf + (p - lo), 0, hi - p);
}

static void report(const struct model_load_params *p, uint64_t done, uint64_t total) {
    if (p->progress)
        p->progress(p->progress_user, p->progress_base + done,
                    p->progress_total ? p->progress_total : total);
}

// The pinned ring: chunk c of the allocation is filled from the mapped file
// into staging buffer c % 2 while the copy of chunk c - 1 (the other buffer)
// is in flight; before refilling a buffer, the copy that last read it is
// waited for. The reads of the file (page faults on the mapping) thus
// overlap the DMA. Returns 1 when pinned memory is not to be had (the
// caller then uploads directly).
static int stream_pinned(struct backend *be, const struct load_plan *lp, uint8_t *arena,
                         const struct model_load_params *p, struct verr *err) {
    size_t chunk = p->staging_bytes ? p->staging_bytes : LOAD_STAGING_DEFAULT;
    chunk = (chunk + LOAD_ALIGN - 1) / LOAD_ALIGN * LOAD_ALIGN;
    const size_t whole = (lp->arena + LOAD_ALIGN - 1) / LOAD_ALIGN * LOAD_ALIGN;
    if (chunk > whole)
        chunk = whole;
    void *buf[2] = {NULL, NULL};
    if (be->ops->alloc_host_pinned(be, chunk, &buf[0]) ||
        be->ops->alloc_host_pinned(be, chunk, &buf[1])) {
        if (buf[0])
            be->ops->free_host_pinned(be, buf[0]);
        return 1;
    }
    int rc = 0, cursor = 0;
    bool issued[2] = {false, false};
    for (size_t lo = 0, c = 0; lo < lp->arena && !rc; lo += chunk, c++) {
        const int k = (int)(c % 2);
        const size_t hi = lp->arena - lo < chunk ? lp->arena : lo + chunk;
        if (issued[k] && (rc = be->ops->upload_wait(be, k))) {
            rc = verr_set(err, rc, "loading weights: waiting for a copy: %s", be->err.msg);
            break;
        }
        plan_fill(lp, &cursor, buf[k], lo, hi);
        if ((rc = be->ops->upload_async(be, arena + lo, buf[k], hi - lo, k))) {
            rc = verr_set(err, rc, "loading weights: copy of bytes %zu..%zu: %s", lo, hi,
                          be->err.msg);
            break;
        }
        issued[k] = true;
        report(p, hi, lp->arena);
    }
    // Every copy must be done with its buffer before the buffer goes.
    for (int k = 0; k < 2; k++)
        if (issued[k] && be->ops->upload_wait(be, k) && !rc)
            rc = verr_set(err, VERR_BACKEND, "loading weights: %s", be->err.msg);
    be->ops->free_host_pinned(be, buf[0]);
    be->ops->free_host_pinned(be, buf[1]);
    return rc;
}

// Without pinned staging (the CPU backend, or no page-locked memory to be
// had): ops->upload straight from the mapping (the CPU: one memcpy), in
// pieces so that progress moves inside large tensors; converted vectors go
// through a small host buffer.
static int stream_direct(struct backend *be, const struct load_plan *lp, uint8_t *arena,
                         const struct model_load_params *p, struct verr *err) {
    size_t piece = p->staging_bytes ? p->staging_bytes : LOAD_STAGING_DEFAULT;
    piece = (piece + LOAD_ALIGN - 1) / LOAD_ALIGN * LOAD_ALIGN;
    uint8_t *tmp = NULL;
    int rc = 0;
    for (int i = 0; i < lp->n && !rc; i++) {
        const struct load_item *it = &lp->items[i];
        const bool convert = it->vector && it->src_type != GGML_TYPE_F32;
        if (convert && !tmp && !(tmp = malloc(piece))) {
            rc = verr_set(err, VERR_NOMEM, "out of host memory");
            break;
        }
        for (size_t from = 0; from < it->bytes && !rc; from += piece) {
            const size_t n = it->bytes - from < piece ? it->bytes - from : piece;
            const uint8_t *src = it->src + from;
            if (convert) {
                item_read(it, from, n, tmp);
                src = tmp;
            }
            if ((rc = be->ops->upload(be, arena + it->off + from, src, n))) {
                rc = verr_set(err, rc, "loading weights: upload: %s", be->err.msg);
                break;
            }
            report(p, it->off + from + n, lp->arena);
        }
    }
    free(tmp);
    return rc;
}

static size_t sat_add(size_t a, size_t b) {
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static double mib(size_t b) {
    return (double)b / (1024.0 * 1024.0);
}

// Refuses, before the weights are allocated, a stage that will not fit in
// what the backend says is free: weights + the caller's KV cache, scratch
// and reserve.
static int check_memory(struct backend *be, size_t weights, const struct model_load_params *p,
                        struct verr *err) {
    if (!be->ops->mem_info || p->skip_memory_check)
        return 0;
    size_t free_b = 0, total_b = 0;
    int rc = be->ops->mem_info(be, &free_b, &total_b);
    if (rc)
        return verr_set(err, rc, "asking the %s backend for its free memory: %s", be->ops->name,
                        be->err.msg);
    if (free_b == SIZE_MAX)
        return 0;
    size_t need =
        sat_add(sat_add(sat_add(weights, p->kv_bytes), p->scratch_bytes), p->reserve_bytes);
    if (need <= free_b)
        return 0;
    char dev[48], reserve[48] = "";
    if (!strcmp(be->ops->name, "cpu"))
        snprintf(dev, sizeof dev, "the cpu backend");
    else
        snprintf(dev, sizeof dev, "device %s:%d", be->ops->name, be->device);
    if (p->reserve_bytes)
        snprintf(reserve, sizeof reserve, ", reserve %.1f MiB", mib(p->reserve_bytes));
    return verr_set(err, VERR_NOMEM,
                    "model needs %.1f MiB on %s (weights %.1f MiB, KV cache %.1f MiB, scratch "
                    "%.1f MiB%s) but only %.1f MiB is free; try a smaller context (-c), a smaller "
                    "quantization or more devices",
                    mib(need), dev, mib(weights), mib(p->kv_bytes), mib(p->scratch_bytes), reserve,
                    mib(free_b));
}

void model_load_params_default(struct model_load_params *p) {
    memset(p, 0, sizeof *p);
    p->l1 = -1;
}

// Reads the metadata, checks every tensor, and lays out layers [l0, l1) (l1
// < 0: all) in m and lp without touching the backend.
static int load_layout(struct model *m, struct load_plan *lp, const struct gguf_file *f, int l0,
                       int l1, struct verr *err) {
    int rc = model_read_hparams(f, &m->hp, err);
    if (rc || (rc = check_all(f, &m->hp, err)))
        return rc;
    if (l1 < 0)
        l1 = m->hp.n_layer;
    if (l0 < 0 || l0 >= l1 || l1 > m->hp.n_layer)
        return verr_set(err, VERR_RANGE,
                        "model: layer range [%d, %d) outside the model's %d layers", l0, l1,
                        m->hp.n_layer);
    m->layer_begin = l0;
    m->layer_end = l1;
    const struct arch *ad = arch_get(m->hp.arch);
    const bool first = l0 == 0, last = l1 == m->hp.n_layer;
    const bool tied = head_tied(f, ad);
    struct arch_dims d;
    model_arch_dims(&m->hp, &d);
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    m->output_tied = tied;
    for (const struct arch_tensor *t = ad->globals; t->name; t++)
        if (entry_on_stage(t, first, last, tied) && (rc = load_entry(m, lp, f, t, &d, 0, err)))
            return rc;
    const struct arch_tensor *layer = model_layer_table(&m->hp);
    for (int il = l0; il < l1; il++)
        for (const struct arch_tensor *t = layer; t->name; t++)
            if ((rc = load_entry(m, lp, f, t, &d, il, err)))
                return rc;
    m->weight_type = m->hp.n_expert > 0 ? m->layers[l0].ffn_up_exps.type : m->layers[l0].w_up.type;
    return 0;
}

int model_load_bytes(const struct gguf_file *f, int l0, int l1, size_t *bytes, struct verr *err) {
    *bytes = 0;
    struct model m = {0};
    struct load_plan lp = {0};
    int rc = load_layout(&m, &lp, f, l0, l1, err);
    if (!rc)
        *bytes = lp.arena;
    free(lp.items);
    free(m.layers);
    return rc;
}

int model_load_ex(struct model **out, const struct gguf_file *f, struct backend *be,
                  const struct model_load_params *p, struct verr *err) {
    *out = NULL;
    struct model_load_params defaults;
    if (!p) {
        model_load_params_default(&defaults);
        p = &defaults;
    }
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    m->be = be;
    struct load_plan lp = {0};
    void *arena = NULL;
    int rc = load_layout(m, &lp, f, p->l0, p->l1, err);
    if (rc)
        goto fail;

    char *name = NULL;
    if (gguf_get_str(f, "general.name", &name, NULL) == 0) {
        m->name = name;
    } else {
        const char *path = f->path ? f->path : "model";
        const char *slash = strrchr(path, '/');
        m->name = strdup(slash ? slash + 1 : path);
        if (!m->name) {
            rc = verr_set(err, VERR_NOMEM, "out of host memory");
            goto fail;
        }
    }

    if ((rc = check_memory(be, lp.arena, p, err)))
        goto fail;
    if ((rc = be->ops->alloc(be, lp.arena, &arena))) {
        rc = verr_set(err, rc, "allocating %.1f MiB for the weights on the %s backend: %s",
                      mib(lp.arena), be->ops->name, be->err.msg);
        goto fail;
    }
    if ((rc = model_track(m, arena, err))) {
        be->ops->free(be, arena);
        goto fail;
    }
    for (int i = 0; i < lp.n; i++) {
        void *ptr = (uint8_t *)arena + lp.items[i].off;
        if (lp.items[i].vector)
            *lp.items[i].vdata = ptr;
        else
            *lp.items[i].wdata = ptr;
    }
    if (m->output_tied && m->layer_end == m->hp.n_layer)
        m->output = m->tok_embd;

    report(p, 0, lp.arena);
    const bool pinned = be->ops->upload_async && be->ops->upload_wait &&
                        be->ops->alloc_host_pinned && be->ops->free_host_pinned;
    rc = pinned ? stream_pinned(be, &lp, arena, p, err) : 1;
    if (rc == 1)
        rc = stream_direct(be, &lp, arena, p, err);
    if (rc)
        goto fail;
    if ((rc = be->ops->sync(be))) {
        rc = verr_set(err, rc, "uploading weights: %s", be->err.msg);
        goto fail;
    }
    free(lp.items);
    *out = m;
    return 0;
fail:
    free(lp.items);
    model_free(m);
    return rc;
}

int model_load(struct model **out, const struct gguf_file *f, struct backend *be,
               struct verr *err) {
    return model_load_ex(out, f, be, NULL, err);
}

int model_load_layers(struct model **out, const struct gguf_file *f, struct backend *be, int l0,
                      int l1, struct verr *err) {
    struct model_load_params p;
    model_load_params_default(&p);
    p.l0 = l0;
    p.l1 = l1;
    return model_load_ex(out, f, be, &p, err);
}

// Bytes load_weight / load_vector would allocate for `name` (0 when absent).
static size_t tensor_bytes(const struct gguf_file *f, const char *name, bool vector) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    if (!t)
        return 0;
    if (vector)
        return (size_t)t->ne[0] * (size_t)t->ne[1] * sizeof(float);
    return ggml_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1] * (size_t)t->ne[2];
}

int model_weight_bytes(const struct gguf_file *f, const struct model_hparams *hp,
                       size_t *layer_bytes, size_t *embed_bytes, size_t *head_bytes,
                       struct verr *err) {
    int rc = check_all(f, hp, err);
    if (rc)
        return rc;
    const struct arch *ad = arch_get(hp->arch);
    const struct arch_tensor *layer = model_layer_table(hp);
    char name[96];
    for (int il = 0; il < hp->n_layer; il++) {
        size_t b = 0;
        for (const struct arch_tensor *t = layer; t->name; t++)
            b += tensor_bytes(f, entry_name(name, sizeof name, t, il), t->kind == ARCH_VECTOR);
        layer_bytes[il] = b;
    }
    // The first stage's and the last's (rope_freqs is on every stage; a
    // tied head loads token_embd again).
    const bool tied = head_tied(f, ad);
    *embed_bytes = *head_bytes = 0;
    for (const struct arch_tensor *t = ad->globals; t->name; t++) {
        size_t b = tensor_bytes(f, t->name, t->kind == ARCH_VECTOR);
        if (entry_on_stage(t, true, false, tied))
            *embed_bytes += b;
        if (entry_on_stage(t, false, true, tied))
            *head_bytes += b;
    }
    return 0;
}

void model_layer_size(const struct model_hparams *hp, const struct model_layer *L, double *bytes,
                      double *matmul_params) {
    struct arch_dims d;
    model_arch_dims(hp, &d);
    double b = 0, p = 0;
    for (const struct arch_tensor *t = model_layer_table(hp); t->name; t++) {
        const uint8_t *field = (const uint8_t *)L + t->field;
        if (t->kind == ARCH_VECTOR) {
            // a required vector counts even in a layer this process did not load
            if (!t->optional || *(float *const *)field)
                b += (double)d.d[t->ne[0]] * (double)d.d[t->ne[1]] * sizeof(float);
            continue;
        }
        const struct backend_weight *w = (const struct backend_weight *)field;
        b += (double)ggml_row_bytes(w->type, w->n_in) * (double)w->n_out;
        // a token goes through k of an expert stack's n_expert matrices
        const double used =
            t->ne[2] == ARCH_DIM_N_EXPERT ? (double)hp->n_expert_used / (double)hp->n_expert : 1.0;
        p += (double)w->n_in * (double)w->n_out * used;
    }
    *bytes = b;
    *matmul_params = p;
}

double model_layer_bytes_read(const struct model_hparams *hp, const struct model_layer *L,
                              int n_tok) {
    double bytes, params;
    model_layer_size(hp, L, &bytes, &params);
    if (hp->n_expert <= 0)
        return bytes;
    const double used = 1.0 - pow(1.0 - (double)hp->n_expert_used / hp->n_expert, n_tok);
    for (const struct arch_tensor *t = model_layer_table(hp); t->name; t++) {
        if (t->ne[2] != ARCH_DIM_N_EXPERT)
            continue;
        const struct backend_weight *w =
            (const struct backend_weight *)((const uint8_t *)L + t->field);
        bytes -= (1.0 - used) * (double)ggml_row_bytes(w->type, w->n_in) * (double)w->n_out;
    }
    return bytes;
}

int model_load_file(struct model **out, const char *path, struct backend *be, struct verr *err) {
    *out = NULL;
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        return rc;
    rc = model_load(out, f, be, err);
    gguf_close(f);
    return rc;
}

void model_free(struct model *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_allocs; i++)
        m->be->ops->free(m->be, m->allocs[i]);
    free(m->allocs);
    free(m->layers);
    free(m->name);
    free(m);
}
