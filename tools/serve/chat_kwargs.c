// Chat template variables from JSON (see chat_kwargs.h).
#include "tools/serve/chat_kwargs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static bool effort_known(const char *s) {
    return !strcmp(s, "low") || !strcmp(s, "medium") || !strcmp(s, "high");
}

// One string variable: *out replaced by a copy of v's text (NULL for null).
// field: its name in messages ("chat_template_kwargs.reasoning_effort").
static int read_var(const cJSON *v, const char *field, bool effort, char **out, struct verr *err) {
    if (cJSON_IsNull(v)) {
        free(*out);
        *out = NULL;
        return 0;
    }
    if (!cJSON_IsString(v))
        return verr_set(err, VERR_TYPE, "'%s' must be a string", field);
    if (effort && !effort_known(v->valuestring))
        return verr_set(err, VERR_RANGE,
                        "'%s' is \"%.64s\"; expected \"low\", \"medium\" or \"high\"", field,
                        v->valuestring);
    char *s = strdup(v->valuestring);
    if (!s)
        return verr_set(err, VERR_NOMEM, "out of memory");
    free(*out);
    *out = s;
    return 0;
}

int chat_kwargs_read(const cJSON *v, const char *where, struct chat_kwargs *k, struct verr *err) {
    if (!cJSON_IsObject(v))
        return verr_set(err, VERR_TYPE, "'%s' must be a JSON object", where);
    const cJSON *it;
    cJSON_ArrayForEach(it, v) { // an unknown key is named before any value is read
        if (strcmp(it->string, CHAT_VAR_REASONING_EFFORT) &&
            strcmp(it->string, CHAT_VAR_MODEL_IDENTITY))
            return verr_set(err, VERR_UNSUPPORTED,
                            "'%s': unknown key '%.64s' (vela has no Jinja and reads only "
                            "reasoning_effort and model_identity, gpt-oss's variables)",
                            where, it->string);
    }
    struct chat_kwargs n;
    if (chat_kwargs_copy(&n, k, err))
        return VERR_NOMEM;
    int rc = 0;
    cJSON_ArrayForEach(it, v) {
        bool effort = !strcmp(it->string, CHAT_VAR_REASONING_EFFORT);
        char field[96];
        snprintf(field, sizeof field, "%s.%s", where, it->string);
        if ((rc = read_var(it, field, effort, effort ? &n.reasoning_effort : &n.model_identity,
                           err)))
            break;
        if (effort)
            n.effort_from = n.reasoning_effort ? where : NULL;
        else
            n.identity_from = n.model_identity ? where : NULL;
    }
    if (rc) {
        chat_kwargs_free(&n);
        return rc;
    }
    chat_kwargs_free(k);
    *k = n;
    return 0;
}

int chat_kwargs_parse(const char *json, const char *where, struct chat_kwargs *k,
                      struct verr *err) {
    cJSON *v = cJSON_ParseWithOpts(json, NULL, true);
    if (!v)
        return verr_set(err, VERR_FORMAT,
                        "'%s': '%.80s' is not valid JSON; expected an object "
                        "such as '{\"reasoning_effort\":\"high\"}'",
                        where, json);
    int rc = chat_kwargs_read(v, where, k, err);
    cJSON_Delete(v);
    return rc;
}

int chat_kwargs_read_effort(const cJSON *v, const char *where, struct chat_kwargs *k,
                            struct verr *err) {
    if (!v || cJSON_IsNull(v))
        return 0;
    int rc = read_var(v, where, true, &k->reasoning_effort, err);
    if (!rc)
        k->effort_from = where;
    return rc;
}

int chat_kwargs_copy(struct chat_kwargs *dst, const struct chat_kwargs *src, struct verr *err) {
    *dst = *src;
    dst->reasoning_effort = src->reasoning_effort ? strdup(src->reasoning_effort) : NULL;
    dst->model_identity = src->model_identity ? strdup(src->model_identity) : NULL;
    if ((src->reasoning_effort && !dst->reasoning_effort) ||
        (src->model_identity && !dst->model_identity)) {
        chat_kwargs_free(dst);
        return verr_set(err, VERR_NOMEM, "out of memory");
    }
    return 0;
}

void chat_kwargs_free(struct chat_kwargs *k) {
    free(k->reasoning_effort);
    free(k->model_identity);
    memset(k, 0, sizeof *k);
}

struct chat_opts chat_kwargs_opts(const struct chat_kwargs *k) {
    return (struct chat_opts){.reasoning_effort = k->reasoning_effort,
                              .model_identity = k->model_identity};
}

int chat_kwargs_check(const struct chat_kwargs *k, enum chat_template t, struct verr *err) {
    const struct {
        const char *var, *from;
    } given[] = {{CHAT_VAR_REASONING_EFFORT, k->reasoning_effort ? k->effort_from : NULL},
                 {CHAT_VAR_MODEL_IDENTITY, k->model_identity ? k->identity_from : NULL}};
    for (size_t i = 0; i < sizeof given / sizeof given[0]; i++)
        if (given[i].from && !chat_template_reads(t, given[i].var))
            return verr_set(err, VERR_UNSUPPORTED,
                            "'%s': the chat template '%s' has no variable %s (only gpt-oss's "
                            "reads reasoning_effort and model_identity)",
                            given[i].from, chat_template_name(t), given[i].var);
    struct chat_opts o = chat_kwargs_opts(k);
    return chat_opts_check(t, &o, err);
}
