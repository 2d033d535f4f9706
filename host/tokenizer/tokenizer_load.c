// tokenizer_load: the tokenizer.ggml.* keys of a GGUF file into a
// tokenizer_desc, then tokenizer_build.
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "host/tokenizer/tokenizer.h"

// The result of a gguf_get_* for an optional key: an absent key is not an
// error (0); another error's message e goes to err (which may be NULL).
static int optional(int rc, const struct verr *e, struct verr *err) {
    if (rc == VERR_NOTFOUND)
        return 0;
    if (rc && err)
        *err = *e;
    return rc;
}

// An optional string key: *out stays NULL when absent.
static int opt_str(const struct gguf_file *f, const char *key, char **out, struct verr *err) {
    *out = NULL;
    struct verr e;
    return optional(gguf_get_str(f, key, out, &e), &e, err);
}

// An optional token id: *out stays TOKENIZER_ID_UNSET when absent.
static int opt_id(const struct gguf_file *f, const char *key, int64_t *out, struct verr *err) {
    uint32_t v;
    struct verr e;
    int rc = gguf_get_u32(f, key, &v, &e);
    if (rc == 0)
        *out = v;
    return optional(rc, &e, err);
}

// An optional bool: *out stays -1 when absent.
static int opt_bool(const struct gguf_file *f, const char *key, int *out, struct verr *err) {
    bool v;
    struct verr e;
    int rc = gguf_get_bool(f, key, &v, &e);
    if (rc == 0)
        *out = v;
    return optional(rc, &e, err);
}

// An optional array: *out stays NULL when absent.
static int opt_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                   const struct gguf_array **out, struct verr *err) {
    *out = NULL;
    struct verr e;
    int rc = gguf_get_arr(f, key, elem, out, &e);
    if (rc == VERR_NOTFOUND)
        *out = NULL;
    return optional(rc, &e, err);
}

// The vocabulary's arrays, checked against each other: tokens (required),
// scores, token types and merges (optional; merges required by gpt2).
struct vocab_arrays {
    const struct gguf_array *tok, *scores, *types, *merges;
    uint32_t n; // tokens
};

static int read_arrays(const struct gguf_file *f, const char *model, struct vocab_arrays *va,
                       struct verr *err) {
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &va->tok, err);
    if (rc)
        return rc;
    if (va->tok->n == 0 || va->tok->n > (uint64_t)INT32_MAX)
        return verr_set(err, VERR_RANGE, "%s: tokenizer.ggml.tokens: %llu tokens", f->path,
                        (unsigned long long)va->tok->n);
    const uint32_t n = va->n = (uint32_t)va->tok->n;
    if ((rc = opt_arr(f, "tokenizer.ggml.scores", GGUF_VT_COUNT, &va->scores, err)) ||
        (rc = opt_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, &va->types, err)) ||
        (rc = opt_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &va->merges, err)))
        return rc;
    const struct gguf_array *sc = va->scores, *ty = va->types, *me = va->merges;
    if (sc && sc->type != GGUF_VT_FLOAT32 && sc->type != GGUF_VT_INT32)
        return verr_set(err, VERR_TYPE,
                        "%s: key 'tokenizer.ggml.scores': expected ARRAY[FLOAT32] or "
                        "ARRAY[INT32], found ARRAY[%s]",
                        f->path, gguf_vtype_name(sc->type));
    if (sc && sc->n < n)
        return verr_set(err, VERR_FORMAT,
                        "%s: tokenizer.ggml.scores has %llu entries for %u tokens", f->path,
                        (unsigned long long)sc->n, n);
    if (ty && ty->n < n)
        return verr_set(err, VERR_FORMAT,
                        "%s: tokenizer.ggml.token_type has %llu entries for %u tokens", f->path,
                        (unsigned long long)ty->n, n);
    if (!strcmp(model, "gpt2") && !me)
        return verr_set(err, VERR_NOTFOUND,
                        "%s: tokenizer.ggml.merges is missing (needed by a gpt2 tokenizer)",
                        f->path);
    if (me && me->n > (uint64_t)INT32_MAX)
        return verr_set(err, VERR_RANGE, "%s: tokenizer.ggml.merges: %llu merges", f->path,
                        (unsigned long long)me->n);
    return 0;
}

// The special token ids and the add_* flags into d.
static int read_specials(const struct gguf_file *f, struct tokenizer_desc *d, struct verr *err) {
    struct {
        const char *key;
        int64_t *id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", &d->bos},
        {"tokenizer.ggml.eos_token_id", &d->eos},
        {"tokenizer.ggml.eot_token_id", &d->eot},
        {"tokenizer.ggml.eom_token_id", &d->eom},
        {"tokenizer.ggml.unknown_token_id", &d->unk},
        {"tokenizer.ggml.seperator_token_id", &d->sep}, // sic: the key as llama.cpp writes it
        {"tokenizer.ggml.padding_token_id", &d->pad},
        {"tokenizer.ggml.fim_pre_token_id", &d->fim_pre},
        {"tokenizer.ggml.fim_suf_token_id", &d->fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &d->fim_mid},
        {"tokenizer.ggml.fim_pad_token_id", &d->fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &d->fim_rep},
        {"tokenizer.ggml.fim_sep_token_id", &d->fim_sep},
        // Older names, read after the new ones so they win as in llama.cpp.
        {"tokenizer.ggml.prefix_token_id", &d->fim_pre},
        {"tokenizer.ggml.suffix_token_id", &d->fim_suf},
        {"tokenizer.ggml.middle_token_id", &d->fim_mid},
    };
    int rc;
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if ((rc = opt_id(f, ids[i].key, ids[i].id, err)))
            return rc;
    if ((rc = opt_bool(f, "tokenizer.ggml.add_bos_token", &d->add_bos, err)) ||
        (rc = opt_bool(f, "tokenizer.ggml.add_eos_token", &d->add_eos, err)) ||
        (rc = opt_bool(f, "tokenizer.ggml.add_space_prefix", &d->add_space_prefix, err)))
        return rc;
    return 0;
}

int tokenizer_load(struct tokenizer **out, const struct gguf_file *f, struct verr *err) {
    *out = NULL;
    struct tokenizer_desc d;
    tokenizer_desc_init(&d);
    char *model = NULL, *pre = NULL, *name = NULL;
    const char **tokens = NULL, **merges = NULL;
    size_t *token_lens = NULL, *merge_lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    struct vocab_arrays va = {0};
    int rc;

    if ((rc = gguf_get_str(f, "tokenizer.ggml.model", &model, err)) ||
        (rc = opt_str(f, "tokenizer.ggml.pre", &pre, err)) ||
        (rc = opt_str(f, "general.name", &name, err)) || (rc = read_arrays(f, model, &va, err)))
        goto done;
    const struct gguf_array *a_tok = va.tok, *a_scores = va.scores, *a_types = va.types,
                            *a_merges = va.merges;
    const uint32_t n = va.n;

    tokens = malloc((size_t)n * sizeof *tokens);
    token_lens = malloc((size_t)n * sizeof *token_lens);
    if (!tokens || !token_lens) {
        rc = verr_set(err, VERR_NOMEM, "%s: out of memory for %u tokens", f->path, n);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        tokens[i] = a_tok->strs[i].data;
        token_lens[i] = (size_t)a_tok->strs[i].len;
    }
    if (a_scores) {
        scores = malloc((size_t)n * sizeof *scores);
        if (!scores) {
            rc = verr_set(err, VERR_NOMEM, "%s: out of memory", f->path);
            goto done;
        }
        for (uint32_t i = 0; i < n; i++)
            scores[i] = (float)gguf_arr_get_f64(a_scores, i);
    }
    if (a_types) {
        types = malloc((size_t)n * sizeof *types);
        if (!types) {
            rc = verr_set(err, VERR_NOMEM, "%s: out of memory", f->path);
            goto done;
        }
        for (uint32_t i = 0; i < n; i++)
            types[i] = (int32_t)gguf_arr_get_i64(a_types, i);
    }
    if (a_merges && a_merges->n) {
        size_t nm = (size_t)a_merges->n;
        merges = malloc(nm * sizeof *merges);
        merge_lens = malloc(nm * sizeof *merge_lens);
        if (!merges || !merge_lens) {
            rc = verr_set(err, VERR_NOMEM, "%s: out of memory for %zu merges", f->path, nm);
            goto done;
        }
        for (size_t i = 0; i < nm; i++) {
            merges[i] = a_merges->strs[i].data;
            merge_lens[i] = (size_t)a_merges->strs[i].len;
        }
        d.n_merges = (uint32_t)nm;
    }

    if ((rc = read_specials(f, &d, err)))
        goto done;

    d.model = model;
    d.pre = pre;
    d.name = name;
    d.n_tokens = n;
    d.tokens = tokens;
    d.token_lens = token_lens;
    d.scores = scores;
    d.token_types = types;
    d.merges = merges;
    d.merge_lens = merge_lens;
    rc = tokenizer_build(out, &d, err);
    if (rc)
        verr_wrap(err, "%s", f->path);
done:
    free(model);
    free(pre);
    free(name);
    free(tokens);
    free(token_lens);
    free(scores);
    free(types);
    free(merges);
    free(merge_lens);
    return rc;
}
