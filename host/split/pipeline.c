// Stages of a model split by layers (see pipeline.h).
#include "host/split/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/split/mpi.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

// --- devices -------------------------------------------------------------------

void load_config_default(struct load_config *c) {
    memset(c, 0, sizeof *c);
    c->backend = LOAD_BACKEND_AUTO;
    c->split_mode = LOAD_SPLIT_LAYER;
    c->be.act = BACKEND_ACT_DEFAULT;
}

int pipeline_resolve_devices(const struct load_config *a, struct backend_device *devs, int *n,
                             struct verr *err) {
    *n = 0;
    if (a->split_mode == LOAD_SPLIT_ROW)
        return verr_set(err, VERR_UNSUPPORTED,
                        "--split-mode row is not supported (layer: split by layers, none: one "
                        "device)");
    const int n_cuda = backend_cuda_device_count();
    if (a->devices) {
        int rc = plan_parse_devices(a->devices, devs, PLAN_MAX_DEVICES, n, err);
        if (rc || (rc = plan_check_devices(devs, *n, n_cuda, backend_cuda_built(), err)))
            return rc;
        if (a->split_mode == LOAD_SPLIT_NONE && *n > 1) {
            // llama.cpp: with split mode none, --main-gpu indexes the device list.
            if (a->main_device >= *n)
                return verr_set(err, VERR_RANGE, "--main-gpu %d: --devices lists only %d device%s",
                                a->main_device, *n, *n == 1 ? "" : "s");
            devs[0] = devs[a->main_device];
            *n = 1;
        }
    } else if (a->backend == LOAD_BACKEND_CPU || (a->backend == LOAD_BACKEND_AUTO && n_cuda == 0)) {
        devs[0] = (struct backend_device){BACKEND_DEVICE_CPU, 0};
        *n = 1;
    } else if (a->split_mode == LOAD_SPLIT_NONE || n_cuda <= 1) {
        devs[0] = (struct backend_device){BACKEND_DEVICE_CUDA, a->main_device};
        *n = 1;
    } else {
        // --split-mode layer (the default) with several GPUs visible: all of them.
        for (int d = 0; d < n_cuda && d < PLAN_MAX_DEVICES; d++)
            devs[d] = (struct backend_device){BACKEND_DEVICE_CUDA, d};
        *n = n_cuda < PLAN_MAX_DEVICES ? n_cuda : PLAN_MAX_DEVICES;
    }
    if (a->tensor_split) {
        float ts[PLAN_MAX_DEVICES];
        int nts = 0;
        int rc = plan_parse_split(a->tensor_split, ts, PLAN_MAX_DEVICES, &nts, err);
        if (rc)
            return rc;
        if (nts > *n && *n > 1)
            return verr_set(err, VERR_RANGE, "--tensor-split: %d proportions for %d devices", nts,
                            *n);
    }
    return 0;
}

// --- the plan ----------------------------------------------------------------

// Kept free on a GPU: cuBLAS workspaces, the backend's scratch, allocator slack.
#define PIPELINE_CUDA_RESERVE ((size_t)256 << 20)

// pipeline_plan for a context keeping n_outputs_max logits rows (0: n_batch).
static int plan_sized(const struct load_config *a, const struct forward_config *cfg,
                      const struct gguf_file *f, const struct backend_device *devs, int n,
                      const size_t *free_bytes, struct plan *out, char *text, size_t text_cap,
                      struct verr *err) {
    struct model_hparams hp;
    int rc = model_read_hparams(f, &hp, err);
    if (rc)
        return rc;
    struct forward_config fcfg = *cfg;
    forward_config_resolve(&fcfg, &hp);
    const int n_outputs_max = fcfg.n_outputs_max;
    size_t *layer_bytes = calloc((size_t)hp.n_layer, sizeof *layer_bytes);
    if (!layer_bytes)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    size_t embed = 0, head = 0;
    if ((rc = model_weight_bytes(f, &hp, layer_bytes, &embed, &head, err))) {
        free(layer_bytes);
        return rc;
    }
    const size_t fl = sizeof(float), nb = (size_t)fcfg.n_batch, nc = (size_t)fcfg.n_ctx;
    const size_t n_q = (size_t)hp.n_head * hp.head_dim, n_k = (size_t)hp.n_head_kv * hp.head_dim;
    const size_t n_v = (size_t)hp.n_head_kv * hp.head_dim_v,
                 n_o = (size_t)hp.n_head * hp.head_dim_v;
    const size_t k_row = ggml_row_bytes(fcfg.type_k, (int64_t)n_k);
    const size_t v_row = ggml_row_bytes(fcfg.type_v, (int64_t)n_v);
    const size_t seq_words = (size_t)((fcfg.n_seq_max > 0 ? fcfg.n_seq_max : 1) + 63) / 64;
    // As forward_init allocates: activations of n_batch tokens, the batch's
    // ids, the cache's cell mirrors; the head's rows on the last stage (at
    // most n_batch rows want logits).
    size_t scratch =
        nb * fl * (3 * (size_t)hp.n_embd + n_q + n_k + n_v + n_o + 2 * (size_t)hp.n_ff) +
        nb * 4 * sizeof(int32_t) + nc * (2 * sizeof(int32_t) + seq_words * 8);
    const size_t no = n_outputs_max > 0 && (size_t)n_outputs_max < nb ? (size_t)n_outputs_max : nb;
    size_t head_scratch = no * fl * ((size_t)hp.n_embd + (size_t)hp.n_vocab) + no * 2 * 4;

    char names[PLAN_MAX_DEVICES][32];
    const char *name_ptr[PLAN_MAX_DEVICES];
    size_t fr[PLAN_MAX_DEVICES];
    bool any_cuda = false;
    for (int d = 0; d < n; d++) {
        backend_device_name(&devs[d], names[d], sizeof names[d]);
        name_ptr[d] = names[d];
        any_cuda |= devs[d].kind == BACKEND_DEVICE_CUDA;
        if (free_bytes) {
            fr[d] = free_bytes[d];
            continue;
        }
        size_t total = 0;
        if ((rc = backend_device_memory(&devs[d], &fr[d], &total, err))) {
            free(layer_bytes);
            return rc;
        }
    }
    // Stages sharing a device share its free memory.
    size_t fr_shared[PLAN_MAX_DEVICES];
    for (int d = 0; d < n; d++) {
        int same = 0;
        for (int e = 0; e < n; e++)
            same += devs[e].kind == devs[d].kind && devs[e].ordinal == devs[d].ordinal;
        fr_shared[d] = fr[d] == BACKEND_MEM_UNLIMITED ? fr[d] : fr[d] / (size_t)same;
    }
    float ts[PLAN_MAX_DEVICES] = {0};
    int nts = 0;
    if (a->tensor_split &&
        (rc = plan_parse_split(a->tensor_split, ts, PLAN_MAX_DEVICES, &nts, err))) {
        free(layer_bytes);
        return rc;
    }
    struct plan_input in = {
        .n_layer = hp.n_layer,
        .layer_bytes = layer_bytes,
        .kv_bytes_per_layer = nc * (k_row + v_row),
        .embed_bytes = embed,
        .head_bytes = head,
        .scratch_bytes = scratch,
        .head_scratch_bytes = head_scratch,
        // cuBLAS workspaces and allocator slack on a GPU.
        .reserve_bytes = any_cuda ? PIPELINE_CUDA_RESERVE : 0,
        .n_devices = n,
        .device_names = name_ptr,
        .free_bytes = fr_shared,
        .split = a->tensor_split ? ts : NULL,
    };
    rc = plan_make(out, &in, err);
    free(layer_bytes);
    if (rc)
        return rc;
    if (text)
        plan_format(out, name_ptr, text, text_cap);
    return 0;
}

int pipeline_plan(const struct load_config *lc, const struct forward_config *cfg,
                  const struct gguf_file *f, const struct backend_device *devs, int n,
                  const size_t *free_bytes, struct plan *out, char *text, size_t text_cap,
                  struct verr *err) {
    return plan_sized(lc, cfg, f, devs, n, free_bytes, out, text, text_cap, err);
}

// --- loading -------------------------------------------------------------------

static int create_backend(const struct load_config *a, const struct backend_device *d,
                          struct backend **out, struct verr *err) {
    return backend_create_device(d, &a->be, out, err);
}

// One device without --devices: --backend's choice, auto being the GPU
// --main-gpu names when it exists, else the CPU.
static int create_backend_auto(const struct load_config *a, struct backend **out,
                               struct verr *err) {
    struct backend_device d = {BACKEND_DEVICE_CPU, 0};
    if (a->backend == LOAD_BACKEND_CUDA ||
        (a->backend == LOAD_BACKEND_AUTO && backend_cuda_device_count() > a->main_device))
        d = (struct backend_device){BACKEND_DEVICE_CUDA, a->main_device};
    int rc = create_backend(a, &d, out, err);
    if (rc && a->backend == LOAD_BACKEND_CUDA)
        verr_wrap(err, "--backend cuda");
    return rc;
}

static int make_transport(struct pipeline *p, struct verr *err) {
    struct backend *be[PLAN_MAX_DEVICES];
    bool nccl = backend_cuda_built();
    for (int s = 0; s < p->n_stages; s++) {
        be[s] = p->stage[s].be;
        if (p->stage[s].dev.kind != BACKEND_DEVICE_CUDA)
            nccl = false;
        for (int t = 0; t < s; t++)
            if (p->stage[t].dev.kind == BACKEND_DEVICE_CUDA &&
                p->stage[t].dev.ordinal == p->stage[s].dev.ordinal)
                nccl = false; // NCCL wants one rank per GPU: "0,0" goes in-process
    }
    const char *why = NULL;
    struct verr nerr = {0};
    if (nccl) {
        if (transport_nccl_create(&p->tp, be, p->n_stages, NULL, 0, &nerr) == 0)
            return 0;
        why = nerr.msg;
    }
    int rc = transport_inproc_create(&p->tp, be, p->n_stages, err);
    if (!rc && why) {
        size_t len = strlen(p->plan_text);
        snprintf(p->plan_text + len, sizeof p->plan_text - len,
                 "transport: in-process (NCCL unavailable: %s)\n", why);
    }
    return rc;
}

int pipeline_load_budget(const struct load_config *a, const struct forward_config *cfg,
                         const struct gguf_file *f, const struct backend_device *d,
                         struct model_load_params *lp, struct verr *err) {
    struct plan one;
    const size_t unl = BACKEND_MEM_UNLIMITED;
    int rc = plan_sized(a, cfg, f, d, 1, &unl, &one, NULL, 0, err);
    if (rc)
        return rc;
    lp->kv_bytes = one.stage[0].kv_bytes;
    lp->scratch_bytes = one.stage[0].scratch_bytes;
    lp->reserve_bytes = d->kind == BACKEND_DEVICE_CUDA ? PIPELINE_CUDA_RESERVE : 0;
    return 0;
}

// One device: the plan's byte accounting (weights come from the loader
// itself) for the check against what the backend reports free.
static int load_one(const struct load_config *a, const struct forward_config *cfg,
                    const struct gguf_file *f, const struct backend_device *d,
                    struct model_load_params *lp, struct backend *be, struct model **m,
                    struct verr *err) {
    int rc;
    if (!lp->skip_memory_check && (rc = pipeline_load_budget(a, cfg, f, d, lp, err)))
        return rc;
    return model_load_ex(m, f, be, lp, err);
}

int pipeline_load(const struct load_config *lc, const struct forward_config *cfg,
                  const struct gguf_file *f, struct pipeline **pipe, struct backend **be,
                  struct model **m, struct verr *err) {
    return pipeline_load_ex(lc, cfg, f, NULL, NULL, pipe, be, m, err);
}

int pipeline_load_ex(const struct load_config *a, const struct forward_config *cfg,
                     const struct gguf_file *f, model_progress_fn progress, void *progress_user,
                     struct pipeline **pipe, struct backend **be, struct model **m,
                     struct verr *err) {
    *pipe = NULL;
    *be = NULL;
    *m = NULL;
    struct pipeline_ctl *ctl = NULL;
    int rc = pipeline_mpi_ctl_create(&ctl, err);
    if (rc)
        return rc;
    if (ctl)
        return pipeline_mpi_load(ctl, a, cfg, f, pipe, be, m, err);

    struct backend_device devs[PLAN_MAX_DEVICES];
    int n = 0;
    if ((rc = pipeline_resolve_devices(a, devs, &n, err)))
        return rc;
    struct model_load_params lp;
    model_load_params_default(&lp);
    lp.progress = progress;
    lp.progress_user = progress_user;
    if (n == 1) {
        // One device: what engine_open always did.
        if (!a->devices)
            rc = create_backend_auto(a, be, err);
        else if ((rc = create_backend(a, &devs[0], be, err)))
            verr_wrap(err, "--devices");
        if (rc)
            return rc;
        if ((rc = load_one(a, cfg, f, &devs[0], &lp, *be, m, err))) {
            backend_destroy(*be);
            *be = NULL;
        }
        return rc;
    }

    struct pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    if ((rc = plan_sized(a, cfg, f, devs, n, NULL, &p->plan, p->plan_text, sizeof p->plan_text,
                         err)))
        goto fail;
    p->n_stages = p->plan.n_stages;
    p->n_ubatch = a->n_ubatch;
    for (int s = 0; s < p->n_stages; s++) {
        struct pipeline_stage *st = &p->stage[s];
        st->dev = devs[p->plan.stage[s].device];
        backend_device_name(&st->dev, st->name, sizeof st->name);
        st->l0 = p->plan.stage[s].l0;
        st->l1 = p->plan.stage[s].l1;
        st->owned = true;
    }
    if (p->n_stages == 1) {
        // --tensor-split gave every layer to one device: no pipeline.
        struct backend_device d = p->stage[0].dev;
        free(p);
        if ((rc = create_backend(a, &d, be, err)))
            return rc;
        lp.skip_memory_check = true; // the plan checked it
        if ((rc = load_one(a, cfg, f, &d, &lp, *be, m, err))) {
            backend_destroy(*be);
            *be = NULL;
        }
        return rc;
    }
    // Progress: every stage's bytes as one total; the plan checked memory.
    size_t stage_bytes[PLAN_MAX_DEVICES];
    uint64_t grand = 0;
    for (int s = 0; s < p->n_stages; s++) {
        if ((rc = model_load_bytes(f, p->stage[s].l0, p->stage[s].l1, &stage_bytes[s], err)))
            goto fail;
        grand += stage_bytes[s];
    }
    lp.skip_memory_check = true;
    lp.progress_total = grand;
    for (int s = 0; s < p->n_stages; s++) {
        struct pipeline_stage *st = &p->stage[s];
        if ((rc = create_backend(a, &st->dev, &st->be, err))) {
            verr_wrap(err, "stage %d (%s)", s, st->name);
            goto fail;
        }
        lp.l0 = st->l0;
        lp.l1 = st->l1;
        if ((rc = model_load_ex(&st->m, f, st->be, &lp, err))) {
            verr_wrap(err, "stage %d (%s, layers %d-%d)", s, st->name, st->l0, st->l1 - 1);
            goto fail;
        }
        lp.progress_base += stage_bytes[s];
    }
    if ((rc = make_transport(p, err)))
        goto fail;
    size_t len = strlen(p->plan_text);
    snprintf(p->plan_text + len, sizeof p->plan_text - len, "transport: %s\n", p->tp->ops->name);
    *be = p->stage[0].be;
    *m = p->stage[0].m;
    *pipe = p;
    return 0;
fail:
    pipeline_free(p);
    return rc;
}

void pipeline_free(struct pipeline *p) {
    if (!p)
        return;
    if (p->ctl && p->ctl->rank == 0)
        pipeline_mpi_quit(p->ctl);
    for (int s = p->n_stages > 0 ? p->n_stages - 1 : PLAN_MAX_DEVICES - 1; s >= 0; s--) {
        struct pipeline_stage *st = &p->stage[s];
        if (!st->owned)
            continue;
        model_free(st->m);
        backend_destroy(st->be);
    }
    transport_destroy(p->tp);
    if (p->ctl && p->ctl->destroy)
        p->ctl->destroy(p->ctl);
    free(p);
}

// --- contexts ------------------------------------------------------------------

int pipeline_ctx_init(struct pipeline_ctx **out, struct pipeline *p, struct forward_ctx *front,
                      const struct forward_config *cfg, struct verr *err) {
    *out = NULL;
    struct pipeline_ctx *pc = calloc(1, sizeof *pc);
    if (!pc)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    pc->p = p;
    if (p->ctl && p->ctl->rank == 0) {
        // Every rank's stage gets the front's shapes (n_ctx, batch, cache types).
        struct forward_config c = *cfg;
        int rc = pipeline_mpi_bcast_config(p->ctl, &c, err);
        if (rc) {
            free(pc);
            return rc;
        }
    }
    for (int s = 0; s < p->n_stages; s++) {
        struct pipeline_stage *st = &p->stage[s];
        if (st->m == front->m) {
            pc->fc[s] = front;
            pc->front = s;
            continue;
        }
        if (!st->m)
            continue; // another process's stage
        struct forward_ctx *fc = calloc(1, sizeof *fc);
        if (!fc) {
            pipeline_ctx_free(pc);
            return verr_set(err, VERR_NOMEM, "out of host memory");
        }
        int rc = forward_init(fc, st->m, cfg, err);
        if (rc) {
            free(fc);
            pipeline_ctx_free(pc);
            return verr_wrap(err, "stage %d (%s)", s, st->name);
        }
        pc->fc[s] = fc;
    }
    *out = pc;
    return 0;
}

void pipeline_ctx_free(struct pipeline_ctx *pc) {
    if (!pc)
        return;
    for (int s = 0; s < pc->p->n_stages; s++) {
        struct forward_ctx *fc = pc->fc[s];
        if (!fc || s == pc->front)
            continue; // the front: its owner frees it
        forward_free(fc);
        free(fc);
    }
    free(pc);
}

// --- KV bookkeeping ------------------------------------------------------------

void pipeline_kv_follow_range(struct kv_cache *dst, int lo, int hi, const int32_t *pos,
                              const int32_t *delta, const uint64_t *seq, int head, int used,
                              bool has_shift) {
    if (lo < hi) {
        const size_t n = (size_t)(hi - lo), w = (size_t)dst->seq_words;
        memcpy(dst->pos + lo, pos, n * sizeof *pos);
        memcpy(dst->delta + lo, delta, n * sizeof *delta);
        memcpy(dst->seq + (size_t)lo * w, seq, n * w * sizeof *seq);
        if (dst->dirty_lo >= dst->dirty_hi) {
            dst->dirty_lo = lo;
            dst->dirty_hi = hi;
        } else {
            if (lo < dst->dirty_lo)
                dst->dirty_lo = lo;
            if (hi > dst->dirty_hi)
                dst->dirty_hi = hi;
        }
    }
    dst->head = head;
    dst->used = used;
    dst->has_shift = dst->has_shift || has_shift;
}

// Every change to a cell (claim, free, move, sequence set) marks it dirty
// until the next kv_prepare, and deltas are non-zero only on such cells, so
// the dirty range is everything that changed since the last decode.
void pipeline_kv_follow(struct kv_cache *dst, const struct kv_cache *src) {
    const int lo = src->dirty_lo, hi = src->dirty_hi;
    const size_t w = (size_t)src->seq_words;
    pipeline_kv_follow_range(
        dst, lo, hi, src->pos + (lo < hi ? lo : 0), src->delta + (lo < hi ? lo : 0),
        src->seq + (lo < hi ? (size_t)lo * w : 0), src->head, src->used, src->has_shift);
}

// --- decode --------------------------------------------------------------------

static int xfer(struct pipeline *p, int from, const void *src, int to, void *dst, size_t bytes,
                struct verr *err) {
    double t0 = p->timing ? now_ms() : 0;
    int rc = p->tp->ops->xfer(p->tp, from, src, to, dst, bytes, err);
    if (rc)
        return verr_wrap(err, "stage %d -> %d", from, to);
    if (p->timing)
        p->xfer_ms += now_ms() - t0;
    return 0;
}

// Every process runs this for every decode, with the same batch and cells:
// it does the work of its local stages and its side of each transfer.
static int run_stages(struct pipeline_ctx *pc, const struct forward_batch *b, const int32_t *cells,
                      const int32_t *rows, int n_out, bool argmax_only, float *h_logits,
                      int32_t *h_argmax, struct verr *err) {
    struct pipeline *p = pc->p;
    const int S = p->n_stages, last = S - 1, n_tok = b->n_tok;
    struct forward_ctx *any = NULL;
    for (int s = 0; s < S && !any; s++)
        any = pc->fc[s];
    const int E = any->m->hp.n_embd, V = any->m->hp.n_vocab;
    int rc;
    for (int s = 0; s < S; s++)
        if (pc->fc[s] && (rc = forward_stage_upload(pc->fc[s], b, cells, rows, n_out, err)))
            return verr_wrap(err, "stage %d (%s)", s, p->stage[s].name);

    int ub = p->n_ubatch > 0 ? p->n_ubatch : (n_tok + S - 1) / S;
    if (ub < 1)
        ub = 1;
    int r0 = 0; // first output row of the micro-batch
    for (int t0 = 0; t0 < n_tok; t0 += ub) {
        const int n = n_tok - t0 < ub ? n_tok - t0 : ub;
        int r1 = r0;
        while (r1 < n_out && rows[r1] < t0 + n)
            r1++;
        for (int s = 0; s < S; s++) {
            struct forward_ctx *fc = pc->fc[s];
            if (s > 0) {
                struct forward_ctx *prev = pc->fc[s - 1];
                const size_t off = (size_t)t0 * E;
                if ((rc = xfer(p, s - 1, prev ? prev->x + off : NULL, s, fc ? fc->x + off : NULL,
                               (size_t)n * E * sizeof(float), err)))
                    return rc;
            }
            if (!fc)
                continue;
            double ts = p->timing ? now_ms() : 0;
            if ((s == 0 && (rc = forward_stage_embed(fc, t0, n, err))) ||
                (rc = forward_stage_layers(fc, t0, n, err)) ||
                (s == last && r1 > r0 &&
                 (rc = forward_stage_head(fc, r0, r1 - r0, argmax_only, err))))
                return verr_wrap(err, "stage %d (%s)", s, p->stage[s].name);
            if (p->timing) {
                if (fc->be->ops->sync(fc->be))
                    return verr_set(err, VERR_BACKEND, "stage %d (%s): %s", s, p->stage[s].name,
                                    fc->be->err.msg);
                p->stage_ms[s] += now_ms() - ts;
            }
        }
        r0 = r1;
    }

    // Results: the last stage's rows to the host of rank 0.
    struct forward_ctx *fl = pc->fc[last], *f0 = pc->fc[0];
    if (fl && f0) {
        if ((rc = forward_stage_download(fl, n_out, argmax_only, h_logits, h_argmax, err)))
            return verr_wrap(err, "stage %d (%s)", last, p->stage[last].name);
    } else if (n_out > 0) {
        size_t bytes = argmax_only ? (size_t)n_out * sizeof(int32_t)
                                   : (size_t)n_out * (size_t)V * sizeof(float);
        const void *src = fl ? (argmax_only ? (void *)fl->d_argmax : (void *)fl->logits) : NULL;
        void *dst = f0 ? (argmax_only ? (void *)f0->d_argmax : (void *)f0->logits) : NULL;
        if ((rc = xfer(p, last, src, 0, dst, bytes, err)))
            return rc;
        if (f0 && (rc = forward_stage_download(f0, n_out, argmax_only, h_logits, h_argmax, err)))
            return rc;
    }
    for (int s = 0; s < S; s++) {
        struct forward_ctx *fc = pc->fc[s];
        if (fc && fc->be->ops->sync(fc->be))
            return verr_set(err, VERR_BACKEND, "stage %d (%s): %s", s, p->stage[s].name,
                            fc->be->err.msg);
    }
    p->n_decodes++;
    return 0;
}

int pipeline_decode(struct pipeline_ctx *pc, const struct forward_batch *b, int n_out,
                    bool argmax_only, struct verr *err) {
    struct pipeline *p = pc->p;
    struct forward_ctx *front = pc->fc[0];
    if (!front)
        return verr_set(err, VERR_RANGE, "pipeline: decodes are driven by rank 0");
    for (int s = 1; s < p->n_stages; s++)
        if (pc->fc[s]) {
            struct kv_cache *ks = &pc->fc[s]->kv;
            if (ks->n_clears != front->kv.n_clears) {
                // The front was cleared since this stage's last decode: its K/V
                // must be zeroed too (kv_clear's contract), not only its cells.
                int rc = kv_clear(ks, err);
                if (rc)
                    return verr_wrap(err, "stage %d (%s): clearing the cache", s, p->stage[s].name);
                ks->n_clears = front->kv.n_clears;
            }
            pipeline_kv_follow(ks, &front->kv);
            pc->fc[s]->sp = front->sp; // the head stage samples with the front's rows
        }
    if (p->ctl) {
        int rc = pipeline_mpi_send_decode(p->ctl, b, front->h_cells, front->h_rows, n_out,
                                          argmax_only, &front->kv, err);
        if (rc)
            return rc;
    }
    int rc = run_stages(pc, b, front->h_cells, front->h_rows, n_out, argmax_only, front->h_logits,
                        front->h_argmax, err);
    for (int s = 1; s < p->n_stages; s++)
        if (pc->fc[s])
            pc->fc[s]->sp = NULL;
    return rc;
}

int pipeline_serve(struct pipeline_ctx *pc, struct verr *err) {
    struct pipeline *p = pc->p;
    if (!p->ctl)
        return verr_set(err, VERR_RANGE, "pipeline_serve: not a multi-process pipeline");
    struct forward_ctx *mine = NULL;
    for (int s = 0; s < p->n_stages && !mine; s++)
        mine = pc->fc[s];
    if (!mine)
        return verr_set(err, VERR_RANGE, "pipeline_serve: no local stage");
    for (;;) {
        struct pipeline_mpi_decode d;
        int rc = pipeline_mpi_recv_decode(p->ctl, &mine->kv, &d, err);
        if (rc)
            return rc;
        if (d.quit)
            return 0;
        struct forward_batch b = {d.n_tok, d.token, d.pos, d.seq, NULL, d.se};
        rc = run_stages(pc, &b, d.cells, d.rows, d.n_out, d.argmax_only, NULL, NULL, err);
        pipeline_mpi_decode_free(&d);
        if (rc)
            return rc;
    }
}
