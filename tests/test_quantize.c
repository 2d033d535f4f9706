// vela quantize (tools/quantize.h): what it writes (types, fallbacks, bytes,
// metadata) against the quantizers applied by hand, and what it refuses
// (requantizing, the input as output, unwritable types) without leaving a
// file behind or touching an existing one.
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "tools/mkmodel/mkmodel.h"
#include "tools/quantize.h"

static char dir[64];

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/vela_test_quantize_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(quantize, .init = setup, .fini = teardown);

static const char *path_of(const char *name) {
    static char buf[4][128];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 128, "%s/%s", dir, name);
    return p;
}

// A small llama file: rows of n_embd (256: whole K-quant blocks) and n_ff.
static const char *write_model(const char *name, int n_embd, int n_ff, enum ggml_type type) {
    struct mkmodel_config c;
    mkmodel_config_default(&c);
    c.n_embd = n_embd;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_head_kv = 1;
    c.n_ff = n_ff;
    c.type = type;
    const char *p = path_of(name);
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, p, &err), 0, "%s", err.msg);
    return p;
}

static struct gguf_file *open_ok(const char *p) {
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&f, p, &err), 0, "%s", err.msg);
    return f;
}

static int run(const char *in, const char *out, enum ggml_type t, bool allow, struct verr *err) {
    const struct quantize_opts o = {.in = in, .out = out, .type = t, .type_embd = -1,
                                    .type_output = -1, .allow_requantize = allow};
    return quantize_file(&o, NULL, err);
}

static bool is_matrix(const struct gguf_tensor_info *t) {
    const size_t n = strlen(t->name);
    return t->n_dims == 2 && strcmp(t->name + n - 7, ".weight") == 0;
}

// Every matrix in `want` (or its fallback), holding exactly what
// quant_quantize_row makes of the source row; everything else byte for byte.
static void expect_converted(const struct gguf_file *src, const struct gguf_file *dst,
                             enum ggml_type want) {
    cr_assert_eq(src->n_tensors, dst->n_tensors);
    int n_mat = 0;
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const struct gguf_tensor_info *a = &src->tensors[i], *b = &dst->tensors[i];
        cr_assert_str_eq(a->name, b->name, "tensor order");
        if (!is_matrix(a)) {
            cr_expect_eq(b->type, a->type, "%s keeps its type", a->name);
            cr_expect(a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes),
                      "%s copied byte for byte", a->name);
            continue;
        }
        n_mat++;
        const enum ggml_type t = mkmodel_type_fallback(want, a->ne[0]);
        cr_expect_eq(b->type, t, "%s: %s, want %s", a->name, ggml_type_name(b->type),
                     ggml_type_name(t));
        const int64_t n = a->ne[0];
        const size_t rin = ggml_row_bytes(a->type, n), rout = ggml_row_bytes(t, n);
        float *x = malloc((size_t)n * sizeof *x);
        uint8_t *q = malloc(rout);
        struct verr err = {0};
        int64_t bad = 0;
        for (int64_t r = 0; r < a->ne[1]; r++) {
            cr_assert_eq(quant_dequantize_row(a->type, (const uint8_t *)a->data + r * rin, x, n,
                                              &err), 0);
            cr_assert_eq(quant_quantize_row(t, x, q, n, &err), 0, "%s", err.msg);
            bad += memcmp(q, (const uint8_t *)b->data + r * rout, rout) != 0;
        }
        cr_expect_eq(bad, 0, "%s: %lld rows differ from quant_quantize_row's", a->name,
                     (long long)bad);
        free(x);
        free(q);
    }
    cr_expect_gt(n_mat, 5);
}

Test(quantize, f32_model_to_q4_k) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    const char *out = path_of("q4k.gguf");
    struct verr err = {0};
    const struct quantize_opts o = {.in = in, .out = out, .type = GGML_TYPE_Q4_K,
                                    .type_embd = -1, .type_output = -1};
    struct quantize_stats st;
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    expect_converted(a, b, GGML_TYPE_Q4_K);
    // Metadata: every key of the input, file type and quantization version set.
    for (uint64_t i = 0; i < a->n_kv; i++)
        cr_expect_geq(gguf_find_key(b, a->kv[i].key), 0, "%s kept", a->kv[i].key);
    uint32_t ft = 0, qv = 0;
    cr_expect_eq(gguf_get_u32(b, "general.file_type", &ft, &err), 0, "%s", err.msg);
    cr_expect_eq(ft, 14, "LLAMA_FTYPE_MOSTLY_Q4_K_S");
    cr_expect_eq(gguf_get_u32(b, "general.quantization_version", &qv, &err), 0);
    cr_expect_eq(qv, 2);
    cr_expect_eq(st.n_tensors, (int)a->n_tensors);
    cr_expect_eq(st.n_fallback, 0);
    cr_expect_lt(st.bytes_out * 5, st.bytes_in, "4.5 bits of 32");
    gguf_close(a);
    gguf_close(b);
}

Test(quantize, threads_do_not_change_the_bytes) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    struct verr err = {0};
    struct quantize_opts o = {.in = in, .out = path_of("t1.gguf"), .type = GGML_TYPE_Q5_K,
                              .type_embd = -1, .type_output = -1, .n_threads = 1};
    cr_assert_eq(quantize_file(&o, NULL, &err), 0, "%s", err.msg);
    o.out = path_of("t3.gguf");
    o.n_threads = 3;
    cr_assert_eq(quantize_file(&o, NULL, &err), 0, "%s", err.msg);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", path_of("t1.gguf"), path_of("t3.gguf"));
    cr_expect_eq(system(cmd), 0, "1 and 3 threads give the same file");
}

Test(quantize, rows_that_do_not_fit_get_the_fallback) {
    // n_embd 128: rows of 128 cannot be Q3_K (256 per block): Q4_0 instead;
    // ffn_down's rows of 512 can.
    const char *in = write_model("f32.gguf", 128, 512, GGML_TYPE_F32);
    const char *out = path_of("q3k.gguf");
    struct verr err = {0};
    const struct quantize_opts o = {.in = in, .out = out, .type = GGML_TYPE_Q3_K,
                                    .type_embd = -1, .type_output = -1};
    struct quantize_stats st;
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    expect_converted(a, b, GGML_TYPE_Q3_K);
    cr_expect_eq(gguf_find_tensor(b, "blk.0.attn_q.weight")->type, GGML_TYPE_Q4_0);
    cr_expect_eq(gguf_find_tensor(b, "blk.0.ffn_down.weight")->type, GGML_TYPE_Q3_K);
    cr_expect_gt(st.n_fallback, 0);
    gguf_close(a);
    gguf_close(b);
}

Test(quantize, requantizing_needs_the_flag) {
    const char *in = write_model("q4_0.gguf", 256, 512, GGML_TYPE_Q4_0);
    const char *out = path_of("q8.gguf");
    struct verr err = {0};
    cr_expect_eq(run(in, out, GGML_TYPE_Q8_0, false, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "q4_0 already") && strstr(err.msg, "--allow-requantize"), "%s",
              err.msg);
    cr_expect_neq(access(out, F_OK), 0, "nothing written");
    cr_expect_eq(run(in, out, GGML_TYPE_Q8_0, true, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    expect_converted(a, b, GGML_TYPE_Q8_0);
    gguf_close(a);
    gguf_close(b);
    // The same type needs no flag: tensors are copied.
    cr_expect_eq(run(in, path_of("same.gguf"), GGML_TYPE_Q4_0, false, &err), 0, "%s", err.msg);
}

Test(quantize, refusals_keep_an_existing_output) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    const char *out = path_of("existing.gguf");
    FILE *fp = fopen(out, "w");
    cr_assert_not_null(fp);
    fputs("keep me", fp);
    fclose(fp);
    struct verr err = {0};
    cr_expect_eq(run(in, in, GGML_TYPE_Q4_0, false, &err), VERR_RANGE, "the input as output");
    cr_expect(strstr(err.msg, "is the input") != NULL, "%s", err.msg);
    cr_expect_eq(run(in, out, GGML_TYPE_IQ4_NL, false, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "iq4_nl") != NULL, "%s", err.msg);
    cr_expect_eq(run(path_of("missing.gguf"), out, GGML_TYPE_Q4_0, false, &err), VERR_IO);
    // A failure while writing: an infinite weight cannot be quantized.
    struct gguf_writer *w = gguf_writer_new();
    float m[2 * 32];
    for (int i = 0; i < 64; i++)
        m[i] = (float)i * 0.01f;
    m[40] = INFINITY;
    const int64_t ne[2] = {32, 2};
    cr_assert_eq(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", GGML_TYPE_F32, 2, ne, m, &err),
                 0, "%s", err.msg);
    cr_assert_eq(gguf_writer_save(w, path_of("inf.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    cr_expect_neq(run(path_of("inf.gguf"), out, GGML_TYPE_Q8_0, false, &err), 0);
    cr_expect(strstr(err.msg, "blk.0.attn_q.weight row 1") != NULL, "names the row: %s", err.msg);
    char buf[16] = {0};
    fp = fopen(out, "r");
    cr_assert_not_null(fp);
    cr_expect_eq(fread(buf, 1, sizeof buf - 1, fp), 7);
    fclose(fp);
    cr_expect_str_eq(buf, "keep me");
    char partial[160];
    snprintf(partial, sizeof partial, "%s.vela-partial", out);
    cr_expect_neq(access(partial, F_OK), 0, "no partial file left");
}
