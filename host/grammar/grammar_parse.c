// The GBNF parser: llama.cpp's grammar syntax (llama_grammar_parser) into
// the flat rule encoding of grammar_impl.h, with errors that name the line
// and column.
#include "host/grammar/grammar_impl.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// llama.cpp's MAX_REPETITION_THRESHOLD: a bound in {m,n} and the product of
// nested repetitions' rule counts stay below it.
#define REPETITION_MAX 2000

struct rbuf {
    struct gelem *e;
    uint32_t n, cap;
};

struct psym {
    char *name;
    bool generated; // a group's or repetition's rule: never found by name
    bool defined;
    size_t first_use; // offset of the first reference (SIZE_MAX: none yet)
};

struct parser {
    const char *src; // NUL-terminated copy of the text
    size_t len;
    const struct grammar_opts *opts;
    struct verr *err;
    struct psym *syms;
    struct rbuf *rules; // [cap_syms], by symbol id
    uint32_t n_syms, cap_syms;
    uint32_t *table; // open addressing over user names: symbol id + 1, 0 empty
    uint32_t cap_table;
    size_t n_elems; // over every rule, for GRAMMAR_MAX_ELEMS
    bool failed;
    int code; // the error's VERR_* code once failed
};

// --- errors --------------------------------------------------------------------

// "grammar:LINE:COL: <msg>[, found <what is at pos>]" into err.
static void perr_v(struct parser *p, const char *pos, bool found, const char *fmt, va_list ap) {
    if (p->failed)
        return;
    p->failed = true;
    p->code = VERR_FORMAT;
    int line = 1, col = 1;
    for (const char *c = p->src; c < pos; c++) {
        if (*c == '\n')
            line++, col = 1;
        else if (((unsigned char)*c & 0xC0) != 0x80)
            col++;
    }
    char msg[512], what[48] = "";
    vsnprintf(msg, sizeof msg, fmt, ap);
    const unsigned char c = (unsigned char)*pos;
    if (!found)
        what[0] = '\0';
    else if (pos >= p->src + p->len)
        snprintf(what, sizeof what, ", found the end of the text");
    else if (c == '\n' || c == '\r')
        snprintf(what, sizeof what, ", found a line break");
    else if (c >= 0x20 && c < 0x7F)
        snprintf(what, sizeof what, ", found '%c'", c);
    else
        snprintf(what, sizeof what, ", found byte 0x%02X", c);
    verr_set(p->err, VERR_FORMAT, "grammar:%d:%d: %s%s", line, col, msg, what);
}

// An error at pos naming what was found there; returns NULL so callers can
// `return perr(...)`.
static const char *perr(struct parser *p, const char *pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *perr(struct parser *p, const char *pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    perr_v(p, pos, true, fmt, ap);
    va_end(ap);
    return NULL;
}

// An error at pos about the item there (nothing unexpected was found).
static const char *perr_at(struct parser *p, const char *pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *perr_at(struct parser *p, const char *pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    perr_v(p, pos, false, fmt, ap);
    va_end(ap);
    return NULL;
}

static const char *pfail(struct parser *p, int code, const char *msg) {
    if (!p->failed) {
        verr_set(p->err, code, "grammar: %s", msg);
        p->code = code;
    }
    p->failed = true;
    return NULL;
}

// --- symbols and rules ---------------------------------------------------------

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static bool table_grow(struct parser *p) {
    uint32_t cap = p->cap_table ? p->cap_table * 2 : 64;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t)
        return false;
    for (uint32_t i = 0; i < p->cap_table; i++) {
        uint32_t id = p->table[i];
        if (!id)
            continue;
        const char *nm = p->syms[id - 1].name;
        uint32_t h = name_hash(nm, strlen(nm)) & (cap - 1);
        while (t[h])
            h = (h + 1) & (cap - 1);
        t[h] = id;
    }
    free(p->table);
    p->table = t;
    p->cap_table = cap;
    return true;
}

// A new symbol (name copied); UINT32_MAX when out of memory.
static uint32_t sym_new(struct parser *p, const char *name, size_t n, bool generated) {
    if (p->n_syms == p->cap_syms) {
        uint32_t cap = p->cap_syms ? p->cap_syms * 2 : 32;
        struct psym *s = realloc(p->syms, cap * sizeof *s);
        if (s)
            p->syms = s;
        struct rbuf *r = s ? realloc(p->rules, cap * sizeof *r) : NULL;
        if (!r)
            return UINT32_MAX;
        p->rules = r;
        p->cap_syms = cap;
    }
    char *nm = malloc(n + 1);
    if (!nm)
        return UINT32_MAX;
    memcpy(nm, name, n);
    nm[n] = '\0';
    const uint32_t id = p->n_syms++;
    p->syms[id] = (struct psym){nm, generated, false, SIZE_MAX};
    p->rules[id] = (struct rbuf){0};
    return id;
}

// The id of the user rule `name`, created on first sight (llama.cpp's get_symbol_id).
static uint32_t sym_get(struct parser *p, const char *name, size_t n) {
    if ((p->n_syms + 1) * 2 > p->cap_table && !table_grow(p))
        return UINT32_MAX;
    uint32_t h = name_hash(name, n) & (p->cap_table - 1);
    for (; p->table[h]; h = (h + 1) & (p->cap_table - 1)) {
        const char *nm = p->syms[p->table[h] - 1].name;
        if (strlen(nm) == n && !memcmp(nm, name, n))
            return p->table[h] - 1;
    }
    uint32_t id = sym_new(p, name, n, false);
    if (id != UINT32_MAX)
        p->table[h] = id + 1;
    return id;
}

// A rule for a group or repetition inside rule `base`: "<base>_<id>".
static uint32_t sym_generate(struct parser *p, const char *base) {
    char nm[128];
    int n = snprintf(nm, sizeof nm, "%.100s_%u", base, p->n_syms);
    return sym_new(p, nm, (size_t)n, true);
}

static bool rb_push(struct parser *p, struct rbuf *r, uint32_t type, uint32_t value) {
    if (p->n_elems >= GRAMMAR_MAX_ELEMS) {
        pfail(p, VERR_FULL, "more than GRAMMAR_MAX_ELEMS elements (repetitions are expanded)");
        return false;
    }
    if (r->n == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 16;
        struct gelem *e = realloc(r->e, cap * sizeof *e);
        if (!e) {
            pfail(p, VERR_NOMEM, "out of host memory");
            return false;
        }
        r->e = e;
        r->cap = cap;
    }
    r->e[r->n++] = (struct gelem){type, value};
    p->n_elems++;
    return true;
}

static bool rb_append(struct parser *p, struct rbuf *r, const struct gelem *e, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!rb_push(p, r, e[i].type, e[i].value))
            return false;
    return true;
}

// Stores r as rule id (a later definition replaces an earlier one, as in llama.cpp).
static void rule_set(struct parser *p, uint32_t id, struct rbuf *r) {
    p->n_elems -= p->rules[id].n;
    free(p->rules[id].e);
    p->rules[id] = *r;
    p->syms[id].defined = true;
    *r = (struct rbuf){0};
}

// --- lexing --------------------------------------------------------------------

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

// llama.cpp's is_word_char, and '_' (its README allows `rule_123`).
static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '-' || c == '_';
}

// Spaces, tabs and comments; line breaks too when newline_ok.
static const char *skip_space(const char *s, bool newline_ok) {
    for (;;) {
        if (*s == ' ' || *s == '\t' || (newline_ok && (*s == '\r' || *s == '\n'))) {
            s++;
        } else if (*s == '#') {
            while (*s && *s != '\r' && *s != '\n')
                s++;
        } else {
            return s;
        }
    }
}

static const char *parse_hex(struct parser *p, const char *s, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        const char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return perr(p, s + i, "expected %d hex digits", n);
        v = (v << 4) | (uint32_t)d;
    }
    *out = v;
    return s + n;
}

// One character of a literal or class: an escape or a UTF-8 sequence.
static const char *parse_char(struct parser *p, const char *s, uint32_t *cp) {
    if (*s == '\\') {
        switch (s[1]) {
        case 'x':
            return parse_hex(p, s + 2, 2, cp);
        case 'u':
            return parse_hex(p, s + 2, 4, cp);
        case 'U':
            return parse_hex(p, s + 2, 8, cp);
        case 't':
            *cp = '\t';
            return s + 2;
        case 'r':
            *cp = '\r';
            return s + 2;
        case 'n':
            *cp = '\n';
            return s + 2;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
            *cp = (uint8_t)s[1];
            return s + 2;
        default:
            return perr(p, s + 1,
                        "expected an escape (\\x \\u \\U \\t \\r \\n \\\\ \\\" \\[ \\] \\-)");
        }
    }
    if (!*s)
        return perr(p, s, "expected a character");
    struct gpartial pt = {0, 0};
    for (const char *c = s;; c++) {
        int r = gutf8_push(&pt, (uint8_t)*c, cp);
        if (r < 0)
            return perr(p, c, "expected UTF-8 text");
        if (r > 0)
            return c + 1;
    }
}

// A decimal integer up to 10^9.
static const char *parse_int(struct parser *p, const char *s, uint64_t *out) {
    if (!is_digit(*s))
        return perr(p, s, "expected an integer");
    uint64_t v = 0;
    const char *c = s;
    for (; is_digit(*c); c++) {
        v = v * 10 + (uint64_t)(*c - '0');
        if (v > 1000000000u)
            return perr(p, s, "expected an integer up to 10^9");
    }
    *out = v;
    return c;
}

// --- sequences -----------------------------------------------------------------

static const char *parse_alternates(struct parser *p, const char *s, const char *rule_name,
                                    uint32_t rule_id, bool nested);

// The state of one sequence: where its last item starts, and how many rules
// that item expands to (llama.cpp's n_prev_rules, which bounds nesting).
struct seq {
    struct rbuf *rule;
    const char *rule_name;
    uint32_t last_start;
    uint64_t n_prev_rules;
};

// llama.cpp's rewrite of S{min,max} (max UINT64_MAX: unbounded):
//   S{m,n} -> S (m times) S'(n-m),  S'(x) ::= S S'(x-1) |,  S'(1) ::= S |
//   S{m,}  -> S (m times) S',       S'    ::= S S' |
static bool repeat_last(struct parser *p, struct seq *q, const char *at, uint64_t min,
                        uint64_t max) {
    const bool no_max = max == UINT64_MAX;
    struct rbuf *rule = q->rule;
    if (q->last_start == rule->n) {
        perr_at(p, at, "a repetition needs an item before it");
        return false;
    }
    if (!no_max && max < min) {
        perr_at(p, at, "the maximum is below the minimum %llu", (unsigned long long)min);
        return false;
    }
    uint64_t total = 1;
    if (!no_max && max > 0)
        total = max;
    else if (min > 0)
        total = min;
    if (q->n_prev_rules * total >= REPETITION_MAX) {
        perr_at(p, at, "nested repetitions too large (their rule counts multiply to %d or more)",
                REPETITION_MAX);
        return false;
    }
    const uint32_t n_prev = rule->n - q->last_start;
    struct gelem *prev = malloc(n_prev * sizeof *prev);
    if (!prev) {
        pfail(p, VERR_NOMEM, "out of host memory");
        return false;
    }
    memcpy(prev, rule->e + q->last_start, n_prev * sizeof *prev);
    bool ok = true;
    if (min == 0) {
        p->n_elems -= rule->n - q->last_start;
        rule->n = q->last_start;
    } else {
        for (uint64_t i = 1; i < min && ok; i++)
            ok = rb_append(p, rule, prev, n_prev);
    }
    const uint64_t n_opt = no_max ? 1 : max - min;
    uint32_t last_rec = 0;
    for (uint64_t i = 0; i < n_opt && ok; i++) {
        struct rbuf rec = {0};
        const uint32_t id = sym_generate(p, q->rule_name);
        if (id == UINT32_MAX) {
            pfail(p, VERR_NOMEM, "out of host memory");
            ok = false;
            break;
        }
        ok = rb_append(p, &rec, prev, n_prev) &&
             (!(i > 0 || no_max) || rb_push(p, &rec, GE_RULE_REF, no_max ? id : last_rec)) &&
             rb_push(p, &rec, GE_ALT, 0) && rb_push(p, &rec, GE_END, 0);
        if (ok)
            rule_set(p, id, &rec);
        free(rec.e);
        last_rec = id;
    }
    if (ok && n_opt > 0)
        ok = rb_push(p, rule, GE_RULE_REF, last_rec);
    q->n_prev_rules *= total;
    free(prev);
    return ok;
}

// "{m}", "{m,}", "{m,n}" after '{'.
static const char *parse_braces(struct parser *p, struct seq *q, const char *s, bool nested) {
    const char *at = s - 1;
    s = skip_space(s, nested);
    uint64_t min = 0, max = UINT64_MAX;
    if (!(s = parse_int(p, s, &min)))
        return NULL;
    s = skip_space(s, nested);
    if (*s == '}') {
        max = min;
    } else if (*s == ',') {
        s = skip_space(s + 1, nested);
        if (is_digit(*s)) {
            if (!(s = parse_int(p, s, &max)))
                return NULL;
            s = skip_space(s, nested);
        }
        if (*s != '}')
            return perr(p, s, "expected '}'");
    } else {
        return perr(p, s, "expected ',' or '}'");
    }
    s = skip_space(s + 1, nested);
    if (min > REPETITION_MAX)
        return perr_at(p, at, "at most %d repetitions are allowed", REPETITION_MAX);
    if (max != UINT64_MAX && max > REPETITION_MAX)
        max = UINT64_MAX; // llama.cpp: a larger bound means no bound
    return repeat_last(p, q, at, min, max) ? s : NULL;
}

// A string literal after '"'.
static const char *parse_literal(struct parser *p, struct seq *q, const char *s, bool nested) {
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    while (*s != '"') {
        uint32_t cp;
        if (!*s)
            return perr(p, s, "expected '\"' to close the string");
        if (!(s = parse_char(p, s, &cp)) || !rb_push(p, q->rule, GE_CHAR, cp))
            return NULL;
    }
    return skip_space(s + 1, nested);
}

// A character class after '['.
static const char *parse_class(struct parser *p, struct seq *q, const char *s, bool nested) {
    uint32_t start_type = GE_CHAR;
    if (*s == '^') {
        s++;
        start_type = GE_CHAR_NOT;
    }
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    while (*s != ']') {
        uint32_t cp;
        if (!*s)
            return perr(p, s, "expected ']' to close the character class");
        if (!(s = parse_char(p, s, &cp)))
            return NULL;
        const uint32_t type = q->last_start < q->rule->n ? GE_CHAR_ALT : start_type;
        if (!rb_push(p, q->rule, type, cp))
            return NULL;
        if (s[0] == '-' && s[1] != ']') {
            if (!(s = parse_char(p, s + 1, &cp)) || !rb_push(p, q->rule, GE_CHAR_RNG_UPPER, cp))
                return NULL;
        }
    }
    return skip_space(s + 1, nested);
}

// A token element: "<[id]>" or "<text>" (after an optional '!').
static const char *parse_token(struct parser *p, struct seq *q, const char *s, uint32_t type,
                               bool nested) {
    if (*s != '<')
        return perr(p, s, "expected '<' after '!'");
    const char *t = s + 1;
    uint64_t id = 0;
    if (*t == '[') {
        if (!(t = parse_int(p, t + 1, &id)))
            return NULL;
        if (*t != ']')
            return perr(p, t, "expected ']'");
        if (*++t != '>')
            return perr(p, t, "expected '>'");
    } else {
        while (*t && *t != '>')
            t++;
        if (*t != '>')
            return perr(p, t, "expected '>' to close the token");
        if (!p->opts || !p->opts->find_token)
            return perr_at(p, s, "a token named by its text needs a vocabulary: use <[id]>");
        int32_t found = p->opts->find_token(p->opts->find_user, s, (size_t)(t + 1 - s));
        if (found < 0)
            return perr_at(p, s, "no single token has the text %.*s", (int)(t + 1 - s), s);
        id = (uint64_t)found;
    }
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    if (!rb_push(p, q->rule, type, (uint32_t)id))
        return NULL;
    return skip_space(t + 1, nested);
}

// A rule reference.
static const char *parse_ref(struct parser *p, struct seq *q, const char *s, bool nested) {
    const char *e = s;
    while (is_word(*e))
        e++;
    const uint32_t id = sym_get(p, s, (size_t)(e - s));
    if (id == UINT32_MAX)
        return pfail(p, VERR_NOMEM, "out of host memory");
    if (p->syms[id].first_use == SIZE_MAX)
        p->syms[id].first_use = (size_t)(s - p->src);
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    if (!rb_push(p, q->rule, GE_RULE_REF, id))
        return NULL;
    return skip_space(e, nested);
}

// A parenthesized group after '(': its alternatives become a rule of their own.
static const char *parse_group(struct parser *p, struct seq *q, const char *s, bool nested) {
    s = skip_space(s, true);
    const uint32_t n_before = p->n_syms;
    const uint32_t id = sym_generate(p, q->rule_name);
    if (id == UINT32_MAX)
        return pfail(p, VERR_NOMEM, "out of host memory");
    if (!(s = parse_alternates(p, s, q->rule_name, id, true)))
        return NULL;
    q->n_prev_rules = p->n_syms - n_before > 1 ? p->n_syms - n_before : 1;
    q->last_start = q->rule->n;
    if (!rb_push(p, q->rule, GE_RULE_REF, id))
        return NULL;
    if (*s != ')')
        return perr(p, s, "expected ')'");
    return skip_space(s + 1, nested);
}

static const char *parse_sequence(struct parser *p, const char *s, const char *rule_name,
                                  struct rbuf *rule, bool nested) {
    struct seq q = {rule, rule_name, rule->n, 1};
    while (s && *s) {
        const char c = *s;
        if (c == '"')
            s = parse_literal(p, &q, s + 1, nested);
        else if (c == '[')
            s = parse_class(p, &q, s + 1, nested);
        else if (c == '<')
            s = parse_token(p, &q, s, GE_TOKEN, nested);
        else if (c == '!')
            s = parse_token(p, &q, s + 1, GE_TOKEN_NOT, nested);
        else if (is_word(c))
            s = parse_ref(p, &q, s, nested);
        else if (c == '(')
            s = parse_group(p, &q, s + 1, nested);
        else if (c == '.') {
            q.last_start = rule->n;
            q.n_prev_rules = 1;
            s = rb_push(p, rule, GE_CHAR_ANY, 0) ? skip_space(s + 1, nested) : NULL;
        } else if (c == '*' || c == '+' || c == '?') {
            const char *at = s;
            s = skip_space(s + 1, nested);
            if (!repeat_last(p, &q, at, c == '+' ? 1 : 0, c == '?' ? 1 : UINT64_MAX))
                return NULL;
        } else if (c == '{')
            s = parse_braces(p, &q, s + 1, nested);
        else
            break;
    }
    return s;
}

static const char *parse_alternates(struct parser *p, const char *s, const char *rule_name,
                                    uint32_t rule_id, bool nested) {
    struct rbuf rule = {0};
    s = parse_sequence(p, s, rule_name, &rule, nested);
    while (s && *s == '|') {
        if (!rb_push(p, &rule, GE_ALT, 0)) {
            s = NULL;
            break;
        }
        s = parse_sequence(p, skip_space(s + 1, true), rule_name, &rule, nested);
    }
    if (s && rb_push(p, &rule, GE_END, 0))
        rule_set(p, rule_id, &rule);
    else
        s = NULL;
    free(rule.e);
    return s;
}

static const char *parse_rule(struct parser *p, const char *s) {
    const char *e = s;
    while (is_word(*e))
        e++;
    if (e == s)
        return perr(p, s, "expected a rule name");
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(e - s < 100 ? e - s : 100), s);
    const uint32_t id = sym_get(p, s, (size_t)(e - s));
    if (id == UINT32_MAX)
        return pfail(p, VERR_NOMEM, "out of host memory");
    const char *t = skip_space(e, false);
    if (strncmp(t, "::=", 3))
        return perr(p, t, "expected '::=' after the rule name '%s'", name);
    if (!(t = parse_alternates(p, skip_space(t + 3, true), name, id, false)))
        return NULL;
    if (*t == '\r')
        t += t[1] == '\n' ? 2 : 1;
    else if (*t == '\n')
        t++;
    else if (*t)
        return perr(p, t, "expected a line break or the end of the rule '%s'", name);
    return skip_space(t, true);
}

// --- checks and assembly ---------------------------------------------------------

// Every referenced rule is defined.
static bool check_defined(struct parser *p) {
    for (uint32_t i = 0; i < p->n_syms; i++)
        if (!p->syms[i].defined) {
            const size_t at = p->syms[i].first_use;
            perr_at(p, p->src + (at == SIZE_MAX ? 0 : at), "rule '%s' is used but never defined",
                    p->syms[i].name);
            return false;
        }
    return true;
}

static void parser_free(struct parser *p) {
    for (uint32_t i = 0; i < p->n_syms; i++) {
        free(p->syms[i].name);
        free(p->rules[i].e);
    }
    free(p->syms);
    free(p->rules);
    free(p->table);
}

// Moves the parser's rules into a grammar.
static int assemble(struct parser *p, uint32_t root, struct grammar **out, struct verr *err) {
    struct grammar *g = calloc(1, sizeof *g);
    if (!g)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    atomic_init(&g->refs, 1);
    g->n_rules = p->n_syms;
    g->root = root;
    g->elems = malloc((p->n_elems ? p->n_elems : 1) * sizeof *g->elems);
    g->rule_start = malloc(p->n_syms * sizeof *g->rule_start);
    g->rule_names = calloc(p->n_syms, sizeof *g->rule_names);
    if (!g->elems || !g->rule_start || !g->rule_names) {
        grammar_free(g);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_syms; i++) {
        g->rule_start[i] = n;
        memcpy(g->elems + n, p->rules[i].e, p->rules[i].n * sizeof *g->elems);
        n += p->rules[i].n;
        g->rule_names[i] = p->syms[i].name;
        p->syms[i].name = NULL;
    }
    g->n_elems = n;
    *out = g;
    return 0;
}

int grammar_check_left_recursion(const struct grammar *g, struct verr *err);

int grammar_parse(struct grammar **out, const char *text, size_t len,
                  const struct grammar_opts *opts, struct verr *err) {
    *out = NULL;
    if (len > GRAMMAR_MAX_TEXT)
        return verr_set(err, VERR_FULL, "grammar: %zu bytes of text, at most %u", len,
                        GRAMMAR_MAX_TEXT);
    char *src = malloc(len + 1);
    if (!src)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    memcpy(src, text, len);
    src[len] = '\0';
    struct parser p = {.src = src, .len = len, .opts = opts, .err = err};
    const char *nul = memchr(src, '\0', len);
    const char *s = nul ? perr(&p, nul, "expected text without NUL bytes") : skip_space(src, true);
    while (s && *s)
        s = parse_rule(&p, s);
    int rc = 0;
    if (!p.failed && check_defined(&p)) {
        const char *root = opts && opts->root ? opts->root : "root";
        uint32_t root_id = UINT32_MAX;
        for (uint32_t i = 0; i < p.n_syms; i++)
            if (!p.syms[i].generated && !strcmp(p.syms[i].name, root))
                root_id = i;
        if (root_id == UINT32_MAX)
            rc = verr_set(err, VERR_FORMAT, "grammar: no rule '%s' to start from", root);
        else if (!(rc = assemble(&p, root_id, out, err)) &&
                 (rc = grammar_check_left_recursion(*out, err))) {
            grammar_free(*out);
            *out = NULL;
        }
    } else {
        rc = p.code;
    }
    parser_free(&p);
    free(src);
    return rc;
}
