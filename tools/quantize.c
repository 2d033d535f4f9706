// vela quantize: the conversion (tools/quantize.h).
#include "tools/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "host/backend/threadpool.h"

#define QZ_CHUNK_BYTES (4u << 20) // output bytes converted per write

// The rules' view of f: layer and head counts from its metadata, attn_v
// tensors and whether the head is tied from its tensors. m.arch is malloc'd
// (or NULL): the caller frees it.
static struct ftype_model model_of(const struct gguf_file *f) {
    struct ftype_model m = {.tied = true};
    char *arch = NULL, key[160];
    struct verr ignore = {0};
    uint32_t v = 0;
    if (gguf_get_str(f, "general.architecture", &arch, &ignore) == VERR_OK && arch) {
        m.arch = arch;
        // Missing or per-layer (array) values stay 0: unknown.
        snprintf(key, sizeof key, "%s.block_count", arch);
        if (gguf_get_u32(f, key, &v, &ignore) == VERR_OK)
            m.n_layer = (int)v;
        snprintf(key, sizeof key, "%s.attention.head_count", arch);
        if (gguf_get_u32(f, key, &v, &ignore) == VERR_OK)
            m.n_head = m.n_head_kv = (int)v;
        snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
        if (gguf_get_u32(f, key, &v, &ignore) == VERR_OK)
            m.n_head_kv = (int)v;
        snprintf(key, sizeof key, "%s.expert_count", arch);
        if (gguf_get_u32(f, key, &v, &ignore) == VERR_OK)
            m.n_expert = (int)v;
    }
    int n_ffn_down = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        const enum ftype_role r = ftype_role_of(t->name, t->n_dims);
        m.n_attn_v += r == FTYPE_ROLE_ATTN_V;
        n_ffn_down += r == FTYPE_ROLE_FFN_DOWN;
        m.tied &= strcmp(t->name, "output.weight") != 0;
    }
    if (m.n_layer <= 0)
        m.n_layer = n_ffn_down;
    return m;
}

// The type of every tensor of f, in file order (to[i] for f->tensors[i]),
// and the counts of st.
static void plan_types(const struct quantize_opts *o, const struct gguf_file *f, enum ggml_type *to,
                       struct quantize_stats *st) {
    struct ftype_plan p = {.ft = o->ftype,
                           .m = model_of(f),
                           .pure = o->pure,
                           .type_embd = o->type_embd,
                           .type_output = o->type_output};
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        bool fell_back = false;
        to[i] = o->keep_output && strcmp(t->name, "output.weight") == 0
                    ? t->type
                    : ftype_tensor_type(&p, t->name, t->n_dims, t->ne[0],
                                        t->n_dims >= 3 ? t->ne[2] : 1, t->type, &fell_back);
        st->n_tensors++;
        st->n_fallback += fell_back;
        st->n_of_type[to[i]]++;
        st->bytes_in += t->nbytes;
        st->bytes_out += ggml_row_bytes(to[i], t->ne[0]) *
                         (uint64_t)(t->nbytes / ggml_row_bytes(t->type, t->ne[0]));
        if (to[i] == t->type)
            st->n_copied++;
        else
            st->n_converted++;
    }
    free((char *)p.m.arch);
}

static int check_type(int t, const char *what, struct verr *err) {
    if (t < 0)
        return VERR_OK;
    if (!quant_can_quantize((enum ggml_type)t)) // F32/F16/BF16 too
        return verr_set(err, VERR_UNSUPPORTED,
                        "%s: vela cannot write %s (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K "
                        "q3_K q4_K q5_K q6_K iq4_nl iq4_xs mxfp4)",
                        what, ggml_type_name((uint32_t)t));
    return VERR_OK;
}

// Refusals that need no writing: same file, undecodable or requantized
// tensors.
static int plan_check(const struct quantize_opts *o, const struct gguf_file *f,
                      const enum ggml_type *to, struct verr *err) {
    struct stat si, so;
    if (stat(o->in, &si) == 0 && stat(o->out, &so) == 0 && si.st_dev == so.st_dev &&
        si.st_ino == so.st_ino)
        return verr_set(err, VERR_RANGE, "%s: the output is the input file", o->out);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        if (to[i] == t->type)
            continue;
        int rc = check_type((int)to[i], t->name, err);
        if (rc)
            return rc;
        if (!quant_can_dequantize(t->type))
            return verr_set(err, VERR_UNSUPPORTED, "%s: %s: vela cannot decode %s tensors", o->in,
                            t->name, ggml_type_name(t->type));
        const bool block = ggml_type_get(t->type)->quantized;
        if (block && !o->allow_requantize)
            return verr_set(err, VERR_RANGE,
                            "%s: %s is %s already; converting it to %s loses precision twice "
                            "(--allow-requantize to do it anyway)",
                            o->in, t->name, ggml_type_name(t->type), ggml_type_name(to[i]));
    }
    return VERR_OK;
}

// Failures are remembered by the writer (gguf_writer_begin reports them).
static void set_metadata(const struct quantize_opts *o, const struct gguf_file *f,
                         const enum ggml_type *to, struct gguf_writer *w) {
    bool blocks = false;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        blocks |= ggml_type_get(to[i])->quantized;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (strcmp(f->kv[i].key, "general.alignment") == 0)
            gguf_writer_set_alignment(w, (uint32_t)f->alignment);
        else
            gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].val);
    }
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)o->ftype->id);
    if (blocks)
        gguf_writer_set_u32(w, "general.quantization_version", 2);
}

// One chunk of rows [r0, r0 + nr) of a tensor, converted by the pool's
// threads into buf; each thread has its own float row and first failure.
struct qz_chunk {
    const struct gguf_tensor_info *t;
    enum ggml_type to;
    size_t rb_in, rb_out;
    int64_t r0;
    uint8_t *buf;
    float *x;          // [threads][ne0]
    int *rc;           // [threads]
    int64_t *bad;      // [threads] the first failing row
    struct verr *errs; // [threads]
};

static void qz_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    struct qz_chunk *c = ctx;
    const int64_t n = c->t->ne[0];
    float *x = c->x + (size_t)thread * (size_t)n;
    for (int64_t r = begin; r < end && c->rc[thread] == VERR_OK; r++) {
        const uint8_t *src = (const uint8_t *)c->t->data + (size_t)(c->r0 + r) * c->rb_in;
        int rc = quant_dequantize_row(c->t->type, src, x, n, &c->errs[thread]);
        if (rc == VERR_OK)
            rc = quant_quantize_row(c->to, x, c->buf + (size_t)r * c->rb_out, n, &c->errs[thread]);
        if (rc) {
            c->rc[thread] = rc;
            c->bad[thread] = c->r0 + r;
        }
    }
}

// Output bytes written so far, reported through o->progress.
struct qz_progress {
    const struct quantize_opts *o;
    uint64_t done, total;
};

static void progress_add(struct qz_progress *p, uint64_t bytes) {
    p->done += bytes;
    if (p->o->progress)
        p->o->progress(p->o->progress_user, p->done, p->total);
}

// Tensor t's data in type `to`, in chunks of whole rows.
static int write_converted(const struct gguf_file *f, const struct gguf_tensor_info *t,
                           enum ggml_type to, struct threadpool *tp, struct gguf_writer *w,
                           struct qz_progress *pg, struct verr *err) {
    const int nt = threadpool_size(tp);
    const int64_t n = t->ne[0];
    struct qz_chunk c = {.t = t, .to = to};
    c.rb_in = ggml_row_bytes(t->type, n);
    c.rb_out = ggml_row_bytes(to, n);
    const int64_t rows = (int64_t)(t->nbytes / c.rb_in);
    int64_t per = (int64_t)(QZ_CHUNK_BYTES / c.rb_out);
    per = per < 1 ? 1 : per;
    c.buf = malloc(c.rb_out * (size_t)(per < rows ? per : rows));
    c.x = malloc((size_t)nt * (size_t)n * sizeof *c.x);
    c.rc = calloc((size_t)nt, sizeof *c.rc);
    c.bad = calloc((size_t)nt, sizeof *c.bad);
    c.errs = calloc((size_t)nt, sizeof *c.errs);
    int rc = (c.buf && c.x && c.rc && c.bad && c.errs) ? VERR_OK
                                                       : verr_set(err, VERR_NOMEM, "out of memory");
    for (c.r0 = 0; rc == VERR_OK && c.r0 < rows; c.r0 += per) {
        const int64_t nr = rows - c.r0 < per ? rows - c.r0 : per;
        threadpool_parallel_for(tp, nr, 1, qz_rows, &c);
        int worst = -1; // the first failing row, whichever thread met it
        for (int k = 0; k < nt; k++)
            if (c.rc[k] && (worst < 0 || c.bad[k] < c.bad[worst]))
                worst = k;
        if (worst >= 0) {
            *err = c.errs[worst];
            rc = c.rc[worst];
            verr_wrap(err, "%s: %s row %lld", f->path, t->name, (long long)c.bad[worst]);
        } else {
            rc = gguf_writer_write_tensor_data(w, c.buf, c.rb_out * (size_t)nr, err);
            progress_add(pg, c.rb_out * (uint64_t)nr);
        }
    }
    free(c.buf);
    free(c.x);
    free(c.rc);
    free(c.bad);
    free(c.errs);
    return rc;
}

// Writes f with tensor i in to[i] to a file beside o->out, renamed to it at
// the end, so that a failure leaves whatever was at o->out untouched.
static int write_file(const struct quantize_opts *o, const struct gguf_file *f,
                      const enum ggml_type *to, uint64_t bytes_out, struct verr *err) {
    int rc = VERR_OK;
    struct qz_progress pg = {.o = o, .total = bytes_out};
    const size_t tl = strlen(o->out) + 16;
    char *tmp = malloc(tl);
    struct gguf_writer *w = gguf_writer_new();
    if (!tmp || !w)
        rc = verr_set(err, VERR_NOMEM, "out of memory");
    else
        snprintf(tmp, tl, "%s.vela-partial", o->out);
    if (rc == VERR_OK)
        set_metadata(o, f, to, w);
    for (uint64_t i = 0; rc == VERR_OK && i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        rc = gguf_writer_add_tensor(w, t->name, to[i], t->n_dims, t->ne, NULL, err);
    }
    struct threadpool *tp = NULL;
    if (rc == VERR_OK)
        rc = threadpool_create(&tp, o->n_threads, err);
    if (rc == VERR_OK)
        rc = gguf_writer_begin(w, tmp, err);
    for (uint64_t i = 0; rc == VERR_OK && i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        if (to[i] != t->type) {
            rc = write_converted(f, t, to[i], tp, w, &pg, err);
        } else if ((rc = gguf_writer_write_tensor_data(w, t->data, t->nbytes, err)) == VERR_OK) {
            progress_add(&pg, t->nbytes);
        }
    }
    threadpool_free(tp);
    if (rc == VERR_OK)
        rc = gguf_writer_finish(w, err);
    gguf_writer_free(w); // removes a partial file
    if (rc == VERR_OK && rename(tmp, o->out) != 0) {
        rc = verr_set(err, VERR_IO, "%s: cannot rename %s to it", o->out, tmp);
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

int quantize_file(const struct quantize_opts *o, struct quantize_stats *stats, struct verr *err) {
    struct quantize_stats st = {0};
    if (!o->ftype)
        return verr_set(err, VERR_RANGE, "no file type given");
    int rc = check_type(o->type_embd, "--token-embedding-type", err);
    if (rc == VERR_OK)
        rc = check_type(o->type_output, "--output-tensor-type", err);
    if (rc)
        return rc;
    struct gguf_file *f = NULL;
    if ((rc = gguf_open(&f, o->in, err)))
        return rc;
    enum ggml_type *to = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *to);
    if (!to)
        rc = verr_set(err, VERR_NOMEM, "out of memory");
    else
        plan_types(o, f, to, &st);
    if (rc == VERR_OK)
        rc = plan_check(o, f, to, err);
    if (rc == VERR_OK)
        rc = write_file(o, f, to, st.bytes_out, err);
    free(to);
    gguf_close(f);
    if (rc == VERR_OK && stats)
        *stats = st;
    return rc;
}
