// vela chat: an interactive terminal chat with the model (multi-turn).
//
// Each turn renders the whole conversation with the model's chat template
// and submits it as one request of the step API with keep_cells: the
// engine reuses the cells of the longest prefix the conversation shares
// with what the previous turn left in the cache, so only the new message is
// decoded. When the conversation outgrows the context, the oldest turns
// after the system message are dropped; within an answer, a full context
// shifts (keeping the system message).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "host/engine/engine.h"
#include "host/engine/step.h"
#include "host/engine/stop.h"
#include "host/tokenizer/chat.h"
#include "host/tokenizer/tokenizer.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/default_model.h"
#include "tools/line_input.h"
#include "tools/progress.h"
#include "tools/serve/buf.h"
#include "tools/serve/chat_kwargs.h"
#include "tools/think_print.h"

#define CHAT_MAX_TURNS 4096

static void usage(FILE *out) {
    fprintf(out, "usage: vela chat [-m MODEL] [options]\n\n"
                 "Chats with the model in the terminal: type a message, Enter sends it; the\n"
                 "reply streams back. The conversation stays in the KV cache between turns\n"
                 "(only the new message is decoded); when it outgrows the context the oldest\n"
                 "turns are dropped. Without -m: the default model (tools/model_cache.sh).\n\n"
                 "commands at the prompt:\n"
                 "  /clear                    forget the conversation (the system message stays)\n"
                 "  /exit, /quit              leave (as does Ctrl-D)\n"
                 "Ctrl-C stops the answer being written, not the program.\n\n");
    if (line_input_library())
        fprintf(out,
                "Line editing: %s (arrow keys, emacs keys; Up recalls earlier messages);\n"
                "the history is kept in $XDG_STATE_HOME/vela/chat_history, by default\n"
                "~/.local/state/vela/chat_history (--no-history: not kept).\n\n",
                line_input_library());
    else
        fprintf(out, "Line editing: none (built without libedit: plain input).\n\n");
    flags_help(out, &cli_flags, CLI_CHAT);
}

static volatile sig_atomic_t g_interrupt;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupt = 1;
}

struct turn {
    char *role;
    char *content;
};

struct chat {
    struct engine *e;
    enum chat_template tmpl;
    struct chat_opts opts;     // --chat-template-kwargs (pointing into the flags)
    int32_t eot;               // the template's end-of-turn token, or -1
    struct stop_matcher *stop; // the end-of-turn text, when it has no token
    struct turn turns[CHAT_MAX_TURNS];
    int n_turns;
    int n_system; // 1 when turns[0] is the system message
    struct sampler_params sp;
    struct grammar_vocab *gvocab; // with --grammar: the model's token trie (sp.grammar_vocab)
    int n_predict;
    bool ignore_eos;
    bool verbose;
    bool split_reasoning;  // a harmony template, --reasoning-format not none
    struct think_print tp; // prints the answer, its content into reply
    struct buf reply;      // the answer being written (its content, without reasoning)
    bool done;
    const char *why;
};

static int on_event(void *user, const struct engine_req_event *ev) {
    struct chat *c = user;
    if (ev->ev == ENGINE_EV_DONE) {
        const char *show = NULL;
        size_t n = 0;
        if (stop_hit(c->stop) < 0)
            stop_flush(c->stop, &show, &n);
        think_print_text(&c->tp, show, n);
        think_print_end(&c->tp);
        c->done = true;
        c->why = ev->text;
        return 0;
    }
    if (ev->ev != ENGINE_EV_TOKEN)
        return 0;
    if (ev->token >= 0 && ev->token == c->eot && !c->ignore_eos)
        return 1; // its text is the template's marker: not part of the answer
    const char *show = NULL;
    size_t n = 0;
    int ended = 0;
    if (ev->len && stop_push(c->stop, ev->text, ev->len, &show, &n, NULL) == 0 && n)
        ended = think_print_text(&c->tp, show, n);
    return g_interrupt || ended || stop_hit(c->stop) >= 0;
}

static int add_turn(struct chat *c, const char *role, const char *content, size_t len) {
    if (c->n_turns == CHAT_MAX_TURNS)
        return -1;
    struct turn *t = &c->turns[c->n_turns];
    t->role = strdup(role);
    t->content = malloc(len + 1);
    if (!t->role || !t->content) {
        free(t->role);
        free(t->content);
        return -1;
    }
    memcpy(t->content, content, len);
    t->content[len] = '\0';
    c->n_turns++;
    return 0;
}

// Drops turns [from, from + n).
static void drop_turns(struct chat *c, int from, int n) {
    for (int i = from; i < from + n; i++) {
        free(c->turns[i].role);
        free(c->turns[i].content);
    }
    memmove(&c->turns[from], &c->turns[from + n],
            (size_t)(c->n_turns - from - n) * sizeof c->turns[0]);
    c->n_turns -= n;
}

// The conversation with a generation prompt, tokenized (BOS where the
// vocabulary wants it; the template's markers as their tokens).
static int render(struct chat *c, int32_t **toks, int *n, struct verr *err) {
    struct chat_msg msgs[CHAT_MAX_TURNS];
    for (int i = 0; i < c->n_turns; i++)
        msgs[i] = (struct chat_msg){c->turns[i].role, c->turns[i].content};
    char *text = NULL;
    size_t len = 0;
    int rc = chat_format(c->tmpl, msgs, (size_t)c->n_turns, &c->opts, true, &text, &len, err);
    if (!rc)
        rc = tokenizer_encode_alloc(c->e->tok, text, len, true, true, toks, n, err);
    free(text);
    return rc;
}

// The tokens of the system message alone: what a context shift keeps.
static int system_tokens(struct chat *c) {
    if (!c->n_system)
        return 0;
    struct chat_msg m = {c->turns[0].role, c->turns[0].content};
    char *text = NULL;
    size_t len = 0;
    int32_t *t = NULL;
    int n = 0;
    if (!chat_format(c->tmpl, &m, 1, &c->opts, false, &text, &len, NULL))
        tokenizer_encode_alloc(c->e->tok, text, len, true, true, &t, &n, NULL);
    free(text);
    free(t);
    return n;
}

// One answer to the conversation as it stands: streams it and adds it as
// the assistant's turn. Returns 0, or 1 after an error was printed.
static int answer(struct chat *c) {
    struct verr err = {0};
    int32_t *toks = NULL;
    int n = 0;
    const int n_ctx = context_config(c->e->ctx)->n_ctx;
    // Too long for the context: drop the oldest exchanges, never the system
    // message or the new one.
    for (;;) {
        free(toks);
        toks = NULL;
        if (render(c, &toks, &n, &err)) {
            fprintf(stderr, "vela chat: %s\n", err.msg);
            return 1;
        }
        if (n <= n_ctx - 8 || c->n_turns - c->n_system <= 1)
            break;
        drop_turns(c, c->n_system, 1);
    }
    if (n > n_ctx - 8) {
        fprintf(stderr, "vela chat: the message is too long (%d tokens; the context is %d)\n", n,
                n_ctx);
        free(toks);
        drop_turns(c, c->n_turns - 1, 1);
        return 0;
    }
    struct engine_request q;
    engine_request_default(&q);
    q.tokens = toks;
    q.n_tokens = n;
    q.sp = c->sp;
    q.n_predict = c->n_predict;
    q.ignore_eos = c->ignore_eos;
    q.ctx_shift = true;
    q.n_keep = system_tokens(c);
    const bool eot_stops = c->eot >= 0 && !c->ignore_eos;
    q.stop_tokens = eot_stops ? &c->eot : NULL;
    q.n_stop_tokens = eot_stops;
    q.keep_cells = true;  // the next turn reuses them:
    q.reuse_cells = true; // only what is new since the last turn is decoded
    q.cb = on_event;
    q.user = c;
    c->reply.len = 0;
    think_print_init(&c->tp, stdout, c->split_reasoning, &c->reply);
    c->done = false;
    stop_reset(c->stop);
    g_interrupt = 0;
    uint64_t id = 0;
    int rc = engine_submit(c->e, &q, &id, &err);
    free(toks);
    while (!rc && !c->done) {
        int st = engine_step(c->e, &err); // 1: more to do, 0: idle, < 0: an error
        if (st <= 0) {
            rc = st;
            break;
        }
    }
    if (rc < 0) {
        fprintf(stderr, "\nvela chat: %s\n", err.msg);
        return 1;
    }
    printf("\n");
    fflush(stdout);
    if (g_interrupt)
        fprintf(stderr, "(stopped)\n");
    else if (c->verbose)
        fprintf(stderr, "(%s)\n", c->why ? c->why : "?");
    g_interrupt = 0;
    if (add_turn(c, "assistant", c->reply.p ? c->reply.p : "", c->reply.len))
        return 1;
    return 0;
}

// The conversation loop: reads a line, runs a command or answers it.
static int chat_loop(struct chat *c, struct line_input *in) {
    const bool tty = isatty(STDIN_FILENO);
    for (;;) {
        const char *line = NULL;
        ssize_t len = line_input_read(in, &line);
        if (len == -2) {
            // Ctrl-C at the prompt: nothing to stop.
            g_interrupt = 0;
            printf("\n(/exit or Ctrl-D to leave)\n");
            continue;
        }
        if (len < 0)
            break;
        if (len == 0)
            continue;
        line_input_remember(in, line);
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/clear")) {
            drop_turns(c, c->n_system, c->n_turns - c->n_system);
            printf("(conversation cleared)\n");
            continue;
        }
        if (line[0] == '/' && !strchr(line, ' ')) {
            printf("(unknown command %s: /clear, /exit)\n", line);
            continue;
        }
        if (add_turn(c, "user", line, (size_t)len) || answer(c))
            return 1;
    }
    if (tty)
        printf("\n");
    return 0;
}

static int open_chat(struct chat *c, struct args_model *am, const struct cli *flags) {
    const char *system_msg = flags->system_msg;
    struct verr err = {0};
    struct gguf_file *f = NULL;
    const char *source = NULL;
    if (gguf_open(&f, am->model_path, &err) ||
        chat_template_from_gguf(f, flags->chat_template, &c->tmpl, &source, &err) ||
        chat_kwargs_check(&flags->chat_kwargs, c->tmpl, &err)) {
        gguf_close(f);
        fprintf(stderr, "vela chat: %s\n", err.msg);
        return 1; // the model file (or its template) failed: a runtime error, as in run
    }
    gguf_close(f);
    c->opts = chat_kwargs_opts(&flags->chat_kwargs);
    struct engine_config ec;
    args_engine_config(am, &ec);
    ec.ctx.n_seq_max = 1;
    ec.ctx.n_outputs_max = 1;
    ec.need_tokenizer = true;
    struct load_progress lp;
    load_progress_init(&lp, "vela chat", am->no_progress);
    ec.progress = load_progress_update;
    ec.progress_user = &lp;
    if (engine_open(&c->e, &ec, &err)) {
        fprintf(stderr, "vela chat: %s\n", err.msg);
        return 1;
    }
    tools_warn_ctx("chat", am, context_config(c->e->ctx)->n_ctx, c->e->m->hp.n_ctx_train, false);
    c->eot = chat_eot_token(c->e->tok, c->tmpl);
    const char *eot_text = chat_template_eot(c->tmpl);
    const char *stops[1] = {eot_text};
    if (stop_new(&c->stop, stops, c->eot < 0 && eot_text && *eot_text ? 1 : 0, &err)) {
        fprintf(stderr, "vela chat: %s\n", err.msg);
        return 1;
    }
    if (system_msg && add_turn(c, "system", system_msg, strlen(system_msg)))
        return 1;
    c->n_system = system_msg ? 1 : 0;
    c->split_reasoning = c->tmpl == CHAT_TMPL_GPT_OSS &&
                         (enum chat_reasoning)flags->reasoning != CHAT_REASONING_NONE;
    fprintf(stderr, "vela chat: %s, chat template %s (%s), context %d tokens; /exit to leave\n",
            am->model_path, chat_template_name(c->tmpl), source, context_config(c->e->ctx)->n_ctx);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    static struct cli f; // large: off the stack
    cli_defaults(&f);
    int status = tools_parse("chat", CLI_CHAT, usage, &f, argc, argv, 0);
    if (status >= 0)
        return status;
    struct chat *c = calloc(1, sizeof *c);
    if (!c)
        return 1;
    struct args_model am = f.am;
    c->sp = f.gp.sp;
    c->n_predict = f.gp.n_predict;
    c->ignore_eos = f.gp.ignore_eos;
    status = 0;
    if (!am.model_path && (status = tools_use_default_model("chat", &am.model_path)))
        goto out;
    tools_note_synthetic("chat", am.model_path);
    c->verbose = am.verbose;
    if ((status = open_chat(c, &am, &f)) ||
        (status = tools_grammar_attach("chat", &f, c->e, &c->sp, &c->gvocab)))
        goto out;
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; // no SA_RESTART: Ctrl-C at the prompt interrupts the read
    sigaction(SIGINT, &sa, NULL);
    char *history = f.chat.no_history ? NULL : line_input_history_path("chat_history");
    struct line_input *in = line_input_open("> ", history, &g_interrupt);
    free(history);
    status = in ? chat_loop(c, in) : 1;
    line_input_close(in);
out:
    drop_turns(c, 0, c->n_turns);
    stop_free(c->stop);
    engine_close(c->e);
    grammar_free(c->sp.grammar); // after the last sampler, then its trie
    grammar_vocab_free(c->gvocab);
    buf_free(&c->reply);
    free(c);
    return status;
}
