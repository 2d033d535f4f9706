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
#include "host/split/pipeline.h"

// *out = NULL (and 0) unless this process was started by mpirun with more
// than one rank; then MPI is initialised and *out is the control channel.
// VERR_UNSUPPORTED under mpirun when vela was built without MPI.
int pipeline_mpi_ctl_create(struct pipeline_ctl **out, struct verr *err);

// pipeline_load for one rank (host/pipeline.c calls it under mpirun).
int pipeline_mpi_load(struct pipeline_ctl *ctl, const struct load_config *lc,
                      const struct forward_config *cfg, const struct gguf_file *f,
                      struct pipeline **pipe, struct backend **be, struct model **m,
                      struct verr *err);

// Rank 0 -> every rank: the forward config (pipeline_ctx_init), so that every
// stage's cache and scratch have the same shape.
int pipeline_mpi_bcast_config(struct pipeline_ctl *ctl, struct forward_config *cfg,
                              struct verr *err);

struct pipeline_mpi_decode {
    bool quit;
    bool argmax_only;
    int n_tok, n_out;
    int32_t *token, *pos, *seq, *cells; // [n_tok]
    int32_t *rows;                      // [n_out]
    int32_t *se;                        // [n_tok][2] the batch's self-extend G, W, or NULL
};

int pipeline_mpi_send_decode(struct pipeline_ctl *ctl, const struct forward_batch *b,
                             const int32_t *cells, const int32_t *rows, int n_out, bool argmax_only,
                             const struct kv_cache *kv, struct verr *err);
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
// A rank other than 0: loads this rank's stage as lc / cfg say (the same
// model flags rank 0 got), serves rank 0's decodes until it quits.
int pipeline_mpi_worker_run(const struct load_config *lc, const struct forward_config *cfg,
                            struct verr *err);

#endif
