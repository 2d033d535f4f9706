// sample.cu: argmax and the sampler chain on the device
// (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_SAMPLE_H
#define VELA_CUDA_SAMPLE_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// out[r] = index of the largest logit of row r, lowest index on ties (NaN
// never wins; a row of NaN gives 0).
int cuda_argmax_rows(int32_t *out /* [n_rows] */, const float *logits /* [n_rows][n_vocab] */,
                     int n_rows, int n_vocab, bool pdl, cudaStream_t stream, struct verr *err);

// Largest top_k served by one block per row (radix select of the k, then the
// chain in shared memory); rows with top_k off or larger are sorted whole.
#define CUDA_SAMPLE_MAX_K 1024

// One row of cuda_sample_rows: struct sample_params (host/ops/backend.h) plus
// log_min_p = logf(min_p), taken on the host with the same logf as
// host/backend/sampler.c (0 when min_p <= 0).
struct cuda_sample_row {
    float temp, top_p, min_p, log_min_p;
    int top_k;
    double u; // [0, 1)
};

// Scratch bytes cuda_sample_rows needs for these rows (host memory).
int cuda_sample_scratch_bytes(int n_rows, int n_vocab, const struct cuda_sample_row *rows,
                              size_t *bytes, struct verr *err);
// out[r] = the token host/backend/sampler.c's sampler_chain picks from row r
// with rows[r] (host memory, copied before the call returns): greedy, or
// top_k -> top_p -> min_p -> temp -> dist(u). Uses `scratch` (device).
int cuda_sample_rows(int32_t *out /* [n_rows] */, const float *logits /* [n_rows][n_vocab] */,
                     int n_rows, int n_vocab, const struct cuda_sample_row *rows /* [n_rows] */,
                     void *scratch, size_t scratch_bytes, cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
