// GGUF reader and writer: round trips of every value and tensor type,
// streaming, getters, and malformed input (truncation at every byte, random
// byte flips, and one crafted file per rule the reader enforces), plus the
// real vocabulary files from ../shared/vocab when they are present.
#include <criterion/criterion.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"

// ---------------------------------------------------------------------------
// Helpers.

// A per-test scratch directory (Criterion runs each test in its own process).
static char tmp_dir[64];

static void make_tmp(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vela_test_gguf_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

static void remove_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_dir);
}

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static uint8_t *read_all(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(n ? (size_t)n : 1);
    cr_assert_eq(fread(p, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *size = (size_t)n;
    return p;
}

// Deterministic generator so failures reproduce (xorshift64*).
static uint64_t rng_state;
static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

// Touches every parsed byte a consumer could reach (what the fuzzer does).
static uint64_t walk_array(const struct gguf_array *a) {
    uint64_t h = a->n;
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->type == GGUF_VT_STRING)
            h += a->strs[i].len ? (uint8_t)a->strs[i].data[a->strs[i].len - 1] : 0;
        else if (a->type == GGUF_VT_ARRAY)
            h += walk_array(&a->elems[i].arr);
        else
            h += (uint64_t)gguf_arr_get_i64(a, i) + (uint64_t)(gguf_arr_get_f64(a, i) != 0);
    }
    return h;
}

static uint64_t walk_file(const struct gguf_file *f) {
    uint64_t h = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        cr_assert_eq(gguf_find_key(f, kv->key), (int64_t)i);
        if (kv->val.type == GGUF_VT_STRING)
            h += kv->val.str.len ? (uint8_t)kv->val.str.data[kv->val.str.len - 1] : 0;
        else if (kv->val.type == GGUF_VT_ARRAY)
            h += walk_array(&kv->val.arr);
        else
            h += kv->val.u8;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        cr_assert_eq(gguf_find_tensor(f, t->name), t);
        const uint8_t *d = t->data;
        h += d[0] + d[t->nbytes - 1];
    }
    return h;
}

// Bytes of a crafted file.
struct bb {
    uint8_t *p;
    size_t n, cap;
};

static void bb_put(struct bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u8(struct bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(struct bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(struct bb *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_str(struct bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}
static void bb_header(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(struct bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, GGUF_VT_UINT32);
    bb_u32(b, v);
}
// A tensor info; ne has n_dims entries.
static void bb_tensor(struct bb *b, const char *name, uint32_t n_dims, const int64_t *ne,
                      uint32_t type, uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        bb_u64(b, (uint64_t)ne[i]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static void bb_pad(struct bb *b, size_t align) {
    while (b->n % align)
        bb_u8(b, 0);
}

// Opens a copy of exactly `n` bytes (so the sanitizer catches any read past
// the end) and expects failure whose message contains every `want` string.
static void expect_bad_n(const void *buf, size_t n, const char *want1, const char *want2) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    struct gguf_file *f = (struct gguf_file *)1;
    struct verr err = {0};
    int rc = gguf_open_memory(&f, copy, n, "bad.gguf", &err);
    cr_assert_neq(rc, 0, "expected failure (%s)", want1);
    cr_assert_eq(rc, err.code);
    cr_assert_null(f);
    cr_assert(strstr(err.msg, "bad.gguf: ") == err.msg, "message does not start with the file: %s",
              err.msg);
    cr_assert(strstr(err.msg, want1), "message '%s' lacks '%s'", err.msg, want1);
    if (want2)
        cr_assert(strstr(err.msg, want2), "message '%s' lacks '%s'", err.msg, want2);
    free(copy);
}

static void expect_bad(struct bb *b, const char *want1, const char *want2) {
    expect_bad_n(b->p, b->n, want1, want2);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static char *at(uint64_t off) {
    static char buf[4][48];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "offset %" PRIu64 ":", off);
    return buf[k];
}

static struct gguf_file *open_ok(const char *path) {
    struct gguf_file *f = NULL;
    struct verr err = {0};
    int rc = gguf_open(&f, path, &err);
    cr_assert_eq(rc, 0, "gguf_open %s: %s", path, err.msg);
    cr_assert_not_null(f);
    return f;
}

// ---------------------------------------------------------------------------
// A file with one of everything, written by the writer.

static const char *const k_strs[] = {"", "a", "hello world", "\xe4\xbd\xa0\xe5\xa5\xbd", "x y z"};
enum { N_STRS = 5 };

static void fill_everything(struct gguf_writer *w) {
    cr_assert_eq(gguf_writer_set_u8(w, "t.u8", 200), 0);
    cr_assert_eq(gguf_writer_set_i8(w, "t.i8", -100), 0);
    cr_assert_eq(gguf_writer_set_u16(w, "t.u16", 60000), 0);
    cr_assert_eq(gguf_writer_set_i16(w, "t.i16", -30000), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "t.u32", 4000000000u), 0);
    cr_assert_eq(gguf_writer_set_i32(w, "t.i32", -2000000000), 0);
    cr_assert_eq(gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull), 0);
    cr_assert_eq(gguf_writer_set_i64(w, "t.i64", -9000000000000000000ll), 0);
    cr_assert_eq(gguf_writer_set_f32(w, "t.f32", 1.5e-5f), 0);
    cr_assert_eq(gguf_writer_set_f64(w, "t.f64", 3.141592653589793), 0);
    cr_assert_eq(gguf_writer_set_bool(w, "t.bool", true), 0);
    cr_assert_eq(gguf_writer_set_bool(w, "t.bool0", false), 0);
    cr_assert_eq(gguf_writer_set_str(w, "t.str", "llama"), 0);
    cr_assert_eq(gguf_writer_set_str(w, "t.empty", ""), 0);

    uint8_t au8[] = {1, 2, 255};
    int8_t ai8[] = {-1, 0, 127};
    uint16_t au16[] = {1, 65535};
    int16_t ai16[] = {-32768, 5};
    uint32_t au32[] = {7, 8, 9, 10, 11, 12, 13};
    int32_t ai32[] = {-7, 2147483647};
    uint64_t au64[] = {UINT64_MAX, 0};
    int64_t ai64[] = {INT64_MIN, 1};
    float af32[] = {0.5f, -2.0f, 1e30f};
    double af64[] = {1e-300, -0.25};
    uint8_t abool[] = {1, 0, 1};
    cr_assert_eq(gguf_writer_set_arr(w, "a.u8", GGUF_VT_UINT8, au8, 3), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.i8", GGUF_VT_INT8, ai8, 3), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.u16", GGUF_VT_UINT16, au16, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.i16", GGUF_VT_INT16, ai16, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.u32", GGUF_VT_UINT32, au32, 7), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.i32", GGUF_VT_INT32, ai32, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.u64", GGUF_VT_UINT64, au64, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.i64", GGUF_VT_INT64, ai64, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.f32", GGUF_VT_FLOAT32, af32, 3), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.f64", GGUF_VT_FLOAT64, af64, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.bool", GGUF_VT_BOOL, abool, 3), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.empty", GGUF_VT_INT32, NULL, 0), 0);
    cr_assert_eq(gguf_writer_set_arr_str(w, "a.str", k_strs, N_STRS), 0);
    cr_assert_eq(gguf_writer_set_arr_str(w, "a.str_empty", NULL, 0), 0);

    // [[1, 2], [], [3]] of INT32 and [[["x"]]] of STRING, via set_value.
    int32_t n12[] = {1, 2}, n3[] = {3};
    struct gguf_value inner[3];
    memset(inner, 0, sizeof inner);
    inner[0].type = inner[1].type = inner[2].type = GGUF_VT_ARRAY;
    inner[0].arr = (struct gguf_array){.type = GGUF_VT_INT32, .n = 2, .data = n12};
    inner[1].arr = (struct gguf_array){.type = GGUF_VT_INT32, .n = 0};
    inner[2].arr = (struct gguf_array){.type = GGUF_VT_INT32, .n = 1, .data = n3};
    struct gguf_value nested = {.type = GGUF_VT_ARRAY};
    nested.arr = (struct gguf_array){.type = GGUF_VT_ARRAY, .n = 3, .elems = inner};
    cr_assert_eq(gguf_writer_set_value(w, "a.nested", &nested), 0);

    struct gguf_str xs = {1, "x"};
    struct gguf_value l2 = {.type = GGUF_VT_ARRAY}, l1 = {.type = GGUF_VT_ARRAY},
                      l0 = {.type = GGUF_VT_ARRAY};
    l2.arr = (struct gguf_array){.type = GGUF_VT_STRING, .n = 1, .strs = &xs};
    l1.arr = (struct gguf_array){.type = GGUF_VT_ARRAY, .n = 1, .elems = &l2};
    l0.arr = (struct gguf_array){.type = GGUF_VT_ARRAY, .n = 1, .elems = &l1};
    cr_assert_eq(gguf_writer_set_value(w, "a.nested3", &l0), 0);

    // A string with a NUL byte inside, only expressible through set_value.
    struct gguf_value sv = {.type = GGUF_VT_STRING};
    sv.str = (struct gguf_str){3, "a\0b"};
    cr_assert_eq(gguf_writer_set_value(w, "t.nul", &sv), 0);
}

static void check_everything(const struct gguf_file *f) {
    const struct gguf_value *v;
    cr_assert_eq(f->version, 3);
    cr_assert_eq(f->n_tensors, 0);
    cr_assert_not_null(v = gguf_get(f, "t.u8"));
    cr_expect_eq(v->type, GGUF_VT_UINT8);
    cr_expect_eq(v->u8, 200);
    cr_expect_eq(gguf_get(f, "t.i8")->i8, -100);
    cr_expect_eq(gguf_get(f, "t.u16")->u16, 60000);
    cr_expect_eq(gguf_get(f, "t.i16")->i16, -30000);
    cr_expect_eq(gguf_get(f, "t.u32")->u32, 4000000000u);
    cr_expect_eq(gguf_get(f, "t.i32")->i32, -2000000000);
    cr_expect_eq(gguf_get(f, "t.u64")->u64, 18000000000000000000ull);
    cr_expect_eq(gguf_get(f, "t.i64")->i64, -9000000000000000000ll);
    cr_expect_eq(gguf_get(f, "t.f32")->f32, 1.5e-5f);
    cr_expect_eq(gguf_get(f, "t.f64")->f64, 3.141592653589793);
    cr_expect_eq(gguf_get(f, "t.bool")->b, true);
    cr_expect_eq(gguf_get(f, "t.bool0")->b, false);
    v = gguf_get(f, "t.str");
    cr_expect_eq(v->type, GGUF_VT_STRING);
    cr_expect_eq(v->str.len, 5);
    cr_expect(memcmp(v->str.data, "llama", 5) == 0);
    cr_expect_eq(gguf_get(f, "t.empty")->str.len, 0);
    v = gguf_get(f, "t.nul");
    cr_expect_eq(v->str.len, 3);
    cr_expect(memcmp(v->str.data, "a\0b", 3) == 0);

    static const struct {
        const char *key;
        enum gguf_vtype type;
        uint64_t n;
        double first, last;
    } arrs[] = {
        {"a.u8", GGUF_VT_UINT8, 3, 1, 255},        {"a.i8", GGUF_VT_INT8, 3, -1, 127},
        {"a.u16", GGUF_VT_UINT16, 2, 1, 65535},    {"a.i16", GGUF_VT_INT16, 2, -32768, 5},
        {"a.u32", GGUF_VT_UINT32, 7, 7, 13},       {"a.i32", GGUF_VT_INT32, 2, -7, 2147483647},
        {"a.u64", GGUF_VT_UINT64, 2, 18446744073709551615.0, 0},
        {"a.i64", GGUF_VT_INT64, 2, -9223372036854775808.0, 1},
        {"a.f32", GGUF_VT_FLOAT32, 3, 0.5, 1e30f}, {"a.f64", GGUF_VT_FLOAT64, 2, 1e-300, -0.25},
        {"a.bool", GGUF_VT_BOOL, 3, 1, 1},         {"a.empty", GGUF_VT_INT32, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        const struct gguf_array *a;
        struct verr err = {0};
        cr_assert_eq(gguf_get_arr(f, arrs[i].key, arrs[i].type, &a, &err), 0, "%s", err.msg);
        cr_expect_eq(a->type, arrs[i].type, "%s", arrs[i].key);
        cr_assert_eq(a->n, arrs[i].n, "%s", arrs[i].key);
        if (a->n) {
            cr_expect_eq(gguf_arr_get_f64(a, 0), arrs[i].first, "%s first", arrs[i].key);
            cr_expect_eq(gguf_arr_get_f64(a, a->n - 1), arrs[i].last, "%s last", arrs[i].key);
        }
    }
    const struct gguf_array *a;
    cr_assert_eq(gguf_get_arr(f, "a.i64", GGUF_VT_INT64, &a, NULL), 0);
    cr_expect_eq(gguf_arr_get_i64(a, 0), INT64_MIN);
    cr_assert_eq(gguf_get_arr(f, "a.f32", GGUF_VT_FLOAT32, &a, NULL), 0);
    cr_expect_eq(gguf_arr_get_i64(a, 1), -2);
    cr_expect_eq(gguf_arr_get_i64(a, 2), INT64_MAX, "saturates");

    cr_assert_eq(gguf_get_arr(f, "a.str", GGUF_VT_STRING, &a, NULL), 0);
    cr_assert_eq(a->n, N_STRS);
    for (int i = 0; i < N_STRS; i++) {
        cr_expect_eq(a->strs[i].len, strlen(k_strs[i]));
        cr_expect(memcmp(a->strs[i].data, k_strs[i], a->strs[i].len) == 0);
    }
    cr_assert_eq(gguf_get_arr(f, "a.str_empty", GGUF_VT_STRING, &a, NULL), 0);
    cr_expect_eq(a->n, 0);

    cr_assert_eq(gguf_get_arr(f, "a.nested", GGUF_VT_ARRAY, &a, NULL), 0);
    cr_assert_eq(a->n, 3);
    cr_expect_eq(a->elems[0].type, GGUF_VT_ARRAY);
    cr_expect_eq(a->elems[0].arr.type, GGUF_VT_INT32);
    cr_assert_eq(a->elems[0].arr.n, 2);
    cr_expect_eq(gguf_arr_get_i64(&a->elems[0].arr, 1), 2);
    cr_expect_eq(a->elems[1].arr.n, 0);
    cr_assert_eq(a->elems[2].arr.n, 1);
    cr_expect_eq(gguf_arr_get_i64(&a->elems[2].arr, 0), 3);

    cr_assert_eq(gguf_get_arr(f, "a.nested3", GGUF_VT_ARRAY, &a, NULL), 0);
    const struct gguf_array *deep = &a->elems[0].arr.elems[0].arr;
    cr_assert_eq(deep->type, GGUF_VT_STRING);
    cr_assert_eq(deep->n, 1);
    cr_expect(deep->strs[0].len == 1 && deep->strs[0].data[0] == 'x');
}

Test(gguf, roundtrip_every_value_type, .init = make_tmp, .fini = remove_tmp) {
    struct gguf_writer *w = gguf_writer_new();
    cr_assert_not_null(w);
    fill_everything(w);
    struct verr err = {0};
    cr_assert_eq(gguf_writer_save(w, tmp_path("v.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);

    struct gguf_file *f = open_ok(tmp_path("v.gguf"));
    check_everything(f);
    cr_expect_eq(f->alignment, GGUF_DEFAULT_ALIGNMENT);
    cr_expect_eq(f->data_offset % 32, 0);
    cr_expect_eq(f->size, f->data_offset, "no tensors: the file ends after the header padding");
    cr_expect_str_eq(f->path, tmp_path("v.gguf"));
    walk_file(f);

    // Copy every value into a second writer: the file must come out identical.
    struct gguf_writer *w2 = gguf_writer_new();
    for (uint64_t i = 0; i < f->n_kv; i++)
        cr_assert_eq(gguf_writer_set_value(w2, f->kv[i].key, &f->kv[i].val), 0);
    cr_assert_eq(gguf_writer_save(w2, tmp_path("v2.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w2);
    size_t n1, n2;
    uint8_t *b1 = read_all(tmp_path("v.gguf"), &n1), *b2 = read_all(tmp_path("v2.gguf"), &n2);
    cr_assert_eq(n1, n2);
    cr_expect(memcmp(b1, b2, n1) == 0, "set_value copy differs");
    free(b1);
    free(b2);
    gguf_close(f);
}

Test(gguf, roundtrip_every_tensor_type, .init = make_tmp, .fini = remove_tmp) {
    struct gguf_writer *w = gguf_writer_new();
    struct verr err = {0};
    uint8_t *datas[GGML_TYPE_COUNT] = {0};
    int64_t ne[GGML_TYPE_COUNT][4];
    uint32_t nd[GGML_TYPE_COUNT];
    size_t nbytes[GGML_TYPE_COUNT] = {0};
    rng_state = 42;
    for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
        const struct ggml_type_info *ti = ggml_type_get(t);
        if (!ti)
            continue;
        nd[t] = 1 + t % 4;
        ne[t][0] = ti->block_size * (1 + t % 3);
        ne[t][1] = 2;
        ne[t][2] = 3;
        ne[t][3] = 1 + t % 2;
        size_t n = ggml_row_bytes(t, ne[t][0]);
        for (uint32_t d = 1; d < nd[t]; d++)
            n *= (size_t)ne[t][d];
        nbytes[t] = n;
        datas[t] = malloc(n);
        for (size_t i = 0; i < n; i++)
            datas[t][i] = (uint8_t)rng_next();
        char name[32];
        snprintf(name, sizeof name, "tensor.%s", ti->name);
        cr_assert_eq(gguf_writer_add_tensor(w, name, t, nd[t], ne[t], datas[t], &err), 0, "%s",
                     err.msg);
    }
    cr_assert_eq(gguf_writer_set_str(w, "general.architecture", "test"), 0);
    cr_assert_eq(gguf_writer_save(w, tmp_path("t.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);

    struct gguf_file *f = open_ok(tmp_path("t.gguf"));
    uint64_t n_types = 0;
    for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
        const struct ggml_type_info *ti = ggml_type_get(t);
        if (!ti)
            continue;
        char name[32];
        snprintf(name, sizeof name, "tensor.%s", ti->name);
        const struct gguf_tensor_info *info = gguf_find_tensor(f, name);
        cr_assert_not_null(info, "%s missing", name);
        cr_expect_eq(info - f->tensors, (ptrdiff_t)n_types, "declaration order kept");
        cr_expect_eq(info->type, (enum ggml_type)t);
        cr_expect_eq(info->n_dims, nd[t]);
        for (uint32_t d = 0; d < 4; d++)
            cr_expect_eq(info->ne[d], d < nd[t] ? ne[t][d] : 1, "%s ne[%u]", name, d);
        cr_expect_eq(info->nbytes, nbytes[t], "%s nbytes", name);
        cr_expect_eq(info->offset % f->alignment, 0);
        cr_expect_eq((const uint8_t *)info->data, f->map + f->data_offset + info->offset);
        cr_expect(memcmp(info->data, datas[t], nbytes[t]) == 0, "%s data", name);
        free(datas[t]);
        n_types++;
    }
    cr_expect_eq(f->n_tensors, n_types);
    cr_expect_null(gguf_find_tensor(f, "nope"));
    cr_expect_null(gguf_find_tensor(f, "tensor.f3"), "prefix of a name is not a match");
    // Padding between the header and the data, and after each tensor, is zero.
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        uint64_t end = f->data_offset + t->offset + t->nbytes;
        uint64_t next = i + 1 < f->n_tensors ? f->data_offset + f->tensors[i + 1].offset : f->size;
        cr_expect_eq(next % f->alignment, 0);
        for (uint64_t p = end; p < next; p++)
            cr_assert_eq(f->map[p], 0, "padding byte at %" PRIu64, p);
    }
    gguf_close(f);
}

Test(gguf, alignment_custom, .init = make_tmp, .fini = remove_tmp) {
    static const uint32_t aligns[] = {1, 8, 64, 4096};
    float data[3] = {1, 2, 3};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        struct gguf_writer *w = gguf_writer_new();
        struct verr err = {0};
        cr_assert_eq(gguf_writer_set_alignment(w, aligns[k]), 0);
        int64_t ne[] = {3};
        cr_assert_eq(gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 1, ne, data, &err), 0);
        cr_assert_eq(gguf_writer_add_tensor(w, "b", GGML_TYPE_F32, 1, ne, data, &err), 0);
        cr_assert_eq(gguf_writer_save(w, tmp_path("a.gguf"), &err), 0, "%s", err.msg);
        gguf_writer_free(w);
        struct gguf_file *f = open_ok(tmp_path("a.gguf"));
        cr_expect_eq(f->alignment, aligns[k]);
        cr_expect_eq(f->data_offset % aligns[k], 0);
        cr_expect_eq(f->tensors[1].offset, (12 + aligns[k] - 1) / aligns[k] * aligns[k]);
        uint32_t a;
        cr_assert_eq(gguf_get_u32(f, "general.alignment", &a, NULL), 0);
        cr_expect_eq(a, aligns[k]);
        cr_expect(memcmp(f->tensors[1].data, data, 12) == 0);
        gguf_close(f);
    }
}

Test(gguf, stream_matches_save, .init = make_tmp, .fini = remove_tmp) {
    enum { N = 7 };
    static float data[N][256];
    for (int t = 0; t < N; t++)
        for (int i = 0; i < 256; i++)
            data[t][i] = (float)(t * 1000 + i);
    struct verr err = {0};
    struct gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.name", "stream");
    for (int t = 0; t < N; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        int64_t ne[] = {1 + t * 37 % 256};
        cr_assert_eq(gguf_writer_add_tensor(w, name, GGML_TYPE_F32, 1, ne, data[t], &err), 0);
    }
    cr_assert_eq(gguf_writer_save(w, tmp_path("whole.gguf"), &err), 0, "%s", err.msg);
    // Same writer, streamed: tensor by tensor, some in several chunks.
    cr_assert_eq(gguf_writer_begin(w, tmp_path("stream.gguf"), &err), 0, "%s", err.msg);
    for (int t = 0; t < N; t++) {
        size_t n = (size_t)(1 + t * 37 % 256) * 4;
        const uint8_t *p = (const uint8_t *)data[t];
        if (t % 2) {
            cr_assert_eq(gguf_writer_write_tensor_data(w, p, n / 2, &err), 0, "%s", err.msg);
            cr_assert_eq(gguf_writer_write_tensor_data(w, p + n / 2, 0, &err), 0, "%s", err.msg);
            cr_assert_eq(gguf_writer_write_tensor_data(w, p + n / 2, n - n / 2, &err), 0, "%s",
                         err.msg);
        } else {
            cr_assert_eq(gguf_writer_write_tensor_data(w, p, n, &err), 0, "%s", err.msg);
        }
    }
    cr_assert_eq(gguf_writer_finish(w, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    size_t n1, n2;
    uint8_t *b1 = read_all(tmp_path("whole.gguf"), &n1), *b2 = read_all(tmp_path("stream.gguf"), &n2);
    cr_assert_eq(n1, n2);
    cr_expect(memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);

    // Streaming with no data given at declaration time.
    w = gguf_writer_new();
    int64_t ne[] = {256, 1};
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 2, ne, NULL, &err), 0);
    cr_assert_neq(gguf_writer_save(w, tmp_path("nodata.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "tensor 'x' has no data"), "%s", err.msg);
    cr_assert_eq(gguf_writer_begin(w, tmp_path("s2.gguf"), &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_write_tensor_data(w, data[0], sizeof data[0], &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_finish(w, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    struct gguf_file *f = open_ok(tmp_path("s2.gguf"));
    cr_expect(memcmp(f->tensors[0].data, data[0], sizeof data[0]) == 0);
    gguf_close(f);
}

Test(gguf, stream_size_checks, .init = make_tmp, .fini = remove_tmp) {
    static uint8_t buf[4096];
    struct verr err = {0};
    struct gguf_writer *w = gguf_writer_new();
    int64_t ne[] = {64};
    cr_assert_eq(gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 1, ne, NULL, &err), 0);
    cr_assert_eq(gguf_writer_add_tensor(w, "b", GGML_TYPE_F16, 1, ne, NULL, &err), 0);

    // Too many bytes for a tensor: refused, the partial file is removed.
    cr_assert_eq(gguf_writer_begin(w, tmp_path("x.gguf"), &err), 0, "%s", err.msg);
    cr_assert_neq(gguf_writer_write_tensor_data(w, buf, 257, &err), 0);
    cr_expect(strstr(err.msg, "tensor 'a': got 257 bytes, declared 256"), "%s", err.msg);
    cr_expect_neq(access(tmp_path("x.gguf"), F_OK), 0, "partial file removed");
    cr_assert_neq(gguf_writer_write_tensor_data(w, buf, 1, &err), 0, "stream is over");
    cr_expect(strstr(err.msg, "without gguf_writer_begin"), "%s", err.msg);

    // Finishing early.
    cr_assert_eq(gguf_writer_begin(w, tmp_path("x.gguf"), &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_write_tensor_data(w, buf, 256, &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_write_tensor_data(w, buf, 100, &err), 0, "%s", err.msg);
    cr_assert_neq(gguf_writer_finish(w, &err), 0);
    cr_expect(strstr(err.msg, "tensor 'b' (2 of 2): got 100 of its 128 bytes"), "%s", err.msg);
    cr_expect_neq(access(tmp_path("x.gguf"), F_OK), 0, "partial file removed");

    // Data past the last tensor.
    cr_assert_eq(gguf_writer_begin(w, tmp_path("x.gguf"), &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_write_tensor_data(w, buf, 256, &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_write_tensor_data(w, buf, 128, &err), 0, "%s", err.msg);
    cr_assert_neq(gguf_writer_write_tensor_data(w, buf, 4, &err), 0);
    cr_expect(strstr(err.msg, "past the last of the 2 declared tensors"), "%s", err.msg);

    // No changes while streaming; finish without begin.
    cr_assert_eq(gguf_writer_begin(w, tmp_path("x.gguf"), &err), 0, "%s", err.msg);
    cr_assert_neq(gguf_writer_add_tensor(w, "c", GGML_TYPE_F32, 1, ne, NULL, &err), 0);
    cr_expect(strstr(err.msg, "while streaming"), "%s", err.msg);
    cr_assert_neq(gguf_writer_begin(w, tmp_path("y.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "already streaming"), "%s", err.msg);
    gguf_writer_free(w); // mid-stream: removes the partial file
    cr_expect_neq(access(tmp_path("x.gguf"), F_OK), 0, "partial file removed by free");

    w = gguf_writer_new();
    cr_assert_neq(gguf_writer_finish(w, &err), 0);
    cr_expect(strstr(err.msg, "without gguf_writer_begin"), "%s", err.msg);
    cr_assert_neq(gguf_writer_save(w, "/nonexistent-dir/x.gguf", &err), 0);
    cr_expect_eq(err.code, VERR_IO);
    cr_expect(strstr(err.msg, "/nonexistent-dir/x.gguf: cannot create"), "%s", err.msg);
    gguf_writer_free(w);
}

Test(gguf, writer_rejects_bad_declarations, .init = make_tmp, .fini = remove_tmp) {
    struct verr err = {0};
    struct gguf_writer *w = gguf_writer_new();
    int64_t ne[] = {32, 2, 1, 1, 1};
    int64_t zero[] = {32, 0};
    int64_t neg[] = {-32};
    int64_t odd[] = {33};
    int64_t huge[] = {INT64_MAX / 2, 4};
    const struct {
        const char *name;
        enum ggml_type type;
        uint32_t n_dims;
        const int64_t *ne;
        const char *want;
    } cases[] = {
        {"", GGML_TYPE_F32, 1, ne, "empty or NULL tensor name"},
        {"0123456789012345678901234567890123456789012345678901234567890123", GGML_TYPE_F32, 1,
         ne, "ggml allows at most 63"},
        {"t", (enum ggml_type)4, 1, ne, "unknown tensor type 4"},
        {"t", (enum ggml_type)GGML_TYPE_COUNT, 1, ne, "unknown tensor type"},
        {"t", GGML_TYPE_F32, 5, ne, "5 dimensions"},
        {"t", GGML_TYPE_F32, 2, zero, "dimension 1 is 0"},
        {"t", GGML_TYPE_F32, 1, neg, "dimension 0 is -32"},
        {"t", GGML_TYPE_Q4_0, 1, odd, "row length 33 is not a multiple of the q4_0 block size 32"},
        {"t", GGML_TYPE_F32, 2, huge, "overflows"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = gguf_writer_add_tensor(w, cases[i].name, cases[i].type, cases[i].n_dims,
                                        cases[i].ne, NULL, &err);
        cr_expect_neq(rc, 0, "case %zu accepted", i);
        cr_expect(strstr(err.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, err.msg,
                  cases[i].want);
    }
    cr_assert_eq(gguf_writer_add_tensor(w, "t", GGML_TYPE_F32, 2, ne, NULL, &err), 0, "%s",
                 err.msg);
    cr_assert_neq(gguf_writer_add_tensor(w, "t", GGML_TYPE_F32, 2, ne, NULL, &err), 0);
    cr_expect(strstr(err.msg, "tensor 't' declared twice"), "%s", err.msg);
    // Scalars (n_dims 0) are one element, as in ggml.
    cr_assert_eq(gguf_writer_add_tensor(w, "s", GGML_TYPE_F32, 0, NULL, NULL, &err), 0, "%s",
                 err.msg);
    gguf_writer_free(w);

    // set_* errors are sticky: save reports the first one.
    w = gguf_writer_new();
    cr_expect_neq(gguf_writer_set_alignment(w, 48), 0);
    cr_expect_eq(gguf_writer_set_u32(w, "ok", 1), 0);
    cr_assert_neq(gguf_writer_save(w, tmp_path("s.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "alignment 48 is not a nonzero power of two"), "%s", err.msg);
    cr_expect_neq(access(tmp_path("s.gguf"), F_OK), 0, "nothing written");
    gguf_writer_free(w);

    w = gguf_writer_new();
    cr_expect_neq(gguf_writer_set_str(w, "k", NULL), 0);
    cr_assert_neq(gguf_writer_save(w, tmp_path("s.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "key 'k': NULL string"), "%s", err.msg);
    gguf_writer_free(w);

    w = gguf_writer_new();
    cr_expect_neq(gguf_writer_set_arr(w, "k", GGUF_VT_STRING, NULL, 0), 0);
    cr_assert_neq(gguf_writer_save(w, tmp_path("s.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "fixed-size elements"), "%s", err.msg);
    gguf_writer_free(w);

    w = gguf_writer_new();
    cr_expect_neq(gguf_writer_set_u32(w, "", 1), 0);
    gguf_writer_free(w);

    // Arrays nested deeper than the reader accepts are refused when set.
    w = gguf_writer_new();
    struct gguf_value lv[10];
    memset(lv, 0, sizeof lv);
    for (int i = 0; i < 10; i++) {
        lv[i].type = GGUF_VT_ARRAY;
        lv[i].arr.type = i < 9 ? GGUF_VT_ARRAY : GGUF_VT_INT32;
        lv[i].arr.n = i < 9 ? 1 : 0;
        lv[i].arr.elems = i < 9 ? &lv[i + 1] : NULL;
    }
    cr_expect_eq(gguf_writer_set_value(w, "deep8", &lv[2]), 0, "8 levels are fine");
    cr_expect_neq(gguf_writer_set_value(w, "deep10", &lv[0]), 0);
    cr_assert_neq(gguf_writer_save(w, tmp_path("s.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "nested more than 8 deep"), "%s", err.msg);
    gguf_writer_free(w);

    // general.alignment set by hand with a bad type.
    w = gguf_writer_new();
    cr_expect_eq(gguf_writer_set_u64(w, "general.alignment", 64), 0);
    cr_assert_neq(gguf_writer_save(w, tmp_path("s.gguf"), &err), 0);
    cr_expect(strstr(err.msg, "general.alignment must be a UINT32 power of two"), "%s", err.msg);
    gguf_writer_free(w);
}

Test(gguf, writer_replaces_keys, .init = make_tmp, .fini = remove_tmp) {
    struct gguf_writer *w = gguf_writer_new();
    struct verr err = {0};
    gguf_writer_set_u32(w, "a", 1);
    gguf_writer_set_str(w, "b", "x");
    gguf_writer_set_str(w, "a", "now a string");
    const char *s[] = {"p", "q"};
    gguf_writer_set_arr_str(w, "b", s, 2);
    // Enough keys to grow the key index several times.
    for (int i = 0; i < 200; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        gguf_writer_set_i32(w, k, i);
        gguf_writer_set_i32(w, k, -i);
    }
    cr_assert_eq(gguf_writer_save(w, tmp_path("r.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    struct gguf_file *f = open_ok(tmp_path("r.gguf"));
    cr_expect_eq(f->n_kv, 202);
    cr_expect_str_eq(f->kv[0].key, "a", "first-set order kept");
    char *str = NULL;
    cr_assert_eq(gguf_get_str(f, "a", &str, NULL), 0);
    cr_expect_str_eq(str, "now a string");
    free(str);
    const struct gguf_array *a;
    cr_assert_eq(gguf_get_arr(f, "b", GGUF_VT_STRING, &a, NULL), 0);
    cr_expect_eq(a->n, 2);
    int32_t v;
    cr_assert_eq(gguf_get_i32(f, "k199", &v, NULL), 0);
    cr_expect_eq(v, -199);
    gguf_close(f);
}

// ---------------------------------------------------------------------------
// Typed getters.

Test(gguf, getters_convert_and_report, .init = make_tmp, .fini = remove_tmp) {
    struct gguf_writer *w = gguf_writer_new();
    struct verr err = {0};
    gguf_writer_set_u8(w, "u8", 7);
    gguf_writer_set_i64(w, "neg", -5);
    gguf_writer_set_i64(w, "big", 5000000000ll);
    gguf_writer_set_u64(w, "huge", UINT64_MAX);
    gguf_writer_set_i32(w, "min", INT32_MIN);
    gguf_writer_set_str(w, "s", "text");
    gguf_writer_set_f64(w, "d", 0.25);
    gguf_writer_set_f32(w, "f", -1.5f);
    gguf_writer_set_bool(w, "b", true);
    uint32_t arr[] = {1, 2};
    gguf_writer_set_arr(w, "arr", GGUF_VT_UINT32, arr, 2);
    cr_assert_eq(gguf_writer_save(w, tmp_path("g.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    struct gguf_file *f = open_ok(tmp_path("g.gguf"));
    const char *path = tmp_path("g.gguf");
    char want[512];

    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    bool b;
    char *s;
    const struct gguf_array *a;
    cr_assert_eq(gguf_get_u32(f, "u8", &u32, &err), 0);
    cr_expect_eq(u32, 7);
    cr_assert_eq(gguf_get_i32(f, "neg", &i32, &err), 0);
    cr_expect_eq(i32, -5);
    cr_assert_eq(gguf_get_i32(f, "min", &i32, &err), 0);
    cr_expect_eq(i32, INT32_MIN);
    cr_assert_eq(gguf_get_u64(f, "huge", &u64, &err), 0);
    cr_expect_eq(u64, UINT64_MAX);
    cr_assert_eq(gguf_get_u64(f, "big", &u64, &err), 0);
    cr_expect_eq(u64, 5000000000ull);
    cr_assert_eq(gguf_get_f32(f, "d", &f32, &err), 0);
    cr_expect_eq(f32, 0.25f);
    cr_assert_eq(gguf_get_f32(f, "f", &f32, &err), 0);
    cr_expect_eq(f32, -1.5f);
    cr_assert_eq(gguf_get_f32(f, "neg", &f32, &err), 0);
    cr_expect_eq(f32, -5.0f);
    cr_assert_eq(gguf_get_bool(f, "b", &b, &err), 0);
    cr_expect(b);
    cr_assert_eq(gguf_get_str(f, "s", &s, &err), 0);
    cr_expect_str_eq(s, "text");
    free(s);
    cr_assert_eq(gguf_get_arr(f, "arr", GGUF_VT_COUNT, &a, &err), 0);
    cr_expect_eq(a->n, 2);

    // Absent keys.
    cr_expect_eq(gguf_get_u32(f, "missing", &u32, &err), VERR_NOTFOUND);
    snprintf(want, sizeof want, "%s: key 'missing' not found", path);
    cr_expect_str_eq(err.msg, want);
    cr_expect_eq(gguf_find_key(f, "missing"), -1);
    cr_expect_null(gguf_get(f, "missing"));
    cr_expect_eq(gguf_get_str(f, "missing", &s, NULL), VERR_NOTFOUND, "err may be NULL");

    // Wrong types: the message format callers rely on.
    cr_expect_eq(gguf_get_u32(f, "s", &u32, &err), VERR_TYPE);
    snprintf(want, sizeof want, "%s: key 's': expected UINT32, found STRING", path);
    cr_expect_str_eq(err.msg, want);
    cr_expect_eq(gguf_get_str(f, "u8", &s, &err), VERR_TYPE);
    snprintf(want, sizeof want, "%s: key 'u8': expected STRING, found UINT8", path);
    cr_expect_str_eq(err.msg, want);
    cr_expect_eq(gguf_get_bool(f, "u8", &b, &err), VERR_TYPE);
    cr_expect(strstr(err.msg, "expected BOOL, found UINT8"), "%s", err.msg);
    cr_expect_eq(gguf_get_f32(f, "s", &f32, &err), VERR_TYPE);
    cr_expect(strstr(err.msg, "expected FLOAT32, found STRING"), "%s", err.msg);
    cr_expect_eq(gguf_get_i32(f, "d", &i32, &err), VERR_TYPE);
    cr_expect(strstr(err.msg, "expected INT32, found FLOAT64"), "%s", err.msg);
    cr_expect_eq(gguf_get_arr(f, "arr", GGUF_VT_STRING, &a, &err), VERR_TYPE);
    cr_expect(strstr(err.msg, "key 'arr': expected ARRAY[STRING], found ARRAY[UINT32]"), "%s",
              err.msg);
    cr_expect_eq(gguf_get_arr(f, "s", GGUF_VT_INT32, &a, &err), VERR_TYPE);
    cr_expect(strstr(err.msg, "expected ARRAY[INT32], found STRING"), "%s", err.msg);
    cr_expect_eq(gguf_get_u32(f, "arr", &u32, &err), VERR_TYPE);
    cr_expect(strstr(err.msg, "expected UINT32, found ARRAY"), "%s", err.msg);

    // Integers that do not fit.
    cr_expect_eq(gguf_get_u32(f, "neg", &u32, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "key 'neg': value -5 (INT64) does not fit UINT32"), "%s", err.msg);
    cr_expect_eq(gguf_get_u64(f, "neg", &u64, &err), VERR_RANGE);
    cr_expect_eq(gguf_get_u32(f, "big", &u32, &err), VERR_RANGE);
    cr_expect_eq(gguf_get_i32(f, "big", &i32, &err), VERR_RANGE);
    cr_expect_eq(gguf_get_i32(f, "huge", &i32, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "value 18446744073709551615 (UINT64) does not fit INT32"), "%s",
              err.msg);
    gguf_close(f);
}

Test(gguf, vtype_names_and_sizes) {
    cr_expect_str_eq(gguf_vtype_name(GGUF_VT_UINT32), "UINT32");
    cr_expect_str_eq(gguf_vtype_name(GGUF_VT_FLOAT64), "FLOAT64");
    cr_expect_str_eq(gguf_vtype_name(GGUF_VT_ARRAY), "ARRAY");
    cr_expect_str_eq(gguf_vtype_name(13), "UNKNOWN");
    cr_expect_eq(gguf_vtype_size(GGUF_VT_UINT16), 2);
    cr_expect_eq(gguf_vtype_size(GGUF_VT_BOOL), 1);
    cr_expect_eq(gguf_vtype_size(GGUF_VT_INT64), 8);
    cr_expect_eq(gguf_vtype_size(GGUF_VT_STRING), 0);
    cr_expect_eq(gguf_vtype_size(99), 0);
}

// ---------------------------------------------------------------------------
// Malformed input.

// A valid file whose last tensor ends exactly at the end of the file, so
// every shorter prefix is invalid.
static uint8_t *small_valid_file(size_t *size) {
    struct gguf_writer *w = gguf_writer_new();
    struct verr err = {0};
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", 4096);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    const char *toks[] = {"<s>", "</s>", "a", "b"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    int32_t types[] = {3, 3, 1, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 4);
    int32_t n12[] = {1, 2};
    struct gguf_value inner = {.type = GGUF_VT_ARRAY};
    inner.arr = (struct gguf_array){.type = GGUF_VT_INT32, .n = 2, .data = n12};
    struct gguf_value nested = {.type = GGUF_VT_ARRAY};
    nested.arr = (struct gguf_array){.type = GGUF_VT_ARRAY, .n = 1, .elems = &inner};
    gguf_writer_set_value(w, "x.nested", &nested);
    static uint8_t d1[64 * 4], d2[32 * 18 / 32 * 2];
    for (size_t i = 0; i < sizeof d1; i++)
        d1[i] = (uint8_t)i;
    int64_t ne1[] = {16, 4}, ne2[] = {64};
    cr_assert_eq(gguf_writer_add_tensor(w, "tok_embd.weight", GGML_TYPE_F32, 2, ne1, d1, &err), 0);
    cr_assert_eq(gguf_writer_add_tensor(w, "blk.0.q", GGML_TYPE_Q4_0, 1, ne2, d2, &err), 0);
    cr_assert_eq(gguf_writer_add_tensor(w, "output.weight", GGML_TYPE_F32, 2, ne1, d1, &err), 0);
    cr_assert_eq(gguf_writer_save(w, tmp_path("small.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    uint8_t *buf = read_all(tmp_path("small.gguf"), size);
    // 256 bytes of F32 data is a multiple of 32: no padding after the last tensor.
    struct gguf_file *f = NULL;
    cr_assert_eq(gguf_open_memory(&f, buf, *size, "small", &err), 0, "%s", err.msg);
    const struct gguf_tensor_info *last = &f->tensors[f->n_tensors - 1];
    cr_assert_eq(f->data_offset + last->offset + last->nbytes, *size);
    gguf_close(f);
    return buf;
}

Test(gguf, truncation_at_every_offset, .init = make_tmp, .fini = remove_tmp) {
    size_t size;
    uint8_t *buf = small_valid_file(&size);
    for (size_t n = 0; n < size; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        struct gguf_file *f = (struct gguf_file *)1;
        struct verr err = {0};
        int rc = gguf_open_memory(&f, copy, n, "cut.gguf", &err);
        cr_assert_neq(rc, 0, "prefix of %zu of %zu bytes accepted", n, size);
        cr_assert_null(f);
        cr_assert(strncmp(err.msg, "cut.gguf: offset ", 17) == 0, "at %zu: %s", n, err.msg);
        cr_assert(strstr(err.msg, "truncated") || strstr(err.msg, "past the end") ||
                      strstr(err.msg, "cannot fit"),
                  "at %zu: %s", n, err.msg);
        free(copy);
    }
    // And through gguf_open on real files, at a few places.
    static const size_t cuts[] = {0, 3, 23, 24, 100};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        FILE *fp = fopen(tmp_path("cut.gguf"), "wb");
        fwrite(buf, 1, cuts[i], fp);
        fclose(fp);
        struct gguf_file *f = NULL;
        struct verr err = {0};
        cr_assert_neq(gguf_open(&f, tmp_path("cut.gguf"), &err), 0);
        cr_expect(strstr(err.msg, tmp_path("cut.gguf")), "%s", err.msg);
        cr_expect(strstr(err.msg, "truncated") || strstr(err.msg, "cannot fit"), "%s", err.msg);
    }
    free(buf);
}

Test(gguf, random_byte_flips_never_crash, .init = make_tmp, .fini = remove_tmp) {
    size_t size;
    uint8_t *buf = small_valid_file(&size);
    uint8_t *copy = malloc(size);
    rng_state = 0x5eed1234abcdull;
    int ok = 0, bad = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(copy, buf, size);
        int flips = 1 + (int)(rng_next() % 4);
        for (int k = 0; k < flips; k++) {
            size_t pos = rng_next() % size;
            // Mostly small changes (off-by-some counts), sometimes any byte.
            if (rng_next() % 2)
                copy[pos] ^= (uint8_t)(1u << (rng_next() % 8));
            else
                copy[pos] = (uint8_t)rng_next();
        }
        struct gguf_file *f = NULL;
        struct verr err = {0};
        if (gguf_open_memory(&f, copy, size, "flip.gguf", &err) == 0) {
            walk_file(f);
            gguf_close(f);
            ok++;
        } else {
            cr_assert_null(f);
            cr_assert(strncmp(err.msg, "flip.gguf: offset ", 18) == 0, "iteration %d: %s", it,
                      err.msg);
            bad++;
        }
    }
    cr_expect_gt(bad, 100, "flips should break the file often (%d ok, %d bad)", ok, bad);
    cr_expect_gt(ok, 100, "flips in data bytes leave it valid (%d ok, %d bad)", ok, bad);
    free(copy);
    free(buf);
}

Test(gguf, bad_header) {
    struct bb b = {0};
    bb_put(&b, "GGML", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_bad(&b, "offset 0: not a GGUF file", "'GGML'");

    bb_header(&b, 1, 0, 0);
    expect_bad(&b, "offset 4: GGUF version 1 is not supported", NULL);

    bb_header(&b, 0x03000000, 0, 0);
    expect_bad(&b, "offset 4: version 0x03000000", "big-endian");
    bb_header(&b, 0x02000000, 0, 0);
    expect_bad(&b, "big-endian", "version 2 byte-swapped");

    bb_header(&b, 4, 0, 0);
    expect_bad(&b, "offset 4: unsupported GGUF version 4", NULL);

    // Version 2 files are read like version 3.
    bb_header(&b, 2, 0, 1);
    bb_kv_u32(&b, "a", 1);
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open_memory(&f, b.p, b.n, "v2", &err), 0, "%s", err.msg);
    cr_expect_eq(f->version, 2);
    gguf_close(f);
    free(b.p);
    memset(&b, 0, sizeof b);

    expect_bad_n("GGU", 3, "offset 0: file truncated: magic needs 4 bytes, 3 left", NULL);
    expect_bad_n("", 0, "offset 0: file truncated", NULL);
}

Test(gguf, absurd_counts) {
    struct bb b = {0};
    bb_header(&b, 3, 0, UINT64_MAX);
    bb_kv_u32(&b, "a", 1);
    expect_bad(&b, "offset 16: key/value count 18446744073709551615 cannot fit", NULL);

    bb_header(&b, 3, 1000000, 1);
    bb_kv_u32(&b, "a", 1);
    expect_bad(&b, "offset 8: tensor count 1000000 cannot fit", NULL);

    // Key length larger than the file.
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 60);
    bb_put(&b, "abcdefgh", 8);
    bb_u32(&b, 0);
    bb_u8(&b, 0);
    expect_bad(&b, at(24), "key length 1152921504606846976 runs past the end");

    // String value length larger than the file.
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, GGUF_VT_STRING);
    size_t s_at = b.n;
    bb_u64(&b, UINT64_MAX);
    bb_put(&b, "xyz", 3);
    expect_bad(&b, at(s_at), "key 0 'k': string length 18446744073709551615 runs past the end");

    // Fixed-size array whose byte size overflows / exceeds the file.
    static const uint64_t counts[] = {UINT64_MAX, UINT64_MAX / 4 + 1, 1000};
    for (size_t i = 0; i < 3; i++) {
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "arr");
        bb_u32(&b, GGUF_VT_ARRAY);
        size_t a_at = b.n;
        bb_u32(&b, GGUF_VT_UINT32);
        bb_u64(&b, counts[i]);
        bb_u32(&b, 1);
        expect_bad(&b, at(a_at), "runs past the end of the file (4 bytes left)");
    }

    // Arrays of strings and of arrays with absurd counts.
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 1ull << 40);
    bb_u64(&b, 0);
    expect_bad(&b, "array of 1099511627776 strings cannot fit", NULL);

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u64(&b, 1ull << 40);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_bad(&b, "array of 1099511627776 arrays cannot fit", NULL);

    // A string inside an array runs past the end.
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "ok");
    size_t bad_at = b.n;
    bb_u64(&b, 100);
    bb_put(&b, "short", 5);
    expect_bad(&b, at(bad_at), "array string length 100 runs past the end");
}

Test(gguf, unknown_types) {
    struct bb b = {0};
    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "ok", 1);
    bb_str(&b, "bad");
    size_t t_at = b.n;
    bb_u32(&b, 13);
    bb_u32(&b, 0);
    expect_bad(&b, at(t_at), "key 1 'bad': unknown value type 13");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_VT_ARRAY);
    size_t a_at = b.n;
    bb_u32(&b, 0xffffffffu);
    bb_u64(&b, 0);
    expect_bad(&b, at(a_at), "unknown array element type 4294967295");

    static const uint32_t bad_types[] = {4, 5, 31, 36, GGML_TYPE_COUNT, 1000};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        bb_header(&b, 3, 1, 0);
        int64_t ne[] = {32};
        size_t info_at = b.n;
        bb_tensor(&b, "w", 1, ne, bad_types[i], 0);
        bb_pad(&b, 32);
        for (int k = 0; k < 1024; k++)
            bb_u8(&b, 0);
        char want[64];
        snprintf(want, sizeof want, "tensor 0 'w': unknown tensor type %u", bad_types[i]);
        expect_bad(&b, at(info_at + 8 + 1 + 4 + 8), want);
    }
}

// One tensor "w" of type `type` with dims ne, data offset `offset`, and
// `data_bytes` bytes of data after the aligned header.
static void one_tensor(struct bb *b, uint32_t n_dims, const int64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_bytes) {
    bb_header(b, 3, 1, 0);
    bb_tensor(b, "w", n_dims, ne, type, offset);
    bb_pad(b, 32);
    for (size_t k = 0; k < data_bytes; k++)
        bb_u8(b, 0);
}

Test(gguf, bad_tensor_infos) {
    struct bb b = {0};
    const size_t dims_at = 24 + 8 + 1; // after the header and the name "w"
    int64_t ne[5] = {8, 2, 1, 1, 1};

    // Sanity: the well-formed version opens.
    one_tensor(&b, 2, ne, GGML_TYPE_F32, 0, 64);
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open_memory(&f, b.p, b.n, "ok", &err), 0, "%s", err.msg);
    cr_expect_eq(f->tensors[0].nbytes, 64);
    gguf_close(f);
    free(b.p);
    memset(&b, 0, sizeof b);

    one_tensor(&b, 5, ne, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, at(dims_at), "tensor 0 'w': 5 dimensions (at most 4 allowed)");

    int64_t zero[] = {8, 0};
    one_tensor(&b, 2, zero, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, at(dims_at + 4 + 8), "dimension 1 is 0 (must be positive)");

    int64_t neg[] = {-8};
    one_tensor(&b, 1, neg, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, at(dims_at + 4), "dimension 0 is -8 (must be positive)");

    // Element count overflows int64.
    int64_t big[] = {1ll << 40, 1ll << 40};
    one_tensor(&b, 2, big, GGML_TYPE_F32, 0, 64);
    expect_bad(&b, at(dims_at), "element count overflows");

    // Elements fit in int64 but the bytes overflow 64 bits (F64: 8 bytes each).
    int64_t big2[] = {1ll << 31, 1ll << 31};
    one_tensor(&b, 2, big2, GGML_TYPE_F64, 0, 64);
    expect_bad(&b, at(dims_at), "byte size of the f64 data overflows 64 bits");

    int64_t odd[] = {40};
    one_tensor(&b, 1, odd, GGML_TYPE_Q8_0, 0, 64);
    expect_bad(&b, at(dims_at), "row length 40 is not a multiple of the q8_0 block size 32");

    // Data past the end of the file: one byte short, and an absurd offset.
    const size_t off_at = dims_at + 4 + 16 + 4;
    one_tensor(&b, 2, ne, GGML_TYPE_F32, 0, 63);
    expect_bad(&b, at(off_at), "data (64 bytes at data offset 0, file offset 96) runs past the end "
                               "of the file (159 bytes)");
    one_tensor(&b, 2, ne, GGML_TYPE_F32, UINT64_MAX - 31, 64);
    expect_bad(&b, at(off_at), "runs past the end of the file");

    // Misaligned offset.
    one_tensor(&b, 2, ne, GGML_TYPE_F32, 16, 128);
    expect_bad(&b, at(off_at), "data offset 16 is not a multiple of the alignment 32");

    // Names with a NUL byte inside.
    bb_header(&b, 3, 1, 0);
    bb_u64(&b, 3);
    bb_put(&b, "a\0b", 3);
    bb_u32(&b, 1);
    bb_u64(&b, 8);
    bb_u32(&b, GGML_TYPE_F32);
    bb_u64(&b, 0);
    bb_pad(&b, 32);
    for (int k = 0; k < 32; k++)
        bb_u8(&b, 0);
    expect_bad(&b, at(24), "tensor name contains a NUL byte");

    // A tensor info cut short in the middle.
    one_tensor(&b, 2, ne, GGML_TYPE_F32, 0, 0);
    b.n = dims_at + 4 + 8 + 3;
    expect_bad(&b, "file truncated: dimension needs 8 bytes, 3 left", at(dims_at + 4 + 8));
}

Test(gguf, duplicates) {
    struct bb b = {0};
    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "a", 1);
    bb_kv_u32(&b, "b", 2);
    size_t dup_at = b.n;
    bb_kv_u32(&b, "a", 3);
    expect_bad(&b, at(dup_at), "key 2 'a': duplicate key (first defined as key 0 at offset 24)");

    int64_t ne[] = {8};
    bb_header(&b, 3, 3, 0);
    bb_tensor(&b, "x", 1, ne, GGML_TYPE_F32, 0);
    bb_tensor(&b, "y", 1, ne, GGML_TYPE_F32, 32);
    size_t t_at = b.n;
    bb_tensor(&b, "x", 1, ne, GGML_TYPE_F32, 64);
    bb_pad(&b, 32);
    for (int k = 0; k < 96; k++)
        bb_u8(&b, 0);
    expect_bad(&b, at(t_at), "tensor 2 'x': duplicate tensor name (first declared as tensor 0 at "
                             "offset 24)");
}

Test(gguf, many_keys_and_tensors_use_the_index) {
    // 300 keys and 5000 tensors: lookups and duplicate checks must stay fast
    // (this would take seconds with quadratic duplicate checks under ASan).
    enum { NK = 300, NT = 5000 };
    struct bb b = {0};
    bb_header(&b, 3, NT, NK);
    char name[32];
    for (int i = 0; i < NK; i++) {
        snprintf(name, sizeof name, "key.%d", i);
        bb_kv_u32(&b, name, (uint32_t)i);
    }
    int64_t ne[] = {8};
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "blk.%d.weight", i);
        bb_tensor(&b, name, 1, ne, GGML_TYPE_F32, 32ull * (uint64_t)i);
    }
    bb_pad(&b, 32);
    size_t data_at = b.n;
    for (int i = 0; i < NT * 32; i++)
        bb_u8(&b, (uint8_t)i);
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open_memory(&f, b.p, b.n, "many", &err), 0, "%s", err.msg);
    cr_expect_eq(f->data_offset, data_at);
    for (int i = 0; i < NK; i++) {
        snprintf(name, sizeof name, "key.%d", i);
        uint32_t v = 0;
        cr_assert_eq(gguf_get_u32(f, name, &v, &err), 0, "%s", err.msg);
        cr_assert_eq(v, (uint32_t)i);
    }
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "blk.%d.weight", i);
        const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
        cr_assert_not_null(t, "%s", name);
        cr_assert_eq(t - f->tensors, i);
    }
    gguf_close(f);

    // The same file with the last tensor renamed to the name of the one before.
    size_t last_name = 0;
    for (size_t p = data_at; p-- > 0;)
        if (memcmp(b.p + p, "blk.4999.weight", 15) == 0) {
            last_name = p;
            break;
        }
    cr_assert_neq(last_name, 0);
    memcpy(b.p + last_name, "blk.4998.weight", 15); // same length, so nothing shifts
    expect_bad(&b, "tensor 4999 'blk.4998.weight': duplicate tensor name", "tensor 4998");
}

Test(gguf, nesting_limit) {
    // depth levels of arrays, the innermost an empty INT32 array.
    for (int depth = 7; depth <= 9; depth++) {
        struct bb b = {0};
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "deep");
        bb_u32(&b, GGUF_VT_ARRAY);
        for (int d = 0; d < depth - 1; d++) {
            bb_u32(&b, GGUF_VT_ARRAY);
            bb_u64(&b, 1);
        }
        bb_u32(&b, GGUF_VT_INT32);
        bb_u64(&b, 0);
        if (depth <= 8) {
            struct gguf_file *f = NULL;
            struct verr err = {0};
            cr_assert_eq(gguf_open_memory(&f, b.p, b.n, "deep", &err), 0, "%d: %s", depth, err.msg);
            gguf_close(f);
            free(b.p);
        } else {
            expect_bad(&b, "key 0 'deep': arrays nested more than 8 deep", NULL);
        }
    }
}

Test(gguf, bad_alignment) {
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_VT_UINT64);
    bb_u64(&b, 64);
    expect_bad(&b, at(24), "general.alignment must be UINT32, found UINT64");

    static const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    for (size_t i = 0; i < 4; i++) {
        bb_header(&b, 3, 0, 1);
        bb_kv_u32(&b, "general.alignment", bad[i]);
        char want[80];
        snprintf(want, sizeof want, "general.alignment %u is not a nonzero power of two", bad[i]);
        expect_bad(&b, at(24), want);
    }

    // A valid 256 alignment: data starts at a multiple of 256, offsets too.
    int64_t ne[] = {8};
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 256);
    bb_tensor(&b, "w", 1, ne, GGML_TYPE_F32, 0);
    bb_pad(&b, 256);
    for (int k = 0; k < 32; k++)
        bb_u8(&b, 1);
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open_memory(&f, b.p, b.n, "a256", &err), 0, "%s", err.msg);
    cr_expect_eq(f->alignment, 256);
    cr_expect_eq(f->data_offset, 256);
    gguf_close(f);
    free(b.p);
    memset(&b, 0, sizeof b);

    // With alignment 256 an offset of 32 is misaligned.
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 256);
    bb_tensor(&b, "w", 1, ne, GGML_TYPE_F32, 32);
    bb_pad(&b, 256);
    for (int k = 0; k < 64; k++)
        bb_u8(&b, 1);
    expect_bad(&b, "data offset 32 is not a multiple of the alignment 256", NULL);
}

Test(gguf, bad_keys) {
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 3);
    bb_put(&b, "a\0b", 3);
    bb_u32(&b, GGUF_VT_UINT8);
    bb_u8(&b, 1);
    expect_bad(&b, at(24), "key contains a NUL byte");

    // Control characters in names are shown as '?' in messages.
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "bad\nkey");
    bb_u32(&b, 77);
    bb_u8(&b, 1);
    expect_bad(&b, "key 0 'bad?key': unknown value type 77", NULL);
}

Test(gguf, open_errors, .init = make_tmp, .fini = remove_tmp) {
    struct gguf_file *f = (struct gguf_file *)1;
    struct verr err = {0};
    cr_expect_eq(gguf_open(&f, tmp_path("absent.gguf"), &err), VERR_IO);
    cr_expect_null(f);
    cr_expect(strstr(err.msg, "absent.gguf: cannot open: No such file or directory"), "%s",
              err.msg);
    cr_expect_eq(gguf_open(&f, tmp_dir, &err), VERR_IO);
    cr_expect(strstr(err.msg, "not a regular file") || strstr(err.msg, "cannot open"), "%s",
              err.msg);
    FILE *fp = fopen(tmp_path("empty.gguf"), "wb");
    fclose(fp);
    // A short text file is not a GGUF file (its magic says so), not a
    // truncated one.
    fp = fopen(tmp_path("note.txt"), "wb");
    fputs("hello\n", fp);
    fclose(fp);
    cr_expect_eq(gguf_open(&f, tmp_path("note.txt"), &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "note.txt: offset 0: not a GGUF file (magic is 'hell' = 68 65 6c 6c"),
              "%s", err.msg);
    fp = fopen(tmp_path("two.txt"), "wb");
    fputs("h\n", fp);
    fclose(fp);
    cr_expect_eq(gguf_open(&f, tmp_path("two.txt"), &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "not a GGUF file (magic is 'h?' = 68 0a, expected 'GGUF')"), "%s",
              err.msg);
    cr_expect_eq(gguf_open_memory(&f, "GGx", 3, "m", &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "m: offset 0: not a GGUF file"), "%s", err.msg);
    cr_expect_eq(gguf_open(&f, tmp_path("empty.gguf"), &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "empty.gguf: offset 0: file truncated: 0 bytes"), "%s", err.msg);
    cr_expect_eq(gguf_open_memory(&f, NULL, 10, NULL, &err), VERR_RANGE);
    gguf_close(NULL);
    cr_expect_eq(gguf_find_key(NULL, "x"), -1);
    cr_expect_null(gguf_find_tensor(NULL, "x"));
}

// ---------------------------------------------------------------------------
// The real vocabulary files (llama.cpp's models/ggml-vocab-*.gguf).

static const char *shared_vocab(const char *name) {
    static char path[1024];
    const char *dir = getenv("VELA_SHARED_DIR");
    if (!dir)
        return NULL;
    snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
    return access(path, R_OK) == 0 ? path : NULL;
}

struct vocab_expect {
    const char *file, *model, *pre, *arch;
    uint64_t n_tokens, n_merges, n_kv;
    uint32_t bos, eos;
    const char *tok0, *tok_last;
    bool has_scores;
};

static void check_vocab(const struct vocab_expect *e) {
    const char *path = shared_vocab(e->file);
    if (!path)
        cr_skip_test("%s not found: set VELA_SHARED_DIR to the folder holding vocab/ "
                     "(ctest sets it to ../shared)",
                     e->file);
    struct gguf_file *f = open_ok(path);
    struct verr err = {0};
    char *s = NULL;
    cr_expect_eq(f->version, 3);
    cr_expect_eq(f->n_tensors, 0);
    cr_expect_eq(f->n_kv, e->n_kv);
    cr_assert_eq(gguf_get_str(f, "tokenizer.ggml.model", &s, &err), 0, "%s", err.msg);
    cr_expect_str_eq(s, e->model);
    free(s);
    cr_assert_eq(gguf_get_str(f, "tokenizer.ggml.pre", &s, &err), 0, "%s", err.msg);
    cr_expect_str_eq(s, e->pre);
    free(s);
    cr_assert_eq(gguf_get_str(f, "general.architecture", &s, &err), 0, "%s", err.msg);
    cr_expect_str_eq(s, e->arch);
    free(s);
    const struct gguf_array *toks;
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, &err), 0, "%s",
                 err.msg);
    cr_expect_eq(toks->n, e->n_tokens);
    cr_expect(toks->strs[0].len == strlen(e->tok0) &&
              memcmp(toks->strs[0].data, e->tok0, toks->strs[0].len) == 0);
    const struct gguf_str *last = &toks->strs[toks->n - 1];
    cr_expect(last->len == strlen(e->tok_last) && memcmp(last->data, e->tok_last, last->len) == 0,
              "last token '%.*s'", (int)last->len, last->data);
    const struct gguf_array *tt;
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, &tt, &err), 0, "%s",
                 err.msg);
    cr_expect_eq(tt->n, e->n_tokens);
    const struct gguf_array *merges;
    int rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &merges, &err);
    if (e->n_merges) {
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_expect_eq(merges->n, e->n_merges);
    } else {
        cr_expect_eq(rc, VERR_NOTFOUND);
    }
    const struct gguf_array *scores;
    rc = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, &scores, &err);
    cr_expect_eq(rc == 0, e->has_scores);
    uint32_t id;
    cr_assert_eq(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &id, &err), 0, "%s", err.msg);
    cr_expect_eq(id, e->bos);
    cr_assert_eq(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &id, &err), 0, "%s", err.msg);
    cr_expect_eq(id, e->eos);
    walk_file(f);
    gguf_close(f);
}

Test(gguf_vocab, llama_spm) {
    struct vocab_expect e = {
        .file = "ggml-vocab-llama-spm.gguf", .model = "llama", .pre = "default", .arch = "llama",
        .n_tokens = 32000, .n_merges = 0, .n_kv = 22, .bos = 1, .eos = 2,
        .tok0 = "<unk>", .tok_last = "\xe7\xbb\x99", .has_scores = true,
    };
    check_vocab(&e);
    // Scores and types of the first and last tokens, and the booleans.
    struct gguf_file *f = open_ok(shared_vocab(e.file));
    const struct gguf_array *a;
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, &a, NULL), 0);
    cr_expect_eq(gguf_arr_get_f64(a, 31999), -31740.0);
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, &a, NULL), 0);
    cr_expect_eq(gguf_arr_get_i64(a, 0), 2);
    cr_expect_eq(gguf_arr_get_i64(a, 1), 3);
    bool b;
    cr_assert_eq(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, NULL), 0);
    cr_expect(b);
    float eps;
    cr_assert_eq(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps, NULL), 0);
    cr_expect_float_eq(eps, 1e-5f, 1e-12, "stored as FLOAT32 1e-5");
    gguf_close(f);
}

Test(gguf_vocab, gpt2) {
    struct vocab_expect e = {
        .file = "ggml-vocab-gpt-2.gguf", .model = "gpt2", .pre = "gpt-2", .arch = "gpt2",
        .n_tokens = 50257, .n_merges = 50000, .n_kv = 16, .bos = 50256, .eos = 50256,
        .tok0 = "!", .tok_last = "<|endoftext|>", .has_scores = false,
    };
    check_vocab(&e);
}

Test(gguf_vocab, deepseek_coder) {
    struct vocab_expect e = {
        .file = "ggml-vocab-deepseek-coder.gguf", .model = "gpt2", .pre = "deepseek-coder",
        .arch = "llama", .n_tokens = 32256, .n_merges = 31757, .n_kv = 25, .bos = 32013,
        .eos = 32014, .tok0 = "!", .tok_last = "[PAD32255]", .has_scores = false,
    };
    check_vocab(&e);
    struct gguf_file *f = open_ok(shared_vocab(e.file));
    char *s = NULL;
    cr_assert_eq(gguf_get_str(f, "llama.rope.scaling.type", &s, NULL), 0);
    cr_expect_str_eq(s, "linear");
    free(s);
    float factor;
    cr_assert_eq(gguf_get_f32(f, "llama.rope.scaling.factor", &factor, NULL), 0);
    cr_expect_eq(factor, 4.0f);
    gguf_close(f);
}

Test(gguf_vocab, rewrite_is_identical, .init = make_tmp, .fini = remove_tmp) {
    // Copying every key of a real file through the writer reproduces its
    // metadata byte for byte (the originals were written by gguf-py).
    const char *path = shared_vocab("ggml-vocab-llama-spm.gguf");
    if (!path)
        cr_skip_test("ggml-vocab-llama-spm.gguf not found (VELA_SHARED_DIR unset or no vocab/)");
    struct gguf_file *f = open_ok(path);
    struct gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < f->n_kv; i++)
        cr_assert_eq(gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].val), 0);
    struct verr err = {0};
    cr_assert_eq(gguf_writer_save(w, tmp_path("copy.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    size_t n;
    uint8_t *copy = read_all(tmp_path("copy.gguf"), &n);
    cr_assert_geq(n, f->size);
    cr_expect(memcmp(copy, f->map, f->size) == 0, "metadata differs");
    for (size_t i = f->size; i < n; i++)
        cr_assert_eq(copy[i], 0, "only zero padding may follow");
    free(copy);
    gguf_close(f);
}
