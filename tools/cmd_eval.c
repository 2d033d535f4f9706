// vela eval: evaluate tokens as one sequence and write the logits of every
// position (raw little-endian float32, n_tokens x n_vocab, row-major),
// optionally with self-extend (--grp-attn-n/-w) regrouping the positions.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/engine/engine.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/default_model.h"
#include "tools/progress.h"

// The least context the step API takes for one slot (host/engine/step.c):
// a text of fewer tokens still gets this many cells (-c's help says so).
#define EVAL_CTX_MIN 5

static void usage(FILE *out) {
    fprintf(out, "usage: vela eval -m MODEL (--tokens 1,2,3 | -p TEXT | -f FILE) [options]\n\n"
                 "Evaluates the tokens as one sequence from position 0, in batches of -b, and\n"
                 "writes the logits of every position as raw little-endian float32\n"
                 "(n_tokens x n_vocab, row-major) to --logits-out.\n\n");
    flags_help(out, &cli_flags, CLI_EVAL);
}

// Parses "1,2,3" (spaces allowed around ids). Returns 0 or an error message in err.
static int parse_tokens(const char *s, int32_t **out, int *n_out, struct verr *err) {
    int cap = 16, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (v) {
        while (*p == ' ')
            p++;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX) {
            free(v);
            return verr_set(err, VERR_RANGE, "--tokens: '%s' is not a list of token ids", s);
        }
        if (n == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv)
                break;
            v = nv;
        }
        v[n++] = (int32_t)x;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == '\0')
            break;
        if (*p != ',') {
            free(v);
            return verr_set(err, VERR_RANGE, "--tokens: '%s' is not a list of token ids", s);
        }
        p++;
    }
    if (!v)
        return verr_set(err, VERR_NOMEM, "out of memory");
    *out = v;
    *n_out = n;
    return 0;
}

struct eval_out {
    FILE *f;
    int n_vocab;
    float *last; // [n_vocab] logits of the last position seen
};

static int write_rows(void *user, int first_pos, int n, const float *logits) {
    struct eval_out *o = user;
    (void)first_pos;
    // The host is little-endian (x86-64, aarch64), so the floats go out as they are.
    if (o->f && fwrite(logits, sizeof(float) * (size_t)o->n_vocab, (size_t)n, o->f) != (size_t)n)
        return 1;
    memcpy(o->last, logits + (size_t)(n - 1) * o->n_vocab, sizeof(float) * (size_t)o->n_vocab);
    return 0;
}

// Self-extend's "shift:" / "div:" lines, with -v.
static int on_note(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                   size_t len) {
    const struct args_model *am = user;
    (void)seq;
    (void)token;
    if (ev == ENGINE_EV_NOTE && am->verbose)
        fprintf(stderr, "vela: %.*s\n", (int)len, text);
    return 0;
}

// Flags that are missing or exclude each other; 0 or the usage status 2 (printed).
static int check_eval_flags(const struct cli *f) {
    const struct engine_eval_params *ep = &f->ep;
    if (!f->am.model_path) {
        fprintf(stderr,
                "vela eval: no model given: pass -m MODEL.gguf (a synthetic test model can be "
                "written with 'vela mkmodel')\n");
        return 2;
    }
    if (ep->ga_n != 1 && ep->ga_w % ep->ga_n != 0) {
        fprintf(stderr, "vela eval: --grp-attn-w %d must be a multiple of --grp-attn-n %d\n",
                ep->ga_w, ep->ga_n);
        return 2;
    }
    if (ep->ga_n != 1 && f->am.se_g > 1) {
        fprintf(stderr, "vela eval: --self-extend and --grp-attn-n exclude each other\n");
        return 2;
    }
    if (!!f->eval.tokens + !!f->prompt + !!f->prompt_file != 1) {
        fprintf(stderr, "vela eval: give exactly one of --tokens, -p, -f\n");
        return 2;
    }
    return 0;
}

// Parses the command line into f; -1 to go on, else the exit status (help
// printed: 0; a usage error printed: 2).
static int parse_eval(struct cli *f, int argc, char **argv) {
    cli_defaults(f);
    int st = tools_parse("eval", CLI_EVAL, usage, f, argc, argv, 0);
    if (st >= 0)
        return st;
    f->ep = (struct engine_eval_params){
        .ga_n = f->gp.ga_n, .ga_w = f->gp.ga_w, .cb = on_note, .user = &f->am};
    st = check_eval_flags(f);
    if (st)
        return st;
    tools_note_synthetic("eval", f->am.model_path);
    return -1;
}

// The engine with a context for the tokens unless -c says otherwise; with
// text (*text, from -p or -f) the count is known only once the tokenizer is
// loaded, so the context is opened again for it and *tokens filled then.
// Non-zero when it fails (printed).
static int open_for_tokens(const struct cli *f, const char *text, size_t text_len, int32_t **tokens,
                           int *n_tok, struct engine **e) {
    const struct args_model *am = &f->am;
    struct engine_config op;
    args_engine_config(am, &op);
    op.ctx.n_seq_max = 1;
    op.need_tokenizer = !!text;
    op.ctx.n_ctx = am->n_ctx > 0 ? am->n_ctx : (*n_tok > EVAL_CTX_MIN ? *n_tok : EVAL_CTX_MIN);
    op.ctx.n_outputs_max = am->n_batch < op.ctx.n_ctx ? am->n_batch : op.ctx.n_ctx;
    struct load_progress lprog;
    load_progress_init(&lprog, "vela eval", am->no_progress);
    op.progress = load_progress_update;
    op.progress_user = &lprog;
    struct verr err = {0};
    if (engine_open(e, &op, &err)) {
        fprintf(stderr, "vela eval: %s\n", err.msg);
        return 1;
    }
    if (!text)
        return 0;
    if (tokenizer_encode_alloc((*e)->tok, text, text_len, true, true, tokens, n_tok, &err)) {
        fprintf(stderr, "vela eval: tokenizing: %s\n", err.msg);
        return 1;
    }
    if (*n_tok == 0) {
        fprintf(stderr, "vela eval: the text gives no tokens\n");
        return 1;
    }
    const int want = *n_tok > EVAL_CTX_MIN ? *n_tok : EVAL_CTX_MIN;
    if (am->n_ctx == 0 && want != context_config((*e)->ctx)->n_ctx) {
        struct forward_config cfg = *context_config((*e)->ctx);
        cfg.n_ctx = want;
        cfg.n_batch = am->n_batch < want ? am->n_batch : want;
        cfg.n_outputs_max = cfg.n_batch;
        if (engine_reopen(*e, &cfg, &err)) {
            fprintf(stderr, "vela eval: %s\n", err.msg);
            return 1;
        }
    }
    return 0;
}

// What eval prints on stdout once every row is written.
static void say_summary(const struct cli *f, const struct engine *e, const struct eval_out *out,
                        int n_tok, double t_ms) {
    const int V = out->n_vocab;
    int best = 0;
    for (int v = 1; v < V; v++)
        if (out->last[v] > out->last[best])
            best = v;
    const char *piece = "";
    size_t plen = 0;
    if (e->tok && best < tokenizer_n_vocab(e->tok))
        tokenizer_piece(e->tok, best, true, &piece, &plen, NULL);
    printf("n_tokens: %d\nn_vocab: %d\ntop1_last: %d (logit %.6f, piece '%.*s')\n"
           "time: %.2f ms (%.2f tokens/s, %s)\n",
           n_tok, V, best, out->last[best], (int)plen, piece, t_ms,
           t_ms > 0 ? 1e3 * n_tok / t_ms : 0.0, context_backend_name(e->ctx));
    if (f->eval.logits_out)
        printf("logits: %s (%d x %d float32)\n", f->eval.logits_out, n_tok, V);
}

// Checks the tokens against the model and evaluates them into out (the
// logits file, when asked for, closed on success). The exit status; a
// failure is printed.
static int eval_tokens(struct cli *f, struct engine *e, const int32_t *tokens, int n_tok,
                       struct eval_out *out, double *t_ms) {
    struct verr err = {0};
    tools_warn_ctx("eval", &f->am, context_config(e->ctx)->n_ctx, e->m->hp.n_ctx_train,
                   f->ep.ga_n != 1);
    if (args_selfextend_check(&f->am, &e->m->hp, context_config(e->ctx)->n_ctx, n_tok, stderr,
                              &err)) {
        fprintf(stderr, "vela eval: %s\n", err.msg);
        return 1;
    }
    const int V = e->m->hp.n_vocab;
    for (int t = 0; t < n_tok; t++)
        if (tokens[t] < 0 || tokens[t] >= V) {
            fprintf(stderr, "vela eval: token id %d is out of range (n_vocab %d)\n", tokens[t], V);
            return 1;
        }
    if (f->am.verbose) {
        char desc[2048];
        engine_describe(e, desc, sizeof desc);
        fprintf(stderr, "%s\n", desc);
    }
    out->n_vocab = V;
    if (!(out->last = malloc(sizeof(float) * (size_t)V))) {
        fprintf(stderr, "vela eval: out of memory\n");
        return 1;
    }
    if (f->eval.logits_out && !(out->f = fopen(f->eval.logits_out, "wb"))) {
        fprintf(stderr, "vela eval: cannot open '%s' for writing: %s\n", f->eval.logits_out,
                strerror(errno));
        return 1;
    }
    if (engine_eval_ex(e, tokens, n_tok, &f->ep, write_rows, out, t_ms, &err)) {
        fprintf(stderr, "vela eval: %s\n", err.msg);
        return 1;
    }
    if (out->f) {
        int bad = fclose(out->f) != 0;
        out->f = NULL;
        if (bad) {
            fprintf(stderr, "vela eval: writing '%s' failed\n", f->eval.logits_out);
            unlink(f->eval.logits_out);
            return 1;
        }
    }
    return 0;
}

int cmd_eval(int argc, char **argv) {
    static struct cli f; // large: off the stack
    int status = parse_eval(&f, argc, argv);
    if (status >= 0)
        return status;
    int32_t *tokens = NULL;
    int n_tok = 0;
    struct verr err = {0};
    if (f.eval.tokens && parse_tokens(f.eval.tokens, &tokens, &n_tok, &err)) {
        fprintf(stderr, "vela eval: %s\n", err.msg);
        return 2;
    }
    status = 1;
    char *text = NULL;
    size_t text_len = 0;
    struct engine *e = NULL;
    struct eval_out out = {0};
    if (f.prompt_file && !(text = tools_read_file(f.prompt_file, &text_len))) {
        fprintf(stderr, "vela eval: cannot read '%s'\n", f.prompt_file);
        goto done;
    }
    if (f.prompt && !(text = strdup(f.prompt))) {
        fprintf(stderr, "vela eval: out of memory\n");
        goto done;
    }
    text_len = f.prompt ? strlen(f.prompt) : text_len;
    double t_ms = 0;
    if (open_for_tokens(&f, text, text_len, &tokens, &n_tok, &e) ||
        eval_tokens(&f, e, tokens, n_tok, &out, &t_ms))
        goto done;
    say_summary(&f, e, &out, n_tok, t_ms);
    status = 0;
done:
    if (out.f) { // a failed run leaves no logits file behind
        fclose(out.f);
        unlink(f.eval.logits_out);
    }
    free(out.last);
    free(tokens);
    free(text);
    engine_close(e);
    return status;
}
