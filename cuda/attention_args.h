// The arguments of an attention call inside cuda/ (struct cuda_attn) and
// the constants of its plans: shared by attention.cu, which picks the kernel,
// and attention_decode.cu, which it may hand the call to.
#ifndef VELA_CUDA_ATTENTION_ARGS_H
#define VELA_CUDA_ATTENTION_ARGS_H

#include "cuda/cuda_boundary.h"
#include "cuda/rope.h"

VELA_CUDA_BEGIN

// Largest head_dim / head_dim_v the attention kernels take.
#define CUDA_ATTN_MAX_HEAD_DIM 256

// The split-K plan of attention depends on n_kv only through
// round_up(n_kv, CUDA_ATTN_PLAN_CELLS) (BACKEND_KV_BUCKET must divide it).
#define CUDA_ATTN_PLAN_CELLS 256

struct cuda_attn {
    float *out;     // [n_tok][n_head][head_dim_v]
    const float *q; // [n_tok][n_head][head_dim]
    const void *k;  // [n_ctx][n_head_kv][head_dim], any cache type (kv_quant.cuh)
    const void *v;  // [n_ctx][n_head_kv][head_dim_v], any cache type
    enum ggml_type type_k, type_v;
    const int32_t *cell_pos;  // [n_kv]
    const uint64_t *cell_seq; // [n_kv][seq_words]
    int seq_words;
    const int32_t *q_pos; // [n_tok]
    const int32_t *q_seq; // [n_tok]
    int n_tok, n_kv, n_head, n_head_kv, head_dim, head_dim_v;
    float scale;
    int window; // > 0: also q_pos - cell_pos < window (a sliding-window layer)
    // Or NULL: also write out as q8_1 blocks (each output row [n_head *
    // head_dim_v] quantized as quant_q8_1_row does) for the act_q8 mat-vec
    // that follows. Needs head_dim_v % 32 == 0 and n_tok < 16 (the SIMT
    // kernels; VERR_RANGE otherwise).
    void *xq; // [n_tok][n_head * head_dim_v / 32] q8_1 blocks
    // The unrotated cache mode (host/ops/selfextend.h): rope_on != 0: q and K
    // arrive unrotated and attn_kernel rotates them with `rope` (magnitude
    // included), K tile by tile as it reads it; se_g > 1: exact self-extend
    // picks each score's rotations (attn_tc_kernel: on its f16 tiles).
    int rope_on;
    int se_g, se_w;
    // NULL, or per query token t: q_se[2t] = G, q_se[2t + 1] = W (device
    // memory), replacing se_g / se_w for that token (struct attn_args.q_se:
    // G < 1 reads as 1, W < 1 as 1). A block whose rows use several G > 1
    // rotates its K tile once per distinct G.
    const int32_t *q_se; // [n_tok][2] or NULL
    struct cuda_rope rope;
    // Split-K plan of the SIMT kernel (decode): aim for split_blocks_per_sm
    // blocks per multiprocessor, each split at least split_min_cells cells
    // (a multiple of 8); 0: CUDA_ATTN_SPLIT_BLOCKS_PER_SM and
    // CUDA_ATTN_SPLIT_MIN_CELLS. Both calls of one attention step must
    // agree (cuda_attention_scratch_bytes, cuda_attention_apply).
    int split_blocks_per_sm, split_min_cells;
    // The decode kernel (a variant under test until a GPU decides):
    // CUDA_ATTN_DECODE_AUTO (0) picks the default, CUDA_ATTN_DECODE_SPLITK
    // attn_kernel with its split-K plan and combine kernel, CUDA_ATTN_DECODE_DEC
    // attn_dec_kernel (cuda/attention_decode.cu: cells split for >= 2 blocks
    // per SM at any length, combine fused) where it applies; split_blocks_per_sm
    // and split_min_cells plan whichever runs (defaults CUDA_ATTN_DEC_* for
    // attn_dec_kernel).
    int decode;
    // Or NULL: sync_n counters (device memory, zero before the first call)
    // that attn_dec_kernel counts its splits on and leaves zero; it needs
    // cuda_attention_sync_count of them, else it merges the splits in a
    // second launch (the same bits).
    unsigned int *sync;
    int sync_n;
};
// Whether a call reads K or V in a type other than f16 / f32 (bf16 or a
// quantized type: cuda/kv_quant.cuh): such calls run the kernels' "any
// cache" instances, which decode each tile as they read it.
static inline bool cuda_attn_kvq(const struct cuda_attn *a) {
    return (a->type_k != GGML_TYPE_F16 && a->type_k != GGML_TYPE_F32) ||
           (a->type_v != GGML_TYPE_F16 && a->type_v != GGML_TYPE_F32);
}
#define CUDA_ATTN_SPLIT_BLOCKS_PER_SM 2
#define CUDA_ATTN_SPLIT_MIN_CELLS 256
#define CUDA_ATTN_DECODE_AUTO 0
#define CUDA_ATTN_DECODE_SPLITK 1
#define CUDA_ATTN_DECODE_DEC 2
// attn_dec_kernel: up to this many query tokens; its default plan.
#define CUDA_ATTN_DEC_MAX_TOK 8
#define CUDA_ATTN_DEC_BLOCKS_PER_SM 2
#define CUDA_ATTN_DEC_MIN_CELLS 8

VELA_CUDA_END

#endif
