// GGUF v2/v3 reader: maps the file read-only and parses everything up front.
//
// Every read goes through the `rd_*` helpers, which check the remaining
// length before touching a byte; every count read from the file is compared
// with the bytes left before anything is allocated for it, so a file of N
// bytes never makes the reader allocate more than a small multiple of N.
// All memory a parse allocates lives in one list (struct arena) that
// gguf_close frees in one walk, so error paths never leak or double free.
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "vela reads GGUF files by memcpy of little-endian values; a big-endian host needs byte swaps"
#endif

static const char *const vtype_names[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = "UINT8",     [GGUF_VT_INT8] = "INT8",     [GGUF_VT_UINT16] = "UINT16",
    [GGUF_VT_INT16] = "INT16",     [GGUF_VT_UINT32] = "UINT32", [GGUF_VT_INT32] = "INT32",
    [GGUF_VT_FLOAT32] = "FLOAT32", [GGUF_VT_BOOL] = "BOOL",     [GGUF_VT_STRING] = "STRING",
    [GGUF_VT_ARRAY] = "ARRAY",     [GGUF_VT_UINT64] = "UINT64", [GGUF_VT_INT64] = "INT64",
    [GGUF_VT_FLOAT64] = "FLOAT64",
};

static const uint8_t vtype_sizes[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = 1,   [GGUF_VT_INT8] = 1,   [GGUF_VT_UINT16] = 2, [GGUF_VT_INT16] = 2,
    [GGUF_VT_UINT32] = 4,  [GGUF_VT_INT32] = 4,  [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
    [GGUF_VT_STRING] = 0,  [GGUF_VT_ARRAY] = 0,  [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8,
    [GGUF_VT_FLOAT64] = 8,
};

const char *gguf_vtype_name(uint32_t vtype) {
    return vtype < GGUF_VT_COUNT ? vtype_names[vtype] : "UNKNOWN";
}

size_t gguf_vtype_size(uint32_t vtype) {
    return vtype < GGUF_VT_COUNT ? vtype_sizes[vtype] : 0;
}

// Smallest encodings, used to bound counts before allocating:
// a key/value pair is key length (8) + at least 0 key bytes + type (4) + a
// value of at least 1 byte; a tensor info is name length (8) + n_dims (4) +
// type (4) + offset (8); a string is its length (8); a nested array is its
// element type (4) + count (8).
enum {
    MIN_KV_BYTES = 13,
    MIN_TENSOR_INFO_BYTES = 24,
    MIN_STRING_BYTES = 8,
    MIN_ARRAY_BYTES = 12,
    HEADER_BYTES = 24, // magic, version, tensor count, key count
};

// ---------------------------------------------------------------------------
// Allocation list: everything a parse allocates, freed together.

struct arena_block {
    struct arena_block *next;
    max_align_t data[];
};

struct arena {
    struct arena_block *head;
};

// Zeroed n*size bytes owned by the arena; NULL on overflow or OOM, or when n
// is 0 (callers keep NULL pointers for empty arrays).
static void *arena_calloc(struct arena *a, uint64_t n, size_t size) {
    uint64_t bytes;
    if (n == 0 || size == 0)
        return NULL;
    if (__builtin_mul_overflow(n, (uint64_t)size, &bytes) ||
        bytes > SIZE_MAX - sizeof(struct arena_block))
        return NULL;
    struct arena_block *b = calloc(1, sizeof *b + (size_t)bytes);
    if (!b)
        return NULL;
    b->next = a->head;
    a->head = b;
    return b->data;
}

static void arena_free(struct arena *a) {
    struct arena_block *b = a->head;
    while (b) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

// ---------------------------------------------------------------------------
// Name -> index hash set (open addressing, linear probing). Slots hold
// index + 1 so that 0 marks an empty slot.

struct name_index {
    uint64_t *slots; // [cap]
    uint64_t cap;    // power of two, at least twice the number of names
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int name_index_init(struct name_index *ix, struct arena *a, uint64_t n) {
    uint64_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    ix->slots = arena_calloc(a, cap, sizeof *ix->slots);
    ix->cap = cap;
    return ix->slots ? 0 : -1;
}

// Returns the index stored for `name`, or -1. names[i] is the name of entry i
// (a stride-separated array of char* inside kv or tensor structs).
static int64_t name_index_find(const struct name_index *ix, const char *name, size_t len,
                               const char *(*name_of)(const void *, uint64_t), const void *tab) {
    if (!ix->slots)
        return -1;
    uint64_t mask = ix->cap - 1;
    for (uint64_t i = hash_bytes(name, len) & mask;; i = (i + 1) & mask) {
        uint64_t s = ix->slots[i];
        if (s == 0)
            return -1;
        const char *other = name_of(tab, s - 1);
        if (strlen(other) == len && memcmp(other, name, len) == 0)
            return (int64_t)(s - 1);
    }
}

static void name_index_put(struct name_index *ix, const char *name, size_t len, uint64_t idx) {
    uint64_t mask = ix->cap - 1;
    uint64_t i = hash_bytes(name, len) & mask;
    while (ix->slots[i] != 0)
        i = (i + 1) & mask;
    ix->slots[i] = idx + 1;
}

static const char *kv_name_of(const void *tab, uint64_t i) {
    return ((const struct gguf_kv *)tab)[i].key;
}

static const char *tensor_name_of(const void *tab, uint64_t i) {
    return ((const struct gguf_tensor_info *)tab)[i].name;
}

struct gguf_priv {
    struct arena arena;
    struct name_index keys;
    struct name_index tensors;
    void *mapping; // what to munmap, or NULL for gguf_open_memory
    size_t mapping_size;
};

// ---------------------------------------------------------------------------
// Bounds-checked reading.

struct rd {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    const char *name; // file name for messages
    const char *ctx;  // "key 'x'" / "tensor 3 'y'" or "" for messages
    struct arena *arena;
    struct verr *err;
};

static int rd_fail(const struct rd *r, uint64_t off, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int rd_fail(const struct rd *r, uint64_t off, int code, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return verr_set(r->err, code, "%s: offset %" PRIu64 ": %s%s%s", r->name, off, r->ctx,
                    r->ctx[0] ? ": " : "", what);
}

static int rd_need(struct rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos)
        return rd_fail(r, r->pos, VERR_FORMAT,
                       "file truncated: %s needs %" PRIu64 " bytes, %" PRIu64 " left", what, n,
                       r->size - r->pos);
    return 0;
}

static int rd_bytes(struct rd *r, void *dst, uint64_t n, const char *what) {
    int rc = rd_need(r, n, what);
    if (rc)
        return rc;
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what) {
    return rd_bytes(r, v, 4, what);
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what) {
    return rd_bytes(r, v, 8, what);
}

static int rd_str(struct rd *r, struct gguf_str *s, const char *what) {
    uint64_t at = r->pos, len;
    int rc = rd_u64(r, &len, what);
    if (rc)
        return rc;
    if (len > r->size - r->pos)
        return rd_fail(r, at, VERR_FORMAT,
                       "%s length %" PRIu64 " runs past the end of the file (%" PRIu64
                       " bytes left)",
                       what, len, r->size - r->pos);
    s->len = len;
    s->data = (const char *)r->p + r->pos;
    r->pos += len;
    return 0;
}

// Arrays nest at most this deep; the format allows any depth but no writer
// uses more than one level, and the limit keeps the recursion shallow.
#define GGUF_MAX_ARRAY_DEPTH 8

static int rd_array(struct rd *r, struct gguf_array *a, int depth);

static int rd_value(struct rd *r, uint32_t type, uint64_t type_off, struct gguf_value *v) {
    v->type = (enum gguf_vtype)type;
    switch (type) {
    case GGUF_VT_UINT8: return rd_bytes(r, &v->u8, 1, "UINT8 value");
    case GGUF_VT_INT8: return rd_bytes(r, &v->i8, 1, "INT8 value");
    case GGUF_VT_UINT16: return rd_bytes(r, &v->u16, 2, "UINT16 value");
    case GGUF_VT_INT16: return rd_bytes(r, &v->i16, 2, "INT16 value");
    case GGUF_VT_UINT32: return rd_bytes(r, &v->u32, 4, "UINT32 value");
    case GGUF_VT_INT32: return rd_bytes(r, &v->i32, 4, "INT32 value");
    case GGUF_VT_FLOAT32: return rd_bytes(r, &v->f32, 4, "FLOAT32 value");
    case GGUF_VT_UINT64: return rd_bytes(r, &v->u64, 8, "UINT64 value");
    case GGUF_VT_INT64: return rd_bytes(r, &v->i64, 8, "INT64 value");
    case GGUF_VT_FLOAT64: return rd_bytes(r, &v->f64, 8, "FLOAT64 value");
    case GGUF_VT_BOOL: {
        uint8_t b = 0;
        int rc = rd_bytes(r, &b, 1, "BOOL value");
        v->b = b != 0;
        return rc;
    }
    case GGUF_VT_STRING: return rd_str(r, &v->str, "string");
    case GGUF_VT_ARRAY: return rd_array(r, &v->arr, 1);
    }
    return rd_fail(r, type_off, VERR_FORMAT, "unknown value type %" PRIu32 " (known: 0..%d)",
                   type, GGUF_VT_COUNT - 1);
}

static int rd_array(struct rd *r, struct gguf_array *a, int depth) {
    uint64_t at = r->pos;
    uint32_t type;
    uint64_t n;
    int rc;
    if ((rc = rd_u32(r, &type, "array element type")) || (rc = rd_u64(r, &n, "array length")))
        return rc;
    if (type >= GGUF_VT_COUNT)
        return rd_fail(r, at, VERR_FORMAT,
                       "unknown array element type %" PRIu32 " (known: 0..%d)", type,
                       GGUF_VT_COUNT - 1);
    a->type = (enum gguf_vtype)type;
    a->n = n;
    a->data = NULL;
    a->strs = NULL;
    a->elems = NULL;
    uint64_t left = r->size - r->pos;
    size_t esize = vtype_sizes[type];
    if (esize) {
        if (n > left / esize) {
            if (n > UINT64_MAX / esize)
                return rd_fail(r, at, VERR_FORMAT,
                               "array of %" PRIu64 " %s (more than 2^64 bytes) runs past the end "
                               "of the file (%" PRIu64 " bytes left)",
                               n, vtype_names[type], left);
            return rd_fail(r, at, VERR_FORMAT,
                           "array of %" PRIu64 " %s (%" PRIu64 " bytes) runs past the end of the "
                           "file (%" PRIu64 " bytes left)",
                           n, vtype_names[type], n * esize, left);
        }
        a->data = r->p + r->pos;
        r->pos += n * esize;
        return 0;
    }
    if (type == GGUF_VT_STRING) {
        if (n > left / MIN_STRING_BYTES)
            return rd_fail(r, at, VERR_FORMAT,
                           "array of %" PRIu64 " strings cannot fit in the %" PRIu64
                           " bytes left in the file",
                           n, left);
        if (n && !(a->strs = arena_calloc(r->arena, n, sizeof *a->strs)))
            return rd_fail(r, at, VERR_NOMEM, "out of memory for %" PRIu64 " strings", n);
        for (uint64_t i = 0; i < n; i++)
            if ((rc = rd_str(r, &a->strs[i], "array string")))
                return rc;
        return 0;
    }
    // Array of arrays.
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return rd_fail(r, at, VERR_FORMAT, "arrays nested more than %d deep",
                       GGUF_MAX_ARRAY_DEPTH);
    if (n > left / MIN_ARRAY_BYTES)
        return rd_fail(r, at, VERR_FORMAT,
                       "array of %" PRIu64 " arrays cannot fit in the %" PRIu64
                       " bytes left in the file",
                       n, left);
    if (n && !(a->elems = arena_calloc(r->arena, n, sizeof *a->elems)))
        return rd_fail(r, at, VERR_NOMEM, "out of memory for %" PRIu64 " nested arrays", n);
    for (uint64_t i = 0; i < n; i++) {
        a->elems[i].type = GGUF_VT_ARRAY;
        if ((rc = rd_array(r, &a->elems[i].arr, depth + 1)))
            return rc;
    }
    return 0;
}

// NUL-terminated arena copy of a name read from the file; names with a NUL
// byte inside are refused because every caller looks them up as C strings.
static int rd_name_copy(struct rd *r, const struct gguf_str *s, uint64_t at, const char *what,
                        char **out) {
    if (memchr(s->data, '\0', s->len))
        return rd_fail(r, at, VERR_FORMAT, "%s contains a NUL byte", what);
    char *c = arena_calloc(r->arena, s->len + 1, 1);
    if (!c)
        return rd_fail(r, at, VERR_NOMEM, "out of memory for a %s of %" PRIu64 " bytes", what,
                       s->len);
    memcpy(c, s->data, s->len);
    *out = c;
    return 0;
}

// Printable, length-capped form of a name for messages.
static void describe(char *buf, size_t cap, const char *what, uint64_t idx, const char *name,
                     uint64_t len) {
    int shown = len > 64 ? 64 : (int)len;
    char clean[65];
    for (int i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)name[i];
        clean[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    clean[shown] = '\0';
    snprintf(buf, cap, "%s %" PRIu64 " '%s%s'", what, idx, clean, len > 64 ? "..." : "");
}

static int parse_kvs(struct rd *r, struct gguf_file *f, struct gguf_priv *pv) {
    int rc;
    char ctx[160];
    if (f->n_kv && !(f->kv = arena_calloc(r->arena, f->n_kv, sizeof *f->kv)))
        return rd_fail(r, r->pos, VERR_NOMEM, "out of memory for %" PRIu64 " keys", f->n_kv);
    if (name_index_init(&pv->keys, r->arena, f->n_kv))
        return rd_fail(r, r->pos, VERR_NOMEM, "out of memory for the key index");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        struct gguf_kv *kv = &f->kv[i];
        struct gguf_str key;
        uint64_t at = r->pos;
        snprintf(ctx, sizeof ctx, "key %" PRIu64, i);
        r->ctx = ctx;
        if ((rc = rd_str(r, &key, "key")))
            return rc;
        describe(ctx, sizeof ctx, "key", i, key.data, key.len);
        if ((rc = rd_name_copy(r, &key, at, "key", &kv->key)))
            return rc;
        kv->offset = at;
        int64_t dup = name_index_find(&pv->keys, kv->key, key.len, kv_name_of, f->kv);
        if (dup >= 0)
            return rd_fail(r, at, VERR_FORMAT, "duplicate key (first defined as key %" PRId64
                           " at offset %" PRIu64 ")", dup, f->kv[dup].offset);
        name_index_put(&pv->keys, kv->key, key.len, i);
        uint32_t type;
        uint64_t type_off = r->pos;
        if ((rc = rd_u32(r, &type, "value type")) || (rc = rd_value(r, type, type_off, &kv->val)))
            return rc;
    }
    r->ctx = "";
    return 0;
}

static int check_alignment(struct rd *r, struct gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(f, "general.alignment");
    if (i < 0)
        return 0;
    const struct gguf_kv *kv = &f->kv[i];
    if (kv->val.type != GGUF_VT_UINT32)
        return rd_fail(r, kv->offset, VERR_FORMAT, "general.alignment must be UINT32, found %s",
                       gguf_vtype_name(kv->val.type));
    uint32_t a = kv->val.u32;
    if (a == 0 || (a & (a - 1)) != 0)
        return rd_fail(r, kv->offset, VERR_FORMAT,
                       "general.alignment %" PRIu32 " is not a nonzero power of two", a);
    f->alignment = a;
    return 0;
}

static int parse_tensor_infos(struct rd *r, struct gguf_file *f, struct gguf_priv *pv,
                              uint64_t *info_off) {
    int rc;
    char ctx[160];
    if (name_index_init(&pv->tensors, r->arena, f->n_tensors))
        return rd_fail(r, r->pos, VERR_NOMEM, "out of memory for the tensor index");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor_info *t = &f->tensors[i];
        struct gguf_str name;
        uint64_t at = r->pos;
        info_off[i] = at;
        snprintf(ctx, sizeof ctx, "tensor %" PRIu64, i);
        r->ctx = ctx;
        if ((rc = rd_str(r, &name, "tensor name")))
            return rc;
        describe(ctx, sizeof ctx, "tensor", i, name.data, name.len);
        if ((rc = rd_name_copy(r, &name, at, "tensor name", &t->name)))
            return rc;
        int64_t dup = name_index_find(&pv->tensors, t->name, name.len, tensor_name_of, f->tensors);
        if (dup >= 0)
            return rd_fail(r, at, VERR_FORMAT,
                           "duplicate tensor name (first declared as tensor %" PRId64
                           " at offset %" PRIu64 ")",
                           dup, info_off[dup]);
        name_index_put(&pv->tensors, t->name, name.len, i);

        uint64_t dims_at = r->pos;
        if ((rc = rd_u32(r, &t->n_dims, "number of dimensions")))
            return rc;
        if (t->n_dims > GGUF_MAX_DIMS)
            return rd_fail(r, dims_at, VERR_FORMAT, "%" PRIu32 " dimensions (at most %d allowed)",
                           t->n_dims, GGUF_MAX_DIMS);
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne_at = r->pos;
            if ((rc = rd_bytes(r, &t->ne[d], 8, "dimension")))
                return rc;
            if (t->ne[d] <= 0)
                return rd_fail(r, ne_at, VERR_FORMAT, "dimension %" PRIu32 " is %" PRId64
                               " (must be positive)", d, t->ne[d]);
        }
        uint64_t type_at = r->pos;
        uint32_t type;
        if ((rc = rd_u32(r, &type, "tensor type")))
            return rc;
        const struct ggml_type_info *ti = ggml_type_get(type);
        if (!ti)
            return rd_fail(r, type_at, VERR_FORMAT, "unknown tensor type %" PRIu32, type);
        t->type = (enum ggml_type)type;

        // Element count must fit int64 (ggml's ne is int64); bytes must fit uint64.
        int64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            if (__builtin_mul_overflow(nel, t->ne[d], &nel))
                return rd_fail(r, dims_at, VERR_FORMAT,
                               "element count overflows: %" PRId64 " x %" PRId64 " x %" PRId64
                               " x %" PRId64,
                               t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        if (t->ne[0] % ti->block_size != 0)
            return rd_fail(r, dims_at, VERR_FORMAT,
                           "row length %" PRId64 " is not a multiple of the %s block size %" PRIu32,
                           t->ne[0], ti->name, ti->block_size);
        uint64_t nbytes = (uint64_t)(t->ne[0] / ti->block_size);
        bool over = __builtin_mul_overflow(nbytes, (uint64_t)ti->block_bytes, &nbytes);
        for (int d = 1; d < GGUF_MAX_DIMS && !over; d++)
            over = __builtin_mul_overflow(nbytes, (uint64_t)t->ne[d], &nbytes);
        if (over)
            return rd_fail(r, dims_at, VERR_FORMAT, "byte size of the %s data overflows 64 bits",
                           ti->name);
        t->nbytes = nbytes;
        if ((rc = rd_u64(r, &t->offset, "tensor data offset")))
            return rc;
    }
    r->ctx = "";
    return 0;
}

static int check_tensor_data(struct rd *r, struct gguf_file *f, const uint64_t *info_off) {
    char ctx[160];
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor_info *t = &f->tensors[i];
        describe(ctx, sizeof ctx, "tensor", i, t->name, strlen(t->name));
        r->ctx = ctx;
        // The offset field is the last 8 bytes of the tensor info.
        uint64_t off_at = info_off[i] + 8 + strlen(t->name) + 4 + 8ull * t->n_dims + 4;
        if (t->offset % f->alignment != 0)
            return rd_fail(r, off_at, VERR_FORMAT,
                           "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                           t->offset, f->alignment);
        uint64_t start, end;
        if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->nbytes, &end) || end > f->size)
            return rd_fail(r, off_at, VERR_FORMAT,
                           "data (%" PRIu64 " bytes at data offset %" PRIu64 ", file offset %" PRIu64
                           ") runs past the end of the file (%" PRIu64 " bytes)",
                           t->nbytes, t->offset, f->data_offset + t->offset, f->size);
        t->data = f->map + start;
    }
    r->ctx = "";
    return 0;
}

// The magic comes first: a file, however short, whose first bytes are not
// "GGUF" (or the start of it) is "not a GGUF file", never a truncated one
// (a text file given as a model).
static int magic_check(const uint8_t *p, size_t size, const char *name, struct verr *err) {
    size_t n = size < 4 ? size : 4;
    if (memcmp(p, "GGUF", n) == 0) // an empty file is a truncated one
        return 0;
    char shown[5] = {0}, hex[16] = {0};
    size_t hl = 0;
    for (size_t i = 0; i < n; i++) {
        shown[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
        hl += (size_t)snprintf(hex + hl, sizeof hex - hl, "%s%02x", i ? " " : "", p[i]);
    }
    return verr_set(err, VERR_FORMAT,
                    "%s: offset 0: not a GGUF file (magic is '%s' = %s, expected 'GGUF')", name,
                    shown, hex);
}

static int parse(struct gguf_file *f, struct verr *err) {
    struct gguf_priv *pv = f->priv;
    struct rd r = {.p = f->map, .size = f->size, .name = f->path, .ctx = "",
                   .arena = &pv->arena, .err = err};
    int rc;
    if ((rc = magic_check(f->map, f->size, f->path, err)))
        return rc;
    uint8_t magic[4];
    if ((rc = rd_bytes(&r, magic, 4, "magic")))
        return rc;
    if ((rc = rd_u32(&r, &f->version, "version")))
        return rc;
    if (f->version == 1)
        return rd_fail(&r, 4, VERR_UNSUPPORTED,
                       "GGUF version 1 is not supported (vela reads versions 2 and 3; "
                       "re-convert the model with a current llama.cpp)");
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0 && (f->version >> 16) != 0)
            return rd_fail(&r, 4, VERR_UNSUPPORTED,
                           "version 0x%08" PRIx32 " means a big-endian GGUF file "
                           "(version %" PRIu32 " byte-swapped); vela reads little-endian files only",
                           f->version, __builtin_bswap32(f->version));
        return rd_fail(&r, 4, VERR_UNSUPPORTED,
                       "unsupported GGUF version %" PRIu32 " (vela reads versions 2 and 3)",
                       f->version);
    }
    if ((rc = rd_u64(&r, &f->n_tensors, "tensor count")) ||
        (rc = rd_u64(&r, &f->n_kv, "key/value count")))
        return rc;
    uint64_t left = r.size - r.pos;
    if (f->n_kv > left / MIN_KV_BYTES)
        return rd_fail(&r, 16, VERR_FORMAT,
                       "key/value count %" PRIu64 " cannot fit in the %" PRIu64
                       " bytes after the header",
                       f->n_kv, left);
    left -= f->n_kv * MIN_KV_BYTES;
    if (f->n_tensors > left / MIN_TENSOR_INFO_BYTES)
        return rd_fail(&r, 8, VERR_FORMAT,
                       "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                       " bytes after the header",
                       f->n_tensors, r.size - r.pos);
    if ((rc = parse_kvs(&r, f, pv)) || (rc = check_alignment(&r, f)))
        return rc;

    if (f->n_tensors && !(f->tensors = arena_calloc(&pv->arena, f->n_tensors, sizeof *f->tensors)))
        return rd_fail(&r, r.pos, VERR_NOMEM, "out of memory for %" PRIu64 " tensors",
                       f->n_tensors);
    uint64_t *info_off = f->n_tensors ? malloc(f->n_tensors * sizeof *info_off) : NULL;
    if (f->n_tensors && !info_off)
        return rd_fail(&r, r.pos, VERR_NOMEM, "out of memory for %" PRIu64 " tensors",
                       f->n_tensors);
    rc = parse_tensor_infos(&r, f, pv, info_off);
    if (!rc) {
        // The data section starts at the end of the tensor infos, rounded up.
        uint64_t end = r.pos;
        f->data_offset = (end + f->alignment - 1) / f->alignment * f->alignment;
        rc = check_tensor_data(&r, f, info_off);
    }
    free(info_off);
    return rc;
}

// Takes ownership of nothing; `path` is copied. On failure frees everything.
static int open_common(struct gguf_file **out, const void *buf, size_t size, const char *name,
                       void *mapping, size_t mapping_size, struct verr *err) {
    struct gguf_file *f = calloc(1, sizeof *f);
    struct gguf_priv *pv = calloc(1, sizeof *pv);
    char *path = strdup(name);
    if (!f || !pv || !path) {
        free(f);
        free(pv);
        free(path);
        if (mapping)
            munmap(mapping, mapping_size);
        return verr_set(err, VERR_NOMEM, "%s: out of memory", name);
    }
    f->path = path;
    f->priv = pv;
    f->map = buf;
    f->size = size;
    pv->mapping = mapping;
    pv->mapping_size = mapping_size;
    int rc = parse(f, err);
    if (rc) {
        gguf_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_open_memory(struct gguf_file **out, const void *buf, size_t size, const char *name,
                     struct verr *err) {
    *out = NULL;
    if (!name)
        name = "<memory>";
    if (!buf && size)
        return verr_set(err, VERR_RANGE, "%s: NULL buffer of %zu bytes", name, size);
    static const uint8_t empty[1];
    return open_common(out, buf ? buf : empty, size, name, NULL, 0, err);
}

int gguf_open(struct gguf_file **out, const char *path, struct verr *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return verr_set(err, VERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return verr_set(err, VERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return verr_set(err, VERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < HEADER_BYTES) {
        uint8_t head[4];
        ssize_t got = pread(fd, head, sizeof head, 0);
        close(fd);
        int rc = magic_check(head, got > 0 ? (size_t)got : 0, path, err);
        if (rc)
            return rc;
        return verr_set(err, VERR_FORMAT,
                        "%s: offset 0: file truncated: %lld bytes, a GGUF header needs %d", path,
                        (long long)st.st_size, HEADER_BYTES);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); // the mapping keeps the file referenced
    if (map == MAP_FAILED)
        return verr_set(err, VERR_IO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(e));
    return open_common(out, map, size, path, map, size, err);
}

void gguf_close(struct gguf_file *f) {
    if (!f)
        return;
    struct gguf_priv *pv = f->priv;
    if (pv) {
        arena_free(&pv->arena);
        if (pv->mapping)
            munmap(pv->mapping, pv->mapping_size);
        free(pv);
    }
    free(f->path);
    free(f);
}

// ---------------------------------------------------------------------------
// Lookups and typed getters.

int64_t gguf_find_key(const struct gguf_file *f, const char *key) {
    if (!f || !key || !f->priv)
        return -1;
    const struct gguf_priv *pv = f->priv;
    return name_index_find(&pv->keys, key, strlen(key), kv_name_of, f->kv);
}

const struct gguf_value *gguf_get(const struct gguf_file *f, const char *key) {
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i].val;
}

const struct gguf_tensor_info *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    if (!f || !name || !f->priv)
        return NULL;
    const struct gguf_priv *pv = f->priv;
    int64_t i = name_index_find(&pv->tensors, name, strlen(name), tensor_name_of, f->tensors);
    return i < 0 ? NULL : &f->tensors[i];
}

static int lookup(const struct gguf_file *f, const char *key, const struct gguf_value **v,
                  struct verr *err) {
    *v = gguf_get(f, key);
    if (!*v)
        return verr_set(err, VERR_NOTFOUND, "%s: key '%s' not found", f ? f->path : "(null)",
                        key ? key : "(null)");
    return 0;
}

static int type_error(const struct gguf_file *f, const char *key, const char *want,
                      const struct gguf_value *v, struct verr *err) {
    return verr_set(err, VERR_TYPE, "%s: key '%s': expected %s, found %s", f->path, key, want,
                    gguf_vtype_name(v->type));
}

// Integer value as sign + magnitude; false when the value is not an integer.
static bool value_int(const struct gguf_value *v, bool *neg, uint64_t *mag) {
    int64_t s;
    switch (v->type) {
    case GGUF_VT_UINT8: *neg = false; *mag = v->u8; return true;
    case GGUF_VT_UINT16: *neg = false; *mag = v->u16; return true;
    case GGUF_VT_UINT32: *neg = false; *mag = v->u32; return true;
    case GGUF_VT_UINT64: *neg = false; *mag = v->u64; return true;
    case GGUF_VT_INT8: s = v->i8; break;
    case GGUF_VT_INT16: s = v->i16; break;
    case GGUF_VT_INT32: s = v->i32; break;
    case GGUF_VT_INT64: s = v->i64; break;
    default: return false;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return true;
}

static int range_error(const struct gguf_file *f, const char *key, const char *want, bool neg,
                       uint64_t mag, const struct gguf_value *v, struct verr *err) {
    return verr_set(err, VERR_RANGE, "%s: key '%s': value %s%" PRIu64 " (%s) does not fit %s",
                    f->path, key, neg ? "-" : "", mag, gguf_vtype_name(v->type), want);
}

// The integer value of `key` as sign and magnitude; VERR_TYPE naming `want`
// when the value is not an integer.
static int lookup_int(const struct gguf_file *f, const char *key, const char *want,
                      const struct gguf_value **v, bool *neg, uint64_t *mag, struct verr *err) {
    int rc = lookup(f, key, v, err);
    if (rc)
        return rc;
    if (!value_int(*v, neg, mag))
        return type_error(f, key, want, *v, err);
    return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct verr *err) {
    const struct gguf_value *v;
    bool neg = false;
    uint64_t mag = 0;
    int rc = lookup_int(f, key, "UINT32", &v, &neg, &mag, err);
    if (rc)
        return rc;
    if (neg || mag > UINT32_MAX)
        return range_error(f, key, "UINT32", neg, mag, v, err);
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *out, struct verr *err) {
    const struct gguf_value *v;
    bool neg = false;
    uint64_t mag = 0;
    int rc = lookup_int(f, key, "INT32", &v, &neg, &mag, err);
    if (rc)
        return rc;
    if (neg ? mag > (uint64_t)INT32_MAX + 1 : mag > INT32_MAX)
        return range_error(f, key, "INT32", neg, mag, v, err);
    *out = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    return 0;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out, struct verr *err) {
    const struct gguf_value *v;
    bool neg = false;
    uint64_t mag = 0;
    int rc = lookup_int(f, key, "UINT64", &v, &neg, &mag, err);
    if (rc)
        return rc;
    if (neg)
        return range_error(f, key, "UINT64", neg, mag, v, err);
    *out = mag;
    return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct verr *err) {
    const struct gguf_value *v;
    bool neg;
    uint64_t mag;
    int rc = lookup(f, key, &v, err);
    if (rc)
        return rc;
    if (v->type == GGUF_VT_FLOAT32)
        *out = v->f32;
    else if (v->type == GGUF_VT_FLOAT64)
        *out = (float)v->f64;
    else if (value_int(v, &neg, &mag))
        *out = neg ? -(float)mag : (float)mag;
    else
        return type_error(f, key, "FLOAT32", v, err);
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct verr *err) {
    const struct gguf_value *v;
    int rc = lookup(f, key, &v, err);
    if (rc)
        return rc;
    if (v->type != GGUF_VT_BOOL)
        return type_error(f, key, "BOOL", v, err);
    *out = v->b;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, char **out, struct verr *err) {
    const struct gguf_value *v;
    int rc = lookup(f, key, &v, err);
    if (rc)
        return rc;
    if (v->type != GGUF_VT_STRING)
        return type_error(f, key, "STRING", v, err);
    char *s = malloc(v->str.len + 1);
    if (!s)
        return verr_set(err, VERR_NOMEM, "%s: key '%s': out of memory for a %" PRIu64
                        "-byte string", f->path, key, v->str.len);
    if (v->str.len)
        memcpy(s, v->str.data, v->str.len);
    s[v->str.len] = '\0';
    *out = s;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                 const struct gguf_array **out, struct verr *err) {
    const struct gguf_value *v;
    int rc = lookup(f, key, &v, err);
    if (rc)
        return rc;
    if (v->type != GGUF_VT_ARRAY) {
        char want[32];
        snprintf(want, sizeof want, "ARRAY[%s]", elem == GGUF_VT_COUNT ? "*" : gguf_vtype_name(elem));
        return type_error(f, key, want, v, err);
    }
    if (elem != GGUF_VT_COUNT && v->arr.type != elem)
        return verr_set(err, VERR_TYPE, "%s: key '%s': expected ARRAY[%s], found ARRAY[%s]",
                        f->path, key, gguf_vtype_name(elem), gguf_vtype_name(v->arr.type));
    *out = &v->arr;
    return 0;
}

// Truncation toward zero, saturating; NaN gives 0 (a plain cast would be
// undefined behaviour outside the int64 range).
static int64_t f64_to_i64(double x) {
    if (x != x)
        return 0;
    if (x >= 9223372036854775807.0)
        return INT64_MAX;
    if (x <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)x;
}

double gguf_arr_get_f64(const struct gguf_array *a, uint64_t i) {
    const uint8_t *p = (const uint8_t *)a->data + i * gguf_vtype_size(a->type);
    switch (a->type) {
    case GGUF_VT_FLOAT32: { float x; memcpy(&x, p, 4); return x; }
    case GGUF_VT_FLOAT64: { double x; memcpy(&x, p, 8); return x; }
    case GGUF_VT_UINT64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    default: return (double)gguf_arr_get_i64(a, i);
    }
}

int64_t gguf_arr_get_i64(const struct gguf_array *a, uint64_t i) {
    const uint8_t *p = (const uint8_t *)a->data + i * gguf_vtype_size(a->type);
    switch (a->type) {
    case GGUF_VT_UINT8: return *p;
    case GGUF_VT_BOOL: return *p != 0;
    case GGUF_VT_INT8: return (int8_t)*p;
    case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_VT_INT16: { int16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_VT_INT32: { int32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_VT_UINT64: { uint64_t x; memcpy(&x, p, 8); return (int64_t)x; }
    case GGUF_VT_INT64: { int64_t x; memcpy(&x, p, 8); return x; }
    case GGUF_VT_FLOAT32: { float x; memcpy(&x, p, 4); return f64_to_i64(x); }
    case GGUF_VT_FLOAT64: { double x; memcpy(&x, p, 8); return f64_to_i64(x); }
    default: return 0;
    }
}
