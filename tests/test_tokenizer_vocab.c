// Conformance with llama.cpp on real vocabularies: every
// $VELA_SHARED_DIR/vocab/*.gguf with its .inp / .out pair, as llama.cpp's
// tests/test-tokenizer-0 reads them: the .inp cases are separated by
// "\n__ggml_vocab_test__\n" (so a case never carries the newline before
// the separator), the .out has one line of ids per case, and the ids come
// from tokenizing with add_special = false (no BOS / EOS) and
// parse_special = false. Every case of every file must match exactly.
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "host/tokenizer/tokenizer.h"
#include "vocab_cases.h"

// The vocabulary directory, or NULL (with a note on stderr) when absent.
static const char *vocab_dir(void) {
    static char dir[4096];
    const char *shared = getenv("VELA_SHARED_DIR");
    if (shared) {
        snprintf(dir, sizeof dir, "%s/vocab", shared);
        DIR *d = opendir(dir);
        if (d) {
            closedir(d);
            return dir;
        }
    }
    fprintf(stderr,
            "SKIP: VELA_SHARED_DIR/vocab not found (VELA_SHARED_DIR=%s); the "
            "conformance tests against llama.cpp's vocabularies need ../shared/vocab\n",
            shared ? shared : "(unset)");
    return NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Names of the *.gguf files in dir that have a .inp and a .out, sorted.
static int list_vocabs(const char *dir, char names[][256], int max) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    char *tmp[64];
    while (d && (e = readdir(d)) && n < max && n < 64) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".gguf") || l >= 240)
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s.out", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f)
            continue;
        fclose(f);
        tmp[n] = strdup(e->d_name);
        n++;
    }
    if (d)
        closedir(d);
    qsort(tmp, (size_t)n, sizeof tmp[0], cmp_str);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 256, "%s", tmp[i]);
        free(tmp[i]);
    }
    return n;
}

struct vocab_file {
    struct gguf_file *g;
    struct tokenizer *t;
    char *inp, *out;
    size_t inp_len, out_len;
};

static void open_vocab(struct vocab_file *v, const char *dir, const char *name) {
    char p[4096];
    struct verr err;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(gguf_open(&v->g, p, &err), 0, "%s", err.msg);
    cr_assert_eq(tokenizer_load(&v->t, v->g, &err), 0, "%s", err.msg);
    snprintf(p, sizeof p, "%s/%s.inp", dir, name);
    v->inp = vocab_slurp(p, &v->inp_len);
    cr_assert_not_null(v->inp, "%s missing", p);
    snprintf(p, sizeof p, "%s/%s.out", dir, name);
    v->out = vocab_slurp(p, &v->out_len);
    cr_assert_not_null(v->out, "%s missing", p);
}

static void close_vocab(struct vocab_file *v) {
    tokenizer_free(v->t);
    gguf_close(v->g);
    free(v->inp);
    free(v->out);
}

Test(vocab, llama_cpp_conformance) {
    const char *dir = vocab_dir();
    if (!dir)
        cr_skip_test("VELA_SHARED_DIR/vocab not found: conformance against llama.cpp skipped");
    static char names[64][256];
    int n_files = list_vocabs(dir, names, 64);
    cr_assert_gt(n_files, 0, "no *.gguf with .inp/.out in %s", dir);
    int total_bad = 0;
    for (int fi = 0; fi < n_files; fi++) {
        struct vocab_file v;
        open_vocab(&v, dir, names[fi]);
        struct vocab_cursor c = {v.inp, v.inp + v.inp_len, v.out, v.out + v.out_len, false};
        const char *text;
        size_t len;
        static int32_t want[4096];
        int n_want, n_cases = 0, n_ok = 0;
        while (vocab_next_case(&c, &text, &len, want, &n_want, 4096)) {
            n_cases++;
            int32_t *got;
            int n_got;
            struct verr err;
            cr_assert_eq(tokenizer_encode_alloc(v.t, text, len, false, false, &got, &n_got, &err),
                         0, "%s: %s", names[fi], err.msg);
            bool ok = n_got == n_want && (n_got == 0 || !memcmp(got, want, (size_t)n_got * 4));
            n_ok += ok;
            if (!ok) {
                fprintf(stderr, "  %s case %d '%.*s':\n", names[fi], n_cases, (int)len, text);
                vocab_print_ids("want", want, n_want);
                vocab_print_ids("got ", got, n_got);
            }
            free(got);
        }
        fprintf(stderr, "%s: %d/%d cases match llama.cpp\n", names[fi], n_ok, n_cases);
        cr_expect_eq(n_ok, n_cases, "%s: %d of %d cases differ from llama.cpp", names[fi],
                     n_cases - n_ok, n_cases);
        cr_expect_gt(n_cases, 0, "%s: no cases", names[fi]);
        total_bad += n_cases - n_ok;
        close_vocab(&v);
    }
    cr_expect_eq(total_bad, 0);
}

// add_special puts BOS in front exactly where the vocabulary asks for it,
// and parse_special finds every control token in text.
Test(vocab, special_tokens) {
    const char *dir = vocab_dir();
    if (!dir)
        cr_skip_test("VELA_SHARED_DIR/vocab not found: skipped");
    static char names[64][256];
    int n_files = list_vocabs(dir, names, 64);
    for (int fi = 0; fi < n_files; fi++) {
        struct vocab_file v;
        open_vocab(&v, dir, names[fi]);
        struct tokenizer *t = v.t;
        int32_t *ids;
        int n;
        struct verr err;
        cr_assert_eq(tokenizer_encode_alloc(t, "Hello world", 11, true, false, &ids, &n, &err), 0);
        cr_assert_gt(n, 1);
        if (tokenizer_add_bos(t))
            cr_expect_eq(ids[0], tokenizer_bos(t), "%s: BOS first", names[fi]);
        else
            cr_expect_neq(ids[0], tokenizer_bos(t), "%s: no BOS", names[fi]);
        free(ids);
        for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
            if (!tokenizer_is_control(t, id))
                continue;
            size_t len;
            const char *s = tokenizer_token_text(t, id, &len);
            char text[300];
            int tl = snprintf(text, sizeof text, "x %.*s y", (int)(len < 200 ? len : 200), s);
            cr_assert_eq(tokenizer_encode_alloc(t, text, (size_t)tl, false, true, &ids, &n, &err),
                         0);
            bool found = false;
            for (int i = 0; i < n; i++)
                found |= ids[i] == id;
            cr_expect(found, "%s: control token %d '%s' not parsed", names[fi], id, s);
            free(ids);
        }
        close_vocab(&v);
    }
}

// Decoding the ids of every case gives the text back where the vocabulary
// keeps text as is (SentencePiece; byte-level BPE without llama.cpp's
// space clean-up), and random bytes never break the tokenizer.
Test(vocab, round_trip_and_garbage) {
    const char *dir = vocab_dir();
    if (!dir)
        cr_skip_test("VELA_SHARED_DIR/vocab not found: skipped");
    static char names[64][256];
    int n_files = list_vocabs(dir, names, 64);
    for (int fi = 0; fi < n_files; fi++) {
        struct vocab_file v;
        open_vocab(&v, dir, names[fi]);
        struct tokenizer *t = v.t;
        // A vocabulary keeps text as is when " ," survives a round trip.
        int32_t *ids;
        int n;
        char *s;
        size_t len;
        struct verr err;
        cr_assert_eq(tokenizer_encode_alloc(t, "a ,", 3, false, false, &ids, &n, &err), 0);
        cr_assert_eq(tokenizer_decode(t, ids, n, false, false, &s, &len, &err), 0);
        bool lossless = !strcmp(s, "a ,");
        free(s);
        free(ids);
        struct vocab_cursor c = {v.inp, v.inp + v.inp_len, v.out, v.out + v.out_len, false};
        const char *text;
        static int32_t want[4096];
        int n_want, n_cases = 0, n_ok = 0;
        while (vocab_next_case(&c, &text, &len, want, &n_want, 4096)) {
            n_cases++;
            cr_assert_eq(tokenizer_encode_alloc(t, text, len, false, false, &ids, &n, &err), 0);
            size_t dl;
            cr_assert_eq(tokenizer_decode(t, ids, n, false, false, &s, &dl, &err), 0);
            bool ok = dl == len && !memcmp(s, text, len);
            n_ok += ok;
            if (lossless)
                cr_expect(ok, "%s: round trip of '%.*s' gave '%s'", names[fi], (int)len, text, s);
            free(s);
            free(ids);
        }
        fprintf(stderr, "%s: %d/%d cases decode back to their text%s\n", names[fi], n_ok, n_cases,
                lossless ? "" : " (the vocabulary cleans up spaces)");

        srand(1234);
        for (int k = 0; k < 300; k++) {
            char buf[96];
            size_t bl = (size_t)(rand() % 95) + 1;
            for (size_t i = 0; i < bl; i++)
                buf[i] = (char)(rand() % 4 ? rand() % 128 : rand() % 256);
            cr_assert_eq(tokenizer_encode_alloc(t, buf, bl, true, k & 1, &ids, &n, &err), 0, "%s",
                         err.msg);
            for (int i = 0; i < n; i++)
                cr_assert(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t));
            cr_assert_eq(tokenizer_decode(t, ids, n, true, true, &s, &len, &err), 0);
            free(s);
            free(ids);
        }
        close_vocab(&v);
    }
}
