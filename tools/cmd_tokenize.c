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

static void usage(FILE *out) {
    fprintf(out, "usage: vela tokenize -m FILE (-p TEXT | -f FILE | --stdin) [options]\n"
                 "\n"
                 "Tokenizes text with the vocabulary of a GGUF model and prints one line per\n"
                 "token, \"    ID -> 'PIECE'\", as llama.cpp's llama-tokenize.\n"
                 "\n"
                 "options:\n"
                 "  -m, --model FILE      GGUF file holding the tokenizer (tokenizer.ggml.*)\n"
                 "  -p, --prompt TEXT     the text to tokenize\n"
                 "  -f, --file FILE       read the text from FILE\n"
                 "      --stdin           read the text from standard input\n"
                 "      --ids             print only the ids, as [1, 2, 3]\n"
                 "      --show-pieces     print \"ID -> 'PIECE'\" lines (the default)\n"
                 "      --show-count      also print the number of tokens\n"
                 "      --no-bos          add no BOS / EOS even where the model asks for them\n"
                 "      --no-parse-special  read control tokens in the text (\"<|im_start|>\") as\n"
                 "                        plain text\n"
                 "      --no-escape       take \\n, \\t, \\xHH, ... in the text literally\n"
                 "  -h, --help            show this help\n"
                 "\n"
                 "exit status: 0 ok, 1 runtime error (unreadable file, bad vocabulary), 2 usage\n");
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

enum source { SRC_NONE, SRC_PROMPT, SRC_FILE, SRC_STDIN };

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *arg = NULL;
    enum source src = SRC_NONE;
    bool ids_only = false, show_count = false, no_bos = false, parse_special = true;
    bool escapes = true;
    struct verr err = {0};
    for (int i = 1; i < argc;) {
        const char *a = argv[i];
        enum source s = SRC_NONE;
        if (args_is(a, "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (args_is(a, "--model", "-m")) {
            if (args_value_str(argc, argv, &i, &model, &err))
                goto usage_error;
            continue;
        } else if (args_is(a, "--prompt", "-p")) {
            s = SRC_PROMPT;
        } else if (args_is(a, "--file", "-f")) {
            s = SRC_FILE;
        } else if (args_is(a, "--stdin", NULL)) {
            s = SRC_STDIN;
        } else if (args_is(a, "--ids", NULL)) {
            ids_only = true;
        } else if (args_is(a, "--show-pieces", NULL)) {
            ids_only = false;
        } else if (args_is(a, "--show-count", NULL)) {
            show_count = true;
        } else if (args_is(a, "--no-bos", NULL)) {
            no_bos = true;
        } else if (args_is(a, "--no-parse-special", NULL)) {
            parse_special = false;
        } else if (args_is(a, "--no-escape", NULL)) {
            escapes = false;
        } else {
            verr_set(&err, VERR_RANGE, "unknown option '%s'", a);
            goto usage_error;
        }
        if (s != SRC_NONE) {
            if (src != SRC_NONE) {
                verr_set(&err, VERR_RANGE,
                         "%s: give the text once (-p, -f and --stdin exclude "
                         "each other)",
                         a);
                goto usage_error;
            }
            src = s;
            if (s != SRC_STDIN) {
                if (args_value_str(argc, argv, &i, &arg, &err))
                    goto usage_error;
                continue;
            }
        }
        i++;
    }
    if (!model) {
        verr_set(&err, VERR_RANGE, "-m FILE is required");
        goto usage_error;
    }
    if (src == SRC_NONE) {
        verr_set(&err, VERR_RANGE, "the text is missing: give -p TEXT, -f FILE or --stdin");
        goto usage_error;
    }

    struct gguf_file *g = NULL;
    struct tokenizer *t = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    int n = 0, status = 1;
    size_t len = 0;
    if (gguf_open(&g, model, &err) || tokenizer_load(&t, g, &err)) {
        fprintf(stderr, "vela tokenize: %s\n", err.msg);
        goto done;
    }
    if (src == SRC_PROMPT) {
        len = strlen(arg);
        text = malloc(len + 1);
        if (text)
            memcpy(text, arg, len + 1);
    } else {
        FILE *f = src == SRC_STDIN ? stdin : fopen(arg, "rb");
        if (!f) {
            fprintf(stderr, "vela tokenize: %s: %s\n", arg, strerror(errno));
            goto done;
        }
        text = read_stream(f, &len);
        if (!text)
            fprintf(stderr, "vela tokenize: %s: read failed\n", src == SRC_STDIN ? "stdin" : arg);
        if (f != stdin)
            fclose(f);
    }
    if (!text) {
        if (src == SRC_PROMPT)
            fprintf(stderr, "vela tokenize: out of memory\n");
        goto done;
    }
    if (escapes)
        len = process_escapes(text, len);
    // As llama-tokenize: special tokens are added only when the model asks
    // for a BOS, and --no-bos turns them all off.
    bool add_special = tokenizer_add_bos(t) && !no_bos;
    if (tokenizer_encode_alloc(t, text, len, add_special, parse_special, &ids, &n, &err)) {
        fprintf(stderr, "vela tokenize: %s\n", err.msg);
        goto done;
    }
    if (ids_only) {
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
    if (show_count)
        printf("Total number of tokens: %d\n", n);
    status = fflush(stdout) == 0 ? 0 : 1;
done:
    free(ids);
    free(text);
    tokenizer_free(t);
    gguf_close(g);
    return status;

usage_error:
    fprintf(stderr, "vela tokenize: %s\n", err.msg);
    fprintf(stderr, "Try 'vela tokenize --help'.\n");
    return 2;
}
