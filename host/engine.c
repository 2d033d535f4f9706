// The generation engine (see engine.h): llama-cli's main loop over the one
// forward pass, the sampler and the streaming detokenizer.
#include "host/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "kv/selfextend.h"

double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int engine_open(struct engine **out, const struct args_model *a, const struct engine_open_params *p,
                struct verr *err) {
    *out = NULL;
    double t0 = engine_now_ms();
    if (!a->model_path)
        return verr_set(err, VERR_RANGE, "no model given (-m FILE)");
    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, a->model_path, err);
    if (rc)
        goto fail;
    if ((rc = args_backend_create(a, &e->be, err)))
        goto fail;
    if ((rc = model_load(&e->m, f, e->be, err)))
        goto fail;
    if (gguf_find_key(f, "tokenizer.ggml.model") >= 0) {
        if ((rc = tokenizer_load(&e->tok, f, err))) {
            verr_wrap(err, "%s: tokenizer", a->model_path);
            goto fail;
        }
        if (tokenizer_n_vocab(e->tok) > e->m->hp.n_vocab) {
            rc = verr_set(err, VERR_FORMAT,
                          "%s: the tokenizer has %d tokens but token_embd.weight only %d rows",
                          a->model_path, tokenizer_n_vocab(e->tok), e->m->hp.n_vocab);
            goto fail;
        }
    } else if (p->need_tokenizer) {
        rc =
            verr_set(err, VERR_NOTFOUND,
                     "%s: the model has no tokenizer (no tokenizer.ggml.model key)", a->model_path);
        goto fail;
    }
    struct forward_config fcfg;
    args_forward_config(a, &e->m->hp, &fcfg);
    if (p->n_ctx > 0) {
        fcfg.n_ctx = p->n_ctx;
        fcfg.n_batch = a->n_batch < fcfg.n_ctx ? a->n_batch : fcfg.n_ctx;
    }
    fcfg.n_seq_max = p->n_seq_max > 0 ? p->n_seq_max : 1;
    fcfg.n_outputs_max = p->n_outputs_max > 0 ? p->n_outputs_max : fcfg.n_seq_max;
    if ((rc = forward_init(&e->fc, e->m, &fcfg, err)))
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

void engine_close(struct engine *e) {
    if (!e)
        return;
    forward_free(&e->fc);
    tokenizer_free(e->tok);
    model_free(e->m);
    backend_destroy(e->be);
    free(e);
}

void engine_gen_params_default(struct engine_gen_params *g) {
    memset(g, 0, sizeof *g);
    g->n_predict = -1;
    g->n_parallel = 1;
    g->ctx_shift = false;
    g->n_keep = 0;
    g->ga_n = 1;
    g->ga_w = 512;
    sampler_params_default(&g->sp);
}

struct note_ctx {
    engine_event_fn cb;
    void *user;
};

static void note_line(void *user, const char *line) {
    struct note_ctx *n = user;
    if (n->cb)
        n->cb(n->user, ENGINE_EV_NOTE, 0, -1, line, strlen(line));
}

static int emit(engine_event_fn cb, void *user, enum engine_event ev, int seq, int32_t tok,
                const char *text, size_t len) {
    return cb ? cb(user, ev, seq, tok, text, len) : 0;
}

int engine_generate(struct engine *e, const int32_t *prompt, int n_prompt,
                    const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err) {
    memset(st, 0, sizeof *st);
    struct forward_ctx *fc = &e->fc;
    const int n_ctx = fc->cfg.n_ctx, n_batch = fc->cfg.n_batch, V = e->m->hp.n_vocab;
    const int n_par = g->n_parallel;
    if (n_prompt < 1)
        return verr_set(err, VERR_RANGE, "empty prompt");
    if (n_prompt > n_ctx - 4)
        return verr_set(err, VERR_RANGE, "prompt is too long (%d tokens, max %d)", n_prompt,
                        n_ctx - 4);
    if (n_par < 1 || n_par > fc->cfg.n_seq_max || n_par > fc->cfg.n_outputs_max)
        return verr_set(err, VERR_RANGE, "--parallel %d: the context was opened for %d", n_par,
                        fc->cfg.n_seq_max);
    if (g->ga_n != 1 && n_par > 1)
        return verr_set(err, VERR_UNSUPPORTED,
                        "self-extend (--grp-attn-n) works on one sequence, not with --parallel");
    if (g->ga_n != 1 && g->ctx_shift)
        return verr_set(err, VERR_UNSUPPORTED,
                        "self-extend (--grp-attn-n) and --context-shift exclude each other");
    if (g->ctx_shift && n_par > 1)
        return verr_set(err, VERR_UNSUPPORTED, "--context-shift works on one sequence only");

    int rc = kv_clear(&fc->kv, err);
    if (rc)
        return rc;
    struct kv_selfextend se;
    struct note_ctx nctx = {cb, user};
    if (g->ga_n != 1) {
        if ((rc = kv_selfextend_init(&se, &fc->kv, g->ga_n, g->ga_w, 0, err)))
            return rc;
        se.log = note_line;
        se.log_user = &nctx;
    }

    // llama-cli's n_keep: -1 or more than the prompt keeps the prompt; the BOS
    // token is always kept on top of what was asked.
    int n_keep = g->n_keep;
    if (n_keep < 0 || n_keep > n_prompt)
        n_keep = n_prompt;
    else if (e->tok && tokenizer_bos(e->tok) >= 0 && prompt[0] == tokenizer_bos(e->tok))
        n_keep += 1;

    struct sampler **smp = calloc((size_t)n_par, sizeof *smp);
    struct tokenizer_stream **streams = calloc((size_t)n_par, sizeof *streams);
    float *last = malloc((size_t)n_par * (size_t)V * sizeof *last); // [n_par][V]
    int32_t *next = malloc((size_t)n_par * sizeof *next);
    int32_t *amax = malloc((size_t)n_par * sizeof *amax);
    int32_t *bt = malloc((size_t)n_par * sizeof *bt), *bp = malloc((size_t)n_par * sizeof *bp),
            *bs = malloc((size_t)n_par * sizeof *bs);
    int8_t *bl = malloc((size_t)n_par);
    bool *live = calloc((size_t)n_par, sizeof *live);
    int *n_gen = calloc((size_t)n_par, sizeof *n_gen);
    int32_t *ptok = malloc((size_t)n_batch * sizeof *ptok),
            *ppos = malloc((size_t)n_batch * sizeof *ppos),
            *pseq = calloc((size_t)n_batch, sizeof *pseq);
    int8_t *plog = calloc((size_t)n_batch, 1);
    if (!smp || !streams || !last || !next || !amax || !bt || !bp || !bs || !bl || !live ||
        !n_gen || !ptok || !ppos || !pseq || !plog) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }

    struct sampler_params sp = g->sp;
    if (sp.repeat_last_n < 0)
        sp.repeat_last_n = n_ctx;
    // Plain greedy needs only the argmax, computed on the backend: the logits
    // row (n_vocab floats per token) never has to come back to the host.
    const bool use_argmax =
        sp.temp <= 0 &&
        (sp.repeat_last_n == 0 || (sp.repeat_penalty == 1.0f && sp.frequency_penalty == 0.0f &&
                                   sp.presence_penalty == 0.0f));
    // Sequence s samples with seed + s; a random seed is drawn once, by sequence 0.
    uint32_t base_seed = sp.seed;
    for (int s = 0; s < n_par; s++) {
        struct sampler_params sps = sp;
        if (s > 0) {
            sps.seed = base_seed + (uint32_t)s;
            if (sps.seed == SAMPLER_SEED_RANDOM)
                sps.seed = 0;
        }
        if ((rc = sampler_create(&smp[s], &sps, V, err)))
            goto out;
        if (s == 0)
            base_seed = sampler_seed(smp[0]);
        for (int t = 0; t < n_prompt; t++)
            sampler_accept(smp[s], prompt[t]);
        if (e->tok && (rc = tokenizer_stream_new(&streams[s], e->tok, false, err)))
            goto out;
    }
    st->seed = sampler_seed(smp[0]);

    // --- prompt, in chunks of n_batch ----------------------------------------
    int32_t n_past = 0;
    double t0 = engine_now_ms();
    for (int i = 0; i < n_prompt; i += n_batch) {
        int nb = n_prompt - i < n_batch ? n_prompt - i : n_batch;
        if (g->ga_n != 1 && (rc = kv_selfextend_apply(&se, &fc->kv, &n_past, err)))
            goto out;
        for (int t = 0; t < nb; t++) {
            ptok[t] = prompt[i + t];
            ppos[t] = n_past + t;
            pseq[t] = 0;
            plog[t] = i + t == n_prompt - 1;
        }
        struct forward_batch b = {nb, ptok, ppos, pseq, plog};
        bool last_chunk = i + nb == n_prompt;
        if ((rc = use_argmax && last_chunk ? forward_decode_argmax(fc, &b, err)
                                           : forward_decode(fc, &b, err)))
            goto out;
        n_past += nb;
    }
    st->n_prompt = n_prompt;
    st->t_prompt_ms = engine_now_ms() - t0;
    for (int s = 0; s < n_par; s++) {
        if (use_argmax)
            amax[s] = forward_argmax(fc, 0);
        else
            memcpy(last + (size_t)s * V, forward_logits(fc, 0), (size_t)V * sizeof *last);
        live[s] = g->n_predict != 0;
        if (s > 0 && (rc = kv_seq_cp(&fc->kv, 0, s, -1, -1, err)))
            goto out;
    }

    // --- generation ------------------------------------------------------------
    double tg = engine_now_ms();
    bool stop = false;
    while (!stop) {
        int n_live = 0;
        for (int s = 0; s < n_par; s++) {
            if (!live[s])
                continue;
            int32_t tok = use_argmax ? amax[s] : sampler_sample(smp[s], last + (size_t)s * V);
            sampler_accept(smp[s], tok);
            n_gen[s]++;
            st->n_gen++;
            const char *txt = "";
            size_t len = 0;
            if (streams[s] && tok < tokenizer_n_vocab(e->tok) &&
                (rc = tokenizer_stream_push(streams[s], tok, &txt, &len, err)))
                goto out;
            if (emit(cb, user, ENGINE_EV_TOKEN, s, tok, txt, len))
                stop = true;
            const char *why = NULL;
            if (e->tok && tokenizer_is_eog(e->tok, tok))
                why = "eog";
            else if (g->n_predict >= 0 && n_gen[s] >= g->n_predict)
                why = "n_predict";
            if (why) {
                live[s] = false;
                if (streams[s]) {
                    tokenizer_stream_flush(streams[s], &txt, &len);
                    if (len)
                        emit(cb, user, ENGINE_EV_TOKEN, s, -1, txt, len);
                }
                emit(cb, user, ENGINE_EV_DONE, s, tok, why, strlen(why));
                continue;
            }
            next[s] = tok;
            n_live++;
        }
        if (stop || n_live == 0)
            break;

        // Room for one more token per live sequence. A single sequence without
        // self-extend follows llama-cli: shift (or stop) once n_past + 1 reaches n_ctx.
        bool full =
            fc->kv.used + n_live > n_ctx || (g->ga_n == 1 && n_par == 1 && n_past + 1 >= n_ctx);
        if (full && g->ctx_shift) {
            int32_t n_discard = 0;
            if ((rc = kv_context_shift(&fc->kv, 0, n_keep, n_past, &n_discard, err)))
                goto out;
            if (n_discard > 0) {
                char line[160];
                snprintf(line, sizeof line,
                         "context shift: n_past = %d, n_keep = %d, n_discard = %d", n_past, n_keep,
                         n_discard);
                note_line(&nctx, line);
                n_past -= n_discard;
                st->n_ctx_shifts++;
                full = fc->kv.used + n_live > n_ctx;
            }
        }
        if (full) {
            for (int s = 0; s < n_par; s++) {
                if (!live[s])
                    continue;
                live[s] = false;
                const char *txt;
                size_t len = 0;
                if (streams[s]) {
                    tokenizer_stream_flush(streams[s], &txt, &len);
                    if (len)
                        emit(cb, user, ENGINE_EV_TOKEN, s, -1, txt, len);
                }
                emit(cb, user, ENGINE_EV_DONE, s, next[s], "context full", 12);
            }
            break;
        }
        if (g->ga_n != 1 && (rc = kv_selfextend_apply(&se, &fc->kv, &n_past, err)))
            goto out;
        int nb = 0;
        for (int s = 0; s < n_par; s++) {
            if (!live[s])
                continue;
            bt[nb] = next[s];
            bp[nb] = n_past;
            bs[nb] = s;
            bl[nb] = 1;
            nb++;
        }
        struct forward_batch b = {nb, bt, bp, bs, bl};
        if ((rc = use_argmax ? forward_decode_argmax(fc, &b, err) : forward_decode(fc, &b, err)))
            goto out;
        st->n_decode_gen++;
        for (int r = 0; r < fc->n_out; r++) {
            int s = bs[fc->out_batch_idx[r]];
            if (use_argmax)
                amax[s] = forward_argmax(fc, r);
            else
                memcpy(last + (size_t)s * V, forward_logits(fc, r), (size_t)V * sizeof *last);
        }
        n_past++;
    }
    // A stop requested by the callback still flushes what the streams hold.
    for (int s = 0; s < n_par; s++) {
        if (live[s] && streams[s]) {
            const char *txt;
            size_t len = 0;
            tokenizer_stream_flush(streams[s], &txt, &len);
            if (len)
                emit(cb, user, ENGINE_EV_TOKEN, s, -1, txt, len);
        }
    }
    st->t_gen_ms = engine_now_ms() - tg;
    rc = 0;
out:
    for (int s = 0; s < n_par && smp; s++)
        sampler_free(smp[s]);
    for (int s = 0; s < n_par && streams; s++)
        tokenizer_stream_free(streams[s]);
    free(smp);
    free(streams);
    free(last);
    free(next);
    free(amax);
    free(bt);
    free(bp);
    free(bs);
    free(bl);
    free(live);
    free(n_gen);
    free(ptok);
    free(ppos);
    free(pseq);
    free(plog);
    return rc;
}

int engine_eval(struct engine *e, const int32_t *tokens, int n_tokens, engine_rows_fn rows,
                void *user, double *t_ms, struct verr *err) {
    struct forward_ctx *fc = &e->fc;
    const int n_ctx = fc->cfg.n_ctx, n_batch = fc->cfg.n_batch;
    if (n_tokens < 1)
        return verr_set(err, VERR_RANGE, "no tokens to evaluate");
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
    int rc = kv_clear(&fc->kv, err);
    if (rc)
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
    for (int i = 0; i < n_tokens; i += n_batch) {
        int nb = n_tokens - i < n_batch ? n_tokens - i : n_batch;
        for (int t = 0; t < nb; t++)
            pos[t] = i + t;
        struct forward_batch b = {nb, tokens + i, pos, seq, want};
        if ((rc = forward_decode(fc, &b, err)))
            goto out;
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

void engine_describe(const struct engine *e, char *buf, size_t cap) {
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    const struct forward_ctx *fc = &e->fc;
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
}
