// vela gguf dump: prints a GGUF file's header, key/values and tensor infos in
// the layout of llama.cpp's gguf_dump.py (text), or as JSON (--json).
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"

// Text output limits: strings longer than this many characters are cut to
// STR_KEEP characters plus "...", arrays show their first ARR_SHOW elements.
enum { STR_MAX = 60, STR_KEEP = 57, ARR_SHOW = 5 };

// ---------------------------------------------------------------------------
// A growable string.

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_putn(struct sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(struct sbuf *b, const char *s) {
    sb_putn(b, s, strlen(s));
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(struct sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_putn(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// ---------------------------------------------------------------------------
// Formatting of single values.

// Shortest decimal form that reads back to the same float / double, laid out
// as Python's repr() lays out floats: positional with at least one decimal
// for exponents -4..15 ("10000.0", "0.001"), scientific otherwise ("1e-05").
static void fmt_real(char *buf, size_t cap, double x, bool single) {
    if (x != x) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (x > 1.7976931348623157e308 || x < -1.7976931348623157e308) {
        snprintf(buf, cap, x > 0 ? "inf" : "-inf");
        return;
    }
    int digits = 17;
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*e", p - 1, x);
        if (single ? strtof(buf, NULL) == (float)x : strtod(buf, NULL) == x) {
            digits = p;
            break;
        }
    }
    snprintf(buf, cap, "%.*e", digits - 1, x);
    const char *e = strchr(buf, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (exp10 < -4 || exp10 >= 16)
        return;
    // Lay the shortest digits out positionally (printing x itself with %f
    // would show the binary value's extra digits, 1e15f as 999999986991104).
    char dig[24];
    size_t nd = 0;
    bool neg = buf[0] == '-';
    for (const char *c = buf + neg; c < e && nd < sizeof dig - 1; c++)
        if (*c != '.')
            dig[nd++] = *c;
    dig[nd] = '\0';
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp10 < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int z = 0; z < -exp10 - 1; z++)
            out[o++] = '0';
        for (size_t i = 0; i < nd; i++)
            out[o++] = dig[i];
    } else {
        for (int i = 0; i <= exp10; i++)
            out[o++] = (size_t)i < nd ? dig[i] : '0';
        out[o++] = '.';
        if ((size_t)exp10 + 1 < nd)
            for (size_t i = (size_t)exp10 + 1; i < nd; i++)
                out[o++] = dig[i];
        else
            out[o++] = '0';
    }
    out[o] = '\0';
    snprintf(buf, cap, "%s", out);
}

// Element i of a fixed-size array as a scalar value.
static struct gguf_value arr_elem(const struct gguf_array *a, uint64_t i) {
    struct gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = a->type;
    size_t es = gguf_vtype_size(a->type);
    const uint8_t *p = (const uint8_t *)a->data + i * es;
    if (a->type == GGUF_VT_BOOL)
        v.b = *p != 0;
    else
        memcpy(&v.u64, p, es); // every scalar member starts at the union's first byte
    return v;
}

static void fmt_scalar(struct sbuf *b, const struct gguf_value *v, bool json_bool) {
    char tmp[64];
    switch (v->type) {
    case GGUF_VT_UINT8:
        sb_printf(b, "%u", (unsigned)v->u8);
        break;
    case GGUF_VT_INT8:
        sb_printf(b, "%d", (int)v->i8);
        break;
    case GGUF_VT_UINT16:
        sb_printf(b, "%u", (unsigned)v->u16);
        break;
    case GGUF_VT_INT16:
        sb_printf(b, "%d", (int)v->i16);
        break;
    case GGUF_VT_UINT32:
        sb_printf(b, "%" PRIu32, v->u32);
        break;
    case GGUF_VT_INT32:
        sb_printf(b, "%" PRId32, v->i32);
        break;
    case GGUF_VT_UINT64:
        sb_printf(b, "%" PRIu64, v->u64);
        break;
    case GGUF_VT_INT64:
        sb_printf(b, "%" PRId64, v->i64);
        break;
    case GGUF_VT_FLOAT32:
        fmt_real(tmp, sizeof tmp, v->f32, true);
        sb_puts(b, tmp);
        break;
    case GGUF_VT_FLOAT64:
        fmt_real(tmp, sizeof tmp, v->f64, false);
        sb_puts(b, tmp);
        break;
    case GGUF_VT_BOOL:
        sb_puts(b, v->b ? (json_bool ? "true" : "True") : (json_bool ? "false" : "False"));
        break;
    default:
        sb_puts(b, "?");
        break;
    }
}

// Length of the valid UTF-8 sequence at s (1..4), or 0 when it is invalid.
static size_t utf8_len(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n > left)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return n;
}

// A string as Python's repr() shows it: quoted, with escapes for quotes,
// backslashes and control characters, and \x escapes for bytes that are not
// UTF-8. More than STR_MAX characters are cut to STR_KEEP plus "...".
static void fmt_str(struct sbuf *b, const struct gguf_str *s) {
    const unsigned char *p = (const unsigned char *)s->data;
    size_t len = (size_t)s->len;
    size_t chars = 0, keep = len;
    for (size_t i = 0; i < len; chars++) {
        size_t n = utf8_len(p + i, len - i);
        if (chars == STR_KEEP)
            keep = i;
        i += n ? n : 1;
    }
    bool cut = chars > STR_MAX;
    if (!cut)
        keep = len;
    bool has_sq = memchr(p, '\'', keep) != NULL, has_dq = memchr(p, '"', keep) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    sb_putn(b, &q, 1);
    for (size_t i = 0; i < keep;) {
        size_t n = utf8_len(p + i, keep - i);
        unsigned c = p[i];
        if (n == 0) {
            sb_printf(b, "\\x%02x", c);
            i++;
            continue;
        }
        if (n == 1) {
            if (c == '\\' || c == (unsigned char)q)
                sb_printf(b, "\\%c", c);
            else if (c == '\n')
                sb_puts(b, "\\n");
            else if (c == '\r')
                sb_puts(b, "\\r");
            else if (c == '\t')
                sb_puts(b, "\\t");
            else if (c < 0x20 || c == 0x7f)
                sb_printf(b, "\\x%02x", c);
            else
                sb_putn(b, (const char *)p + i, 1);
        } else {
            sb_putn(b, (const char *)p + i, n);
        }
        i += n;
    }
    if (cut)
        sb_puts(b, "...");
    sb_putn(b, &q, 1);
}

static void fmt_array(struct sbuf *b, const struct gguf_array *a) {
    sb_puts(b, "[");
    uint64_t show = a->n < ARR_SHOW ? a->n : ARR_SHOW;
    for (uint64_t i = 0; i < show; i++) {
        if (i)
            sb_puts(b, ", ");
        if (a->type == GGUF_VT_STRING) {
            fmt_str(b, &a->strs[i]);
        } else if (a->type == GGUF_VT_ARRAY) {
            fmt_array(b, &a->elems[i].arr);
        } else {
            struct gguf_value v = arr_elem(a, i);
            fmt_scalar(b, &v, false);
        }
    }
    if (a->n > show)
        sb_puts(b, ", ...");
    sb_puts(b, "]");
}

// "UINT32", "[STRING]", "[[INT32]]" (gguf_dump.py's pretty type).
static void fmt_type(struct sbuf *b, const struct gguf_value *v) {
    if (v->type != GGUF_VT_ARRAY) {
        sb_puts(b, gguf_vtype_name(v->type));
        return;
    }
    int depth = 0;
    const struct gguf_array *a = &v->arr;
    for (;;) {
        depth++;
        if (a->type != GGUF_VT_ARRAY || a->n == 0)
            break;
        a = &a->elems[0].arr;
    }
    for (int i = 0; i < depth; i++)
        sb_puts(b, "[");
    sb_puts(b, gguf_vtype_name(a->type));
    for (int i = 0; i < depth; i++)
        sb_puts(b, "]");
}

// Keys and tensor names with control bytes escaped (one line per entry).
static void fmt_name(struct sbuf *b, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            sb_printf(b, "\\x%02x", c);
        else
            sb_putn(b, s, 1);
    }
}

static void type_upper(char *buf, size_t cap, uint32_t type) {
    snprintf(buf, cap, "%s", ggml_type_name(type));
    for (char *c = buf; *c; c++)
        *c = (char)toupper((unsigned char)*c);
}

// ---------------------------------------------------------------------------
// Text dump.

static void print_entry(struct sbuf *line, uint64_t idx, const char *type, uint64_t count,
                        const char *key, const char *value) {
    line->len = 0;
    sb_printf(line, "%7" PRIu64 ": %-10s | %8" PRIu64 " | ", idx, type, count);
    fmt_name(line, key);
    sb_printf(line, " = ");
    sb_puts(line, value);
    if (!line->oom)
        printf("%s\n", line->p);
}

static int dump_text(const struct gguf_file *f, bool tensors) {
    struct sbuf line = {0}, val = {0}, type = {0};
    char tmp[64];
    printf("* File: %s\n", f->path);
    printf("* GGUF version %" PRIu32 ", LITTLE endian, %" PRIu64 " tensor(s), %" PRIu64
           " key/value pair(s), alignment %" PRIu64 ", data section at offset %" PRIu64 ", %" PRIu64
           " bytes\n",
           f->version, f->n_tensors, f->n_kv, f->alignment, f->data_offset, f->size);
    printf("* Dumping %" PRIu64 " key/value pair(s)\n", f->n_kv + 3);
    snprintf(tmp, sizeof tmp, "%" PRIu32, f->version);
    print_entry(&line, 1, "UINT32", 1, "GGUF.version", tmp);
    snprintf(tmp, sizeof tmp, "%" PRIu64, f->n_tensors);
    print_entry(&line, 2, "UINT64", 1, "GGUF.tensor_count", tmp);
    snprintf(tmp, sizeof tmp, "%" PRIu64, f->n_kv);
    print_entry(&line, 3, "UINT64", 1, "GGUF.kv_count", tmp);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_value *v = &f->kv[i].val;
        val.len = type.len = 0;
        sb_puts(&val, "");
        sb_puts(&type, "");
        fmt_type(&type, v);
        uint64_t count = 1;
        if (v->type == GGUF_VT_STRING)
            fmt_str(&val, &v->str);
        else if (v->type == GGUF_VT_ARRAY) {
            fmt_array(&val, &v->arr);
            count = v->arr.n;
        } else
            fmt_scalar(&val, v, false);
        if (val.oom || type.oom)
            break;
        print_entry(&line, i + 4, type.p, count, f->kv[i].key, val.p);
    }
    bool oom = line.oom || val.oom || type.oom;
    if (tensors && !oom) {
        printf("* Dumping %" PRIu64 " tensor(s)\n", f->n_tensors);
        int w = 4;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            size_t n = strlen(f->tensors[i].name);
            if (n > (size_t)w)
                w = n > 64 ? 64 : (int)n;
        }
        if (f->n_tensors)
            printf("%7s: %-*s | %-26s | %-7s | %12s | %12s\n", "n", w, "name",
                   "shape (ne0, ne1, ne2, ne3)", "type", "offset", "bytes");
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const struct gguf_tensor_info *t = &f->tensors[i];
            line.len = 0;
            sb_puts(&line, "");
            fmt_name(&line, t->name);
            if (line.oom) {
                oom = true;
                break;
            }
            type_upper(tmp, sizeof tmp, t->type);
            char shape[96];
            snprintf(shape, sizeof shape, "%5" PRId64 ", %5" PRId64 ", %5" PRId64 ", %5" PRId64,
                     t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
            printf("%7" PRIu64 ": %-*s | %-26s | %-7s | %12" PRIu64 " | %12" PRIu64 "\n", i + 1, w,
                   line.p, shape, tmp, t->offset, t->nbytes);
        }
    }
    free(line.p);
    free(val.p);
    free(type.p);
    if (oom) {
        fprintf(stderr, "vela gguf dump: out of memory\n");
        return 1;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// JSON dump.

// A valid UTF-8, NUL-free copy of s (invalid bytes and NULs become U+FFFD),
// so the JSON output always parses.
static char *utf8_clean(const char *s, uint64_t len) {
    if (len > (SIZE_MAX - 1) / 3)
        return NULL;
    char *out = malloc((size_t)len * 3 + 1), *o = out;
    if (!out)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_len(p + i, len - i);
        if (n == 0 || p[i] == 0) {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy(o, p + i, n);
            o += n;
            i += n;
        }
    }
    *o = '\0';
    return out;
}

static cJSON *json_str(const struct gguf_str *s) {
    char *c = utf8_clean(s->data, s->len);
    if (!c)
        return NULL;
    cJSON *j = cJSON_CreateString(c);
    free(c);
    return j;
}

// Integers go out as raw text so 64-bit values keep every digit.
static cJSON *json_scalar(const struct gguf_value *v) {
    char tmp[64];
    switch (v->type) {
    case GGUF_VT_BOOL:
        return cJSON_CreateBool(v->b);
    case GGUF_VT_FLOAT32:
    case GGUF_VT_FLOAT64: {
        double x = v->type == GGUF_VT_FLOAT32 ? v->f32 : v->f64;
        if (x != x || x > 1.7976931348623157e308 || x < -1.7976931348623157e308)
            return cJSON_CreateNull(); // JSON has no NaN or infinity
        fmt_real(tmp, sizeof tmp, x, v->type == GGUF_VT_FLOAT32);
        return cJSON_CreateRaw(tmp);
    }
    default: {
        struct sbuf b = {0};
        fmt_scalar(&b, v, true);
        cJSON *j = b.oom ? NULL : cJSON_CreateRaw(b.p);
        free(b.p);
        return j;
    }
    }
}

static cJSON *json_array(const struct gguf_array *a) {
    cJSON *arr = cJSON_CreateArray();
    for (uint64_t i = 0; arr && i < a->n; i++) {
        cJSON *e;
        if (a->type == GGUF_VT_STRING)
            e = json_str(&a->strs[i]);
        else if (a->type == GGUF_VT_ARRAY)
            e = json_array(&a->elems[i].arr);
        else {
            struct gguf_value v = arr_elem(a, i);
            e = json_scalar(&v);
        }
        if (!e || !cJSON_AddItemToArray(arr, e)) {
            cJSON_Delete(e);
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

static cJSON *json_value(const struct gguf_value *v) {
    if (v->type == GGUF_VT_STRING)
        return json_str(&v->str);
    if (v->type == GGUF_VT_ARRAY)
        return json_array(&v->arr);
    return json_scalar(v);
}

static bool json_add_entry(cJSON *meta, const char *key, int64_t index, const char *type,
                           uint64_t offset, cJSON *value, const struct gguf_value *v) {
    cJSON *e = cJSON_CreateObject();
    char *k = utf8_clean(key, strlen(key));
    if (!e || !k || !value) {
        cJSON_Delete(e);
        cJSON_Delete(value);
        free(k);
        return false;
    }
    cJSON_AddItemToObject(meta, k, e);
    free(k);
    cJSON_AddNumberToObject(e, "index", (double)index);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "offset", (double)offset);
    if (v && v->type == GGUF_VT_ARRAY) {
        cJSON *types = cJSON_AddArrayToObject(e, "array_types");
        const struct gguf_array *a = &v->arr;
        for (;;) {
            cJSON_AddItemToArray(types, cJSON_CreateString(gguf_vtype_name(a->type)));
            if (a->type != GGUF_VT_ARRAY || a->n == 0)
                break;
            a = &a->elems[0].arr;
        }
        cJSON_AddNumberToObject(e, "count", (double)v->arr.n);
    }
    cJSON_AddItemToObject(e, "value", value);
    return true;
}

static int dump_json(const struct gguf_file *f, bool tensors) {
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    char tmp[64];
    if (ok) {
        char *name = utf8_clean(f->path, strlen(f->path));
        ok = name && cJSON_AddStringToObject(root, "filename", name);
        free(name);
    }
    if (ok) {
        cJSON_AddStringToObject(root, "endian", "LITTLE");
        cJSON_AddNumberToObject(root, "version", f->version);
        cJSON_AddNumberToObject(root, "alignment", (double)f->alignment);
        cJSON_AddNumberToObject(root, "data_offset", (double)f->data_offset);
        cJSON_AddNumberToObject(root, "size", (double)f->size);
        cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
        ok = meta != NULL;
        snprintf(tmp, sizeof tmp, "%" PRIu32, f->version);
        ok = ok && json_add_entry(meta, "GGUF.version", 0, "UINT32", 4, cJSON_CreateRaw(tmp), NULL);
        snprintf(tmp, sizeof tmp, "%" PRIu64, f->n_tensors);
        ok = ok &&
             json_add_entry(meta, "GGUF.tensor_count", 1, "UINT64", 8, cJSON_CreateRaw(tmp), NULL);
        snprintf(tmp, sizeof tmp, "%" PRIu64, f->n_kv);
        ok = ok &&
             json_add_entry(meta, "GGUF.kv_count", 2, "UINT64", 16, cJSON_CreateRaw(tmp), NULL);
        for (uint64_t i = 0; ok && i < f->n_kv; i++) {
            const struct gguf_value *v = &f->kv[i].val;
            ok = json_add_entry(meta, f->kv[i].key, (int64_t)i + 3, gguf_vtype_name(v->type),
                                f->kv[i].offset, json_value(v), v);
        }
    }
    if (ok && tensors) {
        cJSON *tj = cJSON_AddObjectToObject(root, "tensors");
        ok = tj != NULL;
        for (uint64_t i = 0; ok && i < f->n_tensors; i++) {
            const struct gguf_tensor_info *t = &f->tensors[i];
            cJSON *e = cJSON_CreateObject();
            char *k = utf8_clean(t->name, strlen(t->name));
            if (!e || !k) {
                cJSON_Delete(e);
                free(k);
                ok = false;
                break;
            }
            cJSON_AddItemToObject(tj, k, e);
            free(k);
            cJSON_AddNumberToObject(e, "index", (double)i);
            cJSON *shape = cJSON_AddArrayToObject(e, "shape");
            for (uint32_t d = 0; d < t->n_dims; d++) {
                snprintf(tmp, sizeof tmp, "%" PRId64, t->ne[d]);
                cJSON_AddItemToArray(shape, cJSON_CreateRaw(tmp));
            }
            type_upper(tmp, sizeof tmp, t->type);
            cJSON_AddStringToObject(e, "type", tmp);
            snprintf(tmp, sizeof tmp, "%" PRIu64, t->offset);
            cJSON_AddRawToObject(e, "offset", tmp);
            snprintf(tmp, sizeof tmp, "%" PRIu64, t->nbytes);
            cJSON_AddRawToObject(e, "bytes", tmp);
        }
    }
    char *out = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!out) {
        fprintf(stderr, "vela gguf dump: out of memory building JSON\n");
        return 1;
    }
    fputs(out, stdout);
    fputc('\n', stdout);
    free(out);
    return 0;
}

// ---------------------------------------------------------------------------
// Command line.

static void usage_gguf(FILE *out) {
    fprintf(out, "usage: vela gguf SUBCOMMAND [options]\n\n"
                 "subcommands:\n"
                 "  dump FILE [--json] [--no-tensors]   print the header, every key/value and\n"
                 "                                      every tensor info of a GGUF file\n\n"
                 "'vela gguf dump --help' lists the options of dump.\n");
}

static void usage_dump(FILE *out) {
    fprintf(out, "usage: vela gguf dump FILE [--json] [--no-tensors]\n\n"
                 "Prints a GGUF file's header, every key/value pair (long arrays and strings\n"
                 "abbreviated) and every tensor (name, shape, type, offset in the data section,\n"
                 "bytes), in the layout of llama.cpp's gguf_dump.py.\n\n");
    flags_help(out, &cli_flags, CLI_GGUF_DUMP);
    fprintf(out,
            "\nexit status: 0 ok, 1 the file cannot be read or is not valid GGUF, 2 usage error\n");
}

static int cmd_gguf_dump(int argc, char **argv) {
    static struct cli c; // large: off the stack
    cli_defaults(&c);
    int rc = tools_parse("gguf dump", CLI_GGUF_DUMP, usage_dump, &c, argc, argv, 4);
    if (rc >= 0)
        return rc;
    if (c.n_pos > 1) {
        fprintf(stderr, "vela gguf dump: more than one FILE given ('%s' and '%s')\n", c.pos[0],
                c.pos[1]);
        return 2;
    }
    if (c.n_pos == 0) {
        fprintf(stderr, "vela gguf dump: missing FILE\n");
        usage_dump(stderr);
        return 2;
    }
    const char *path = c.pos[0];
    struct verr err = {0};
    struct gguf_file *f = NULL;
    if (gguf_open(&f, path, &err)) {
        fprintf(stderr, "vela gguf dump: %s\n", err.msg);
        return 1;
    }
    rc = c.dump.json ? dump_json(f, c.dump.tensors) : dump_text(f, c.dump.tensors);
    gguf_close(f);
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "vela gguf dump: cannot write the output\n");
        rc = 1;
    }
    return rc;
}

int cmd_gguf(int argc, char **argv) {
    if (argc < 2) {
        usage_gguf(stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
        usage_gguf(stdout);
        return 0;
    }
    if (!strcmp(sub, "dump"))
        return cmd_gguf_dump(argc - 1, argv + 1);
    fprintf(stderr, "vela gguf: unknown subcommand '%s'\n", sub);
    usage_gguf(stderr);
    return 2;
}
