// attention.cu: causal flash attention over the KV cache, split-K for decode
// (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_ATTENTION_H
#define VELA_CUDA_ATTENTION_H

#include "cuda/attention_args.h"
#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// Scratch bytes the attention call with these sizes needs for its split-K
// partial results (0 when it runs unsplit). sm_count: multiprocessors.
size_t cuda_attention_scratch_bytes(const struct cuda_attn *a, int sm_count);
// Counters the call needs in cuda_attn.sync for a one-launch decode (0: none).
int cuda_attention_sync_count(const struct cuda_attn *a, int sm_count);
// Flash attention with online softmax; splits the KV range across blocks when
// there are too few (token, head) blocks to fill the GPU, using `scratch`.
// sinks: NULL, or one logit per query head (device memory; struct
// attn_args.sinks) in every row's softmax denominator, joined where the row
// is normalized (after a split's combine). An argument, not a field of
// struct cuda_attn (every kernel's by-value parameter), and run by kernel
// instances of their own: calls without sinks run kernels with no sink code.
// With rope_on: VERR_UNSUPPORTED (no instance joins the two).
int cuda_attention_apply(const struct cuda_attn *a, const float *sinks, int sm_count, void *scratch,
                         size_t scratch_bytes, cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
