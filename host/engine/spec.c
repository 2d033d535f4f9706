// Speculative decoding's request values and the n-gram drafter (spec.h).
#include <string.h>

#include "host/engine/spec.h"

void engine_spec_default(struct engine_spec *s) {
    memset(s, 0, sizeof *s);
    s->type = ENGINE_SPEC_NONE;
    s->n_max = 16;
    s->n_min = 0;
    s->p_min = 0.75f;
    s->ngram_n = 3;
}

int engine_spec_check(const struct engine_spec *s, int n_batch, struct verr *err) {
    if (s->type == ENGINE_SPEC_NONE)
        return 0;
    if (s->type != ENGINE_SPEC_NGRAM && s->type != ENGINE_SPEC_DRAFT)
        return verr_set(err, VERR_RANGE, "speculative type %d: none, ngram or draft", (int)s->type);
    if (s->n_max < 1 || s->n_max > ENGINE_SPEC_MAX || s->n_max >= n_batch)
        return verr_set(err, VERR_RANGE,
                        "draft max %d: 1 .. %d and below the batch (%d tokens, -b)", s->n_max,
                        ENGINE_SPEC_MAX, n_batch);
    if (s->n_min < 0 || s->n_min > s->n_max)
        return verr_set(err, VERR_RANGE, "draft min %d: 0 .. draft max (%d)", s->n_min, s->n_max);
    if (!(s->p_min >= 0 && s->p_min <= 1))
        return verr_set(err, VERR_RANGE, "draft p-min %g: 0 .. 1", (double)s->p_min);
    if (s->ngram_n < 2 || s->ngram_n > 16)
        return verr_set(err, VERR_RANGE, "n-gram size %d: 2 .. 16", s->ngram_n);
    return 0;
}

const char *engine_spec_type_name(enum engine_spec_type t) {
    switch (t) {
    case ENGINE_SPEC_NONE:
        return "none";
    case ENGINE_SPEC_NGRAM:
        return "ngram";
    case ENGINE_SPEC_DRAFT:
        return "draft";
    }
    return NULL;
}

int engine_spec_type_parse(const char *name) {
    for (int t = ENGINE_SPEC_NONE; t <= ENGINE_SPEC_DRAFT; t++)
        if (!strcmp(name, engine_spec_type_name((enum engine_spec_type)t)))
            return t;
    return -1;
}

int spec_ngram_draft(const int32_t *t, int n, int ngram_n, int32_t *out, int n_max) {
    for (int m = ngram_n < n ? ngram_n : n - 1; m >= 2; m--) {
        const int32_t *key = t + n - m;
        // Latest first: the start i of an earlier occurrence, i + m < n.
        for (int i = n - m - 1; i >= 0; i--) {
            if (memcmp(t + i, key, (size_t)m * sizeof *t))
                continue;
            int k = n - (i + m);
            k = k < n_max ? k : n_max;
            memcpy(out, t + i + m, (size_t)k * sizeof *t);
            return k;
        }
    }
    return 0;
}
