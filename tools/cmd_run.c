// vela run: generate text from a prompt, streaming it to stdout, with the
// timings on stderr at the end (llama-cli's main loop).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/args.h"
#include "host/engine.h"
#include "tools/cmds.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: vela run -m MODEL [-p PROMPT | -f FILE] [options]\n\n"
        "Generates text from a prompt and streams it to stdout; load time, prompt and\n"
        "generation speed go to stderr at the end.\n\n"
        "prompt and generation:\n"
        "  -p, --prompt TEXT         prompt (escapes \\n \\t \\\\ \\xNN are processed; default: "
        "empty = BOS)\n"
        "  -f, --file FILE           read the prompt from FILE (one trailing newline dropped)\n"
        "  -n, --n-predict N         tokens to generate, -1 = until end of generation or a "
        "full context (default: -1)\n"
        "  --no-display-prompt       do not print the prompt before the generated text\n"
        "  --no-escape               take -p literally\n"
        "  -np, --parallel N         sample N sequences from the one prompt, sharing its KV "
        "cells (default: 1)\n"
        "  --context-shift           when the context is full, drop half of it after --keep "
        "tokens and go on\n"
        "  --no-context-shift        stop when the context is full (default)\n"
        "  --keep N                  tokens of the prompt kept on a context shift, -1 = all "
        "(default: 0; BOS is always kept)\n"
        "  -gan, --grp-attn-n N      self-extend group factor, 1 = off (default: 1)\n"
        "  -gaw, --grp-attn-w N      self-extend group width (default: 512)\n"
        "  -h, --help                this help\n");
    args_help_model(out);
    args_help_sampler(out);
}

// llama.cpp's string_process_escapes: \n \r \t \' \" \\ \xNN; anything else stays.
static void process_escapes(char *s) {
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r != '\\' || !r[1]) {
            *w++ = *r;
            continue;
        }
        char c = *++r;
        switch (c) {
        case 'n':
            *w++ = '\n';
            break;
        case 'r':
            *w++ = '\r';
            break;
        case 't':
            *w++ = '\t';
            break;
        case '\'':
            *w++ = '\'';
            break;
        case '"':
            *w++ = '"';
            break;
        case '\\':
            *w++ = '\\';
            break;
        case 'x': {
            int v = 0, nd = 0;
            while (nd < 2) {
                char h = r[1 + nd];
                int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (d < 0)
                    break;
                v = v * 16 + d;
                nd++;
            }
            if (nd == 2) {
                *w++ = (char)v;
                r += 2;
            } else {
                *w++ = '\\';
                *w++ = 'x';
            }
            break;
        }
        default:
            *w++ = '\\';
            *w++ = c;
        }
    }
    *w = '\0';
}

// Reads a whole file into a NUL-terminated buffer; drops one trailing newline
// as llama.cpp's -f does.
static char *read_prompt_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf)
            break;
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    if (!buf)
        return NULL;
    if (len > 0 && buf[len - 1] == '\n')
        len--;
    buf[len] = '\0';
    *len_out = len;
    return buf;
}

struct run_out {
    int n_parallel;
    char **texts; // [n_parallel] collected text when n_parallel > 1
    size_t *lens;
    size_t *caps;
    const char **why;
    bool verbose;
};

static int on_event(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                    size_t len) {
    struct run_out *o = user;
    switch (ev) {
    case ENGINE_EV_TOKEN:
        if (o->n_parallel == 1) {
            fwrite(text, 1, len, stdout);
            fflush(stdout);
        } else if (len) {
            if (o->lens[seq] + len + 1 > o->caps[seq]) {
                size_t nc = (o->lens[seq] + len + 1) * 2;
                char *nb = realloc(o->texts[seq], nc);
                if (!nb)
                    return 1;
                o->texts[seq] = nb;
                o->caps[seq] = nc;
            }
            memcpy(o->texts[seq] + o->lens[seq], text, len);
            o->lens[seq] += len;
            o->texts[seq][o->lens[seq]] = '\0';
        }
        break;
    case ENGINE_EV_DONE:
        o->why[seq] = text; // static strings from the engine
        break;
    case ENGINE_EV_NOTE:
        if (o->verbose)
            fprintf(stderr, "vela: %.*s\n", (int)len, text);
        break;
    }
    (void)token;
    return 0;
}

int cmd_run(int argc, char **argv) {
    struct args_model am;
    args_model_default(&am);
    struct engine_gen_params gp;
    engine_gen_params_default(&gp);
    const char *prompt_arg = NULL, *prompt_file = NULL;
    bool display_prompt = true, escape = true;
    struct verr err = {0};

    for (int i = 1; i < argc;) {
        const char *arg = argv[i];
        int rc;
        if (args_is(arg, "-h", "--help")) {
            usage(stdout);
            return 0;
        }
        if ((rc = args_parse_model(&am, argc, argv, &i, &err)) != 0 ||
            (rc = args_parse_sampler(&gp.sp, argc, argv, &i, &err)) != 0) {
            if (rc < 0) {
                fprintf(stderr, "vela run: %s\n", err.msg);
                return 2;
            }
            continue;
        }
        if (args_is(arg, "-p", "--prompt"))
            rc = args_value_str(argc, argv, &i, &prompt_arg, &err);
        else if (args_is(arg, "-f", "--file"))
            rc = args_value_str(argc, argv, &i, &prompt_file, &err);
        else if (args_is(arg, "-n", "--n-predict"))
            rc = args_value_int(argc, argv, &i, -1, 1L << 30, &gp.n_predict, &err);
        else if (args_is(arg, "-np", "--parallel"))
            rc = args_value_int(argc, argv, &i, 1, 256, &gp.n_parallel, &err);
        else if (args_is(arg, "--keep", NULL))
            rc = args_value_int(argc, argv, &i, -1, 1L << 30, &gp.n_keep, &err);
        else if (args_is(arg, "-gan", "--grp-attn-n"))
            rc = args_value_int(argc, argv, &i, 1, 1L << 20, &gp.ga_n, &err);
        else if (args_is(arg, "-gaw", "--grp-attn-w"))
            rc = args_value_int(argc, argv, &i, 1, 1L << 30, &gp.ga_w, &err);
        else if (args_is(arg, "--context-shift", NULL))
            gp.ctx_shift = true, i++;
        else if (args_is(arg, "--no-context-shift", NULL))
            gp.ctx_shift = false, i++;
        else if (args_is(arg, "--no-display-prompt", NULL))
            display_prompt = false, i++;
        else if (args_is(arg, "--no-escape", NULL))
            escape = false, i++;
        else if (args_is(arg, "-e", "--escape"))
            escape = true, i++;
        else {
            fprintf(stderr, "vela run: unknown option '%s' (see 'vela run --help')\n", arg);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "vela run: %s\n", err.msg);
            return 2;
        }
    }
    if (!am.model_path) {
        fprintf(stderr,
                "vela run: no model given: pass -m MODEL.gguf (a synthetic test model can be "
                "written with 'vela mkmodel')\n");
        return 2;
    }
    if (prompt_arg && prompt_file) {
        fprintf(stderr, "vela run: give -p or -f, not both\n");
        return 2;
    }

    char *prompt = NULL;
    size_t prompt_len = 0;
    if (prompt_file) {
        prompt = read_prompt_file(prompt_file, &prompt_len);
        if (!prompt) {
            fprintf(stderr, "vela run: cannot read prompt file '%s'\n", prompt_file);
            return 1;
        }
    } else {
        prompt = strdup(prompt_arg ? prompt_arg : "");
        if (prompt && escape)
            process_escapes(prompt);
        prompt_len = prompt ? strlen(prompt) : 0;
    }
    if (!prompt) {
        fprintf(stderr, "vela run: out of memory\n");
        return 1;
    }

    int status = 1;
    struct engine *e = NULL;
    int32_t *tokens = NULL;
    struct run_out out = {0};
    struct engine_open_params op = {
        .n_seq_max = gp.n_parallel, .n_outputs_max = gp.n_parallel, .need_tokenizer = true};
    if (engine_open(&e, &am, &op, &err)) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        goto done;
    }
    if (am.verbose) {
        char desc[2048];
        engine_describe(e, desc, sizeof desc);
        fprintf(stderr, "%s\n", desc);
    }
    int n_tok = 0;
    if (tokenizer_encode_alloc(e->tok, prompt, prompt_len, true, true, &tokens, &n_tok, &err)) {
        fprintf(stderr, "vela run: tokenizing the prompt: %s\n", err.msg);
        goto done;
    }
    if (n_tok == 0) {
        // llama-cli: an empty prompt starts from BOS
        int32_t bos = tokenizer_bos(e->tok);
        if (bos < 0) {
            fprintf(stderr, "vela run: the prompt is empty and the vocabulary has no BOS token\n");
            goto done;
        }
        free(tokens);
        tokens = malloc(sizeof *tokens);
        tokens[0] = bos;
        n_tok = 1;
    }
    const int n_ctx = e->fc.cfg.n_ctx;
    if (n_tok > n_ctx - 4) {
        fprintf(stderr, "vela run: prompt is too long (%d tokens, max %d)\n", n_tok, n_ctx - 4);
        goto done;
    }
    out.n_parallel = gp.n_parallel;
    out.verbose = am.verbose;
    out.texts = calloc((size_t)gp.n_parallel, sizeof *out.texts);
    out.lens = calloc((size_t)gp.n_parallel, sizeof *out.lens);
    out.caps = calloc((size_t)gp.n_parallel, sizeof *out.caps);
    out.why = calloc((size_t)gp.n_parallel, sizeof *out.why);
    if (!out.texts || !out.lens || !out.caps || !out.why) {
        fprintf(stderr, "vela run: out of memory\n");
        goto done;
    }
    if (am.verbose)
        fprintf(stderr, "vela: prompt: %d tokens\n", n_tok);
    if (display_prompt && gp.n_parallel == 1) {
        fwrite(prompt, 1, prompt_len, stdout);
        fflush(stdout);
    }
    struct engine_stats st;
    int rc = engine_generate(e, tokens, n_tok, &gp, on_event, &out, &st, &err);
    if (gp.n_parallel == 1)
        fputc('\n', stdout);
    else
        for (int s = 0; s < gp.n_parallel; s++)
            printf("[sequence %d]%s%.*s%s\n", s, display_prompt ? "\n" : " ",
                   display_prompt ? (int)prompt_len : 0, prompt, out.texts[s] ? out.texts[s] : "");
    fflush(stdout);
    if (rc) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        goto done;
    }
    for (int s = 0; s < gp.n_parallel; s++)
        if (out.why[s] && !strcmp(out.why[s], "context full"))
            fprintf(stderr, "vela: sequence %d: context full (%d tokens)%s\n", s, n_ctx,
                    gp.ctx_shift ? "" : "; --context-shift would go on");
    fprintf(stderr, "vela: sampler seed: %u\n", st.seed);
    fprintf(stderr, "vela: load time:   %10.2f ms\n", e->t_load_ms);
    fprintf(stderr, "vela: prompt eval: %10.2f ms / %5d tokens (%10.2f tokens/s)\n", st.t_prompt_ms,
            st.n_prompt, st.t_prompt_ms > 0 ? 1e3 * st.n_prompt / st.t_prompt_ms : 0.0);
    fprintf(stderr, "vela: generation:  %10.2f ms / %5d tokens (%10.2f tokens/s)\n", st.t_gen_ms,
            st.n_gen, st.t_gen_ms > 0 ? 1e3 * st.n_gen / st.t_gen_ms : 0.0);
    if (st.n_ctx_shifts)
        fprintf(stderr, "vela: context shifts: %d\n", st.n_ctx_shifts);
    status = 0;
done:
    if (out.texts)
        for (int s = 0; s < out.n_parallel; s++)
            free(out.texts[s]);
    free(out.texts);
    free(out.lens);
    free(out.caps);
    free(out.why);
    free(tokens);
    free(prompt);
    engine_close(e);
    return status;
}
