// The engine thread of `vela serve` (see worker.h).
#include "tools/serve/worker.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/stop.h"
#include "host/tokenizer/tokenizer.h"
#include "tools/serve/log.h"

const double srv_hist_bounds_ms[SRV_HIST_BUCKETS] = {5,   10,   25,   50,   100,   250,
                                                     500, 1000, 2500, 5000, 10000, INFINITY};

static void hist_add(uint64_t *h, double ms) {
    for (int b = 0; b < SRV_HIST_BUCKETS; b++)
        if (ms <= srv_hist_bounds_ms[b]) {
            h[b]++;
            return;
        }
}

struct srv_req *srv_req_new(struct api_request *api, int32_t *tokens, int n_tokens, int n_vocab) {
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->api = *api;
    memset(api, 0, sizeof *api);
    r->tokens = tokens;
    r->n_tokens = n_tokens;
    r->n_jobs = r->api.n;
    r->n_vocab = n_vocab;
    r->max_gen = -1;
    r->marker = -1;
    for (int i = 0; i < r->n_jobs; i++) {
        r->jobs[i].req = r;
        r->jobs[i].index = i;
        harmony_init(&r->jobs[i].hp);
        if (stop_new(&r->jobs[i].stop, (const char *const *)r->api.stop, r->api.n_stop, NULL)) {
            r->n_jobs = i; // what exists is freed
            srv_req_release(r);
            return NULL;
        }
    }
    return r;
}

void srv_req_release(struct srv_req *r) {
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0)
        return;
    for (int i = 0; i < r->n_jobs; i++) {
        stop_free(r->jobs[i].stop);
        buf_free(&r->jobs[i].text);
        buf_free(&r->jobs[i].reasoning);
        api_tools_calls_free(r->jobs[i].calls, r->jobs[i].n_calls);
        free(r->jobs[i].lp);
        free(r->jobs[i].row);
    }
    api_request_free(&r->api);
    free(r->tokens);
    free(r->bias);
    grammar_free(r->grammar);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

// --- text and stop strings (under the request's lock) ---------------------------

// s[0..n) appended to the NUL-terminated *str (NULL: empty). -1 when out of memory.
static int str_append(char **str, const char *s, size_t n) {
    const size_t have = *str ? strlen(*str) : 0;
    char *t = realloc(*str, have + n + 1);
    if (!t)
        return -1;
    memcpy(t + have, s, n);
    t[have + n] = '\0';
    *str = t;
    return 0;
}

static int harmony_take(void *user, enum harmony_part part, const char *s, size_t n) {
    struct srv_job *j = user;
    if (part == HARMONY_CONTENT)
        return buf_add(&j->text, s, n);
    if (part == HARMONY_REASONING)
        return buf_add(&j->reasoning, s, n);
    if (part == HARMONY_TOOL_NAME) {
        struct api_tool_call *c = realloc(j->calls, (size_t)(j->n_calls + 1) * sizeof *c);
        if (!c)
            return -1;
        j->calls = c;
        c[j->n_calls] = (struct api_tool_call){0};
        return str_append(&c[j->n_calls++].name, s, n);
    }
    return j->n_calls ? str_append(&j->calls[j->n_calls - 1].arguments, s, n) : 0;
}

// Shown text (stop strings cut out) into the job: as it is, or split by the
// harmony parser. flush: the answer ended.
static int job_show(struct srv_job *j, const char *s, size_t n, bool flush) {
    if (!j->req->harmony)
        return n ? buf_add(&j->text, s, n) : 0;
    int rc = n ? harmony_push(&j->hp, s, n, harmony_take, j) : 0;
    return rc || !flush ? rc : harmony_flush(&j->hp, harmony_take, j);
}

// --- logprobs ----------------------------------------------------------------------

static void token_text(const struct tokenizer *tok, int32_t id, char *out, size_t cap) {
    const char *p = NULL;
    size_t n = 0;
    out[0] = '\0';
    if (tok && tokenizer_piece(tok, id, true, &p, &n, NULL) == 0) {
        if (n >= cap)
            n = cap - 1;
        // Cut a UTF-8 sequence the limit would split, so the JSON stays valid.
        while (n > 0 && !api_utf8_valid(p, n))
            n--;
        memcpy(out, p, n);
        out[n] = '\0';
    }
}

// The chosen token's log-probability and the top alternatives, from the row
// saved by on_logits.
static int record_logprob(struct srv_job *j, const struct tokenizer *tok, int32_t id) {
    if (!j->row)
        return 0;
    if (j->n_lp == j->cap_lp) {
        int cap = j->cap_lp ? 2 * j->cap_lp : 16;
        void *t = realloc(j->lp, (size_t)cap * sizeof *j->lp);
        if (!t)
            return -1;
        j->lp = t;
        j->cap_lp = cap;
    }
    const int V = j->req->n_vocab, k = j->req->api.top_logprobs;
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++)
        mx = j->row[v] > mx ? j->row[v] : mx;
    for (int v = 0; v < V; v++)
        sum += exp((double)j->row[v] - mx);
    const double lse = mx + log(sum);
    struct api_token_logprob *t = &j->lp[j->n_lp++];
    memset(t, 0, sizeof *t);
    token_text(tok, id, t->token, sizeof t->token);
    t->logprob = (float)(j->row[id] - lse);
    int idx[API_MAX_TOP_LOGPROBS];
    for (int v = 0; v < V && k > 0; v++) { // insertion into the k best so far
        int n = t->n_top;
        if (n == k && j->row[v] <= j->row[idx[n - 1]])
            continue;
        int p = n < k ? n++ : n - 1;
        while (p > 0 && j->row[idx[p - 1]] < j->row[v]) {
            idx[p] = idx[p - 1];
            p--;
        }
        idx[p] = v;
        t->n_top = n;
    }
    for (int i = 0; i < t->n_top; i++) {
        token_text(tok, idx[i], t->top[i].token, sizeof t->top[i].token);
        t->top[i].logprob = (float)(j->row[idx[i]] - lse);
    }
    return 0;
}

static int on_logits(void *user, uint64_t id, int32_t pos, const float *logits) {
    struct srv_job *j = user;
    if (!j->row && !(j->row = malloc((size_t)j->req->n_vocab * sizeof *j->row)))
        return 1;
    memcpy(j->row, logits, (size_t)j->req->n_vocab * sizeof *j->row);
    return 0;
}

// --- engine events (engine thread) -------------------------------------------------

static const char *finish_of(const char *why, bool stopping) {
    if (!strcmp(why, "n_predict") || !strcmp(why, "context full"))
        return "length";
    if (!strcmp(why, "error") || !strcmp(why, "grammar") || (stopping && !strcmp(why, "cancelled")))
        return "error";
    return "stop";
}

static void job_done(struct srv_worker *w, struct srv_job *j, const struct engine_req_event *ev) {
    struct srv_req *r = j->req;
    if (!j->finish)
        j->finish = finish_of(ev->text, w->ending);
    if (ev->stats)
        j->st = *ev->stats;
    // Nothing more comes: a held-back partial stop string is text after all.
    const char *show = NULL;
    size_t n_show = 0;
    stop_flush(j->stop, &show, &n_show);
    job_show(j, show, n_show, true);
    j->done = true;
    r->n_done++;
    const struct engine_req_stats *st = ev->stats;
    pthread_mutex_lock(&w->mu);
    // The client may read /metrics as soon as its answer is out, before the
    // step ends and update_gauges recounts: this job no longer runs.
    if (w->m.running > 0)
        w->m.running--;
    w->m.generated_tokens += (uint64_t)j->n_gen;
    w->m.prompt_tokens_evaluated += (uint64_t)j->st.n_prompt_eval;
    w->m.prompt_tokens_cached += (uint64_t)j->st.n_prompt_reused;
    w->m.draft_tokens += (uint64_t)j->st.n_drafted;
    w->m.draft_tokens_accepted += (uint64_t)j->st.n_accepted;
    if (j->index == 0)
        w->m.prompt_tokens += (uint64_t)r->n_tokens;
    if (st && st->ttft_ms >= 0 && j->n_gen > 0) {
        w->m.ttft_sum_ms += st->ttft_ms;
        w->m.ttft_count++;
        hist_add(w->m.ttft_hist, st->ttft_ms);
    }
    if (st && j->n_gen > 1) {
        w->m.itl_sum_ms += st->tpot_ms * (j->n_gen - 1);
        w->m.itl_count += (uint64_t)(j->n_gen - 1);
        hist_add(w->m.itl_hist, st->tpot_ms);
    }
    if (r->n_done == r->n_jobs) {
        bool ok = strcmp(j->finish, "error") != 0;
        if (r->cancel)
            w->m.requests_cancelled++;
        else if (ok)
            w->m.requests_ok++;
        else
            w->m.requests_failed++;
    }
    pthread_mutex_unlock(&w->mu);
}

static int on_event(void *user, const struct engine_req_event *ev) {
    struct srv_job *j = user;
    struct srv_req *r = j->req;
    struct srv_worker *w = r->w;
    int stop = 0;
    pthread_mutex_lock(&r->mu);
    if (ev->ev == ENGINE_EV_TOKEN) {
        if (ev->token >= 0) {
            j->n_gen++;
            if (r->api.logprobs && record_logprob(j, w->e->tok, ev->token))
                stop = 1;
        }
        // Shown text only: the matcher holds back what may begin a stop string.
        const char *show = NULL, *text = ev->text;
        size_t n_show = 0, len = ev->len;
        if (ev->token >= 0 && ev->token == r->marker) {
            text = r->marker_text;
            len = strlen(text);
        }
        if (!j->finish && len &&
            (stop_push(j->stop, text, len, &show, &n_show, NULL) ||
             job_show(j, show, n_show, false)))
            stop = 1;
        // A stop string, or the harmony answer's end (<|return|>, <|call|>)
        // where the vocabulary does not end generation there.
        if (!j->finish && (stop_hit(j->stop) >= 0 || (r->harmony && harmony_done(&j->hp)))) {
            j->finish = "stop";
            stop = 1;
        }
    } else if (ev->ev == ENGINE_EV_NOTE) {
        snprintf(j->note, sizeof j->note, "%.*s", (int)ev->len, ev->text);
    } else if (ev->ev == ENGINE_EV_DONE) {
        if (strcmp(ev->text, "grammar"))
            j->note[0] = '\0'; // a note that did not end it (self-extend's) is no error
        job_done(w, j, ev);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return stop;
}

// --- submission ------------------------------------------------------------------

// The engine request of job i of r.
static void job_request(struct srv_req *r, int i, struct engine_request *q) {
    const struct api_request *a = &r->api;
    engine_request_default(q);
    q->tokens = r->tokens;
    q->n_tokens = r->n_tokens;
    q->sp.temp = a->temperature;
    q->sp.top_p = a->top_p;
    q->sp.top_k = a->top_k;
    q->sp.min_p = a->min_p;
    q->sp.presence_penalty = a->presence_penalty;
    q->sp.frequency_penalty = a->frequency_penalty;
    q->sp.repeat_penalty = a->repeat_penalty;
    q->sp.repeat_last_n = a->repeat_last_n;
    q->sp.bias = r->bias;
    q->sp.n_bias = r->n_bias;
    q->sp.grammar = r->grammar; // the sampler takes a reference
    q->sp.grammar_vocab = r->gvocab;
    q->sp.seed = a->has_seed ? (uint32_t)((uint64_t)a->seed + (uint64_t)i) : SAMPLER_SEED_RANDOM;
    if (q->sp.seed == SAMPLER_SEED_RANDOM && a->has_seed)
        q->sp.seed = 0;
    // Without max_tokens: until a stop or the slot's context is full. A
    // request that gives n_keep asks for context shifts instead.
    q->n_predict = a->max_tokens >= 0 ? a->max_tokens : (a->has_n_keep ? -1 : -2);
    if (r->max_gen >= 0 && (q->n_predict < 0 || q->n_predict > r->max_gen))
        q->n_predict = r->max_gen; // exact self-extend: the extended context ends it
    q->ctx_shift = a->has_n_keep;
    q->n_keep = a->n_keep;
    q->ga_n = a->grp_attn_n;
    q->ga_w = a->grp_attn_w;
    q->se_g = a->se_n; // 0: the server's (the context's)
    q->se_w = a->se_w;
    q->ignore_eos = a->ignore_eos;
    // Prompt caching (llama-server's cache_prompt): the slot keeps this
    // request's cells for the next one, which decodes only what differs.
    q->keep_cells = a->cache_prompt;
    q->reuse_cells = a->cache_prompt;
    q->stop_tokens = r->stop_tokens;
    q->n_stop_tokens = r->n_stop_tokens;
    q->cb = on_event;
    q->on_logits = a->logprobs ? on_logits : NULL;
    q->user = &r->jobs[i];
    q->spec = a->spec;
    if (!api_request_speculates(a))
        q->spec.type = ENGINE_SPEC_NONE;
}

static void submit_error(struct srv_req *r, int rc, const struct verr *err) {
    if (rc == VERR_FULL)
        api_fail(&r->err, 503, "unavailable_error", "server_busy",
                 "the server is busy (every slot in use and the queue full): %s; try again later",
                 err->msg);
    else if (strstr(err->msg, "too long"))
        api_fail(&r->err, 400, "invalid_request_error", "context_length_exceeded",
                 "%s: the prompt does not fit in the context of a slot", err->msg);
    else if (rc == VERR_RANGE)
        api_fail(&r->err, 400, "invalid_request_error", "invalid_value", "%s", err->msg);
    else
        api_fail(&r->err, 500, "server_error", NULL, "%s", err->msg);
}

// Gives every job of r to the engine; on a refusal the jobs already given are
// cancelled and r->err says why. Returns whether r is running.
static bool submit_jobs(struct srv_worker *w, struct srv_req *r) {
    struct verr err = {0};
    int rc = 0, i;
    r->w = w;
    for (i = 0; i < r->n_jobs && !rc; i++) {
        struct engine_request q;
        job_request(r, i, &q);
        rc = engine_submit(w->e, &q, &r->jobs[i].eid, &err);
    }
    if (rc) {
        for (int k = 0; k < i - 1; k++)
            engine_cancel(w->e, r->jobs[k].eid, NULL);
        pthread_mutex_lock(&r->mu);
        submit_error(r, rc, &err);
    } else {
        pthread_mutex_lock(&r->mu);
    }
    r->submitted = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&w->mu);
    w->m.requests_total++;
    if (rc)
        w->m.requests_failed++;
    pthread_mutex_unlock(&w->mu);
    return rc == 0;
}

// --- the engine thread ---------------------------------------------------------------

struct active {
    struct srv_req **r;
    int n, cap;
};

static void cancel_jobs(struct srv_worker *w, struct srv_req *r) {
    for (int i = 0; i < r->n_jobs; i++) {
        pthread_mutex_lock(&r->mu);
        bool done = r->jobs[i].done;
        pthread_mutex_unlock(&r->mu);
        if (!done)
            engine_cancel(w->e, r->jobs[i].eid, NULL);
    }
}

// Takes the incoming requests (waiting while there is nothing to do).
static struct srv_req *take_incoming(struct srv_worker *w, bool idle, bool *stopping) {
    pthread_mutex_lock(&w->mu);
    while (idle && !w->incoming && !w->wake && !w->stopping)
        pthread_cond_wait(&w->cv, &w->mu);
    struct srv_req *in = w->incoming;
    w->incoming = NULL;
    w->wake = false;
    *stopping = w->stopping;
    pthread_mutex_unlock(&w->mu);
    return in;
}

static void update_gauges(struct srv_worker *w) {
    pthread_mutex_lock(&w->mu);
    w->m.running = engine_n_active(w->e);
    w->m.queued = engine_n_queued(w->e);
    w->m.kv_cells_used = context_cells_used(w->e->ctx);
    w->m.kv_cells_total = context_config(w->e->ctx)->n_ctx;
    // the slots as the engine thread, their owner, left them after this step
    struct engine_sched_config sc;
    engine_sched_config_get(w->e, &sc);
    w->m.n_slots = sc.n_slots < SRV_MAX_SLOTS ? sc.n_slots : SRV_MAX_SLOTS;
    for (int i = 0; i < w->m.n_slots; i++)
        w->m.slot_state[i] = engine_slot_state(w->e, i) == ENGINE_SLOT_FREE     ? 0
                             : engine_slot_state(w->e, i) == ENGINE_SLOT_PROMPT ? 1
                                                                                : 2;
    pthread_mutex_unlock(&w->mu);
}

static void *engine_main(void *arg) {
    struct srv_worker *w = arg;
    struct active act = {0};
    bool stopping = false;
    while (!stopping) {
        bool idle = engine_n_active(w->e) + engine_n_queued(w->e) == 0;
        struct srv_req *in = take_incoming(w, idle, &stopping);
        while (in) { // oldest first: the list was pushed at the head
            struct srv_req *prev = NULL, *r = in;
            while (r->next) {
                prev = r;
                r = r->next;
            }
            if (prev)
                prev->next = NULL;
            else
                in = NULL;
            if (act.n == act.cap) {
                act.cap = act.cap ? 2 * act.cap : 16;
                act.r = realloc(act.r, (size_t)act.cap * sizeof *act.r);
            }
            if (act.r && submit_jobs(w, r))
                act.r[act.n++] = r;
            else
                srv_req_release(r);
        }
        for (int k = 0; k < act.n; k++) {
            pthread_mutex_lock(&act.r[k]->mu);
            bool c = act.r[k]->cancel || stopping;
            w->ending = stopping; // their DONE events finish with "error"
            pthread_mutex_unlock(&act.r[k]->mu);
            if (c)
                cancel_jobs(w, act.r[k]);
        }
        if (engine_n_active(w->e) + engine_n_queued(w->e) > 0) {
            struct verr err = {0};
            if (engine_step(w->e, &err) < 0)
                srv_log(SRV_LOG_ERROR, "a step failed: %s", err.msg);
        }
        int kept = 0;
        for (int k = 0; k < act.n; k++) {
            pthread_mutex_lock(&act.r[k]->mu);
            bool all = act.r[k]->n_done == act.r[k]->n_jobs;
            pthread_mutex_unlock(&act.r[k]->mu);
            if (all)
                srv_req_release(act.r[k]);
            else
                act.r[kept++] = act.r[k];
        }
        act.n = kept;
        update_gauges(w);
    }
    free(act.r);
    return NULL;
}

int srv_worker_start(struct srv_worker *w, struct engine *e, int n_slots, int n_queue_max,
                     float slot_similarity, struct verr *err) {
    memset(w, 0, sizeof *w);
    w->e = e;
    w->n_queue_max = n_queue_max;
    w->m.t_start_ms = engine_now_ms();
    struct engine_sched_config sc = {
        .n_slots = n_slots, .n_queue_max = n_queue_max, .slot_similarity = slot_similarity};
    int rc = engine_sched_configure(e, &sc, err);
    if (rc)
        return rc;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->inited = true;
    if (pthread_create(&w->thread, NULL, engine_main, w))
        return verr_set(err, VERR_NOMEM, "cannot start the engine thread");
    w->started = true;
    return 0;
}

void srv_worker_stop(struct srv_worker *w) {
    if (!w->started)
        return;
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    // Requests handed over but never seen by the engine thread.
    for (struct srv_req *r = w->incoming, *nx; r; r = nx) {
        nx = r->next;
        pthread_mutex_lock(&r->mu);
        api_fail(&r->err, 503, "unavailable_error", "shutting_down", "the server is shutting down");
        r->submitted = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        srv_req_release(r);
    }
    w->incoming = NULL;
    w->started = false;
}

void srv_worker_free(struct srv_worker *w) {
    if (!w->inited)
        return;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    w->inited = false;
}

void srv_worker_submit(struct srv_worker *w, struct srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++; // the engine thread's
    r->t_submit_ms = engine_now_ms();
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(&r->mu);
        api_fail(&r->err, 503, "unavailable_error", "shutting_down", "the server is shutting down");
        r->submitted = true;
        r->refs--;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    r->next = w->incoming;
    w->incoming = r;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&r->mu);
    while (!r->submitted)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

void srv_worker_cancel(struct srv_worker *w, struct srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->cancel = true;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&w->mu);
    w->wake = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void srv_worker_metrics(struct srv_worker *w, struct srv_metrics *out) {
    pthread_mutex_lock(&w->mu);
    *out = w->m;
    pthread_mutex_unlock(&w->mu);
}
