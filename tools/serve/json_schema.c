// JSON schema -> GBNF (json_schema.h), following llama.cpp's
// common/json-schema-to-grammar.cpp: its primitive rules, rule naming,
// object layout and whitespace (SPACE_RULE).
#include "tools/serve/json_schema.h"

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// llama.cpp's SPACE_RULE: nothing, one space, or one or two line breaks and
// up to 20 spaces or tabs of indentation.
#define SPACE_RULE "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}"

struct prim {
    const char *name, *body, *deps[6];
};

static const struct prim PRIMS[] = {
    {"boolean", "(\"true\" | \"false\") space", {0}},
    {"decimal-part", "[0-9]{1,16}", {0}},
    {"integral-part", "[0] | [1-9] [0-9]{0,15}", {0}},
    {"number",
     "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space",
     {"integral-part", "decimal-part"}},
    {"integer", "(\"-\"? integral-part) space", {"integral-part"}},
    {"value",
     "object | array | string | number | boolean | null",
     {"object", "array", "string", "number", "boolean", "null"}},
    {"object",
     "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" "
     "space",
     {"string", "value"}},
    {"array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", {"value"}},
    {"uuid",
     "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} "
     "\"-\" [0-9a-fA-F]{12} \"\\\"\" space",
     {0}},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})", {0}},
    {"string", "\"\\\"\" char* \"\\\"\" space", {"char"}},
    {"null", "\"null\" space", {0}},
    // string formats
    {"date",
     "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] "
     ")",
     {0}},
    {"time",
     "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? ( \"Z\" | "
     "( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
     {0}},
    {"date-time", "date \"T\" time", {"date", "time"}},
    {"date-string", "\"\\\"\" date \"\\\"\" space", {"date"}},
    {"time-string", "\"\\\"\" time \"\\\"\" space", {"time"}},
    {"date-time-string", "\"\\\"\" date-time \"\\\"\" space", {"date-time"}},
};
#define N_PRIMS (sizeof PRIMS / sizeof PRIMS[0])

static const struct prim *prim_find(const char *name) {
    for (size_t i = 0; i < N_PRIMS; i++)
        if (!strcmp(PRIMS[i].name, name))
            return &PRIMS[i];
    return NULL;
}

// Keywords that constrain values in ways a grammar here cannot express.
static const char *const UNSUPPORTED[] = {"multipleOf",
                                          "pattern",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "uniqueItems",
                                          "contains",
                                          "minContains",
                                          "maxContains",
                                          "not",
                                          "if",
                                          "then",
                                          "else",
                                          "allOf",
                                          "patternProperties",
                                          "propertyNames",
                                          "dependentSchemas",
                                          "dependentRequired",
                                          "minProperties",
                                          "maxProperties",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "prefixItems",
                                          "$dynamicRef",
                                          "dependencies",
                                          "additionalItems"};

// --- strings -------------------------------------------------------------------------

struct sb {
    char *s;
    size_t n, cap;
    bool oom;
};

static void sb_add(struct sb *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_cat(struct sb *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static void sb_printf(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sb *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        b->oom = true;
    else if ((size_t)n < sizeof tmp)
        sb_add(b, tmp, (size_t)n);
    else {
        char *big = malloc((size_t)n + 1);
        if (!big) {
            b->oom = true;
            return;
        }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        sb_add(b, big, (size_t)n);
        free(big);
    }
}

// s as a GBNF string literal (llama.cpp's format_literal).
static void sb_literal(struct sb *b, const char *s) {
    sb_cat(b, "\"");
    for (; *s; s++) {
        if (*s == '\r')
            sb_cat(b, "\\r");
        else if (*s == '\n')
            sb_cat(b, "\\n");
        else if (*s == '"')
            sb_cat(b, "\\\"");
        else if (*s == '\\')
            sb_cat(b, "\\\\");
        else
            sb_add(b, s, 1);
    }
    sb_cat(b, "\"");
}

// --- the converter -------------------------------------------------------------------

struct rule {
    char *name, *body;
};

struct conv {
    const cJSON *root;
    struct rule *rules;
    size_t n_rules, cap_rules;
    const char *resolving[64]; // $refs being expanded (a recursive one refers to its rule)
    int n_resolving;
    int depth;
    struct verr *err;
    int rc;
};

// Fails the conversion (the first error wins); returns NULL for callers.
static const char *fail(struct conv *c, int code, const char *ptr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static const char *fail(struct conv *c, int code, const char *ptr, const char *fmt, ...) {
    if (c->rc)
        return NULL;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rc = verr_set(c->err, code, "%s: %s", *ptr ? ptr : "(root)", msg);
    return NULL;
}

static struct rule *rule_find(struct conv *c, const char *name) {
    for (size_t i = 0; i < c->n_rules; i++)
        if (!strcmp(c->rules[i].name, name))
            return &c->rules[i];
    return NULL;
}

static const char *rule_put(struct conv *c, const char *name, const char *body) {
    struct rule *r = rule_find(c, name);
    if (r) {
        char *nb = strdup(body);
        if (!nb)
            return fail(c, VERR_NOMEM, "", "out of host memory");
        free(r->body);
        r->body = nb;
        return r->name;
    }
    if (c->n_rules == c->cap_rules) {
        size_t cap = c->cap_rules ? c->cap_rules * 2 : 32;
        struct rule *rs = realloc(c->rules, cap * sizeof *rs);
        if (!rs)
            return fail(c, VERR_NOMEM, "", "out of host memory");
        c->rules = rs;
        c->cap_rules = cap;
    }
    char *nm = strdup(name), *nb = strdup(body);
    if (!nm || !nb) {
        free(nm);
        free(nb);
        return fail(c, VERR_NOMEM, "", "out of host memory");
    }
    c->rules[c->n_rules++] = (struct rule){nm, nb};
    return nm;
}

// llama.cpp's _add_rule: the name with runs of other characters than
// [a-zA-Z0-9-] made '-', numbered when another rule already has it.
static const char *add_rule(struct conv *c, const char *name, const char *body) {
    if (c->rc || !body)
        return NULL;
    struct sb esc = {0};
    for (const char *s = name; *s;) {
        const bool ok = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                        (*s >= '0' && *s <= '9') || *s == '-';
        if (ok) {
            sb_add(&esc, s++, 1);
            continue;
        }
        sb_cat(&esc, "-");
        while (*s && !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                       (*s >= '0' && *s <= '9') || *s == '-'))
            s++;
    }
    sb_cat(&esc, "");
    if (esc.oom)
        return fail(c, VERR_NOMEM, "", "out of host memory");
    const char *out = NULL;
    struct rule *r = rule_find(c, esc.s);
    if (!r || !strcmp(r->body, body)) {
        out = rule_put(c, esc.s, body);
    } else {
        char key[600];
        for (int i = 0;; i++) {
            snprintf(key, sizeof key, "%.500s%d", esc.s, i);
            r = rule_find(c, key);
            if (!r || !strcmp(r->body, body))
                break;
        }
        out = rule_put(c, key, body);
    }
    free(esc.s);
    return out;
}

static const char *add_prim(struct conv *c, const char *name, const struct prim *p) {
    const char *n = add_rule(c, name, p->body);
    for (int i = 0; i < 6 && p->deps[i] && n; i++)
        if (!rule_find(c, p->deps[i]))
            add_prim(c, p->deps[i], prim_find(p->deps[i]));
    return c->rc ? NULL : n;
}

static bool is_reserved(const char *name) {
    return !strcmp(name, "root") || prim_find(name) != NULL;
}

// "<name>-<suffix>", or the suffix alone for the root's parts.
static void sub_name(char *out, size_t cap, const char *name, const char *suffix) {
    snprintf(out, cap, "%s%s%s", name, *name ? "-" : "", suffix);
}

// JSON pointer of a child: ptr + "/" + key with '~' and '/' escaped (out
// may be ptr).
static void sub_ptr(char *out, size_t cap, const char *ptr, const char *key) {
    char buf[1024];
    size_t n = 0;
    for (; *ptr && n + 1 < sizeof buf; ptr++)
        buf[n++] = *ptr;
    if (n + 1 < sizeof buf)
        buf[n++] = '/';
    for (; *key && n + 3 < sizeof buf; key++) {
        if (*key == '~' || *key == '/') {
            buf[n++] = '~';
            buf[n++] = *key == '~' ? '0' : '1';
        } else {
            buf[n++] = *key;
        }
    }
    buf[n] = '\0';
    snprintf(out, cap, "%s", buf);
}

static const char *visit(struct conv *c, const cJSON *s, const char *name, const char *ptr);

// llama.cpp's build_repetition: item min..max times (max INT_MAX: no
// bound), separated by sep when sep is not empty.
static void repetition(struct sb *b, const char *item, int min, int max, const char *sep) {
    const bool has_max = max != INT_MAX;
    if (max == 0)
        return;
    if (min == 0 && max == 1) {
        sb_printf(b, "%s?", item);
        return;
    }
    if (!*sep) {
        if (min == 1 && !has_max)
            sb_printf(b, "%s+", item);
        else if (min == 0 && !has_max)
            sb_printf(b, "%s*", item);
        else if (has_max)
            sb_printf(b, "%s{%d,%d}", item, min, max);
        else
            sb_printf(b, "%s{%d,}", item, min);
        return;
    }
    struct sb inner = {0};
    sb_printf(&inner, "(%s %s)", sep, item);
    if (min == 0)
        sb_cat(b, "(");
    sb_printf(b, "%s ", item);
    repetition(b, inner.s ? inner.s : "", min == 0 ? 0 : min - 1, has_max ? max - 1 : max, "");
    if (min == 0)
        sb_cat(b, ")?");
    if (inner.oom)
        b->oom = true;
    free(inner.s);
}

// A code point as a one-character class member.
static void class_cp(struct sb *b, uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
        cp == '_' || cp == ' ')
        sb_printf(b, "%c", (char)cp);
    else if (cp < 0x100)
        sb_printf(b, "\\x%02X", cp);
    else if (cp < 0x10000)
        sb_printf(b, "\\u%04X", cp);
    else
        sb_printf(b, "\\U%08X", cp);
}

// The code points of a UTF-8 string (malformed bytes as themselves).
static size_t utf8_cps(const char *s, uint32_t *out, size_t cap) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n < cap;) {
        int len = *p < 0x80 ? 1 : *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : *p >= 0xC0 ? 2 : 1;
        uint32_t v = len == 1 ? *p : *p & (0x7Fu >> len);
        int k = 1;
        for (; k < len && (p[k] & 0xC0) == 0x80; k++)
            v = (v << 6) | (p[k] & 0x3Fu);
        out[n++] = k == len ? v : *p;
        p += k == len ? len : 1;
    }
    return n;
}

struct name_cps {
    uint32_t cps[256];
    size_t n;
};

// llama.cpp's _not_strings over names[lo, hi) (sorted), sharing their first
// d code points: a JSON key that is none of them.
static void not_strings_node(struct sb *b, const struct name_cps *names, size_t lo, size_t hi,
                             size_t d, const char *char_rule) {
    struct sb rejects = {0};
    bool first = true;
    size_t i = lo;
    while (i < hi && names[i].n == d)
        i++; // a name that ends here
    while (i < hi) {
        const uint32_t cp = names[i].cps[d];
        size_t j = i;
        bool ends = false, longer = false;
        while (j < hi && names[j].n > d && names[j].cps[d] == cp) {
            ends |= names[j].n == d + 1;
            longer |= names[j].n > d + 1;
            j++;
        }
        class_cp(&rejects, cp);
        if (!first)
            sb_cat(b, " | ");
        first = false;
        sb_cat(b, "[");
        class_cp(b, cp);
        sb_cat(b, "]");
        if (longer) {
            sb_cat(b, " (");
            not_strings_node(b, names, i, j, d + 1, char_rule);
            sb_cat(b, ")");
        } else if (ends) {
            sb_printf(b, " %s+", char_rule);
        }
        i = j;
    }
    if (!first)
        sb_printf(b, " | [^\"%s] %s*", rejects.s ? rejects.s : "", char_rule);
    free(rejects.s);
}

static int cmp_name_cps(const void *a, const void *b) {
    const struct name_cps *x = a, *y = b;
    for (size_t i = 0; i < x->n && i < y->n; i++)
        if (x->cps[i] != y->cps[i])
            return x->cps[i] < y->cps[i] ? -1 : 1;
    return (x->n > y->n) - (x->n < y->n);
}

// A JSON string that is none of the property names of props.
static void not_strings(struct conv *c, struct sb *b, const cJSON *props) {
    const char *char_rule = add_prim(c, "char", prim_find("char"));
    const int n = cJSON_GetArraySize(props);
    struct name_cps *names = calloc((size_t)n, sizeof *names);
    if (!names || !char_rule) {
        free(names);
        fail(c, VERR_NOMEM, "", "out of host memory");
        return;
    }
    int k = 0;
    bool empty_name = false;
    for (const cJSON *p = props->child; p; p = p->next, k++) {
        names[k].n = utf8_cps(p->string, names[k].cps, 256);
        empty_name |= names[k].n == 0;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_name_cps);
    sb_cat(b, "[\"] ( ");
    not_strings_node(b, names, 0, (size_t)n, 0, char_rule);
    sb_printf(b, " )%s [\"] space", empty_name ? "" : "?");
    free(names);
}

// "{" required kv's, then the optional ones in declared order, each after
// the ones before it (llama.cpp's _build_object_rule and its "-rest" rules).
// keys[i] / kvs[i]: the optional properties' names ("*" for additional
// properties) and their kv rules.
static void optional_chain(struct conv *c, struct sb *b, const char *name, char **keys,
                           const char **kvs, int n, bool first_optional) {
    if (n == 0)
        return;
    const bool star = !strcmp(keys[0], "*");
    if (first_optional)
        sb_printf(b, "( \",\" space %s )%s", kvs[0], star ? "*" : "?");
    else if (star)
        sb_printf(b, "%s ( \",\" space %s )*", kvs[0], kvs[0]);
    else
        sb_cat(b, kvs[0]);
    if (n > 1) {
        struct sb rest = {0};
        optional_chain(c, &rest, name, keys + 1, kvs + 1, n - 1, true);
        char rn[512];
        snprintf(rn, sizeof rn, "%s%s%s-rest", name, *name ? "-" : "", keys[0]);
        const char *r = add_rule(c, rn, rest.s ? rest.s : "");
        if (r)
            sb_printf(b, " %s", r);
        free(rest.s);
    }
}

static bool is_required(const cJSON *req, const char *key) {
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, key))
            return true;
    return false;
}

static const char *object_rule(struct conv *c, const cJSON *s, const char *name,
                               const char *rule_name, const char *ptr) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char pp[1024], nm[512];
    if (props && !cJSON_IsObject(props))
        return fail(c, VERR_FORMAT, ptr, "'properties' must be an object");
    if (req && !cJSON_IsArray(req))
        return fail(c, VERR_FORMAT, ptr, "'required' must be an array");
    const int n = props ? cJSON_GetArraySize(props) : 0;
    const char **kv = calloc((size_t)n + 1, sizeof *kv),
               **opt_kv = calloc((size_t)n + 1, sizeof *kv);
    char **opt_key = calloc((size_t)n + 1, sizeof *opt_key);
    struct sb b = {0};
    int n_opt = 0, n_req = 0;
    if (!kv || !opt_kv || !opt_key) {
        fail(c, VERR_NOMEM, ptr, "out of host memory");
        goto out;
    }
    sb_cat(&b, "\"{\" space ");
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p && !c->rc; p = p->next, i++) {
        sub_ptr(pp, sizeof pp, ptr, "properties");
        sub_ptr(pp, sizeof pp, pp, p->string);
        sub_name(nm, sizeof nm, name, p->string);
        const char *value = visit(c, p, nm, pp);
        struct sb body = {0};
        char *key_json =
            cJSON_PrintUnformatted(&(cJSON){.type = cJSON_String, .valuestring = p->string});
        sb_literal(&body, key_json ? key_json : "\"\"");
        free(key_json);
        sb_printf(&body, " space \":\" space %s", value ? value : "");
        char kvn[600];
        snprintf(kvn, sizeof kvn, "%s-kv", nm);
        kv[i] = value ? add_rule(c, kvn, body.s) : NULL;
        free(body.s);
        if (!kv[i])
            goto out;
        if (is_required(req, p->string)) {
            sb_printf(&b, "%s%s", n_req++ ? " \",\" space " : "", kv[i]);
        } else {
            opt_key[n_opt] = p->string;
            opt_kv[n_opt++] = kv[i];
        }
    }
    if (addl && (cJSON_IsTrue(addl) || cJSON_IsObject(addl))) {
        char sub[512], vn[600], kn[600];
        sub_name(sub, sizeof sub, name, "additional");
        snprintf(vn, sizeof vn, "%s-value", sub);
        sub_ptr(pp, sizeof pp, ptr, "additionalProperties");
        const char *value = cJSON_IsObject(addl) ? visit(c, addl, vn, pp)
                                                 : add_prim(c, "value", prim_find("value"));
        const char *key = NULL;
        if (n == 0) {
            key = add_prim(c, "string", prim_find("string"));
        } else {
            struct sb ks = {0};
            not_strings(c, &ks, props);
            snprintf(kn, sizeof kn, "%s-k", sub);
            key = add_rule(c, kn, ks.s);
            free(ks.s);
        }
        struct sb body = {0};
        sb_printf(&body, "%s \":\" space %s", key ? key : "", value ? value : "");
        snprintf(kn, sizeof kn, "%s-kv", sub);
        opt_kv[n_opt] = key && value ? add_rule(c, kn, body.s) : NULL;
        opt_key[n_opt++] = "*";
        free(body.s);
    }
    if (n_opt > 0 && !c->rc) {
        sb_cat(&b, " (");
        if (n_req)
            sb_cat(&b, " \",\" space ( ");
        for (int k = 0; k < n_opt; k++) {
            if (k)
                sb_cat(&b, " | ");
            optional_chain(c, &b, name, opt_key + k, opt_kv + k, n_opt - k, false);
        }
        if (n_req)
            sb_cat(&b, " )");
        sb_cat(&b, " )?");
    }
    sb_cat(&b, " \"}\" space");
out:;
    const char *r = c->rc ? NULL : add_rule(c, rule_name, b.s);
    free(b.s);
    free(kv);
    free(opt_kv);
    free(opt_key);
    return r;
}

// The schema a "#/..." reference points to inside the root, or NULL.
static const cJSON *resolve_pointer(const cJSON *root, const char *ref) {
    if (ref[0] != '#')
        return NULL;
    const cJSON *t = root;
    for (const char *p = ref + 1; *p == '/' && t;) {
        char key[512];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof key; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1'))
                key[n++] = *++p == '0' ? '~' : '/';
            else
                key[n++] = *p;
        }
        key[n] = '\0';
        if (cJSON_IsArray(t)) {
            char *end;
            long idx = strtol(key, &end, 10);
            t = *end || idx < 0 ? NULL : cJSON_GetArrayItem(t, (int)idx);
        } else {
            t = cJSON_GetObjectItemCaseSensitive(t, key);
        }
    }
    return t;
}

// A $ref: its rule "ref" + the pointer with other characters than
// [a-zA-Z0-9-] made '-', expanded once (a recursive reference uses the name).
static const char *visit_ref(struct conv *c, const cJSON *ref, const char *rule_name,
                             const char *ptr) {
    if (!cJSON_IsString(ref))
        return fail(c, VERR_FORMAT, ptr, "'$ref' must be a string");
    const char *r = ref->valuestring;
    const cJSON *target = resolve_pointer(c->root, r);
    if (!target)
        return fail(c, VERR_UNSUPPORTED, ptr,
                    "$ref '%s' does not point into this schema (#/$defs/..., #/definitions/...)",
                    r);
    struct sb nm = {0};
    sb_cat(&nm, "ref");
    for (const char *p = strchr(r, '#') + 1; *p;) {
        const bool ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                        (*p >= '0' && *p <= '9') || *p == '-';
        if (ok) {
            sb_add(&nm, p++, 1);
            continue;
        }
        sb_cat(&nm, "-");
        while (*p && !((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                       (*p >= '0' && *p <= '9') || *p == '-'))
            p++;
    }
    const char *name = nm.s;
    bool busy = false;
    for (int i = 0; i < c->n_resolving; i++)
        busy |= !strcmp(c->resolving[i], r);
    if (!rule_find(c, nm.s) && !busy) {
        if (c->n_resolving == 64) {
            free(nm.s);
            return fail(c, VERR_UNSUPPORTED, ptr, "$ref chains deeper than 64");
        }
        c->resolving[c->n_resolving++] = r;
        name = visit(c, target, nm.s, r + 1);
        c->n_resolving--;
    }
    const char *out = name ? add_rule(c, rule_name, name) : NULL;
    free(nm.s);
    return out;
}

// anyOf / oneOf, or a list of types: the alternatives' rules joined by '|'.
static const char *visit_union(struct conv *c, const cJSON *alts, const cJSON *s, const char *name,
                               const char *rule_name, const char *ptr, const char *key) {
    struct sb b = {0};
    char nm[512], pp[1024], idx[16];
    int i = 0;
    for (const cJSON *a = alts->child; a && !c->rc; a = a->next, i++) {
        snprintf(idx, sizeof idx, "%d", i);
        snprintf(nm, sizeof nm, "%s%s%d", name, *name ? "-" : "alternative-", i);
        sub_ptr(pp, sizeof pp, ptr, key);
        sub_ptr(pp, sizeof pp, pp, idx);
        const char *r;
        if (s) { // a list of types: the schema with one of them
            cJSON *copy = cJSON_Duplicate(s, true);
            if (!copy ||
                !cJSON_ReplaceItemInObjectCaseSensitive(copy, "type", cJSON_Duplicate(a, true))) {
                cJSON_Delete(copy);
                free(b.s);
                return fail(c, VERR_NOMEM, ptr, "out of host memory");
            }
            r = visit(c, copy, nm, ptr);
            cJSON_Delete(copy);
        } else {
            r = visit(c, a, nm, pp);
        }
        if (r)
            sb_printf(&b, "%s%s", i ? " | " : "", r);
    }
    if (i == 0)
        fail(c, VERR_FORMAT, ptr, "'%s' must be a non-empty array", key);
    const char *out = c->rc ? NULL : add_rule(c, rule_name, b.s);
    free(b.s);
    return out;
}

// enum / const: the values' JSON text as literals.
static const char *visit_values(struct conv *c, const cJSON *vals, bool one, const char *rule_name,
                                const char *ptr) {
    struct sb b = {0};
    if (!one && (!cJSON_IsArray(vals) || !vals->child)) {
        return fail(c, VERR_FORMAT, ptr, "'enum' must be a non-empty array");
    }
    sb_cat(&b, one ? "" : "(");
    int i = 0;
    for (const cJSON *v = one ? vals : vals->child; v; v = one ? NULL : v->next, i++) {
        char *txt = cJSON_PrintUnformatted(v);
        if (i)
            sb_cat(&b, " | ");
        sb_literal(&b, txt ? txt : "null");
        free(txt);
    }
    sb_cat(&b, one ? " space" : ") space");
    const char *out = add_rule(c, rule_name, b.s);
    free(b.s);
    return out;
}

static int get_int(struct conv *c, const cJSON *s, const char *key, int def, const char *ptr) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v)
        return def;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 ||
        v->valuedouble != (double)(int)v->valuedouble) {
        fail(c, VERR_FORMAT, ptr, "'%s' must be an integer from 0 to 1000000", key);
        return def;
    }
    return (int)v->valuedouble;
}

static const char *visit_array(struct conv *c, const cJSON *s, const cJSON *items, const char *name,
                               const char *rule_name, const char *ptr) {
    char nm[512], pp[1024], idx[16];
    struct sb b = {0};
    sub_ptr(pp, sizeof pp, ptr, "items");
    if (cJSON_IsArray(items)) { // a tuple
        sb_cat(&b, "\"[\" space ");
        int i = 0;
        for (const cJSON *it = items->child; it && !c->rc; it = it->next, i++) {
            char tn[32], ip[1024];
            snprintf(tn, sizeof tn, "tuple-%d", i);
            snprintf(idx, sizeof idx, "%d", i);
            sub_name(nm, sizeof nm, name, tn);
            sub_ptr(ip, sizeof ip, pp, idx);
            const char *r = visit(c, it, nm, ip);
            sb_printf(&b, "%s%s", i ? " \",\" space " : "", r ? r : "");
        }
        sb_cat(&b, " \"]\" space");
    } else {
        sub_name(nm, sizeof nm, name, "item");
        const char *item = visit(c, items, nm, pp);
        const int min = get_int(c, s, "minItems", 0, ptr),
                  max = get_int(c, s, "maxItems", INT_MAX, ptr);
        if (max < min)
            fail(c, VERR_FORMAT, ptr, "maxItems %d is below minItems %d", max, min);
        sb_cat(&b, "\"[\" space ");
        repetition(&b, item ? item : "", min, max, "\",\" space");
        sb_cat(&b, " \"]\" space");
    }
    const char *out = c->rc ? NULL : add_rule(c, rule_name, b.s);
    free(b.s);
    return out;
}

// A string with a format llama.cpp knows, or with length bounds; NULL with
// c->rc == 0 when neither applies.
static const char *visit_string(struct conv *c, const cJSON *s, const char *rule_name,
                                const char *ptr) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "";
    if (!strncmp(f, "uuid", 4) && (!f[4] || (f[4] >= '1' && f[4] <= '5' && !f[5])))
        return add_prim(c, !strcmp(rule_name, "root") ? "root" : f, prim_find("uuid"));
    if (!strcmp(f, "date") || !strcmp(f, "time") || !strcmp(f, "date-time")) {
        char pn[32];
        snprintf(pn, sizeof pn, "%s-string", f);
        const char *p = add_prim(c, pn, prim_find(pn));
        return p ? add_rule(c, rule_name, p) : NULL;
    }
    if (!cJSON_GetObjectItemCaseSensitive(s, "minLength") &&
        !cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
        return NULL;
    const char *ch = add_prim(c, "char", prim_find("char"));
    const int min = get_int(c, s, "minLength", 0, ptr),
              max = get_int(c, s, "maxLength", INT_MAX, ptr);
    if (max < min)
        fail(c, VERR_FORMAT, ptr, "maxLength %d is below minLength %d", max, min);
    struct sb b = {0};
    sb_cat(&b, "\"\\\"\" ");
    repetition(&b, ch ? ch : "", min, max, "");
    sb_cat(&b, " \"\\\"\" space");
    const char *out = c->rc ? NULL : add_rule(c, rule_name, b.s);
    free(b.s);
    return out;
}

// Refuses a keyword no grammar here can express.
static bool check_keywords(struct conv *c, const cJSON *s, const char *ptr) {
    for (size_t i = 0; i < sizeof UNSUPPORTED / sizeof UNSUPPORTED[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, UNSUPPORTED[i])) {
            fail(c, VERR_UNSUPPORTED, ptr, "keyword '%s' is not supported", UNSUPPORTED[i]);
            return false;
        }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref && s->child && s->child->next) {
        // Sibling keywords of $ref constrain too; llama.cpp drops them.
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && strcmp(k->string, "description") &&
                strcmp(k->string, "title") && strcmp(k->string, "$defs") &&
                strcmp(k->string, "definitions") && strcmp(k->string, "default") &&
                strcmp(k->string, "$schema") && strcmp(k->string, "$id") &&
                strcmp(k->string, "examples") && strcmp(k->string, "$comment")) {
                fail(c, VERR_UNSUPPORTED, ptr, "keyword '%s' beside '$ref' is not supported",
                     k->string);
                return false;
            }
    }
    return true;
}

static const char *visit_typed(struct conv *c, const cJSON *s, const cJSON *type, const char *name,
                               const char *rule_name, const char *ptr) {
    const char *t = cJSON_IsString(type) ? type->valuestring : NULL;
    const bool untyped = !type;
    if (type && !t)
        return fail(c, VERR_FORMAT, ptr, "'type' must be a string or an array of strings");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    if ((untyped || !strcmp(t, "object")) && (props || (addl && !cJSON_IsTrue(addl))))
        return object_rule(c, s, name, rule_name, ptr);
    if ((untyped || !strcmp(t, "array")) && items)
        return visit_array(c, s, items, name, rule_name, ptr);
    if (untyped || !strcmp(t, "string")) {
        const char *r = visit_string(c, s, rule_name, ptr);
        if (r || c->rc)
            return r;
    }
    if ((!s->child && untyped) || (t && !strcmp(t, "object")))
        return add_rule(c, rule_name, add_prim(c, "object", prim_find("object")));
    if (untyped)
        return add_rule(c, rule_name, add_prim(c, "value", prim_find("value")));
    static const char *const types[] = {"string", "number", "integer", "boolean", "null", "array"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(t, types[i]))
            return add_prim(c, !strcmp(rule_name, "root") ? "root" : t, prim_find(t));
    return fail(c, VERR_UNSUPPORTED, ptr, "type '%s' is not supported", t);
}

// llama.cpp's visit: the rule for schema s, named after name.
static const char *visit(struct conv *c, const cJSON *s, const char *name, const char *ptr) {
    if (c->rc)
        return NULL;
    if (++c->depth > 128) {
        c->depth--;
        return fail(c, VERR_UNSUPPORTED, ptr, "schemas nested deeper than 128");
    }
    char rule_name[520];
    snprintf(rule_name, sizeof rule_name, "%s", is_reserved(name) ? "" : *name ? name : "root");
    if (is_reserved(name))
        snprintf(rule_name, sizeof rule_name, "%.500s-", name);
    const char *out = NULL;
    const cJSON *t;
    if (cJSON_IsTrue(s))
        out = add_rule(c, rule_name, add_prim(c, "value", prim_find("value")));
    else if (!cJSON_IsObject(s))
        out = fail(c, VERR_FORMAT, ptr, "a schema must be an object or true");
    else if (!check_keywords(c, s, ptr))
        out = NULL;
    else if ((t = cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        out = visit_ref(c, t, rule_name, ptr);
    else if ((t = cJSON_GetObjectItemCaseSensitive(s, "oneOf")) ||
             (t = cJSON_GetObjectItemCaseSensitive(s, "anyOf")))
        out = cJSON_IsArray(t) ? visit_union(c, t, NULL, name, rule_name, ptr, t->string)
                               : fail(c, VERR_FORMAT, ptr, "'%s' must be an array", t->string);
    else if ((t = cJSON_GetObjectItemCaseSensitive(s, "type")) && cJSON_IsArray(t))
        out = visit_union(c, t, s, name, rule_name, ptr, "type");
    else if ((t = cJSON_GetObjectItemCaseSensitive(s, "const")))
        out = visit_values(c, t, true, rule_name, ptr);
    else if ((t = cJSON_GetObjectItemCaseSensitive(s, "enum")))
        out = visit_values(c, t, false, rule_name, ptr);
    else
        out = visit_typed(c, s, cJSON_GetObjectItemCaseSensitive(s, "type"), name, rule_name, ptr);
    c->depth--;
    return out;
}

static bool utf8_ok(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int len = *p < 0x80         ? 1
                        : (*p >> 5) == 6  ? 2
                        : (*p >> 4) == 14 ? 3
                        : (*p >> 3) == 30 ? 4
                                          : 0;
        if (!len)
            return false;
        for (int k = 1; k < len; k++)
            if ((p[k] & 0xC0) != 0x80)
                return false;
        p += len;
    }
    return true;
}

// Every key and string of the schema is UTF-8 (they become grammar text).
static bool check_utf8(struct conv *c, const cJSON *n, const char *ptr, int depth) {
    char pp[1024];
    if (cJSON_IsString(n) && !utf8_ok(n->valuestring)) {
        fail(c, VERR_FORMAT, ptr, "a string is not UTF-8");
        return false;
    }
    for (const cJSON *k = n->child; k && depth < 256; k = k->next) {
        if (k->string && !utf8_ok(k->string)) {
            fail(c, VERR_FORMAT, ptr, "a key is not UTF-8");
            return false;
        }
        sub_ptr(pp, sizeof pp, ptr, k->string ? k->string : "");
        if (!check_utf8(c, k, pp, depth + 1))
            return false;
    }
    return true;
}

static int cmp_rules(const void *a, const void *b) {
    return strcmp(((const struct rule *)a)->name, ((const struct rule *)b)->name);
}

int json_schema_to_gbnf(const cJSON *schema, char **gbnf, struct verr *err) {
    *gbnf = NULL;
    struct conv c = {.root = schema, .err = err};
    rule_put(&c, "space", SPACE_RULE);
    if (check_utf8(&c, schema, "", 0))
        visit(&c, schema, "", "");
    struct sb out = {0};
    if (!c.rc) {
        qsort(c.rules, c.n_rules, sizeof *c.rules, cmp_rules);
        for (size_t i = 0; i < c.n_rules; i++)
            sb_printf(&out, "%s ::= %s\n", c.rules[i].name, c.rules[i].body);
        if (out.oom)
            c.rc = verr_set(err, VERR_NOMEM, "out of host memory");
    }
    for (size_t i = 0; i < c.n_rules; i++) {
        free(c.rules[i].name);
        free(c.rules[i].body);
    }
    free(c.rules);
    if (c.rc) {
        free(out.s);
        return c.rc;
    }
    *gbnf = out.s;
    return 0;
}

int json_schema_text_to_gbnf(const char *text, size_t len, char **gbnf, struct verr *err) {
    *gbnf = NULL;
    const char *end = NULL;
    cJSON *s = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!s)
        return verr_set(err, VERR_FORMAT, "JSON schema: not JSON (at byte %zu)",
                        end && end >= text ? (size_t)(end - text) : (size_t)0);
    int rc = json_schema_to_gbnf(s, gbnf, err);
    cJSON_Delete(s);
    return rc;
}
