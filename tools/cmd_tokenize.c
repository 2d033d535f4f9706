// vela tokenize: tokenizes text with a GGUF model's vocabulary and prints
// the tokens as llama.cpp's llama-tokenize does ("    id -> 'piece'" lines,
// or [id, id, ...] with --ids). Only the tokenizer.ggml.* keys are read.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "host/tokenizer/tokenizer.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"

static void usage(FILE *out) {
    fprintf(out, "usage: vela tokenize -m FILE (-p TEXT | -f FILE | --stdin) [options]\n"
                 "\n"
                 "Tokenizes text with the vocabulary of a GGUF model and prints one line per\n"
                 "token, \"    ID -> 'PIECE'\", as llama.cpp's llama-tokenize.\n"
                 "\n");
    flags_help(out, &cli_flags, CLI_TOKENIZE);
    fprintf(out,
            "\nexit status: 0 ok, 1 runtime error (unreadable file, bad vocabulary), 2 usage\n");
}

// Reads a whole stream into a malloc'd buffer.
static char *read_stream(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

// llama.cpp's escape processing of prompts, in place: \n \r \t \' \" \\ and
// \xHH; any other backslash sequence is kept as written.
static size_t process_escapes(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            s[o++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n':
            s[o++] = '\n';
            break;
        case 'r':
            s[o++] = '\r';
            break;
        case 't':
            s[o++] = '\t';
            break;
        case '\'':
        case '"':
        case '\\':
            s[o++] = c;
            break;
        case 'x':
            if (i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
                s[o++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
                i += 2;
                break;
            }
            s[o++] = '\\';
            s[o++] = c;
            break;
        default:
            s[o++] = '\\';
            s[o++] = c;
            break;
        }
    }
    return o;
}

// The text to tokenize (-p's, or read from -f's file or stdin) in a malloc'd
// buffer of *len bytes, escapes processed unless --no-escape; NULL when it
// fails (printed).
static char *read_text(const struct cli *c, size_t *len) {
    char *text = NULL;
    const char *arg = c->tok.text;
    if (c->tok.src == CLI_TEXT_PROMPT) {
        *len = strlen(arg);
        text = malloc(*len + 1);
        if (text)
            memcpy(text, arg, *len + 1);
        else
            fprintf(stderr, "vela tokenize: out of memory\n");
    } else {
        const bool in = c->tok.src == CLI_TEXT_STDIN;
        FILE *f = in ? stdin : fopen(arg, "rb");
        if (!f) {
            fprintf(stderr, "vela tokenize: %s: %s\n", arg, strerror(errno));
            return NULL;
        }
        text = read_stream(f, len);
        if (!text)
            fprintf(stderr, "vela tokenize: %s: read failed\n", in ? "stdin" : arg);
        if (f != stdin)
            fclose(f);
    }
    if (text && c->tok.escapes)
        *len = process_escapes(text, *len);
    return text;
}

static void print_tokens(const struct cli *c, const struct tokenizer *t, const int32_t *ids,
                         int n) {
    if (c->tok.ids_only) {
        printf("[");
        for (int i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    } else {
        for (int i = 0; i < n; i++) {
            const char *p;
            size_t pl;
            tokenizer_piece(t, ids[i], true, &p, &pl, NULL);
            printf("%6d -> '", ids[i]);
            fwrite(p, 1, pl, stdout);
            printf("'\n");
        }
    }
    if (c->tok.show_count)
        printf("Total number of tokens: %d\n", n);
}

int cmd_tokenize(int argc, char **argv) {
    static struct cli c; // large: off the stack
    cli_defaults(&c);
    int status = tools_parse("tokenize", CLI_TOKENIZE, usage, &c, argc, argv, 0);
    if (status >= 0)
        return status;
    const char *missing = !c.am.model_path ? "-m FILE is required"
                          : c.tok.src == CLI_TEXT_NONE
                              ? "the text is missing: give -p TEXT, -f FILE or --stdin"
                              : NULL;
    if (missing) {
        fprintf(stderr, "vela tokenize: %s\nTry 'vela tokenize --help'.\n", missing);
        return 2;
    }
    struct verr err = {0};
    struct gguf_file *g = NULL;
    struct tokenizer *t = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    int n = 0;
    size_t len = 0;
    status = 1;
    if (gguf_open(&g, c.am.model_path, &err) || tokenizer_load(&t, g, &err)) {
        fprintf(stderr, "vela tokenize: %s\n", err.msg);
        goto done;
    }
    if (!(text = read_text(&c, &len)))
        goto done;
    // As llama-tokenize: special tokens are added only when the model asks
    // for a BOS, and --no-bos turns them all off.
    bool add_special = tokenizer_add_bos(t) && !c.tok.no_bos;
    if (tokenizer_encode_alloc(t, text, len, add_special, c.tok.parse_special, &ids, &n, &err)) {
        fprintf(stderr, "vela tokenize: %s\n", err.msg);
        goto done;
    }
    print_tokens(&c, t, ids, n);
    status = fflush(stdout) == 0 ? 0 : 1;
done:
    free(ids);
    free(text);
    tokenizer_free(t);
    gguf_close(g);
    return status;
}
