// attention_decode.cu: decode attention for latency (split cells, fused
// combine), called by attention.cu's entry points for the calls it takes
// (cuda_attention_decode_eligible). Internal to cuda/: the host reaches it
// through cuda_attention_apply (cuda/attention.h).
#ifndef VELA_CUDA_ATTENTION_DECODE_H
#define VELA_CUDA_ATTENTION_DECODE_H

#include <stdbool.h>

#include "cuda/attention_args.h"

VELA_CUDA_BEGIN

// Whether attn_dec_kernel runs this call: decode != CUDA_ATTN_DECODE_SPLITK,
// no RoPE inside, 1..CUDA_ATTN_DEC_MAX_TOK tokens, head dims 64/128/256 (K
// and V alike), K and V both F16 or both F32, q, K and V 16-byte aligned.
bool cuda_attention_decode_eligible(const struct cuda_attn *a);
size_t cuda_attention_decode_scratch_bytes(const struct cuda_attn *a, int sm_count);
int cuda_attention_decode_sync_count(const struct cuda_attn *a, int sm_count);
// sinks: as cuda_attention_apply's.
int cuda_attention_decode_apply(const struct cuda_attn *a, const float *sinks, int sm_count,
                                void *scratch, size_t scratch_bytes, cudaStream_t stream,
                                struct verr *err);

VELA_CUDA_END

#endif
