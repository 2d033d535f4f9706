// vela quantize (tools/quantize.h) and llama.cpp's file types
// (tools/mkmodel/ftype.h): the type chosen for every tensor against what
// llama-quantize chose on four models (tests/data/llamacpp/quant_mix_types.txt),
// what vela quantize writes (types, fallbacks, bytes, metadata) against the
// quantizers applied by hand, and what it refuses (requantizing, the input as
// output, unwritable types) without leaving a file behind or touching an
// existing one.
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "tools/mkmodel/ftype.h"
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

// A small llama file with rows of n_embd and n_ff.
static const char *write_model_cfg(const char *name, int n_layer, int n_embd, int n_ff, int n_head,
                                   int n_head_kv, enum ggml_type type, int mix) {
    struct mkmodel_config c;
    mkmodel_config_default(&c);
    c.n_embd = n_embd;
    c.n_layer = n_layer;
    c.n_head = n_head;
    c.n_head_kv = n_head_kv;
    c.n_ff = n_ff;
    c.type = type;
    c.mix = mix;
    const char *p = path_of(name);
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, p, &err), 0, "%s", err.msg);
    return p;
}

static const char *write_model(const char *name, int n_embd, int n_ff, enum ggml_type type) {
    return write_model_cfg(name, 2, n_embd, n_ff, 2, 1, type, MKMODEL_MIX_NONE);
}

static struct gguf_file *open_ok(const char *p) {
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&f, p, &err), 0, "%s", err.msg);
    return f;
}

static struct quantize_opts opts(const char *in, const char *out, const char *ftype, bool pure) {
    const struct ftype_info *ft = ftype_find(ftype);
    cr_assert_not_null(ft, "file type %s", ftype);
    return (struct quantize_opts){
        .in = in, .out = out, .ftype = ft, .pure = pure, .type_embd = -1, .type_output = -1};
}

static int run(const char *in, const char *out, const char *ftype, bool pure, bool allow,
               struct verr *err) {
    struct quantize_opts o = opts(in, out, ftype, pure);
    o.allow_requantize = allow;
    return quantize_file(&o, NULL, err);
}

// --- llama-quantize's choices (tests/data/llamacpp/quant_mix_types.txt) ---

#define MT_MAX_FT 20
#define MT_MAX_MODELS 4
struct mt_tensor {
    char name[64];
    unsigned n_dims;
    int64_t ne0;
    int in;              // the input's type
    int want[MT_MAX_FT]; // llama-quantize's type for each file type
};
struct mt_model {
    char key[8], arch[16];
    int n_layer, n_head, n_head_kv;
    int n;
    struct mt_tensor *t;
};
struct mix_table {
    int n_ft;
    char ft[MT_MAX_FT][8];
    int n_models;
    struct mt_model m[MT_MAX_MODELS];
};

static int type_of(const char *s) {
    const int t = ggml_type_from_name(s);
    cr_assert_geq(t, 0, "unknown type %s in the table", s);
    return t;
}

static void mix_table_load(struct mix_table *tb) {
    memset(tb, 0, sizeof *tb);
    const char *src = __FILE__, *slash = strrchr(src, '/');
    char path[1024], line[512];
    snprintf(path, sizeof path, "%.*s/data/llamacpp/quant_mix_types.txt",
             slash ? (int)(slash - src) : 1, slash ? src : ".");
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s", path);
    struct mt_model *m = NULL;
    while (fgets(line, sizeof line, f)) {
        char *tok = strtok(line, " \n");
        if (!tok || tok[0] == '#')
            continue;
        if (!strcmp(tok, "ftypes")) {
            while ((tok = strtok(NULL, " \n")) && tb->n_ft < MT_MAX_FT)
                snprintf(tb->ft[tb->n_ft++], sizeof tb->ft[0], "%s", tok);
        } else if (!strcmp(tok, "model")) {
            cr_assert_lt(tb->n_models, MT_MAX_MODELS);
            m = &tb->m[tb->n_models++];
            const int k = sscanf(strtok(NULL, "\n"), "%7s %15s %d %d %d", m->key, m->arch,
                                 &m->n_layer, &m->n_head, &m->n_head_kv);
            cr_assert_eq(k, 5, "a model line");
        } else {
            cr_assert_not_null(m, "a tensor before any model line");
            struct mt_tensor *t = realloc(m->t, (size_t)(m->n + 1) * sizeof *t);
            cr_assert_not_null(t);
            m->t = t;
            t = &m->t[m->n++];
            snprintf(t->name, sizeof t->name, "%s", tok);
            t->n_dims = (unsigned)atoi(strtok(NULL, " "));
            t->ne0 = atoll(strtok(NULL, " "));
            t->in = type_of(strtok(NULL, " \n"));
            for (int i = 0; i < tb->n_ft; i++) {
                const char *w = strtok(NULL, " \n");
                cr_assert_not_null(w, "%s: %d types, want %d", t->name, i, tb->n_ft);
                t->want[i] = type_of(w);
            }
        }
    }
    fclose(f);
    cr_assert_eq(tb->n_models, MT_MAX_MODELS);
    cr_assert_eq(tb->n_ft, 17);
}

static void mix_table_free(struct mix_table *tb) {
    for (int i = 0; i < tb->n_models; i++)
        free(tb->m[i].t);
}

static const struct mt_tensor *mt_find(const struct mt_model *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name))
            return &m->t[i];
    return NULL;
}

static int mt_ft_index(const struct mix_table *tb, const char *ft) {
    for (int i = 0; i < tb->n_ft; i++)
        if (!strcmp(tb->ft[i], ft))
            return i;
    cr_assert_fail("file type %s not in the table", ft);
    return -1;
}

// ftype_tensor_type over every tensor of every model for every file type,
// against llama-quantize's choice.
Test(quantize, file_types_choose_what_llama_quantize_chose) {
    struct mix_table tb;
    mix_table_load(&tb);
    int n_checked = 0, n_bad = 0;
    for (int mi = 0; mi < tb.n_models; mi++) {
        const struct mt_model *m = &tb.m[mi];
        struct ftype_model fm = {.arch = m->arch,
                                 .n_layer = m->n_layer,
                                 .n_head = m->n_head,
                                 .n_head_kv = m->n_head_kv,
                                 .tied = !mt_find(m, "output.weight")};
        for (int i = 0; i < m->n; i++)
            fm.n_attn_v += ftype_role_of(m->t[i].name, m->t[i].n_dims) == FTYPE_ROLE_ATTN_V;
        for (int fi = 0; fi < tb.n_ft; fi++) {
            const struct ftype_info *ft = ftype_find(tb.ft[fi]);
            cr_assert_not_null(ft, "%s", tb.ft[fi]);
            struct ftype_plan p = {.ft = ft, .m = fm, .type_embd = -1, .type_output = -1};
            for (int i = 0; i < m->n; i++) {
                const struct mt_tensor *t = &m->t[i];
                const enum ggml_type got =
                    // (the table's tensors are 2-D: one matrix each)
                    ftype_tensor_type(&p, t->name, t->n_dims, t->ne0, 1, (enum ggml_type)t->in,
                                      NULL);
                n_checked++;
                if ((int)got != t->want[fi] && n_bad++ < 10)
                    cr_log_error("model %s %s: %s is %s, llama-quantize wrote %s", m->key,
                                 tb.ft[fi], t->name, ggml_type_name(got),
                                 ggml_type_name((uint32_t)t->want[fi]));
            }
        }
    }
    cr_expect_eq(n_bad, 0, "%d of %d tensor types differ from llama-quantize's", n_bad, n_checked);
    cr_expect_gt(n_checked, 20000);
    mix_table_free(&tb);
}

Test(quantize, file_type_names_and_ids) {
    cr_expect_eq(ftype_find("q4_k_m")->id, 15);
    cr_expect_eq(ftype_find("Q4_K")->id, 15, "llama-quantize's alias");
    cr_expect_eq(ftype_find("Q3_K")->id, 12);
    cr_expect_eq(ftype_find("7")->base, GGML_TYPE_Q8_0, "by number");
    cr_expect_eq(ftype_find("iq4_xs")->id, 30);
    cr_expect_null(ftype_find("IQ3_S"), "no quantizer");
    cr_expect_null(ftype_find("Q2_K_S"), "llama-quantize needs an importance matrix for it");
    cr_expect_null(ftype_find("99"));
    cr_expect_null(ftype_find(""));
    cr_expect_eq(ftype_id_of_type(GGML_TYPE_Q4_K), 14);
    cr_expect_eq(ftype_id_of_type(GGML_TYPE_Q2_K), 10);
    cr_expect_eq(ftype_id_of_type(GGML_TYPE_F32), 0);
}

// MXFP4_MOE, as llama.cpp's llama_tensor_get_type_impl writes it (read from
// llama.cpp 0c1e570's src/llama-quant.cpp; no column of the table above: its
// models have no experts): the head Q8_0, expert stacks (a third dimension
// above 1) MXFP4, every other matrix Q8_0; bailingmoe3's non-FFN 3-D tensors
// Q8_0; rows that MXFP4's blocks do not fit F16 (the fallback of a 32-block
// type). --pure: every matrix MXFP4.
Test(quantize, mxfp4_moe_chooses_what_llama_cpp_does) {
    const struct ftype_info *ft = ftype_find("MXFP4_MOE");
    cr_assert_not_null(ft);
    cr_expect_eq(ft->id, 38, "LLAMA_FTYPE_MOSTLY_MXFP4_MOE");
    cr_expect_eq(ft->base, GGML_TYPE_MXFP4);
    static const struct {
        const char *name;
        unsigned n_dims;
        int64_t ne0, ne2;
        enum ggml_type want, want_pure;
    } cases[] = {
        {"token_embd.weight", 2, 2880, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
        {"blk.0.attn_norm.weight", 1, 2880, 1, GGML_TYPE_F32, GGML_TYPE_F32},
        {"blk.0.attn_q.weight", 2, 2880, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
        {"blk.0.attn_v.weight", 2, 2880, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
        {"blk.0.attn_output.weight", 2, 4096, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
        {"blk.0.ffn_gate_inp.weight", 2, 2880, 1, GGML_TYPE_F32, GGML_TYPE_F32},
        {"blk.0.ffn_gate_exps.weight", 3, 2880, 32, GGML_TYPE_MXFP4, GGML_TYPE_MXFP4},
        {"blk.0.ffn_up_exps.weight", 3, 2880, 32, GGML_TYPE_MXFP4, GGML_TYPE_MXFP4},
        {"blk.0.ffn_down_exps.weight", 3, 2880, 32, GGML_TYPE_MXFP4, GGML_TYPE_MXFP4},
        {"blk.1.ffn_down_exps.weight", 3, 100, 32, GGML_TYPE_F16, GGML_TYPE_F16},
        {"blk.1.ffn_up_exps.weight", 3, 2880, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
        {"blk.1.ffn_down.weight", 2, 2880, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
        {"output.weight", 2, 2880, 1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4},
    };
    for (int pure = 0; pure < 2; pure++) {
        struct ftype_plan p = {.ft = ft,
                               .m = {.arch = "gpt-oss", .n_layer = 2, .n_expert = 32},
                               .pure = pure,
                               .type_embd = -1,
                               .type_output = -1};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const enum ggml_type got =
                ftype_tensor_type(&p, cases[i].name, cases[i].n_dims, cases[i].ne0, cases[i].ne2,
                                  GGML_TYPE_F32, NULL);
            const enum ggml_type want = pure ? cases[i].want_pure : cases[i].want;
            cr_expect_eq(got, want, "%s%s: %s, want %s", cases[i].name, pure ? " (pure)" : "",
                         ggml_type_name(got), ggml_type_name(want));
        }
    }
    // A tied token_embd is the head: Q8_0 as well.
    struct ftype_plan p = {.ft = ft, .m = {.tied = true}, .type_embd = -1, .type_output = -1};
    cr_expect_eq(ftype_tensor_type(&p, "token_embd.weight", 2, 2880, 1, GGML_TYPE_F32, NULL),
                 GGML_TYPE_Q8_0);
    // bailingmoe3: only its FFN stacks are experts.
    p.m = (struct ftype_model){.arch = "bailingmoe3", .n_layer = 1, .n_expert = 8};
    cr_expect_eq(ftype_tensor_type(&p, "blk.0.attn_k_b.weight", 3, 128, 8, GGML_TYPE_F32, NULL),
                 GGML_TYPE_Q8_0);
    cr_expect_eq(ftype_tensor_type(&p, "blk.0.ffn_up_exps.weight", 3, 256, 8, GGML_TYPE_F32, NULL),
                 GGML_TYPE_MXFP4);
}

// A Mixtral-shaped F32 file written as MXFP4_MOE: the expert stacks MXFP4,
// every other matrix Q8_0, each row what quant_quantize_row makes of the
// source row, the rest copied; general.file_type 38.
Test(quantize, mxfp4_moe_end_to_end) {
    struct mkmodel_config c;
    mkmodel_config_default(&c);
    c.n_embd = 256;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_ff = 512;
    c.n_expert = 4;
    c.type = GGML_TYPE_F32;
    const char *in = path_of("moe_f32.gguf"), *out = path_of("moe_mxfp4.gguf");
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, in, &err), 0, "%s", err.msg);
    const struct quantize_opts o = opts(in, out, "MXFP4_MOE", false);
    struct quantize_stats st;
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    cr_assert_eq(a->n_tensors, b->n_tensors);
    int n_exps = 0, n_q8 = 0;
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const struct gguf_tensor_info *s = &a->tensors[i], *d = &b->tensors[i];
        cr_assert_str_eq(s->name, d->name);
        const enum ftype_role role = ftype_role_of(s->name, s->n_dims);
        if (role == FTYPE_ROLE_KEEP) {
            cr_expect_eq(d->type, s->type, "%s keeps its type", s->name);
            cr_expect(s->nbytes == d->nbytes && !memcmp(s->data, d->data, s->nbytes),
                      "%s copied byte for byte", s->name);
            continue;
        }
        const bool exps = s->n_dims == 3 && s->ne[2] > 1;
        const enum ggml_type t = exps ? GGML_TYPE_MXFP4 : GGML_TYPE_Q8_0;
        n_exps += exps;
        n_q8 += !exps;
        cr_expect_eq(d->type, t, "%s: %s, want %s", s->name, ggml_type_name(d->type),
                     ggml_type_name(t));
        const int64_t n = s->ne[0], rows = s->ne[1] * (s->n_dims == 3 ? s->ne[2] : 1);
        const size_t rout = ggml_row_bytes(t, n);
        uint8_t *q = malloc(rout);
        cr_assert_not_null(q);
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            cr_assert_eq(quant_quantize_row(t, (const float *)s->data + r * n, q, n, &err), 0);
            bad += memcmp(q, (const uint8_t *)d->data + r * rout, rout) != 0;
        }
        cr_expect_eq(bad, 0, "%s: %lld of %lld rows differ", s->name, (long long)bad,
                     (long long)rows);
        free(q);
    }
    cr_expect_eq(n_exps, 3 * c.n_layer, "gate, up and down stacks of every layer");
    cr_expect_gt(n_q8, 4 * c.n_layer);
    uint32_t ft = 0;
    cr_expect_eq(gguf_get_u32(b, "general.file_type", &ft, &err), 0, "%s", err.msg);
    cr_expect_eq(ft, 38);
    gguf_close(a);
    gguf_close(b);
}

// --- vela quantize ---

static bool is_matrix(const struct gguf_tensor_info *t) {
    const size_t n = strlen(t->name);
    return t->n_dims == 2 && strcmp(t->name + n - 7, ".weight") == 0;
}

// Every matrix in `want` (or its fallback) -- or, with m, in llama-quantize's
// type for file type fi -- holding exactly what quant_quantize_row makes of
// the source row; everything else byte for byte.
static void expect_converted(const struct gguf_file *src, const struct gguf_file *dst,
                             enum ggml_type want, const struct mt_model *m, int fi) {
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
        enum ggml_type t;
        if (m) {
            const struct mt_tensor *r = mt_find(m, a->name);
            cr_assert_not_null(r, "%s not in the table", a->name);
            t = (enum ggml_type)r->want[fi];
        } else {
            t = ftype_fallback(want, a->ne[0]);
        }
        cr_expect_eq(b->type, t, "%s: %s, want %s", a->name, ggml_type_name(b->type),
                     ggml_type_name(t));
        const int64_t n = a->ne[0];
        const size_t rin = ggml_row_bytes(a->type, n), rout = ggml_row_bytes(t, n);
        float *x = malloc((size_t)n * sizeof *x);
        uint8_t *q = malloc(rout);
        struct verr err = {0};
        int64_t bad = 0;
        for (int64_t r = 0; r < a->ne[1]; r++) {
            cr_assert_eq(
                quant_dequantize_row(a->type, (const uint8_t *)a->data + r * rin, x, n, &err), 0);
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

Test(quantize, f32_model_to_pure_q4_k) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    const char *out = path_of("q4k.gguf");
    struct verr err = {0};
    const struct quantize_opts o = opts(in, out, "Q4_K_S", true);
    struct quantize_stats st;
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    expect_converted(a, b, GGML_TYPE_Q4_K, NULL, 0);
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
    cr_expect_eq(st.n_of_type[GGML_TYPE_Q4_K], st.n_converted);
    cr_expect_lt(st.bytes_out * 5, st.bytes_in, "4.5 bits of 32");
    gguf_close(a);
    gguf_close(b);
}

// Model A of the table, written by vela quantize as Q4_K_M and as Q3_K_L:
// every tensor in llama-quantize's type, every row vela's quantizer's.
Test(quantize, mixes_end_to_end_match_llama_quantize) {
    struct mix_table tb;
    mix_table_load(&tb);
    const struct mt_model *m = &tb.m[0];
    cr_assert_str_eq(m->key, "A");
    const char *in = write_model_cfg("A.gguf", 8, 256, 512, 8, 2, GGML_TYPE_F32, MKMODEL_MIX_NONE);
    const char *fts[] = {"Q4_K_M", "Q3_K_L"};
    for (int k = 0; k < 2; k++) {
        const char *out = path_of("mix.gguf");
        struct verr err = {0};
        struct quantize_stats st;
        const struct quantize_opts o = opts(in, out, fts[k], false);
        cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
        struct gguf_file *a = open_ok(in), *b = open_ok(out);
        expect_converted(a, b, GGML_TYPE_COUNT, m, mt_ft_index(&tb, fts[k]));
        uint32_t ft = 0;
        cr_expect_eq(gguf_get_u32(b, "general.file_type", &ft, &err), 0, "%s", err.msg);
        cr_expect_eq(ft, (uint32_t)o.ftype->id);
        gguf_close(a);
        gguf_close(b);
    }
    mix_table_free(&tb);
}

// vela mkmodel --mix follows the same rules (its fast path writes the types
// the plan chose).
Test(quantize, mkmodel_mixes_match_llama_quantize) {
    struct mix_table tb;
    mix_table_load(&tb);
    const struct mt_model *m = &tb.m[0];
    const char *fts[] = {"Q2_K", "Q3_K_M", "Q4_K_S", "Q5_K_M", "Q4_0"};
    for (int k = 0; k < 5; k++) {
        const int fi = mt_ft_index(&tb, fts[k]);
        const char *p =
            write_model_cfg("mk.gguf", 8, 256, 512, 8, 2, GGML_TYPE_F32, ftype_find(fts[k])->id);
        struct gguf_file *f = open_ok(p);
        int n = 0;
        for (int i = 0; i < m->n; i++) {
            const struct gguf_tensor_info *t = gguf_find_tensor(f, m->t[i].name);
            cr_assert_not_null(t, "%s", m->t[i].name);
            if (m->t[i].n_dims != 2)
                continue;
            n++;
            cr_expect_eq((int)t->type, m->t[i].want[fi], "%s %s: %s, llama-quantize: %s", fts[k],
                         t->name, ggml_type_name(t->type),
                         ggml_type_name((uint32_t)m->t[i].want[fi]));
        }
        cr_expect_eq(n, 8 * 7 + 2);
        gguf_close(f);
    }
    mix_table_free(&tb);
}

// Progress: output bytes, rising to the total, which is stats' bytes_out.
struct progress_log {
    int n;
    uint64_t last, total;
    bool rising;
};
static void log_progress(void *user, uint64_t done, uint64_t total) {
    struct progress_log *l = user;
    l->rising &= done >= l->last && (l->n == 0 || total == l->total);
    l->n++;
    l->last = done;
    l->total = total;
}

Test(quantize, progress_reaches_the_written_bytes) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    struct verr err = {0};
    struct progress_log l = {.rising = true};
    struct quantize_opts o = opts(in, path_of("p.gguf"), "Q4_K_M", false);
    o.progress = log_progress;
    o.progress_user = &l;
    struct quantize_stats st;
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    cr_expect(l.rising, "done never falls, total never changes");
    cr_expect_gt(l.n, 10, "once per tensor at least: %d calls", l.n);
    cr_expect_eq(l.last, st.bytes_out);
    cr_expect_eq(l.total, st.bytes_out);
}

Test(quantize, threads_do_not_change_the_bytes) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    struct verr err = {0};
    struct quantize_opts o = opts(in, path_of("t1.gguf"), "Q5_K_M", false);
    o.n_threads = 1;
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
    const struct quantize_opts o = opts(in, out, "Q3_K_S", true);
    struct quantize_stats st;
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    expect_converted(a, b, GGML_TYPE_Q3_K, NULL, 0);
    cr_expect_eq(gguf_find_tensor(b, "blk.0.attn_q.weight")->type, GGML_TYPE_Q4_0);
    cr_expect_eq(gguf_find_tensor(b, "blk.0.ffn_down.weight")->type, GGML_TYPE_Q3_K);
    cr_expect_gt(st.n_fallback, 0);
    gguf_close(a);
    gguf_close(b);
}

// The overrides and --leave-output-tensor win over the file type's rules.
Test(quantize, overrides_and_a_kept_head) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    struct verr err = {0};
    struct quantize_opts o = opts(in, path_of("o1.gguf"), "Q4_K_M", false);
    o.type_embd = GGML_TYPE_Q8_0;
    o.type_output = GGML_TYPE_F16;
    cr_assert_eq(quantize_file(&o, NULL, &err), 0, "%s", err.msg);
    struct gguf_file *b = open_ok(o.out);
    cr_expect_eq(gguf_find_tensor(b, "token_embd.weight")->type, GGML_TYPE_Q8_0);
    cr_expect_eq(gguf_find_tensor(b, "output.weight")->type, GGML_TYPE_F16);
    cr_expect_eq(gguf_find_tensor(b, "blk.0.attn_v.weight")->type, GGML_TYPE_Q4_K);
    cr_expect_eq(gguf_find_tensor(b, "blk.1.attn_v.weight")->type, GGML_TYPE_Q6_K,
                 "the last layer gets more bits");
    gguf_close(b);
    o = opts(in, path_of("o2.gguf"), "Q4_0", false);
    o.keep_output = true;
    cr_assert_eq(quantize_file(&o, NULL, &err), 0, "%s", err.msg);
    b = open_ok(o.out);
    cr_expect_eq(gguf_find_tensor(b, "output.weight")->type, GGML_TYPE_F32, "kept");
    cr_expect_eq(gguf_find_tensor(b, "blk.1.ffn_up.weight")->type, GGML_TYPE_Q4_0);
    gguf_close(b);
    o = opts(in, path_of("o3.gguf"), "Q4_0", false);
    cr_assert_eq(quantize_file(&o, NULL, &err), 0, "%s", err.msg);
    b = open_ok(o.out);
    cr_expect_eq(gguf_find_tensor(b, "output.weight")->type, GGML_TYPE_Q6_K,
                 "llama-quantize's head for Q4_0");
    gguf_close(b);
}

Test(quantize, requantizing_needs_the_flag) {
    const char *in = write_model("q4_0.gguf", 256, 512, GGML_TYPE_Q4_0);
    const char *out = path_of("q8.gguf");
    struct verr err = {0};
    cr_expect_eq(run(in, out, "Q8_0", false, false, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "q4_0 already") && strstr(err.msg, "--allow-requantize"), "%s",
              err.msg);
    cr_expect_neq(access(out, F_OK), 0, "nothing written");
    cr_expect_eq(run(in, out, "Q8_0", false, true, &err), 0, "%s", err.msg);
    struct gguf_file *a = open_ok(in), *b = open_ok(out);
    expect_converted(a, b, GGML_TYPE_Q8_0, NULL, 0);
    gguf_close(a);
    gguf_close(b);
    // The same type needs no flag: tensors are copied. (Not so Q4_0 with its
    // rules: the head would become Q6_K.)
    cr_expect_eq(run(in, path_of("same.gguf"), "Q4_0", true, false, &err), 0, "%s", err.msg);
    cr_expect_eq(run(in, path_of("mix.gguf"), "Q4_0", false, false, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "output.weight is q4_0 already; converting it to q6_K"), "%s",
              err.msg);
}

Test(quantize, refusals_keep_an_existing_output) {
    const char *in = write_model("f32.gguf", 256, 512, GGML_TYPE_F32);
    const char *out = path_of("existing.gguf");
    FILE *fp = fopen(out, "w");
    cr_assert_not_null(fp);
    fputs("keep me", fp);
    fclose(fp);
    struct verr err = {0};
    cr_expect_eq(run(in, in, "Q4_0", false, false, &err), VERR_RANGE, "the input as output");
    cr_expect(strstr(err.msg, "is the input") != NULL, "%s", err.msg);
    struct quantize_opts o = opts(in, out, "Q4_0", false);
    o.type_embd = GGML_TYPE_IQ3_S;
    cr_expect_eq(quantize_file(&o, NULL, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "iq3_s") != NULL, "%s", err.msg);
    cr_expect_eq(run(path_of("missing.gguf"), out, "Q4_0", false, false, &err), VERR_IO);
    // A failure while writing: an infinite weight cannot be quantized.
    struct gguf_writer *w = gguf_writer_new();
    float m[2 * 32];
    for (int i = 0; i < 64; i++)
        m[i] = (float)i * 0.01f;
    m[40] = INFINITY;
    const int64_t ne[2] = {32, 2};
    cr_assert_eq(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", GGML_TYPE_F32, 2, ne, m, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(gguf_writer_save(w, path_of("inf.gguf"), &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    cr_expect_neq(run(path_of("inf.gguf"), out, "Q8_0", false, false, &err), 0);
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
