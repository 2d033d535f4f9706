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
    // With experts: gate and up are the shared expert's, plus the routing's own.
    const size_t n_ff = hp.n_expert > 0 ? (size_t)hp.n_ff_shexp : (size_t)hp.n_ff;
    size_t scratch = nb * fl * (3 * (size_t)hp.n_embd + n_q + n_k + n_v + n_o + 2 * n_ff) +
                     forward_moe_scratch_bytes(&hp, nb) + nb * 4 * sizeof(int32_t) +
                     nc * (2 * sizeof(int32_t) + seq_words * 8);
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

// Under mpirun: every rank plans the same split (rank 0's) and loads its own
// stage; the other stages are remote (be and m NULL).
static int load_ranks(struct pipeline_ctl *ctl, const struct load_config *a,
                      const struct forward_config *cfg, const struct gguf_file *f,
                      struct pipeline **pipe, struct verr *err) {
    const int n = ctl->n_ranks, me = ctl->rank;
    int rc;
    if (n > PLAN_MAX_DEVICES) {
        rc = verr_set(err, VERR_RANGE, "mpirun: %d ranks (at most %d stages)", n, PLAN_MAX_DEVICES);
        ctl->destroy(ctl);
        return rc;
    }
    struct pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        ctl->destroy(ctl);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    p->ctl = ctl;
    p->n_ubatch = a->n_ubatch;

    uint64_t kinds[PLAN_MAX_DEVICES], frees[PLAN_MAX_DEVICES];
    if ((rc = pipeline_mpi_gather_devices(ctl, a, kinds, frees, err)))
        goto fail;
    struct backend_device devs[PLAN_MAX_DEVICES];
    size_t free_bytes[PLAN_MAX_DEVICES];
    for (int r = 0; r < n; r++) {
        devs[r].kind = (enum backend_device_kind)(kinds[r] >> 32);
        devs[r].ordinal = (int)(uint32_t)kinds[r];
        free_bytes[r] = (size_t)frees[r];
    }
    // Rank 0 plans (its n_ctx is the engine's); every rank loads what it says.
    int32_t plan_rc = 0;
    char msg[sizeof err->msg] = {0};
    if (me == 0) {
        struct verr perr = {0};
        plan_rc = pipeline_plan(a, cfg, f, devs, n, free_bytes, &p->plan, p->plan_text,
                                sizeof p->plan_text, &perr);
        if (!plan_rc && p->plan.n_stages != n)
            plan_rc = verr_set(&perr, VERR_RANGE,
                               "mpirun: %d ranks but the split has %d stages: every rank needs "
                               "layers (no 0 in --tensor-split)",
                               n, p->plan.n_stages);
        memcpy(msg, perr.msg, sizeof msg);
    }
    if ((rc = ctl->bcast(ctl, &plan_rc, sizeof plan_rc, err)) ||
        (rc = ctl->bcast(ctl, msg, sizeof msg, err)) ||
        (rc = ctl->bcast(ctl, &p->plan, sizeof p->plan, err)) ||
        (rc = ctl->bcast(ctl, p->plan_text, sizeof p->plan_text, err)))
        goto fail;
    if (plan_rc) {
        rc = verr_set(err, plan_rc, "%s", msg);
        goto fail;
    }
    p->n_stages = n;
    for (int s = 0; s < n; s++) {
        struct pipeline_stage *st = &p->stage[s];
        st->dev = devs[s];
        char dn[24];
        backend_device_name(&devs[s], dn, sizeof dn);
        snprintf(st->name, sizeof st->name, "rank%d:%s", s, dn);
        st->l0 = p->plan.stage[s].l0;
        st->l1 = p->plan.stage[s].l1;
    }
    struct pipeline_stage *st = &p->stage[me];
    rc = backend_create_device(&st->dev, &a->be, &st->be, err);
    if (rc || (rc = model_load_layers(&st->m, f, st->be, st->l0, st->l1, err))) {
        verr_wrap(err, "rank %d (%s)", me, st->name);
        goto fail;
    }
    struct backend *bes[PLAN_MAX_DEVICES] = {0};
    bes[me] = st->be;
    bool all_cuda = true;
    for (int s = 0; s < n; s++)
        all_cuda &= devs[s].kind == BACKEND_DEVICE_CUDA;
    if (all_cuda) {
        unsigned char id[TRANSPORT_NCCL_ID_BYTES] = {0};
        if (me == 0 && (rc = transport_nccl_unique_id(id, err)))
            goto fail;
        if ((rc = ctl->bcast(ctl, id, sizeof id, err)) ||
            (rc = transport_nccl_create(&p->tp, bes, n, id, me, err)))
            goto fail;
    } else if ((rc = transport_mpi_create(&p->tp, ctl, bes, n, err))) {
        goto fail;
    }
    size_t len = strlen(p->plan_text);
    snprintf(p->plan_text + len, sizeof p->plan_text - len, "transport: %s, %d processes\n",
             p->tp->ops->name, n);
    st->owned = true;
    *pipe = p;
    return 0;
fail:
    if (p->stage[me].m)
        model_free(p->stage[me].m);
    backend_destroy(p->stage[me].be);
    p->stage[me].m = NULL;
    p->stage[me].be = NULL;
    p->ctl = NULL;
    pipeline_free(p);
    ctl->destroy(ctl);
    return rc;
}

// A pipeline of one stage over be and m (owned or not).
static int pipeline_one(struct pipeline **out, const struct backend_device *d, struct backend *be,
                        struct model *m, bool own, struct verr *err) {
    struct pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    p->n_stages = 1;
    struct pipeline_stage *st = &p->stage[0];
    st->dev = *d;
    backend_device_name(&st->dev, st->name, sizeof st->name);
    st->l0 = m->layer_begin;
    st->l1 = m->layer_end;
    st->be = be;
    st->m = m;
    st->owned = own;
    *out = p;
    return 0;
}

int pipeline_wrap(struct pipeline **out, struct backend *be, struct model *m, bool own,
                  struct verr *err) {
    *out = NULL;
    struct backend_device d = {BACKEND_DEVICE_CPU, 0};
    if (be->device >= 0)
        d = (struct backend_device){BACKEND_DEVICE_CUDA, be->device};
    int rc = pipeline_one(out, &d, be, m, own, err);
    if (rc && own) {
        model_free(m);
        backend_destroy(be);
    }
    return rc;
}

// One device: its backend and the model, with the memory check unless the
// plan made it.
static int load_one_device(const struct load_config *a, const struct forward_config *cfg,
                           const struct gguf_file *f, const struct backend_device *d, bool auto_be,
                           struct model_load_params *lp, struct pipeline **out, struct verr *err) {
    struct backend *be = NULL;
    struct model *m = NULL;
    int rc;
    if (auto_be)
        rc = create_backend_auto(a, &be, err);
    else if ((rc = create_backend(a, d, &be, err)) && a->devices)
        verr_wrap(err, "--devices");
    if (rc)
        return rc;
    struct backend_device used = *d;
    if (auto_be)
        used = be->device >= 0 ? (struct backend_device){BACKEND_DEVICE_CUDA, be->device}
                               : (struct backend_device){BACKEND_DEVICE_CPU, 0};
    if ((rc = load_one(a, cfg, f, &used, lp, be, &m, err)) ||
        (rc = pipeline_one(out, &used, be, m, true, err))) {
        model_free(m);
        backend_destroy(be);
    }
    return rc;
}

int pipeline_load(const struct load_config *lc, const struct forward_config *cfg,
                  const struct gguf_file *f, struct pipeline **pipe, struct verr *err) {
    return pipeline_load_ex(lc, cfg, f, NULL, NULL, pipe, err);
}

int pipeline_load_ex(const struct load_config *a, const struct forward_config *cfg,
                     const struct gguf_file *f, model_progress_fn progress, void *progress_user,
                     struct pipeline **pipe, struct verr *err) {
    *pipe = NULL;
    struct pipeline_ctl *ctl = NULL;
    int rc = pipeline_mpi_ctl_create(&ctl, err);
    if (rc)
        return rc;
    if (ctl)
        return load_ranks(ctl, a, cfg, f, pipe, err);

    struct backend_device devs[PLAN_MAX_DEVICES];
    int n = 0;
    if ((rc = pipeline_resolve_devices(a, devs, &n, err)))
        return rc;
    struct model_load_params lp;
    model_load_params_default(&lp);
    lp.progress = progress;
    lp.progress_user = progress_user;
    if (n == 1)
        return load_one_device(a, cfg, f, &devs[0], !a->devices, &lp, pipe, err);

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
        // --tensor-split gave every layer to one device.
        struct backend_device d = p->stage[0].dev;
        free(p);
        lp.skip_memory_check = true; // the plan checked it
        return load_one_device(a, cfg, f, &d, false, &lp, pipe, err);
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

int pipeline_ctx_init(struct pipeline_ctx **out, struct pipeline *p,
                      const struct forward_config *cfg, struct verr *err) {
    *out = NULL;
    struct pipeline_ctx *pc = calloc(1, sizeof *pc);
    if (!pc)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    pc->p = p;
    pc->front = -1;
    for (int s = 0; s < p->n_stages; s++) {
        struct pipeline_stage *st = &p->stage[s];
        if (!st->m)
            continue; // another process's stage
        struct forward_ctx *fc = calloc(1, sizeof *fc);
        if (!fc) {
            pipeline_ctx_free(pc);
            return verr_set(err, VERR_NOMEM, "out of host memory");
        }
        // Rank 0's stage receives the head's results from another process.
        const bool receives = pc->front < 0 && p->ctl && s < p->n_stages - 1;
        int rc =
            receives ? forward_init_front(fc, st->m, cfg, err) : forward_init(fc, st->m, cfg, err);
        if (rc) {
            free(fc);
            pipeline_ctx_free(pc);
            return p->n_stages > 1 ? verr_wrap(err, "stage %d (%s)", s, st->name) : rc;
        }
        pc->fc[s] = fc;
        if (pc->front < 0)
            pc->front = s;
    }
    // Every row LOGITS: what a decode without `how` asks for.
    int rc = 0;
    if (pc->front < 0)
        rc = verr_set(err, VERR_RANGE, "pipeline: no stage in this process");
    else if (!(pc->how_logits = calloc((size_t)pc->fc[pc->front]->cfg.n_outputs_max, 1)))
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
    if (rc) {
        pipeline_ctx_free(pc);
        return rc;
    }
    *out = pc;
    return 0;
}

void pipeline_ctx_free(struct pipeline_ctx *pc) {
    if (!pc)
        return;
    for (int s = 0; s < pc->p->n_stages; s++) {
        if (pc->fc[s])
            forward_free(pc->fc[s]);
        free(pc->fc[s]);
    }
    free(pc->how_logits);
    free(pc);
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

static int stage_fail(const struct pipeline *p, int s, int rc, struct verr *err) {
    return p->n_stages > 1 ? verr_wrap(err, "stage %d (%s)", s, p->stage[s].name) : rc;
}

// One micro-batch through every stage: the hidden state in from the stage
// before, the stage's part, and (timing) its wall time.
static int run_micro(struct pipeline_ctx *pc, const struct forward_part *part, const uint8_t *how,
                     const struct sample_params *sp, struct verr *err) {
    struct pipeline *p = pc->p;
    const int S = p->n_stages;
    int rc;
    for (int s = 0; s < S; s++) {
        struct forward_ctx *fc = pc->fc[s];
        if (s > 0) {
            struct forward_ctx *prev = pc->fc[s - 1];
            const size_t E = (size_t)pc->fc[pc->front]->m->hp.n_embd;
            const size_t off = (size_t)part->t0 * E;
            if ((rc = xfer(p, s - 1, prev ? prev->x + off : NULL, s, fc ? fc->x + off : NULL,
                           (size_t)part->n * E * sizeof(float), err)))
                return rc;
        }
        if (!fc)
            continue;
        struct forward_part pt = *part;
        pt.embed = s == 0;
        pt.head = s == S - 1;
        double ts = p->timing ? now_ms() : 0;
        if ((rc = forward_stage_run(fc, &pt, how, sp, err)))
            return stage_fail(p, s, rc, err);
        if (p->timing) {
            if (fc->be->ops->sync(fc->be))
                return verr_set(err, VERR_BACKEND, "stage %d (%s): %s", s, p->stage[s].name,
                                fc->be->err.msg);
            p->stage_ms[s] += now_ms() - ts;
        }
    }
    return 0;
}

// The last stage's results to the host of the front (rank 0).
static int run_results(struct pipeline_ctx *pc, int n_out, const uint8_t *how, float *h_logits,
                       int32_t *h_ids, struct verr *err) {
    struct pipeline *p = pc->p;
    const int last = p->n_stages - 1;
    struct forward_ctx *fl = pc->fc[last], *f0 = pc->fc[0];
    int rc;
    if (fl && f0) {
        if ((rc = forward_stage_download(fl, n_out, how, h_logits, h_ids, err)))
            return stage_fail(p, last, rc, err);
        return 0;
    }
    if (n_out == 0)
        return 0;
    bool any_logits = false, any_ids = false;
    for (int r = 0; r < n_out; r++) {
        any_logits |= how[r] == FORWARD_ROW_LOGITS;
        any_ids |= how[r] != FORWARD_ROW_LOGITS;
    }
    const size_t V = (size_t)pc->fc[pc->front]->m->hp.n_vocab;
    if (any_logits && (rc = xfer(p, last, fl ? fl->logits : NULL, 0, f0 ? f0->logits : NULL,
                                 (size_t)n_out * V * sizeof(float), err)))
        return rc;
    if (any_ids && (rc = xfer(p, last, fl ? fl->d_argmax : NULL, 0, f0 ? f0->d_argmax : NULL,
                              (size_t)n_out * sizeof(int32_t), err)))
        return rc;
    if (f0 && (rc = forward_stage_download(f0, n_out, how, h_logits, h_ids, err)))
        return rc;
    return 0;
}

// The driver: every process runs this for every decode, with the same batch,
// cells and rows; it does the work of its local stages and its side of each
// transfer. A decode's batch is cut into micro-batches of n_ubatch tokens
// (default ceil(n_tok / n_stages)); micro-batch k+1 is enqueued on stage s
// right after micro-batch k was handed to stage s+1.
static int run_stages(struct pipeline_ctx *pc, const struct forward_batch *b, const int32_t *cells,
                      const int32_t *rows, int n_out, const uint8_t *how,
                      const struct sample_params *sp, float *h_logits, int32_t *h_ids,
                      struct verr *err) {
    struct pipeline *p = pc->p;
    const int S = p->n_stages, n_tok = b->n_tok;
    int rc;
    for (int s = 0; s < S; s++)
        if (pc->fc[s] && (rc = forward_stage_upload(pc->fc[s], b, cells, rows, n_out, err)))
            return stage_fail(p, s, rc, err);
    int ub = p->n_ubatch > 0 ? p->n_ubatch : (n_tok + S - 1) / S;
    if (ub < 1)
        ub = 1;
    struct forward_part part = {0};
    for (int t0 = 0; t0 < n_tok; t0 += ub) {
        part.t0 = t0;
        part.n = n_tok - t0 < ub ? n_tok - t0 : ub;
        part.r0 += part.nr;
        part.nr = 0;
        while (part.r0 + part.nr < n_out && rows[part.r0 + part.nr] < t0 + part.n)
            part.nr++;
        if ((rc = run_micro(pc, &part, how, sp, err)))
            return rc;
    }
    if ((rc = run_results(pc, n_out, how, h_logits, h_ids, err)))
        return rc;
    for (int s = 0; s < S; s++) {
        struct forward_ctx *fc = pc->fc[s];
        if (fc && fc->be->ops->sync(fc->be))
            return verr_set(err, VERR_BACKEND, "stage %d (%s): %s", s, p->stage[s].name,
                            fc->be->err.msg);
    }
    p->n_decodes++;
    return 0;
}

// Every other stage's cache takes the front's bookkeeping (after a clear of
// the front, its K/V are zeroed too: kv_clear's contract).
static int follow_front(struct pipeline_ctx *pc, struct verr *err) {
    struct pipeline *p = pc->p;
    struct forward_ctx *front = pc->fc[pc->front];
    for (int s = 0; s < p->n_stages; s++) {
        if (!pc->fc[s] || s == pc->front)
            continue;
        struct kv_cache *ks = &pc->fc[s]->kv;
        if (ks->n_clears != front->kv.n_clears) {
            int rc = kv_clear(ks, err);
            if (rc)
                return verr_wrap(err, "stage %d (%s): clearing the cache", s, p->stage[s].name);
            ks->n_clears = front->kv.n_clears;
        }
        kv_follow(ks, &front->kv);
    }
    return 0;
}

int pipeline_decode(struct pipeline_ctx *pc, const struct forward_batch *b, const uint8_t *how,
                    const struct sample_params *sp, struct verr *err) {
    struct pipeline *p = pc->p;
    struct forward_ctx *front = pc->front == 0 ? pc->fc[0] : NULL;
    if (!front)
        return verr_set(err, VERR_RANGE, "pipeline: decodes are driven by rank 0");
    int n_out = 0;
    int rc = forward_batch_begin(front, b, &n_out, err);
    if (rc)
        return rc;
    for (int r = 0; r < n_out && !rc; r++) {
        const int h = how ? how[r] : FORWARD_ROW_LOGITS;
        if (h == FORWARD_ROW_SAMPLE && p->ctl)
            rc = verr_set(err, VERR_UNSUPPORTED,
                          "pipeline: sampling on the backend with the head in another process");
        else if (h == FORWARD_ROW_SAMPLE && !sp)
            rc = verr_set(err, VERR_RANGE, "pipeline: row %d is sampled but has no sample_params",
                          r);
        else if (h < FORWARD_ROW_LOGITS || h > FORWARD_ROW_SAMPLE)
            rc = verr_set(err, VERR_RANGE, "pipeline: row %d: unknown result kind %d", r, h);
    }
    if (!how)
        how = pc->how_logits;
    if (!rc)
        rc = follow_front(pc, err);
    if (!rc && p->ctl)
        rc = pipeline_mpi_send_decode(p->ctl, b, front->h_cells, front->h_rows, n_out, how,
                                      &front->kv, err);
    if (!rc)
        rc = run_stages(pc, b, front->h_cells, front->h_rows, n_out, how, sp, front->h_logits,
                        front->h_argmax, err);
    if (rc) {
        forward_batch_undo(front, b);
        return rc;
    }
    front->n_out = n_out;
    return 0;
}

int pipeline_serve(struct pipeline_ctx *pc, struct verr *err) {
    struct pipeline *p = pc->p;
    if (!p->ctl)
        return verr_set(err, VERR_RANGE, "pipeline_serve: not a multi-process pipeline");
    if (pc->front < 0)
        return verr_set(err, VERR_RANGE, "pipeline_serve: no local stage");
    struct forward_ctx *mine = pc->fc[pc->front];
    for (;;) {
        struct pipeline_mpi_decode d;
        int rc = pipeline_mpi_recv_decode(p->ctl, &mine->kv, &d, err);
        if (rc)
            return rc;
        if (d.quit)
            return 0;
        struct forward_batch b = {d.n_tok, d.token, d.pos, d.seq, NULL, d.se};
        rc = run_stages(pc, &b, d.cells, d.rows, d.n_out, d.how, NULL, NULL, NULL, err);
        pipeline_mpi_decode_free(&d);
        if (rc)
            return rc;
    }
}
