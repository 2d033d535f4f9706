#include "tools/serve/toolcall.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/serve/buf.h"
#include "tools/serve/json_schema.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define LLAMA3_PYTHON_TAG "<|python_tag|>"
#define MISTRAL_CALLS "[TOOL_CALLS]"
#define MISTRAL_ID_LEN 9

enum toolcall_format toolcall_format_of(enum chat_template t) {
    switch (t) {
    case CHAT_TMPL_CHATML:
        return TOOLCALL_HERMES;
    case CHAT_TMPL_LLAMA3:
        return TOOLCALL_LLAMA3;
    case CHAT_TMPL_MISTRAL_V3:
    case CHAT_TMPL_MISTRAL_V3_TEKKEN:
    case CHAT_TMPL_MISTRAL_V7:
    case CHAT_TMPL_MISTRAL_V7_TEKKEN:
        return TOOLCALL_MISTRAL;
    case CHAT_TMPL_GPT_OSS:
        return TOOLCALL_HARMONY;
    default:
        return TOOLCALL_NONE;
    }
}

const char *toolcall_marker(enum toolcall_format f) {
    return f == TOOLCALL_MISTRAL ? MISTRAL_CALLS : NULL;
}

bool toolcall_wanted(const struct api_request *r) {
    return r->tools.n > 0 && r->tools.choice != API_TOOL_CHOICE_NONE;
}

void toolcall_strs_free(struct toolcall_strs *s) {
    for (int i = 0; i < s->n; i++)
        free(s->p[i]);
    free(s->p);
    memset(s, 0, sizeof *s);
}

// Takes b's bytes into *keep; NULL when out of memory (b is freed either way).
static const char *keep_buf(struct toolcall_strs *keep, struct buf *b) {
    if (keep->n == keep->cap) {
        int cap = keep->cap ? 2 * keep->cap : 8;
        char **p = realloc(keep->p, (size_t)cap * sizeof *p);
        if (!p) {
            buf_free(b);
            return NULL;
        }
        keep->p = p;
        keep->cap = cap;
    }
    if (!b->p && buf_add(b, "", 0))
        return NULL;
    keep->p[keep->n++] = b->p;
    const char *s = b->p;
    memset(b, 0, sizeof *b);
    return s;
}

// --- JSON as the templates print it ------------------------------------------------

// Python's json.dumps (what Jinja's tojson is): ", " and ": " between items
// on one line, or with indent > 0 one item per line and "," / ": "; non-ASCII
// kept as it is.
static int dump_json(struct buf *b, const cJSON *v, int indent, int depth);

static int dump_string(struct buf *b, const char *s) {
    int rc = buf_add(b, "\"", 1);
    for (; *s && !rc; s++) {
        const unsigned char c = (unsigned char)*s;
        char esc[8];
        const char *e = NULL;
        switch (c) {
        case '"':
            e = "\\\"";
            break;
        case '\\':
            e = "\\\\";
            break;
        case '\n':
            e = "\\n";
            break;
        case '\r':
            e = "\\r";
            break;
        case '\t':
            e = "\\t";
            break;
        case '\b':
            e = "\\b";
            break;
        case '\f':
            e = "\\f";
            break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                e = esc;
            }
        }
        rc = e ? buf_add(b, e, strlen(e)) : buf_add(b, s, 1);
    }
    return rc ? rc : buf_add(b, "\"", 1);
}

// A number as Python prints it: integers without a point, others in the
// shortest form that reads back the same.
static int dump_number(struct buf *b, double d) {
    char s[40];
    if (!isfinite(d))
        snprintf(s, sizeof s, "null");
    else if (d == floor(d) && fabs(d) < 1e15)
        snprintf(s, sizeof s, "%.0f", d);
    else
        for (int p = 1; p <= 17; p++) {
            snprintf(s, sizeof s, "%.*g", p, d);
            if (strtod(s, NULL) == d)
                break;
        }
    return buf_add(b, s, strlen(s));
}

static int dump_newline(struct buf *b, int indent, int depth) {
    int rc = buf_add(b, "\n", 1);
    for (int i = 0; i < indent * depth && !rc; i++)
        rc = buf_add(b, " ", 1);
    return rc;
}

static int dump_container(struct buf *b, const cJSON *v, int indent, int depth) {
    const bool obj = cJSON_IsObject(v);
    int rc = buf_add(b, obj ? "{" : "[", 1);
    if (!v->child)
        return rc ? rc : buf_add(b, obj ? "}" : "]", 1);
    for (const cJSON *c = v->child; c && !rc; c = c->next) {
        if (c != v->child)
            rc = indent > 0 ? buf_add(b, ",", 1) : buf_add(b, ", ", 2);
        if (!rc && indent > 0)
            rc = dump_newline(b, indent, depth + 1);
        if (!rc && obj)
            rc = dump_string(b, c->string ? c->string : "");
        if (!rc && obj)
            rc = buf_add(b, ": ", 2);
        if (!rc)
            rc = dump_json(b, c, indent, depth + 1);
    }
    if (!rc && indent > 0)
        rc = dump_newline(b, indent, depth);
    return rc ? rc : buf_add(b, obj ? "}" : "]", 1);
}

static int dump_json(struct buf *b, const cJSON *v, int indent, int depth) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v))
        return dump_container(b, v, indent, depth);
    if (cJSON_IsString(v))
        return dump_string(b, v->valuestring);
    if (cJSON_IsNumber(v))
        return dump_number(b, v->valuedouble);
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? buf_add(b, "true", 4) : buf_add(b, "false", 5);
    return buf_add(b, "null", 4);
}

// JSON text (a request's tool object or call arguments) re-printed as the
// templates print it; text that is not JSON is printed as a JSON string.
static int dump_text(struct buf *b, const char *json, int indent) {
    cJSON *v = json ? api_json_parse(json, strlen(json)) : NULL;
    int rc = v ? dump_json(b, v, indent, 0) : dump_string(b, json ? json : "");
    cJSON_Delete(v);
    return rc;
}

static int add_str(struct buf *b, const char *s) {
    return buf_add(b, s, strlen(s));
}

// --- prompts -----------------------------------------------------------------------

static int hermes_system(struct buf *b, const struct api_request *r, const char *system) {
    int rc = add_str(b, system ? system
                               : "You are Qwen, created by Alibaba Cloud. You are a helpful "
                                 "assistant.");
    rc = rc ? rc
            : add_str(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the "
                         "user query.\n\nYou are provided with function signatures within "
                         "<tools></tools> XML tags:\n<tools>");
    for (int i = 0; i < r->tools.n && !rc; i++)
        if (!(rc = buf_add(b, "\n", 1)))
            rc = dump_text(b, r->tools.list[i].json, 0);
    return rc ? rc
              : add_str(b, "\n</tools>\n\nFor each function call, return a json object with "
                           "function name and arguments within <tool_call></tool_call> XML "
                           "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                           "<args-json-object>}\n</tool_call>");
}

static int hermes_calls(struct buf *b, const struct api_message *m) {
    int rc = add_str(b, m->content);
    for (int i = 0; i < m->n_calls && !rc; i++) {
        if (b->len)
            rc = buf_add(b, "\n", 1);
        rc = rc ? rc : add_str(b, HERMES_OPEN "\n{\"name\": ");
        rc = rc ? rc : dump_string(b, m->calls[i].name);
        rc = rc ? rc : add_str(b, ", \"arguments\": ");
        rc = rc ? rc : dump_text(b, m->calls[i].arguments, 0);
        rc = rc ? rc : add_str(b, "}\n" HERMES_CLOSE);
    }
    return rc;
}

static int llama3_tools(struct buf *b, const struct api_request *r, const char *question) {
    int rc = add_str(b, "Given the following functions, please respond with a JSON for a function "
                        "call with its proper arguments that best answers the given "
                        "prompt.\n\nRespond in the format {\"name\": function name, "
                        "\"parameters\": dictionary of argument name and its value}.Do not use "
                        "variables.\n\n");
    for (int i = 0; i < r->tools.n && !rc; i++)
        if (!(rc = dump_text(b, r->tools.list[i].json, 4)))
            rc = add_str(b, "\n\n");
    return rc ? rc : add_str(b, question);
}

static int llama3_calls(struct buf *b, const struct api_message *m) {
    int rc = 0;
    for (int i = 0; i < m->n_calls && !rc; i++) {
        rc = add_str(b, i ? "; {\"name\": " : "{\"name\": ");
        rc = rc ? rc : dump_string(b, m->calls[i].name);
        rc = rc ? rc : add_str(b, ", \"parameters\": ");
        rc = rc ? rc : dump_text(b, m->calls[i].arguments, 0);
        rc = rc ? rc : add_str(b, "}");
    }
    return m->n_calls ? rc : add_str(b, m->content);
}

// A call id as Mistral's templates take it: 9 letters and digits. Such an
// id is kept; any other is mapped to 9 base-62 digits of its FNV-1a hash.
static void mistral_id(const char *id, char out[MISTRAL_ID_LEN + 1]) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    size_t n = 0;
    while (id[n] && n <= MISTRAL_ID_LEN &&
           ((id[n] >= '0' && id[n] <= '9') || ((id[n] | 0x20) >= 'a' && (id[n] | 0x20) <= 'z')))
        n++;
    if (n == MISTRAL_ID_LEN && !id[n]) {
        memcpy(out, id, MISTRAL_ID_LEN + 1);
        return;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    for (int i = 0; i < MISTRAL_ID_LEN; i++, h /= 62)
        out[i] = digits[h % 62];
    out[MISTRAL_ID_LEN] = '\0';
}

// The space after Mistral's markers: "[TOOL_CALLS] [" in v3 and v7,
// "[TOOL_CALLS][" in v3-tekken (Nemo).
static const char *mistral_sep(enum chat_template t) {
    return t == CHAT_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
}

// One tool as the templates write it: {"type": "function", "function":
// {...}} with the function's keys in order ("return" left out), string
// values between quotes as they are (the templates do not escape them),
// others as JSON.
static int mistral_tool(struct buf *b, const char *json) {
    cJSON *o = api_json_parse(json, strlen(json));
    const cJSON *fn = o ? cJSON_GetObjectItemCaseSensitive(o, "function") : NULL;
    int rc = add_str(b, "{\"type\": \"function\", \"function\": {");
    bool first = true;
    for (const cJSON *c = fn ? fn->child : NULL; c && !rc; c = c->next) {
        if (!c->string || !strcmp(c->string, "return"))
            continue;
        rc = first ? 0 : add_str(b, ", ");
        first = false;
        rc = rc ? rc : add_str(b, "\"");
        rc = rc ? rc : add_str(b, c->string);
        rc = rc ? rc : add_str(b, "\": ");
        if (cJSON_IsString(c))
            rc = rc ? rc : add_str(b, "\"") || add_str(b, c->valuestring) || add_str(b, "\"");
        else
            rc = rc ? rc : dump_json(b, c, 0, 0);
    }
    cJSON_Delete(o);
    return rc ? rc : add_str(b, "}}");
}

static int mistral_tools(struct buf *b, enum chat_template t, const struct api_request *r) {
    int rc = add_str(b, "[AVAILABLE_TOOLS]") || add_str(b, mistral_sep(t)) || add_str(b, "[");
    for (int i = 0; i < r->tools.n && !rc; i++)
        rc = (i ? add_str(b, ", ") : 0) || mistral_tool(b, r->tools.list[i].json);
    return rc ? rc : add_str(b, "][/AVAILABLE_TOOLS]");
}

static int mistral_calls(struct buf *b, enum chat_template t, const struct api_message *m) {
    int rc = add_str(b, MISTRAL_CALLS) || add_str(b, mistral_sep(t)) || add_str(b, "[");
    for (int i = 0; i < m->n_calls && !rc; i++) {
        char id[MISTRAL_ID_LEN + 1];
        mistral_id(m->calls[i].id ? m->calls[i].id : "", id);
        rc = (i ? add_str(b, ", ") : 0) || add_str(b, "{\"name\": ") ||
             dump_string(b, m->calls[i].name) || add_str(b, ", \"arguments\": ") ||
             dump_text(b, m->calls[i].arguments, 0) || add_str(b, ", \"id\": \"") ||
             add_str(b, id) || add_str(b, "\"}");
    }
    return rc ? rc : add_str(b, "]</s>");
}

static int mistral_result(struct buf *b, enum chat_template t, const struct api_message *m) {
    char id[MISTRAL_ID_LEN + 1];
    mistral_id(m->tool_call_id, id);
    return add_str(b, "[TOOL_RESULTS]") || add_str(b, mistral_sep(t)) ||
           add_str(b, "{\"content\": ") || add_str(b, m->content) ||
           add_str(b, ", \"call_id\": \"") || add_str(b, id) || add_str(b, "\"}[/TOOL_RESULTS]");
}

// One message of the request, rewritten for format f (the tools block is
// placed by the caller). *merged: a tool result appended to the previous
// user turn (Hermes puts consecutive results in one turn).
static int render_message(enum toolcall_format f, const struct api_message *m, struct buf *b,
                          const char **role) {
    *role = m->role;
    if (!strcmp(m->role, "assistant") && m->n_calls)
        return f == TOOLCALL_HERMES ? hermes_calls(b, m) : llama3_calls(b, m);
    if (!strcmp(m->role, "tool")) {
        if (f == TOOLCALL_LLAMA3) {
            *role = "ipython";
            return add_str(b, m->content);
        }
        *role = "user";
        int rc = add_str(b, "<tool_response>\n");
        rc = rc ? rc : add_str(b, m->content);
        return rc ? rc : add_str(b, "\n</tool_response>");
    }
    return add_str(b, m->content);
}

static bool uses_tools(const struct api_request *r) {
    if (r->tools.n > 0 && r->tools.choice != API_TOOL_CHOICE_NONE)
        return true;
    for (int i = 0; i < r->n_messages; i++)
        if (r->messages[i].n_calls || !strcmp(r->messages[i].role, "tool"))
            return true;
    return false;
}

#define OOM() api_fail(e, 500, "server_error", NULL, "out of memory")

// The system turn, with the tools announced (Hermes; Llama 3's tools go in
// the first user turn).
static int render_system(enum toolcall_format f, const struct api_request *r, bool show,
                         struct chat_msg *out, int *n, struct toolcall_strs *keep,
                         struct api_error *e) {
    const bool has_sys = r->n_messages > 0 && !strcmp(r->messages[0].role, "system");
    struct buf b = {0};
    if (f == TOOLCALL_HERMES && show) {
        if (hermes_system(&b, r, has_sys ? r->messages[0].content : NULL))
            return buf_free(&b), OOM();
    } else if (f == TOOLCALL_LLAMA3 && show) {
        // Llama 3.1's template; its date_string default (the legacy llama3
        // formatter trims the turn, as llama.cpp's)
        if (add_str(&b, "Environment: ipython\nCutting Knowledge Date: December 2023\nToday "
                        "Date: 26 Jul 2024\n\n") ||
            (has_sys && add_str(&b, r->messages[0].content)))
            return buf_free(&b), OOM();
    } else if (!has_sys) {
        return 0;
    } else if (add_str(&b, r->messages[0].content)) {
        return buf_free(&b), OOM();
    }
    const char *s = keep_buf(keep, &b);
    if (!s)
        return OOM();
    out[(*n)++] = (struct chat_msg){"system", s};
    return 0;
}

// Appends (role, b's text) to out; b is taken. -1 (a 500 in e) when out of memory.
static int push_msg(const char *role, struct buf *b, int rc, struct chat_msg *out, int *n,
                    struct toolcall_strs *keep, struct api_error *e) {
    const char *s = rc ? (buf_free(b), NULL) : keep_buf(keep, b);
    if (!s)
        return OOM();
    out[(*n)++] = (struct chat_msg){role, s};
    return 0;
}

// Mistral Small 3.1's instructions for calls, which open its system prompt
// when tools are given.
#define MISTRAL_V7_TOOLS_PROMPT                                                                    \
    "You are a helpful assistant that can call tools. If you call one or more tools, format "      \
    "them in a single JSON array or objects, where each object is a tool call, not as separate "   \
    "objects outside of an array or multiple arrays. Use the format [{\"name\": tool call name, "  \
    "\"arguments\": tool call arguments}, additional tool calls] if you call more than one "       \
    "tool. If you call tools, do not attempt to interpret them or otherwise provide a response "   \
    "until you receive a tool call result that you can interpret for the user."

// The conversation in Mistral's format (toolcall.h): markers as raw
// messages between the turns.
static int render_mistral(enum chat_template t, const struct api_request *r, bool show,
                          struct chat_msg *out, int *n, struct toolcall_strs *keep,
                          struct api_error *e) {
    const bool v7 = t == CHAT_TMPL_MISTRAL_V7 || t == CHAT_TMPL_MISTRAL_V7_TEKKEN;
    const int first = r->n_messages > 0 && !strcmp(r->messages[0].role, "system") ? 1 : 0;
    const char *sys = first ? r->messages[0].content : NULL;
    int last_user = -1;
    for (int i = first; i < r->n_messages; i++)
        if (!strcmp(r->messages[i].role, "user"))
            last_user = i;
    if (v7 && (sys || show)) {
        struct buf b = {0};
        int rc = show && (add_str(&b, MISTRAL_V7_TOOLS_PROMPT) || (sys && add_str(&b, "\n\n")));
        rc = rc || (sys && add_str(&b, sys));
        if (push_msg("system", &b, rc, out, n, keep, e))
            return -1;
    }
    for (int i = first; i < r->n_messages; i++) {
        const struct api_message *m = &r->messages[i];
        struct buf b = {0};
        if (i == last_user && show &&
            push_msg(CHAT_ROLE_RAW, &b, mistral_tools(&b, t, r), out, n, keep, e))
            return -1;
        const char *role = m->role;
        int rc;
        if (!strcmp(m->role, "tool")) {
            if (!m->tool_call_id)
                return api_fail(e, 400, "invalid_request_error", "invalid_value",
                                "'messages[%d].tool_call_id' is required: the chat template "
                                "'%s' names the call each result answers",
                                i, chat_template_name(t));
            role = CHAT_ROLE_RAW;
            rc = mistral_result(&b, t, m);
        } else if (!strcmp(m->role, "assistant") && m->n_calls) {
            role = CHAT_ROLE_RAW;
            rc = mistral_calls(&b, t, m);
        } else if (!v7 && sys && i == r->n_messages - 1 && !strcmp(m->role, "user")) {
            // v3's template: the system text joins the last message when it
            // is the user's (and is left out otherwise).
            rc = add_str(&b, sys) || add_str(&b, "\n\n") || add_str(&b, m->content);
        } else {
            rc = add_str(&b, m->content);
        }
        if (push_msg(role, &b, rc, out, n, keep, e))
            return -1;
    }
    return 0;
}

// --- harmony (gpt-oss) ---------------------------------------------------------

static const cJSON *item(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static bool type_is(const cJSON *spec, const char *t) {
    const cJSON *v = item(spec, "type");
    return cJSON_IsString(v) && !strcmp(v->valuestring, t);
}

static bool in_list(const cJSON *list, const char *s) {
    for (const cJSON *v = cJSON_IsArray(list) ? list->child : NULL; v; v = v->next)
        if (cJSON_IsString(v) && !strcmp(v->valuestring, s))
            return true;
    return false;
}

static int ts_type(struct buf *b, const cJSON *spec, int depth);

// An array's element type as the template's render_typescript_type writes it.
static int ts_array(struct buf *b, const cJSON *spec, int depth) {
    const cJSON *items = item(spec, "items");
    int rc = 0;
    if (!cJSON_IsObject(items) || !items->child)
        rc = add_str(b, "any[]");
    else if (type_is(items, "string"))
        rc = add_str(b, "string[]");
    else if (type_is(items, "number") || type_is(items, "integer"))
        rc = add_str(b, "number[]");
    else if (type_is(items, "boolean"))
        rc = add_str(b, "boolean[]");
    else {
        struct buf in = {0};
        rc = ts_type(&in, items, depth + 1);
        const char *t = in.p ? in.p : "";
        if (!rc)
            rc = !strcmp(t, "object | object") || in.len > 50 ? add_str(b, "any[]")
                                                              : add_str(b, t) || add_str(b, "[]");
        buf_free(&in);
    }
    return rc || !cJSON_IsTrue(item(spec, "nullable")) ? rc : add_str(b, " | null");
}

// A nested object's properties: "{\n", then each as NAME?: TYPE, joined by
// ", ", then "}" (the template puts a line break and 16 spaces before each
// property's type: its {{ }} there does not trim).
static int ts_object(struct buf *b, const cJSON *spec, int depth) {
    const cJSON *props = item(spec, "properties"), *req = item(spec, "required");
    if (!cJSON_IsObject(props) || !props->child)
        return add_str(b, "object");
    int rc = add_str(b, "{\n");
    for (const cJSON *p = props->child; p && !rc; p = p->next) {
        rc = add_str(b, p->string) || (!in_list(req, p->string) && add_str(b, "?")) ||
             add_str(b, ": \n                ") || ts_type(b, p, depth + 1) ||
             (p->next && add_str(b, ", "));
    }
    return rc ? rc : add_str(b, "}");
}

// gpt-oss's render_typescript_type. oneOf (whose variants the template
// writes with comments and line breaks) is refused: 1.
static int ts_type(struct buf *b, const cJSON *spec, int depth) {
    const cJSON *type = item(spec, "type");
    if (depth > 16)
        return 1;
    if (type_is(spec, "array"))
        return ts_array(b, spec, depth);
    if (cJSON_IsArray(type) && type->child) {
        int rc = 0;
        for (const cJSON *t = type->child; t && !rc; t = t->next)
            rc = !cJSON_IsString(t) || add_str(b, t->valuestring) || (t->next && add_str(b, " | "));
        return rc;
    }
    if (item(spec, "oneOf"))
        return 1;
    if (type_is(spec, "string")) {
        const cJSON *en = item(spec, "enum");
        if (cJSON_IsArray(en) && en->child) {
            int rc = add_str(b, "\"");
            for (const cJSON *v = en->child; v && !rc; v = v->next)
                rc = !cJSON_IsString(v) || add_str(b, v->valuestring) ||
                     add_str(b, v->next ? "\" | \"" : "\"");
            return rc;
        }
        return add_str(b, "string") ||
               (cJSON_IsTrue(item(spec, "nullable")) && add_str(b, " | null"));
    }
    if (type_is(spec, "number") || type_is(spec, "integer"))
        return add_str(b, "number");
    if (type_is(spec, "boolean"))
        return add_str(b, "boolean");
    if (type_is(spec, "object"))
        return ts_object(b, spec, depth);
    return add_str(b, "any");
}

// One parameter line of a function: "// description\n", NAME?: TYPE, its
// default, ",\n".
static int ts_param(struct buf *b, const cJSON *p, const cJSON *req) {
    const cJSON *desc = item(p, "description"), *def = item(p, "default");
    int rc = cJSON_IsString(desc) && desc->valuestring[0] &&
             (add_str(b, "// ") || add_str(b, desc->valuestring) || add_str(b, "\n"));
    rc = rc || add_str(b, p->string) || (!in_list(req, p->string) && add_str(b, "?")) ||
         add_str(b, ": ") || ts_type(b, p, 0);
    if (!rc && def) {
        if (item(p, "enum") && cJSON_IsString(def))
            rc = add_str(b, ", // default: ") || add_str(b, def->valuestring);
        else
            rc = add_str(b, ", // default: ") || dump_json(b, def, 0, 0);
    }
    return rc || add_str(b, ",\n");
}

// The template's render_tool_namespace("functions", tools): each tool as a
// TypeScript type. 1 for a schema it cannot write (oneOf), -1 out of memory.
static int harmony_namespace(struct buf *b, const struct api_request *r) {
    int rc = add_str(b, "## functions\n\nnamespace functions {\n\n");
    for (int i = 0; i < r->tools.n && !rc; i++) {
        cJSON *t = api_json_parse(r->tools.list[i].json, strlen(r->tools.list[i].json));
        const cJSON *fn = item(t, "function"), *desc = item(fn, "description");
        const cJSON *params = item(fn, "parameters"), *props = item(params, "properties");
        rc = add_str(b, "// ") || (cJSON_IsString(desc) && add_str(b, desc->valuestring)) ||
             add_str(b, "\ntype ") || add_str(b, r->tools.list[i].name) || add_str(b, " = ");
        if (!rc && cJSON_IsObject(props) && props->child) {
            rc = add_str(b, "(_: {\n");
            for (const cJSON *p = props->child; p && !rc; p = p->next)
                rc = ts_param(b, p, item(params, "required"));
            rc = rc || add_str(b, "}) => any;\n\n");
        } else if (!rc) {
            rc = add_str(b, "() => any;\n\n");
        }
        cJSON_Delete(t);
    }
    return rc || add_str(b, "} // namespace functions");
}

// An assistant message's call as the template writes it: its reasoning (or
// else its content) as an analysis message unless a later answer without
// calls follows, then the first call (the template writes one per message).
static int harmony_call(struct buf *b, const struct api_request *r, int i) {
    const struct api_message *m = &r->messages[i];
    bool later_final = false;
    for (int k = i + 1; k < r->n_messages; k++)
        later_final |= !strcmp(r->messages[k].role, "assistant") && !r->messages[k].n_calls;
    // llama.cpp passes reasoning_content as the template's "thinking", which
    // then stands in for the content
    const char *analysis = m->reasoning ? m->reasoning : m->content;
    int rc = analysis[0] && !later_final &&
             (add_str(b, "<|start|>assistant<|channel|>analysis<|message|>") ||
              add_str(b, analysis) || add_str(b, "<|end|>"));
    return rc || add_str(b, "<|start|>assistant to=functions.") || add_str(b, m->calls[0].name) ||
           add_str(b, "<|channel|>commentary json<|message|>") ||
           dump_text(b, m->calls[0].arguments, 0) || add_str(b, "<|call|>");
}

// The conversation in harmony (toolcall.h): calls and results as raw
// messages, then the functions namespace as a CHAT_ROLE_TOOLS message.
static int render_harmony(const struct api_request *r, bool show, struct chat_msg *out, int *n,
                          struct toolcall_strs *keep, struct api_error *e) {
    const char *last_call = NULL;
    for (int i = 0; i < r->n_messages; i++) {
        const struct api_message *m = &r->messages[i];
        const char *role = m->role;
        struct buf b = {0};
        int rc;
        if (!strcmp(m->role, "assistant") && m->n_calls) {
            role = CHAT_ROLE_RAW;
            rc = harmony_call(&b, r, i);
            last_call = m->calls[0].name;
        } else if (!strcmp(m->role, "tool")) {
            if (!last_call)
                return api_fail(e, 400, "invalid_request_error", "invalid_value",
                                "'messages[%d]': a tool result with no assistant tool call "
                                "before it (gpt-oss's template names the function it answers)",
                                i);
            role = CHAT_ROLE_RAW;
            rc = add_str(&b, "<|start|>functions.") || add_str(&b, last_call) ||
                 add_str(&b, " to=assistant<|channel|>commentary<|message|>") ||
                 dump_string(&b, m->content) || add_str(&b, "<|end|>");
        } else {
            if (!strcmp(m->role, "assistant"))
                last_call = NULL;
            rc = add_str(&b, m->content);
        }
        if (push_msg(role, &b, rc, out, n, keep, e))
            return -1;
    }
    if (show) { // after the conversation: its first message stays the system one
        struct buf b = {0};
        int rc = harmony_namespace(&b, r);
        if (rc > 0) {
            buf_free(&b);
            return api_fail(e, 400, "invalid_request_error", "invalid_value",
                            "'tools': a parameter schema with oneOf (or nested deeper than 16) "
                            "cannot be written in gpt-oss's tool format by vela");
        }
        if (push_msg(CHAT_ROLE_TOOLS, &b, rc, out, n, keep, e))
            return -1;
    }
    return 0;
}

int toolcall_render(enum chat_template t, const struct api_request *r, struct chat_msg *out,
                    int *n_out, struct toolcall_strs *keep, struct api_error *e) {
    *n_out = 0;
    const enum toolcall_format f = toolcall_format_of(t);
    if (!uses_tools(r)) {
        for (int i = 0; i < r->n_messages; i++)
            out[i] = (struct chat_msg){r->messages[i].role, r->messages[i].content};
        *n_out = r->n_messages;
        return 0;
    }
    if (f == TOOLCALL_NONE)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "'tools': the model's chat template '%s' has no tool-call format in vela "
                        "(templates with one: chatml (Hermes / Qwen), llama3, mistral-v3, "
                        "mistral-v3-tekken, mistral-v7, mistral-v7-tekken, gpt-oss)",
                        chat_template_name(t));
    const bool show = toolcall_wanted(r);
    if (f == TOOLCALL_MISTRAL)
        return render_mistral(t, r, show, out, n_out, keep, e);
    if (f == TOOLCALL_HARMONY)
        return render_harmony(r, show, out, n_out, keep, e);
    if (render_system(f, r, show, out, n_out, keep, e))
        return -1;
    bool tools_placed = f != TOOLCALL_LLAMA3 || !show;
    const int first = r->n_messages > 0 && !strcmp(r->messages[0].role, "system") ? 1 : 0;
    for (int i = first; i < r->n_messages; i++) {
        const struct api_message *m = &r->messages[i];
        struct buf b = {0};
        const char *role = m->role;
        int rc;
        if (!tools_placed && !strcmp(m->role, "user")) {
            rc = llama3_tools(&b, r, m->content);
            tools_placed = true;
        } else {
            rc = render_message(f, m, &b, &role);
        }
        // Hermes: consecutive tool results share one user turn.
        const bool join = f == TOOLCALL_HERMES && !strcmp(m->role, "tool") && i > first &&
                          !strcmp(r->messages[i - 1].role, "tool");
        if (!rc && join) {
            struct buf j = {0};
            rc = add_str(&j, out[*n_out - 1].content) || buf_add(&j, "\n", 1) ||
                 buf_add(&j, b.p ? b.p : "", b.len);
            buf_free(&b);
            b = j;
            (*n_out)--;
        }
        const char *s = rc ? (buf_free(&b), NULL) : keep_buf(keep, &b);
        if (!s)
            return OOM();
        out[(*n_out)++] = (struct chat_msg){role, s};
    }
    return 0;
}

// --- answers -----------------------------------------------------------------------

static bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// One call's JSON object: its name and its arguments under `args_key`
// ("arguments" or "parameters"; an object, or a string holding one).
static int call_of(const cJSON *o, struct api_tool_call *c) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name) || !name->valuestring[0])
        return 1;
    if (args && !cJSON_IsObject(args) && !cJSON_IsString(args))
        return 1;
    c->name = strdup(name->valuestring);
    c->arguments = !args                  ? strdup("{}")
                   : cJSON_IsString(args) ? strdup(args->valuestring)
                                          : cJSON_PrintUnformatted(args);
    return c->name && c->arguments ? 0 : -1;
}

// Appends the call object o to *calls; 1 when it is not a call.
static int add_call_obj(const cJSON *o, struct api_tool_call **calls, int *n_calls) {
    struct api_tool_call c = {0};
    int rc = call_of(o, &c);
    struct api_tool_call *grown = rc ? NULL : realloc(*calls, (size_t)(*n_calls + 1) * sizeof c);
    if (rc || !grown) {
        free(c.name);
        free(c.arguments);
        return rc ? rc : -1;
    }
    *calls = grown;
    grown[(*n_calls)++] = c;
    return 0;
}

// Appends the call in JSON text s[0..n) to *calls; 1 when it is not a call.
static int add_call(const char *s, size_t n, struct api_tool_call **calls, int *n_calls) {
    cJSON *o = api_json_parse(s, n);
    if (!o)
        return 1;
    int rc = add_call_obj(o, calls, n_calls);
    cJSON_Delete(o);
    return rc;
}

// Hermes: every <tool_call>...</tool_call> (the last one may be unclosed).
static int parse_hermes(const char *text, size_t len, size_t *content_len,
                        struct api_tool_call **calls, int *n) {
    const char *end = text + len, *open = NULL;
    for (const char *p = text; p + strlen(HERMES_OPEN) <= end; p++)
        if (!memcmp(p, HERMES_OPEN, strlen(HERMES_OPEN))) {
            open = p;
            break;
        }
    if (!open)
        return 1;
    *content_len = (size_t)(open - text);
    for (const char *p = open; p < end;) {
        while (p < end && is_space(*p))
            p++;
        if (p == end)
            break;
        if ((size_t)(end - p) < strlen(HERMES_OPEN) || memcmp(p, HERMES_OPEN, strlen(HERMES_OPEN)))
            return 1; // text after a call that is not another call
        p += strlen(HERMES_OPEN);
        const char *close = p;
        while (close + strlen(HERMES_CLOSE) <= end &&
               memcmp(close, HERMES_CLOSE, strlen(HERMES_CLOSE)))
            close++;
        if (close + strlen(HERMES_CLOSE) > end)
            close = end;
        int rc = add_call(p, (size_t)(close - p), calls, n);
        if (rc)
            return rc;
        p = close == end ? end : close + strlen(HERMES_CLOSE);
    }
    return 0;
}

// Llama 3: the whole answer is one call, or calls separated by ';'.
static int parse_llama3(const char *text, size_t len, size_t *content_len,
                        struct api_tool_call **calls, int *n) {
    const char *p = text, *end = text + len;
    while (p < end && is_space(*p))
        p++;
    if ((size_t)(end - p) >= strlen(LLAMA3_PYTHON_TAG) &&
        !memcmp(p, LLAMA3_PYTHON_TAG, strlen(LLAMA3_PYTHON_TAG)))
        p += strlen(LLAMA3_PYTHON_TAG);
    while (p < end && is_space(*p))
        p++;
    if (p == end || *p != '{')
        return 1;
    *content_len = 0;
    while (p < end) {
        // the object's end: the first ';' outside strings at depth 0, or the end
        const char *q = p;
        int depth = 0;
        bool in_str = false;
        for (; q < end && (in_str || depth > 0 || *q != ';'); q++) {
            if (in_str) {
                if (*q == '\\' && q + 1 < end)
                    q++;
                else if (*q == '"')
                    in_str = false;
            } else if (*q == '"') {
                in_str = true;
            } else if (*q == '{' || *q == '[') {
                depth++;
            } else if (*q == '}' || *q == ']') {
                depth--;
            }
        }
        int rc = add_call(p, (size_t)(q - p), calls, n);
        if (rc)
            return rc;
        p = q < end ? q + 1 : end;
        while (p < end && is_space(*p))
            p++;
    }
    return 0;
}

// Mistral: [TOOL_CALLS] and a JSON array of calls (or one call) to the end;
// without the marker, an answer that is such an array alone (a forced call:
// a grammar cannot make the control token).
static int parse_mistral(const char *text, size_t len, size_t *content_len,
                         struct api_tool_call **calls, int *n) {
    const char *p = text, *end = text + len;
    const size_t ml = strlen(MISTRAL_CALLS);
    const char *mark = NULL;
    for (const char *q = text; q + ml <= end && !mark; q++)
        if (!memcmp(q, MISTRAL_CALLS, ml))
            mark = q;
    if (mark) {
        *content_len = (size_t)(mark - text);
        p = mark + ml;
    } else {
        *content_len = 0;
    }
    while (p < end && is_space(*p))
        p++;
    if (p == end || (*p != '[' && (!mark || *p != '{')))
        return 1;
    cJSON *v = api_json_parse(p, (size_t)(end - p));
    if (!v)
        return 1;
    int rc = cJSON_IsArray(v) && !v->child ? 1 : 0;
    if (cJSON_IsArray(v))
        for (const cJSON *c = v->child; c && !rc; c = c->next)
            rc = add_call_obj(c, calls, n);
    else
        rc = add_call_obj(v, calls, n);
    cJSON_Delete(v);
    return rc;
}

int toolcall_parse(enum toolcall_format f, const char *text, size_t len, const char *id_prefix,
                   size_t *content_len, struct api_tool_call **calls, int *n_calls) {
    *calls = NULL;
    *n_calls = 0;
    *content_len = len;
    int rc = f == TOOLCALL_HERMES    ? parse_hermes(text, len, content_len, calls, n_calls)
             : f == TOOLCALL_LLAMA3  ? parse_llama3(text, len, content_len, calls, n_calls)
             : f == TOOLCALL_MISTRAL ? parse_mistral(text, len, content_len, calls, n_calls)
                                     : 1;
    if (rc) { // not calls after all: the whole text is content
        api_tools_calls_free(*calls, *n_calls);
        *calls = NULL;
        *n_calls = 0;
        *content_len = len;
        return rc < 0 ? -1 : 0;
    }
    while (*content_len > 0 && is_space(text[*content_len - 1]))
        (*content_len)--;
    for (int i = 0; i < *n_calls; i++) {
        char id[96];
        snprintf(id, sizeof id, "%s_%d", id_prefix, i);
        if (f == TOOLCALL_MISTRAL) {
            char m[MISTRAL_ID_LEN + 1];
            mistral_id(id, m);
            memcpy(id, m, sizeof m);
        }
        if (!((*calls)[i].id = strdup(id)))
            return -1;
    }
    return 0;
}

// The bytes of text[0..len) before marker or what may begin it at the end.
static size_t before_marker(const char *marker, const char *text, size_t len) {
    const size_t n = strlen(marker);
    for (size_t i = 0; i < len; i++) {
        const size_t m = len - i < n ? len - i : n;
        if (!memcmp(text + i, marker, m))
            return i; // a call, or what may become one
    }
    return len;
}

size_t toolcall_stream_safe(enum toolcall_format f, const char *text, size_t len) {
    if (f == TOOLCALL_HERMES)
        return before_marker(HERMES_OPEN, text, len);
    if (f == TOOLCALL_MISTRAL) {
        // An answer that opens with '[' may be a bare array of calls
        // (parse_mistral) until its next character says otherwise.
        size_t i = 0;
        while (i < len && is_space(text[i]))
            i++;
        size_t j = i + 1;
        while (j < len && is_space(text[j]))
            j++;
        if (i < len && text[i] == '[' && (j == len || text[j] == '{'))
            return 0;
        return before_marker(MISTRAL_CALLS, text, len);
    }
    if (f == TOOLCALL_LLAMA3) {
        size_t i = 0;
        while (i < len && is_space(text[i]))
            i++;
        const size_t n = strlen(LLAMA3_PYTHON_TAG), m = len - i < n ? len - i : n;
        if (i == len || text[i] == '{' || !memcmp(text + i, LLAMA3_PYTHON_TAG, m))
            return 0; // the answer may be a call: nothing is content yet
        return len;
    }
    return len;
}

// --- forced calls ------------------------------------------------------------------

// The JSON schema of a call of tool t in format f: {"name": const, and its
// arguments (Hermes) or parameters (Llama 3) as the tool's schema}. The
// tool's $defs / definitions move to the top, where its "#/..." references
// point from.
static cJSON *call_schema(enum toolcall_format f, const struct api_tool *t, cJSON *top) {
    cJSON *params = t->parameters ? cJSON_Parse(t->parameters) : cJSON_CreateObject();
    cJSON *o = cJSON_CreateObject(), *props = cJSON_CreateObject(), *name = cJSON_CreateObject();
    cJSON *req = cJSON_CreateArray();
    if (!params || !o || !props || !name || !req) {
        cJSON_Delete(params), cJSON_Delete(o), cJSON_Delete(props), cJSON_Delete(name);
        cJSON_Delete(req);
        return NULL;
    }
    static const char *const defs[] = {"$defs", "definitions"};
    for (int i = 0; i < 2; i++) {
        cJSON *d = cJSON_DetachItemFromObjectCaseSensitive(params, defs[i]);
        cJSON *have = d ? cJSON_GetObjectItemCaseSensitive(top, defs[i]) : NULL;
        if (d && !have) {
            cJSON_AddItemToObject(top, defs[i], d);
            continue;
        }
        while (d && d->child) // several tools' definitions: merged
            cJSON_AddItemToObject(have, d->child->string, cJSON_DetachItemViaPointer(d, d->child));
        cJSON_Delete(d);
    }
    const char *args = f == TOOLCALL_LLAMA3 ? "parameters" : "arguments";
    cJSON_AddStringToObject(o, "type", "object");
    cJSON_AddStringToObject(name, "const", t->name);
    cJSON_AddItemToObject(props, "name", name);
    cJSON_AddItemToObject(props, args, params);
    cJSON_AddItemToObject(o, "properties", props);
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(args));
    cJSON_AddItemToObject(o, "required", req);
    return o;
}

// The schema of any call r allows: the named tool's, or anyOf every tool's.
static cJSON *calls_schema(enum toolcall_format f, const struct api_request *r) {
    cJSON *top = cJSON_CreateObject(), *any = cJSON_CreateArray();
    if (!top || !any) {
        cJSON_Delete(top), cJSON_Delete(any);
        return NULL;
    }
    cJSON_AddItemToObject(top, "anyOf", any);
    for (int i = 0; i < r->tools.n; i++) {
        const struct api_tool *t = &r->tools.list[i];
        if (r->tools.choice == API_TOOL_CHOICE_NAMED && strcmp(t->name, r->tools.choice_name))
            continue;
        cJSON *c = call_schema(f, t, top);
        if (!c) {
            cJSON_Delete(top);
            return NULL;
        }
        cJSON_AddItemToArray(any, c);
    }
    return top;
}

int toolcall_grammar(enum chat_template t, const struct api_request *r, char **gbnf,
                     struct api_error *e) {
    const enum toolcall_format f = toolcall_format_of(t);
    if (f == TOOLCALL_NONE)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "'tools': the model's chat template '%s' has no tool-call format in vela "
                        "(templates with one: chatml (Hermes / Qwen), llama3, mistral-v3, "
                        "mistral-v3-tekken, mistral-v7, mistral-v7-tekken, gpt-oss)",
                        chat_template_name(t));
    if (f == TOOLCALL_HARMONY)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "'tool_choice': a forced call (required or a named function) is not "
                        "supported for gpt-oss's harmony format yet; use auto");
    cJSON *schema = calls_schema(f, r);
    if (!schema)
        return api_fail(e, 500, "server_error", NULL, "out of memory");
    char *call = NULL;
    struct verr err = {0};
    int rc = json_schema_to_gbnf(schema, &call, &err);
    cJSON_Delete(schema);
    if (rc)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "'tools': a parameters schema: %s", err.msg);
    // The schema's start rule becomes "call"; root wraps it in the format.
    struct buf b = {0};
    const char *nl = strstr(call, "\nroot ::=");
    const size_t at = !strncmp(call, "root ::=", 8) ? 0 : nl ? (size_t)(nl + 1 - call) : SIZE_MAX;
    const bool many = r->tools.parallel && f != TOOLCALL_LLAMA3;
    rc = at == SIZE_MAX || buf_add(&b, call, at) || add_str(&b, "call ::=") ||
         add_str(&b, call + at + 8);
    if (!rc && f == TOOLCALL_HERMES)
        rc = add_str(&b, many ? "root ::= tc (\"\\n\" tc)*\ntc ::= \"<tool_call>\\n\" call "
                                "\"\\n</tool_call>\"\n"
                              : "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
    else if (!rc && f == TOOLCALL_MISTRAL) // the array that follows [TOOL_CALLS]
        rc = add_str(&b, many ? "root ::= \"[\" call (\", \" call)* \"]\"\n"
                              : "root ::= \"[\" call \"]\"\n");
    else if (!rc)
        rc = add_str(&b, "root ::= call\n");
    free(call);
    if (rc) {
        buf_free(&b);
        return api_fail(e, 500, "server_error", NULL, "the tool call's grammar");
    }
    *gbnf = b.p;
    return 0;
}
