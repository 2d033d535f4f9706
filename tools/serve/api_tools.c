#include "tools/serve/api_tools.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include <stdarg.h>
#include <stdio.h>

// The error sink of one parse: msg[cap].
struct sink {
    char *msg;
    size_t cap;
};

static int bad(struct sink *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct sink *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->cap, fmt, ap);
    va_end(ap);
    return API_TOOLS_BAD;
}

#define BAD(...) bad(e, __VA_ARGS__)
#define OOM() (snprintf(e->msg, e->cap, "out of memory"), API_TOOLS_NOMEM)

static bool is_name(const char *s) {
    if (!s[0] || strlen(s) > 64)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return false;
    return true;
}

// tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?}}
static int parse_tool(const cJSON *t, int i, struct api_tool *out, struct sink *e) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))
        return BAD("'tools[%d]' must be an object with \"type\": \"function\"", i);
    if (!cJSON_IsObject(fn))
        return BAD("'tools[%d].function' must be an object", i);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (!cJSON_IsString(name) || !is_name(name->valuestring))
        return BAD("'tools[%d].function.name' must be a string of 1 to 64 letters, digits, '_', "
                   "'-' or '.'",
                   i);
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
        return BAD("'tools[%d].function.description' must be a string", i);
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
        return BAD("'tools[%d].function.parameters' must be a JSON schema object", i);
    out->name = strdup(name->valuestring);
    out->json = cJSON_PrintUnformatted(t);
    out->parameters = params && cJSON_IsObject(params) ? cJSON_PrintUnformatted(params) : NULL;
    if (!out->name || !out->json || (params && cJSON_IsObject(params) && !out->parameters))
        return OOM();
    return 0;
}

static int parse_choice(const cJSON *o, struct api_tools *t, struct sink *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    t->choice = API_TOOL_CHOICE_AUTO;
    if (!tc || cJSON_IsNull(tc))
        return 0;
    if (cJSON_IsString(tc)) {
        static const char *const names[] = {"auto", "none", "required"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(tc->valuestring, names[i])) {
                t->choice = (enum api_tool_choice)i;
                break;
            }
        if (strcmp(tc->valuestring, "auto") && t->choice == API_TOOL_CHOICE_AUTO)
            return BAD("'tool_choice' is '%.40s'; expected \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                       tc->valuestring);
    } else {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(name))
            return BAD("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}");
        int found = -1;
        for (int i = 0; i < t->n && found < 0; i++)
            if (!strcmp(t->list[i].name, name->valuestring))
                found = i;
        if (found < 0)
            return BAD("'tool_choice' names the function '%.64s', which is not in 'tools'",
                       name->valuestring);
        t->choice = API_TOOL_CHOICE_NAMED;
        if (!(t->choice_name = strdup(name->valuestring)))
            return OOM();
    }
    if (t->choice >= API_TOOL_CHOICE_REQUIRED && t->n == 0)
        return BAD("'tool_choice' asks for a call, but 'tools' is empty");
    return 0;
}

static int parse_tools(const cJSON *o, bool chat, struct api_tools *t, struct sink *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "tools");
    t->parallel = true;
    if (v && !cJSON_IsNull(v)) {
        if (!chat && !(cJSON_IsArray(v) && !v->child))
            return BAD("'tools' is a field of /v1/chat/completions");
        if (!cJSON_IsArray(v))
            return BAD("'tools' must be an array");
        const int n = cJSON_GetArraySize(v);
        if (n > API_MAX_TOOLS)
            return BAD("'tools' has %d entries (at most %d)", n, API_MAX_TOOLS);
        if (n && !(t->list = calloc((size_t)n, sizeof *t->list)))
            return OOM();
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            int rc = parse_tool(it, t->n, &t->list[t->n], e);
            t->n++;
            if (rc)
                return rc;
        }
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "parallel_tool_calls");
    if (p && !cJSON_IsNull(p)) {
        if (!cJSON_IsBool(p))
            return BAD("'parallel_tool_calls' must be a boolean");
        t->parallel = cJSON_IsTrue(p);
    }
    return parse_choice(o, t, e);
}

int api_tools_parse(const cJSON *o, bool chat, struct api_tools *t, char *msg, size_t cap) {
    struct sink e = {msg, cap};
    return parse_tools(o, chat, t, &e);
}

static int parse_call(const cJSON *c, int i, int j, struct api_tool_call *out, struct sink *e) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name))
        return BAD("'messages[%d].tool_calls[%d]' must be {\"id\", \"type\": \"function\", "
                   "\"function\": {\"name\", \"arguments\"}}",
                   i, j);
    if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
        return BAD("'messages[%d].tool_calls[%d].function.arguments' must be a JSON string", i, j);
    out->id = cJSON_IsString(id) ? strdup(id->valuestring) : NULL;
    out->name = strdup(name->valuestring);
    out->arguments = !args                  ? strdup("{}")
                     : cJSON_IsString(args) ? strdup(args->valuestring)
                                            : cJSON_PrintUnformatted(args);
    return out->name && out->arguments && (out->id || !cJSON_IsString(id)) ? 0 : OOM();
}

static int parse_message(const cJSON *msg, int i, const char *role, struct api_tool_call **out,
                         int *n_out, char **tool_call_id, struct sink *e) {
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (calls && !cJSON_IsNull(calls)) {
        if (strcmp(role, "assistant"))
            return BAD("'messages[%d].tool_calls' belongs to role 'assistant'", i);
        if (!cJSON_IsArray(calls))
            return BAD("'messages[%d].tool_calls' must be an array", i);
        const int n = cJSON_GetArraySize(calls);
        if (n && !(*out = calloc((size_t)n, sizeof **out)))
            return OOM();
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) {
            int rc = parse_call(c, i, *n_out, &(*out)[*n_out], e);
            (*n_out)++;
            if (rc)
                return rc;
        }
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    if (id && !cJSON_IsNull(id)) {
        if (!cJSON_IsString(id))
            return BAD("'messages[%d].tool_call_id' must be a string", i);
        if (!(*tool_call_id = strdup(id->valuestring)))
            return OOM();
    }
    return 0;
}

int api_tools_parse_message(const cJSON *m, int i, const char *role, struct api_tool_call **calls,
                            int *n_calls, char **tool_call_id, char *msg, size_t cap) {
    struct sink e = {msg, cap};
    return parse_message(m, i, role, calls, n_calls, tool_call_id, &e);
}

void api_tools_calls_free(struct api_tool_call *calls, int n) {
    for (int i = 0; i < n; i++) {
        free(calls[i].id);
        free(calls[i].name);
        free(calls[i].arguments);
    }
    free(calls);
}

void api_tools_free(struct api_tools *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->list[i].name);
        free(t->list[i].json);
        free(t->list[i].parameters);
    }
    free(t->list);
    free(t->choice_name);
    memset(t, 0, sizeof *t);
}

cJSON *api_tools_calls_json(const struct api_tool_call *calls, int n, bool stream) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) {
        cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        if (!c || !fn) {
            cJSON_Delete(c);
            cJSON_Delete(fn);
            cJSON_Delete(arr);
            return NULL;
        }
        if (stream)
            cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", calls[i].id ? calls[i].id : "");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(fn, "name", calls[i].name);
        cJSON_AddStringToObject(fn, "arguments", calls[i].arguments);
        cJSON_AddItemToObject(c, "function", fn);
        cJSON_AddItemToArray(arr, c);
    }
    return arr;
}
