// `vela serve`: HTTP routing, validation and streaming (see serve.h).
// POLLRDHUP (Linux): the peer closed its end, seen without reading.
#define _GNU_SOURCE
#include "tools/serve/serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "host/engine/constrain.h"
#include "host/ops/selfextend.h"
#include "host/tokenizer/tokenizer.h"
#include "tools/serve/api.h"
#include "tools/serve/chat_kwargs.h"
#include "tools/serve/log.h"
#include "tools/serve/toolcall.h"
#include "tools/serve/webui.h"
#include "tools/serve/worker.h"

struct serve {
    struct serve_config cfg;
    struct MHD_Daemon *d;
    struct srv_worker w;
    struct engine *e;             // NULL while the model loads
    struct grammar_vocab *gvocab; // the model's token trie for grammars (NULL: no tokenizer)
    struct api_ctx_limits limits; // set with e
    atomic_bool ready;
    atomic_bool stopping; // serve_stop has begun: requests that end in error end for it
    atomic_int n_open;    // requests received and not yet completed (on_completed)
    // libmicrohttpd's last message while serve_start runs (why it could not listen)
    char mhd_msg[256];
    atomic_bool started;
    atomic_uint_fast64_t next_id;
    int64_t created;
    char model_id[256];
};

// One HTTP request: its body as it arrives, and what its access line says.
struct conn {
    struct buf body;
    bool too_big;
    char method[16], path[256], remote[64];
    double t0_ms;
    int status;                // queued with the response; 0: none yet
    int tokens_in, tokens_out; // a completion's usage; -1: not a completion
};

void serve_config_default(struct serve_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->n_parallel = 4;
    c->n_queue_max = 64;
    c->slot_similarity = 0.5f;
    c->max_body = (size_t)4 << 20;
    c->max_connections = 256;
    c->timeout_s = 600;
    api_defaults_openai(&c->defaults);
}

// --- responses ------------------------------------------------------------------

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *text, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, char *json) {
    if (!json)
        return send_text(c, 500, "application/json",
                         "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}",
                         63);
    enum MHD_Result ok = send_text(c, status, "application/json", json, strlen(json));
    free(json);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const struct api_error *e) {
    return send_json(c, (unsigned)e->status, api_error_json(e));
}

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *type,
                            const char *code, const char *msg) {
    struct api_error e;
    api_fail(&e, status, type, code, "%s", msg);
    return send_error(c, &e);
}

// The client closed its end: nothing more will be read from it.
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return true;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP))
        return true;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// Waits on r's condition for up to 100 ms (r->mu held).
static void wait_a_little(struct srv_req *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

// Usage of every choice; the cache and timings are the first choice's (the
// others share its prompt cells or read the prompt alongside it).
static struct api_usage usage_of(const struct srv_req *r) {
    const struct engine_req_stats *st = &r->jobs[0].st;
    struct api_usage u = {.prompt_tokens = r->n_tokens,
                          .cached_tokens = st->n_prompt_reused,
                          .timings = true,
                          .prompt_n = st->n_prompt_eval};
    u.spec = api_request_speculates(&r->api);
    for (int i = 0; i < r->n_jobs; i++) {
        u.completion_tokens += r->jobs[i].n_gen;
        u.draft_n += r->jobs[i].st.n_drafted;
        u.draft_n_accepted += r->jobs[i].st.n_accepted;
    }
    if (st->t_first_ms > 0) {
        u.prompt_ms = st->t_first_ms - st->t_start_ms;
        u.predicted_ms = st->t_last_ms - st->t_first_ms;
    }
    return u;
}

static struct api_choice choice_of(const struct srv_job *j) {
    return (struct api_choice){.text = j->text.p,
                               .len = j->text.len,
                               .reasoning = j->reasoning.p,
                               .reasoning_len = j->reasoning.len,
                               .finish = j->finish,
                               .lp = j->req->api.logprobs ? j->lp : NULL,
                               .n_lp = j->n_lp};
}

// Why choice j that finished with "error" ended: its grammar allowed no
// token (400, with the engine's note), the shutdown (503, the client may
// retry elsewhere) or a failed step (500).
static void ended_error(struct serve *s, const struct srv_job *j, struct api_error *e) {
    if (j->note[0])
        api_fail(e, 400, "invalid_request_error", "grammar_dead_end", "%s", j->note);
    else if (atomic_load(&s->stopping))
        api_fail(e, 503, "unavailable_error", "shutting_down", "the server is shutting down");
    else
        api_fail(e, 500, "server_error", NULL, "the request was ended by the server");
}

// --- tool calls --------------------------------------------------------------------

// The tool calls found in a finished chat answer (tools/serve/toolcall.h).
struct answer_calls {
    struct api_tool_call *calls; // [n] owned
    int n;
    size_t content_len; // bytes of the text that are content
};

// The calls the harmony parser found in job j (copied), with ids
// "<prefix>_<k>". -1: out of memory.
static int harmony_calls(const struct srv_job *j, const char *prefix, struct answer_calls *ac) {
    if (!j->n_calls)
        return 0;
    if (!(ac->calls = calloc((size_t)j->n_calls, sizeof *ac->calls)))
        return -1;
    ac->n = j->n_calls;
    for (int k = 0; k < j->n_calls; k++) {
        char id[96];
        snprintf(id, sizeof id, "%s_%d", prefix, k);
        struct api_tool_call *c = &ac->calls[k];
        c->id = strdup(id);
        c->name = strdup(j->calls[k].name);
        c->arguments = strdup(j->calls[k].arguments ? j->calls[k].arguments : "");
        if (!c->id || !c->name || !c->arguments)
            return -1;
    }
    return 0;
}

// Splits job i's finished text into content and calls when the request
// offered tools; nothing found: the whole text is content. -1: out of memory.
static int answer_calls_find(const struct serve *s, const struct srv_req *r, int i,
                             struct answer_calls *ac) {
    const struct srv_job *j = &r->jobs[i];
    ac->content_len = j->text.len;
    if (r->api.kind != API_CHAT || !toolcall_wanted(&r->api))
        return 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "call_%.40s_%d", r->id, i);
    if (r->harmony)
        return harmony_calls(j, prefix, ac);
    return toolcall_parse(toolcall_format_of(s->cfg.tmpl), j->text.p ? j->text.p : "", j->text.len,
                          prefix, &ac->content_len, &ac->calls, &ac->n);
}

// The choice with its calls: content cut to the text before them, and
// finish_reason "tool_calls" (OpenAI's) when the answer ended on its own.
static void answer_calls_apply(const struct answer_calls *ac, struct api_choice *ch) {
    if (ac->n == 0)
        return;
    ch->len = ac->content_len < ch->len ? ac->content_len : ch->len;
    ch->calls = ac->calls;
    ch->n_calls = ac->n;
    if (ch->finish && !strcmp(ch->finish, "stop"))
        ch->finish = "tool_calls";
}

// --- non-streamed completions ------------------------------------------------------

static enum MHD_Result complete_whole(struct serve *s, struct MHD_Connection *c, struct srv_req *r,
                                      struct conn *cn) {
    pthread_mutex_lock(&r->mu);
    while (r->n_done < r->n_jobs) {
        wait_a_little(r);
        if (r->n_done < r->n_jobs && client_gone(c)) {
            pthread_mutex_unlock(&r->mu);
            srv_worker_cancel(&s->w, r);
            return MHD_NO;
        }
    }
    struct api_choice ch[API_MAX_N];
    struct answer_calls calls[API_MAX_N] = {0};
    bool error = false;
    struct api_error e;
    for (int i = 0; i < r->n_jobs; i++) {
        ch[i] = choice_of(&r->jobs[i]);
        if (!error && !strcmp(r->jobs[i].finish, "error"))
            ended_error(s, &r->jobs[i], &e);
        error |= !strcmp(r->jobs[i].finish, "error");
        if (!error && answer_calls_find(s, r, i, &calls[i])) {
            api_fail(&e, 500, "server_error", NULL, "out of memory");
            error = true;
        }
        answer_calls_apply(&calls[i], &ch[i]);
    }
    struct api_usage u = usage_of(r);
    cn->tokens_out = u.completion_tokens;
    char *json = error                       ? NULL
                 : r->api.kind == API_NATIVE ? api_native_json(s->model_id, &ch[0], &u)
                                             : api_response_json(r->api.kind, r->id, s->model_id,
                                                                 r->created, ch, r->n_jobs, &u);
    for (int i = 0; i < r->n_jobs; i++)
        api_tools_calls_free(calls[i].calls, calls[i].n);
    pthread_mutex_unlock(&r->mu);
    if (error)
        return send_error(c, &e);
    return send_json(c, 200, json);
}

// --- streamed completions ----------------------------------------------------------

struct stream {
    struct serve *s;
    struct srv_req *r;
    struct MHD_Connection *c;
    struct conn *cn; // alive while the response is read (the request is open)
    struct buf out;  // SSE bytes; out.p[off..] not yet handed to MHD
    size_t off;
    bool role_sent[API_MAX_N], final_sent[API_MAX_N];
    bool ended;
};

// Appends s (malloc'd; taken) to the stream's pending bytes.
static int out_add(struct stream *st, char *s) {
    int rc = s ? buf_add(&st->out, s, strlen(s)) : -1;
    free(s);
    return rc;
}

// llama-server's /completion stream (one choice): new text as
// {"content", "stop": false} events, then the whole answer's fields with
// "stop": true, or the error; no [DONE] (r->mu held).
static int stream_collect_native(struct stream *st) {
    struct srv_req *r = st->r;
    struct srv_job *j = &r->jobs[0];
    if (j->text.len > j->sent) {
        struct api_choice ch = {.text = j->text.p + j->sent, .len = j->text.len - j->sent};
        if (out_add(st, api_native_chunk_sse(st->s->model_id, &ch, NULL)))
            return -1;
        j->sent = j->text.len;
    }
    if (!j->done)
        return 0;
    struct api_usage u = usage_of(r);
    st->cn->tokens_out = u.completion_tokens;
    struct api_error e;
    const struct api_choice ch = {.text = "", .len = 0, .finish = j->finish};
    bool error = !strcmp(j->finish, "error");
    if (error)
        ended_error(st->s, j, &e);
    if (out_add(st, error ? api_error_sse(&e) : api_native_chunk_sse(st->s->model_id, &ch, &u)))
        return -1;
    st->ended = true;
    return 0;
}

// Choice i's new events: its text up to avail bytes and logprobs, then, once
// it is done, its tool calls (ac) and its end (r->mu held).
static int stream_choice(struct stream *st, int i, size_t avail, const struct answer_calls *ac) {
    struct srv_req *r = st->r;
    const enum api_kind k = r->api.kind;
    struct srv_job *j = &r->jobs[i];
    if (j->reasoning.len > j->reasoning_sent) { // llama-server's reasoning_content deltas
        struct api_choice ch = {.text = "",
                                .reasoning = j->reasoning.p + j->reasoning_sent,
                                .reasoning_len = j->reasoning.len - j->reasoning_sent};
        if (out_add(st, api_chunk_sse(k, r->id, st->s->model_id, r->created, i, &ch,
                                      !st->role_sent[i], NULL)))
            return -1;
        st->role_sent[i] = true;
        j->reasoning_sent = j->reasoning.len;
    }
    const bool news = avail > j->sent || j->lp_sent < j->n_lp;
    if (news || (!st->role_sent[i] && k == API_CHAT)) {
        const size_t to = avail > j->sent ? avail : j->sent;
        struct api_choice ch = {.text = j->text.p + j->sent,
                                .len = to - j->sent,
                                .lp = r->api.logprobs ? j->lp + j->lp_sent : NULL,
                                .n_lp = j->n_lp - j->lp_sent};
        if (out_add(st, api_chunk_sse(k, r->id, st->s->model_id, r->created, i, &ch,
                                      !st->role_sent[i], NULL)))
            return -1;
        st->role_sent[i] = true;
        j->sent = to;
        j->lp_sent = j->n_lp;
    }
    if (!j->done || st->final_sent[i])
        return 0;
    if (!strcmp(j->finish, "error")) {
        struct api_error e;
        ended_error(st->s, j, &e);
        if (out_add(st, api_chunk_error_sse(k, r->id, st->s->model_id, r->created, i, &e)))
            return -1;
    } else {
        struct api_choice ch = {.text = "", .len = 0, .finish = j->finish};
        if (ac->n > 0) { // the calls in one delta, then the end
            struct api_choice calls = {.text = "", .len = 0, .calls = ac->calls, .n_calls = ac->n};
            if (out_add(st, api_chunk_sse(k, r->id, st->s->model_id, r->created, i, &calls, false,
                                          NULL)))
                return -1;
            answer_calls_apply(ac, &ch); // its finish_reason; the calls went above
            ch.calls = NULL;
            ch.n_calls = 0;
        }
        if (out_add(st, api_chunk_sse(k, r->id, st->s->model_id, r->created, i, &ch, false, NULL)))
            return -1;
    }
    st->final_sent[i] = true;
    return 0;
}

// New text, logprobs and endings of every choice as SSE events (r->mu held).
static int stream_collect(struct stream *st) {
    struct srv_req *r = st->r;
    const enum api_kind k = r->api.kind;
    if (k == API_NATIVE)
        return stream_collect_native(st);
    const bool tools = k == API_CHAT && toolcall_wanted(&r->api);
    for (int i = 0; i < r->n_jobs; i++) {
        struct srv_job *j = &r->jobs[i];
        // With tools, text that may be a call is held back until the answer ends.
        size_t avail = j->text.len;
        struct answer_calls ac = {0};
        if (tools && !j->done)
            avail =
                toolcall_stream_safe(toolcall_format_of(st->s->cfg.tmpl), j->text.p, j->text.len);
        else if (tools && st->final_sent[i])
            avail = j->sent;
        else if (tools && strcmp(j->finish, "error")) {
            if (answer_calls_find(st->s, r, i, &ac))
                return -1;
            avail = ac.content_len;
        }
        int rc = stream_choice(st, i, avail, &ac);
        api_tools_calls_free(ac.calls, ac.n);
        if (rc)
            return -1;
    }
    if (r->n_done == r->n_jobs) {
        st->cn->tokens_out = usage_of(r).completion_tokens;
        if (r->api.include_usage) {
            struct api_usage u = usage_of(r);
            if (out_add(st,
                        api_chunk_sse(k, r->id, st->s->model_id, r->created, 0, NULL, false, &u)))
                return -1;
        }
        if (out_add(st, strdup(api_sse_done)))
            return -1;
        st->ended = true;
    }
    return 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream *st = cls;
    struct srv_req *r = st->r;
    while (st->off == st->out.len) {
        if (st->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        st->off = st->out.len = 0;
        pthread_mutex_lock(&r->mu);
        int rc = stream_collect(st);
        bool empty = st->out.len == 0 && !st->ended;
        if (empty)
            wait_a_little(r);
        pthread_mutex_unlock(&r->mu);
        if (rc)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (empty && client_gone(st->c)) {
            srv_worker_cancel(&st->s->w, r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = st->out.len - st->off < max ? st->out.len - st->off : max;
    memcpy(buf, st->out.p + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    struct stream *st = cls;
    pthread_mutex_lock(&st->r->mu);
    bool running = st->r->n_done < st->r->n_jobs;
    pthread_mutex_unlock(&st->r->mu);
    if (running) // the client left before the end: its cells are freed at the next step
        srv_worker_cancel(&st->s->w, st->r);
    srv_req_release(st->r);
    buf_free(&st->out);
    free(st);
}

static enum MHD_Result complete_stream(struct serve *s, struct MHD_Connection *c, struct srv_req *r,
                                       struct conn *cn) {
    struct stream *st = calloc(1, sizeof *st);
    if (!st)
        return fail(c, 500, "server_error", NULL, "out of memory");
    st->s = s;
    st->r = r;
    st->c = c;
    st->cn = cn;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!resp) {
        free(st);
        return MHD_NO;
    }
    pthread_mutex_lock(&r->mu);
    r->refs++; // the stream's, released by stream_free
    pthread_mutex_unlock(&r->mu);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ok;
}

// --- prompts -----------------------------------------------------------------------

// A chat request's messages formatted with the model's template, the
// assistant's turn opened: *text malloc'd, *len bytes.
static int format_chat(const struct serve *s, const struct api_request *a, char **text, size_t *len,
                       struct api_error *e) {
    if (!s->cfg.have_tmpl)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "the model has no usable chat template (start the server with "
                        "--chat-template NAME)");
    struct chat_msg msgs[API_MAX_MESSAGES + 1];
    struct toolcall_strs keep = {0};
    int n = 0;
    if (toolcall_render(s->cfg.tmpl, a, msgs, &n, &keep, e)) {
        toolcall_strs_free(&keep);
        return -1;
    }
    struct verr err = {0};
    struct chat_opts opts = chat_kwargs_opts(&a->kwargs);
    int rc = chat_kwargs_check(&a->kwargs, s->cfg.tmpl, &err);
    if (!rc)
        rc = chat_format(s->cfg.tmpl, msgs, (size_t)n, &opts, true, text, len, &err);
    toolcall_strs_free(&keep);
    if (rc)
        return api_fail(e, 400, "invalid_request_error", "invalid_value", "%s", err.msg);
    return 0;
}

// The prompt's tokens: the completion's text or ids, or the chat formatted
// with the model's template. The template's end-of-turn token joins the stop
// tokens.
static int prompt_tokens(struct serve *s, struct api_request *a, int32_t **toks, int *n,
                         int32_t *stop_tok, struct api_error *e) {
    const struct tokenizer *tok = s->e->tok;
    const int V = s->e->m->hp.n_vocab;
    struct verr err = {0};
    *stop_tok = -1;
    if (a->kind != API_CHAT && a->prompt_tokens) {
        for (int i = 0; i < a->n_prompt_tokens; i++)
            if (a->prompt_tokens[i] >= V)
                return api_fail(e, 400, "invalid_request_error", "invalid_value",
                                "'prompt': token id %d is out of range (n_vocab %d)",
                                a->prompt_tokens[i], V);
        *toks = a->prompt_tokens;
        *n = a->n_prompt_tokens;
        a->prompt_tokens = NULL;
        return 0;
    }
    if (!tok)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "the model has no tokenizer: send 'prompt' as token ids");
    char *text = a->prompt;
    size_t len = text ? strlen(text) : 0;
    bool formatted = false;
    if (a->kind == API_CHAT) {
        if (format_chat(s, a, &text, &len, e))
            return -1;
        formatted = true;
        *stop_tok = chat_eot_token(tok, s->cfg.tmpl);
    }
    int rc = tokenizer_encode_alloc(tok, text, len, true, true, toks, n, &err);
    if (formatted)
        free(text);
    if (rc)
        return api_fail(e, 500, "server_error", NULL, "tokenizing: %s", err.msg);
    if (*n == 0)
        return api_fail(e, 400, "invalid_request_error", "invalid_value", "the prompt is empty");
    return 0;
}

// The control token whose text is marker (NULL: none), or -1 where the
// vocabulary has no such token (the marker is then plain text, which the
// detokenizer keeps).
static int32_t marker_token(const struct serve *s, const char *marker) {
    int32_t id[2];
    int n = 0;
    if (!marker || !s->e->tok ||
        tokenizer_encode(s->e->tok, marker, strlen(marker), false, true, id, 2, &n, NULL) ||
        n != 1 || !tokenizer_is_control(s->e->tok, id[0]))
        return -1;
    return id[0];
}

// Appends (token, bias) to *b [*n] (capacity *cap, grown); SAMPLER_MAX_BIAS at most.
static int bias_push(struct sampler_bias **b, int *n, int *cap, int32_t token, float bias,
                     struct api_error *e) {
    if (*n == SAMPLER_MAX_BIAS)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "'logit_bias' names more than %d tokens", SAMPLER_MAX_BIAS);
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 16;
        struct sampler_bias *g = realloc(*b, (size_t)c * sizeof *g);
        if (!g)
            return api_fail(e, 500, "server_error", NULL, "out of memory");
        *b = g;
        *cap = c;
    }
    (*b)[(*n)++] = (struct sampler_bias){token, bias};
    return 0;
}

// The request's logit_bias as the sampler's entries: token ids checked
// against the vocabulary, texts tokenized without BOS as llama-server does
// (each of their tokens gets the bias).
static int resolve_logit_bias(struct serve *s, const struct api_request *a,
                              struct sampler_bias **out, int *n_out, struct api_error *e) {
    const int V = s->e->m->hp.n_vocab;
    struct sampler_bias *b = NULL;
    int n = 0, cap = 0, rc = 0;
    for (int i = 0; i < a->n_bias && !rc; i++) {
        const struct api_bias *x = &a->bias[i];
        if (!x->text) {
            rc = x->token < V ? bias_push(&b, &n, &cap, x->token, x->bias, e)
                              : api_fail(e, 400, "invalid_request_error", "invalid_value",
                                         "'logit_bias': token id %d is out of range (n_vocab %d)",
                                         x->token, V);
            continue;
        }
        if (!s->e->tok) {
            rc = api_fail(e, 400, "invalid_request_error", "invalid_value",
                          "'logit_bias' entry %d: the model has no tokenizer: give token ids", i);
            continue;
        }
        int32_t *toks = NULL;
        int nt = 0;
        struct verr err = {0};
        if (tokenizer_encode_alloc(s->e->tok, x->text, strlen(x->text), false, false, &toks, &nt,
                                   &err))
            rc = api_fail(e, 500, "server_error", NULL, "tokenizing logit_bias: %s", err.msg);
        for (int t = 0; t < nt && !rc; t++)
            rc = bias_push(&b, &n, &cap, toks[t], x->bias, e);
        free(toks);
    }
    if (rc) {
        free(b);
        b = NULL;
        n = 0;
    }
    *out = b;
    *n_out = n;
    return rc;
}

// --- grammars ----------------------------------------------------------------------

// The request's grammar, parsed against the model's vocabulary: its own
// (grammar, json_schema, response_format), or, for a forced tool call
// (tool_choice required or named), the grammar of the call. NULL: none.
static int request_grammar(const struct serve *s, const struct api_request *a, struct grammar **g,
                           struct api_error *e) {
    *g = NULL;
    const bool forced = a->kind == API_CHAT && (a->tools.choice == API_TOOL_CHOICE_REQUIRED ||
                                                a->tools.choice == API_TOOL_CHOICE_NAMED);
    if (!a->grammar && !forced && !s->cfg.grammar)
        return 0;
    if (a->grammar && forced)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "a forced tool call (tool_choice) has a grammar of its own: leave out "
                        "'grammar', 'json_schema' and 'response_format'");
    if (!s->gvocab)
        return api_fail(e, 400, "invalid_request_error", "invalid_value",
                        "grammars need the model's tokenizer, and this model has none");
    char *text = a->grammar ? a->grammar : (char *)s->cfg.grammar;
    if (forced && toolcall_grammar(s->cfg.tmpl, a, &text, e))
        return -1;
    struct verr err = {0};
    int rc = constrain_parse(g, s->e->tok, text, strlen(text), NULL, &err);
    if (forced)
        free(text);
    if (rc)
        return api_fail(e, 400, "invalid_request_error", "invalid_value", "%s: %s",
                        forced ? "the tool call's grammar" : "'grammar'", err.msg);
    return 0;
}

static enum MHD_Result handle_completion(struct serve *s, struct MHD_Connection *c, enum api_kind k,
                                         struct conn *cn) {
    struct api_request a;
    struct api_error e = {0};
    if (api_parse_request(k, cn->body.p ? cn->body.p : "", cn->body.len, &s->cfg.defaults, &a, &e))
        return send_error(c, &e);
    if (s->cfg.strict_model_name && a.model && strcmp(a.model, s->model_id)) {
        api_fail(&e, 404, "invalid_request_error", "model_not_found",
                 "the model '%.100s' does not exist; this server serves '%.100s'", a.model,
                 s->model_id);
        api_request_free(&a);
        return send_error(c, &e);
    }
    int32_t *toks = NULL, stop_tok = -1;
    int n = 0;
    if (prompt_tokens(s, &a, &toks, &n, &stop_tok, &e)) {
        api_request_free(&a);
        free(toks);
        return send_error(c, &e);
    }
    cn->tokens_in = n;
    cn->tokens_out = 0;
    int max_gen = -1;
    if (api_check_context(&a, n, &s->limits, &max_gen, &e)) {
        api_request_free(&a);
        free(toks);
        return send_error(c, &e);
    }
    struct sampler_bias *bias = NULL;
    int n_bias = 0;
    struct grammar *g = NULL;
    if (resolve_logit_bias(s, &a, &bias, &n_bias, &e) || request_grammar(s, &a, &g, &e)) {
        api_request_free(&a);
        free(toks);
        free(bias);
        return send_error(c, &e);
    }
    struct srv_req *r = srv_req_new(&a, toks, n, s->e->m->hp.n_vocab);
    if (!r) {
        api_request_free(&a);
        free(toks);
        free(bias);
        grammar_free(g);
        return fail(c, 500, "server_error", NULL, "out of memory");
    }
    r->max_gen = max_gen;
    r->bias = bias;
    r->n_bias = n_bias;
    r->grammar = g;
    r->gvocab = s->gvocab;
    if (k == API_CHAT && toolcall_wanted(&r->api))
        r->marker =
            marker_token(s, r->marker_text = toolcall_marker(toolcall_format_of(s->cfg.tmpl)));
    // The template's end of turn ends the answer, unless ignore_eos asks to
    // go on past end-of-generation tokens (llama-server does the same).
    if (stop_tok >= 0 && !r->api.ignore_eos)
        r->stop_tokens[r->n_stop_tokens++] = stop_tok;
    // harmony: the answer's channels apart, unless reasoning_format none
    // asks for the text as it is.
    r->harmony = k == API_CHAT && s->cfg.tmpl == CHAT_TMPL_GPT_OSS &&
                 r->api.reasoning != CHAT_REASONING_NONE;
    snprintf(r->id, sizeof r->id, "%s-%llx", k == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    r->created = (int64_t)time(NULL);
    srv_worker_submit(&s->w, r);
    enum MHD_Result ok;
    if (r->err.status)
        ok = send_error(c, &r->err);
    else if (r->api.stream)
        ok = complete_stream(s, c, r, cn);
    else
        ok = complete_whole(s, c, r, cn);
    srv_req_release(r);
    return ok;
}

// --- small endpoints ---------------------------------------------------------------

static enum MHD_Result handle_tokenize(struct serve *s, struct MHD_Connection *c, struct conn *cn) {
    cJSON *o = api_json_parse(cn->body.p ? cn->body.p : "", cn->body.len);
    const cJSON *ct = o ? cJSON_GetObjectItemCaseSensitive(o, "content") : NULL;
    const cJSON *as = o ? cJSON_GetObjectItemCaseSensitive(o, "add_special") : NULL;
    const cJSON *wp = o ? cJSON_GetObjectItemCaseSensitive(o, "with_pieces") : NULL;
    if (!cJSON_IsString(ct) || (as && !cJSON_IsBool(as)) || (wp && !cJSON_IsBool(wp)) ||
        !api_utf8_valid(ct->valuestring, strlen(ct->valuestring)) || !s->e->tok) {
        cJSON_Delete(o);
        return fail(c, 400, "invalid_request_error", "invalid_value",
                    "expected {\"content\": string (UTF-8), \"add_special\": bool, "
                    "\"with_pieces\": bool}");
    }
    int32_t *ids = NULL;
    int n = 0;
    struct verr err = {0};
    if (tokenizer_encode_alloc(s->e->tok, ct->valuestring, strlen(ct->valuestring),
                               cJSON_IsTrue(as), true, &ids, &n, &err)) {
        cJSON_Delete(o);
        return fail(c, 500, "server_error", NULL, err.msg);
    }
    cJSON *res = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(res, "tokens");
    for (int i = 0; i < n; i++) {
        if (!cJSON_IsTrue(wp)) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        const char *p;
        size_t len;
        cJSON *it = cJSON_CreateObject();
        cJSON_AddNumberToObject(it, "id", ids[i]);
        if (tokenizer_piece(s->e->tok, ids[i], true, &p, &len, NULL) == 0 &&
            api_utf8_valid(p, len)) {
            char *t = malloc(len + 1);
            if (t) {
                memcpy(t, p, len);
                t[len] = '\0';
                cJSON_AddStringToObject(it, "piece", t);
                free(t);
            }
        }
        cJSON_AddItemToArray(arr, it);
    }
    free(ids);
    cJSON_Delete(o);
    char *js = cJSON_PrintUnformatted(res);
    cJSON_Delete(res);
    return send_json(c, 200, js);
}

static enum MHD_Result handle_detokenize(struct serve *s, struct MHD_Connection *c,
                                         struct conn *cn) {
    cJSON *o = api_json_parse(cn->body.p ? cn->body.p : "", cn->body.len);
    const cJSON *tk = o ? cJSON_GetObjectItemCaseSensitive(o, "tokens") : NULL;
    const int V = s->e->tok ? tokenizer_n_vocab(s->e->tok) : 0;
    int n = cJSON_IsArray(tk) ? cJSON_GetArraySize(tk) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    bool ok = n >= 0 && (n == 0 || ids) && V > 0;
    for (int i = 0; ok && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(tk, i);
        ok = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < V &&
             v->valuedouble == (double)(int32_t)v->valuedouble;
        if (ok)
            ids[i] = (int32_t)v->valuedouble;
    }
    cJSON_Delete(o);
    if (!ok) {
        free(ids);
        return fail(c, 400, "invalid_request_error", "invalid_value",
                    "expected {\"tokens\": [ids in the vocabulary]}");
    }
    char *text = NULL;
    size_t len = 0;
    struct verr err = {0};
    int rc = n ? tokenizer_decode(s->e->tok, ids, n, false, false, &text, &len, &err) : 0;
    free(ids);
    if (rc)
        return fail(c, 500, "server_error", NULL, err.msg);
    cJSON *res = cJSON_CreateObject();
    // A cut multi-byte character would make invalid JSON: replace such text.
    cJSON_AddStringToObject(res, "content",
                            !text                       ? ""
                            : api_utf8_valid(text, len) ? text
                                                        : "\xEF\xBF\xBD");
    free(text);
    char *js = cJSON_PrintUnformatted(res);
    cJSON_Delete(res);
    return send_json(c, 200, js);
}

// llama-server's POST /apply-template: {"messages": [...]} as the chat
// endpoint takes them -> {"prompt": the formatted text}.
static enum MHD_Result handle_apply_template(struct serve *s, struct MHD_Connection *c,
                                             struct conn *cn) {
    struct api_request a;
    struct api_error e = {0};
    if (api_parse_request(API_CHAT, cn->body.p ? cn->body.p : "", cn->body.len, &s->cfg.defaults,
                          &a, &e))
        return send_error(c, &e);
    char *text = NULL;
    size_t len = 0;
    int rc = format_chat(s, &a, &text, &len, &e);
    api_request_free(&a);
    if (rc)
        return send_error(c, &e);
    cJSON *res = cJSON_CreateObject();
    cJSON_AddStringToObject(res, "prompt", text); // NUL-terminated, UTF-8 (messages are checked)
    free(text);
    char *js = cJSON_PrintUnformatted(res);
    cJSON_Delete(res);
    return send_json(c, 200, js);
}

// llama-server's GET /props: the defaults a request gets, the slots, the
// model and its chat template.
static enum MHD_Result handle_props(struct serve *s, struct MHD_Connection *c) {
    const struct api_defaults *d = &s->cfg.defaults;
    cJSON *o = cJSON_CreateObject();
    cJSON *g = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(g, "n_ctx", s->limits.n_ctx_slot);
    cJSON *p = cJSON_AddObjectToObject(g, "params");
    cJSON_AddNumberToObject(p, "n_predict", d->n_predict);
    cJSON_AddNumberToObject(p, "temperature", d->temperature);
    cJSON_AddNumberToObject(p, "top_k", d->top_k);
    cJSON_AddNumberToObject(p, "top_p", d->top_p);
    cJSON_AddNumberToObject(p, "min_p", d->min_p);
    cJSON_AddNumberToObject(p, "repeat_penalty", d->repeat_penalty);
    cJSON_AddNumberToObject(p, "repeat_last_n", d->repeat_last_n);
    cJSON_AddNumberToObject(p, "presence_penalty", d->presence_penalty);
    cJSON_AddNumberToObject(p, "frequency_penalty", d->frequency_penalty);
    cJSON_AddNumberToObject(p, "seed", d->seed < 0 ? -1 : (double)d->seed);
    cJSON_AddNumberToObject(o, "total_slots", s->cfg.n_parallel);
    cJSON_AddStringToObject(o, "model_alias", s->model_id);
    cJSON_AddStringToObject(o, "model_path", s->cfg.model_path ? s->cfg.model_path : "");
    cJSON_AddStringToObject(o, "chat_template",
                            s->cfg.have_tmpl ? chat_template_name(s->cfg.tmpl) : "");
    cJSON *m = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(m, "vision", false);
    cJSON_AddBoolToObject(m, "audio", false);
    cJSON_AddStringToObject(o, "build_info", "vela");
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return send_json(c, 200, js);
}

// llama-server's GET /slots (with --slots): each slot's id, context and
// whether it holds a request ("state": 0 idle, 1 reading its prompt, 2
// generating) as the engine left them after its last step.
static enum MHD_Result handle_slots(struct serve *s, struct MHD_Connection *c) {
    if (!s->cfg.slots)
        return fail(c, 501, "not_supported_error", "not_supported",
                    "This server does not support slots endpoint. Start it with `--slots`");
    struct srv_metrics m;
    srv_worker_metrics(&s->w, &m);
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < s->cfg.n_parallel; i++) {
        const int state = i < m.n_slots ? m.slot_state[i] : 0;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddNumberToObject(o, "n_ctx", s->limits.n_ctx_slot);
        cJSON_AddBoolToObject(o, "is_processing", state != 0);
        cJSON_AddNumberToObject(o, "state", state);
        cJSON_AddItemToArray(arr, o);
    }
    char *js = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    return send_json(c, 200, js);
}

static enum MHD_Result handle_models(struct serve *s, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "vela");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_vocab", s->e->m->hp.n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", s->e->m->hp.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx", context_config(s->e->ctx)->n_ctx);
    cJSON_AddNumberToObject(meta, "n_ctx_slot",
                            context_config(s->e->ctx)->n_ctx / s->cfg.n_parallel);
    cJSON_AddNumberToObject(meta, "n_params", (double)s->e->m->n_params);
    if (s->limits.se_g > 1) {
        cJSON *se = cJSON_AddObjectToObject(meta, "self_extend");
        cJSON_AddNumberToObject(se, "n", s->limits.se_g);
        cJSON_AddNumberToObject(se, "w", s->limits.se_w);
        cJSON_AddNumberToObject(
            se, "n_ctx_extended",
            (double)se_extended_ctx(s->limits.n_ctx_train, s->limits.se_g, s->limits.se_w));
    }
    // Whether a request may send its own self_extend {n, w}.
    cJSON_AddBoolToObject(meta, "self_extend_per_request", s->limits.k_unrotated);
    cJSON_AddItemToArray(data, m);
    cJSON_AddItemToObject(o, "data", data);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return send_json(c, 200, js);
}

// Prometheus text format.
static void hist_lines(char *buf, size_t cap, size_t *n, const char *name, const char *help,
                       const uint64_t *h, double sum_ms, uint64_t count) {
    *n += (size_t)snprintf(buf + *n, cap - *n, "# HELP %s %s\n# TYPE %s histogram\n", name, help,
                           name);
    uint64_t cum = 0;
    for (int b = 0; b < SRV_HIST_BUCKETS; b++) {
        cum += h[b];
        if (b == SRV_HIST_BUCKETS - 1)
            *n += (size_t)snprintf(buf + *n, cap - *n, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                                   (unsigned long long)cum);
        else
            *n += (size_t)snprintf(buf + *n, cap - *n, "%s_bucket{le=\"%g\"} %llu\n", name,
                                   srv_hist_bounds_ms[b] / 1000.0, (unsigned long long)cum);
    }
    *n += (size_t)snprintf(buf + *n, cap - *n, "%s_sum %.6f\n%s_count %llu\n", name, sum_ms / 1e3,
                           name, (unsigned long long)count);
}

static enum MHD_Result handle_metrics(struct serve *s, struct MHD_Connection *c) {
    struct srv_metrics m;
    srv_worker_metrics(&s->w, &m);
    const double up_s = (engine_now_ms() - m.t_start_ms) / 1e3;
    char buf[8192];
    size_t n = 0;
    const struct {
        const char *name, *type, *help;
        double v;
    } rows[] = {
        {"vela_requests_total", "counter", "completion requests received",
         (double)m.requests_total},
        {"vela_requests_ok_total", "counter", "requests that completed", (double)m.requests_ok},
        {"vela_requests_failed_total", "counter", "requests refused or failed",
         (double)m.requests_failed},
        {"vela_requests_cancelled_total", "counter", "requests whose client left before the end",
         (double)m.requests_cancelled},
        {"vela_requests_running", "gauge", "requests decoding now", (double)m.running},
        {"vela_requests_queued", "gauge", "requests waiting for a slot", (double)m.queued},
        {"vela_prompt_tokens_total", "counter", "prompt tokens of finished requests",
         (double)m.prompt_tokens},
        {"vela_prompt_tokens_evaluated_total", "counter",
         "prompt tokens decoded (every choice; not those shared or cached)",
         (double)m.prompt_tokens_evaluated},
        {"vela_prompt_tokens_cached_total", "counter",
         "prompt tokens found in a slot's kept cells (cache_prompt) and not decoded again",
         (double)m.prompt_tokens_cached},
        {"vela_generated_tokens_total", "counter", "tokens generated", (double)m.generated_tokens},
        {"vela_generated_tokens_per_second", "gauge", "tokens generated per second of uptime",
         up_s > 0 ? (double)m.generated_tokens / up_s : 0},
        {"vela_draft_tokens_total", "counter",
         "draft tokens verified (speculative decoding) of finished requests",
         (double)m.draft_tokens},
        {"vela_draft_tokens_accepted_total", "counter", "of those, accepted",
         (double)m.draft_tokens_accepted},
        {"vela_kv_cells_used", "gauge", "KV cache cells in use", (double)m.kv_cells_used},
        {"vela_kv_cells_total", "gauge", "KV cache cells", (double)m.kv_cells_total},
        {"vela_kv_cache_bytes", "gauge",
         "bytes of the KV cache (K and V of every layer, in the --cache-type-k/-v types)",
         context_kv_bytes(s->e->ctx)},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n",
                              rows[i].name, rows[i].help, rows[i].name, rows[i].type, rows[i].name,
                              rows[i].v);
    hist_lines(buf, sizeof buf, &n, "vela_time_to_first_token_seconds",
               "time from a request's arrival to its first token", m.ttft_hist, m.ttft_sum_ms,
               m.ttft_count);
    hist_lines(buf, sizeof buf, &n, "vela_inter_token_latency_seconds",
               "mean time between a request's tokens", m.itl_hist, m.itl_sum_ms, m.itl_count);
    return send_text(c, 200, "text/plain; version=0.0.4", buf, n);
}

// --- routing -----------------------------------------------------------------------

enum route {
    R_HEALTH,
    R_MODELS,
    R_METRICS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_COMPLETIONS,
    R_CHAT,
    R_PROPS,
    R_APPLY_TEMPLATE,
    R_NATIVE,
    R_SLOTS,
    R_NONE,
};

static const struct {
    const char *path;
    const char *method;
    enum route r;
} routes[] = {
    {"/health", "GET", R_HEALTH},
    {"/v1/health", "GET", R_HEALTH},
    {"/v1/models", "GET", R_MODELS},
    {"/models", "GET", R_MODELS},
    {"/metrics", "GET", R_METRICS},
    {"/tokenize", "POST", R_TOKENIZE},
    {"/detokenize", "POST", R_DETOKENIZE},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/completions", "POST", R_COMPLETIONS},
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/chat/completions", "POST", R_CHAT},
    {"/props", "GET", R_PROPS},
    {"/completion", "POST", R_NATIVE},
    {"/slots", "GET", R_SLOTS},
    {"/apply-template", "POST", R_APPLY_TEMPLATE},
};

static bool authorized(const struct serve *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->cfg.api_key);
}

static enum MHD_Result dispatch(struct serve *s, struct MHD_Connection *c, const char *url,
                                const char *method, struct conn *cn) {
    // The chat page needs no API key and answers while the model loads.
    const struct webui_file *page = s->cfg.no_webui ? NULL : webui_find(url, method);
    if (page)
        return webui_send(c, page);
    enum route r = R_NONE;
    bool path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && r == R_NONE; i++)
        if (!strcmp(url, routes[i].path)) {
            path_known = true;
            if (!strcmp(method, routes[i].method))
                r = routes[i].r;
        }
    if (r == R_NONE && path_known)
        return fail(c, 405, "invalid_request_error", "method_not_allowed",
                    "method not allowed for this path");
    if (r == R_NONE)
        return fail(c, 404, "not_found_error", "not_found", "no such endpoint");
    if (r == R_HEALTH)
        return atomic_load(&s->ready)
                   ? send_text(c, 200, "application/json", "{\"status\":\"ok\"}", 15)
                   : fail(c, 503, "unavailable_error", "loading", "the model is loading");
    if (!authorized(s, c))
        return fail(c, 401, "authentication_error", "invalid_api_key",
                    "missing or wrong API key (Authorization: Bearer KEY)");
    if (!atomic_load(&s->ready))
        return fail(c, 503, "unavailable_error", "loading", "the model is loading");
    if (cn->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes (--max-body)",
                 s->cfg.max_body);
        return fail(c, 413, "invalid_request_error", "request_too_large", msg);
    }
    switch (r) {
    case R_MODELS:
        return handle_models(s, c);
    case R_METRICS:
        return handle_metrics(s, c);
    case R_TOKENIZE:
        return handle_tokenize(s, c, cn);
    case R_DETOKENIZE:
        return handle_detokenize(s, c, cn);
    case R_COMPLETIONS:
        return handle_completion(s, c, API_COMPLETION, cn);
    case R_CHAT:
        return handle_completion(s, c, API_CHAT, cn);
    case R_PROPS:
        return handle_props(s, c);
    case R_NATIVE:
        return handle_completion(s, c, API_NATIVE, cn);
    case R_SLOTS:
        return handle_slots(s, c);
    case R_APPLY_TEMPLATE:
        return handle_apply_template(s, c, cn);
    default:
        return MHD_NO;
    }
}

// A request's access-line fields, from its first call.
static void conn_begin(struct conn *cn, struct MHD_Connection *c, const char *url,
                       const char *method) {
    snprintf(cn->method, sizeof cn->method, "%s", method);
    snprintf(cn->path, sizeof cn->path, "%s", url);
    snprintf(cn->remote, sizeof cn->remote, "-");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, cn->remote,
                  sizeof cn->remote);
    cn->t0_ms = engine_now_ms();
    cn->tokens_in = cn->tokens_out = -1;
}

static const char *termination_name(enum MHD_RequestTerminationCode toe) {
    switch (toe) {
    case MHD_REQUEST_TERMINATED_WITH_ERROR:
        return "error";
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED:
        return "timeout";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN:
        return "shutdown";
    case MHD_REQUEST_TERMINATED_READ_ERROR:
        return "read error";
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT:
        return "the client left";
    default:
        return "other";
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    struct serve *s = cls;
    struct conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn)))
            return MHD_NO;
        conn_begin(cn, c, url, method);
        *con_cls = cn;
        atomic_fetch_add(&s->n_open, 1);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->too_big || cn->body.len + n > s->cfg.max_body) {
            cn->too_big = true; // read and dropped: the answer is a 413 at the end
            buf_free(&cn->body);
            return MHD_YES;
        }
        return buf_add(&cn->body, upload, n) ? MHD_NO : MHD_YES;
    }
    enum MHD_Result ok = dispatch(s, c, url, method, cn);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
    if (ci)
        cn->status = (int)ci->http_status;
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct serve *s = cls;
    struct conn *cn = *con_cls;
    if (cn) {
        srv_log_access(&(struct srv_access){.method = cn->method,
                                            .path = cn->path,
                                            .remote = cn->remote,
                                            .status = cn->status,
                                            .tokens_in = cn->tokens_in,
                                            .tokens_out = cn->tokens_out,
                                            .ms = engine_now_ms() - cn->t0_ms});
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            srv_log(SRV_LOG_DEBUG, "%s %s: ended before its answer was sent (%s)", cn->method,
                    cn->path, termination_name(toe));
        buf_free(&cn->body);
        free(cn);
        atomic_fetch_sub(&s->n_open, 1);
    }
    *con_cls = NULL;
}

// --- lifecycle ---------------------------------------------------------------------

// libmicrohttpd's messages go to the server's log as debug lines (vela
// reports the failures that matter in its own words); while serve_start
// runs, the last one is kept for its error message.
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    struct serve *s = cls;
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    if (!atomic_load(&s->started))
        snprintf(s->mhd_msg, sizeof s->mhd_msg, "%s", msg);
    srv_log(SRV_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

// libmicrohttpd's URL decoding, except that %00 stays as it is: a decoded
// NUL would end the path there in C strings ("/health%00x" answering as
// "/health"); kept, the path names nothing and gets a 404.
static size_t unescape_keep_nul(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    char *w = s;
    for (const char *r = s; *r;) {
        const int hi = r[0] == '%' ? hex_digit(r[1]) : -1, lo = hi >= 0 ? hex_digit(r[2]) : -1;
        if (lo >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

int serve_start(struct serve **out, const struct serve_config *cfg, int *port_out,
                struct verr *err) {
    *out = NULL;
    struct serve *s = calloc(1, sizeof *s);
    if (!s)
        return verr_set(err, VERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->created = (int64_t)time(NULL);
    atomic_init(&s->ready, false);
    atomic_init(&s->stopping, false);
    atomic_init(&s->n_open, 0);
    atomic_init(&s->started, false);
    atomic_init(&s->next_id, ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid());
    snprintf(s->model_id, sizeof s->model_id, "%s", cfg->model_id ? cfg->model_id : "vela");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port)};
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
        free(s);
        return verr_set(err, VERR_RANGE, "--host '%s': not an IPv4 address", cfg->host);
    }
    s->d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
            MHD_USE_ITC, // MHD_quiesce_daemon needs it in this mode
        (uint16_t)cfg->port, NULL, NULL, on_request, s,
        // first: MHD logs the options that come before it with its own logger
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 << 10, MHD_OPTION_UNESCAPE_CALLBACK,
        unescape_keep_nul, NULL, MHD_OPTION_END);
    if (!s->d) {
        int rc = verr_set(err, VERR_IO, "cannot listen on %s:%d: %s", cfg->host, cfg->port,
                          s->mhd_msg[0] ? s->mhd_msg : "in use, or not allowed");
        free(s);
        return rc;
    }
    atomic_store(&s->started, true);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    if (port_out)
        *port_out = di ? di->port : cfg->port;
    *out = s;
    return 0;
}

int serve_set_engine(struct serve *s, struct engine *e, struct verr *err) {
    s->e = e;
    s->limits =
        (struct api_ctx_limits){.n_ctx_slot = context_config(e->ctx)->n_ctx / s->cfg.n_parallel,
                                .n_ctx_train = e->m->hp.n_ctx_train,
                                .se_g = context_config(e->ctx)->se_g,
                                .se_w = context_config(e->ctx)->se_w,
                                .k_unrotated = context_config(e->ctx)->k_unrotated};
    if (s->limits.se_g > 1 && s->limits.se_w >= s->limits.n_ctx_slot)
        return verr_set(err, VERR_RANGE,
                        "self-extend window W = %d is not below a slot's context of %d cells "
                        "(-c %d split between %d slots): raise -c or lower --parallel",
                        s->limits.se_w, s->limits.n_ctx_slot, context_config(e->ctx)->n_ctx,
                        s->cfg.n_parallel);
    int rc = e->tok ? constrain_vocab_new(&s->gvocab, e->tok, err) : 0;
    if (rc)
        return rc;
    if (s->cfg.grammar) { // the default grammar parses, or the server does not start
        struct grammar *g = NULL;
        struct verr gerr = {0};
        if (!e->tok)
            return verr_set(err, VERR_RANGE, "--grammar needs the model's tokenizer");
        if (constrain_parse(&g, e->tok, s->cfg.grammar, strlen(s->cfg.grammar), NULL, &gerr))
            return verr_set(err, VERR_FORMAT, "the grammar (--grammar / --json-schema): %s",
                            gerr.msg);
        grammar_free(g);
    }
    rc = srv_worker_start(&s->w, e, s->cfg.n_parallel, s->cfg.n_queue_max, s->cfg.slot_similarity,
                          err);
    if (rc)
        return rc;
    atomic_store(&s->ready, true);
    return 0;
}

// Waits until every request received has been answered to the end (its
// stream's last chunk and [DONE] sent), at most SERVE_DRAIN_MS.
static void drain(struct serve *s) {
    const double t_end = engine_now_ms() + SERVE_DRAIN_MS;
    while (atomic_load(&s->n_open) > 0 && engine_now_ms() < t_end) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void serve_stop(struct serve *s) {
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    if (s->d)
        MHD_quiesce_daemon(s->d); // no new connections
    srv_worker_stop(&s->w);       // running requests end: streams get their error chunk, others 503
    if (s->d) {
        drain(s);
        MHD_stop_daemon(s->d); // closes what is left, joins the connection threads
    }
    srv_worker_free(&s->w);
    grammar_vocab_free(s->gvocab);
    free(s);
}
