// NCCL transport between stages on distinct GPUs (host/ops/transport.h), and the
// free-memory query the split plan uses. Plain C against the CUDA runtime
// and NCCL C APIs; compiled in every CUDA build, the NCCL part only where
// CMake found libnccl (VELA_HAVE_NCCL).
//
// Ordering: ncclSend is enqueued on the sending stage's stream and ncclRecv
// on the receiving stage's, so the transfer starts after the sender's
// enqueued layers and the receiver's next layers wait for it, without the
// host waiting. In one process both halves go in one ncclGroupStart/End
// (one thread driving several GPUs must group them, or it deadlocks).
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "host/ops/transport.h"

int backend_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes, struct verr *err) {
    *free_bytes = *total_bytes = 0;
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess)
        e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(free_bytes, total_bytes);
    (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return verr_set(err, VERR_NOTFOUND, "CUDA device %d: cudaMemGetInfo: %s (%s:%d)", device,
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    return 0;
}

#ifdef VELA_HAVE_NCCL
#include <nccl.h>

_Static_assert(sizeof(ncclUniqueId) == TRANSPORT_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");

struct nccl_tp {
    ncclComm_t comm[TRANSPORT_MAX_STAGES]; // [n_stages]; NULL where the stage is remote
    int n_local;
};

#define NCCL_TRY(err, call)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return verr_set(err, VERR_BACKEND, "NCCL: %s: %s (%s:%d)", #call,                      \
                            ncclGetErrorString(r_), __FILE__, __LINE__);                           \
    } while (0)

static int nccl_xfer(struct transport *t, int from, const void *src, int to, void *dst,
                     size_t bytes, struct verr *err) {
    struct nccl_tp *n = t->impl;
    const bool send = n->comm[from] != NULL, recv = n->comm[to] != NULL;
    if ((!send && !recv) || bytes == 0)
        return 0;
    NCCL_TRY(err, ncclGroupStart());
    if (send) {
        cudaStream_t st = (cudaStream_t)backend_cuda_stream(t->be[from]);
        ncclResult_t r = ncclSend(src, bytes, ncclChar, to, n->comm[from], st);
        if (r != ncclSuccess) {
            (void)ncclGroupEnd();
            return verr_set(err, VERR_BACKEND, "NCCL: send %zu bytes stage %d -> %d: %s", bytes,
                            from, to, ncclGetErrorString(r));
        }
    }
    if (recv) {
        cudaStream_t st = (cudaStream_t)backend_cuda_stream(t->be[to]);
        ncclResult_t r = ncclRecv(dst, bytes, ncclChar, from, n->comm[to], st);
        if (r != ncclSuccess) {
            (void)ncclGroupEnd();
            return verr_set(err, VERR_BACKEND, "NCCL: receive %zu bytes stage %d -> %d: %s", bytes,
                            from, to, ncclGetErrorString(r));
        }
    }
    NCCL_TRY(err, ncclGroupEnd());
    return 0;
}

static void nccl_destroy(struct transport *t) {
    struct nccl_tp *n = t->impl;
    if (n)
        for (int s = 0; s < t->n_stages; s++)
            if (n->comm[s])
                (void)ncclCommDestroy(n->comm[s]);
    free(n);
    free(t);
}

static const struct transport_ops nccl_ops = {
    .name = "nccl",
    .xfer = nccl_xfer,
    .destroy = nccl_destroy,
};

int transport_nccl_unique_id(void *id, struct verr *err) {
    ncclUniqueId u;
    NCCL_TRY(err, ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    return 0;
}

int transport_nccl_create(struct transport **out, struct backend *const *be, int n,
                          const void *unique_id, int rank, struct verr *err) {
    *out = NULL;
    if (n < 2 || n > TRANSPORT_MAX_STAGES)
        return verr_set(err, VERR_RANGE, "NCCL: %d stages", n);
    struct transport *t = calloc(1, sizeof *t);
    struct nccl_tp *nt = calloc(1, sizeof *nt);
    if (!t || !nt) {
        free(t);
        free(nt);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    t->ops = &nccl_ops;
    t->n_stages = n;
    t->impl = nt;
    for (int s = 0; s < n; s++)
        t->be[s] = be[s];
    ncclResult_t r;
    if (!unique_id) {
        // One process, every stage here, one GPU each: rank s is stage s.
        int devs[TRANSPORT_MAX_STAGES];
        for (int s = 0; s < n; s++) {
            if (!be[s] || strcmp(be[s]->ops->name, "cuda")) {
                nccl_destroy(t);
                return verr_set(err, VERR_UNSUPPORTED, "NCCL: stage %d is not on a GPU", s);
            }
            devs[s] = be[s]->device;
        }
        r = ncclCommInitAll(nt->comm, n, devs);
    } else {
        if (rank < 0 || rank >= n || !be[rank]) {
            nccl_destroy(t);
            return verr_set(err, VERR_RANGE, "NCCL: rank %d has no local stage", rank);
        }
        ncclUniqueId id;
        memcpy(&id, unique_id, sizeof id);
        cudaError_t ce = cudaSetDevice(be[rank]->device);
        if (ce != cudaSuccess) {
            nccl_destroy(t);
            return verr_set(err, VERR_BACKEND, "NCCL: cudaSetDevice(%d): %s", be[rank]->device,
                            cudaGetErrorString(ce));
        }
        r = ncclCommInitRank(&nt->comm[rank], n, id, rank);
    }
    if (r != ncclSuccess) {
        memset(nt->comm, 0, sizeof nt->comm);
        nccl_destroy(t);
        return verr_set(err, VERR_BACKEND, "NCCL: creating the communicator over %d stages: %s", n,
                        ncclGetErrorString(r));
    }
    *out = t;
    return 0;
}

#else // CUDA without NCCL

int transport_nccl_create(struct transport **out, struct backend *const *be, int n,
                          const void *unique_id, int rank, struct verr *err) {
    *out = NULL;
    return verr_set(err, VERR_UNSUPPORTED, "NCCL: vela was built without NCCL (libnccl not found)");
}

int transport_nccl_unique_id(void *id, struct verr *err) {
    return verr_set(err, VERR_UNSUPPORTED, "NCCL: vela was built without NCCL (libnccl not found)");
}

#endif
