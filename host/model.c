// Model loading: hparams from metadata, tensor map checked against the
// shapes llama.cpp expects, weights uploaded through the backend.
#include "host/model.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "host/pipeline.h"

const char *model_arch_name(enum model_arch arch) {
    switch (arch) {
    case MODEL_ARCH_LLAMA:
        return "llama";
    case MODEL_ARCH_QWEN2:
        return "qwen2";
    }
    return "unknown";
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

int model_read_hparams(const struct gguf_file *f, struct model_hparams *hp, struct verr *err) {
    memset(hp, 0, sizeof *hp);
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", &arch, err);
    if (rc == VERR_NOTFOUND)
        return verr_set(err, VERR_NOTFOUND, "%s: missing key 'general.architecture'", file_name(f));
    if (rc)
        return rc;
    if (!strcmp(arch, "llama")) {
        hp->arch = MODEL_ARCH_LLAMA;
        hp->rope_mode = ROPE_MODE_NORMAL;
    } else if (!strcmp(arch, "qwen2")) {
        hp->arch = MODEL_ARCH_QWEN2;
        hp->rope_mode = ROPE_MODE_NEOX;
        hp->has_bias_qkv = true;
    } else {
        rc = verr_set(err, VERR_UNSUPPORTED,
                      "%s: unknown model architecture: '%s' (supported: llama, qwen2)",
                      file_name(f), arch);
        free(arch);
        return rc;
    }

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
        (rc = read_float_key(f, arch, "rope.freq_base", false, 10000.0f, &hp->rope_freq_base, err)))
        goto out;
    if (!(hp->norm_eps >= 0) || !(hp->rope_freq_base > 0)) {
        rc = verr_set(err, VERR_RANGE, "%s: bad rms epsilon %g or rope freq base %g", file_name(f),
                      hp->norm_eps, hp->rope_freq_base);
        goto out;
    }

    // llama.cpp: the scaling type defaults to "linear", which with no factor
    // is no scaling at all.
    {
        char key[160];
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        char *st = NULL;
        rc = gguf_get_str(f, key, &st, err);
        if (rc == VERR_NOTFOUND) {
            hp->rope_scaling = ROPE_SCALING_LINEAR;
        } else if (rc) {
            goto out;
        } else {
            int t = rope_scaling_from_name(st);
            if (t < 0) {
                rc = verr_set(err, VERR_UNSUPPORTED,
                              "%s: %s = '%s' is not supported (none, linear, yarn)", file_name(f),
                              key, st);
                free(st);
                goto out;
            }
            free(st);
            hp->rope_scaling = (enum rope_scaling_type)t;
        }
    }
    float factor = 0;
    if ((rc = read_float_key(f, arch, "rope.scaling.factor", false, 0, &factor, err)))
        goto out;
    if (factor == 0 && (rc = read_float_key(f, arch, "rope.scale_linear", false, 0, &factor, err)))
        goto out;
    if (factor < 0) {
        rc = verr_set(err, VERR_RANGE, "%s: rope scaling factor %g must be > 0", file_name(f),
                      factor);
        goto out;
    }
    hp->rope_freq_scale = factor == 0 ? 1.0f : 1.0f / factor;
    if ((rc = read_int_key(f, arch, "rope.scaling.original_context_length", false, hp->n_ctx_train,
                           &hp->n_ctx_orig_yarn, err)) ||
        (rc = read_float_key(f, arch, "rope.scaling.attn_factor", false, 1.0f,
                             &hp->rope_attn_factor, err)))
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

static bool weight_type_ok(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

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

static int upload_bytes(struct model *m, const char *name, const void *src, size_t bytes,
                        void **out, struct verr *err) {
    struct backend *be = m->be;
    void *p = NULL;
    int rc = be->ops->alloc(be, bytes, &p);
    if (rc)
        return verr_set(err, rc, "%s: allocating %zu bytes on the %s backend: %s", name, bytes,
                        be->ops->name, be->err.msg);
    if ((rc = model_track(m, p, err))) {
        be->ops->free(be, p);
        return rc;
    }
    rc = be->ops->upload(be, p, src, bytes);
    if (rc)
        return verr_set(err, rc, "%s: upload: %s", name, be->err.msg);
    m->n_bytes += bytes;
    *out = p;
    return 0;
}

// A matmul weight / embedding table of ggml shape [n_in, n_out].
static int load_weight(struct model *m, const struct gguf_file *f, const char *name, int64_t n_in,
                       int64_t n_out, struct backend_weight *w, struct verr *err) {
    const struct gguf_tensor_info *t;
    int64_t want[2] = {n_in, n_out};
    int rc = tensor_check(f, name, 2, want, false, &t, err);
    if (rc)
        return rc;
    if (!weight_type_ok(t->type))
        return verr_set(err, VERR_UNSUPPORTED,
                        "%s: weight type %s is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, "
                        "q5_0, q5_1, q4_K, q5_K, q6_K)",
                        name, ggml_type_name(t->type));
    size_t row = ggml_row_bytes(t->type, n_in);
    if (row == 0)
        return verr_set(err, VERR_FORMAT,
                        "%s: row length %" PRId64 " is not a multiple of the %s block size %u",
                        name, n_in, ggml_type_name(t->type), ggml_type_get(t->type)->block_size);
    size_t bytes = row * (size_t)n_out;
    if (t->nbytes < bytes)
        return verr_set(err, VERR_FORMAT, "%s: %" PRIu64 " bytes of data, expected %zu", name,
                        t->nbytes, bytes);
    void *p;
    if ((rc = upload_bytes(m, name, t->data, bytes, &p, err)))
        return rc;
    w->data = p;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    m->n_params += n_in * n_out;
    return 0;
}

// A vector of n floats (norm weights, biases, rope factors): stored as F32 on
// the backend whatever the file holds (F32, F16 or BF16).
static int load_vector(struct model *m, const struct gguf_file *f, const char *name, int64_t n,
                       bool optional, float **out, struct verr *err) {
    *out = NULL;
    const struct gguf_tensor_info *t;
    int rc = tensor_check(f, name, 1, &n, optional, &t, err);
    if (rc || !t)
        return rc;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16)
        return verr_set(err, VERR_UNSUPPORTED, "%s: type %s, expected f32 (or f16 / bf16)", name,
                        ggml_type_name(t->type));
    size_t esz = t->type == GGML_TYPE_F32 ? 4 : 2;
    if (t->nbytes < esz * (size_t)n)
        return verr_set(err, VERR_FORMAT, "%s: %" PRIu64 " bytes of data, expected %zu", name,
                        t->nbytes, esz * (size_t)n);
    float *host = malloc((size_t)n * sizeof *host);
    if (!host)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    const uint8_t *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (t->type == GGML_TYPE_F32) {
            memcpy(&host[i], src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            host[i] = t->type == GGML_TYPE_F16 ? quant_fp16_to_f32(h) : quant_bf16_to_f32(h);
        }
    }
    void *p = NULL;
    rc = upload_bytes(m, name, host, (size_t)n * sizeof *host, &p, err);
    free(host);
    if (rc)
        return rc;
    m->n_params += n;
    *out = p;
    return 0;
}

static int load_layer(struct model *m, const struct gguf_file *f, int il, struct verr *err) {
    const struct model_hparams *hp = &m->hp;
    struct model_layer *L = &m->layers[il];
    const int64_t n_embd = hp->n_embd, n_ff = hp->n_ff;
    const int64_t n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_k = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t n_v = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int64_t n_o = (int64_t)hp->n_head * hp->head_dim_v;
    char name[96];
    int rc;
#define TN(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    if ((rc = load_vector(m, f, TN("attn_norm.weight"), n_embd, false, &L->attn_norm, err)) ||
        (rc = load_weight(m, f, TN("attn_q.weight"), n_embd, n_q, &L->wq, err)) ||
        (rc = load_weight(m, f, TN("attn_k.weight"), n_embd, n_k, &L->wk, err)) ||
        (rc = load_weight(m, f, TN("attn_v.weight"), n_embd, n_v, &L->wv, err)) ||
        (rc = load_weight(m, f, TN("attn_output.weight"), n_o, n_embd, &L->wo, err)))
        return rc;
    // qwen2 requires the biases; llama accepts them when present (some
    // conversions carry them), as llama.cpp does.
    bool opt = !hp->has_bias_qkv;
    if ((rc = load_vector(m, f, TN("attn_q.bias"), n_q, opt, &L->bq, err)) ||
        (rc = load_vector(m, f, TN("attn_k.bias"), n_k, opt, &L->bk, err)) ||
        (rc = load_vector(m, f, TN("attn_v.bias"), n_v, opt, &L->bv, err)))
        return rc;
    if ((rc = load_vector(m, f, TN("ffn_norm.weight"), n_embd, false, &L->ffn_norm, err)) ||
        (rc = load_weight(m, f, TN("ffn_gate.weight"), n_embd, n_ff, &L->w_gate, err)) ||
        (rc = load_weight(m, f, TN("ffn_up.weight"), n_embd, n_ff, &L->w_up, err)) ||
        (rc = load_weight(m, f, TN("ffn_down.weight"), n_ff, n_embd, &L->w_down, err)))
        return rc;
#undef TN
    return 0;
}

// Shapes are checked before any backend memory is touched, so a bad file is
// refused quickly and without allocating gigabytes first.
static int check_all(const struct gguf_file *f, const struct model_hparams *hp, struct verr *err) {
    const int64_t n_embd = hp->n_embd, n_ff = hp->n_ff, n_vocab = hp->n_vocab;
    const int64_t n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_k = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t n_v = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int64_t n_o = (int64_t)hp->n_head * hp->head_dim_v;
    const struct gguf_tensor_info *t;
    int rc;
    int64_t s2[2];
#define CHK2(nm, a, b, opt) (s2[0] = (a), s2[1] = (b), tensor_check(f, nm, 2, s2, opt, &t, err))
#define CHK1(nm, a, opt) (s2[0] = (a), tensor_check(f, nm, 1, s2, opt, &t, err))
    if ((rc = CHK2("token_embd.weight", n_embd, n_vocab, false)) ||
        (rc = CHK1("output_norm.weight", n_embd, false)) ||
        (rc = CHK2("output.weight", n_embd, n_vocab, true)) ||
        (rc = CHK1("rope_freqs.weight", hp->n_rot / 2, true)))
        return rc;
    char name[96];
    for (int il = 0; il < hp->n_layer; il++) {
#define TN(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
        bool opt = !hp->has_bias_qkv;
        if ((rc = CHK1(TN("attn_norm.weight"), n_embd, false)) ||
            (rc = CHK2(TN("attn_q.weight"), n_embd, n_q, false)) ||
            (rc = CHK2(TN("attn_k.weight"), n_embd, n_k, false)) ||
            (rc = CHK2(TN("attn_v.weight"), n_embd, n_v, false)) ||
            (rc = CHK2(TN("attn_output.weight"), n_o, n_embd, false)) ||
            (rc = CHK1(TN("attn_q.bias"), n_q, opt)) || (rc = CHK1(TN("attn_k.bias"), n_k, opt)) ||
            (rc = CHK1(TN("attn_v.bias"), n_v, opt)) ||
            (rc = CHK1(TN("ffn_norm.weight"), n_embd, false)) ||
            (rc = CHK2(TN("ffn_gate.weight"), n_embd, n_ff, false)) ||
            (rc = CHK2(TN("ffn_up.weight"), n_embd, n_ff, false)) ||
            (rc = CHK2(TN("ffn_down.weight"), n_ff, n_embd, false)))
            return rc;
#undef TN
    }
#undef CHK1
#undef CHK2
    return 0;
}

int model_load(struct model **out, const struct gguf_file *f, struct backend *be,
               struct verr *err) {
    return model_load_layers(out, f, be, 0, -1, err);
}

// l1 < 0: every layer (model_load, before n_layer is known).
int model_load_layers(struct model **out, const struct gguf_file *f, struct backend *be, int l0,
                      int l1, struct verr *err) {
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    m->be = be;
    int rc = model_read_hparams(f, &m->hp, err);
    if (rc || (rc = check_all(f, &m->hp, err)))
        goto fail;
    if (l1 < 0)
        l1 = m->hp.n_layer;
    if (l0 < 0 || l0 >= l1 || l1 > m->hp.n_layer) {
        rc = verr_set(err, VERR_RANGE, "model: layer range [%d, %d) outside the model's %d layers",
                      l0, l1, m->hp.n_layer);
        goto fail;
    }
    m->layer_begin = l0;
    m->layer_end = l1;
    const bool first = l0 == 0, last = l1 == m->hp.n_layer;
    const bool tied = gguf_find_tensor(f, "output.weight") == NULL;

    char *name = NULL;
    if (gguf_get_str(f, "general.name", &name, NULL) == 0) {
        m->name = name;
    } else {
        const char *p = f->path ? f->path : "model";
        const char *slash = strrchr(p, '/');
        m->name = strdup(slash ? slash + 1 : p);
        if (!m->name) {
            rc = verr_set(err, VERR_NOMEM, "out of host memory");
            goto fail;
        }
    }

    const struct model_hparams *hp = &m->hp;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto fail;
    }
    m->output_tied = tied;
    if ((first || (last && tied)) &&
        (rc = load_weight(m, f, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd, err)))
        goto fail;
    if (last) {
        if (tied)
            m->output = m->tok_embd;
        else if ((rc =
                      load_weight(m, f, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err)))
            goto fail;
        if ((rc = load_vector(m, f, "output_norm.weight", hp->n_embd, false, &m->output_norm, err)))
            goto fail;
    }
    if ((rc = load_vector(m, f, "rope_freqs.weight", hp->n_rot / 2, true, &m->rope_freqs, err)))
        goto fail;
    for (int il = l0; il < l1; il++)
        if ((rc = load_layer(m, f, il, err)))
            goto fail;
    m->weight_type = m->layers[l0].w_up.type;
    if ((rc = be->ops->sync(be))) {
        rc = verr_set(err, rc, "uploading weights: %s", be->err.msg);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

// Bytes load_weight / load_vector would allocate for `name` (0 when absent).
static size_t tensor_bytes(const struct gguf_file *f, const char *name, bool vector) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    if (!t)
        return 0;
    if (vector)
        return (size_t)t->ne[0] * sizeof(float);
    return ggml_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
}

int model_weight_bytes(const struct gguf_file *f, const struct model_hparams *hp,
                       size_t *layer_bytes, size_t *embed_bytes, size_t *head_bytes,
                       struct verr *err) {
    int rc = check_all(f, hp, err);
    if (rc)
        return rc;
    static const char *const mats[] = {"attn_q.weight",      "attn_k.weight",   "attn_v.weight",
                                       "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                       "ffn_down.weight"};
    static const char *const vecs[] = {"attn_norm.weight", "ffn_norm.weight", "attn_q.bias",
                                       "attn_k.bias", "attn_v.bias"};
    char name[96];
    for (int il = 0; il < hp->n_layer; il++) {
        size_t b = 0;
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", il, mats[i]);
            b += tensor_bytes(f, name, false);
        }
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", il, vecs[i]);
            b += tensor_bytes(f, name, true);
        }
        layer_bytes[il] = b;
    }
    const size_t rope = tensor_bytes(f, "rope_freqs.weight", true); // on every stage
    *embed_bytes = tensor_bytes(f, "token_embd.weight", false) + rope;
    size_t out = tensor_bytes(f, "output.weight", false);
    *head_bytes = (out ? out : tensor_bytes(f, "token_embd.weight", false)) +
                  tensor_bytes(f, "output_norm.weight", true) + rope;
    return 0;
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
    pipeline_free(m->pipe);
    for (int i = 0; i < m->n_allocs; i++)
        m->be->ops->free(m->be, m->allocs[i]);
    free(m->allocs);
    free(m->layers);
    free(m->name);
    free(m);
}
