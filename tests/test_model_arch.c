// The architecture tables (host/model/arch.h) and everything that walks
// them, for every registered architecture: the tables are well formed, what
// mkmodel writes the loader loads (every tensor of the file, into the field
// the table names) and the byte counts agree with the file, and a missing
// required tensor or a mis-shaped one is refused with its name.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "host/model/arch.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "tests/arch_models.h"
#include "tests/file_helpers.h"
#include "tools/mkmodel/mkmodel.h"

TEST_SUITE_WITH_TMPDIR(model_arch, "vela_arch");

// The models these tests write: every architecture as mkmodel makes it by
// default (with experts where it always has them: qwen3moe, qwen2moe), and
// variant MODEL_ARCH_COUNT, llama with 8 experts (Mixtral).
#define N_VARIANTS (MODEL_ARCH_COUNT + 1)

static const struct arch *variant_arch(int v) {
    return arch_get(v < MODEL_ARCH_COUNT ? (enum model_arch)v : MODEL_ARCH_LLAMA);
}

static int variant_experts(int v) {
    return v < MODEL_ARCH_COUNT ? 0 : 8;
}

// The block table of variant v's files.
static const struct arch_tensor *variant_layer(int v) {
    const struct arch *a = variant_arch(v);
    return arch_layer_table(a, a->moe.required || variant_experts(v) > 0);
}

// A small F32 model of variant v from mkmodel.
static void write_model(int v, bool tied, bool rope_freqs, const char *path,
                        struct mkmodel_config *resolved) {
    const struct arch *a = variant_arch(v);
    struct mkmodel_config c;
    mkmodel_config_default(&c);
    c.arch = (enum mkmodel_arch)a->id;
    c.n_expert = variant_experts(v);
    c.n_embd = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_ff = 96;
    c.n_ctx = 128;
    c.n_threads = 2;
    c.tied = tied;
    c.rope_freqs = rope_freqs;
    struct verr err = {0};
    cr_assert_eq(mkmodel_resolve(&c, resolved, &err), 0, "%s: %s", a->name, err.msg);
    cr_assert_eq(mkmodel_write(&c, path, &err), 0, "%s: %s", a->name, err.msg);
}

static int count(const struct arch_tensor *t) {
    int n = 0;
    while (t[n].name)
        n++;
    return n;
}

Test(model_arch, registry_and_tables_are_well_formed) {
    int n_arch = 0;
    char names[256];
    arch_names(names, sizeof names);
    for (int id = 0; id < MODEL_ARCH_COUNT; id++) {
        const struct arch *a = arch_get((enum model_arch)id);
        cr_assert_not_null(a, "id %d is not registered", id);
        n_arch++;
        cr_expect(a->moe.required ? a->layer_moe && !a->layer : a->layer != NULL,
                  "%s: a block table (with experts when they are required)", a->name);
        cr_expect_eq((int)a->id, id, "%s: id", a->name);
        cr_expect_eq(arch_find(a->name), a, "%s: found by name", a->name);
        cr_expect_str_eq(model_arch_name(a->id), a->name);
        cr_expect(strstr(names, a->name), "%s missing from '%s'", a->name, names);
        cr_expect(a->rope_freq_base > 0 && a->synth_rope_freq_base > 0 && a->synth_norm_eps > 0,
                  "%s: defaults", a->name);
        int n_embd_tok = 0, n_req_bias = 0;
        for (int pass = 0; pass < 3; pass++) {
            const struct arch_tensor *tab = pass == 0   ? a->globals
                                            : pass == 1 ? a->layer
                                                        : a->layer_moe;
            if (!tab)
                continue;
            const size_t whole = pass ? sizeof(struct model_layer) : sizeof(struct model);
            for (int i = 0; tab[i].name; i++) {
                const struct arch_tensor *t = &tab[i];
                const size_t size =
                    t->kind == ARCH_MATRIX ? sizeof(struct backend_weight) : sizeof(float *);
                cr_expect(t->field + size <= whole, "%s %s: field outside the struct", a->name,
                          t->name);
                cr_expect_eq(t->place == ARCH_PLACE_LAYER, pass > 0, "%s %s: place", a->name,
                             t->name);
                // one-row matrices: the shared expert's gate vector only;
                // tables of vectors: one per expert (their biases) only
                cr_expect_eq(t->ne[1] == ARCH_DIM_1,
                             (t->kind == ARCH_VECTOR && t->ne[1] != ARCH_DIM_N_EXPERT) ||
                                 (t->role == ARCH_ROLE_FFN_GATE_INP && strstr(t->name, "_shexp")),
                             "%s %s: a vector has one dim (or one per expert), a matrix two",
                             a->name, t->name);
                cr_expect(t->ne[2] == ARCH_DIM_1 || (t->ne[2] == ARCH_DIM_N_EXPERT &&
                                                     t->kind == ARCH_MATRIX && pass == 2),
                          "%s %s: only a block's expert stacks have a third dim", a->name, t->name);
                cr_expect(t->ne[0] > ARCH_DIM_1 && t->ne[0] < ARCH_DIM_COUNT, "%s %s: ne0", a->name,
                          t->name);
                for (int j = 0; j < i; j++) {
                    cr_expect_str_neq(tab[j].name, t->name, "%s: %s twice", a->name, t->name);
                    cr_expect_neq(tab[j].field, t->field, "%s: %s and %s fill one field", a->name,
                                  tab[j].name, t->name);
                }
                n_embd_tok += t->role == ARCH_ROLE_TOKEN_EMBD;
                n_req_bias += t->role == ARCH_ROLE_BIAS && !t->optional;
            }
        }
        cr_expect_eq(n_embd_tok, 1, "%s: one token_embd", a->name);
        if (a->layer_moe) {
            int n_stacks = 0;
            for (const struct arch_tensor *t = a->layer_moe; t->name; t++)
                n_stacks += t->ne[2] == ARCH_DIM_N_EXPERT;
            cr_expect_eq(n_stacks, 3, "%s: gate, up and down expert stacks", a->name);
        }
        cr_expect_eq(n_req_bias > 0, a->block.bias_qkv, "%s: block.bias_qkv vs the table", a->name);
    }
    cr_expect_gt(n_arch, 0);
    cr_expect_null(arch_find("gpt2"));
    cr_expect_null(arch_get(MODEL_ARCH_COUNT));
}

// The field table entry t fills in m (layer il for a layer's) is set.
static bool field_set(const struct model *m, const struct arch_tensor *t, int il) {
    const uint8_t *base =
        t->place == ARCH_PLACE_LAYER ? (const uint8_t *)&m->layers[il] : (const uint8_t *)m;
    if (t->kind == ARCH_VECTOR)
        return *(float *const *)(base + t->field) != NULL;
    return ((const struct backend_weight *)(base + t->field))->data != NULL;
}

// Loads what mkmodel wrote for variant v; checks fields, bytes and parameters.
static void check_loads(int v, bool tied, bool rope_freqs) {
    const struct arch *a = variant_arch(v);
    char path[300];
    tmp_path(path, sizeof path, "m.gguf");
    struct mkmodel_config r;
    write_model(v, tied, rope_freqs, path, &r);
    const char *what = a->name;
    struct verr err = {0};
    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    struct backend *be;
    cr_assert_eq(backend_cpu_create(&be, 1, &err), 0, "%s", err.msg);
    struct model *m = NULL;
    cr_assert_eq(model_load(&m, f, be, &err), 0, "%s (tied %d): %s", what, tied, err.msg);
    cr_expect_eq(m->hp.arch, a->id);
    cr_expect_eq(m->hp.rope_mode, a->rope_mode);
    cr_expect_eq(m->output_tied, tied);
    cr_expect_eq(m->rope_freqs != NULL, rope_freqs);

    // Every tensor of the file is one the table names, loaded into its field.
    size_t file_bytes = 0, embd_bytes = 0, rope_bytes = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        file_bytes += f->tensors[i].nbytes;
    uint64_t named = 0;
    for (const struct arch_tensor *t = a->globals; t->name; t++) {
        const struct gguf_tensor_info *ti = gguf_find_tensor(f, t->name);
        if (ti && t->role == ARCH_ROLE_TOKEN_EMBD)
            embd_bytes = ti->nbytes;
        if (ti && t->role == ARCH_ROLE_ROPE_FREQS)
            rope_bytes = ti->nbytes;
        named += ti != NULL;
        // a tied head is token_embd's
        const bool set = ti != NULL || (t->role == ARCH_ROLE_OUTPUT && tied);
        cr_expect_eq(field_set(m, t, 0), set, "%s: %s", what, t->name);
    }
    for (int il = 0; il < m->hp.n_layer; il++)
        for (const struct arch_tensor *t = variant_layer(v); t->name; t++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", il, t->name);
            const bool present = gguf_find_tensor(f, name) != NULL;
            named += present;
            cr_expect_eq(field_set(m, t, il), present, "%s: %s", what, name);
        }
    cr_expect_eq(named, f->n_tensors, "%s: tensors of the file outside the table", what);

    // F32 everywhere: the backend holds what the file holds.
    cr_expect_eq(m->n_bytes, file_bytes, "%s: loaded %zu bytes, the file has %zu", what, m->n_bytes,
                 file_bytes);
    cr_expect_eq(m->n_params, mkmodel_count_params(&r), "%s: parameters", what);
    size_t arena = 0;
    cr_expect_eq(model_load_bytes(f, 0, -1, &arena, &err), 0, "%s", err.msg);
    cr_expect_geq(arena, file_bytes);

    size_t layer_bytes[8], embed = 0, head = 0, sum = 0;
    cr_assert_eq(model_weight_bytes(f, &m->hp, layer_bytes, &embed, &head, &err), 0, "%s", err.msg);
    for (int il = 0; il < m->hp.n_layer; il++) {
        double lb = 0, lp = 0;
        model_layer_size(&m->hp, &m->layers[il], &lb, &lp);
        cr_expect_eq((size_t)lb, layer_bytes[il], "%s: layer %d", what, il);
        cr_expect_gt(lp, 0);
        sum += layer_bytes[il];
    }
    // rope_freqs sits on every stage; a tied head holds token_embd again.
    cr_expect_eq(sum + embed + head, file_bytes + rope_bytes + (tied ? embd_bytes : 0),
                 "%s (tied %d, rope_freqs %d): layers %zu + embed %zu + head %zu vs file %zu", what,
                 tied, rope_freqs, sum, embed, head, file_bytes);
    model_free(m);
    backend_destroy(be);
    gguf_close(f);
    unlink(path);
}

Test(model_arch, every_arch_loads_what_mkmodel_writes) {
    for (int v = 0; v < N_VARIANTS; v++) {
        check_loads(v, false, false);
        check_loads(v, true, false);
        check_loads(v, false, true);
    }
}

// Copies src to dst without tensor `skip` and with tensor `bad`'s ne0
// doubled (its data zeros).
static void copy_model(const char *src, const char *dst, const char *skip, const char *bad) {
    struct verr err = {0};
    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, src, &err), 0, "%s", err.msg);
    struct gguf_writer *w = gguf_writer_new();
    cr_assert_not_null(w);
    for (uint64_t i = 0; i < f->n_kv; i++)
        cr_assert_eq(gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].val), 0);
    void *zeros = NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        if (skip && !strcmp(t->name, skip))
            continue;
        int64_t ne[GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        const void *data = t->data;
        if (bad && !strcmp(t->name, bad)) {
            ne[0] *= 2;
            zeros = calloc(2, t->nbytes);
            cr_assert_not_null(zeros);
            data = zeros;
        }
        cr_assert_eq(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, data, &err), 0,
                     "%s", err.msg);
    }
    cr_assert_eq(gguf_writer_save(w, dst, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    free(zeros);
    gguf_close(f);
}

// The names of a's tensors in a file of it: globals, then layer 1's.
static int entry_names(int v, char names[][96], const struct arch_tensor **ents) {
    const struct arch *a = variant_arch(v);
    int n = 0;
    for (const struct arch_tensor *t = a->globals; t->name; t++, n++) {
        snprintf(names[n], 96, "%s", t->name);
        ents[n] = t;
    }
    for (const struct arch_tensor *t = variant_layer(v); t->name; t++, n++) {
        snprintf(names[n], 96, "blk.1.%s", t->name);
        ents[n] = t;
    }
    return n;
}

// Architecture id's model (untied) written to src; dst is where its
// variants go; names / ents its tensors (entry_names), *n how many.
static const struct arch *arch_files(int v, bool rope_freqs, char *src, char *dst, char names[][96],
                                     const struct arch_tensor **ents, int *n) {
    const struct arch *a = variant_arch(v);
    cr_assert_lt(count(a->globals) + count(variant_layer(v)), 64);
    tmp_path(src, 300, "src.gguf");
    tmp_path(dst, 300, "dst.gguf");
    struct mkmodel_config r;
    write_model(v, false, rope_freqs, src, &r);
    *n = entry_names(v, names, ents);
    return a;
}

Test(model_arch, missing_required_tensor_is_refused_by_name) {
    for (int id = 0; id < N_VARIANTS; id++) {
        char src[300], dst[300], names[64][96];
        const struct arch_tensor *ents[64];
        int n;
        const struct arch *a = arch_files(id, false, src, dst, names, ents, &n);
        int n_required = 0;
        for (int i = 0; i < n; i++) {
            if (ents[i]->optional)
                continue;
            n_required++;
            copy_model(src, dst, names[i], NULL);
            struct verr err = {0};
            cr_expect_eq(arch_test_try_load(dst, &err), VERR_NOTFOUND, "%s without %s: %s", a->name,
                         names[i], err.msg);
            char want[128];
            snprintf(want, sizeof want, "missing tensor '%.96s'", names[i]);
            cr_expect(strstr(err.msg, want), "%s: '%s' does not say %s", a->name, err.msg, want);
        }
        cr_expect_gt(n_required, 4, "%s", a->name);
        // The optional ones it wrote may go (an untied head: then tied).
        copy_model(src, dst, "output.weight", NULL);
        struct verr err = {0};
        cr_expect_eq(arch_test_try_load(dst, &err), 0, "%s without output.weight: %s", a->name,
                     err.msg);
    }
}

Test(model_arch, misshaped_tensor_is_refused_by_name) {
    for (int id = 0; id < N_VARIANTS; id++) {
        char src[300], dst[300], names[64][96];
        const struct arch_tensor *ents[64];
        int n;
        const struct arch *a = arch_files(id, true, src, dst, names, ents, &n);
        struct gguf_file *f;
        struct verr err = {0};
        cr_assert_eq(gguf_open(&f, src, &err), 0, "%s", err.msg);
        int n_tried = 0;
        for (int i = 0; i < n; i++) {
            const struct gguf_tensor_info *t = gguf_find_tensor(f, names[i]);
            if (!t)
                continue; // an optional one mkmodel does not write
            n_tried++;
            copy_model(src, dst, NULL, names[i]);
            err = (struct verr){0};
            cr_expect_eq(arch_test_try_load(dst, &err), VERR_FORMAT, "%s, %s mis-shaped: %s",
                         a->name, names[i], err.msg);
            char want[256];
            if (t->n_dims == 3)
                snprintf(want, sizeof want,
                         "%.96s: expected shape [%lld, %lld, %lld], found [%lld, %lld, %lld]",
                         names[i], (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                         (long long)(2 * t->ne[0]), (long long)t->ne[1], (long long)t->ne[2]);
            else if (t->n_dims == 2)
                snprintf(want, sizeof want,
                         "%.96s: expected shape [%lld, %lld], found [%lld, %lld]", names[i],
                         (long long)t->ne[0], (long long)t->ne[1], (long long)(2 * t->ne[0]),
                         (long long)t->ne[1]);
            else
                snprintf(want, sizeof want, "%.96s: expected shape [%lld], found [%lld]", names[i],
                         (long long)t->ne[0], (long long)(2 * t->ne[0]));
            cr_expect(strstr(err.msg, want), "%s: '%s' does not say '%s'", a->name, err.msg, want);
        }
        cr_expect_gt(n_tried, 4, "%s", a->name);
        gguf_close(f);
    }
}
