// vela run: generate text from a prompt, streaming it to stdout, with the
// timings on stderr at the end (llama-cli's main loop); with --parallel N
// and a file of prompts, many sequences in one cache (llama.cpp's parallel
// example). --chat formats -p as a user message with the model's chat
// template and generates the reply until the end of the turn. Without -m,
// the default model from the cache (tools/default_model.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "host/engine/engine.h"
#include "host/engine/stop.h"
#include "host/tokenizer/chat.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/default_model.h"
#include "tools/progress.h"
#include "tools/serve/chat_kwargs.h"
#include "tools/think_print.h"

static void usage(FILE *out) {
    fprintf(out, "usage: vela run [-m MODEL] [-p PROMPT | -f FILE] [options]\n"
                 "       vela run [-m MODEL] --chat -p QUESTION [options]\n"
                 "       vela run [-m MODEL] --parallel N -f PROMPTS_FILE [options]\n\n"
                 "Generates text from a prompt and streams it to stdout; the sampler seed goes to\n"
                 "stderr before the first token (--seed N replays it), load time, prompt and\n"
                 "generation speed at the end. With --parallel N and -f, every\n"
                 "line of the file is a prompt: up to N are decoded together in one KV cache\n"
                 "(the others wait for a free slot) and each text is printed with its index\n"
                 "when its sequence ends. Without -m: the default model, SmolLM2-135M-Instruct,\n"
                 "from the cache ($VELA_CACHE or ~/.cache/vela; bash tools/model_cache.sh fetches "
                 "it).\n\n");
    flags_help(out, &cli_flags, CLI_RUN);
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

// Splits text into its non-blank lines (a trailing '\r' dropped), in place.
static int split_lines(char *text, char ***out, int *n_out) {
    int n = 0, cap = 16;
    char **v = malloc((size_t)cap * sizeof *v);
    for (char *p = text; v && *p;) {
        char *nl = strchr(p, '\n');
        char *end = nl ? nl : p + strlen(p);
        char *next = nl ? nl + 1 : end;
        if (end > p && end[-1] == '\r')
            end--;
        *end = '\0';
        bool blank = true;
        for (const char *c = p; *c; c++)
            if (*c != ' ' && *c != '\t')
                blank = false;
        if (!blank) {
            if (n == cap) {
                char **nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                if (!nv) {
                    free(v);
                    return -1;
                }
                v = nv;
            }
            v[n++] = p;
        }
        p = next;
    }
    if (!v)
        return -1;
    *out = v;
    *n_out = n;
    return 0;
}

struct run_out {
    bool stream; // one sequence: print tokens as they come
    bool display_prompt;
    int n_seq;
    char **prompt_text;  // [n_seq] the prompt of each sequence (display)
    char **texts;        // [n_seq] collected text (not streaming)
    size_t *lens, *caps; // [n_seq]
    const char **why;    // [n_seq] why it ended (static strings of the engine)
    bool verbose;
    // --chat: the end of the assistant's turn, as its token and as text
    // (for a vocabulary without that token, or one that spells it out).
    struct stop_matcher *stop;
    int32_t eot;
    struct think_print tp; // --chat: prints the reply (a reasoning model's thoughts apart)
};

// --chat's reply (one sequence, streamed): stops at the template's
// end-of-turn token, or where its end-of-turn text appears; that text is
// never printed. Returns non-zero to stop.
static int chat_out(struct run_out *o, int32_t token, const char *text, size_t len) {
    if (token >= 0 && token == o->eot)
        return 1;
    const char *show;
    size_t n;
    if (stop_push(o->stop, text, len, &show, &n, NULL))
        return 1;
    return think_print_text(&o->tp, show, n) || stop_hit(o->stop) >= 0;
}

static int on_event(void *user, enum engine_event ev, int seq, int32_t token, const char *text,
                    size_t len) {
    struct run_out *o = user;
    switch (ev) {
    case ENGINE_EV_TOKEN:
        if (o->stream && o->stop) {
            return chat_out(o, token, text, len);
        } else if (o->stream) {
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
        o->why[seq] = text;
        if (o->stream && o->stop) {
            const char *held;
            size_t n;
            stop_flush(o->stop, &held, &n);
            think_print_text(&o->tp, held, n);
            think_print_end(&o->tp);
        }
        if (!o->stream) {
            if (o->display_prompt)
                printf("[sequence %d]\n%s%s\n", seq, o->prompt_text[seq],
                       o->texts[seq] ? o->texts[seq] : "");
            else
                printf("[sequence %d] %s\n", seq, o->texts[seq] ? o->texts[seq] : "");
            fflush(stdout);
            free(o->texts[seq]);
            o->texts[seq] = NULL;
        }
        break;
    case ENGINE_EV_NOTE:
    case ENGINE_EV_SHIFT:
        if (o->verbose) {
            if (o->stream)
                fprintf(stderr, "vela: %.*s\n", (int)len, text);
            else
                fprintf(stderr, "vela: [sequence %d] %.*s\n", seq, (int)len, text);
        }
        break;
    }
    return 0;
}

// Without -n, says on stderr what ends each sequence (before it starts):
// a run that then goes on for long has said why and how to bound it.
static void say_bounds(const struct engine_gen_params *gp, bool chat, int n_ctx_seq) {
    const char *eog =
        chat ? " at the end of the assistant's turn" : " at an end-of-generation token";
    if (gp->ignore_eos)
        eog = "";
    if (gp->ctx_shift && gp->ga_n == 1)
        fprintf(stderr,
                "vela: no -n: generation ends%s%s; the context shift is on, so it may go on "
                "without end (-n N bounds it; --no-context-shift stops at the context of %d "
                "tokens)\n",
                *eog ? "" : " never by itself", eog, n_ctx_seq);
    else
        fprintf(stderr, "vela: no -n: generation ends%s%s when the context (%d tokens) is full\n",
                eog, *eog ? " or" : "", n_ctx_seq);
}

// Picks the seed now (a random one for -1) and says it on stderr, before
// the first token, in the form that replays it.
static void say_seed(struct sampler_params *sp, int n_seq) {
    sp->seed = tools_seed_resolve(sp->seed);
    if (n_seq == 1)
        fprintf(stderr, "vela: sampler seed: %u (replay: --seed %u)\n", sp->seed, sp->seed);
    else
        fprintf(stderr, "vela: sampler seed: %u (sequence i: %u + i; replay: --seed %u)\n",
                sp->seed, sp->seed, sp->seed);
    fflush(stderr);
}

// --chat: replaces *prompt (the user's message) by the conversation
// [system,] user formatted with the model's template (or --chat-template)
// and a generation prompt. Prints the error and returns non-zero on failure.
static int chat_prompt(const struct cli *c, char **prompt, size_t *prompt_len,
                       enum chat_template *tmpl) {
    struct verr err = {0};
    struct gguf_file *f = NULL;
    const char *source = NULL;
    if (gguf_open(&f, c->am.model_path, &err) ||
        chat_template_from_gguf(f, c->chat_template, tmpl, &source, &err) ||
        chat_kwargs_check(&c->chat_kwargs, *tmpl, &err)) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        gguf_close(f);
        return 1;
    }
    gguf_close(f);
    if (c->am.verbose)
        fprintf(stderr, "vela: chat template %s (%s)\n", chat_template_name(*tmpl), source);
    struct chat_msg msgs[2];
    size_t n = 0;
    if (c->system_msg)
        msgs[n++] = (struct chat_msg){"system", c->system_msg};
    msgs[n++] = (struct chat_msg){"user", *prompt};
    char *text = NULL;
    size_t len = 0;
    struct chat_opts opts = chat_kwargs_opts(&c->chat_kwargs);
    if (chat_format(*tmpl, msgs, n, &opts, true, &text, &len, &err)) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        return 1;
    }
    free(*prompt);
    *prompt = text;
    *prompt_len = len;
    return 0;
}

// Flags that exclude each other; 0 or the usage status 2 (printed).
static int check_run_flags(struct cli *f) {
    const char *msg = NULL;
    if ((f->chat_template || f->system_msg || f->chat_kwargs.reasoning_effort ||
         f->chat_kwargs.model_identity) &&
        !f->run.chat)
        msg = "--chat-template, --chat-template-kwargs, --reasoning-effort and --system go with "
              "--chat";
    else if (f->run.chat && f->gp.n_parallel != 1)
        msg = "--chat answers one question: drop --parallel";
    else if (f->prompt && f->prompt_file)
        msg = "give -p or -f, not both";
    else if (f->gp.ga_n != 1 && f->am.se_g > 1)
        msg = "--self-extend and --grp-attn-n exclude each other";
    if (msg) {
        fprintf(stderr, "vela run: %s\n", msg);
        return 2;
    }
    if (f->gp.ga_n != 1 && f->gp.ga_w % f->gp.ga_n != 0) {
        fprintf(stderr, "vela run: --grp-attn-w %d must be a multiple of --grp-attn-n %d\n",
                f->gp.ga_w, f->gp.ga_n);
        return 2;
    }
    // One question, one answer: the reply ends with its turn or the context,
    // never in a context shift that could let it go on without end.
    if (f->run.chat && !f->run.shift_given)
        f->gp.ctx_shift = false;
    return 0;
}

// Parses the command line into f; -1 to go on, else the exit status
// (help printed: 0; a usage error printed: 2; no default model: its status).
static int parse_run(struct cli *f, int argc, char **argv) {
    cli_defaults(f);
    int st = tools_parse("run", CLI_RUN, usage, f, argc, argv, 0);
    if (st >= 0)
        return st;
    st = check_run_flags(f);
    if (!st) {
        const int sr = tools_spec_resolve("run", f);
        st = sr >= 0 ? sr : 0;
    }
    if (!st && !f->am.model_path)
        st = tools_use_default_model("run", &f->am.model_path);
    if (st)
        return st;
    tools_note_synthetic("run", f->am.model_path);
    return -1;
}

// The prompt's text: -f's file (one trailing newline dropped, as llama.cpp's
// -f) or -p (escapes processed unless --no-escape), formatted as a chat with
// --chat (*tmpl: its template). NULL when it fails (printed).
static char *read_prompt(const struct cli *f, size_t *len, enum chat_template *tmpl) {
    char *prompt = NULL;
    *len = 0;
    if (f->prompt_file) {
        prompt = tools_read_file(f->prompt_file, len);
        if (!prompt) {
            fprintf(stderr, "vela run: cannot read prompt file '%s'\n", f->prompt_file);
            return NULL;
        }
        if (*len > 0 && prompt[*len - 1] == '\n')
            prompt[--*len] = '\0';
    } else {
        prompt = strdup(f->prompt ? f->prompt : "");
        if (prompt && f->run.escape)
            process_escapes(prompt);
        *len = prompt ? strlen(prompt) : 0;
    }
    if (!prompt) {
        fprintf(stderr, "vela run: out of memory\n");
        return NULL;
    }
    if (f->run.chat && chat_prompt(f, &prompt, len, tmpl)) {
        free(prompt);
        return NULL;
    }
    return prompt;
}

// The prompts to generate from: the text's lines (-f with --parallel N > 1)
// or the text itself, in *lines (pointing into text). Non-zero when it
// fails (printed).
static int prompt_lines(const struct cli *f, bool lines_mode, char *text, char ***lines,
                        int *n_lines) {
    if (!lines_mode) {
        if (!(*lines = malloc(sizeof **lines))) {
            fprintf(stderr, "vela run: out of memory\n");
            return 1;
        }
        (*lines)[0] = text;
        *n_lines = 1;
        return 0;
    }
    if (split_lines(text, lines, n_lines)) {
        fprintf(stderr, "vela run: out of memory\n");
        return 1;
    }
    if (*n_lines == 0) {
        fprintf(stderr, "vela run: '%s' has no prompt (one per line)\n", f->prompt_file);
        return 1;
    }
    return 0;
}

// Tokenizes line l into toks[l] (malloc'd) and prompts[l]; an empty prompt
// starts from BOS, as llama-cli's. Non-zero when it fails (printed).
static int tokenize_line(struct engine *e, char **lines, int l, bool lines_mode, int32_t **toks,
                         struct engine_prompt *prompts) {
    struct verr err = {0};
    int n_tok = 0;
    if (tokenizer_encode_alloc(e->tok, lines[l], strlen(lines[l]), true, true, &toks[l], &n_tok,
                               &err)) {
        if (lines_mode)
            fprintf(stderr, "vela run: tokenizing prompt %d: %s\n", l, err.msg);
        else
            fprintf(stderr, "vela run: tokenizing the prompt: %s\n", err.msg);
        return 1;
    }
    if (n_tok == 0) {
        int32_t bos = tokenizer_bos(e->tok);
        if (bos < 0) {
            fprintf(stderr, "vela run: the prompt is empty and the vocabulary has no BOS token\n");
            return 1;
        }
        free(toks[l]);
        if (!(toks[l] = malloc(sizeof *toks[l]))) {
            fprintf(stderr, "vela run: out of memory\n");
            return 1;
        }
        toks[l][0] = bos;
        n_tok = 1;
    }
    prompts[l] = (struct engine_prompt){toks[l], n_tok};
    return 0;
}

// The model and its context for f's sequences. Non-zero when it fails (printed).
static int open_engine(const struct cli *f, struct engine **e) {
    struct engine_config op;
    args_engine_config(&f->am, &op);
    op.ctx.n_seq_max = f->gp.n_parallel;
    op.ctx.n_outputs_max = tools_spec_outputs(f, f->gp.n_parallel, op.ctx.n_batch);
    op.need_tokenizer = true;
    struct load_progress lprog;
    load_progress_init(&lprog, "vela run", f->am.no_progress);
    op.progress = load_progress_update;
    op.progress_user = &lprog;
    struct verr err = {0};
    if (engine_open(e, &op, &err)) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        return 1;
    }
    if (tools_draft_open("run", f, *e, f->gp.n_parallel))
        return 1;
    if (f->am.verbose) {
        char desc[2048];
        engine_describe(*e, desc, sizeof desc);
        fprintf(stderr, "%s\n", desc);
    }
    return 0;
}

// The per-sequence buffers of out for n_seq sequences; non-zero when out of
// memory (printed).
static int run_out_alloc(struct run_out *out, int n_seq) {
    out->n_seq = n_seq;
    out->prompt_text = calloc((size_t)n_seq, sizeof *out->prompt_text);
    out->texts = calloc((size_t)n_seq, sizeof *out->texts);
    out->lens = calloc((size_t)n_seq, sizeof *out->lens);
    out->caps = calloc((size_t)n_seq, sizeof *out->caps);
    out->why = calloc((size_t)n_seq, sizeof *out->why);
    if (!out->prompt_text || !out->texts || !out->lens || !out->caps || !out->why) {
        fprintf(stderr, "vela run: out of memory\n");
        return 1;
    }
    return 0;
}

static void run_out_free(struct run_out *out) {
    if (out->texts)
        for (int s = 0; s < out->n_seq; s++)
            free(out->texts[s]);
    free(out->texts);
    free(out->prompt_text);
    free(out->lens);
    free(out->caps);
    free(out->why);
    stop_free(out->stop);
}

// With -v: the prompts' lengths.
static void say_prompts(const struct cli *f, const struct engine_prompt *prompts, int n_seq,
                        int n_ctx_seq) {
    int lo = prompts[0].n_tokens, hi = lo;
    for (int s = 1; s < n_seq; s++) {
        lo = prompts[s].n_tokens < lo ? prompts[s].n_tokens : lo;
        hi = prompts[s].n_tokens > hi ? prompts[s].n_tokens : hi;
    }
    if (n_seq == 1)
        fprintf(stderr, "vela: prompt: %d tokens\n", lo);
    else
        fprintf(stderr,
                "vela: %d sequences, %d at a time, prompts of %d..%d tokens, %d cells per "
                "sequence\n",
                n_seq, f->gp.n_parallel, lo, hi, n_ctx_seq);
}

// After the run: which sequences filled their context and why nothing
// shifted it, then llama-cli's timings.
static void say_results(const struct cli *f, const struct engine *e, const struct run_out *out,
                        const struct engine_stats *st, int n_ctx_seq) {
    const struct engine_gen_params *gp = &f->gp;
    const int n_seq = out->n_seq;
    for (int s = 0; s < n_seq; s++) {
        if (!out->why[s] || strcmp(out->why[s], "context full"))
            continue;
        const char *how = gp->ga_n != 1 ? "; self-extend does not shift the context"
                          : !gp->ctx_shift && f->run.chat && !f->run.shift_given
                              ? "; --chat does not shift the context (--context-shift would)"
                          : !gp->ctx_shift ? "; context shift is off (--no-context-shift)"
                                           : "; -n -2 stops there";
        if (n_seq == 1)
            fprintf(stderr, "vela: context full (%d tokens)%s\n", n_ctx_seq, how);
        else
            fprintf(stderr, "vela: sequence %d: context full (%d cells per sequence)%s\n", s,
                    n_ctx_seq, how);
    }
    fprintf(stderr, "vela: load time:   %10.2f ms\n", e->t_load_ms);
    fprintf(stderr, "vela: prompt eval: %10.2f ms / %5d tokens (%10.2f tokens/s)\n",
            st->t_prompt_ms, st->n_prompt,
            st->t_prompt_ms > 0 ? 1e3 * st->n_prompt / st->t_prompt_ms : 0.0);
    fprintf(stderr, "vela: generation:  %10.2f ms / %5d tokens (%10.2f tokens/s)\n", st->t_gen_ms,
            st->n_gen, st->t_gen_ms > 0 ? 1e3 * st->n_gen / st->t_gen_ms : 0.0);
    if (n_seq > 1)
        fprintf(stderr,
                "vela: total:       %10.2f ms / %5d sequences, %d at a time: %d prompt + %d "
                "generated tokens (%.2f generated tokens/s, %.2f tokens/s in all)\n",
                st->t_total_ms, st->n_seq, gp->n_parallel, st->n_prompt, st->n_gen,
                st->t_total_ms > 0 ? 1e3 * st->n_gen / st->t_total_ms : 0.0,
                st->t_total_ms > 0 ? 1e3 * (st->n_prompt + st->n_gen) / st->t_total_ms : 0.0);
    if (st->n_ctx_shifts)
        fprintf(stderr, "vela: context shifts: %d\n", st->n_ctx_shifts);
    if (gp->spec.type != ENGINE_SPEC_NONE)
        fprintf(stderr, "vela: speculative (%s): %d drafted, %d accepted (%.1f%%)\n",
                engine_spec_type_name(gp->spec.type), st->n_drafted, st->n_accepted,
                st->n_drafted ? 100.0 * st->n_accepted / st->n_drafted : 0.0);
}

// Sets up out for the run (streaming, --chat's end of turn) and says, before
// the first token, what bounds the run and its seed. Non-zero when it fails
// (printed).
static int prepare_run(struct cli *f, struct engine *e, const struct engine_prompt *prompts,
                       int n_seq, enum chat_template tmpl, struct run_out *out) {
    struct verr err = {0};
    int longest = 0;
    for (int s = 0; s < n_seq; s++)
        longest = prompts[s].n_tokens > longest ? prompts[s].n_tokens : longest;
    if (args_selfextend_check(&f->am, &e->m->hp, context_config(e->ctx)->n_ctx, longest, stderr,
                              &err)) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        return 1;
    }
    out->stream = n_seq == 1;
    out->display_prompt = f->run.display_prompt && !f->run.chat; // --chat: the reply alone
    out->verbose = f->am.verbose;
    if (f->run.chat) {
        const char *eot_text = chat_template_eot(tmpl);
        out->eot = chat_eot_token(e->tok, tmpl);
        think_print_init(&out->tp, stdout,
                         tmpl == CHAT_TMPL_GPT_OSS && f->reasoning != CHAT_REASONING_NONE, NULL);
        if (stop_new(&out->stop, &eot_text, 1, &err)) {
            fprintf(stderr, "vela run: %s\n", err.msg);
            return 1;
        }
    }
    const int n_ctx_seq = context_config(e->ctx)->n_ctx / f->gp.n_parallel;
    if (f->am.verbose)
        say_prompts(f, prompts, n_seq, n_ctx_seq);
    tools_warn_ctx("run", &f->am, n_ctx_seq, e->m->hp.n_ctx_train, f->gp.ga_n != 1);
    if (!f->run.n_given)
        say_bounds(&f->gp, f->run.chat, n_ctx_seq);
    say_seed(&f->gp.sp, n_seq);
    return 0;
}

// Opens the model, tokenizes the prompts and generates. The exit status.
static int run_prompts(struct cli *f, char *text, size_t text_len, enum chat_template tmpl) {
    // -f with --parallel N > 1 is a list of prompts, one per line.
    const bool lines_mode = f->prompt_file && f->gp.n_parallel > 1;
    int status = 1, n_lines = 0;
    struct engine *e = NULL;
    char **lines = NULL;
    int32_t **toks = NULL; // [n_lines]
    struct engine_prompt *prompts = NULL;
    struct run_out out = {0};
    struct grammar_vocab *gvocab = NULL;
    if (prompt_lines(f, lines_mode, text, &lines, &n_lines) || open_engine(f, &e))
        goto done;
    int gst = tools_grammar_attach("run", f, e, &f->gp.sp, &gvocab);
    if (gst) {
        status = gst;
        goto done;
    }
    // The sequences: one per line, or --parallel samples of the one prompt.
    const int n_seq = lines_mode ? n_lines : f->gp.n_parallel;
    toks = calloc((size_t)n_lines, sizeof *toks);
    prompts = calloc((size_t)n_seq, sizeof *prompts);
    if (run_out_alloc(&out, n_seq))
        goto done;
    if (!toks || !prompts) {
        fprintf(stderr, "vela run: out of memory\n");
        goto done;
    }
    for (int l = 0; l < n_lines; l++)
        if (tokenize_line(e, lines, l, lines_mode, toks, prompts))
            goto done;
    for (int s = 0; s < n_seq; s++) {
        if (!lines_mode)
            prompts[s] = prompts[0];
        out.prompt_text[s] = lines[lines_mode ? s : 0];
    }
    if (prepare_run(f, e, prompts, n_seq, tmpl, &out))
        goto done;
    if (out.display_prompt && out.stream) {
        fwrite(text, 1, text_len, stdout);
        fflush(stdout);
    }
    struct engine_stats st;
    struct verr err = {0};
    int rc = engine_generate_batch(e, prompts, n_seq, &f->gp, on_event, &out, &st, &err);
    if (out.stream)
        fputc('\n', stdout);
    fflush(stdout);
    if (rc) {
        fprintf(stderr, "vela run: %s\n", err.msg);
        goto done;
    }
    say_results(f, e, &out, &st, context_config(e->ctx)->n_ctx / f->gp.n_parallel);
    status = 0;
done:
    run_out_free(&out);
    if (toks)
        for (int l = 0; l < n_lines; l++)
            free(toks[l]);
    free(toks);
    free(prompts);
    free(lines);
    engine_close(e);
    grammar_free(f->gp.sp.grammar); // after the last sampler, then its trie
    f->gp.sp.grammar = NULL;
    grammar_vocab_free(gvocab);
    return status;
}

int cmd_run(int argc, char **argv) {
    static struct cli f; // large: off the stack
    int st = parse_run(&f, argc, argv);
    if (st >= 0)
        return st;
    size_t len = 0;
    enum chat_template tmpl = CHAT_TMPL_CHATML;
    char *text = read_prompt(&f, &len, &tmpl);
    if (!text)
        return 1;
    st = run_prompts(&f, text, len, tmpl);
    free(text);
    return st;
}
