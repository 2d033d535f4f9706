// rope.cu: RoPE, the fused RoPE + KV store and the KV shift
// (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_ROPE_H
#define VELA_CUDA_ROPE_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// Rope constants derived on the host from struct rope_params, so that host
// and device use bit-identical theta_scale, corr dims and mscale.
struct cuda_rope {
    int mode;          // enum rope_mode: 0 normal, 2 NeoX
    int n_rot;         // even, <= head_dim
    float theta_scale; // powf(freq_base, -2.0f / n_rot)
    float freq_scale;
    float ext_factor;
    float corr_lo, corr_hi;
    float mscale;              // 1 for a pure rotation (kv shift)
    const float *freq_factors; // device [n_rot/2] or NULL
};

// Rotates x in place (k_cache/v_cache NULL), or, the fused KV store: rotates
// x (= K) in place and writes token t's K and V into cache cell cells[t]
// (c->n_rot 0 with the store: no rotation, the unrotated cache mode),
// converted to the cache types; with q (KV store only) the same launch also
// rotates the n_head_q query heads of q in place. bad (device int or NULL):
// set to INT_MAX - t, t the lowest token of the call with a non-finite K or
// V value for a block-quantized cache type (which cannot hold it; the
// values are stored as the encoder makes them), else left as it is.
int cuda_rope_apply(float *x /* [n_tok][n_head][head_dim] */, const int32_t *pos /* [n_tok] */,
                    int n_tok, int n_head, int head_dim, const struct cuda_rope *c,
                    const float *v /* [n_tok][n_head][head_dim_v] or NULL */,
                    void *k_cache /* [n_ctx][n_head][head_dim] or NULL */, enum ggml_type type_k,
                    void *v_cache /* [n_ctx][n_head][head_dim_v] or NULL */, enum ggml_type type_v,
                    const int32_t *cells /* [n_tok] or NULL */, int head_dim_v,
                    float *q /* [n_tok][n_head_q][head_dim] or NULL */, int n_head_q,
                    void *bad /* int or NULL */, bool pdl, cudaStream_t stream, struct verr *err);

// backend_ops.rope_kv_store_rot in one launch: rotates x (= K) and, with q,
// the n_head_q query heads of q in place (c->n_rot 0: no RoPE), then
// Hadamard-rotates them with block rot_k and v with block rot_v (0: none)
// in place, and writes token t's K and V into cache cell cells[t], converted
// to the cache types (any kvq_is_cache_type); bad as cuda_rope_apply's.
int cuda_rope_store_rotated(float *x /* [n_tok][n_head][head_dim] */,
                            const int32_t *pos /* [n_tok] */, int n_tok, int n_head, int head_dim,
                            const struct cuda_rope *c, float *v /* [n_tok][n_head][head_dim_v] */,
                            void *k_cache /* [n_ctx][n_head][head_dim] */, enum ggml_type type_k,
                            void *v_cache /* [n_ctx][n_head][head_dim_v] */, enum ggml_type type_v,
                            const int32_t *cells /* [n_tok] */, int head_dim_v,
                            float *q /* [n_tok][n_head_q][head_dim] or NULL */, int n_head_q,
                            int rot_k, int rot_v, void *bad /* int or NULL */, cudaStream_t stream,
                            struct verr *err);

// Rotates the K rows of every layer's cell c by delta[c] positions (cells with
// delta 0 untouched), one launch for all layers. rot_block > 0: a
// Hadamard-rotated quantized K (backend_ops.kv_shift's contract).
int cuda_rope_shift_kv(void *k_cache /* [n_layer][n_ctx][n_head_kv][head_dim] */,
                       enum ggml_type type_k, const int32_t *delta /* [n_ctx] */, int n_layer,
                       int n_ctx, int n_head_kv, int head_dim, const struct cuda_rope *c,
                       int rot_block, cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
