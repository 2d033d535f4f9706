// The forward pass over the backend op table (see forward.h).
#include "host/forward/forward.h"
#include "host/ops/selfextend.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

void rope_overrides_default(struct rope_overrides *o) {
    o->scaling = ROPE_SCALING_UNSPECIFIED;
    o->freq_base = 0.0f;
    o->freq_scale = 0.0f;
    o->yarn_orig_ctx = 0;
    o->yarn_ext_factor = -1.0f;
    o->yarn_attn_factor = 1.0f;
    o->yarn_beta_fast = 32.0f;
    o->yarn_beta_slow = 1.0f;
}

void forward_rope_resolve(const struct model *m, const struct rope_overrides *o,
                          struct rope_params *rp) {
    const struct model_hparams *hp = &m->hp;
    memset(rp, 0, sizeof *rp);
    rp->mode = hp->rope_mode;
    rp->n_rot = hp->n_rot;
    rp->n_ctx_orig = o->yarn_orig_ctx != 0 ? o->yarn_orig_ctx : hp->n_ctx_orig_yarn;
    rp->freq_base = o->freq_base != 0.0f ? o->freq_base : hp->rope_freq_base;
    rp->freq_scale = o->freq_scale != 0.0f ? o->freq_scale : hp->rope_freq_scale;
    int scaling = o->scaling != ROPE_SCALING_UNSPECIFIED ? o->scaling : (int)hp->rope_scaling;
    if (scaling == ROPE_SCALING_NONE)
        rp->freq_scale = 1.0f; // llama.cpp: never scale when the type is none
    rp->ext_factor = o->yarn_ext_factor >= 0.0f ? o->yarn_ext_factor
                                                : (scaling == ROPE_SCALING_YARN ? 1.0f : 0.0f);
    rp->attn_factor = o->yarn_attn_factor * hp->rope_attn_factor;
    rp->beta_fast = o->yarn_beta_fast;
    rp->beta_slow = o->yarn_beta_slow;
    rp->freq_factors = m->rope_freqs;
}

void forward_config_default(struct forward_config *c) {
    memset(c, 0, sizeof *c);
    c->n_ctx = 4096;
    c->n_batch = 512;
    c->n_outputs_max = 0;
    c->n_seq_max = 1;
    c->type_k = GGML_TYPE_F16;
    c->type_v = GGML_TYPE_F16;
    rope_overrides_default(&c->rope);
}

int forward_selfextend_ctx(const struct model_hparams *hp, int se_g, int se_w, int *n_ctx_out,
                           struct verr *err) {
    if (se_g < 1 || se_w < 1)
        return verr_set(err, VERR_RANGE,
                        "self-extend: group size G = %d and window W = %d must be >= 1", se_g,
                        se_w);
    if (se_g == 1) {
        *n_ctx_out = hp->n_ctx_train;
        return 0;
    }
    const int64_t n = se_extended_ctx(hp->n_ctx_train, se_g, se_w);
    if (n <= 0)
        return verr_set(err, VERR_RANGE,
                        "self-extend: window W = %d must be below the trained context %d (and "
                        "(n_ctx_train - W) * G + W must fit an int)",
                        se_w, hp->n_ctx_train);
    *n_ctx_out = (int)n;
    return 0;
}

void forward_config_resolve(struct forward_config *c, const struct model_hparams *hp) {
    int se_ctx = 0;
    if (c->n_ctx <= 0 && c->se_g > 1 &&
        !forward_selfextend_ctx(hp, c->se_g, c->se_w, &se_ctx, NULL))
        c->n_ctx = se_ctx; // the cache is sized for the extended context
    if (c->n_ctx <= 0)
        c->n_ctx = hp->n_ctx_train < FORWARD_CTX_CAP ? hp->n_ctx_train : FORWARD_CTX_CAP;
    if (c->n_batch > c->n_ctx)
        c->n_batch = c->n_ctx;
}

static int scratch_alloc(struct forward_ctx *fc, size_t bytes, void **out, const char *what,
                         struct verr *err) {
    struct backend *be = fc->be;
    int rc = be->ops->alloc(be, bytes ? bytes : 1, out);
    if (rc)
        return verr_set(err, rc, "forward: allocating %s (%zu bytes): %s", what, bytes,
                        be->err.msg);
    return 0;
}

// stage_layers runs every struct arch_block feature (host/model/arch.h); a
// table asking for one it does not know (a new field, an unknown
// activation) is refused here, not miscomputed.
// A model with experts needs the backend's moe ops (their experts are
// SwiGLU: host/model/arch.h, struct arch_moe).
static int check_block(const struct model_hparams *hp, const struct backend *be, struct verr *err) {
    const struct arch *a = arch_get(hp->arch);
    const struct arch_block *b = &a->block;
    if (b->ffn != ARCH_FFN_SWIGLU && b->ffn != ARCH_FFN_GEGLU)
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: the %s block's feed-forward activation %d is not implemented",
                        a->name, (int)b->ffn);
    if (hp->n_expert > 0 && b->ffn != ARCH_FFN_SWIGLU)
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: %s: experts with a feed-forward other than SwiGLU", a->name);
    if (hp->n_expert > 0 && ((unsigned)a->moe.gating > MOE_GATING_SOFTMAX_WEIGHT ||
                             (unsigned)a->moe.act > MOE_ACT_SWIGLU_OAI))
        return verr_set(err, VERR_UNSUPPORTED, "forward: %s: expert gating %d, activation %d",
                        a->name, (int)a->moe.gating, (int)a->moe.act);
    if (hp->n_expert > 0 && (!be->ops->moe_route || !be->ops->moe_ffn))
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: %s has %d experts per block, and the %s backend has no "
                        "mixture-of-experts ops (moe_route, moe_ffn)",
                        a->name, hp->n_expert, be->ops->name);
    if (hp->n_expert > 0 && a->moe.shexp && !be->ops->add_sigmoid_scaled)
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: %s has a gated shared expert, and the %s backend has no "
                        "add_sigmoid_scaled op",
                        a->name, be->ops->name);
    return 0;
}

// The attention scale and the sliding-window layers' RoPE (after
// forward_rope_resolve): llama.cpp's gemma3 f_attention_scale, and its
// local layers' base rope_freq_base_train_swa with no frequency scaling, or
// (gpt-oss) the trained scaling (a --rope-freq-base or --rope-scale
// override applies to the global layers only, as in llama.cpp).
static void init_arch_attn(struct forward_ctx *fc, const struct model_hparams *hp) {
    const struct arch_block *b = &arch_get(hp->arch)->block;
    float d = (float)hp->head_dim;
    if (b->attn_scale_embd_layers && hp->n_layer == b->attn_scale_embd_layers)
        d = (float)(hp->n_embd / hp->n_head);
    fc->attn_scale = 1.0f / sqrtf(d);
    fc->rope_swa = fc->rope;
    if (hp->sliding_window > 0) {
        fc->rope_swa.freq_base = hp->rope_freq_base_swa;
        fc->rope_swa.freq_scale = b->swa_rope_trained ? hp->rope_freq_scale : 1.0f;
    }
}

size_t forward_moe_scratch_bytes(const struct model_hparams *hp, size_t nb) {
    if (hp->n_expert <= 0)
        return 0;
    const size_t k = (size_t)hp->n_expert_used, f = sizeof(float);
    return nb * ((size_t)hp->n_expert * f + k * (sizeof(int32_t) + f) + (size_t)hp->n_embd * f +
                 (hp->n_ff_shexp ? f : 0)) +
           BACKEND_MOE_TMP(nb, k, hp->n_embd, hp->n_ff_exp) * f;
}

// front: the context is the front of a pipeline whose last stage runs in
// another process (host/split/): it keeps the head's buffers, which receive
// that stage's logits and ids.
static int init(struct forward_ctx *fc, const struct model *m, const struct forward_config *cfg_in,
                bool front, struct verr *err) {
    memset(fc, 0, sizeof *fc);
    const struct model_hparams *hp = &m->hp;
    struct forward_config resolved = *cfg_in;
    if (resolved.n_ctx == 0)
        forward_config_resolve(&resolved, hp);
    const struct forward_config *cfg = &resolved;
    fc->m = m;
    fc->be = m->be;
    fc->cfg = *cfg;
    if (fc->cfg.n_seq_max <= 0)
        fc->cfg.n_seq_max = 1;
    if (fc->cfg.n_outputs_max <= 0 || fc->cfg.n_outputs_max > cfg->n_batch)
        fc->cfg.n_outputs_max = cfg->n_batch;
    if (cfg->n_ctx < 1 || cfg->n_batch < 1)
        return verr_set(err, VERR_RANGE, "forward: n_ctx %d and n_batch %d must be >= 1",
                        cfg->n_ctx, cfg->n_batch);
    int brc = check_block(hp, fc->be, err);
    if (brc)
        return brc;
    int se_ctx = 0;
    if ((cfg->se_g > 1 || cfg->se_g < 0) &&
        (brc = forward_selfextend_ctx(hp, cfg->se_g, cfg->se_w, &se_ctx, err)))
        return brc;
    if (cfg->se_g > 1)
        fc->cfg.k_unrotated = true;
    if (cfg->se_g > 1 && hp->sliding_window > 0)
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: self-extend with %s's sliding-window layers is not supported: "
                        "a window over grouped (divided) positions is not defined",
                        model_arch_name(hp->arch));
    for (int i = 0; i < 2; i++) {
        const enum ggml_type t = i ? cfg->type_v : cfg->type_k;
        if (!backend_supports_cache_type(fc->be, t))
            return verr_set(err, VERR_UNSUPPORTED,
                            "forward: %s cache type %s: the %s backend supports %s caches",
                            i ? "V" : "K", ggml_type_name(t), fc->be->ops->name,
                            fc->be->ops->cache_type_supported
                                ? "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl"
                                : "f16/f32");
    }
    forward_rope_resolve(m, &cfg->rope, &fc->rope);
    if (!(fc->rope.freq_scale > 0) || !(fc->rope.freq_base > 0) || fc->rope.n_ctx_orig <= 0)
        return verr_set(err, VERR_RANGE,
                        "rope: freq_base %g and freq_scale %g must be > 0, original context %d "
                        "must be > 0",
                        fc->rope.freq_base, fc->rope.freq_scale, fc->rope.n_ctx_orig);
    init_arch_attn(fc, hp);

    // A stage holds the cache of its own layers only.
    const int n_layer_here = m->layer_end - m->layer_begin;
    // The head's buffers live where logits are made (the last stage) and on
    // the front of a pipeline, which receives them from the last stage when
    // that runs in another process.
    const bool has_head = m->layer_end == hp->n_layer || front;
    const char *rot_env = getenv("VELA_ATTN_ROT_DISABLE");
    const bool rot_off = cfg->no_attn_rot || (rot_env && *rot_env && strcmp(rot_env, "0") != 0);
    fc->rot_k = rot_off || fc->cfg.k_unrotated
                    ? 0
                    : backend_attn_rot_block(cfg->type_k, hp->head_dim, true);
    fc->rot_v = rot_off ? 0 : backend_attn_rot_block(cfg->type_v, hp->head_dim_v, false);
    if ((fc->rot_k || fc->rot_v) && (!fc->be->ops->hadamard_q8 || !fc->be->ops->rope_kv_store_rot))
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: the %s backend has no hadamard op for the rotation of a "
                        "quantized cache (turn it off with --no-attn-rot)",
                        fc->be->ops->name);
    struct kv_config kc = {
        .n_ctx = cfg->n_ctx,
        .n_layer = n_layer_here,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .head_dim_v = hp->head_dim_v,
        .type_k = cfg->type_k,
        .type_v = cfg->type_v,
        .n_seq_max = fc->cfg.n_seq_max,
        .rot_k = fc->rot_k,
    };
    int rc = kv_init(&fc->kv, &kc, fc->be, err);
    if (rc)
        return rc;

    const size_t nb = (size_t)cfg->n_batch, no = (size_t)fc->cfg.n_outputs_max;
    const size_t f = sizeof(float);
    const size_t n_q = (size_t)hp->n_head * hp->head_dim;
    const size_t n_k = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t n_v = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t n_o = (size_t)hp->n_head * hp->head_dim_v;
    // A block with experts runs no dense feed-forward: gate and up hold
    // the shared expert's, when there is one.
    const bool moe = hp->n_expert > 0;
    const size_t n_ff = moe ? (size_t)hp->n_ff_shexp : (size_t)hp->n_ff;
    const size_t n_ex = moe ? (size_t)hp->n_expert : 0, k = moe ? (size_t)hp->n_expert_used : 0;
    const size_t moe_tmp = moe ? BACKEND_MOE_TMP(nb, k, hp->n_embd, hp->n_ff_exp) : 0;
    struct {
        void **p;
        size_t bytes;
        const char *what;
    } bufs[] = {
        {(void **)&fc->x, nb * hp->n_embd * f, "x"},
        {(void **)&fc->xn, nb * hp->n_embd * f, "xn"},
        {(void **)&fc->q, nb * n_q * f, "q"},
        {(void **)&fc->k, nb * n_k * f, "k"},
        {(void **)&fc->v, nb * n_v * f, "v"},
        {(void **)&fc->attn, nb * n_o * f, "attn"},
        {(void **)&fc->gate, nb * n_ff * f, "gate"},
        {(void **)&fc->up, nb * n_ff * f, "up"},
        {(void **)&fc->router, nb * n_ex * f, "router logits"},
        {(void **)&fc->moe_ids, nb * k * sizeof(int32_t), "expert ids"},
        {(void **)&fc->moe_w, nb * k * f, "expert weights"},
        {(void **)&fc->moe_out, moe ? nb * hp->n_embd * f : 0, "experts' output"},
        {(void **)&fc->moe_tmp, moe_tmp * f, "experts' scratch"},
        {(void **)&fc->shexp_gate, moe && hp->n_ff_shexp ? nb * f : 0, "shared expert gate"},
        {(void **)&fc->xo, has_head ? no * hp->n_embd * f : 0, "xo"},
        {(void **)&fc->logits, has_head ? no * hp->n_vocab * f : 0, "logits"},
        {(void **)&fc->d_tok, nb * sizeof(int32_t), "tokens"},
        {(void **)&fc->d_pos, nb * sizeof(int32_t), "positions"},
        {(void **)&fc->d_seq, nb * sizeof(int32_t), "seq ids"},
        {(void **)&fc->d_cells, nb * sizeof(int32_t), "cells"},
        {(void **)&fc->d_rows, no * sizeof(int32_t), "rows"},
        {(void **)&fc->d_argmax, no * sizeof(int32_t), "argmax"},
        {(void **)&fc->d_se, fc->cfg.k_unrotated ? nb * 2 * sizeof(int32_t) : 0, "self-extend"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if ((rc = scratch_alloc(fc, bufs[i].bytes, bufs[i].p, bufs[i].what, err)))
            goto fail;
    fc->out_batch_idx = malloc(no * sizeof(int32_t));
    fc->h_logits = malloc(no * (size_t)hp->n_vocab * f);
    fc->h_argmax = malloc(no * sizeof(int32_t));
    fc->h_cells = malloc(nb * sizeof(int32_t));
    fc->h_rows = malloc(no * sizeof(int32_t));
    fc->h_se = malloc(nb * 2 * sizeof(int32_t));
    if (!fc->out_batch_idx || !fc->h_logits || !fc->h_argmax || !fc->h_cells || !fc->h_rows ||
        !fc->h_se) {
        rc = verr_set(err, VERR_NOMEM, "forward: out of host memory (logits for %zu rows)", no);
        goto fail;
    }
    const char *env = getenv("VELA_NO_CUDA_GRAPH");
    const bool env_off = env && *env && strcmp(env, "0") != 0;
    fc->graphs_on = fc->be->ops->graph_begin && !fc->cfg.no_graph && !env_off;
    return 0;
fail:
    forward_free(fc);
    return rc;
}

int forward_init(struct forward_ctx *fc, const struct model *m, const struct forward_config *cfg,
                 struct verr *err) {
    return init(fc, m, cfg, false, err);
}

int forward_init_front(struct forward_ctx *fc, const struct model *m,
                       const struct forward_config *cfg, struct verr *err) {
    return init(fc, m, cfg, true, err);
}

void forward_free(struct forward_ctx *fc) {
    if (!fc->be)
        return;
    for (int i = 0; i < FORWARD_GRAPH_CACHE; i++)
        if (fc->graphs[i].exec)
            fc->be->ops->graph_destroy(fc->be, fc->graphs[i].exec);
    void *dev[] = {fc->x,       fc->xn,         fc->q,      fc->k,        fc->v,     fc->attn,
                   fc->gate,    fc->up,         fc->router, fc->moe_ids,  fc->moe_w, fc->moe_out,
                   fc->moe_tmp, fc->shexp_gate, fc->xo,     fc->logits,   fc->d_tok, fc->d_pos,
                   fc->d_seq,   fc->d_cells,    fc->d_rows, fc->d_argmax, fc->d_se};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            fc->be->ops->free(fc->be, dev[i]);
    kv_free(&fc->kv);
    free(fc->out_batch_idx);
    free(fc->h_logits);
    free(fc->h_argmax);
    free(fc->h_cells);
    free(fc->h_rows);
    free(fc->h_se);
    memset(fc, 0, sizeof *fc);
}

// Every op's failure is reported with the op, the layer and the backend's message.
#define OP(what, call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) {                                                                                 \
            if (il >= 0)                                                                           \
                return verr_set(err, rc_, "forward: layer %d: %s: %s", il, what, be->err.msg);     \
            return verr_set(err, rc_, "forward: %s: %s", what, be->err.msg);                       \
        }                                                                                          \
    } while (0)

static int stage_layers(struct forward_ctx *fc, int t0, int n_tok, int n_kv, struct verr *err);
static int stage_embed(struct forward_ctx *fc, int t0, int n, struct verr *err);

static enum forward_row row_how(const uint8_t *how, int r) {
    return how ? (enum forward_row)how[r] : FORWARD_ROW_LOGITS;
}

// The end of a row run [r, *end) of one kind in [r, r1).
static int row_run(const uint8_t *how, int r, int r1) {
    int e = r + 1;
    while (e < r1 && row_how(how, e) == row_how(how, r))
        e++;
    return e;
}

// Output rows [r0, r0+nr) (last stage): gathers their x rows, final norm,
// LM head into logits rows [r0, r0+nr), then the argmax of the ARGMAX rows.
static int head_logits(struct forward_ctx *fc, int r0, int nr, const uint8_t *how,
                       struct verr *err) {
    const struct model *m = fc->m;
    const struct model_hparams *hp = &m->hp;
    struct backend *be = fc->be;
    const int n_embd = hp->n_embd, V = hp->n_vocab;
    int il = -1;
    float *xo = fc->xo + (size_t)r0 * n_embd; // [nr][n_embd]
    float *logits = fc->logits;               // [n_out][n_vocab]
    OP("get_rows", be->ops->get_rows(be, xo, fc->x, fc->d_rows + r0, nr, n_embd));
    OP("output_norm + q8_1 for output",
       be->ops->rms_norm_q8(be, xo, xo, m->output_norm, nr, n_embd, hp->norm_eps));
    OP("output", be->ops->matmul(be, logits + (size_t)r0 * V, &m->output, xo, NULL, nr));
    for (int r = r0, e; r < r0 + nr; r = e) {
        e = row_run(how, r, r0 + nr);
        if (row_how(how, r) == FORWARD_ROW_ARGMAX)
            OP("argmax", be->ops->argmax(be, fc->d_argmax + r, logits + (size_t)r * V, e - r, V));
    }
    return 0;
}

// The SAMPLE rows of [r0, r0+nr): the token ops->sample picks with sp[r].
// Never recorded: sp is host memory that changes every step.
static int head_sample(struct forward_ctx *fc, int r0, int nr, const uint8_t *how,
                       const struct sample_params *sp, struct verr *err) {
    struct backend *be = fc->be;
    const int V = fc->m->hp.n_vocab;
    int il = -1;
    for (int r = r0, e; r < r0 + nr; r = e) {
        e = row_run(how, r, r0 + nr);
        if (row_how(how, r) != FORWARD_ROW_SAMPLE)
            continue;
        if (!sp)
            return verr_set(err, VERR_RANGE, "forward: row %d is sampled but has no sample_params",
                            r);
        OP("sample",
           be->ops->sample(be, fc->d_argmax + r, fc->logits + (size_t)r * V, e - r, V, sp + r));
    }
    return 0;
}

// The device ops of a part (eager, or being recorded): embed, the layers
// with attention over cells [0, n_kv), the head up to the ARGMAX rows' ids.
static int part_ops(struct forward_ctx *fc, const struct forward_part *pt, int n_kv,
                    const uint8_t *how, struct verr *err) {
    int rc;
    if ((pt->embed && (rc = stage_embed(fc, pt->t0, pt->n, err))) ||
        (rc = stage_layers(fc, pt->t0, pt->n, n_kv, err)))
        return rc;
    if (pt->head && pt->nr > 0 && (rc = head_logits(fc, pt->r0, pt->nr, how, err)))
        return rc;
    return 0;
}

// --- graphs ------------------------------------------------------------------
//
// A part of at most FORWARD_GRAPH_MAX_TOK tokens on a backend with graph ops
// (CUDA), graphs not disabled (--no-cuda-graph, VELA_NO_CUDA_GRAPH=1), goes
// like this:
//   host, eager, before (forward_stage_upload; none of it recorded):
//     kv_prepare (the pending K shift runs as an eager kernel, the changed
//     cell mirrors are copied); tokens, positions, seq ids, cells and output
//     rows are copied to their fixed device buffers fc->d_* (stream-ordered
//     copies, nothing waits for the device);
//   device, one graph launch:
//     part_ops: embed, the stage's layers, final norm, LM head and the
//     ARGMAX rows' ids. Attention runs over n_kv rounded up to
//     BACKEND_KV_BUCKET (capped at n_ctx): the cells past the used range are
//     empty (pos -1 on the device too) and masked, and the backend's
//     attention gives the same bits for every n_kv of a bucket, so the logits
//     equal an eager step's;
//   host, eager, after the launch:
//     the SAMPLE rows' sample op (their rows are host memory that changes
//     every step), then the driver's download and synchronisation.
// One graph per (part, n_kv bucket, which rows are ARGMAX), recorded the
// first time that shape is seen (the recording is then replayed for that
// step too) and kept in fc->graphs, least recently used out. A recording an
// op refuses (the scratch would grow, ...) is discarded and the part runs
// eagerly with the same n_kv, which grows the scratch so that the next
// recording fits; after FORWARD_GRAPH_FAIL_MAX failures in a row the context
// stops recording. A graph whose scratch moved since it was recorded (a
// larger batch grew it) is stale: destroyed and recorded again.
#define FORWARD_GRAPH_FAIL_MAX 4

static int graph_n_kv(const struct forward_ctx *fc) {
    long n = kv_n_kv(&fc->kv);
    n = (n + BACKEND_KV_BUCKET - 1) / BACKEND_KV_BUCKET * BACKEND_KV_BUCKET;
    return n > fc->cfg.n_ctx ? fc->cfg.n_ctx : (int)n;
}

static void graph_drop(struct forward_ctx *fc, struct forward_graph *g) {
    if (!g->exec)
        return;
    fc->be->ops->graph_destroy(fc->be, g->exec);
    g->exec = NULL;
    fc->graph_stats.live--;
}

// Bit r - r0 set: row r is an ARGMAX row (n <= FORWARD_GRAPH_MAX_TOK rows).
static uint32_t argmax_mask(const struct forward_part *pt, const uint8_t *how) {
    uint32_t mask = 0;
    for (int r = 0; pt->head && r < pt->nr; r++)
        if (row_how(how, pt->r0 + r) == FORWARD_ROW_ARGMAX)
            mask |= 1u << r;
    return mask;
}

static struct forward_graph *graph_find(struct forward_ctx *fc, const struct forward_graph *key,
                                        struct forward_graph **victim) {
    *victim = NULL;
    for (int i = 0; i < FORWARD_GRAPH_CACHE; i++) {
        struct forward_graph *c = &fc->graphs[i];
        if (c->exec && c->t0 == key->t0 && c->n_tok == key->n_tok && c->r0 == key->r0 &&
            c->n_out == key->n_out && c->n_kv == key->n_kv && c->argmax == key->argmax)
            return c;
        if (!*victim || ((*victim)->exec && (!c->exec || c->last_use < (*victim)->last_use)))
            *victim = c;
    }
    return NULL;
}

// Records the part into a graph in *victim's place; 1: recording failed (the
// caller runs it eagerly).
static int graph_record(struct forward_ctx *fc, const struct forward_part *pt, const uint8_t *how,
                        const struct forward_graph *key, struct forward_graph *victim) {
    struct backend *be = fc->be;
    void *exec = NULL;
    int rc = be->ops->graph_begin(be);
    if (!rc) {
        struct verr rec_err = {0};
        int rc_ops = part_ops(fc, pt, key->n_kv, how, &rec_err);
        rc = be->ops->graph_end(be, rc_ops ? NULL : &exec);
        if (rc_ops)
            rc = rc_ops;
    }
    if (rc || !exec) {
        fc->graph_fail_run++;
        return 1;
    }
    graph_drop(fc, victim);
    *victim = *key;
    victim->exec = exec;
    fc->graph_fail_run = 0;
    fc->graph_stats.recorded++;
    fc->graph_stats.live++;
    return 0;
}

static int part_graph(struct forward_ctx *fc, const struct forward_part *pt, const uint8_t *how,
                      struct verr *err) {
    struct backend *be = fc->be;
    const struct forward_graph key = {.t0 = pt->t0,
                                      .n_tok = pt->n,
                                      .r0 = pt->head ? pt->r0 : 0,
                                      .n_out = pt->head ? pt->nr : 0,
                                      .n_kv = graph_n_kv(fc),
                                      .argmax = argmax_mask(pt, how)};
    struct forward_graph *victim;
    struct forward_graph *g = graph_find(fc, &key, &victim);
    if (g && !be->ops->graph_current(be, g->exec)) {
        graph_drop(fc, g);
        victim = g;
        g = NULL;
    }
    if (!g) {
        if (fc->graph_fail_run >= FORWARD_GRAPH_FAIL_MAX ||
            graph_record(fc, pt, how, &key, victim)) {
            fc->graph_stats.eager++;
            return part_ops(fc, pt, key.n_kv, how, err);
        }
        g = victim;
    }
    g->last_use = ++fc->graph_tick;
    int il = -1;
    OP("graph launch", be->ops->graph_launch(be, g->exec));
    fc->graph_stats.replays++;
    return 0;
}

int forward_stage_run(struct forward_ctx *fc, const struct forward_part *pt, const uint8_t *how,
                      const struct sample_params *sp, struct verr *err) {
    int rc = fc->graphs_on && pt->n <= FORWARD_GRAPH_MAX_TOK
                 ? part_graph(fc, pt, how, err)
                 : part_ops(fc, pt, kv_n_kv(&fc->kv), how, err);
    if (rc || !pt->head || pt->nr == 0)
        return rc;
    return head_sample(fc, pt->r0, pt->nr, how, sp, err);
}

// b->se: only in the unrotated cache mode; each G >= 1, each W as
// forward_selfextend_ctx wants it when G > 1, and no G > 1 on a model with
// sliding-window layers (init's rule for cfg.se_g).
static int check_batch_se(const struct forward_ctx *fc, const struct forward_batch *b,
                          struct verr *err) {
    const struct model_hparams *hp = &fc->m->hp;
    if (!b->se)
        return 0;
    if (!fc->cfg.k_unrotated)
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: self-extend per token needs K cached unrotated (the context "
                        "was created without k_unrotated or se_g > 1)");
    for (int t = 0; t < b->n_tok; t++) {
        const int g = b->se[2 * t], w = b->se[2 * t + 1];
        int n_ctx_se;
        if (g == 1)
            continue;
        int rc = forward_selfextend_ctx(hp, g, w, &n_ctx_se, err);
        if (rc)
            return verr_wrap(err, "forward: token %d", t);
        if (hp->sliding_window > 0)
            return verr_set(err, VERR_UNSUPPORTED,
                            "forward: token %d: self-extend with %s's sliding-window layers is "
                            "not supported",
                            t, model_arch_name(hp->arch));
    }
    return 0;
}

int forward_batch_begin(struct forward_ctx *fc, const struct forward_batch *b, int *n_out_p,
                        struct verr *err) {
    const struct model_hparams *hp = &fc->m->hp;
    const int n_tok = b->n_tok;
    fc->n_out = 0;
    *n_out_p = 0;
    if (n_tok < 1 || n_tok > fc->cfg.n_batch)
        return verr_set(err, VERR_RANGE, "forward: batch of %d tokens (must be 1..%d)", n_tok,
                        fc->cfg.n_batch);
    for (int t = 0; t < n_tok; t++) {
        if (b->token[t] < 0 || b->token[t] >= hp->n_vocab)
            return verr_set(err, VERR_RANGE, "token id %d is out of range (n_vocab %d)",
                            b->token[t], hp->n_vocab);
        if (b->pos[t] < 0)
            return verr_set(err, VERR_RANGE, "forward: token %d: negative position %d", t,
                            b->pos[t]);
    }
    int rc = check_batch_se(fc, b, err);
    if (rc)
        return rc;
    int n_out = 0;
    for (int t = 0; t < n_tok; t++) {
        bool want = b->logits ? b->logits[t] != 0 : t == n_tok - 1;
        if (!want)
            continue;
        if (n_out == fc->cfg.n_outputs_max)
            return verr_set(err, VERR_RANGE, "forward: more than %d rows want logits in one batch",
                            fc->cfg.n_outputs_max);
        fc->h_rows[n_out] = t;
        fc->out_batch_idx[n_out] = t;
        n_out++;
    }
    if ((rc = kv_find_slot(&fc->kv, b->pos, b->seq, n_tok, fc->h_cells, err)))
        return rc;
    *n_out_p = n_out;
    return 0;
}

void forward_batch_undo(struct forward_ctx *fc, const struct forward_batch *b) {
    for (int t = 0; t < b->n_tok; t++)
        kv_seq_rm(&fc->kv, b->seq[t], b->pos[t], b->pos[t] + 1, NULL);
    fc->n_out = 0;
}

int forward_stage_upload(struct forward_ctx *fc, const struct forward_batch *b,
                         const int32_t *cells, const int32_t *rows, int n_out, struct verr *err) {
    struct backend *be = fc->be;
    const int n_tok = b->n_tok;
    int il = -1; // for OP's message: -1 = outside the layers
    if (fc->kv.has_shift && fc->m->hp.sliding_window > 0 && !fc->cfg.k_unrotated)
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: %s with a sliding window: a shifted KV cache (context shift, "
                        "self-extend) is not supported: its local and global layers rotate K "
                        "with different RoPE bases, which the one K shift over all layers "
                        "cannot do, and a window over self-extend's divided positions is "
                        "not defined",
                        model_arch_name(fc->m->hp.arch));
    // The unrotated cache: a pending shift only changes positions (no K rewrite).
    int rc = kv_prepare(&fc->kv, fc->cfg.k_unrotated ? NULL : &fc->rope, err);
    if (rc)
        return rc;
    const size_t i32 = sizeof(int32_t);
    if (fc->m->layer_begin == 0)
        OP("upload tokens", be->ops->upload(be, fc->d_tok, b->token, (size_t)n_tok * i32));
    OP("upload positions", be->ops->upload(be, fc->d_pos, b->pos, (size_t)n_tok * i32));
    OP("upload seq ids", be->ops->upload(be, fc->d_seq, b->seq, (size_t)n_tok * i32));
    OP("upload cells", be->ops->upload(be, fc->d_cells, cells, (size_t)n_tok * i32));
    if (n_out > 0 && fc->m->layer_end == fc->m->hp.n_layer)
        OP("upload rows", be->ops->upload(be, fc->d_rows, rows, (size_t)n_out * i32));
    if (fc->cfg.k_unrotated && b->se) {
        OP("upload self-extend", be->ops->upload(be, fc->d_se, b->se, (size_t)n_tok * 2 * i32));
        fc->se_default_n = 0;
    } else if (fc->cfg.k_unrotated && n_tok > fc->se_default_n) {
        // the context's own G and W for every token, uploaded once per size
        for (int t = 0; t < n_tok; t++) {
            fc->h_se[2 * t] = fc->cfg.se_g > 1 ? fc->cfg.se_g : 1;
            fc->h_se[2 * t + 1] = fc->cfg.se_w > 0 ? fc->cfg.se_w : 1;
        }
        OP("upload self-extend", be->ops->upload(be, fc->d_se, fc->h_se, (size_t)n_tok * 2 * i32));
        fc->se_default_n = n_tok;
    }
    return 0;
}

static int stage_embed(struct forward_ctx *fc, int t0, int n, struct verr *err) {
    struct backend *be = fc->be;
    const struct model *m = fc->m;
    int il = -1;
    float *x = fc->x + (size_t)t0 * m->hp.n_embd; // [n][n_embd]
    OP("embed", be->ops->embed(be, x, &m->tok_embd, fc->d_tok + t0, n));
    // gemma: scaled by sqrt(n_embd) as llama.cpp does (sqrtf of the float)
    if (arch_get(m->hp.arch)->block.embd_scale)
        OP("embedding scale",
           be->ops->scale(be, x, sqrtf((float)m->hp.n_embd), (int64_t)n * m->hp.n_embd));
    return 0;
}

// x += post_norm(w in + bias), or x += w in (one fused op) without a
// post-norm and a bias: the end of a block's attention or feed-forward.
// `what` names the matrix.
static int proj_residual(struct forward_ctx *fc, int il, float *x /* [n_tok][n_embd] */,
                         const struct backend_weight *w, const float *in /* [n_tok][w->n_in] */,
                         const float *bias /* [n_embd] or NULL */,
                         const float *post_norm /* [n_embd] or NULL */, int n_tok, const char *what,
                         struct verr *err) {
    struct backend *be = fc->be;
    const struct model_hparams *hp = &fc->m->hp;
    if (!post_norm && !bias) {
        OP(what, be->ops->matmul_add(be, x, w, in, n_tok));
        return 0;
    }
    OP(what, be->ops->matmul(be, fc->xn, w, in, bias, n_tok));
    if (post_norm)
        OP("post-norm",
           be->ops->rms_norm(be, fc->xn, fc->xn, post_norm, n_tok, hp->n_embd, hp->norm_eps));
    OP("residual", be->ops->add(be, x, fc->xn, (int64_t)n_tok * hp->n_embd));
    return 0;
}

// RoPE on q and k and the K/V store of one layer's tokens; with the
// attention rotation (forward_ctx.rot_k / rot_v), q and k are rotated after
// RoPE and v before the store, in the same fused op.
static int qkv_rotate_store(struct forward_ctx *fc, int kl, const struct rope_params *rp,
                            const int32_t *d_pos /* [n_tok] */,
                            const int32_t *d_cells /* [n_tok] */, int n_tok, struct verr *err) {
    const struct model_hparams *hp = &fc->m->hp;
    struct backend *be = fc->be;
    const int il = kl + fc->m->layer_begin;
    // rp NULL stores K as it is (the unrotated cache mode): attention rotates it
    const struct rope_params *store_rp = fc->cfg.k_unrotated ? NULL : rp;
    if (fc->rot_k || fc->rot_v)
        OP("rope q, k + rotation + kv store",
           be->ops->rope_kv_store_rot(be, fc->q, hp->n_head, fc->k, fc->v, kv_layer_k(&fc->kv, kl),
                                      fc->kv.cfg.type_k, kv_layer_v(&fc->kv, kl), fc->kv.cfg.type_v,
                                      d_pos, d_cells, n_tok, hp->n_head_kv, hp->head_dim,
                                      hp->head_dim_v, store_rp, fc->rot_k, fc->rot_v));
    else
        OP("rope q, k + kv store",
           be->ops->rope_kv_store(be, fc->q, hp->n_head, fc->k, fc->v, kv_layer_k(&fc->kv, kl),
                                  fc->kv.cfg.type_k, kv_layer_v(&fc->kv, kl), fc->kv.cfg.type_v,
                                  d_pos, d_cells, n_tok, hp->n_head_kv, hp->head_dim,
                                  hp->head_dim_v, store_rp));
    return 0;
}

// One block's attention, added to the residual x [n_tok][n_embd]: norm,
// Q/K/V, per-head Q/K norms (qwen3, gemma3), RoPE with the layer's
// parameters and the K/V store, attention over cells [0, n_kv) (through the
// window on a sliding-window layer), the output projection and, on a
// sandwich-norm block (gemma3), its norm before the residual add.
static int layer_attention(struct forward_ctx *fc, int il, float *x, int t0, int n_tok, int n_kv,
                           struct verr *err) {
    const struct model *m = fc->m;
    const struct model_hparams *hp = &m->hp;
    struct backend *be = fc->be;
    const struct model_layer *L = &m->layers[il];
    const int kl = il - m->layer_begin; // this stage's cache holds its layers only
    const int n_embd = hp->n_embd;
    const bool swa = model_layer_is_swa(hp, il);
    const struct rope_params *rp = swa ? &fc->rope_swa : &fc->rope;
    const int32_t *d_pos = fc->d_pos + t0, *d_seq = fc->d_seq + t0; // [n_tok]
    const int32_t *d_cells = fc->d_cells + t0;                      // [n_tok]
    OP("attn_norm + q8_1 for q/k/v",
       be->ops->rms_norm_q8(be, fc->xn, x, L->attn_norm, n_tok, n_embd, hp->norm_eps));
    const struct backend_mm qkv[3] = {
        {fc->q, &L->wq, L->bq}, {fc->k, &L->wk, L->bk}, {fc->v, &L->wv, L->bv}};
    OP("attn_q/k/v", be->ops->matmul_multi(be, qkv, 3, fc->xn, n_tok));
    if (L->attn_q_norm)
        OP("attn_q_norm", be->ops->rms_norm(be, fc->q, fc->q, L->attn_q_norm, n_tok * hp->n_head,
                                            hp->head_dim, hp->norm_eps));
    if (L->attn_k_norm)
        OP("attn_k_norm", be->ops->rms_norm(be, fc->k, fc->k, L->attn_k_norm, n_tok * hp->n_head_kv,
                                            hp->head_dim, hp->norm_eps));
    int rc = qkv_rotate_store(fc, kl, rp, d_pos, d_cells, n_tok, err);
    if (rc)
        return rc;
    struct attn_args a = {
        .out = fc->attn,
        .q = fc->q,
        .k = kv_layer_k(&fc->kv, kl),
        .v = kv_layer_v(&fc->kv, kl),
        .type_k = fc->kv.cfg.type_k,
        .type_v = fc->kv.cfg.type_v,
        .cell_pos = fc->kv.d_cell_pos,
        .cell_seq = fc->kv.d_cell_seq,
        .seq_words = fc->kv.seq_words,
        .q_pos = d_pos,
        .q_seq = d_seq,
        .n_tok = n_tok,
        .n_kv = n_kv,
        .window = swa ? hp->sliding_window : 0,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .head_dim_v = hp->head_dim_v,
        .scale = fc->attn_scale,
        .rope = fc->cfg.k_unrotated ? rp : NULL,
        .se_g = fc->cfg.se_g > 1 ? fc->cfg.se_g : 1,
        .se_w = fc->cfg.se_w,
        .q_se = fc->cfg.k_unrotated ? fc->d_se + 2 * t0 : NULL, // [n_tok][2]
        .sinks = L->attn_sinks,
        .out_q8 = !fc->rot_v, // the output projection reads it next (else the rotation)
    };
    OP("attention", be->ops->attention(be, &a));
    if (fc->rot_v) // each head's blocks: rows of n_head heads are the same runs
        OP("attention output rotation + q8_1 for attn_output",
           be->ops->hadamard_q8(be, fc->attn, n_tok, hp->n_head * hp->head_dim_v, fc->rot_v));
    return proj_residual(fc, il, x, &L->wo, fc->attn, L->bo, L->attn_post_norm, n_tok,
                         "attn_output", err);
}

// One block's feed-forward, added to x: norm, gate/up with the
// architecture's activation, down projection and, on a sandwich-norm block,
// its norm before the residual add.
static int layer_ffn(struct forward_ctx *fc, int il, float *x, int n_tok, struct verr *err) {
    const struct model *m = fc->m;
    const struct model_hparams *hp = &m->hp;
    struct backend *be = fc->be;
    const struct model_layer *L = &m->layers[il];
    const int n_embd = hp->n_embd;
    OP("ffn_norm + q8_1 for gate/up",
       be->ops->rms_norm_q8(be, fc->xn, x, L->ffn_norm, n_tok, n_embd, hp->norm_eps));
    if (arch_get(hp->arch)->block.ffn == ARCH_FFN_GEGLU)
        OP("ffn_gate/up + geglu",
           be->ops->matmul_geglu(be, fc->gate, fc->up, &L->w_gate, &L->w_up, fc->xn, n_tok));
    else
        OP("ffn_gate/up + swiglu",
           be->ops->matmul_swiglu(be, fc->gate, fc->up, &L->w_gate, &L->w_up, fc->xn, n_tok));
    return proj_residual(fc, il, x, &L->w_down, fc->gate, NULL, L->ffn_post_norm, n_tok, "ffn_down",
                         err);
}

// The shared expert of a qwen2moe block, added to fc->moe_out as llama.cpp
// computes it: moe_out += ffn(h) * sigmoid(g), g = ffn_gate_inp_shexp . h,
// h = fc->xn the normed input (the add_sigmoid_scaled op: host/ops/backend.h).
static int moe_shared_expert(struct forward_ctx *fc, int il, int n_tok, struct verr *err) {
    const struct model_hparams *hp = &fc->m->hp;
    struct backend *be = fc->be;
    const struct model_layer *L = &fc->m->layers[il];
    OP("ffn_gate_inp_shexp",
       be->ops->matmul(be, fc->shexp_gate, &L->ffn_gate_inp_shexp, fc->xn, NULL, n_tok));
    OP("ffn_gate/up_shexp + swiglu",
       be->ops->matmul_swiglu(be, fc->gate, fc->up, &L->ffn_gate_shexp, &L->ffn_up_shexp, fc->xn,
                              n_tok));
    // xn is read for the last time above: it takes the shared expert's output
    OP("ffn_down_shexp", be->ops->matmul(be, fc->xn, &L->ffn_down_shexp, fc->gate, NULL, n_tok));
    OP("shared expert gate + add",
       be->ops->add_sigmoid_scaled(be, fc->moe_out, fc->xn, fc->shexp_gate, n_tok, hp->n_embd));
    return 0;
}

// A block's routed feed-forward, added to x as llama.cpp's build_moe_ffn:
// norm, router logits, each token's k experts and weights (renormalised
// where the architecture says), their weighted sum, the shared expert
// (qwen2moe), then the residual add.
static int layer_moe(struct forward_ctx *fc, int il, float *x, int n_tok, struct verr *err) {
    const struct model *m = fc->m;
    const struct model_hparams *hp = &m->hp;
    const struct arch *a = arch_get(hp->arch);
    struct backend *be = fc->be;
    const struct model_layer *L = &m->layers[il];
    const int n_embd = hp->n_embd, k = hp->n_expert_used;
    OP("ffn_norm", be->ops->rms_norm(be, fc->xn, x, L->ffn_norm, n_tok, n_embd, hp->norm_eps));
    OP("ffn_gate_inp",
       be->ops->matmul(be, fc->router, &L->ffn_gate_inp, fc->xn, L->ffn_gate_inp_b, n_tok));
    OP("moe_route", be->ops->moe_route(be, fc->moe_ids, fc->moe_w, fc->router, n_tok, hp->n_expert,
                                       k, a->moe.gating));
    const struct moe_args ma = {
        .out = fc->moe_out,
        .x = fc->xn,
        .ids = fc->moe_ids,
        .weights = fc->moe_w,
        .gate = &L->ffn_gate_exps,
        .up = &L->ffn_up_exps,
        .down = &L->ffn_down_exps,
        .gate_b = L->ffn_gate_exps_b,
        .up_b = L->ffn_up_exps_b,
        .down_b = L->ffn_down_exps_b,
        .act = a->moe.act,
        .alpha = MOE_OAI_ALPHA,
        .limit = MOE_OAI_LIMIT,
        .n_expert = hp->n_expert,
        .k = k,
        .n_tok = n_tok,
        .tmp = fc->moe_tmp,
    };
    OP("moe_ffn", be->ops->moe_ffn(be, &ma));
    int rc = a->moe.shexp ? moe_shared_expert(fc, il, n_tok, err) : 0;
    if (rc)
        return rc;
    OP("residual", be->ops->add(be, x, fc->moe_out, (int64_t)n_tok * n_embd));
    return 0;
}

// forward_stage_layers with attention over cells [0, n_kv), n_kv >= kv_n_kv.
static int stage_layers(struct forward_ctx *fc, int t0, int n_tok, int n_kv, struct verr *err) {
    const struct model *m = fc->m;
    float *x = fc->x + (size_t)t0 * m->hp.n_embd; // [n_tok][n_embd]
    for (int il = m->layer_begin; il < m->layer_end; il++) {
        int rc = layer_attention(fc, il, x, t0, n_tok, n_kv, err);
        if (!rc)
            rc = m->hp.n_expert > 0 ? layer_moe(fc, il, x, n_tok, err)
                                    : layer_ffn(fc, il, x, n_tok, err);
        if (rc)
            return rc;
    }
    return 0;
}

int forward_stage_download(struct forward_ctx *fc, int n_out, const uint8_t *how, float *h_logits,
                           int32_t *h_ids, struct verr *err) {
    struct backend *be = fc->be;
    const size_t V = (size_t)fc->m->hp.n_vocab;
    int il = -1;
    bool ids = false;
    for (int r = 0, e; r < n_out; r = e) {
        e = row_run(how, r, n_out);
        if (row_how(how, r) != FORWARD_ROW_LOGITS)
            ids = true;
        else
            OP("download logits",
               be->ops->download(be, h_logits + (size_t)r * V, fc->logits + (size_t)r * V,
                                 (size_t)(e - r) * V * sizeof(float)));
    }
    if (ids)
        OP("download ids",
           be->ops->download(be, h_ids, fc->d_argmax, (size_t)n_out * sizeof(int32_t)));
    OP("sync", be->ops->sync(be));
    return 0;
}

#undef OP
