// gpt-oss's tokenizer (o200k_harmony, tokenizer.ggml.pre = "gpt-4o")
// against llama.cpp, on the data of tests/data/o200k (README.md there says
// how it was made): the part of the real vocabulary a corpus uses, at the
// real ids, with the merges between those tokens; the corpus; llama.cpp's
// words (its gpt-4o regex split), its ids with parse_special off and on, and
// its end-of-generation set, attributes and pieces of the special tokens,
// and its text for the ids (llama_detokenize).
// Every case must match exactly.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_helpers.h"
#include "host/tokenizer/tokenizer.h"
#include "host/tokenizer/unicode.h"
#include "vocab_cases.h"

#define MAX_IDS 4096

static char *read_data(const char *name, size_t *len) {
    char path[1024];
    test_data_path(path, sizeof path, "VELA_O200K_DATA", "o200k", name);
    char *s = vocab_slurp(path, len);
    cr_assert_not_null(s, "cannot read %s (set VELA_O200K_DATA to the folder)", path);
    return s;
}

// vocab.txt: a header of "key value" lines, "tokens N" then N lines
// "id type text", "merges M" then M lines "left right", in rank order.
// Ids the file does not list are unused placeholders "[PAD<id>]".
struct o200k_vocab {
    char *file;
    uint32_t n_vocab, n_merges;
    char **tokens;
    int32_t *types;
    const char **merges;
    int64_t bos, eos, pad;
};

static char *next_line(char **p) {
    char *s = *p, *nl = strchr(s, '\n');
    cr_assert_not_null(nl, "vocab.txt: truncated");
    *nl = '\0';
    *p = nl + 1;
    return s;
}

static long header_value(char **p, const char *key) {
    char *line = next_line(p);
    size_t k = strlen(key);
    cr_assert(!strncmp(line, key, k) && line[k] == ' ', "vocab.txt: expected '%s', got '%s'", key,
              line);
    return strtol(line + k + 1, NULL, 10);
}

static void read_tokens(struct o200k_vocab *v, char **p) {
    long n = header_value(p, "tokens");
    for (long i = 0; i < n; i++) {
        char *line = next_line(p), *e;
        long id = strtol(line, &e, 10);
        long type = strtol(e, &e, 10);
        cr_assert(id >= 0 && id < (long)v->n_vocab && *e == ' ', "vocab.txt: bad line '%s'", line);
        free(v->tokens[id]);
        v->tokens[id] = strdup(e + 1);
        v->types[id] = (int32_t)type;
    }
}

static void vocab_read(struct o200k_vocab *v) {
    size_t len;
    v->file = read_data("vocab.txt", &len);
    char *p = v->file;
    cr_assert_str_eq(next_line(&p), "o200k_harmony-subset 1");
    v->n_vocab = (uint32_t)header_value(&p, "n_vocab");
    v->bos = header_value(&p, "bos");
    v->eos = header_value(&p, "eos");
    v->pad = header_value(&p, "pad");
    v->tokens = calloc(v->n_vocab, sizeof *v->tokens);
    v->types = calloc(v->n_vocab, sizeof *v->types);
    for (uint32_t i = 0; i < v->n_vocab; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%u]", i);
        v->tokens[i] = strdup(buf);
        v->types[i] = TOKEN_TYPE_UNUSED;
    }
    read_tokens(v, &p);
    v->n_merges = (uint32_t)header_value(&p, "merges");
    v->merges = calloc(v->n_merges, sizeof *v->merges);
    for (uint32_t i = 0; i < v->n_merges; i++)
        v->merges[i] = next_line(&p);
}

static void vocab_free(struct o200k_vocab *v) {
    for (uint32_t i = 0; i < v->n_vocab; i++)
        free(v->tokens[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    free(v->file);
}

static struct tokenizer *o200k_build(struct o200k_vocab *v, const char *pre) {
    vocab_read(v);
    struct tokenizer_desc d;
    tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = pre;
    d.n_tokens = v->n_vocab;
    d.tokens = (const char *const *)v->tokens;
    d.token_types = v->types;
    d.n_merges = v->n_merges;
    d.merges = v->merges;
    d.bos = v->bos;
    d.eos = v->eos;
    d.pad = v->pad;
    struct tokenizer *t;
    struct verr err;
    cr_assert_eq(tokenizer_build(&t, &d, &err), 0, "%s", err.msg);
    return t;
}

// Decodes text[0..len) into code points (cap entries); returns the count.
static size_t to_cpts(const char *text, size_t len, uint32_t *cpts, size_t cap) {
    size_t n = 0, pos = 0;
    while (pos < len) {
        cr_assert_lt(n, cap);
        cpts[n++] = unicode_utf8_decode(text, len, &pos);
    }
    return n;
}

// Each case's words, split as llama.cpp splits them with the gpt-4o regex.
Test(o200k, words_match_llama_cpp) {
    size_t il, ol;
    char *inp = read_data("corpus.inp", &il), *out = read_data("corpus.split", &ol);
    struct vocab_cursor c = {inp, inp + il, out, out + ol, false};
    const char *text;
    size_t len;
    static int32_t want[MAX_IDS];
    static uint32_t cpts[MAX_IDS];
    int n_want, n_cases = 0, n_ok = 0;
    while (vocab_next_case(&c, &text, &len, want, &n_want, MAX_IDS)) {
        n_cases++;
        size_t n = to_cpts(text, len, cpts, MAX_IDS), *lens, n_words;
        struct verr err;
        cr_assert_eq(tokenizer_pre_split(TOKENIZER_PRE_GPT4O, cpts, n, &lens, &n_words, &err), 0);
        bool ok = (int)n_words == n_want;
        for (size_t i = 0; ok && i < n_words; i++)
            ok = (int32_t)lens[i] == want[i];
        n_ok += ok;
        cr_expect(ok, "case %d '%.*s': %zu words, llama.cpp %d", n_cases, (int)len, text, n_words,
                  n_want);
        free(lens);
    }
    fprintf(stderr, "o200k: %d/%d cases split into llama.cpp's words\n", n_ok, n_cases);
    cr_expect_gt(n_cases, 250);
    free(inp);
    free(out);
}

static void check_ids(const char *out_name, bool parse_special) {
    struct o200k_vocab v;
    struct tokenizer *t = o200k_build(&v, "gpt-4o");
    size_t il, ol;
    char *inp = read_data("corpus.inp", &il), *out = read_data(out_name, &ol);
    struct vocab_cursor c = {inp, inp + il, out, out + ol, false};
    const char *text;
    size_t len;
    static int32_t want[MAX_IDS];
    int n_want, n_cases = 0, n_ok = 0;
    while (vocab_next_case(&c, &text, &len, want, &n_want, MAX_IDS)) {
        n_cases++;
        int32_t *got;
        int n_got;
        struct verr err;
        cr_assert_eq(tokenizer_encode_alloc(t, text, len, false, parse_special, &got, &n_got, &err),
                     0, "%s", err.msg);
        bool ok = n_got == n_want && (n_got == 0 || !memcmp(got, want, (size_t)n_got * 4));
        n_ok += ok;
        if (!ok) {
            fprintf(stderr, "  %s case %d '%.*s':\n", out_name, n_cases, (int)len, text);
            vocab_print_ids("want", want, n_want);
            vocab_print_ids("got ", got, n_got);
        }
        free(got);
    }
    fprintf(stderr, "o200k %s: %d/%d cases match llama.cpp\n", out_name, n_ok, n_cases);
    cr_expect_eq(n_ok, n_cases, "%s: %d of %d cases differ from llama.cpp", out_name,
                 n_cases - n_ok, n_cases);
    cr_expect_gt(n_cases, 250);
    free(inp);
    free(out);
    tokenizer_free(t);
    vocab_free(&v);
}

Test(o200k, ids_match_llama_cpp) {
    check_ids("corpus.out", false);
}

Test(o200k, ids_with_special_tokens_match_llama_cpp) {
    check_ids("corpus.special.out", true);
}

// Hex digits [0..2n) into bytes; returns n, or -1 on a bad digit.
static int from_hex(const char *hex, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) {
        unsigned b;
        if (sscanf(hex + 2 * i, "%2x", &b) != 1)
            return -1;
        out[i] = (char)b;
    }
    return (int)n;
}

// Each case's ids (parse_special on) joined back into text, as
// llama_detokenize with remove_special off and unparse_special as given;
// the expected text is one line of hex per case.
static void check_decode(const char *want_name, bool unparse_special) {
    struct o200k_vocab v;
    struct tokenizer *t = o200k_build(&v, "gpt-4o");
    size_t il, ol, wl;
    char *inp = read_data("corpus.inp", &il), *out = read_data("corpus.special.out", &ol);
    char *want = read_data(want_name, &wl), *wp = want;
    struct vocab_cursor c = {inp, inp + il, out, out + ol, false};
    const char *text;
    size_t len;
    static int32_t ids[MAX_IDS];
    static char bytes[MAX_IDS * 4];
    int n_ids, n_cases = 0, n_ok = 0;
    while (vocab_next_case(&c, &text, &len, ids, &n_ids, MAX_IDS)) {
        n_cases++;
        char *nl = strchr(wp, '\n');
        cr_assert(nl && (size_t)(nl - wp) % 2 == 0 && (size_t)(nl - wp) / 2 <= sizeof bytes,
                  "%s: bad line %d", want_name, n_cases);
        int n_want = from_hex(wp, (size_t)(nl - wp) / 2, bytes);
        cr_assert_geq(n_want, 0, "%s: bad hex on line %d", want_name, n_cases);
        wp = nl + 1;
        char *got;
        size_t n_got;
        struct verr err;
        cr_assert_eq(tokenizer_decode(t, ids, n_ids, false, unparse_special, &got, &n_got, &err), 0,
                     "%s", err.msg);
        bool ok = n_got == (size_t)n_want && !memcmp(got, bytes, n_got);
        n_ok += ok;
        cr_expect(ok, "%s case %d '%.*s': got '%s', want '%.*s'", want_name, n_cases, (int)len,
                  text, got, n_want, bytes);
        free(got);
    }
    fprintf(stderr, "o200k %s: %d/%d cases decode as llama.cpp\n", want_name, n_ok, n_cases);
    cr_expect_gt(n_cases, 250);
    free(inp);
    free(out);
    free(want);
    tokenizer_free(t);
    vocab_free(&v);
}

Test(o200k, decode_matches_llama_cpp) {
    check_decode("corpus.detok", false);
}

Test(o200k, decode_with_special_tokens_matches_llama_cpp) {
    check_decode("corpus.detok.special", true);
}

// specials.txt: "id eog attr piece" for every token llama.cpp makes
// control, user-defined, unknown or end-of-generation (piece: its
// llama_token_to_piece with special = false), then "bos B eos E eot T".
// Harmony's rules: <|return|> and <|call|> end generation and <|end|> does
// not, and <|end|>, <|channel|>, <|message|>, <|start|>, <|constrain|> are
// user-defined, so they are rendered (and cut out of text) always.
Test(o200k, harmony_specials_match_llama_cpp) {
    struct o200k_vocab v;
    struct tokenizer *t = o200k_build(&v, "gpt-4o");
    size_t len;
    char *s = read_data("specials.txt", &len), *p = s;
    uint8_t *listed = calloc((size_t)tokenizer_n_vocab(t), 1);
    int n_listed = 0;
    for (char *line; *p && strncmp(p, "bos ", 4);) {
        line = next_line(&p);
        char *e;
        long id = strtol(line, &e, 10), eog = strtol(e, &e, 10), attr = strtol(e, &e, 10);
        cr_assert(id >= 0 && id < tokenizer_n_vocab(t) && *e == ' ', "specials.txt: '%s'", line);
        listed[id] = 1;
        n_listed++;
        const char *piece;
        size_t pl;
        struct verr err;
        cr_assert_eq(tokenizer_piece(t, (int32_t)id, false, &piece, &pl, &err), 0);
        cr_expect_eq(tokenizer_is_eog(t, (int32_t)id), eog == 1, "%ld eog", id);
        cr_expect_eq(tokenizer_token_attr(t, (int32_t)id), (uint32_t)attr, "%ld attr", id);
        cr_expect(pl == strlen(e + 1) && !memcmp(piece, e + 1, pl), "%ld piece '%.*s', want '%s'",
                  id, (int)pl, piece, e + 1);
    }
    long bos, eos, eot;
    cr_assert_eq(sscanf(p, "bos %ld eos %ld eot %ld", &bos, &eos, &eot), 3, "specials.txt end");
    cr_expect_eq(tokenizer_bos(t), bos);
    cr_expect_eq(tokenizer_eos(t), eos);
    cr_expect_eq(tokenizer_eot(t), eot);
    const uint32_t special = TOKEN_ATTR_CONTROL | TOKEN_ATTR_USER_DEFINED | TOKEN_ATTR_UNKNOWN;
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++)
        if (!listed[id])
            cr_expect(!tokenizer_is_eog(t, id) && !(tokenizer_token_attr(t, id) & special),
                      "%d: llama.cpp gives it no special role", id);
    cr_expect_gt(n_listed, 1000);
    free(listed);
    free(s);
    tokenizer_free(t);
    vocab_free(&v);
}

// The tokenizer.ggml.pre names llama.cpp maps to its gpt-4o regex (with
// the same flags: no space clean-up, merges always applied, no BOS).
Test(o200k, pre_names) {
    const char *names[] = {"llama4", "kanana2", "talkie", "minimax-m2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        enum tokenizer_pre p;
        struct verr err;
        cr_expect_eq(tokenizer_pre_from_name(names[i], &p, &err), 0, "%s", names[i]);
        cr_expect_eq(p, TOKENIZER_PRE_GPT4O, "%s", names[i]);
    }
    cr_expect_str_eq(tokenizer_pre_name(TOKENIZER_PRE_GPT4O), "gpt-4o");
}
