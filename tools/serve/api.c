// OpenAI request parsing and response writing (see api.h).
#include "tools/serve/api.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "host/ops/selfextend.h"
#include "tools/serve/api_tools.h"
#include "tools/serve/buf.h"
#include "tools/serve/json_schema.h"

const char api_sse_done[] = "data: [DONE]\n\n";

int api_fail(struct api_error *e, int status, const char *type, const char *code, const char *fmt,
             ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(...) api_fail(e, 400, "invalid_request_error", "invalid_value", __VA_ARGS__)

bool api_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t k;
        unsigned cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (p[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

cJSON *api_json_parse(const char *s, size_t len) {
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(s, len, &end, false);
    if (!o)
        return NULL;
    // cJSON stops after the first value: anything but white space after it
    // makes the body something else than one JSON value.
    for (const char *p = end; p < s + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(o);
            return NULL;
        }
    return o;
}

void api_request_free(struct api_request *r) {
    api_tools_free(&r->tools);
    chat_kwargs_free(&r->kwargs);
    free(r->grammar);
    free(r->model);
    free(r->prompt);
    free(r->prompt_tokens);
    for (int i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
        api_tools_calls_free(r->messages[i].calls, r->messages[i].n_calls);
        free(r->messages[i].tool_call_id);
        free(r->messages[i].reasoning);
    }
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    for (int i = 0; i < r->n_bias; i++)
        free(r->bias[i].text);
    free(r->bias);
    memset(r, 0, sizeof *r);
}

// A string field (NULL or JSON null: absent) copied into *out; checked UTF-8.
static int get_string(const cJSON *o, const char *name, char **out, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return BAD("'%s' must be a string", name);
    if (!api_utf8_valid(v->valuestring, strlen(v->valuestring)))
        return BAD("'%s' is not valid UTF-8", name);
    if (!(*out = strdup(v->valuestring)))
        return api_fail(e, 500, "server_error", NULL, "out of memory");
    return 0;
}

static int get_bool(const cJSON *o, const char *name, bool *out, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return BAD("'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

// A number in [lo, hi]; *present tells whether it was given.
static int get_num(const cJSON *o, const char *name, double lo, double hi, double *out,
                   bool *present, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (present)
        *present = false;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return BAD("'%s' must be a number", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return BAD("'%s' is %g; it must be between %g and %g", name, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    if (present)
        *present = true;
    return 0;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *out,
                   bool *present, struct api_error *e) {
    double d = 0;
    bool p = false;
    if (get_num(o, name, lo, hi, &d, &p, e))
        return -1;
    if (p && d != floor(d))
        return BAD("'%s' must be an integer", name);
    if (p)
        *out = (int64_t)d;
    if (present)
        *present = p;
    return 0;
}

static int get_float(const cJSON *o, const char *name, double lo, double hi, float *out,
                     struct api_error *e) {
    double d = *out;
    if (get_num(o, name, lo, hi, &d, NULL, e))
        return -1;
    *out = (float)d;
    return 0;
}

static int get_int32(const cJSON *o, const char *name, double lo, double hi, int *out,
                     struct api_error *e) {
    int64_t v = *out;
    if (get_int(o, name, lo, hi, &v, NULL, e))
        return -1;
    *out = (int)v;
    return 0;
}

// "stop": a string or an array of strings.
static int parse_stop(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!v || cJSON_IsNull(v))
        return 0;
    const cJSON *items[API_MAX_STOP];
    int n = 0;
    if (cJSON_IsString(v)) {
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (n == API_MAX_STOP)
                return BAD("'stop' has more than %d strings", API_MAX_STOP);
            items[n++] = it;
        }
    } else {
        return BAD("'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < n; i++) {
        if (!cJSON_IsString(items[i]))
            return BAD("'stop' must be a string or an array of strings");
        size_t len = strlen(items[i]->valuestring);
        if (len == 0 || len > API_MAX_STOP_LEN)
            return BAD("'stop' strings must be 1 to %d bytes long", API_MAX_STOP_LEN);
        if (!api_utf8_valid(items[i]->valuestring, len))
            return BAD("'stop' is not valid UTF-8");
        if (!(r->stop[r->n_stop] = strdup(items[i]->valuestring)))
            return api_fail(e, 500, "server_error", NULL, "out of memory");
        r->n_stop++;
    }
    return 0;
}

// "prompt": a string, an array holding one string, or an array of token ids.
static int parse_prompt(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!v || cJSON_IsNull(v))
        return BAD("'prompt' is required");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(cJSON_GetArrayItem(v, 0)))
        v = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsString(v)) {
        if (!api_utf8_valid(v->valuestring, strlen(v->valuestring)))
            return BAD("'prompt' is not valid UTF-8");
        if (!(r->prompt = strdup(v->valuestring)))
            return api_fail(e, 500, "server_error", NULL, "out of memory");
        return 0;
    }
    if (!cJSON_IsArray(v))
        return BAD("'prompt' must be a string or an array of token ids");
    int n = cJSON_GetArraySize(v);
    if (n == 0)
        return BAD("'prompt' is empty");
    if (!(r->prompt_tokens = malloc((size_t)n * sizeof *r->prompt_tokens)))
        return api_fail(e, 500, "server_error", NULL, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
            it->valuedouble < 0 || it->valuedouble > 2147483647.0)
            return BAD("'prompt' must be a string or an array of token ids (integers >= 0)");
        r->prompt_tokens[r->n_prompt_tokens++] = (int32_t)it->valuedouble;
    }
    return 0;
}

// A message's content: a string, null (an assistant turn with tool calls),
// or an array of parts whose "text" parts are joined.
static int message_content(const cJSON *c, int i, char **out, struct api_error *e) {
    if (!c || cJSON_IsNull(c))
        return (*out = strdup("")) ? 0 : api_fail(e, 500, "server_error", NULL, "out of memory");
    if (cJSON_IsString(c)) {
        if (!api_utf8_valid(c->valuestring, strlen(c->valuestring)))
            return BAD("'messages[%d].content' is not valid UTF-8", i);
        return (*out = strdup(c->valuestring))
                   ? 0
                   : api_fail(e, 500, "server_error", NULL, "out of memory");
    }
    if (!cJSON_IsArray(c))
        return BAD("'messages[%d].content' must be a string or an array of parts", i);
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx))
            return BAD("'messages[%d].content': only parts of type 'text' are supported", i);
        len += strlen(tx->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s)
        return api_fail(e, 500, "server_error", NULL, "out of memory");
    s[0] = '\0';
    cJSON_ArrayForEach(p, c) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    if (!api_utf8_valid(s, len)) {
        free(s);
        return BAD("'messages[%d].content' is not valid UTF-8", i);
    }
    *out = s;
    return 0;
}

// An api_tools parser's failure as the request's error.
static int tools_fail(int rc, const char *why, struct api_error *e) {
    return rc == API_TOOLS_NOMEM ? api_fail(e, 500, "server_error", NULL, "out of memory")
                                 : BAD("%s", why);
}

static int parse_tools(const cJSON *o, struct api_request *r, struct api_error *e) {
    char why[256];
    int rc = api_tools_parse(o, r->kind == API_CHAT, &r->tools, why, sizeof why);
    return rc ? tools_fail(rc, why, e) : 0;
}

static int parse_messages(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!v || cJSON_IsNull(v))
        return BAD("'messages' is required");
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return BAD("'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(v);
    if (n > API_MAX_MESSAGES)
        return BAD("'messages' has %d entries (at most %d)", n, API_MAX_MESSAGES);
    if (!(r->messages = calloc((size_t)n, sizeof *r->messages)))
        return api_fail(e, 500, "server_error", NULL, "out of memory");
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    const cJSON *m;
    cJSON_ArrayForEach(m, v) {
        int i = r->n_messages;
        if (!cJSON_IsObject(m))
            return BAD("'messages[%d]' must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return BAD("'messages[%d].role' must be a string", i);
        bool known = false;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++)
            known |= !strcmp(role->valuestring, roles[k]);
        if (!known)
            return BAD("'messages[%d].role' is '%.40s'; expected system, user, assistant, tool "
                       "or developer",
                       i, role->valuestring);
        if (!(r->messages[i].role = strdup(role->valuestring)))
            return api_fail(e, 500, "server_error", NULL, "out of memory");
        r->n_messages++;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if ((!content || cJSON_IsNull(content)) && strcmp(role->valuestring, "assistant"))
            return BAD("'messages[%d].content' is required for role '%s'", i, role->valuestring);
        if (message_content(content, i, &r->messages[i].content, e))
            return -1;
        struct api_message *msg = &r->messages[i];
        // llama-server's: an assistant message's reasoning (gpt-oss writes it
        // back before a tool call, toolcall.h)
        if (get_string(m, "reasoning_content", &msg->reasoning, e))
            return -1;
        char why[256];
        int rc = api_tools_parse_message(m, i, msg->role, &msg->calls, &msg->n_calls,
                                         &msg->tool_call_id, why, sizeof why);
        if (rc)
            return tools_fail(rc, why, e);
    }
    return 0;
}

// logprobs: chat takes a boolean plus top_logprobs; completions an integer
// 0..5 that is both.
static int parse_logprobs(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (r->kind == API_CHAT) {
        if (get_bool(o, "logprobs", &r->logprobs, e) ||
            get_int32(o, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, &r->top_logprobs, e))
            return -1;
        if (r->top_logprobs > 0 && !r->logprobs)
            return BAD("'top_logprobs' needs 'logprobs': true");
        return 0;
    }
    if (!v || cJSON_IsNull(v))
        return 0;
    int64_t n = 0;
    if (get_int(o, "logprobs", 0, 5, &n, NULL, e))
        return -1;
    r->logprobs = true;
    r->top_logprobs = (int)n;
    return 0;
}

static int parse_sampling(const cJSON *o, struct api_request *r, struct api_error *e) {
    int64_t seed = r->seed;
    bool has_seed = false;
    if (get_float(o, "temperature", 0, 2, &r->temperature, e) ||
        get_float(o, "top_p", 0, 1, &r->top_p, e) ||
        get_int32(o, "top_k", 0, 1 << 30, &r->top_k, e) ||
        get_float(o, "min_p", 0, 1, &r->min_p, e) ||
        get_float(o, "presence_penalty", -2, 2, &r->presence_penalty, e) ||
        get_float(o, "frequency_penalty", -2, 2, &r->frequency_penalty, e) ||
        // 0 would divide logits by zero (the sampler's penalty is logit / repeat)
        get_float(o, "repeat_penalty", 1e-3, 100, &r->repeat_penalty, e) ||
        get_int32(o, "repeat_last_n", -1, 1 << 24, &r->repeat_last_n, e) ||
        get_int(o, "seed", -9.2e18, 9.2e18, &seed, &has_seed, e))
        return -1;
    r->seed = seed;
    // llama-server's -1 (any negative): a random seed, whatever the server's
    if (has_seed)
        r->has_seed = seed >= 0;
    return 0;
}

// A field whose value asks for something vela's sampler cannot do yet
// (tools, grammars, typical or mirostat sampling): a 400 naming it. The
// values that ask for nothing pass (empty tools,
// tool_choice "none" or "auto" without tools, typical_p 1, mirostat 0), so
// that clients sending their defaults still work.
static int parse_unsupported(const cJSON *o, struct api_error *e) {
    double typical = 1, mirostat = 0, unused = 0;
    if (get_num(o, "typical_p", 0, 1, &typical, NULL, e) ||
        get_num(o, "mirostat", 0, 2, &mirostat, NULL, e) ||
        get_num(o, "mirostat_tau", 0, 1e6, &unused, NULL, e) ||
        get_num(o, "mirostat_eta", 0, 1e6, &unused, NULL, e))
        return -1;
    if (typical != 1)
        return BAD("'typical_p' %g is not supported yet (vela's sampler has no typical "
                   "sampling); leave it out or send 1",
                   typical);
    if (mirostat != 0)
        return BAD("'mirostat' %g is not supported yet (vela's sampler has no mirostat); leave "
                   "it out or send 0",
                   mirostat);
    return 0;
}

// One logit_bias value: a number (within +-1e6) or false (never: -inf).
static int bias_value(const cJSON *v, int i, float *out, struct api_error *e) {
    if (cJSON_IsFalse(v)) {
        *out = -INFINITY;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 1e6)
        return BAD("'logit_bias' entry %d: the bias must be a number in [-1e6, 1e6] or false", i);
    *out = (float)v->valuedouble;
    return 0;
}

// A token id written as a JSON number or (OpenAI's object keys) a string.
static int bias_token(const cJSON *v, const char *key, int i, int32_t *out, struct api_error *e) {
    double d = -1;
    if (key) {
        char *end;
        errno = 0;
        long long x = strtoll(key, &end, 10);
        if (end == key || *end || errno || x < 0 || x > INT32_MAX)
            return BAD("'logit_bias' key '%.64s': a token id (a non-negative integer)", key);
        *out = (int32_t)x;
        return 0;
    }
    if (cJSON_IsNumber(v))
        d = v->valuedouble;
    if (!(d >= 0 && d <= INT32_MAX && d == floor(d)))
        return BAD("'logit_bias' entry %d: the token must be a token id or a string", i);
    *out = (int32_t)d;
    return 0;
}

// logit_bias: OpenAI's object {"id": bias}, or llama-server's array of
// [id or "text", bias or false] pairs; null or empty: none.
static int parse_logit_bias(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return BAD("'logit_bias' must be an object {\"token id\": bias} or an array of "
                   "[token id or text, bias] pairs");
    const int n = cJSON_GetArraySize(v);
    if (n > API_MAX_LOGIT_BIAS)
        return BAD("'logit_bias' has %d entries (at most %d)", n, API_MAX_LOGIT_BIAS);
    if (n == 0)
        return 0;
    if (!(r->bias = calloc((size_t)n, sizeof *r->bias)))
        return api_fail(e, 500, "server_error", NULL, "out of memory");
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        struct api_bias *b = &r->bias[i];
        r->n_bias = i + 1;
        b->token = -1;
        const cJSON *tok = it, *val = it;
        if (cJSON_IsArray(v)) {
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
                return BAD("'logit_bias' entry %d: a pair [token id or text, bias]", i);
            tok = it->child;
            val = it->child->next;
        }
        if (bias_value(val, i, &b->bias, e))
            return -1;
        if (cJSON_IsString(tok) && cJSON_IsArray(v)) {
            size_t len = strlen(tok->valuestring);
            if (!len || !api_utf8_valid(tok->valuestring, len))
                return BAD("'logit_bias' entry %d: the text must be non-empty UTF-8", i);
            if (!(b->text = strdup(tok->valuestring)))
                return api_fail(e, 500, "server_error", NULL, "out of memory");
        } else if (bias_token(tok, cJSON_IsObject(v) ? it->string : NULL, i, &b->token, e)) {
            return -1;
        }
    }
    return 0;
}

// max_tokens, max_completion_tokens and llama-server's n_predict (-1: until
// a stop; it wins) within the server's -n; n, n_keep, grp_attn_*.
static int parse_limits(const cJSON *o, const struct api_defaults *d, struct api_request *r,
                        struct api_error *e) {
    // Bounded so that a hostile number cannot size anything; the server
    // caps generation at the slot's context.
    const double max_tok = 1 << 24;
    static const char *const names[] = {"max_tokens", "max_completion_tokens", "n_predict"};
    for (int i = 0; i < 3; i++) {
        int64_t mt = 0;
        bool has = false;
        if (get_int(o, names[i], i == 2 ? -1 : 0, max_tok, &mt, &has, e))
            return -1;
        if (has)
            r->max_tokens = (int)mt;
    }
    if (d->n_predict >= 0 && (r->max_tokens < 0 || r->max_tokens > d->n_predict))
        r->max_tokens = d->n_predict;
    int64_t nk = -1;
    if (get_int32(o, "n", 1, API_MAX_N, &r->n, e) ||
        get_int(o, "n_keep", -1, 1 << 24, &nk, &r->has_n_keep, e) ||
        get_int32(o, "grp_attn_n", 1, 1 << 16, &r->grp_attn_n, e) ||
        get_int32(o, "grp_attn_w", 1, 1 << 24, &r->grp_attn_w, e))
        return -1;
    r->n_keep = (int)nk;
    return 0;
}

// "self_extend": {"n": G, "w": W}, both integers >= 1; no other key (a typo
// would silently run without it).
static int parse_self_extend(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "self_extend");
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return BAD("'self_extend' must be an object {\"n\": G, \"w\": W}");
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (strcmp(it->string, "n") && strcmp(it->string, "w"))
            return BAD("'self_extend.%.40s' is not known; expected {\"n\": G, \"w\": W}",
                       it->string);
    }
    static const struct {
        const char *key;
        double hi;
    } f[2] = {{"n", 1 << 16}, {"w", 1 << 24}};
    int out[2];
    for (int k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, f[k].key);
        if (!x)
            return BAD("'self_extend.%s' is required (group size n, neighbor window w)", f[k].key);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) ||
            x->valuedouble != floor(x->valuedouble))
            return BAD("'self_extend.%s' must be an integer", f[k].key);
        if (x->valuedouble < 1 || x->valuedouble > f[k].hi)
            return BAD("'self_extend.%s' is %g; it must be between 1 and %g", f[k].key,
                       x->valuedouble, f[k].hi);
        out[k] = (int)x->valuedouble;
    }
    r->se_n = out[0];
    r->se_w = out[1];
    return 0;
}

bool api_request_speculates(const struct api_request *r) {
    return r->spec.type != ENGINE_SPEC_NONE &&
           (r->spec_given || (!r->logprobs && r->grp_attn_n == 1));
}

// One field of "speculative" (get_*'s message, its name as the field's path).
static int spec_field(int rc, struct api_error *e) {
    if (rc) {
        char m[sizeof e->message - 16];
        snprintf(m, sizeof m, "%s", e->message + 1); // past the opening quote
        snprintf(e->message, sizeof e->message, "'speculative.%s", m);
    }
    return rc;
}

// "speculative": {"type": "none"|"ngram"|"draft", "n_max": N, "n_min": N,
// "p_min": P}, each optional over the server's default; no other key.
static int parse_speculative(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "speculative");
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return BAD("'speculative' must be an object {\"type\", \"n_max\", \"n_min\", \"p_min\"}");
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (strcmp(it->string, "type") && strcmp(it->string, "n_max") &&
            strcmp(it->string, "n_min") && strcmp(it->string, "p_min"))
            return BAD("'speculative.%.40s' is not known; expected type, n_max, n_min, p_min",
                       it->string);
    }
    struct engine_spec *sp = &r->spec;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (t && !cJSON_IsNull(t)) {
        const int ty = cJSON_IsString(t) ? engine_spec_type_parse(t->valuestring) : -1;
        if (ty < 0)
            return BAD("'speculative.type' must be \"none\", \"ngram\" or \"draft\"");
        sp->type = (enum engine_spec_type)ty;
    }
    if (spec_field(get_int32(v, "n_max", 1, ENGINE_SPEC_MAX, &sp->n_max, e), e) ||
        spec_field(get_int32(v, "n_min", 0, ENGINE_SPEC_MAX, &sp->n_min, e), e) ||
        spec_field(get_float(v, "p_min", 0, 1, &sp->p_min, e), e))
        return -1;
    if (sp->n_min > sp->n_max)
        return BAD("'speculative.n_min' %d is above n_max %d", sp->n_min, sp->n_max);
    r->spec_given = true;
    return 0;
}

int api_check_context(const struct api_request *r, int n_prompt, const struct api_ctx_limits *l,
                      int *max_gen, struct api_error *e) {
    *max_gen = -1;
    // The request's own values, else the server's (n 1: off).
    const int g = r->se_n ? r->se_n : l->se_g > 1 ? l->se_g : 1;
    const int w = r->se_n ? r->se_w : l->se_w;
    if (g > 1 && !l->k_unrotated)
        return BAD("'self_extend' needs the server started with --self-extend G W or "
                   "--kv-unrotated (exact self-extend keeps K without RoPE in the cache); this "
                   "server's cache is rotated: 'grp_attn_n' / 'grp_attn_w' give llama.cpp's "
                   "approximation");
    if (g <= 1)
        return 0;
    if (r->grp_attn_n != 1)
        return BAD("'grp_attn_n' %d (llama.cpp's self-extend) and exact self-extend (n = %d, "
                   "w = %d%s) exclude each other",
                   r->grp_attn_n, g, w, r->se_n ? "" : ", the server's");
    if (w >= l->n_ctx_slot)
        return BAD("self-extend window w = %d is not below the slot's context of %d cells "
                   "(raise -c or lower --parallel)",
                   w, l->n_ctx_slot);
    const int64_t ext = se_extended_ctx(l->n_ctx_train, g, w);
    if (ext <= 0)
        return BAD("self-extend window w = %d must be below the trained context %d", w,
                   l->n_ctx_train);
    if ((int64_t)n_prompt + 4 > ext)
        return api_fail(e, 400, "invalid_request_error", "context_length_exceeded",
                        "prompt is too long (%d tokens, max %lld): exact self-extend (n = %d, "
                        "w = %d) extends the trained context of %d tokens to (%d - w) * n + w = "
                        "%lld, which must hold the prompt and 4 more tokens",
                        n_prompt, (long long)ext - 4, g, w, l->n_ctx_train, l->n_ctx_train,
                        (long long)ext);
    if (ext < l->n_ctx_slot)
        *max_gen = (int)(ext - n_prompt);
    return 0;
}

static int parse_stream(const cJSON *o, struct api_request *r, struct api_error *e) {
    if (get_bool(o, "stream", &r->stream, e) || get_bool(o, "echo", &r->echo, e) ||
        get_bool(o, "ignore_eos", &r->ignore_eos, e) ||
        get_bool(o, "cache_prompt", &r->cache_prompt, e))
        return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return BAD("'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, e))
            return -1;
    }
    if (r->echo)
        return BAD("'echo' is not supported");
    return 0;
}

// llama-server's reasoning_format.
static int parse_reasoning(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "reasoning_format");
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v) || chat_reasoning_from_name(v->valuestring, &r->reasoning))
        return BAD("'reasoning_format' must be \"auto\", \"deepseek\" or \"none\" "
                   "(\"deepseek-legacy\" is not supported)");
    return 0;
}

// A chat's template variables: the server's, then chat_template_kwargs, then
// reasoning_effort.
static int parse_kwargs(const cJSON *o, const struct api_defaults *d, struct api_request *r,
                        struct api_error *e) {
    struct verr err = {0};
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(o, "chat_template_kwargs");
    if ((d->kwargs && chat_kwargs_copy(&r->kwargs, d->kwargs, &err)) ||
        (kw && !cJSON_IsNull(kw) &&
         chat_kwargs_read(kw, "chat_template_kwargs", &r->kwargs, &err)) ||
        chat_kwargs_read_effort(cJSON_GetObjectItemCaseSensitive(o, "reasoning_effort"),
                                "reasoning_effort", &r->kwargs, &err))
        return err.code == VERR_NOMEM ? api_fail(e, 500, "server_error", NULL, "out of memory")
                                      : BAD("%s", err.msg);
    return 0;
}

// r->grammar from the JSON schema at `where` (a field's name, for errors).
static int schema_grammar(const cJSON *schema, const char *where, struct api_request *r,
                          struct api_error *e) {
    if (!cJSON_IsObject(schema) && !cJSON_IsTrue(schema))
        return BAD("'%s' must be a JSON schema object", where);
    struct verr err = {0};
    if (json_schema_to_gbnf(schema, &r->grammar, &err))
        return BAD("'%s': %s", where, err.msg);
    return 0;
}

// The output's constraint: llama-server's "grammar" (GBNF) or "json_schema",
// or OpenAI's response_format json_object / json_schema; one of them.
static int parse_grammar(const cJSON *o, struct api_request *r, struct api_error *e) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "grammar");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(o, "json_schema");
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(o, "response_format");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (rf && !cJSON_IsNull(rf) && (!cJSON_IsObject(rf) || !cJSON_IsString(ty)))
        return BAD("'response_format' must be an object with a 'type'");
    const bool has_g = g && !cJSON_IsNull(g) && !(cJSON_IsString(g) && !g->valuestring[0]);
    const bool has_js = js && !cJSON_IsNull(js);
    const bool has_rf = ty && strcmp(ty->valuestring, "text");
    if (has_g + has_js + has_rf > 1)
        return BAD("give one of 'grammar', 'json_schema' and 'response_format' (not text)");
    if (has_g) {
        if (!cJSON_IsString(g))
            return BAD("'grammar' must be a string (GBNF)");
        return (r->grammar = strdup(g->valuestring))
                   ? 0
                   : api_fail(e, 500, "server_error", NULL, "out of memory");
    }
    if (has_js)
        return schema_grammar(js, "json_schema", r, e);
    if (!has_rf)
        return 0;
    if (!strcmp(ty->valuestring, "json_object")) { // any object, or llama-server's "schema"
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(rf, "schema");
        cJSON *any = sc ? NULL : cJSON_CreateObject();
        int rc = schema_grammar(sc ? sc : any, "response_format.schema", r, e);
        cJSON_Delete(any);
        return rc;
    }
    if (!strcmp(ty->valuestring, "json_schema")) {
        const cJSON *jsn = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(jsn, "schema");
        if (!cJSON_IsObject(jsn) || !sc)
            return BAD("'response_format.json_schema' must be an object with a 'schema'");
        return schema_grammar(sc, "response_format.json_schema.schema", r, e);
    }
    return BAD("'response_format' has type '%.40s'; expected text, json_object or json_schema",
               ty->valuestring);
}

void api_defaults_openai(struct api_defaults *d) {
    *d = (struct api_defaults){.temperature = 1.0f,
                               .top_p = 1.0f,
                               .repeat_penalty = 1.0f,
                               .repeat_last_n = 64,
                               .seed = -1,
                               .n_predict = -1};
    engine_spec_default(&d->spec);
}

static void request_defaults(enum api_kind k, const struct api_defaults *d, struct api_request *r) {
    memset(r, 0, sizeof *r);
    r->kind = k;
    // OpenAI's 16 for completions; chat and llama-server's /completion: until a stop
    r->max_tokens = d->n_predict >= 0 ? d->n_predict : k == API_COMPLETION ? 16 : -1;
    r->temperature = d->temperature;
    r->top_p = d->top_p;
    r->top_k = d->top_k;
    r->min_p = d->min_p;
    r->repeat_penalty = d->repeat_penalty;
    r->repeat_last_n = d->repeat_last_n;
    r->presence_penalty = d->presence_penalty;
    r->frequency_penalty = d->frequency_penalty;
    r->seed = d->seed;
    r->has_seed = d->seed >= 0;
    r->n = 1;
    r->n_keep = -1;
    r->grp_attn_n = 1;
    r->grp_attn_w = 512;
    r->cache_prompt = true; // llama-server's default
    r->spec = d->spec;
    r->reasoning = d->reasoning;
}

int api_parse_request(enum api_kind k, const char *body, size_t len, const struct api_defaults *d,
                      struct api_request *r, struct api_error *e) {
    struct api_defaults openai;
    if (!d) {
        api_defaults_openai(&openai);
        d = &openai;
    }
    request_defaults(k, d, r);
    if (!api_utf8_valid(body, len))
        return BAD("the request body is not valid UTF-8");
    cJSON *o = api_json_parse(body, len);
    if (!o)
        return api_fail(e, 400, "invalid_request_error", "invalid_json",
                        "the request body is not valid JSON");
    int rc = 0;
    if (!cJSON_IsObject(o))
        rc = BAD("the request body must be a JSON object");
    else if (get_string(o, "model", &r->model, e) ||
             (k != API_CHAT ? parse_prompt(o, r, e) : parse_messages(o, r, e)) ||
             parse_tools(o, r, e) || parse_sampling(o, r, e) || parse_logit_bias(o, r, e) ||
             parse_unsupported(o, e) || parse_grammar(o, r, e) || parse_limits(o, d, r, e) ||
             parse_stop(o, r, e) || parse_stream(o, r, e) || parse_logprobs(o, r, e) ||
             parse_self_extend(o, r, e) || parse_speculative(o, r, e) || parse_reasoning(o, r, e) ||
             (k == API_CHAT && parse_kwargs(o, d, r, e)))
        rc = -1;
    else if (k == API_NATIVE && (r->n > 1 || r->logprobs))
        rc = BAD("'%s' is not supported by /completion (use /v1/completions)",
                 r->n > 1 ? "n" : "logprobs");
    cJSON_Delete(o);
    if (rc)
        api_request_free(r);
    return rc;
}

// The error object {"message", "type", "param": null, "code"} of e into o.
static void add_error(cJSON *o, const struct api_error *e) {
    cJSON *in = cJSON_AddObjectToObject(o, "error");
    if (!in)
        return;
    cJSON_AddStringToObject(in, "message", e->message);
    cJSON_AddStringToObject(in, "type", e->type ? e->type : "server_error");
    cJSON_AddNullToObject(in, "param");
    if (e->code)
        cJSON_AddStringToObject(in, "code", e->code);
    else
        cJSON_AddNullToObject(in, "code");
}

char *api_error_json(const struct api_error *e) {
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    add_error(o, e);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

// A string of n bytes (not NUL-terminated) as a JSON string item.
// The JSON string of the n bytes at s, NUL bytes included: a model may
// generate byte 0, and cJSON's strings end at the first NUL, which would cut
// the text there. Text holding one is written as raw JSON: the runs between
// NULs escaped by cJSON, each NUL as \u0000.
static cJSON *string_n(const char *s, size_t n) {
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    memcpy(t, s, n);
    t[n] = '\0';
    if (!memchr(t, 0, n)) {
        cJSON *v = cJSON_CreateString(t);
        free(t);
        return v;
    }
    struct buf b = {0};
    bool ok = buf_add(&b, "\"", 1) == 0;
    for (size_t i = 0; ok && i <= n; i += strlen(t + i) + 1) {
        if (i > 0)
            ok = buf_add(&b, "\\u0000", 6) == 0;
        cJSON *run = cJSON_CreateString(t + i);
        char *esc = run ? cJSON_PrintUnformatted(run) : NULL; // "...", escaped
        ok = ok && esc && buf_add(&b, esc + 1, strlen(esc) - 2) == 0;
        cJSON_free(esc);
        cJSON_Delete(run);
    }
    ok = ok && buf_add(&b, "\"", 1) == 0;
    free(t);
    cJSON *v = ok ? cJSON_CreateRaw(b.p) : NULL;
    buf_free(&b);
    return v;
}

// OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]};
// completions': {tokens, token_logprobs, top_logprobs, text_offset}.
static cJSON *logprobs_json(enum api_kind k, const struct api_choice *c) {
    if (!c->lp)
        return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (k == API_CHAT) {
        cJSON *arr = cJSON_AddArrayToObject(o, "content");
        for (int i = 0; i < c->n_lp; i++) {
            const struct api_token_logprob *t = &c->lp[i];
            cJSON *it = cJSON_CreateObject(), *tops = cJSON_CreateArray();
            cJSON_AddStringToObject(it, "token", t->token);
            cJSON_AddNumberToObject(it, "logprob", t->logprob);
            cJSON_AddNullToObject(it, "bytes");
            for (int j = 0; j < t->n_top; j++) {
                cJSON *a = cJSON_CreateObject();
                cJSON_AddStringToObject(a, "token", t->top[j].token);
                cJSON_AddNumberToObject(a, "logprob", t->top[j].logprob);
                cJSON_AddNullToObject(a, "bytes");
                cJSON_AddItemToArray(tops, a);
            }
            cJSON_AddItemToObject(it, "top_logprobs", tops);
            cJSON_AddItemToArray(arr, it);
        }
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    int off = 0;
    for (int i = 0; i < c->n_lp; i++) {
        const struct api_token_logprob *t = &c->lp[i];
        cJSON_AddItemToArray(toks, cJSON_CreateString(t->token));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->logprob));
        cJSON *m = cJSON_CreateObject();
        for (int j = 0; j < t->n_top; j++)
            cJSON_AddNumberToObject(m, t->top[j].token, t->top[j].logprob);
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(off));
        off += (int)strlen(t->token);
    }
    return o;
}

static cJSON *choice_json(enum api_kind k, int index, const struct api_choice *c, bool stream,
                          bool first) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", index);
    cJSON *text = string_n(c->text ? c->text : "", c->text ? c->len : 0);
    if (k == API_COMPLETION) {
        cJSON_AddItemToObject(o, "text", text);
    } else {
        cJSON *msg = cJSON_CreateObject();
        if (!stream || first)
            cJSON_AddStringToObject(msg, "role", "assistant");
        if (c->n_calls > 0 && c->len == 0) { // OpenAI: a call's message has null content
            cJSON_Delete(text);
            text = stream ? NULL : cJSON_CreateNull();
        }
        if (stream && c->len == 0 && c->reasoning_len > 0) { // a reasoning delta
            cJSON_Delete(text);
            text = NULL;
        }
        if (text)
            cJSON_AddItemToObject(msg, "content", text);
        if (c->reasoning_len > 0)
            cJSON_AddItemToObject(msg, "reasoning_content",
                                  string_n(c->reasoning, c->reasoning_len));
        if (c->n_calls > 0)
            cJSON_AddItemToObject(msg, "tool_calls",
                                  api_tools_calls_json(c->calls, c->n_calls, stream));
        cJSON_AddItemToObject(o, stream ? "delta" : "message", msg);
    }
    cJSON_AddItemToObject(o, "logprobs", logprobs_json(k, c));
    if (c->finish)
        cJSON_AddStringToObject(o, "finish_reason", c->finish);
    else
        cJSON_AddNullToObject(o, "finish_reason");
    return o;
}

static cJSON *envelope(enum api_kind k, const char *id, const char *model, int64_t created,
                       bool stream) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            k == API_COMPLETION ? "text_completion"
                            : stream            ? "chat.completion.chunk"
                                                : "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "system_fingerprint", "vela");
    return o;
}

static void add_timings(cJSON *o, const struct api_usage *u);

static void add_usage(cJSON *o, const struct api_usage *u) {
    cJSON *us = cJSON_CreateObject();
    cJSON_AddNumberToObject(us, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(us, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(us, "total_tokens", u->prompt_tokens + u->completion_tokens);
    cJSON *det = cJSON_AddObjectToObject(us, "prompt_tokens_details");
    cJSON_AddNumberToObject(det, "cached_tokens", u->cached_tokens);
    cJSON_AddItemToObject(o, "usage", us);
    if (u->timings)
        add_timings(o, u);
}

// llama-server's "timings": its names; per-second values as it derives them.
static void add_timings(cJSON *o, const struct api_usage *u) {
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "cache_n", u->cached_tokens);
    cJSON_AddNumberToObject(t, "prompt_n", u->prompt_n);
    cJSON_AddNumberToObject(t, "prompt_ms", u->prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_second",
                            u->prompt_ms > 0 ? 1e3 * u->prompt_n / u->prompt_ms : 0);
    cJSON_AddNumberToObject(t, "predicted_n", u->completion_tokens);
    cJSON_AddNumberToObject(t, "predicted_ms", u->predicted_ms);
    cJSON_AddNumberToObject(t, "predicted_per_second",
                            u->predicted_ms > 0 ? 1e3 * u->completion_tokens / u->predicted_ms : 0);
    if (u->spec) {
        cJSON_AddNumberToObject(t, "draft_n", u->draft_n);
        cJSON_AddNumberToObject(t, "draft_n_accepted", u->draft_n_accepted);
    }
}

char *api_response_json(enum api_kind k, const char *id, const char *model, int64_t created,
                        const struct api_choice *choices, int n, const struct api_usage *u) {
    cJSON *o = envelope(k, id, model, created, false);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, choice_json(k, i, &choices[i], false, false));
    if (u)
        add_usage(o, u);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

// o as an SSE event "data: {...}\n\n" (o deleted); NULL when out of memory.
static char *sse_event(cJSON *o) {
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js)
        return NULL;
    size_t n = strlen(js);
    char *s = malloc(n + 9);
    if (s)
        snprintf(s, n + 9, "data: %s\n\n", js);
    cJSON_free(js);
    return s;
}

char *api_chunk_sse(enum api_kind k, const char *id, const char *model, int64_t created, int index,
                    const struct api_choice *c, bool first, const struct api_usage *u) {
    cJSON *o = envelope(k, id, model, created, true);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    if (c)
        cJSON_AddItemToArray(arr, choice_json(k, index, c, true, first));
    if (u)
        add_usage(o, u);
    return sse_event(o);
}

char *api_chunk_error_sse(enum api_kind k, const char *id, const char *model, int64_t created,
                          int index, const struct api_error *e) {
    cJSON *o = envelope(k, id, model, created, true);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    const struct api_choice c = {.text = "", .len = 0, .finish = "error"};
    cJSON_AddItemToArray(arr, choice_json(k, index, &c, true, false));
    add_error(o, e);
    return sse_event(o);
}

// llama-server's /completion fields of a finished or running answer.
static cJSON *native_object(const char *model, const struct api_choice *c,
                            const struct api_usage *u) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "content", string_n(c->text ? c->text : "", c->text ? c->len : 0));
    cJSON_AddBoolToObject(o, "stop", u != NULL);
    cJSON_AddNumberToObject(o, "id_slot", -1); // the engine does not say which slot it took
    if (!u)
        return o;
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddNumberToObject(o, "tokens_predicted", u->completion_tokens);
    cJSON_AddNumberToObject(o, "tokens_evaluated", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "tokens_cached", u->cached_tokens);
    // "stop": an end-of-generation token or a stop string ended it
    cJSON_AddStringToObject(o, "stop_type",
                            c->finish && !strcmp(c->finish, "length") ? "limit" : "eos");
    cJSON_AddBoolToObject(o, "truncated", false);
    add_timings(o, u);
    return o;
}

char *api_native_json(const char *model, const struct api_choice *c, const struct api_usage *u) {
    cJSON *o = native_object(model, c, u);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *api_native_chunk_sse(const char *model, const struct api_choice *c,
                           const struct api_usage *u) {
    return sse_event(native_object(model, c, u));
}

char *api_error_sse(const struct api_error *e) {
    cJSON *o = cJSON_CreateObject();
    add_error(o, e);
    return sse_event(o);
}
