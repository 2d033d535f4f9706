// The tokenizer's side of grammar-constrained sampling (constrain.h).
#include "host/engine/constrain.h"

#include <stdlib.h>

int constrain_vocab_new(struct grammar_vocab **out, const struct tokenizer *t, struct verr *err) {
    *out = NULL;
    const int32_t n = tokenizer_n_vocab(t);
    const char **bytes = malloc((size_t)n * sizeof *bytes);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    bool *eog = malloc((size_t)n * sizeof *eog);
    int rc = 0;
    if (!bytes || !lens || !eog) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    for (int32_t i = 0; i < n && !rc; i++) {
        rc = tokenizer_piece(t, i, false, &bytes[i], &lens[i], err);
        eog[i] = tokenizer_is_eog(t, i);
    }
    if (!rc)
        rc = grammar_vocab_new(out, n, bytes, lens, eog, err);
out:
    free(bytes);
    free(lens);
    free(eog);
    return rc;
}

static int32_t find_token(void *user, const char *text, size_t len) {
    return tokenizer_find(user, text, len);
}

int constrain_parse(struct grammar **out, const struct tokenizer *t, const char *text, size_t len,
                    const char *root, struct verr *err) {
    const struct grammar_opts o = {
        .root = root, .find_token = t ? find_token : NULL, .find_user = (void *)t};
    return grammar_parse(out, text, len, &o, err);
}
