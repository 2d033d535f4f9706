// Several processes, one stage each (mpirun): the control channel over MPI,
// the decode messages rank 0 broadcasts, the MPI transport for stages
// without NCCL, and the entry point of ranks other than 0.
//
// Built with MPI when CMake finds it (-DVELA_MPI=ON, the default when
// OpenMPI is installed: Debian's libopenmpi-dev); without it every function
// here still exists and says that vela was built without MPI when a run is
// started under mpirun.
//
// Protocol: rank 0 runs the command (engine, sampler, tokenizer) and drives
// stage 0; every other rank r loads stage r and serves. Rank 0 broadcasts
// the plan (every rank loads its own layers), the forward config, then for
// each decode: the batch, its cells and output rows, and the KV bookkeeping
// rank 0 changed since the last decode; a quit message when it frees the
// model. The hidden state and the last stage's logits move through the
// transport (NCCL between GPUs, MPI between host buffers otherwise).
#ifndef VELA_HOST_MPI_H
#define VELA_HOST_MPI_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "gguf/verr.h"
#include "host/forward/forward.h"
#include "host/ops/transport.h"
#include "host/split/plan.h"
#include "kv/kv.h"

// Control channel between the processes of a multi-process pipeline (MPI).
struct pipeline_ctl {
    int rank, n_ranks;
    // Rank 0's bytes to every rank.
    int (*bcast)(struct pipeline_ctl *c, void *buf, size_t bytes, struct verr *err);
    // Every rank's value to every rank: out[r] = rank r's v.
    int (*allgather)(struct pipeline_ctl *c, uint64_t v, uint64_t *out, struct verr *err);
    void (*destroy)(struct pipeline_ctl *c);
    void *impl;
};

// *out = NULL (and 0) unless this process was started by mpirun with more
// than one rank; then MPI is initialised and *out is the control channel.
// VERR_UNSUPPORTED under mpirun when vela was built without MPI.
int pipeline_mpi_ctl_create(struct pipeline_ctl **out, struct verr *err);

// This rank's device (its entry of --devices, else the GPU of its local rank:
// one process per GPU on each node, else the CPU), checked, and every rank's
// device and free memory: kinds[r] = kind << 32 | ordinal, frees[r] bytes
// ([ctl->n_ranks] each). A rank that cannot use its device fails them all.
int pipeline_mpi_gather_devices(struct pipeline_ctl *ctl, const struct load_config *lc,
                                uint64_t *kinds, uint64_t *frees, struct verr *err);

// Rank 0 -> every rank: the forward config (pipeline_ctx_init), so that every
// stage's cache and scratch have the same shape.
int pipeline_mpi_bcast_config(struct pipeline_ctl *ctl, struct forward_config *cfg,
                              struct verr *err);

struct pipeline_mpi_decode {
    bool quit;
    int n_tok, n_out;
    uint8_t *how;                       // [n_out] enum forward_row of each output row
    int32_t *token, *pos, *seq, *cells; // [n_tok]
    int32_t *rows;                      // [n_out]
    int32_t *se;                        // [n_tok][2] the batch's self-extend G, W, or NULL
};

int pipeline_mpi_send_decode(struct pipeline_ctl *ctl, const struct forward_batch *b,
                             const int32_t *cells, const int32_t *rows, int n_out,
                             const uint8_t *how, const struct kv_cache *kv, struct verr *err);
// Receives one message; applies its KV bookkeeping to kv.
int pipeline_mpi_recv_decode(struct pipeline_ctl *ctl, struct kv_cache *kv,
                             struct pipeline_mpi_decode *d, struct verr *err);
void pipeline_mpi_decode_free(struct pipeline_mpi_decode *d);
void pipeline_mpi_quit(struct pipeline_ctl *ctl);

// Host buffers between the ranks' stages over MPI (be: [n], only be[rank] set).
int transport_mpi_create(struct transport **out, struct pipeline_ctl *ctl,
                         struct backend *const *be, int n, struct verr *err);

// Whether this process is a rank other than 0 of an mpirun job (it then
// serves its stage instead of running the command: tools/main.c).
bool pipeline_mpi_is_worker(void);
#endif
