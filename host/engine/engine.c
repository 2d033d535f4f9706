// The generation engine (see engine.h): llama-cli's main loop over the one
// forward pass, the sampler and the streaming detokenizer.
#include "host/engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "host/split/pipeline.h"
#include "kv/selfextend.h"

double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void engine_config_default(struct engine_config *c) {
    memset(c, 0, sizeof *c);
    load_config_default(&c->load);
    forward_config_default(&c->ctx);
    c->ctx.n_ctx = 0;
    c->ctx.n_seq_max = 0;
}

// The tokenizer of an open file, checked against the model's vocabulary.
static int open_tokenizer(struct engine *e, const struct gguf_file *f, const char *path, bool need,
                          struct verr *err) {
    if (gguf_find_key(f, "tokenizer.ggml.model") < 0) {
        if (!need)
            return 0;
        return verr_set(err, VERR_NOTFOUND,
                        "%s: the model has no tokenizer (no tokenizer.ggml.model key)", path);
    }
    int rc = tokenizer_load(&e->tok, f, err);
    if (rc)
        return verr_wrap(err, "%s: tokenizer", path);
    if (tokenizer_n_vocab(e->tok) > e->m->hp.n_vocab)
        return verr_set(err, VERR_FORMAT,
                        "%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                        tokenizer_n_vocab(e->tok), e->m->hp.n_vocab);
    return 0;
}

int engine_open(struct engine **out, const struct engine_config *c, struct verr *err) {
    *out = NULL;
    double t0 = engine_now_ms();
    const char *path = c->load.model_path;
    if (!path)
        return verr_set(err, VERR_RANGE, "no model given (-m FILE)");
    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    struct forward_config fcfg = c->ctx;
    fcfg.n_seq_max = fcfg.n_seq_max > 0 ? fcfg.n_seq_max : 1;
    fcfg.n_outputs_max = fcfg.n_outputs_max > 0 ? fcfg.n_outputs_max : fcfg.n_seq_max;
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        goto fail;
    // One backend, or a model split over several devices (e->m and e->be
    // are then stage 0's, see host/split/split.h).
    if ((rc = split_load(&e->sm, &c->load, &fcfg, f, c->progress, c->progress_user, err)))
        goto fail;
    e->m = e->sm.m;
    e->be = e->sm.be;
    if ((rc = open_tokenizer(e, f, path, c->need_tokenizer, err)))
        goto fail;
    forward_config_resolve(&fcfg, &e->m->hp);
    if ((rc = engine_reopen(e, &fcfg, err)))
        goto fail;
    gguf_close(f);
    e->t_load_ms = engine_now_ms() - t0;
    *out = e;
    return 0;
fail:
    gguf_close(f);
    engine_close(e);
    return rc;
}

int engine_reopen(struct engine *e, const struct forward_config *cfg, struct verr *err) {
    executor_destroy(e->x);
    e->x = NULL;
    e->fc = NULL;
    int rc = split_executor_create(&e->x, &e->sm, cfg, false, err);
    if (!rc)
        e->fc = e->x->fc;
    return rc;
}

void engine_close(struct engine *e) {
    if (!e)
        return;
    executor_destroy(e->x);
    tokenizer_free(e->tok);
    split_model_free(&e->sm);
    free(e);
}

void engine_gen_params_default(struct engine_gen_params *g) {
    memset(g, 0, sizeof *g);
    g->n_predict = -1;
    g->n_parallel = 1;
    g->ctx_shift = true;
    g->n_keep = 0;
    g->ga_n = 1;
    g->ga_w = 512;
    sampler_params_default(&g->sp);
}

static int emit(engine_event_fn cb, void *user, enum engine_event ev, int seq, int32_t tok,
                const char *text, size_t len) {
    return cb ? cb(user, ev, seq, tok, text, len) : 0;
}

// Routes kv_selfextend's log lines to the callback as notes of one sequence.
struct note_ctx {
    engine_event_fn cb;
    void *user;
    int seq;
};

static void note_line(void *user, const char *line) {
    struct note_ctx *n = user;
    emit(n->cb, n->user, ENGINE_EV_NOTE, n->seq, -1, line, strlen(line));
}

enum slot_state { SLOT_FREE, SLOT_PROMPT, SLOT_GEN };

// One sequence being decoded. Its sequence id in the cache is its slot index.
struct slot {
    enum slot_state state;
    int id; // index of its prompt
    const int32_t *prompt;
    int n_prompt;
    int n_consumed; // prompt tokens decoded (or shared)
    int32_t n_past; // position of the next token
    int n_cells;    // cells holding this sequence
    int n_keep;
    int n_gen;
    int32_t next; // the sampled token waiting to be decoded
    int out_row;  // index in this step's batch of the row it samples from; -1: none
    int32_t out_pos;
    int share_from; // slot whose prompt cells it will share; -1: none
    bool can_share; // no shift can ever move this sequence's prompt cells
    bool started_now;
    int32_t amax; // the token the backend picked from its row (argmax or sample op)
    float *last;  // [n_vocab] its row (sampling)
    struct sampler *smp;
    struct tokenizer_stream *stream;
    struct kv_selfextend se;
    struct note_ctx note;
};

struct gen_run {
    struct engine *e;
    const struct engine_gen_params *g;
    engine_event_fn cb;
    void *user;
    struct engine_stats *st;
    int n_ctx_seq;
    bool use_argmax;
    // Sampling on the backend (ops->sample) is possible: temp > 0, nobody
    // wants the logits. A step uses it when every active sequence's sampler
    // has no penalties and no sequence waits to share a prompt's row.
    bool dev_sample_ok;
    struct sample_params *rows; // [n_parallel] this step's sample rows, in batch order
    uint32_t base_seed;
    struct sampler_params sp;
    struct slot *slots; // [n_parallel]
    // the step batch: up to n_parallel * n_batch entries
    int cap;
    int32_t *tok, *pos, *seq;
    int8_t *want;
};

static bool same_prompt(const struct slot *a, const struct slot *b) {
    return a->n_prompt == b->n_prompt &&
           (a->prompt == b->prompt ||
            !memcmp(a->prompt, b->prompt, (size_t)a->n_prompt * sizeof *a->prompt));
}

static int slot_start(struct gen_run *r, int s, int id, const struct engine_prompt *p,
                      struct verr *err) {
    struct engine *e = r->e;
    const struct engine_gen_params *g = r->g;
    struct slot *sl = &r->slots[s];
    float *last = sl->last;
    memset(sl, 0, sizeof *sl);
    sl->last = last;
    sl->state = SLOT_PROMPT;
    sl->id = id;
    sl->prompt = p->tokens;
    sl->n_prompt = p->n_tokens;
    sl->out_row = -1;
    sl->share_from = -1;
    sl->next = -1;
    sl->started_now = true;
    // llama-cli's n_keep: -1 or more than the prompt keeps the prompt; else
    // the BOS token is kept on top of what was asked.
    sl->n_keep = g->n_keep;
    if (sl->n_keep < 0 || sl->n_keep > sl->n_prompt)
        sl->n_keep = sl->n_prompt;
    else if (e->tok && tokenizer_bos(e->tok) >= 0 && sl->prompt[0] == tokenizer_bos(e->tok))
        sl->n_keep += 1;
    // Shared cells would move for every sharer on a shift of one of them
    // (seq_add moves a cell for all its sequences), so only a sequence that
    // can never shift shares.
    sl->can_share =
        g->ga_n == 1 && (!g->ctx_shift || g->n_predict == -2 ||
                         (g->n_predict >= 0 && sl->n_prompt + g->n_predict < r->n_ctx_seq));
    struct sampler_params sps = r->sp;
    if (id > 0) {
        sps.seed = r->base_seed + (uint32_t)id;
        if (sps.seed == SAMPLER_SEED_RANDOM)
            sps.seed = 0;
    }
    int rc = sampler_create(&sl->smp, &sps, e->m->hp.n_vocab, err);
    if (rc)
        return rc;
    if (id == 0) {
        r->base_seed = sampler_seed(sl->smp);
        r->st->seed = r->base_seed;
    }
    for (int t = 0; t < sl->n_prompt; t++)
        sampler_accept(sl->smp, sl->prompt[t]);
    if (e->tok && (rc = tokenizer_stream_new(&sl->stream, e->tok, false, err)))
        return rc;
    sl->note = (struct note_ctx){r->cb, r->user, id};
    if (g->ga_n != 1) {
        if ((rc = kv_selfextend_init(&sl->se, &e->fc->kv, g->ga_n, g->ga_w, s, err)))
            return rc;
        sl->se.log = note_line;
        sl->se.log_user = &sl->note;
    }
    if (sl->can_share)
        for (int t = 0; t < s; t++) {
            const struct slot *o = &r->slots[t];
            if (o->state == SLOT_PROMPT && o->started_now && o->share_from < 0 && o->can_share &&
                same_prompt(o, sl)) {
                sl->share_from = t;
                break;
            }
        }
    return 0;
}

// Flushes the stream, frees the slot's cells and state, reports why it ended.
static int slot_finish(struct gen_run *r, int s, const char *why, struct verr *err) {
    struct slot *sl = &r->slots[s];
    const char *txt;
    size_t len = 0;
    if (sl->stream) {
        tokenizer_stream_flush(sl->stream, &txt, &len);
        if (len)
            emit(r->cb, r->user, ENGINE_EV_TOKEN, sl->id, -1, txt, len);
    }
    int rc = kv_seq_rm(&r->e->fc->kv, s, -1, -1, err);
    sampler_free(sl->smp);
    tokenizer_stream_free(sl->stream);
    sl->smp = NULL;
    sl->stream = NULL;
    sl->state = SLOT_FREE;
    r->st->n_seq++;
    if (rc)
        return rc;
    emit(r->cb, r->user, ENGINE_EV_DONE, sl->id, sl->next, why, strlen(why));
    return 0;
}

// Decodes entries [0, n) of the step batch in pieces of at most n_batch
// tokens; a piece that finds no contiguous run of free cells is retried in
// halves (llama.cpp's parallel example), down to single tokens, which always
// fit since every sequence stays within its share of the cells. Each output
// row is stored with the slot it belongs to.
//
// use_sample: the rows are sampled on the backend with r->rows (one per row
// that wants logits, drawn before the step); a retried piece passes the same
// rows again, so no draw is taken twice.
static int step_decode(struct gen_run *r, int n, bool use_sample, struct verr *err) {
    struct forward_ctx *fc = r->e->fc;
    const int V = r->e->m->hp.n_vocab, n_par = r->g->n_parallel;
    int piece = fc->cfg.n_batch;
    int o_base = 0; // output rows of the step before entry i
    for (int i = 0; i < n;) {
        int nb = n - i < piece ? n - i : piece;
        struct forward_batch b = {nb, r->tok + i, r->pos + i, r->seq + i, r->want + i};
        const enum forward_head head = use_sample      ? FORWARD_HEAD_SAMPLE
                                       : r->use_argmax ? FORWARD_HEAD_ARGMAX
                                                       : FORWARD_HEAD_LOGITS;
        int rc = executor_decode(r->e->x, &b, head, use_sample ? r->rows + o_base : NULL, err);
        if (rc == VERR_FULL && nb > 1) {
            piece = nb / 2;
            r->st->n_batch_splits++;
            continue;
        }
        if (rc)
            return rc;
        for (int o = 0; o < fc->n_out; o++) {
            int bi = i + fc->out_batch_idx[o];
            int s = r->seq[bi];
            if (s < 0 || s >= n_par || r->slots[s].out_row != bi)
                continue;
            if (r->use_argmax || use_sample)
                r->slots[s].amax = forward_argmax(fc, o);
            else
                memcpy(r->slots[s].last, forward_logits(fc, o), (size_t)V * sizeof(float));
        }
        o_base += fc->n_out;
        i += nb;
    }
    return 0;
}

// samples: the prompts are copies of one (engine_generate), which the
// messages then call "the prompt".
static int check_params(const struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                        bool samples, const struct engine_gen_params *g, int n_ctx_seq,
                        struct verr *err) {
    const struct forward_ctx *fc = e->fc;
    const int n_par = g->n_parallel, V = e->m->hp.n_vocab;
    if (n_prompts < 1)
        return verr_set(err, VERR_RANGE, "no prompt");
    if (n_par < 1 || n_par > fc->cfg.n_seq_max ||
        fc->cfg.n_outputs_max < (n_par < fc->cfg.n_batch ? n_par : fc->cfg.n_batch))
        return verr_set(err, VERR_RANGE,
                        "--parallel %d: the context was opened for %d sequences (%d logits rows)",
                        n_par, fc->cfg.n_seq_max, fc->cfg.n_outputs_max);
    if (n_ctx_seq < 5)
        return verr_set(err, VERR_RANGE,
                        "a context of %d cells leaves %d per sequence for --parallel %d; each "
                        "needs at least 5 (raise -c)",
                        fc->cfg.n_ctx, n_ctx_seq, n_par);
    if (g->n_predict < -2)
        return verr_set(err, VERR_RANGE,
                        "n_predict %d: -1 (until EOG) or -2 (until the context is "
                        "full) or >= 0",
                        g->n_predict);
    if (g->ga_n != 1) {
        struct kv_selfextend se;
        int rc = kv_selfextend_init(&se, &fc->kv, g->ga_n, g->ga_w, 0, err);
        if (rc)
            return rc;
    }
    for (int i = 0; i < n_prompts; i++) {
        const struct engine_prompt *p = &prompts[i];
        if (p->n_tokens < 1 || !p->tokens)
            return verr_set(err, VERR_RANGE, "prompt %d is empty", i);
        // llama-cli's limit: room for a few generated tokens after the prompt.
        if (p->n_tokens > n_ctx_seq - 4) {
            if (n_prompts == 1 || samples)
                return verr_set(err, VERR_RANGE, "prompt is too long (%d tokens, max %d)",
                                p->n_tokens, n_ctx_seq - 4);
            return verr_set(err, VERR_RANGE, "prompt %d is too long (%d tokens, max %d)", i,
                            p->n_tokens, n_ctx_seq - 4);
        }
        for (int t = 0; t < p->n_tokens; t++)
            if (p->tokens[t] < 0 || p->tokens[t] >= V)
                return samples || n_prompts == 1
                           ? verr_set(err, VERR_RANGE, "token id %d is out of range (n_vocab %d)",
                                      p->tokens[t], V)
                           : verr_set(err, VERR_RANGE,
                                      "prompt %d: token id %d is out of range (n_vocab %d)", i,
                                      p->tokens[t], V);
    }
    return 0;
}

// Before the step's entry for a generating slot: room for one more token in
// its share of the cells, by a context shift if allowed. Returns 1 when the
// slot must end with "context full".
static int make_room(struct gen_run *r, int s, struct verr *err) {
    const struct engine_gen_params *g = r->g;
    struct slot *sl = &r->slots[s];
    // Without self-extend, llama-cli's rule: n_past + 1 >= n_ctx. Self-extend
    // keeps positions low, so there the cells are what runs out.
    bool full = g->ga_n == 1 ? sl->n_past + 1 >= r->n_ctx_seq : sl->n_cells + 1 > r->n_ctx_seq;
    if (!full)
        return 0;
    if (g->ga_n != 1 || !g->ctx_shift || g->n_predict == -2)
        return 1;
    int32_t n_discard = 0;
    int rc = kv_context_shift(&r->e->fc->kv, s, sl->n_keep, sl->n_past, &n_discard, err);
    if (rc)
        return rc;
    if (n_discard <= 0)
        return 1;
    char line[160];
    snprintf(line, sizeof line, "context shift: n_past = %d, n_keep = %d, n_discard = %d",
             sl->n_past, sl->n_keep, n_discard);
    sl->n_past -= n_discard;
    sl->n_cells -= n_discard;
    r->st->n_ctx_shifts++;
    emit(r->cb, r->user, ENGINE_EV_SHIFT, sl->id, n_discard, line, strlen(line));
    return sl->n_past + 1 >= r->n_ctx_seq ? 1 : 0;
}

static int generate(struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                    bool samples, const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err) {
    memset(st, 0, sizeof *st);
    struct forward_ctx *fc = e->fc;
    const int n_batch = fc->cfg.n_batch, V = e->m->hp.n_vocab;
    const int n_par = g->n_parallel;
    const int n_ctx_seq = n_par >= 1 ? fc->cfg.n_ctx / n_par : 0;
    int rc = check_params(e, prompts, n_prompts, samples, g, n_ctx_seq, err);
    if (rc)
        return rc;

    struct gen_run r = {.e = e, .g = g, .cb = cb, .user = user, .st = st, .n_ctx_seq = n_ctx_seq};
    r.sp = g->sp;
    if (r.sp.repeat_last_n < 0)
        r.sp.repeat_last_n = n_ctx_seq;
    // Plain greedy needs only the argmax, computed on the backend: the logits
    // row (n_vocab floats per token) never has to come back to the host.
    r.use_argmax = !g->on_logits && r.sp.temp <= 0 &&
                   (r.sp.repeat_last_n == 0 ||
                    (r.sp.repeat_penalty == 1.0f && r.sp.frequency_penalty == 0.0f &&
                     r.sp.presence_penalty == 0.0f));
    r.dev_sample_ok = !g->on_logits && r.sp.temp > 0 && executor_can_sample(e->x);
    r.cap = n_par * n_batch;
    r.slots = calloc((size_t)n_par, sizeof *r.slots);
    r.rows = malloc((size_t)n_par * sizeof *r.rows);
    r.tok = malloc((size_t)r.cap * sizeof *r.tok);
    r.pos = malloc((size_t)r.cap * sizeof *r.pos);
    r.seq = malloc((size_t)r.cap * sizeof *r.seq);
    r.want = malloc((size_t)r.cap);
    bool oom = !r.slots || !r.rows || !r.tok || !r.pos || !r.seq || !r.want;
    for (int s = 0; s < n_par && !oom && !r.use_argmax; s++)
        oom = !(r.slots[s].last = malloc((size_t)V * sizeof(float)));
    if (oom) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    if ((rc = kv_clear(&fc->kv, err)))
        goto out;

    int next_prompt = 0, n_done = 0;
    bool stop = false;
    double t_start = engine_now_ms();
    while (n_done < n_prompts && !stop) {
        // --- free slots take the next prompts --------------------------------
        for (int s = 0; s < n_par; s++)
            r.slots[s].started_now = false;
        for (int s = 0; s < n_par && next_prompt < n_prompts; s++) {
            if (r.slots[s].state != SLOT_FREE)
                continue;
            if ((rc = slot_start(&r, s, next_prompt, &prompts[next_prompt], err)))
                goto out;
            next_prompt++;
        }

        // --- the step batch: a token per generating slot, a chunk per prompt --
        int n = 0, n_p = 0, n_g = 0;
        for (int s = 0; s < n_par; s++) {
            struct slot *sl = &r.slots[s];
            sl->out_row = -1;
            if (sl->state == SLOT_GEN) {
                if ((rc = make_room(&r, s, err)) < 0)
                    goto out;
                if (rc == 1) {
                    if ((rc = slot_finish(&r, s, "context full", err)))
                        goto out;
                    n_done++;
                    continue;
                }
            } else if (sl->state != SLOT_PROMPT || sl->share_from >= 0) {
                continue;
            }
            if (g->ga_n != 1 && (rc = kv_selfextend_apply(&sl->se, &fc->kv, &sl->n_past, err)))
                goto out;
            if (sl->state == SLOT_GEN) {
                r.tok[n] = sl->next;
                r.pos[n] = sl->n_past;
                r.seq[n] = s;
                r.want[n] = 1;
                sl->out_row = n;
                sl->out_pos = sl->n_past;
                n++, n_g++;
                sl->n_past++;
                sl->n_cells++;
            } else {
                int nb = sl->n_prompt - sl->n_consumed;
                if (nb > n_batch)
                    nb = n_batch;
                for (int t = 0; t < nb; t++) {
                    r.tok[n + t] = sl->prompt[sl->n_consumed + t];
                    r.pos[n + t] = sl->n_past + t;
                    r.seq[n + t] = s;
                    r.want[n + t] = 0;
                }
                sl->n_consumed += nb;
                sl->n_past += nb;
                sl->n_cells += nb;
                if (sl->n_consumed == sl->n_prompt) {
                    r.want[n + nb - 1] = 1;
                    sl->out_row = n + nb - 1;
                    sl->out_pos = sl->n_past - 1;
                }
                n += nb, n_p += nb;
            }
        }
        if (n == 0)
            continue; // every generating slot ended on a full context

        // Sampling on the backend: each row's draw is taken now, once, from
        // its sequence's sampler (the draw sampler_sample would take later).
        bool use_sample = r.dev_sample_ok;
        for (int s = 0; s < n_par && use_sample; s++) {
            const struct slot *sl = &r.slots[s];
            if (sl->state != SLOT_FREE && (sl->share_from >= 0 || !sampler_penalties_off(sl->smp)))
                use_sample = false;
        }
        if (use_sample)
            for (int bi = 0, o = 0; bi < n; bi++)
                if (r.want[bi])
                    sampler_next_params(r.slots[r.seq[bi]].smp, &r.rows[o++]);

        double t0 = engine_now_ms();
        if ((rc = step_decode(&r, n, use_sample, err)))
            goto out;
        double t_dec = engine_now_ms() - t0;
        st->t_prompt_ms += t_dec * n_p / n;
        st->t_gen_ms += t_dec * n_g / n;
        st->n_prompt += n_p;
        if (n_g)
            st->n_decode_gen++;

        // --- samples that share a prompt read just now take its cells ----------
        for (int s = 0; s < n_par; s++) {
            struct slot *sl = &r.slots[s];
            if (sl->state != SLOT_PROMPT || sl->share_from < 0)
                continue;
            const struct slot *src = &r.slots[sl->share_from];
            if (src->out_row < 0 || src->state != SLOT_PROMPT)
                continue; // its prompt is still being read
            if ((rc = kv_seq_cp(&fc->kv, sl->share_from, s, -1, -1, err)))
                goto out;
            sl->n_consumed = src->n_consumed;
            sl->n_past = src->n_past;
            sl->n_cells = src->n_cells;
            sl->out_row = src->out_row;
            sl->out_pos = src->out_pos;
            sl->amax = src->amax;
            if (!r.use_argmax)
                memcpy(sl->last, src->last, (size_t)V * sizeof(float));
            sl->share_from = -1;
        }

        // --- sample ----------------------------------------------------------------
        double ts = engine_now_ms();
        for (int s = 0; s < n_par && !stop; s++) {
            struct slot *sl = &r.slots[s];
            if (sl->out_row < 0 || sl->state == SLOT_FREE)
                continue;
            sl->state = SLOT_GEN;
            if (g->n_predict == 0) { // the prompt is read, nothing is sampled
                if ((rc = slot_finish(&r, s, "n_predict", err)))
                    goto out;
                n_done++;
                continue;
            }
            if (g->on_logits && g->on_logits(g->logits_user, sl->id, sl->out_pos, sl->last))
                stop = true;
            const bool picked = r.use_argmax || use_sample;
            int32_t tok = picked ? sl->amax : sampler_sample(sl->smp, sl->last);
            st->n_gen_backend += picked;
            sampler_accept(sl->smp, tok);
            sl->n_gen++;
            st->n_gen++;
            sl->next = tok;
            const char *txt = "";
            size_t len = 0;
            if (sl->stream && tok < tokenizer_n_vocab(e->tok) &&
                (rc = tokenizer_stream_push(sl->stream, tok, &txt, &len, err)))
                goto out;
            if (emit(cb, user, ENGINE_EV_TOKEN, sl->id, tok, txt, len))
                stop = true;
            const char *why = NULL;
            if (!g->ignore_eos && e->tok && tokenizer_is_eog(e->tok, tok))
                why = "eog";
            else if (g->n_predict >= 0 && sl->n_gen >= g->n_predict)
                why = "n_predict";
            if (why) {
                if ((rc = slot_finish(&r, s, why, err)))
                    goto out;
                n_done++;
            }
        }
        st->t_gen_ms += engine_now_ms() - ts;
    }
    // A stop requested by a callback still flushes and ends every sequence.
    for (int s = 0; s < n_par; s++)
        if (r.slots[s].state != SLOT_FREE && (rc = slot_finish(&r, s, "stopped", err)))
            goto out;
    st->t_total_ms = engine_now_ms() - t_start;
    rc = 0;
out:
    for (int s = 0; r.slots && s < n_par; s++) {
        sampler_free(r.slots[s].smp);
        tokenizer_stream_free(r.slots[s].stream);
        free(r.slots[s].last);
    }
    free(r.slots);
    free(r.rows);
    free(r.tok);
    free(r.pos);
    free(r.seq);
    free(r.want);
    return rc;
}

int engine_generate_batch(struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                          const struct engine_gen_params *g, engine_event_fn cb, void *user,
                          struct engine_stats *st, struct verr *err) {
    return generate(e, prompts, n_prompts, false, g, cb, user, st, err);
}

int engine_generate(struct engine *e, const int32_t *prompt, int n_prompt,
                    const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err) {
    int n = g->n_parallel > 0 ? g->n_parallel : 1;
    if (n > KV_SEQ_MAX_LIMIT) {
        memset(st, 0, sizeof *st);
        return verr_set(err, VERR_RANGE, "--parallel %d is more than %d", n, KV_SEQ_MAX_LIMIT);
    }
    struct engine_prompt *ps = malloc((size_t)n * sizeof *ps);
    if (!ps) {
        memset(st, 0, sizeof *st);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    for (int i = 0; i < n; i++)
        ps[i] = (struct engine_prompt){prompt, n_prompt};
    int rc = generate(e, ps, n, true, g, cb, user, st, err);
    free(ps);
    return rc;
}

int engine_eval_ex(struct engine *e, const int32_t *tokens, int n_tokens,
                   const struct engine_eval_params *p, engine_rows_fn rows, void *user,
                   double *t_ms, struct verr *err) {
    struct forward_ctx *fc = e->fc;
    const int n_ctx = fc->cfg.n_ctx, n_batch = fc->cfg.n_batch;
    const int ga_n = p ? p->ga_n : 1, ga_w = p ? p->ga_w : 512;
    if (n_tokens < 1)
        return verr_set(err, VERR_RANGE, "no tokens to evaluate");
    // Every token takes a cell, self-extend or not.
    if (n_tokens > n_ctx)
        return verr_set(err, VERR_RANGE, "%d tokens do not fit in the context of %d (-c)", n_tokens,
                        n_ctx);
    if (fc->cfg.n_outputs_max < n_batch)
        return verr_set(err, VERR_RANGE,
                        "engine_eval: the context keeps logits of %d rows, "
                        "the batch is %d",
                        fc->cfg.n_outputs_max, n_batch);
    for (int t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= e->m->hp.n_vocab)
            return verr_set(err, VERR_RANGE, "token id %d is out of range (n_vocab %d)", tokens[t],
                            e->m->hp.n_vocab);
    struct kv_selfextend se;
    struct note_ctx note = {p ? p->cb : NULL, p ? p->user : NULL, 0};
    int rc;
    if (ga_n != 1) {
        if ((rc = kv_selfextend_init(&se, &fc->kv, ga_n, ga_w, 0, err)))
            return rc;
        se.log = note_line;
        se.log_user = &note;
    }
    if ((rc = kv_clear(&fc->kv, err)))
        return rc;
    int32_t *pos = malloc((size_t)n_batch * sizeof *pos),
            *seq = calloc((size_t)n_batch, sizeof *seq);
    int8_t *want = malloc((size_t)n_batch);
    if (!pos || !seq || !want) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    memset(want, 1, (size_t)n_batch);
    double t0 = engine_now_ms(), spent_in_rows = 0;
    int32_t n_past = 0;
    for (int i = 0; i < n_tokens; i += n_batch) {
        int nb = n_tokens - i < n_batch ? n_tokens - i : n_batch;
        if (ga_n != 1 && (rc = kv_selfextend_apply(&se, &fc->kv, &n_past, err)))
            goto out;
        for (int t = 0; t < nb; t++)
            pos[t] = n_past + t;
        struct forward_batch b = {nb, tokens + i, pos, seq, want};
        if ((rc = executor_decode(e->x, &b, FORWARD_HEAD_LOGITS, NULL, err)))
            goto out;
        n_past += nb;
        double tr = engine_now_ms();
        if (rows && (rc = rows(user, i, nb, fc->h_logits))) {
            if (rc > 0)
                rc = verr_set(err, VERR_IO, "writing logits failed");
            goto out;
        }
        spent_in_rows += engine_now_ms() - tr;
    }
    if (t_ms)
        *t_ms = engine_now_ms() - t0 - spent_in_rows;
    rc = 0;
out:
    free(pos);
    free(seq);
    free(want);
    return rc;
}

int engine_eval(struct engine *e, const int32_t *tokens, int n_tokens, engine_rows_fn rows,
                void *user, double *t_ms, struct verr *err) {
    return engine_eval_ex(e, tokens, n_tokens, NULL, rows, user, t_ms, err);
}

void engine_describe(const struct engine *e, char *buf, size_t cap) {
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    const struct forward_ctx *fc = e->fc;
    const struct rope_params *rp = &fc->rope;
    snprintf(buf, cap,
             "model: %s (%s), %.2f M parameters, %.2f MiB of weights (%s), output %s\n"
             "hparams: n_embd %d, n_layer %d, n_head %d, n_head_kv %d, head_dim %d/%d, n_ff %d, "
             "n_vocab %d, n_ctx_train %d, rms_eps %g\n"
             "rope: %s, n_rot %d, freq_base %g, freq_scale %g, scaling %s, ext_factor %g, "
             "attn_factor %g, beta_fast %g, beta_slow %g, n_ctx_orig %d%s\n"
             "context: backend %s, n_ctx %d, n_batch %d, n_seq_max %d, cache %s/%s, "
             "KV %.2f MiB\n"
             "tokenizer: %s",
             m->name, model_arch_name(hp->arch), (double)m->n_params / 1e6,
             (double)m->n_bytes / (1024.0 * 1024.0), ggml_type_name(m->weight_type),
             m->output_tied ? "tied to token_embd" : "separate", hp->n_embd, hp->n_layer,
             hp->n_head, hp->n_head_kv, hp->head_dim, hp->head_dim_v, hp->n_ff, hp->n_vocab,
             hp->n_ctx_train, hp->norm_eps, rp->mode == ROPE_MODE_NEOX ? "neox" : "normal",
             rp->n_rot, rp->freq_base, rp->freq_scale, rope_scaling_name(hp->rope_scaling),
             rp->ext_factor, rp->attn_factor, rp->beta_fast, rp->beta_slow, rp->n_ctx_orig,
             rp->freq_factors ? ", rope_freqs.weight" : "", e->be->ops->name, fc->cfg.n_ctx,
             fc->cfg.n_batch, fc->cfg.n_seq_max, ggml_type_name(fc->cfg.type_k),
             ggml_type_name(fc->cfg.type_v),
             (double)(fc->kv.k_row_bytes + fc->kv.v_row_bytes) * fc->cfg.n_ctx * hp->n_layer /
                 (1024.0 * 1024.0),
             e->tok ? (tokenizer_get_type(e->tok) == TOKENIZER_SPM ? "spm (llama)" : "bpe (gpt2)")
                    : "none");
    const char *plan = executor_describe(e->x); // NULL with one stage
    if (plan) {
        size_t n = strlen(buf);
        if (n < cap)
            snprintf(buf + n, cap - n, "\nsplit:\n%s", plan);
    }
}
