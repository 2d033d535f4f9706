// The transport interface: what carries the hidden state of a model split by
// layers (host/split/) from one stage's backend memory to the next. It sits
// beside the backend interface because backends implement it: the NCCL
// transport lives in cuda/nccl_transport.c, the in-process and MPI ones in
// host/split/.
//
// A transport moves bytes between stages, ordered like a backend op: after
// everything already enqueued on both stages' backends, before what is
// enqueued after it. Implementations:
// - in-process (host/split/stage.c): through a host staging buffer, between
//   any two backends of this process (cpu and cpu, two stages on one GPU,
//   cpu and cuda); synchronous on the sending stage;
// - NCCL (cuda/nccl_transport.c, VELA_HAVE_NCCL): ncclSend / ncclRecv on
//   the stages' CUDA streams, one communicator over every stage, in one
//   process (distinct GPUs) or one stage per process (mpirun);
// - MPI (host/split/mpi.c, VELA_HAVE_MPI): host buffers over MPI, one stage
//   per process, for stages without NCCL (cpu ranks).
#ifndef VELA_HOST_OPS_TRANSPORT_H
#define VELA_HOST_OPS_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "gguf/verr.h"
#include "host/ops/backend.h"

#define TRANSPORT_MAX_STAGES 64

struct transport;

struct transport_ops {
    const char *name; // "in-process", "nccl", "mpi"
    // Moves `bytes` from stage `from`'s backend memory src to stage `to`'s
    // dst. Every process calls it for every transfer of the pipeline; a
    // process does its side only (it sends where `from` is local, receives
    // where `to` is local, and returns at once otherwise).
    int (*xfer)(struct transport *t, int from, const void *src, int to, void *dst, size_t bytes,
                struct verr *err);
    void (*destroy)(struct transport *t);
};

struct transport {
    const struct transport_ops *ops;
    int n_stages;
    struct backend *be[TRANSPORT_MAX_STAGES]; // [n_stages]; NULL: the stage runs in another process
    void *impl;
};

// NCCL over be[0..n-1]. One process (unique_id NULL): every stage local, on
// distinct GPUs (ncclCommInitAll). Several processes: be[rank] is the one
// local stage and unique_id the 128-byte ncclUniqueId that rank 0 made with
// transport_nccl_unique_id and broadcast. VERR_UNSUPPORTED without NCCL.
int transport_nccl_create(struct transport **out, struct backend *const *be, int n,
                          const void *unique_id, int rank, struct verr *err);
#define TRANSPORT_NCCL_ID_BYTES 128
int transport_nccl_unique_id(void *id /* [TRANSPORT_NCCL_ID_BYTES] */, struct verr *err);

// Calls t->ops->destroy; NULL is fine.
void transport_destroy(struct transport *t);

#endif
