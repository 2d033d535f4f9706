// The flag table's parser and --help writer (flags.h).
#include "tools/flags.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HELP_COLUMN 28 // where the help text starts
#define HELP_WIDTH 80  // the line it wraps at

int flags_read_int(const char *where, const char *s, long lo, long hi, int *out, struct verr *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not an integer in [%ld, %ld]", where, s, lo,
                        hi);
    if (v < lo || v > hi)
        return verr_set(err, VERR_RANGE, "%s: %ld is out of range [%ld, %ld]", where, v, lo, hi);
    *out = (int)v;
    return 0;
}

int flags_read_float(const char *where, const char *s, float *out, struct verr *err) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return verr_set(err, VERR_RANGE, "%s: '%s' is not a number", where, s);
    *out = v;
    return 0;
}

static void *field(void *opts, size_t off) {
    return (char *)opts + off;
}

static int read_float_row(void *opts, const struct flag *f, const char *where, const char *s,
                          struct verr *err) {
    float v = 0;
    int rc = flags_read_float(where, s, &v, err);
    if (rc)
        return rc;
    if (f->lo_open && !(v > f->lo))
        return verr_set(err, VERR_RANGE, "%s: %g must be > %g", where, v, f->lo);
    if (!f->lo_open && !(v >= f->lo && v <= f->hi)) {
        if (isinf(f->hi))
            return verr_set(err, VERR_RANGE, "%s: %g must be >= %g", where, v, f->lo);
        return verr_set(err, VERR_RANGE, "%s: %g must be between %g and %g", where, v, f->lo,
                        f->hi);
    }
    *(float *)field(opts, f->off) = v;
    return 0;
}

static int read_enum_row(void *opts, const struct flag *f, const char *where, const char *s,
                         struct verr *err) {
    for (const struct flag_choice *c = f->choices; c->name; c++)
        if (!strcmp(s, c->name)) {
            *(int *)field(opts, f->off) = c->value;
            return 0;
        }
    return verr_set(err, VERR_RANGE, "%s: '%s' is not %s", where, s, f->expected);
}

// The values of row f at vals[0..n) into opts; how many it took, or a VERR_* code.
static int apply_row(void *opts, const struct flag *f, const char *where, const char *const *vals,
                     int n, struct verr *err) {
    int rc = 0;
    switch (f->kind) {
    case FLAG_HELP:
    case FLAG_NOTE:
        return 0;
    case FLAG_SET:
    case FLAG_UNSET:
        *(bool *)field(opts, f->off) = f->kind == FLAG_SET;
        break;
    case FLAG_INT:
        rc = flags_read_int(where, vals[0], (long)f->lo, (long)f->hi, field(opts, f->off), err);
        break;
    case FLAG_FLOAT:
        rc = read_float_row(opts, f, where, vals[0], err);
        break;
    case FLAG_STR:
        *(const char **)field(opts, f->off) = vals[0];
        break;
    case FLAG_ENUM:
        rc = read_enum_row(opts, f, where, vals[0], err);
        break;
    case FLAG_FN:
        rc = f->fn(opts, f, where, vals, n, err);
        if (rc < 0)
            return rc;
        n = rc;
        rc = 0;
        break;
    }
    if (rc)
        return rc;
    if (f->seen)
        *(bool *)field(opts, f->seen - 1) = true;
    return f->kind == FLAG_SET || f->kind == FLAG_UNSET ? 0 : n;
}

// Values the row takes: 0, 1, 2, or FLAG_VALUE_OPTIONAL.
static int row_values(const struct flag *f) {
    if (f->kind == FLAG_FN)
        return f->n_values;
    return f->value ? 1 : 0;
}

// Whether `arg` (len bytes of it) is one of the row's spellings.
static bool row_named(const struct flag *f, const char *arg, size_t len) {
    for (const char *p = f->names; p && *p;) {
        const size_t n = strcspn(p, ",");
        if (n == len && !strncmp(p, arg, len))
            return true;
        p += n;
        while (*p == ',' || *p == ' ')
            p++;
    }
    return false;
}

static const struct flag *find_row(const struct flag_table *t, unsigned cmd, const char *arg,
                                   size_t len) {
    for (size_t k = 0; k < t->n_rows; k++)
        if ((t->rows[k].cmds & cmd) && t->rows[k].kind != FLAG_NOTE &&
            row_named(&t->rows[k], arg, len))
            return &t->rows[k];
    return NULL;
}

int flags_parse_one(const struct flag_table *t, unsigned cmd, void *opts, int argc, char **argv,
                    int *i, struct verr *err) {
    const char *arg = argv[*i];
    // "--name=value": the value of a flag that takes one
    const char *eq = !strncmp(arg, "--", 2) ? strchr(arg, '=') : NULL;
    const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const struct flag *f = find_row(t, cmd, arg, len);
    if (!f)
        return 0;
    char where[64];
    snprintf(where, sizeof where, "%.*s", (int)len, arg);
    const int want = row_values(f);
    const char *vals[2] = {NULL, NULL};
    int n = 0;
    if (eq) {
        if (want == 0)
            return verr_set(err, VERR_RANGE, "%s takes no value ('%s')", where, arg);
        if (want == 2)
            return verr_set(err, VERR_RANGE, "%s takes two values: %s %s", where, where, f->value);
        vals[n++] = eq + 1;
    } else if (want == FLAG_VALUE_OPTIONAL) {
        if (*i + 1 < argc)
            vals[n++] = argv[*i + 1];
    } else {
        if (*i + want >= argc) {
            if (want == 1)
                return verr_set(err, VERR_RANGE, "%s: missing value", where);
            return verr_set(err, VERR_RANGE, "%s: needs %d values, %s", where, want, f->value);
        }
        for (; n < want; n++)
            vals[n] = argv[*i + 1 + n];
    }
    if (f->kind == FLAG_HELP)
        return 2;
    int took = apply_row(opts, f, where, vals, n, err);
    if (took < 0)
        return took;
    *i += 1 + (eq ? 0 : took);
    return 1;
}

int flags_parse_env(const struct flag_table *t, unsigned cmd, void *opts, struct verr *err) {
    for (size_t k = 0; k < t->n_rows; k++) {
        const struct flag *f = &t->rows[k];
        const char *v = f->env && (f->cmds & cmd) ? getenv(f->env) : NULL;
        if (!v)
            continue;
        const int want = row_values(f);
        const char *vals[1] = {v};
        int rc =
            want == 1 || want == FLAG_VALUE_OPTIONAL ? apply_row(opts, f, f->env, vals, 1, err) : 0;
        if (rc < 0)
            return rc;
    }
    return 0;
}

int flags_parse(const struct flag_table *t, unsigned cmd, void *opts, int argc, char **argv,
                int first, const char **pos, int max_pos, int *n_pos, struct verr *err) {
    *n_pos = 0;
    int rc = flags_parse_env(t, cmd, opts, err);
    if (rc)
        return rc;
    bool only_pos = false;
    for (int i = first; i < argc;) {
        const char *arg = argv[i];
        const bool is_flag = !only_pos && arg[0] == '-' && arg[1] != '\0';
        if (is_flag && !strcmp(arg, "--")) {
            only_pos = true;
            i++;
            continue;
        }
        rc = is_flag ? flags_parse_one(t, cmd, opts, argc, argv, &i, err) : 0;
        if (rc == 2)
            return FLAGS_HELP;
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        if (is_flag || max_pos == 0) {
            verr_set(err, VERR_RANGE, "unknown option '%s'", arg);
            return FLAGS_UNKNOWN;
        }
        if (*n_pos == max_pos)
            return verr_set(err, VERR_RANGE, "too many arguments: '%s' (at most %d)", arg, max_pos);
        pos[(*n_pos)++] = arg;
        i++;
    }
    return FLAGS_OK;
}

// text from column `col` on, wrapped at HELP_WIDTH with lines after the
// first starting at `indent`; '\n' in text breaks a line.
static void print_wrapped(FILE *out, const char *text, int col, int indent) {
    const char *p = text;
    while (*p) {
        const int room = HELP_WIDTH - col;
        size_t line = strcspn(p, "\n");
        size_t take = line;
        if ((int)line > room) { // break at the last space that fits
            take = 0;
            for (size_t k = 0; k < line && (int)k <= room; k++)
                if (p[k] == ' ')
                    take = k;
            if (take == 0)
                take = strcspn(p, " \n");
        }
        fprintf(out, "%.*s\n", (int)take, p);
        p += take;
        while (*p == ' ')
            p++;
        if (*p == '\n')
            p++;
        if (*p)
            fprintf(out, "%*s", indent, "");
        col = indent;
    }
}

static void help_row(FILE *out, const struct flag *f) {
    if (f->kind == FLAG_NOTE) {
        fprintf(out, "  ");
        print_wrapped(out, f->help, 2, 2);
        return;
    }
    char left[128];
    int n = snprintf(left, sizeof left, "  %s%s%s", f->names, f->value ? " " : "",
                     f->value ? f->value : "");
    char help[1024];
    snprintf(help, sizeof help, "%s%s%s%s", f->help, f->env ? " (env: " : "", f->env ? f->env : "",
             f->env ? ")" : "");
    if (n < HELP_COLUMN) {
        fprintf(out, "%-*s", HELP_COLUMN, left);
    } else {
        fprintf(out, "%s\n%*s", left, HELP_COLUMN, "");
    }
    print_wrapped(out, help, HELP_COLUMN, HELP_COLUMN);
}

void flags_help(FILE *out, const struct flag_table *t, unsigned cmd) {
    for (int s = 0; s < t->n_sections; s++) {
        bool titled = false;
        for (size_t k = 0; k < t->n_rows; k++) {
            const struct flag *f = &t->rows[k];
            if (f->section != s || !(f->cmds & cmd))
                continue;
            if (!titled && *t->sections[s])
                fprintf(out, "%s:\n", t->sections[s]);
            titled = true;
            help_row(out, f);
        }
    }
}
