// One stage per process under mpirun (see mpi.h).
#include "host/split/mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef VELA_HAVE_MPI
#include <mpi.h>
#endif

// The launcher's environment: OpenMPI sets OMPI_COMM_WORLD_*, PMI-based
// launchers (MPICH, Slurm) PMI_*.
static int env_int(const char *a, const char *b, int def) {
    const char *v = getenv(a);
    if (!v && b)
        v = getenv(b);
    return v ? atoi(v) : def;
}

static bool under_mpirun(void) {
    return env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1) > 1;
}

// --- decode messages (any control channel) -------------------------------------

enum { MSG_DECODE = 1, MSG_QUIT = 2 };

struct msg_hdr {
    int32_t kind, n_tok, n_out;
    int32_t lo, hi, head, used, has_shift, seq_words;
    int32_t has_se;    // the batch's per-token self-extend values follow its seq ids
    uint32_t n_clears; // rank 0's kv.n_clears (mod 2^32): a rank behind clears its K/V first
};

int pipeline_mpi_bcast_config(struct pipeline_ctl *ctl, struct forward_config *cfg,
                              struct verr *err) {
    // Plain data but for the rope factors pointer, which never crosses.
    return ctl->bcast(ctl, cfg, sizeof *cfg, err);
}

int pipeline_mpi_send_decode(struct pipeline_ctl *ctl, const struct forward_batch *b,
                             const int32_t *cells, const int32_t *rows, int n_out,
                             const uint8_t *how, const struct kv_cache *kv, struct verr *err) {
    const int lo = kv->dirty_lo < kv->dirty_hi ? kv->dirty_lo : 0;
    const int hi = kv->dirty_lo < kv->dirty_hi ? kv->dirty_hi : 0;
    struct msg_hdr h = {.kind = MSG_DECODE,
                        .n_tok = b->n_tok,
                        .n_out = n_out,
                        .lo = lo,
                        .hi = hi,
                        .head = kv->head,
                        .used = kv->used,
                        .has_shift = kv->has_shift,
                        .seq_words = kv->seq_words,
                        .has_se = b->se != NULL,
                        .n_clears = (uint32_t)kv->n_clears};
    const size_t nt = (size_t)b->n_tok * sizeof(int32_t), nc = (size_t)(hi - lo);
    int rc;
    if ((rc = ctl->bcast(ctl, &h, sizeof h, err)) ||
        (rc = ctl->bcast(ctl, (void *)b->token, nt, err)) ||
        (rc = ctl->bcast(ctl, (void *)b->pos, nt, err)) ||
        (rc = ctl->bcast(ctl, (void *)b->seq, nt, err)) ||
        (b->se && (rc = ctl->bcast(ctl, (void *)b->se, 2 * nt, err))) ||
        (rc = ctl->bcast(ctl, (void *)cells, nt, err)) ||
        (rc = ctl->bcast(ctl, (void *)rows, (size_t)n_out * sizeof(int32_t), err)) ||
        (rc = ctl->bcast(ctl, (void *)how, (size_t)n_out, err)) ||
        (rc = ctl->bcast(ctl, kv->pos + lo, nc * sizeof(int32_t), err)) ||
        (rc = ctl->bcast(ctl, kv->delta + lo, nc * sizeof(int32_t), err)) ||
        (rc = ctl->bcast(ctl, kv->seq + (size_t)lo * kv->seq_words,
                         nc * (size_t)kv->seq_words * sizeof(uint64_t), err)))
        return rc;
    return 0;
}

void pipeline_mpi_decode_free(struct pipeline_mpi_decode *d) {
    free(d->token);
    free(d->pos);
    free(d->seq);
    free(d->cells);
    free(d->rows);
    free(d->how);
    free(d->se);
    memset(d, 0, sizeof *d);
}

int pipeline_mpi_recv_decode(struct pipeline_ctl *ctl, struct kv_cache *kv,
                             struct pipeline_mpi_decode *d, struct verr *err) {
    memset(d, 0, sizeof *d);
    struct msg_hdr h;
    int rc = ctl->bcast(ctl, &h, sizeof h, err);
    if (rc)
        return rc;
    if (h.kind == MSG_QUIT) {
        d->quit = true;
        return 0;
    }
    if (h.kind != MSG_DECODE || h.n_tok < 1 || h.n_out < 0 || h.lo < 0 || h.hi < h.lo ||
        h.hi > kv->cfg.n_ctx || h.seq_words != kv->seq_words)
        return verr_set(err, VERR_FORMAT, "pipeline: bad message from rank 0 (kind %d)", h.kind);
    if (h.n_clears != (uint32_t)kv->n_clears) {
        // rank 0 cleared its cache since this rank's last decode: zero this
        // stage's K/V too (kv_clear's contract), before its cells follow.
        if ((rc = kv_clear(kv, err)))
            return verr_wrap(err, "clearing this rank's cache");
        kv->n_clears = h.n_clears;
    }
    const size_t nt = (size_t)h.n_tok, nc = (size_t)(h.hi - h.lo);
    d->n_tok = h.n_tok;
    d->n_out = h.n_out;
    d->token = malloc(nt * 4);
    d->pos = malloc(nt * 4);
    d->seq = malloc(nt * 4);
    d->cells = malloc(nt * 4);
    d->rows = malloc((size_t)(h.n_out + 1) * 4);
    d->how = malloc((size_t)h.n_out + 1);
    d->se = h.has_se ? malloc(nt * 8) : NULL;
    int32_t *pos = malloc((nc + 1) * 4), *delta = malloc((nc + 1) * 4);
    uint64_t *seq = malloc((nc * (size_t)h.seq_words + 1) * 8);
    if (!d->token || !d->pos || !d->seq || !d->cells || !d->rows || !d->how || !pos || !delta ||
        !seq || (h.has_se && !d->se)) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    if ((rc = ctl->bcast(ctl, d->token, nt * 4, err)) ||
        (rc = ctl->bcast(ctl, d->pos, nt * 4, err)) ||
        (rc = ctl->bcast(ctl, d->seq, nt * 4, err)) ||
        (d->se && (rc = ctl->bcast(ctl, d->se, nt * 8, err))) ||
        (rc = ctl->bcast(ctl, d->cells, nt * 4, err)) ||
        (rc = ctl->bcast(ctl, d->rows, (size_t)h.n_out * 4, err)) ||
        (rc = ctl->bcast(ctl, d->how, (size_t)h.n_out, err)) ||
        (rc = ctl->bcast(ctl, pos, nc * 4, err)) || (rc = ctl->bcast(ctl, delta, nc * 4, err)) ||
        (rc = ctl->bcast(ctl, seq, nc * (size_t)h.seq_words * 8, err)))
        goto out;
    kv_follow_range(kv, h.lo, h.hi, pos, delta, seq, h.head, h.used, h.has_shift != 0);
out:
    free(pos);
    free(delta);
    free(seq);
    if (rc)
        pipeline_mpi_decode_free(d);
    return rc;
}

void pipeline_mpi_quit(struct pipeline_ctl *ctl) {
    struct msg_hdr h = {0};
    h.kind = MSG_QUIT;
    (void)ctl->bcast(ctl, &h, sizeof h, NULL);
}

#ifdef VELA_HAVE_MPI

// --- MPI control channel ------------------------------------------------------------

// MPI counts are int: big buffers go in pieces.
#define MPI_CHUNK ((size_t)1 << 30)

static int mpi_fail(struct verr *err, int code, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    return verr_set(err, VERR_BACKEND, "MPI: %s: %.*s", what, len, msg);
}

static int mpi_bcast(struct pipeline_ctl *c, void *buf, size_t bytes, struct verr *err) {
    for (size_t off = 0; off < bytes; off += MPI_CHUNK) {
        size_t n = bytes - off < MPI_CHUNK ? bytes - off : MPI_CHUNK;
        int rc = MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, "broadcast");
    }
    return 0;
}

static int mpi_allgather(struct pipeline_ctl *c, uint64_t v, uint64_t *out, struct verr *err) {
    int rc = MPI_Allgather(&v, 1, MPI_UINT64_T, out, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "allgather");
}

static void mpi_destroy(struct pipeline_ctl *c) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
    free(c);
}

int pipeline_mpi_ctl_create(struct pipeline_ctl **out, struct verr *err) {
    *out = NULL;
    if (!under_mpirun())
        return 0;
    int init = 0;
    MPI_Initialized(&init);
    if (!init && MPI_Init(NULL, NULL) != MPI_SUCCESS)
        return verr_set(err, VERR_BACKEND, "MPI_Init failed");
    struct pipeline_ctl *c = calloc(1, sizeof *c);
    if (!c)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->n_ranks);
    c->bcast = mpi_bcast;
    c->allgather = mpi_allgather;
    c->destroy = mpi_destroy;
    *out = c;
    return 0;
}

// --- MPI transport (host buffers) ---------------------------------------------------

struct mpi_tp {
    struct pipeline_ctl *ctl;
    void *staging;
    size_t cap;
};

static int mpi_xfer(struct transport *t, int from, const void *src, int to, void *dst, size_t bytes,
                    struct verr *err) {
    struct mpi_tp *m = t->impl;
    const int me = m->ctl->rank; // rank r holds stage r
    if ((from != me && to != me) || bytes == 0)
        return 0;
    if (m->cap < bytes) {
        void *p = realloc(m->staging, bytes);
        if (!p)
            return verr_set(err, VERR_NOMEM, "transport: no host memory for %zu bytes", bytes);
        m->staging = p;
        m->cap = bytes;
    }
    struct backend *be = t->be[me];
    if (from == me) {
        if (be->ops->download(be, m->staging, src, bytes) || be->ops->sync(be))
            return verr_set(err, VERR_BACKEND, "transport: stage %d: %s", me, be->err.msg);
        for (size_t off = 0; off < bytes; off += MPI_CHUNK) {
            size_t n = bytes - off < MPI_CHUNK ? bytes - off : MPI_CHUNK;
            int rc = MPI_Send((char *)m->staging + off, (int)n, MPI_BYTE, to, 7, MPI_COMM_WORLD);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, rc, "send");
        }
    } else {
        for (size_t off = 0; off < bytes; off += MPI_CHUNK) {
            size_t n = bytes - off < MPI_CHUNK ? bytes - off : MPI_CHUNK;
            int rc = MPI_Recv((char *)m->staging + off, (int)n, MPI_BYTE, from, 7, MPI_COMM_WORLD,
                              MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, rc, "receive");
        }
        if (be->ops->upload(be, dst, m->staging, bytes))
            return verr_set(err, VERR_BACKEND, "transport: stage %d: %s", me, be->err.msg);
    }
    return 0;
}

static void mpi_tp_destroy(struct transport *t) {
    struct mpi_tp *m = t->impl;
    if (m)
        free(m->staging);
    free(m);
    free(t);
}

static const struct transport_ops mpi_tp_ops = {
    .name = "mpi",
    .xfer = mpi_xfer,
    .destroy = mpi_tp_destroy,
};

int transport_mpi_create(struct transport **out, struct pipeline_ctl *ctl,
                         struct backend *const *be, int n, struct verr *err) {
    *out = NULL;
    struct transport *t = calloc(1, sizeof *t);
    struct mpi_tp *m = calloc(1, sizeof *m);
    if (!t || !m) {
        free(t);
        free(m);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    for (int s = 0; s < n; s++)
        t->be[s] = be[s];
    m->ctl = ctl;
    t->ops = &mpi_tp_ops;
    t->n_stages = n;
    t->impl = m;
    *out = t;
    return 0;
}

#else // !VELA_HAVE_MPI

int pipeline_mpi_ctl_create(struct pipeline_ctl **out, struct verr *err) {
    *out = NULL;
    if (under_mpirun())
        return verr_set(err, VERR_UNSUPPORTED,
                        "started by mpirun, but vela was built without MPI (install "
                        "libopenmpi-dev and rebuild)");
    return 0;
}

int transport_mpi_create(struct transport **out, struct pipeline_ctl *ctl,
                         struct backend *const *be, int n, struct verr *err) {
    *out = NULL;
    return verr_set(err, VERR_UNSUPPORTED, "vela was built without MPI");
}

#endif

// --- loading one rank's stage -------------------------------------------------------

int pipeline_mpi_gather_devices(struct pipeline_ctl *ctl, const struct load_config *a,
                                uint64_t *kinds, uint64_t *frees, struct verr *err) {
    const int n = ctl->n_ranks, me = ctl->rank;
    struct backend_device list[PLAN_MAX_DEVICES], mine = {BACKEND_DEVICE_CPU, 0};
    int n_list = 0, rc;
    const int n_cuda = backend_cuda_device_count();
    if (a->devices) {
        if ((rc = plan_parse_devices(a->devices, list, PLAN_MAX_DEVICES, &n_list, err)))
            return rc;
        if (n_list != n && n_list != 1)
            return verr_set(err, VERR_RANGE, "--devices lists %d devices for %d MPI ranks", n_list,
                            n);
        mine = list[n_list == 1 ? 0 : me];
    } else if (a->backend != LOAD_BACKEND_CPU && n_cuda > 0) {
        mine.kind = BACKEND_DEVICE_CUDA;
        mine.ordinal = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", me) % n_cuda;
    }
    struct verr local = {0};
    size_t fr = 0, total = 0;
    int lrc = plan_check_devices(&mine, 1, n_cuda, backend_cuda_built(), &local);
    if (!lrc)
        lrc = backend_device_memory(&mine, &fr, &total, &local);
    uint64_t oks[PLAN_MAX_DEVICES];
    if ((rc =
             ctl->allgather(ctl, (uint64_t)mine.kind << 32 | (uint32_t)mine.ordinal, kinds, err)) ||
        (rc = ctl->allgather(ctl, fr, frees, err)) ||
        (rc = ctl->allgather(ctl, lrc ? 1 : 0, oks, err)))
        return rc;
    for (int r = 0; r < n; r++)
        if (oks[r])
            return lrc ? verr_set(err, lrc, "rank %d: %s", me, local.msg)
                       : verr_set(err, VERR_NOTFOUND, "rank %d cannot use its device", r);
    return 0;
}

// --- ranks other than 0 ----------------------------------------------------------

bool pipeline_mpi_is_worker(void) {
    return under_mpirun() && env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0) != 0;
}
