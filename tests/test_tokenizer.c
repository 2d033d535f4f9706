// Tokenizer unit tests: Unicode helpers, every pre-tokenizer on a curated
// string, SentencePiece and byte-level BPE on tiny hand-made vocabularies
// (merge order, byte fallback, special tokens, BOS / EOS), pieces,
// detokenization, the streaming decoder, loading from a GGUF file written
// with the writer, and the errors. The real vocabularies are in
// test_tokenizer_vocab.c.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "host/tokenizer/tokenizer.h"
#include "host/tokenizer/unicode.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SP "\xe2\x96\x81" // U+2581, SentencePiece's space

// ---------------------------------------------------------------------------
// Unicode helpers

Test(unicode, flags) {
    cr_expect(unicode_flags('a') & UNICODE_LETTER);
    cr_expect(unicode_flags('7') & UNICODE_NUMBER);
    cr_expect(unicode_flags('!') & UNICODE_PUNCT);
    cr_expect(unicode_flags('$') & UNICODE_SYMBOL);
    cr_expect(unicode_flags(' ') & UNICODE_WHITESPACE);
    cr_expect(unicode_flags(' ') & UNICODE_SEPARATOR);
    cr_expect(unicode_flags('\n') & UNICODE_WHITESPACE);
    cr_expect(!(unicode_flags(0x1C) & UNICODE_WHITESPACE), "U+001C is not White_Space");
    cr_expect(unicode_flags(0xA0) & UNICODE_WHITESPACE);
    cr_expect(unicode_flags(0x3000) & UNICODE_WHITESPACE);
    cr_expect(unicode_flags(0xE9) & UNICODE_LETTER, "é");
    cr_expect(unicode_flags(0x4E2D) & UNICODE_LETTER, "中");
    cr_expect(unicode_flags(0x0663) & UNICODE_NUMBER, "Arabic-Indic three");
    cr_expect(unicode_flags(0x00B2) & UNICODE_NUMBER, "superscript two");
    cr_expect(unicode_flags(0x0301) & UNICODE_MARK, "combining acute");
    cr_expect(unicode_flags(0x1F600) & UNICODE_SYMBOL, "emoji");
    cr_expect_eq(unicode_flags(0x0378), UNICODE_UNDEFINED, "unassigned");
    cr_expect(unicode_flags(0xE000) & UNICODE_CONTROL, "private use");
    cr_expect_eq(unicode_flags(0x110000), UNICODE_UNDEFINED);
    // Every code point has exactly one category.
    for (uint32_t cp = 0; cp < UNICODE_MAX_CP; cp += 7) {
        uint16_t c = unicode_flags(cp) & UNICODE_CATEGORY_MASK;
        cr_assert(c && !(c & (c - 1)), "U+%04X has categories 0x%x", cp, c);
    }
    cr_expect_eq(unicode_tolower('Q'), 'q');
    cr_expect_eq(unicode_tolower(0xC9), 0xE9);
    cr_expect_eq(unicode_tolower(0x0416), 0x0436);
    cr_expect_eq(unicode_tolower('q'), 'q');
    cr_expect(unicode_is_han(0x4E2D));
    cr_expect(!unicode_is_han('a'));
}

Test(unicode, utf8) {
    // Valid sequences of every length round-trip.
    const uint32_t cps[] = {0x24, 0xA2, 0x939, 0x20AC, 0xD55C, 0x10348, 0x10FFFF};
    for (size_t i = 0; i < LEN(cps); i++) {
        char b[4];
        size_t n = unicode_utf8_encode(cps[i], b), pos = 0;
        cr_expect_eq(unicode_utf8_len((uint8_t)b[0]), n);
        cr_expect_eq(unicode_utf8_decode(b, n, &pos), cps[i]);
        cr_expect_eq(pos, n);
    }
    // Malformed input: one U+FFFD per bad byte, then decoding resumes.
    const char bad[] = "\x80"
                       "a"
                       "\xC3"
                       "\xE2\x82"
                       "\xF8"
                       "\xF4\x90\x80\x80";
    uint32_t out[16];
    size_t n = unicode_utf8_to_cpts(bad, sizeof bad - 1, out);
    const uint32_t want[] = {0xFFFD, 'a',    0xFFFD, 0xFFFD, 0xFFFD,
                             0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD};
    cr_assert_eq(n, LEN(want));
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(out[i], want[i], "code point %zu: %x", i, out[i]);
    char b[4];
    cr_expect_eq(unicode_utf8_encode(0x110000, b), 3, "out of range becomes U+FFFD");
}

Test(unicode, byte_encoding) {
    // GPT-2's table: a bijection between bytes and 256 printable code points.
    bool seen[0x200] = {false};
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t n = unicode_byte_encode((uint8_t)b, u), pos = 0;
        uint32_t cp = unicode_utf8_decode(u, n, &pos);
        cr_assert_lt(cp, 0x200u);
        cr_expect(!seen[cp], "byte %d maps to a used code point", b);
        seen[cp] = true;
        cr_expect_eq(unicode_byte_decode(cp), b);
        cr_expect(!(unicode_flags(cp) & (UNICODE_WHITESPACE | UNICODE_CONTROL)),
                  "byte %d maps to a non-printable code point", b);
    }
    cr_expect_eq(unicode_byte_decode(' ' + 0x100), ' ', "'Ġ' is the space");
    cr_expect_eq(unicode_byte_decode('A'), 'A');
    cr_expect_eq(unicode_byte_decode(0x144), -1);
    cr_expect_eq(unicode_byte_decode(0xAD), -1, "soft hyphen is remapped");
}

// ---------------------------------------------------------------------------
// Pre-tokenizers. Expected words were worked out from llama.cpp's regex
// lists (and cross-checked against an independent emulation of its
// std::regex path over thousands of random strings).

struct pre_case {
    enum tokenizer_pre pre;
    const char *text;
    const char *words[20];
};

static const struct pre_case pre_cases[] = {
    {TOKENIZER_PRE_DEFAULT,
     "a+b=c; 12345678 x~|y",
     {"a", "+", "b", "=", "c", ";", " ", "123", "456", "78", " x", "~|", "y", NULL}},
    {TOKENIZER_PRE_LLAMA3,
     "Hello, y'all! How'RE you \360\237\230\201 1234567\012\012  x",
     {"Hello", ",", " y", "'all", "!", " How", "'RE", " you", " \360\237\230\201", " ", "123",
      "456", "7", "\012\012", " ", " x", NULL}},
    {TOKENIZER_PRE_QWEN2,
     "abc 12345 I'M\015\012\015\012ok  ",
     {"abc", " ", "1", "2", "3", "4", "5", " I", "'M", "\015\012\015\012", "ok", "  ", NULL}},
    {TOKENIZER_PRE_GPT2,
     "Hello  world's 123 ...!!\011\011y  ",
     {"Hello", " ", " world", "'s", " 123", " ...!!", "\011", "\011", "y", "  ", NULL}},
    // deepseek-llm's regexes apply one after the other: " café" is cut by
    // the second (letters) and cut again by the third, whose class holds
    // ASCII letters but not é.
    {TOKENIZER_PRE_DEEPSEEK_LLM,
     "Hello \344\270\226\347\225\214 123\012  caf\303\251!!  ",
     {"Hello", " ", "\344\270\226\347\225\214", " ", "123", "\012", " ", " caf", "\303\251", "!!",
      "  ", NULL}},
    {TOKENIZER_PRE_DEEPSEEK_CODER,
     "foo(bar) 1234 \344\270\255\346\226\207\015\012x",
     {"foo", "(", "bar", ")", " ", "1", "2", "3", "4", " ", "\344\270\255\346\226\207", "\015",
      "\012", "x", NULL}},
    {TOKENIZER_PRE_FALCON, "x<=y`z 123456", {"x", "<=", "y", "`", "z", " ", "123", "456", NULL}},
    {TOKENIZER_PRE_STARCODER, "var1 = 42;", {"var", "1", " =", " ", "4", "2", ";", NULL}},
};

Test(pre, curated) {
    for (size_t c = 0; c < LEN(pre_cases); c++) {
        const struct pre_case *pc = &pre_cases[c];
        size_t len = strlen(pc->text), n_words, *lens;
        uint32_t cpts[128];
        size_t n = unicode_utf8_to_cpts(pc->text, len, cpts);
        struct verr err;
        cr_assert_eq(tokenizer_pre_split(pc->pre, cpts, n, &lens, &n_words, &err), 0, "%s",
                     err.msg);
        size_t want = 0;
        while (pc->words[want])
            want++;
        cr_expect_eq(n_words, want, "%s: %zu words, want %zu", tokenizer_pre_name(pc->pre), n_words,
                     want);
        size_t start = 0;
        for (size_t w = 0; w < n_words && w < want; w++) {
            char got[64];
            size_t gl = 0;
            for (size_t i = start; i < start + lens[w]; i++)
                gl += unicode_utf8_encode(cpts[i], got + gl);
            got[gl] = '\0';
            cr_expect_str_eq(got, pc->words[w], "%s word %zu", tokenizer_pre_name(pc->pre), w);
            start += lens[w];
        }
        free(lens);
    }
}

Test(pre, names) {
    enum tokenizer_pre p;
    struct verr err;
    const struct {
        const char *name;
        enum tokenizer_pre pre;
    } names[] = {
        {"default", TOKENIZER_PRE_DEFAULT},
        {"llama3", TOKENIZER_PRE_LLAMA3},
        {"llama-bpe", TOKENIZER_PRE_LLAMA3},
        {"qwen2", TOKENIZER_PRE_QWEN2},
        {"gpt-2", TOKENIZER_PRE_GPT2},
        {"mpt", TOKENIZER_PRE_GPT2},
        {"deepseek-llm", TOKENIZER_PRE_DEEPSEEK_LLM},
        {"deepseek-coder", TOKENIZER_PRE_DEEPSEEK_CODER},
        {"falcon", TOKENIZER_PRE_FALCON},
        {"starcoder", TOKENIZER_PRE_STARCODER},
        {"refact", TOKENIZER_PRE_STARCODER},
    };
    for (size_t i = 0; i < LEN(names); i++) {
        cr_expect_eq(tokenizer_pre_from_name(names[i].name, &p, &err), 0, "%s", names[i].name);
        cr_expect_eq(p, names[i].pre, "%s", names[i].name);
    }
    cr_expect_eq(tokenizer_pre_from_name("no-such-pre", &p, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "no-such-pre"), "%s", err.msg);
}

Test(pre, edge_cases) {
    size_t *lens, n_words;
    cr_assert_eq(tokenizer_pre_split(TOKENIZER_PRE_GPT2, NULL, 0, &lens, &n_words, NULL), 0);
    cr_expect_eq(n_words, 0);
    cr_expect_null(lens);
    // Long runs stay linear enough and cover the input exactly.
    enum { N = 20000 };
    uint32_t *cp = malloc(N * sizeof *cp);
    for (int pre = 0; pre < TOKENIZER_PRE_COUNT; pre++) {
        for (int i = 0; i < N; i++)
            cp[i] = (i % 1000 == 999) ? 'x' : (i % 3 ? ' ' : '\n');
        cr_assert_eq(tokenizer_pre_split(pre, cp, N, &lens, &n_words, NULL), 0);
        size_t sum = 0;
        for (size_t w = 0; w < n_words; w++) {
            cr_assert_gt(lens[w], 0);
            sum += lens[w];
        }
        cr_expect_eq(sum, N, "%s", tokenizer_pre_name(pre));
        free(lens);
    }
    free(cp);
}

// ---------------------------------------------------------------------------
// A tiny SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then
// pieces whose scores make "▁hello" and "▁world" merge step by step.

enum { SPM_BYTE0 = 3, SPM_NORMAL = SPM_BYTE0 + 256 };

static const struct {
    const char *text;
    float score;
} spm_pieces[] = {
    {SP, -1.0f},      {"h", -2.0f},       {"e", -2.0f},        {"l", -2.0f},     {"o", -2.0f},
    {"w", -2.0f},     {"r", -2.0f},       {"d", -2.0f},        {"ll", -1.0f},    {SP "h", -1.5f},
    {SP "he", -1.2f}, {SP "hell", -1.1f}, {SP "hello", -0.5f}, {SP "w", -1.3f},  {"or", -1.4f},
    {"ld", -1.6f},    {SP "wor", -1.25f}, {SP "world", -0.6f}, {"<tool>", 0.0f},
};

struct vocab {
    const char *tokens[400];
    float scores[400];
    int32_t types[400];
    char bytes[256][8];
    uint32_t n;
};

static int32_t spm_id(const char *text) {
    for (size_t i = 0; i < LEN(spm_pieces); i++)
        if (!strcmp(spm_pieces[i].text, text))
            return SPM_NORMAL + (int32_t)i;
    cr_assert_fail("no piece '%s'", text);
    return -1;
}

static void spm_vocab(struct vocab *v, struct tokenizer_desc *d) {
    v->n = 0;
    v->tokens[0] = "<unk>";
    v->types[0] = TOKEN_TYPE_UNKNOWN;
    v->tokens[1] = "<s>";
    v->types[1] = TOKEN_TYPE_CONTROL;
    v->tokens[2] = "</s>";
    v->types[2] = TOKEN_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(v->bytes[b], sizeof v->bytes[b], "<0x%02X>", b);
        v->tokens[SPM_BYTE0 + b] = v->bytes[b];
        v->types[SPM_BYTE0 + b] = TOKEN_TYPE_BYTE;
    }
    for (int i = 0; i < SPM_NORMAL; i++)
        v->scores[i] = 0.0f;
    for (size_t i = 0; i < LEN(spm_pieces); i++) {
        v->tokens[SPM_NORMAL + i] = spm_pieces[i].text;
        v->scores[SPM_NORMAL + i] = spm_pieces[i].score;
        v->types[SPM_NORMAL + i] = TOKEN_TYPE_NORMAL;
    }
    v->types[spm_id("<tool>")] = TOKEN_TYPE_USER_DEFINED;
    v->n = SPM_NORMAL + (uint32_t)LEN(spm_pieces);
    tokenizer_desc_init(d);
    d->model = "llama";
    d->n_tokens = v->n;
    d->tokens = v->tokens;
    d->scores = v->scores;
    d->token_types = v->types;
    d->bos = 1;
    d->eos = 2;
    d->unk = 0;
}

static struct tokenizer *build(const struct tokenizer_desc *d) {
    struct tokenizer *t = NULL;
    struct verr err = {0};
    cr_assert_eq(tokenizer_build(&t, d, &err), 0, "build: %s", err.msg);
    return t;
}

static void expect_ids(const struct tokenizer *t, const char *text, bool add_special,
                       bool parse_special, const int32_t *want, int n_want) {
    int32_t *got;
    int n;
    struct verr err;
    cr_assert_eq(
        tokenizer_encode_alloc(t, text, strlen(text), add_special, parse_special, &got, &n, &err),
        0, "%s", err.msg);
    bool same = n == n_want && (n == 0 || !memcmp(got, want, (size_t)n * sizeof *got));
    if (!same) {
        char g[512] = "", w[512] = "";
        for (int i = 0; i < n && strlen(g) < 480; i++)
            snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[i]);
        for (int i = 0; i < n_want && strlen(w) < 480; i++)
            snprintf(w + strlen(w), sizeof w - strlen(w), " %d", want[i]);
        cr_expect_fail("'%s': got [%s ], want [%s ]", text, g, w);
    }
    free(got);
}

#define EXPECT_IDS(t, text, add, parse, ...)                                                       \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(t, text, add, parse, want_, (int)LEN(want_));                                   \
    } while (0)

Test(spm, encode) {
    struct vocab v;
    struct tokenizer_desc d;
    spm_vocab(&v, &d);
    struct tokenizer *t = build(&d);
    cr_expect_eq(tokenizer_get_type(t), TOKENIZER_SPM);
    cr_expect_eq(tokenizer_n_vocab(t), (int32_t)v.n);
    cr_expect(tokenizer_add_bos(t), "llama vocabularies add BOS by default");
    cr_expect(!tokenizer_add_eos(t));
    cr_expect_eq(tokenizer_nl(t), SPM_BYTE0 + '\n');

    int32_t hello = spm_id(SP "hello"), world = spm_id(SP "world");
    EXPECT_IDS(t, "hello world", true, false, 1, hello, world);
    EXPECT_IDS(t, "hello world", false, false, hello, world);
    // A leading space doubles the prefix: "▁▁hello" has no piece for "▁▁".
    EXPECT_IDS(t, " hello", false, false, spm_id(SP), hello);
    // é is not in the vocabulary: its two bytes.
    EXPECT_IDS(t, "h\xc3\xa9llo", false, false, spm_id(SP "h"), SPM_BYTE0 + 0xC3, SPM_BYTE0 + 0xA9,
               spm_id("ll"), spm_id("o"));
    // Control tokens only with parse_special; text after a special token gets
    // the space prefix again.
    EXPECT_IDS(t, "hello<s>world", false, true, hello, 1, world);
    EXPECT_IDS(t, "hello<s>world", false, false, hello, SPM_BYTE0 + '<', SPM_BYTE0 + 's',
               SPM_BYTE0 + '>', spm_id("w"), spm_id("or"), spm_id("ld"));
    // User-defined tokens are cut out either way.
    EXPECT_IDS(t, "hello<tool>", false, false, hello, spm_id("<tool>"));
    EXPECT_IDS(t, "", true, false, 1);
    const int32_t none[1] = {0};
    expect_ids(t, "", false, false, none, 0);
    tokenizer_free(t);

    // add_eos, and add_space_prefix off.
    d.add_eos = 1;
    d.add_space_prefix = 0;
    t = build(&d);
    EXPECT_IDS(t, "hello world", true, false, 1, spm_id("h"), spm_id("e"), spm_id("ll"),
               spm_id("o"), world, 2);
    tokenizer_free(t);
}

Test(spm, encode_bounded) {
    struct vocab v;
    struct tokenizer_desc d;
    spm_vocab(&v, &d);
    struct tokenizer *t = build(&d);
    int32_t out[3] = {-7, -7, -7};
    int n = 0;
    struct verr err;
    cr_expect_eq(tokenizer_encode(t, "hello world", 11, true, false, out, 1, &n, &err), VERR_FULL);
    cr_expect_eq(n, 3, "the count needed");
    cr_expect_eq(out[0], 1);
    cr_expect_eq(out[1], -7, "nothing written past max");
    cr_expect_eq(tokenizer_encode(t, "hello world", 11, true, false, out, 3, &n, &err), 0);
    cr_expect_eq(n, 3);
    tokenizer_free(t);
}

Test(spm, pieces_and_decode) {
    struct vocab v;
    struct tokenizer_desc d;
    spm_vocab(&v, &d);
    struct tokenizer *t = build(&d);
    const char *p;
    size_t n;
    struct verr err;
    cr_assert_eq(tokenizer_piece(t, spm_id(SP "hello"), false, &p, &n, &err), 0);
    cr_expect(n == 6 && !memcmp(p, " hello", 6));
    tokenizer_piece(t, SPM_BYTE0 + 'A', false, &p, &n, NULL);
    cr_expect(n == 1 && p[0] == 'A');
    tokenizer_piece(t, SPM_BYTE0 + 0xFF, false, &p, &n, NULL);
    cr_expect(n == 1 && (uint8_t)p[0] == 0xFF);
    tokenizer_piece(t, 1, false, &p, &n, NULL);
    cr_expect_eq(n, 0, "control tokens are hidden");
    tokenizer_piece(t, 1, true, &p, &n, NULL);
    cr_expect(n == 3 && !memcmp(p, "<s>", 3));
    tokenizer_piece(t, 0, false, &p, &n, NULL);
    cr_expect_eq(n, 0, "so is <unk>");
    tokenizer_piece(t, spm_id("<tool>"), false, &p, &n, NULL);
    cr_expect(n == 6 && !memcmp(p, "<tool>", 6), "user-defined tokens show");
    cr_expect_eq(tokenizer_piece(t, (int32_t)v.n, false, &p, &n, &err), VERR_RANGE);
    cr_expect_eq(tokenizer_piece(t, -1, false, &p, &n, &err), VERR_RANGE);

    const int32_t ids[] = {1, spm_id(SP "hello"), spm_id(SP "world"), 2};
    char *s;
    size_t len;
    // Decoding drops the space SentencePiece put in front of the text, except
    // when it drops a BOS instead (llama_detokenize does the same).
    cr_assert_eq(tokenizer_decode(t, ids + 1, 2, false, false, &s, &len, &err), 0);
    cr_expect_str_eq(s, "hello world");
    free(s);
    tokenizer_decode(t, ids, 3, true, false, &s, &len, &err);
    cr_expect_str_eq(s, " hello world");
    free(s);
    // Without remove_special the (empty) BOS piece takes the space removal.
    tokenizer_decode(t, ids, 3, false, false, &s, &len, &err);
    cr_expect_str_eq(s, " hello world");
    free(s);
    tokenizer_decode(t, ids, 4, false, true, &s, &len, &err);
    cr_expect_str_eq(s, "<s> hello world</s>");
    free(s);

    // Encoding then decoding gives valid UTF-8 text back, characters the
    // vocabulary lacks included (byte fallback).
    static const char *const alphabet[] = {
        "h",  "e", "l", "o", " ",        "  ",           "<",
        ">",  "w", "r", "d", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x81",
        "\n", "<s"};
    srand(7);
    for (int k = 0; k < 200; k++) {
        char text[128];
        size_t tl = 0;
        for (int i = rand() % 20 + 1; i > 0; i--) {
            const char *a = alphabet[rand() % (int)LEN(alphabet)];
            memcpy(text + tl, a, strlen(a));
            tl += strlen(a);
        }
        int32_t *tok;
        int nt;
        cr_assert_eq(tokenizer_encode_alloc(t, text, tl, false, false, &tok, &nt, &err), 0);
        cr_assert_eq(tokenizer_decode(t, tok, nt, false, false, &s, &len, &err), 0);
        cr_expect(len == tl && !memcmp(s, text, tl), "round trip of '%.*s' gave '%s'", (int)tl,
                  text, s);
        free(s);
        free(tok);
    }
    tokenizer_free(t);
}

Test(spm, stream) {
    struct vocab v;
    struct tokenizer_desc d;
    spm_vocab(&v, &d);
    struct tokenizer *t = build(&d);
    struct tokenizer_stream *s;
    struct verr err;
    cr_assert_eq(tokenizer_stream_new(&s, t, false, &err), 0);
    const char *txt;
    size_t n;
    // é arrives as two byte tokens: nothing, then the whole character.
    tokenizer_stream_push(s, SPM_BYTE0 + 0xC3, &txt, &n, &err);
    cr_expect_eq(n, 0);
    tokenizer_stream_push(s, SPM_BYTE0 + 0xA9, &txt, &n, &err);
    cr_expect(n == 2 && !memcmp(txt, "\xc3\xa9", 2));
    // A 4-byte character in four pieces.
    const uint8_t smile[] = {0xF0, 0x9F, 0x98, 0x81};
    for (int i = 0; i < 4; i++) {
        tokenizer_stream_push(s, SPM_BYTE0 + smile[i], &txt, &n, &err);
        cr_expect_eq(n, i < 3 ? 0u : 4u);
    }
    cr_expect(!memcmp(txt, smile, 4));
    // A byte that can never start a character.
    tokenizer_stream_push(s, SPM_BYTE0 + 0xFF, &txt, &n, &err);
    cr_expect(n == 3 && !memcmp(txt, "\xef\xbf\xbd", 3));
    // A character cut short by the next piece: U+FFFD, then the piece.
    tokenizer_stream_push(s, SPM_BYTE0 + 0xE2, &txt, &n, &err);
    cr_expect_eq(n, 0);
    tokenizer_stream_push(s, spm_id(SP "hello"), &txt, &n, &err);
    cr_expect(n == 9 && !memcmp(txt, "\xef\xbf\xbd hello", 9));
    // Control tokens stay hidden unless asked for.
    tokenizer_stream_push(s, 2, &txt, &n, &err);
    cr_expect_eq(n, 0);
    // Flush: a held-back start becomes U+FFFD; nothing held, nothing out.
    tokenizer_stream_push(s, SPM_BYTE0 + 0xC3, &txt, &n, &err);
    tokenizer_stream_flush(s, &txt, &n);
    cr_expect(n == 3 && !memcmp(txt, "\xef\xbf\xbd", 3));
    tokenizer_stream_flush(s, &txt, &n);
    cr_expect_eq(n, 0);
    // Overlong and surrogate encodings are not let through.
    tokenizer_stream_push(s, SPM_BYTE0 + 0xE0, &txt, &n, &err);
    tokenizer_stream_push(s, SPM_BYTE0 + 0x80, &txt, &n, &err);
    cr_expect(n == 6 && !memcmp(txt, "\xef\xbf\xbd\xef\xbf\xbd", 6), "E0 80 is overlong");
    tokenizer_stream_push(s, SPM_BYTE0 + 0xED, &txt, &n, &err);
    tokenizer_stream_push(s, SPM_BYTE0 + 0xA0, &txt, &n, &err);
    cr_expect_eq(n, 6, "ED A0 starts a surrogate");
    cr_expect_eq(tokenizer_stream_push(s, -3, &txt, &n, &err), VERR_RANGE);
    tokenizer_stream_free(s);

    cr_assert_eq(tokenizer_stream_new(&s, t, true, &err), 0);
    tokenizer_stream_push(s, 2, &txt, &n, &err);
    cr_expect(n == 4 && !memcmp(txt, "</s>", 4));
    tokenizer_stream_free(s);
    tokenizer_free(t);
}

// ---------------------------------------------------------------------------
// A tiny byte-level BPE vocabulary: the 256 byte symbols, merge results,
// and <|endoftext|>.

struct bpe_vocab {
    char byte_tok[256][4];
    const char *tokens[300];
    int32_t types[300];
    uint32_t n;
    const char *merges[32];
    uint32_t n_merges;
};

static void bpe_vocab(struct bpe_vocab *v, struct tokenizer_desc *d, const char *pre,
                      const char *const *merges, const char *const *extra) {
    v->n = 0;
    for (int b = 0; b < 256; b++) {
        size_t k = unicode_byte_encode((uint8_t)b, v->byte_tok[b]);
        v->byte_tok[b][k] = '\0';
        v->tokens[v->n] = v->byte_tok[b];
        v->types[v->n++] = TOKEN_TYPE_NORMAL;
    }
    v->n_merges = 0;
    for (; merges[v->n_merges]; v->n_merges++)
        v->merges[v->n_merges] = merges[v->n_merges];
    for (; *extra; extra++) {
        v->tokens[v->n] = *extra;
        v->types[v->n++] = TOKEN_TYPE_NORMAL;
    }
    v->tokens[v->n] = "<|endoftext|>";
    v->types[v->n++] = TOKEN_TYPE_CONTROL;
    tokenizer_desc_init(d);
    d->model = "gpt2";
    d->pre = pre;
    d->n_tokens = v->n;
    d->tokens = v->tokens;
    d->token_types = v->types;
    d->n_merges = v->n_merges;
    d->merges = v->merges;
    d->bos = d->eos = v->n - 1;
}

static const char *const hello_merges[] = {
    "h e", "l l",          "he ll", "hell o",         "\xc4\xa0 w",
    "o r", "\xc4\xa0w or", "l d",   "\xc4\xa0wor ld", NULL};
static const char *const hello_tokens[] = {
    "he", "ll", "hell", "hello", "\xc4\xa0w", "or", "\xc4\xa0wor", "ld", "\xc4\xa0world", NULL};

static int32_t find(const struct tokenizer *t, const char *s) {
    int32_t id = tokenizer_find(t, s, strlen(s));
    cr_assert_geq(id, 0, "no token '%s'", s);
    return id;
}

Test(bpe, encode) {
    struct bpe_vocab v;
    struct tokenizer_desc d;
    bpe_vocab(&v, &d, "gpt-2", hello_merges, hello_tokens);
    struct tokenizer *t = build(&d);
    cr_expect_eq(tokenizer_get_type(t), TOKENIZER_BPE);
    cr_expect_eq(tokenizer_get_pre(t), TOKENIZER_PRE_GPT2);
    cr_expect_eq(tokenizer_n_merges(t), 9);
    cr_expect(!tokenizer_add_bos(t), "gpt2 vocabularies add no BOS by default");
    cr_expect_eq(tokenizer_nl(t), find(t, "\xc4\x8a"), "the byte symbol of \\n");
    int32_t eot = (int32_t)v.n - 1;
    cr_expect(tokenizer_is_eog(t, eot));
    cr_expect(!tokenizer_is_eog(t, find(t, "hello")));

    EXPECT_IDS(t, "hello world", true, false, find(t, "hello"), find(t, "\xc4\xa0world"));
    // Two spaces: the first stands alone (\s+(?!\S)).
    EXPECT_IDS(t, "hello  world", false, false, find(t, "hello"), find(t, "\xc4\xa0"),
               find(t, "\xc4\xa0world"));
    EXPECT_IDS(t, "hello<|endoftext|>", false, true, find(t, "hello"), eot);
    // Without parse_special it is text: "<|" "endoftext" "|>" "x", no merges apply.
    EXPECT_IDS(t, "<|endoftext|>x", false, false, find(t, "<"), find(t, "|"), find(t, "e"),
               find(t, "n"), find(t, "d"), find(t, "o"), find(t, "f"), find(t, "t"), find(t, "e"),
               find(t, "x"), find(t, "t"), find(t, "|"), find(t, ">"), find(t, "x"));
    // Non-ASCII: bytes through the byte symbols.
    EXPECT_IDS(t, "\xc3\xa9", false, false, find(t, "\xc3\x83"), find(t, "\xc2\xa9"));
    tokenizer_free(t);

    // BOS / EOS on request.
    d.add_bos = 1;
    d.add_eos = 1;
    t = build(&d);
    EXPECT_IDS(t, "hello", true, false, eot, find(t, "hello"), eot);
    tokenizer_free(t);
}

Test(bpe, merge_order) {
    // The lowest rank merges first, whatever its position.
    static const char *const m1[] = {"b c", "a b", NULL}, *const m2[] = {"a b", "b c", NULL};
    static const char *const extra[] = {"ab", "bc", NULL};
    struct bpe_vocab v;
    struct tokenizer_desc d;
    bpe_vocab(&v, &d, "gpt-2", m1, extra);
    struct tokenizer *t = build(&d);
    EXPECT_IDS(t, "abc", false, false, find(t, "a"), find(t, "bc"));
    tokenizer_free(t);
    bpe_vocab(&v, &d, "gpt-2", m2, extra);
    t = build(&d);
    EXPECT_IDS(t, "abc", false, false, find(t, "ab"), find(t, "c"));
    // Equal pairs merge left first: "aaa" with "a a" -> "aa" "a".
    tokenizer_free(t);
    static const char *const m3[] = {"a a", NULL}, *const e3[] = {"aa", NULL};
    bpe_vocab(&v, &d, "gpt-2", m3, e3);
    t = build(&d);
    EXPECT_IDS(t, "aaa", false, false, find(t, "aa"), find(t, "a"));
    EXPECT_IDS(t, "aaaa", false, false, find(t, "aa"), find(t, "aa"));
    tokenizer_free(t);
}

Test(bpe, ignore_merges) {
    // "xyz" is a token no merge reaches: llama3 vocabularies emit it whole.
    static const char *const none[] = {NULL}, *const extra[] = {"xyz", NULL};
    struct bpe_vocab v;
    struct tokenizer_desc d;
    bpe_vocab(&v, &d, "gpt-2", none, extra);
    struct tokenizer *t = build(&d);
    EXPECT_IDS(t, "xyz", false, false, find(t, "x"), find(t, "y"), find(t, "z"));
    tokenizer_free(t);
    bpe_vocab(&v, &d, "llama-bpe", none, extra);
    t = build(&d);
    cr_expect(tokenizer_add_bos(t), "llama3 vocabularies add BOS by default");
    EXPECT_IDS(t, "xyz", false, false, find(t, "xyz"));
    EXPECT_IDS(t, "xyz", true, false, (int32_t)v.n - 1, find(t, "xyz"));
    tokenizer_free(t);
}

Test(bpe, decode) {
    struct bpe_vocab v;
    struct tokenizer_desc d;
    bpe_vocab(&v, &d, "gpt-2", hello_merges, hello_tokens);
    struct tokenizer *t = build(&d);
    const char *p;
    size_t n;
    tokenizer_piece(t, find(t, "\xc4\xa0world"), false, &p, &n, NULL);
    cr_expect(n == 6 && !memcmp(p, " world", 6));
    tokenizer_piece(t, find(t, "\xc3\x83"), false, &p, &n, NULL);
    cr_expect(n == 1 && (uint8_t)p[0] == 0xC3, "a byte symbol is its byte");

    char *s;
    size_t len;
    struct verr err;
    int32_t *ids;
    int nt;
    // gpt-2 cleans up spaces before punctuation and contractions.
    const char *text = "hello , world 's ! hello's";
    cr_assert_eq(tokenizer_encode_alloc(t, text, strlen(text), false, false, &ids, &nt, &err), 0);
    cr_assert_eq(tokenizer_decode(t, ids, nt, false, false, &s, &len, &err), 0);
    cr_expect_str_eq(s, "hello, world's! hello's");
    free(s);
    free(ids);
    tokenizer_free(t);

    // qwen2 does not: text comes back as it was.
    bpe_vocab(&v, &d, "qwen2", hello_merges, hello_tokens);
    t = build(&d);
    cr_assert_eq(tokenizer_encode_alloc(t, text, strlen(text), false, false, &ids, &nt, &err), 0);
    cr_assert_eq(tokenizer_decode(t, ids, nt, false, false, &s, &len, &err), 0);
    cr_expect_str_eq(s, text);
    free(s);
    free(ids);
    tokenizer_free(t);
}

// ---------------------------------------------------------------------------
// Building errors

Test(build, errors) {
    struct vocab v;
    struct tokenizer_desc d;
    struct tokenizer *t;
    struct verr err;
    spm_vocab(&v, &d);
    d.model = "bert";
    cr_expect_eq(tokenizer_build(&t, &d, &err), VERR_UNSUPPORTED);
    cr_expect_null(t);
    cr_expect(strstr(err.msg, "bert"), "%s", err.msg);

    struct bpe_vocab bv;
    static const char *const none[] = {NULL}, *const extra[] = {NULL};
    bpe_vocab(&bv, &d, "klingon", none, extra);
    cr_expect_eq(tokenizer_build(&t, &d, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "klingon"), "%s", err.msg);

    spm_vocab(&v, &d);
    v.tokens[SPM_NORMAL + 1] = v.tokens[SPM_NORMAL + 2]; // "e" twice
    cr_expect_eq(tokenizer_build(&t, &d, &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "duplicate"), "%s", err.msg);

    // add_bos without a BOS token (gpt2's default id 11 is outside 5 tokens).
    const char *few[] = {"a", "b", "c", "d", "e"};
    tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.n_tokens = 5;
    d.tokens = few;
    d.add_bos = 1;
    cr_expect_eq(tokenizer_build(&t, &d, &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "bos_token_id"), "%s", err.msg);

    tokenizer_desc_init(&d);
    d.model = "llama";
    cr_expect_eq(tokenizer_build(&t, &d, &err), VERR_NOTFOUND, "no tokens");

    // Empty tokens get llama.cpp's placeholder; ids out of range are ignored.
    const char *with_empty[] = {"a", "", "b"};
    tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.n_tokens = 3;
    d.tokens = with_empty;
    d.eos = 99;
    cr_assert_eq(tokenizer_build(&t, &d, &err), 0, "%s", err.msg);
    cr_expect_str_eq(tokenizer_token_text(t, 1, NULL), "[EMPTY_1]");
    cr_expect_eq(tokenizer_eos(t), TOKENIZER_NULL);
    tokenizer_free(t);
}

Test(build, special_detection) {
    // Tokens that end generation are recognised by their text and become
    // control tokens, so parse_special cuts them out.
    const char *toks[] = {"a", "b", "<|im_end|>", "<|im_start|>", "<unused0>"};
    int32_t types[] = {1, 1, 1, 3, 3};
    struct tokenizer_desc d;
    tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = "qwen2";
    d.n_tokens = 5;
    d.tokens = toks;
    d.token_types = types;
    d.eos = 2;
    struct tokenizer *t = build(&d);
    cr_expect(tokenizer_is_eog(t, 2));
    cr_expect(tokenizer_is_control(t, 2));
    cr_expect_eq(tokenizer_eot(t), 2);
    cr_expect(!tokenizer_is_eog(t, 3));
    cr_expect(tokenizer_token_attr(t, 4) & TOKEN_ATTR_UNUSED);
    EXPECT_IDS(t, "<|im_start|>a<|im_end|>", false, true, 3, 0, 2);
    tokenizer_free(t);
}

// ---------------------------------------------------------------------------
// Loading from GGUF

Test(load, gguf_roundtrip) {
    struct vocab v;
    struct tokenizer_desc d;
    spm_vocab(&v, &d);
    char path[] = "/tmp/vela_test_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    struct gguf_writer *w = gguf_writer_new();
    cr_assert_not_null(w);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v.tokens, v.n);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v.scores, v.n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v.types, v.n);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    struct verr err;
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);

    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(&t, f, &err), 0, "%s", err.msg);
    gguf_close(f); // the tokenizer keeps its own copy
    unlink(path);
    cr_expect(tokenizer_add_eos(t));
    cr_expect_eq(tokenizer_bos(t), 1);
    cr_expect_eq(tokenizer_eos(t), 2);
    cr_expect_eq(tokenizer_unk(t), 0);
    cr_expect_float_eq(tokenizer_token_score(t, spm_id(SP "hello")), -0.5f, 0.0f);
    EXPECT_IDS(t, "hello world", true, false, 1, spm_id(SP "hello"), spm_id(SP "world"), 2);
    tokenizer_free(t);
}

Test(load, gguf_errors) {
    char path[] = "/tmp/vela_test_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    const char *toks[] = {"a", "b"};
    struct verr err;
    struct gguf_file *f;
    struct tokenizer *t;

    // gpt2 without merges.
    struct gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    cr_expect_eq(tokenizer_load(&t, f, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "merges"), "%s", err.msg);
    gguf_close(f);

    // No tokenizer at all.
    w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    cr_expect_eq(tokenizer_load(&t, f, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "tokenizer.ggml.model"), "%s", err.msg);
    gguf_close(f);

    // Scores of the wrong type, and too few token types.
    w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.scores", toks, 2);
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    cr_expect_eq(tokenizer_load(&t, f, &err), VERR_TYPE, "%s", err.msg);
    gguf_close(f);

    w = gguf_writer_new();
    int32_t one_type = 1;
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, &one_type, 1);
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    cr_expect_eq(tokenizer_load(&t, f, &err), VERR_FORMAT, "%s", err.msg);
    gguf_close(f);
    unlink(path);
}
