// GGUF v3 writer: metadata and tensor infos are declared in memory, then the
// file is written front to back in one pass (whole, or with tensor data
// streamed in declaration order).
//
// Layout written (what llama.cpp and gguf-py expect): header, key/values in
// the order they were first set, tensor infos in declaration order, zero
// padding to the alignment, then each tensor's data followed by zero padding
// to the alignment (the last one too). Tensor offsets are assigned
// back to back from 0.
//
// Errors from the set_* calls (which have no verr argument) are sticky: the
// first one is remembered and makes gguf_writer_save / gguf_writer_begin fail
// with its message, so a dropped return code never yields a silently
// incomplete file.
#include "gguf/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ggml keeps tensor names in a char[64] (GGML_MAX_NAME), NUL included.
#define GGUF_WRITER_MAX_NAME 63
// Same nesting limit as the reader, so what we write we can read back.
#define GGUF_WRITER_MAX_DEPTH 8

struct wkv {
    char *key;
    struct gguf_value val; // owns its strings and arrays
};

struct wtensor {
    char *name;
    enum ggml_type type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data; // borrowed; NULL when streamed
    uint64_t nbytes;
    uint64_t offset; // assigned by begin
};

// Open-addressing name set over an array of entries (slots hold index + 1).
struct wset {
    uint64_t *slots;
    uint64_t cap;
};

enum wstate { W_IDLE, W_STREAMING };

struct gguf_writer {
    struct wkv *kv;
    uint64_t n_kv, cap_kv;
    struct wset kv_set;
    struct wtensor *t;
    uint64_t n_t, cap_t;
    struct wset t_set;

    struct verr sticky; // first error from a call without a verr argument
    bool failed;

    enum wstate state;
    FILE *fp;
    char *path;
    uint64_t pos;       // bytes written so far
    uint64_t alignment; // fixed by begin
    uint64_t cur;       // tensor being streamed
    uint64_t cur_done;  // bytes of it written
};

static int sticky_fail(struct gguf_writer *w, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int sticky_fail(struct gguf_writer *w, int code, const char *fmt, ...) {
    if (w && !w->failed) {
        char msg[sizeof w->sticky.msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        verr_set(&w->sticky, code, "gguf writer: %s", msg);
        w->failed = true;
    }
    return code;
}

// ---------------------------------------------------------------------------
// Name sets.

static uint64_t whash(const char *s) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static const char *kv_key(const void *tab, uint64_t i) {
    return ((const struct wkv *)tab)[i].key;
}

static const char *tensor_key(const void *tab, uint64_t i) {
    return ((const struct wtensor *)tab)[i].name;
}

static int64_t wset_find(const struct wset *s, const char *name,
                         const char *(*name_of)(const void *, uint64_t), const void *tab) {
    if (!s->slots)
        return -1;
    uint64_t mask = s->cap - 1;
    for (uint64_t i = whash(name) & mask;; i = (i + 1) & mask) {
        if (s->slots[i] == 0)
            return -1;
        if (strcmp(name_of(tab, s->slots[i] - 1), name) == 0)
            return (int64_t)(s->slots[i] - 1);
    }
}

// Makes room for n entries (keeps the load at most one half), re-inserting
// entries 0..n-1 when the table grows.
static int wset_reserve(struct wset *s, uint64_t n, const char *(*name_of)(const void *, uint64_t),
                        const void *tab) {
    if (s->cap >= 2 * n && s->slots)
        return 0;
    uint64_t cap = s->cap ? s->cap : 16;
    while (cap < 2 * n)
        cap *= 2;
    uint64_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return VERR_NOMEM;
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
    for (uint64_t i = 0; i + 1 < n; i++) {
        uint64_t j = whash(name_of(tab, i)) & (cap - 1);
        while (slots[j])
            j = (j + 1) & (cap - 1);
        slots[j] = i + 1;
    }
    return 0;
}

static void wset_put(struct wset *s, const char *name, uint64_t idx) {
    uint64_t mask = s->cap - 1;
    uint64_t j = whash(name) & mask;
    while (s->slots[j])
        j = (j + 1) & mask;
    s->slots[j] = idx + 1;
}

// ---------------------------------------------------------------------------
// Owned values.

static void value_free(struct gguf_value *v);

static void array_free(struct gguf_array *a) {
    if (a->strs)
        for (uint64_t i = 0; i < a->n; i++)
            free((void *)a->strs[i].data);
    if (a->elems)
        for (uint64_t i = 0; i < a->n; i++)
            value_free(&a->elems[i]);
    free((void *)a->data);
    free(a->strs);
    free(a->elems);
    memset(a, 0, sizeof *a);
}

static void value_free(struct gguf_value *v) {
    if (v->type == GGUF_VT_STRING)
        free((void *)v->str.data);
    else if (v->type == GGUF_VT_ARRAY)
        array_free(&v->arr);
    memset(v, 0, sizeof *v);
}

static int str_copy(struct gguf_writer *w, const char *key, struct gguf_str *dst,
                    const char *src, uint64_t len) {
    char *c = malloc(len + 1);
    if (!c)
        return sticky_fail(w, VERR_NOMEM, "key '%s': out of memory for a %" PRIu64 "-byte string",
                           key, len);
    if (len)
        memcpy(c, src, len);
    c[len] = '\0';
    dst->data = c;
    dst->len = len;
    return 0;
}

static int array_copy(struct gguf_writer *w, const char *key, struct gguf_array *dst,
                      const struct gguf_array *src, int depth);

// Deep copy of src into dst (zeroed on entry); on failure dst holds only what
// value_free can release.
static int value_copy(struct gguf_writer *w, const char *key, struct gguf_value *dst,
                      const struct gguf_value *src) {
    if ((uint32_t)src->type >= GGUF_VT_COUNT)
        return sticky_fail(w, VERR_RANGE, "key '%s': unknown value type %u", key,
                           (unsigned)src->type);
    dst->type = src->type;
    if (src->type == GGUF_VT_STRING) {
        if (!src->str.data && src->str.len)
            return sticky_fail(w, VERR_RANGE, "key '%s': NULL string data", key);
        return str_copy(w, key, &dst->str, src->str.data, src->str.len);
    }
    if (src->type == GGUF_VT_ARRAY)
        return array_copy(w, key, &dst->arr, &src->arr, 1);
    memcpy(dst, src, sizeof *dst); // a scalar: the union holds it
    return 0;
}

static int array_copy(struct gguf_writer *w, const char *key, struct gguf_array *dst,
                      const struct gguf_array *src, int depth) {
    uint32_t type = (uint32_t)src->type;
    if (type >= GGUF_VT_COUNT)
        return sticky_fail(w, VERR_RANGE, "key '%s': unknown array element type %u", key,
                           (unsigned)type);
    dst->type = src->type;
    uint64_t n = src->n;
    size_t esize = gguf_vtype_size(type);
    if (esize) {
        if (n > (SIZE_MAX / 2) / esize)
            return sticky_fail(w, VERR_RANGE, "key '%s': array of %" PRIu64 " elements is too large",
                               key, n);
        if (n && !src->data)
            return sticky_fail(w, VERR_RANGE, "key '%s': NULL array data", key);
        if (n) {
            void *d = malloc(n * esize);
            if (!d)
                return sticky_fail(w, VERR_NOMEM, "key '%s': out of memory for %" PRIu64
                                   " array elements", key, n);
            memcpy(d, src->data, n * esize);
            dst->data = d;
        }
        dst->n = n;
        return 0;
    }
    if (type == GGUF_VT_ARRAY && depth >= GGUF_WRITER_MAX_DEPTH)
        return sticky_fail(w, VERR_RANGE, "key '%s': arrays nested more than %d deep", key,
                           GGUF_WRITER_MAX_DEPTH);
    if (n && !(type == GGUF_VT_STRING ? (const void *)src->strs : (const void *)src->elems))
        return sticky_fail(w, VERR_RANGE, "key '%s': NULL array elements", key);
    if (n > SIZE_MAX / 2 / sizeof(struct gguf_value))
        return sticky_fail(w, VERR_RANGE, "key '%s': array of %" PRIu64 " elements is too large",
                           key, n);
    if (type == GGUF_VT_STRING) {
        if (n && !(dst->strs = calloc(n, sizeof *dst->strs)))
            return sticky_fail(w, VERR_NOMEM, "key '%s': out of memory for %" PRIu64 " strings",
                               key, n);
        for (uint64_t i = 0; i < n; i++) {
            dst->n = i + 1; // so array_free releases what was copied so far
            if (!src->strs[i].data && src->strs[i].len)
                return sticky_fail(w, VERR_RANGE, "key '%s': NULL string %" PRIu64, key, i);
            int rc = str_copy(w, key, &dst->strs[i], src->strs[i].data, src->strs[i].len);
            if (rc)
                return rc;
        }
        dst->n = n;
        return 0;
    }
    if (n && !(dst->elems = calloc(n, sizeof *dst->elems)))
        return sticky_fail(w, VERR_NOMEM, "key '%s': out of memory for %" PRIu64 " arrays", key,
                           n);
    for (uint64_t i = 0; i < n; i++) {
        dst->n = i + 1;
        if (src->elems[i].type != GGUF_VT_ARRAY)
            return sticky_fail(w, VERR_RANGE,
                               "key '%s': element %" PRIu64 " of an array of arrays is a %s",
                               key, i, gguf_vtype_name(src->elems[i].type));
        dst->elems[i].type = GGUF_VT_ARRAY;
        int rc = array_copy(w, key, &dst->elems[i].arr, &src->elems[i].arr, depth + 1);
        if (rc)
            return rc;
    }
    dst->n = n;
    return 0;
}

// ---------------------------------------------------------------------------
// Lifecycle and metadata.

struct gguf_writer *gguf_writer_new(void) {
    return calloc(1, sizeof(struct gguf_writer));
}

static void stream_abort(struct gguf_writer *w) {
    if (w->fp) {
        fclose(w->fp);
        w->fp = NULL;
        if (w->path)
            unlink(w->path); // a partial file must not look like a model
    }
    free(w->path);
    w->path = NULL;
    w->state = W_IDLE;
}

void gguf_writer_free(struct gguf_writer *w) {
    if (!w)
        return;
    stream_abort(w);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].val);
    }
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w->kv_set.slots);
    free(w->t_set.slots);
    free(w);
}

// Stores a value already copied into `val` (ownership moves to the writer).
static int put_kv(struct gguf_writer *w, const char *key, struct gguf_value *val) {
    int64_t i = wset_find(&w->kv_set, key, kv_key, w->kv);
    if (i >= 0) {
        value_free(&w->kv[i].val);
        w->kv[i].val = *val;
        return 0;
    }
    if (w->n_kv == w->cap_kv) {
        uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        struct wkv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv)
            goto oom;
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k)
        goto oom;
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].val = *val;
    if (wset_reserve(&w->kv_set, w->n_kv + 1, kv_key, w->kv)) {
        free(k);
        goto oom;
    }
    wset_put(&w->kv_set, k, w->n_kv);
    w->n_kv++;
    return 0;
oom:
    value_free(val);
    return sticky_fail(w, VERR_NOMEM, "key '%s': out of memory", key);
}

static int check_key(struct gguf_writer *w, const char *key) {
    if (!w)
        return VERR_RANGE;
    if (w->state != W_IDLE)
        return sticky_fail(w, VERR_RANGE, "key '%s': metadata cannot change while streaming",
                           key ? key : "(null)");
    if (!key || !key[0])
        return sticky_fail(w, VERR_RANGE, "empty or NULL key");
    return 0;
}

int gguf_writer_set_value(struct gguf_writer *w, const char *key, const struct gguf_value *v) {
    int rc = check_key(w, key);
    if (rc)
        return rc;
    if (!v)
        return sticky_fail(w, VERR_RANGE, "key '%s': NULL value", key);
    struct gguf_value copy;
    memset(&copy, 0, sizeof copy);
    if ((rc = value_copy(w, key, &copy, v))) {
        value_free(&copy);
        return rc;
    }
    return put_kv(w, key, &copy);
}

#define SCALAR_SETTER(fn, ctype, vt, field)                                                        \
    int fn(struct gguf_writer *w, const char *key, ctype v) {                                      \
        struct gguf_value val;                                                                     \
        memset(&val, 0, sizeof val);                                                               \
        val.type = vt;                                                                             \
        val.field = v;                                                                             \
        return gguf_writer_set_value(w, key, &val);                                                \
    }

SCALAR_SETTER(gguf_writer_set_u8, uint8_t, GGUF_VT_UINT8, u8)
SCALAR_SETTER(gguf_writer_set_i8, int8_t, GGUF_VT_INT8, i8)
SCALAR_SETTER(gguf_writer_set_u16, uint16_t, GGUF_VT_UINT16, u16)
SCALAR_SETTER(gguf_writer_set_i16, int16_t, GGUF_VT_INT16, i16)
SCALAR_SETTER(gguf_writer_set_u32, uint32_t, GGUF_VT_UINT32, u32)
SCALAR_SETTER(gguf_writer_set_i32, int32_t, GGUF_VT_INT32, i32)
SCALAR_SETTER(gguf_writer_set_u64, uint64_t, GGUF_VT_UINT64, u64)
SCALAR_SETTER(gguf_writer_set_i64, int64_t, GGUF_VT_INT64, i64)
SCALAR_SETTER(gguf_writer_set_f32, float, GGUF_VT_FLOAT32, f32)
SCALAR_SETTER(gguf_writer_set_f64, double, GGUF_VT_FLOAT64, f64)
SCALAR_SETTER(gguf_writer_set_bool, bool, GGUF_VT_BOOL, b)

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v) {
    if (!v) {
        int rc = check_key(w, key);
        return rc ? rc : sticky_fail(w, VERR_RANGE, "key '%s': NULL string", key);
    }
    struct gguf_value val;
    memset(&val, 0, sizeof val);
    val.type = GGUF_VT_STRING;
    val.str.data = v;
    val.str.len = strlen(v);
    return gguf_writer_set_value(w, key, &val);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                        const void *data, uint64_t n) {
    int rc = check_key(w, key);
    if (rc)
        return rc;
    if (gguf_vtype_size(elem) == 0)
        return sticky_fail(w, VERR_RANGE,
                           "key '%s': gguf_writer_set_arr takes fixed-size elements, not %s", key,
                           gguf_vtype_name(elem));
    struct gguf_value val;
    memset(&val, 0, sizeof val);
    val.type = GGUF_VT_ARRAY;
    val.arr.type = elem;
    val.arr.n = n;
    val.arr.data = data;
    return gguf_writer_set_value(w, key, &val);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                            uint64_t n) {
    int rc = check_key(w, key);
    if (rc)
        return rc;
    if (n && !v)
        return sticky_fail(w, VERR_RANGE, "key '%s': NULL string array", key);
    if (n > SIZE_MAX / 2 / sizeof(struct gguf_str))
        return sticky_fail(w, VERR_RANGE, "key '%s': %" PRIu64 " strings is too many", key, n);
    struct gguf_value val;
    memset(&val, 0, sizeof val);
    val.type = GGUF_VT_ARRAY;
    val.arr.type = GGUF_VT_STRING;
    val.arr.n = n;
    val.arr.strs = n ? calloc(n, sizeof *val.arr.strs) : NULL;
    if (n && !val.arr.strs)
        return sticky_fail(w, VERR_NOMEM, "key '%s': out of memory for %" PRIu64 " strings", key,
                           n);
    for (uint64_t i = 0; i < n; i++) {
        if (!v[i]) {
            free(val.arr.strs);
            return sticky_fail(w, VERR_RANGE, "key '%s': string %" PRIu64 " is NULL", key, i);
        }
        val.arr.strs[i].data = v[i];
        val.arr.strs[i].len = strlen(v[i]);
    }
    // The temporary view borrows the caller's strings; set_value copies them.
    rc = gguf_writer_set_value(w, key, &val);
    free(val.arr.strs);
    return rc;
}

int gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment) {
    if (!w)
        return VERR_RANGE;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        return sticky_fail(w, VERR_RANGE, "alignment %" PRIu32 " is not a nonzero power of two",
                           alignment);
    return gguf_writer_set_u32(w, "general.alignment", alignment);
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type,
                           uint32_t n_dims, const int64_t *ne, const void *data,
                           struct verr *err) {
    if (!w)
        return verr_set(err, VERR_RANGE, "gguf writer: NULL writer");
    if (w->state != W_IDLE)
        return verr_set(err, VERR_RANGE, "gguf writer: tensor '%s': cannot add tensors while "
                        "streaming", name ? name : "(null)");
    if (!name || !name[0])
        return verr_set(err, VERR_RANGE, "gguf writer: empty or NULL tensor name");
    size_t len = strlen(name);
    if (len > GGUF_WRITER_MAX_NAME)
        return verr_set(err, VERR_RANGE,
                        "gguf writer: tensor '%s': name is %zu bytes, ggml allows at most %d",
                        name, len, GGUF_WRITER_MAX_NAME);
    const struct ggml_type_info *ti = ggml_type_get((uint32_t)type);
    if (!ti)
        return verr_set(err, VERR_RANGE, "gguf writer: tensor '%s': unknown tensor type %d", name,
                        (int)type);
    if (n_dims > GGUF_MAX_DIMS || (n_dims && !ne))
        return verr_set(err, VERR_RANGE, "gguf writer: tensor '%s': %" PRIu32
                        " dimensions (at most %d)", name, n_dims, GGUF_MAX_DIMS);
    struct wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    int64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
        if (t.ne[d] <= 0)
            return verr_set(err, VERR_RANGE,
                            "gguf writer: tensor '%s': dimension %d is %" PRId64
                            " (must be positive)", name, d, t.ne[d]);
        if (__builtin_mul_overflow(nel, t.ne[d], &nel))
            return verr_set(err, VERR_RANGE, "gguf writer: tensor '%s': element count overflows",
                            name);
    }
    if (t.ne[0] % ti->block_size != 0)
        return verr_set(err, VERR_RANGE,
                        "gguf writer: tensor '%s': row length %" PRId64
                        " is not a multiple of the %s block size %" PRIu32,
                        name, t.ne[0], ti->name, ti->block_size);
    uint64_t nbytes = (uint64_t)(t.ne[0] / ti->block_size);
    bool over = __builtin_mul_overflow(nbytes, (uint64_t)ti->block_bytes, &nbytes);
    for (int d = 1; d < GGUF_MAX_DIMS && !over; d++)
        over = __builtin_mul_overflow(nbytes, (uint64_t)t.ne[d], &nbytes);
    if (over || nbytes > INT64_MAX)
        return verr_set(err, VERR_RANGE, "gguf writer: tensor '%s': byte size overflows", name);
    t.nbytes = nbytes;
    if (wset_find(&w->t_set, name, tensor_key, w->t) >= 0)
        return verr_set(err, VERR_RANGE, "gguf writer: tensor '%s' declared twice", name);
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? 2 * w->cap_t : 64;
        struct wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt)
            return verr_set(err, VERR_NOMEM, "gguf writer: out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = strdup(name)))
        return verr_set(err, VERR_NOMEM, "gguf writer: out of memory");
    w->t[w->n_t] = t;
    if (wset_reserve(&w->t_set, w->n_t + 1, tensor_key, w->t)) {
        free(t.name);
        return verr_set(err, VERR_NOMEM, "gguf writer: out of memory");
    }
    wset_put(&w->t_set, t.name, w->n_t);
    w->n_t++;
    return 0;
}

// ---------------------------------------------------------------------------
// Output.

static int out_bytes(struct gguf_writer *w, const void *p, uint64_t n, struct verr *err) {
    if (n && fwrite(p, 1, n, w->fp) != n)
        return verr_set(err, VERR_IO, "%s: write failed at offset %" PRIu64 ": %s", w->path,
                        w->pos, strerror(errno));
    w->pos += n;
    return 0;
}

static int out_u32(struct gguf_writer *w, uint32_t v, struct verr *err) {
    return out_bytes(w, &v, 4, err);
}

static int out_u64(struct gguf_writer *w, uint64_t v, struct verr *err) {
    return out_bytes(w, &v, 8, err);
}

static int out_str(struct gguf_writer *w, const char *s, uint64_t len, struct verr *err) {
    int rc = out_u64(w, len, err);
    return rc ? rc : out_bytes(w, s, len, err);
}

static int out_pad(struct gguf_writer *w, struct verr *err) {
    static const uint8_t zeros[4096];
    uint64_t pad = (w->alignment - w->pos % w->alignment) % w->alignment;
    while (pad) {
        uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
        int rc = out_bytes(w, zeros, n, err);
        if (rc)
            return rc;
        pad -= n;
    }
    return 0;
}

static int out_array(struct gguf_writer *w, const struct gguf_array *a, struct verr *err) {
    int rc;
    if ((rc = out_u32(w, (uint32_t)a->type, err)) || (rc = out_u64(w, a->n, err)))
        return rc;
    size_t esize = gguf_vtype_size(a->type);
    if (esize)
        return out_bytes(w, a->data, a->n * esize, err);
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->type == GGUF_VT_STRING)
            rc = out_str(w, a->strs[i].data, a->strs[i].len, err);
        else
            rc = out_array(w, &a->elems[i].arr, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int out_value(struct gguf_writer *w, const struct gguf_value *v, struct verr *err) {
    int rc = out_u32(w, (uint32_t)v->type, err);
    if (rc)
        return rc;
    switch (v->type) {
    case GGUF_VT_UINT8: return out_bytes(w, &v->u8, 1, err);
    case GGUF_VT_INT8: return out_bytes(w, &v->i8, 1, err);
    case GGUF_VT_UINT16: return out_bytes(w, &v->u16, 2, err);
    case GGUF_VT_INT16: return out_bytes(w, &v->i16, 2, err);
    case GGUF_VT_UINT32: return out_bytes(w, &v->u32, 4, err);
    case GGUF_VT_INT32: return out_bytes(w, &v->i32, 4, err);
    case GGUF_VT_FLOAT32: return out_bytes(w, &v->f32, 4, err);
    case GGUF_VT_UINT64: return out_bytes(w, &v->u64, 8, err);
    case GGUF_VT_INT64: return out_bytes(w, &v->i64, 8, err);
    case GGUF_VT_FLOAT64: return out_bytes(w, &v->f64, 8, err);
    case GGUF_VT_BOOL: {
        uint8_t b = v->b ? 1 : 0;
        return out_bytes(w, &b, 1, err);
    }
    case GGUF_VT_STRING: return out_str(w, v->str.data, v->str.len, err);
    case GGUF_VT_ARRAY: return out_array(w, &v->arr, err);
    default: break;
    }
    return verr_set(err, VERR_RANGE, "%s: unknown value type %u", w->path, (unsigned)v->type);
}

static int fail_stream(struct gguf_writer *w, int rc) {
    stream_abort(w);
    return rc;
}

int gguf_writer_begin(struct gguf_writer *w, const char *path, struct verr *err) {
    if (!w || !path)
        return verr_set(err, VERR_RANGE, "gguf writer: NULL writer or path");
    if (w->failed) {
        if (err)
            *err = w->sticky;
        return w->sticky.code;
    }
    if (w->state != W_IDLE)
        return verr_set(err, VERR_RANGE, "gguf writer: %s: already streaming to %s", path,
                        w->path);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = wset_find(&w->kv_set, "general.alignment", kv_key, w->kv);
    if (ai >= 0) {
        const struct gguf_value *v = &w->kv[ai].val;
        if (v->type != GGUF_VT_UINT32 || v->u32 == 0 || (v->u32 & (v->u32 - 1)) != 0)
            return verr_set(err, VERR_RANGE,
                            "gguf writer: general.alignment must be a UINT32 power of two");
        w->alignment = v->u32;
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        uint64_t padded = (w->t[i].nbytes + w->alignment - 1) / w->alignment * w->alignment;
        if (__builtin_add_overflow(off, padded, &off))
            return verr_set(err, VERR_RANGE, "gguf writer: total tensor data overflows 64 bits");
    }
    if (!(w->path = strdup(path)))
        return verr_set(err, VERR_NOMEM, "gguf writer: out of memory");
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        int rc = verr_set(err, VERR_IO, "%s: cannot create: %s", path, strerror(errno));
        free(w->path);
        w->path = NULL;
        return rc;
    }
    setvbuf(w->fp, NULL, _IOFBF, 1 << 20);
    w->state = W_STREAMING;
    w->pos = 0;
    w->cur = 0;
    w->cur_done = 0;

    int rc;
    if ((rc = out_bytes(w, "GGUF", 4, err)) || (rc = out_u32(w, 3, err)) ||
        (rc = out_u64(w, w->n_t, err)) || (rc = out_u64(w, w->n_kv, err)))
        return fail_stream(w, rc);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if ((rc = out_str(w, w->kv[i].key, strlen(w->kv[i].key), err)) ||
            (rc = out_value(w, &w->kv[i].val, err)))
            return fail_stream(w, rc);
    for (uint64_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        if ((rc = out_str(w, t->name, strlen(t->name), err)) ||
            (rc = out_u32(w, t->n_dims, err)))
            return fail_stream(w, rc);
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = out_u64(w, (uint64_t)t->ne[d], err)))
                return fail_stream(w, rc);
        if ((rc = out_u32(w, (uint32_t)t->type, err)) || (rc = out_u64(w, t->offset, err)))
            return fail_stream(w, rc);
    }
    if ((rc = out_pad(w, err)))
        return fail_stream(w, rc);
    return 0;
}

int gguf_writer_write_tensor_data(struct gguf_writer *w, const void *data, size_t nbytes,
                                  struct verr *err) {
    if (!w || w->state != W_STREAMING)
        return verr_set(err, VERR_RANGE,
                        "gguf writer: write_tensor_data called without gguf_writer_begin");
    if (w->cur >= w->n_t)
        return fail_stream(w, verr_set(err, VERR_RANGE,
                                       "%s: %zu bytes of tensor data past the last of the %" PRIu64
                                       " declared tensors",
                                       w->path, nbytes, w->n_t));
    const struct wtensor *t = &w->t[w->cur];
    if (nbytes > t->nbytes - w->cur_done)
        return fail_stream(w, verr_set(err, VERR_RANGE,
                                       "%s: tensor '%s': got %" PRIu64 " bytes, declared %" PRIu64
                                       " (%s)",
                                       w->path, t->name, (uint64_t)(w->cur_done + nbytes),
                                       t->nbytes, ggml_type_name(t->type)));
    if (nbytes && !data)
        return fail_stream(w, verr_set(err, VERR_RANGE, "%s: tensor '%s': NULL data", w->path,
                                       t->name));
    int rc = out_bytes(w, data, nbytes, err);
    if (rc)
        return fail_stream(w, rc);
    w->cur_done += nbytes;
    if (w->cur_done == t->nbytes) {
        if ((rc = out_pad(w, err)))
            return fail_stream(w, rc);
        w->cur++;
        w->cur_done = 0;
    }
    return 0;
}

int gguf_writer_finish(struct gguf_writer *w, struct verr *err) {
    if (!w || w->state != W_STREAMING)
        return verr_set(err, VERR_RANGE, "gguf writer: finish called without gguf_writer_begin");
    if (w->cur < w->n_t) {
        const struct wtensor *t = &w->t[w->cur];
        return fail_stream(w, verr_set(err, VERR_RANGE,
                                       "%s: tensor '%s' (%" PRIu64 " of %" PRIu64
                                       "): got %" PRIu64 " of its %" PRIu64 " bytes",
                                       w->path, t->name, w->cur + 1, w->n_t, w->cur_done,
                                       t->nbytes));
    }
    FILE *fp = w->fp;
    w->fp = NULL;
    int bad = fflush(fp) != 0 || ferror(fp);
    int e = errno;
    bad |= fclose(fp) != 0;
    if (bad) {
        int rc = verr_set(err, VERR_IO, "%s: write failed: %s", w->path, strerror(e ? e : errno));
        unlink(w->path);
        free(w->path);
        w->path = NULL;
        w->state = W_IDLE;
        return rc;
    }
    free(w->path);
    w->path = NULL;
    w->state = W_IDLE;
    return 0;
}

int gguf_writer_save(struct gguf_writer *w, const char *path, struct verr *err) {
    if (!w)
        return verr_set(err, VERR_RANGE, "gguf writer: NULL writer");
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!w->t[i].data)
            return verr_set(err, VERR_RANGE,
                            "gguf writer: %s: tensor '%s' has no data (give it to "
                            "gguf_writer_add_tensor or stream it with gguf_writer_begin)",
                            path ? path : "(null)", w->t[i].name);
    int rc = gguf_writer_begin(w, path, err);
    for (uint64_t i = 0; !rc && i < w->n_t; i++)
        rc = gguf_writer_write_tensor_data(w, w->t[i].data, w->t[i].nbytes, err);
    return rc ? rc : gguf_writer_finish(w, err);
}
