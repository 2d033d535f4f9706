// The backend interface: the table of operations the one forward pass in
// host/ is written against. The CPU backend (host/backend/backend_cpu.c) is the
// float32 reference that defines "correct"; the CUDA backend (cuda/)
// implements the same ops with fused kernels and is tested against it.
//
// Contract for every op:
// - pointers are backend memory (host memory for CPU, device memory for CUDA),
//   obtained from be->ops->alloc; shapes are given next to each pointer, the
//   last index varying fastest;
// - ops are asynchronous on the backend's stream; be->ops->sync waits;
// - an op returns 0 or a negative VERR_* code and fills be->err.
#ifndef VELA_HOST_BACKEND_H
#define VELA_HOST_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"

enum rope_mode {
    ROPE_MODE_NORMAL = 0, // rotates pairs (2i, 2i+1): llama
    ROPE_MODE_NEOX = 2,   // rotates pairs (i, i + n_rot/2): qwen2, phi3, gemma, falcon, gptneox
};

// RoPE with the YaRN ramp, llama.cpp's semantics (shared/seeds/001_*):
//   theta_extrap = pos * freq_base^(-2i/n_rot) / freq_factor[i]
//   theta_interp = freq_scale * theta_extrap
//   ext_factor == 0: theta = theta_interp, mscale = attn_factor
//   else: mix = ramp(corr_dims, i) * ext_factor,
//         theta = theta_interp * (1 - mix) + theta_extrap * mix,
//         mscale = attn_factor * (1 + 0.1 ln(1/freq_scale))
//   corr_dims from n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow.
// Only the first n_rot dims of each head rotate; the rest are copied.
struct rope_params {
    enum rope_mode mode;
    int n_rot;      // even, <= head_dim
    int n_ctx_orig; // the trained context (YaRN)
    float freq_base;
    float freq_scale; // 1 / linear scale factor
    float ext_factor; // 0 disables the YaRN ramp
    float attn_factor;
    float beta_fast;
    float beta_slow;
    const float *freq_factors; // backend memory [n_rot/2], or NULL
};

// A weight matrix as stored in the GGUF file: n_out rows of n_in elements
// (ggml ne0 = n_in), each row ggml_row_bytes(type, n_in) bytes.
struct backend_weight {
    const void *data; // backend memory [n_out][row_bytes(type, n_in)]
    enum ggml_type type;
    int64_t n_in;
    int64_t n_out;
};

// One matrix of a matmul_multi call: out = W x (+ bias).
struct backend_mm {
    float *out; // [n_tok][w->n_out]
    const struct backend_weight *w;
    const float *bias; // [w->n_out] or NULL
};
#define BACKEND_MM_MAX 3 // matrices per matmul_multi call (Q, K, V)

// Attention over the KV cache for a batch of query tokens, with the mask
// built from cell positions and sequence sets: query t may attend to cell c
// iff seq q_seq[t] is in cell c's set and cell_pos[c] <= q_pos[t] (and
// cell_pos[c] >= 0). Heads are grouped (GQA): query head h reads KV head
// h / (n_head / n_head_kv). Softmax scale `scale` (1/sqrt(head_dim)).
// With window > 0 (a sliding-window layer) query t sees cell c only if also
// q_pos[t] - cell_pos[c] < window (llama.cpp's LLAMA_SWA_TYPE_STANDARD).
// A query row with no visible cell produces zeros.
struct attn_args {
    float *out;               // [n_tok][n_head][head_dim_v]
    const float *q;           // [n_tok][n_head][head_dim]
    const void *k;            // [n_ctx][n_head_kv][head_dim] of type kv_type_k (one layer)
    const void *v;            // [n_ctx][n_head_kv][head_dim_v] of type kv_type_v (one layer)
    enum ggml_type type_k;    // F16, F32, or where the backend supports it a quantized type
    enum ggml_type type_v;    // (backend_cache_type_quantized)
    const int32_t *cell_pos;  // [n_kv] position of each cell, -1 when empty
    const uint64_t *cell_seq; // [n_kv][seq_words] bit s set when the cell holds sequence s
    int seq_words;
    const int32_t *q_pos; // [n_tok]
    const int32_t *q_seq; // [n_tok]
    int n_tok;
    int n_kv;   // cells 0..n_kv-1 are considered
    int window; // 0: no sliding window
    int n_head;
    int n_head_kv;
    int head_dim;
    int head_dim_v;
    float scale;
    // RoPE inside attention (the unrotated cache mode, host/ops/selfextend.h):
    // NULL: q and K arrive rotated (the default cache). Non-NULL: q and K are
    // unrotated and attention rotates them with these params (magnitude
    // included, as rope does), with exact self-extend when se_g > 1.
    const struct rope_params *rope; // host memory, read during the call
    int se_g;                       // group size G >= 1 (only with rope)
    int se_w;                       // neighbor window W >= 1 (only with rope and se_g > 1)
    // Exact self-extend chosen per query (only with rope): NULL, or backend
    // memory where q_se[2t] is token t's G and q_se[2t + 1] its W, which then
    // replace se_g / se_w for that token. Tokens of one batch (of different
    // sequences) may so use different G and W, or none (G = 1): K is stored
    // unrotated, so the op's inputs do not depend on them (the K/V a later
    // layer stores do: they come from this attention). The caller checks
    // the values (forward_batch_begin: G >= 1, and 1 <= W when G > 1); a
    // backend reads G < 1 as 1 (ordinary attention) and W < 1 as 1.
    const int32_t *q_se; // [n_tok][2] or NULL
    // Attention sinks (gpt-oss): NULL, or backend memory [n_head] F32, one
    // logit per query head that joins every softmax's denominator and takes
    // no value: with m = max(sink[h], the visible scores s_c = scale q.k_c),
    //   out = sum_c exp(s_c - m) v_c / (exp(sink[h] - m) + sum_c exp(s_c - m))
    // (llama.cpp's ggml_soft_max_add_sinks). A row with no visible cell
    // still produces zeros. Composes with windows, exact self-extend and
    // every cache type (the sink is a score, not a cell).
    const float *sinks;
    // The output also goes to the next op as the 8-bit activations of its
    // mat-vec (as rms_norm_q8's): set when the op right after is the output
    // projection reading `out`. A backend with act_q8 may write a q8_1 copy
    // for it and then refuses any other op next; the CPU ignores it (its
    // matmuls quantize their input themselves).
    bool out_q8;
};

// One row of the sample op: host/backend/sampler.h's chain after its penalties.
// u is the row's uniform draw, taken on the host from the sequence's seeded
// sampler (sampler_next_params), so the host sampler stays the one place with
// RNG state and every backend picks the same token for the same logits and u.
struct sample_params {
    float temp;  // <= 0: greedy (u unused)
    int top_k;   // <= 0: off
    float top_p; // >= 1: off
    float min_p; // <= 0: off
    double u;    // [0, 1)
};

// The router's gating (backend_ops.moe_route), llama.cpp's
// expert_gating_func with its norm_w. The values of the first two are the
// bool `renorm` the op once took.
enum moe_gating {
    MOE_GATING_SOFTMAX = 0,        // softmax over all experts, the top k's probabilities
    MOE_GATING_SOFTMAX_RENORM = 1, // the same, each divided by their sum (norm_w)
    MOE_GATING_SOFTMAX_WEIGHT = 2, // the top k logits, then a softmax over those k (gpt-oss)
};

// The experts' gated activation (moe_args.act).
enum moe_act {
    MOE_ACT_SWIGLU = 0, // silu(g) * u
    // gpt-oss's swiglu_oai (ggml_swiglu_oai): x = min(g, limit),
    // y = clamp(u, -limit, limit), x / (1 + expf(alpha * -x)) * (y + 1),
    // each step rounded to float as written.
    MOE_ACT_SWIGLU_OAI = 1,
};

// llama.cpp's swiglu_oai parameters for gpt-oss (constants of its graph;
// the files carry none).
#define MOE_OAI_ALPHA 1.702f
#define MOE_OAI_LIMIT 7.0f

// The routed feed-forward's operands (backend_ops.moe_ffn). An expert stack
// is one backend_weight holding n_expert matrices one after the other, as
// ggml stores a [n_in, n_out, n_expert] tensor: expert e's matrix is rows
// [e * n_out / n_expert, (e + 1) * n_out / n_expert). gate and up: n_expert
// * n_ff rows of n_embd; down: n_expert * n_embd rows of n_ff; gate and up
// of one type, down of any.
struct moe_args {
    float *out;           // [n_tok][n_embd]; must not alias x or tmp
    const float *x;       // [n_tok][n_embd]
    const int32_t *ids;   // [n_tok][k] experts, each in [0, n_expert) (moe_route)
    const float *weights; // [n_tok][k]
    const struct backend_weight *gate, *up, *down; // host memory, read during the call
    // Per-expert biases (gpt-oss), each NULL or added to its matmul's output
    // before anything else reads it (ggml_add_id): gate_b and up_b [n_expert][n_ff],
    // down_b [n_expert][n_embd], backend memory, F32.
    const float *gate_b, *up_b, *down_b;
    enum moe_act act;   // MOE_ACT_SWIGLU (the zero value) or MOE_ACT_SWIGLU_OAI
    float alpha, limit; // swiglu_oai's parameters (unused for MOE_ACT_SWIGLU)
    int n_expert;
    int k;
    int n_tok;
    float *tmp; // [BACKEND_MOE_TMP(n_tok, k, n_embd, n_ff)] scratch the backend may write
};
// Floats of moe_args.tmp.
#define BACKEND_MOE_TMP(n_tok, k, n_embd, n_ff)                                                    \
    ((size_t)(n_tok) * (size_t)(k)*2u * ((size_t)(n_ff) + (size_t)(n_embd)))

// The KV cache element types. Every backend stores, shifts and attends over
// K and V in the float ones (the CUDA ops check with this function).
static inline bool backend_cache_type_ok(enum ggml_type t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16;
}

// The quantized cache types, llama.cpp's --cache-type-k/-v set besides the
// floats: each cell's row of K (and of V) is a row of blocks of that type
// (gguf/quant.h, the quantizer `vela quantize` uses), so a block never spans
// two heads: head_dim (head_dim_v) must be a multiple of the block size
// (kv_init refuses it otherwise). A backend that runs them says so with
// backend_ops.cache_type_supported (the CPU backend: all of these).
static inline bool backend_cache_type_quantized(enum ggml_type t) {
    return t == GGML_TYPE_BF16 || t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0 ||
           t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q5_1 ||
           t == GGML_TYPE_IQ4_NL;
}

// The cache types of backend_cache_type_quantized stored in blocks (all but
// BF16): no encoding for inf or NaN, the attention rotation applies.
static inline bool backend_cache_type_blocks(enum ggml_type t) {
    return backend_cache_type_quantized(t) && t != GGML_TYPE_BF16;
}

// The largest block of backend_ops.hadamard.
#define BACKEND_HADAMARD_MAX 1024

// Whether block is a valid backend_ops.hadamard block for rows of n values.
static inline bool backend_hadamard_block_ok(int n, int block) {
    return block >= 2 && block <= BACKEND_HADAMARD_MAX && (block & (block - 1)) == 0 && n > 0 &&
           n % block == 0;
}

// The attention rotation's block for a K (is_k) or V cache of type t and
// head dim hd, as llama.cpp's attn_rot_k / attn_rot_v (llama-kv-cache.cpp):
// 0 (none) unless t is block-quantized (bf16 is not) and hd is a multiple
// of 64; then for K the largest power of two dividing hd (at most
// BACKEND_HADAMARD_MAX), for V 64.
static inline int backend_attn_rot_block(enum ggml_type t, int hd, bool is_k) {
    if (!backend_cache_type_blocks(t) || hd <= 0 || hd % 64)
        return 0;
    int b = 64;
    while (is_k && b < BACKEND_HADAMARD_MAX && hd % (2 * b) == 0)
        b *= 2;
    return b;
}

struct backend;

struct backend_ops {
    const char *name; // "cpu", "cuda"

    // memory
    int (*alloc)(struct backend *be, size_t bytes, void **out);
    void (*free)(struct backend *be, void *ptr);
    int (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    int (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
    int (*memset_zero)(struct backend *be, void *dst, size_t bytes);
    int (*sync)(struct backend *be);

    // out[t][:] = dequantized row tokens[t] of `table`.
    int (*embed)(struct backend *be, float *out /* [n_tok][table->n_in] */,
                 const struct backend_weight *table, const int32_t *tokens /* [n_tok] */,
                 int n_tok);

    // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w; out may alias x.
    int (*rms_norm)(struct backend *be, float *out /* [n_rows][n] */,
                    const float *x /* [n_rows][n] */, const float *w /* [n] */, int n_rows, int n,
                    float eps);

    // Fused: rms_norm, and out handed on as the q8_1 activations (act_q8) of
    // the mat-vec that reads it, so that it is not quantized a second time.
    // Same contract and result as rms_norm; the op right after it on this
    // backend must be a matmul, matmul_multi, matmul_add, matmul_swiglu or
    // matmul_geglu with x = out and n_tok = n_rows (the CUDA backend refuses
    // any other op there with VERR_RANGE: the fusion is never lost in
    // silence). Bit for bit, the pair gives what rms_norm + that op give: the
    // copy is quant_q8_1_row(out[r]), what the mat-vec computes from out
    // itself. The CPU backend's matmuls quantize x themselves: its
    // rms_norm_q8 is its rms_norm.
    int (*rms_norm_q8)(struct backend *be, float *out /* [n_rows][n] */,
                       const float *x /* [n_rows][n] */, const float *w /* [n] */, int n_rows,
                       int n, float eps);

    // out[t][o] = sum_i W[o][i] * x[t][i] (+ bias[o]); out must not alias x.
    int (*matmul)(struct backend *be, float *out /* [n_tok][w->n_out] */,
                  const struct backend_weight *w, const float *x /* [n_tok][w->n_in] */,
                  const float *bias /* [w->n_out] or NULL */, int n_tok);

    // Fused matmuls. Each is, element by element, exactly the composition its
    // comment names (same operations, same roundings), so a forward pass gives
    // the same result whether a backend fuses them or not; the CUDA backend
    // runs each as one launch for decode batches.
    //
    // mm[i].out = matmul(mm[i].w, x, mm[i].bias) for i < n <= BACKEND_MM_MAX;
    // every mm[i].w has the same n_in; no out aliases x or another out.
    int (*matmul_multi)(struct backend *be, const struct backend_mm *mm /* [n], host memory */,
                        int n, const float *x /* [n_tok][n_in] */, int n_tok);
    // y += matmul(w, x): the residual add folded into the projection. y must
    // not alias x.
    int (*matmul_add)(struct backend *be, float *y /* [n_tok][w->n_out] */,
                      const struct backend_weight *w, const float *x /* [n_tok][w->n_in] */,
                      int n_tok);
    // out = swiglu(matmul(w_gate, x), matmul(w_up, x)). up_tmp is scratch the
    // backend may write (the unfused path puts matmul(w_up, x) there); the
    // weights share n_in and n_out; out, up_tmp and x do not alias.
    int (*matmul_swiglu)(struct backend *be, float *out /* [n_tok][w_gate->n_out] */,
                         float *up_tmp /* [n_tok][w_up->n_out] */,
                         const struct backend_weight *w_gate, const struct backend_weight *w_up,
                         const float *x /* [n_tok][n_in] */, int n_tok);

    // out = geglu(matmul(w_gate, x), matmul(w_up, x)): matmul_swiglu with the
    // geglu op's activation; same contract.
    int (*matmul_geglu)(struct backend *be, float *out /* [n_tok][w_gate->n_out] */,
                        float *up_tmp /* [n_tok][w_up->n_out] */,
                        const struct backend_weight *w_gate, const struct backend_weight *w_up,
                        const float *x /* [n_tok][n_in] */, int n_tok);

    // Rotates every head of x in place to position pos[t], scaled by mscale.
    int (*rope)(struct backend *be, float *x /* [n_tok][n_head][head_dim] */,
                const int32_t *pos /* [n_tok] */, int n_tok, int n_head, int head_dim,
                const struct rope_params *rp);

    // Fused: rotates k to pos[t] (as rope) and stores k and v of token t into
    // cache cell cells[t] of one layer, converting to the cache types (a
    // quantized type: the cell's row through quant_quantize_row, so a
    // non-finite value fails the op with VERR_RANGE). k is left rotated in
    // place. With q (else NULL), also rope(q, n_head) as the
    // rope op does: Q's rotation rides in the same pass (one launch on CUDA).
    // rp NULL (the unrotated cache mode): k and v are stored as they are and
    // q is left untouched; attention rotates them (attn_args.rope).
    int (*rope_kv_store)(struct backend *be, float *q /* [n_tok][n_head][head_dim] or NULL */,
                         int n_head, float *k /* [n_tok][n_head_kv][head_dim] */,
                         const float *v /* [n_tok][n_head_kv][head_dim_v] */,
                         void *k_cache /* [n_ctx][n_head_kv][head_dim] */, enum ggml_type type_k,
                         void *v_cache /* [n_ctx][n_head_kv][head_dim_v] */, enum ggml_type type_v,
                         const int32_t *pos /* [n_tok] */, const int32_t *cells /* [n_tok] */,
                         int n_tok, int n_head_kv, int head_dim, int head_dim_v,
                         const struct rope_params *rp);
    // Fused: rope_kv_store for a cache that keeps K and V Hadamard-rotated
    // (the attention rotation of a quantized cache): exactly the sequence
    //   rope(q), rope(k)             (rp non-NULL; q may be NULL),
    //   hadamard(q, rot_k), hadamard(k, rot_k)   (rot_k > 0),
    //   hadamard(v, rot_v)                       (rot_v > 0),
    //   rope_kv_store(..., rp = NULL)
    // with q, k and v left as that sequence leaves them (rotated in place),
    // in one launch on CUDA instead of up to six. rot_k / rot_v: 0 or a
    // hadamard block dividing head_dim / head_dim_v.
    int (*rope_kv_store_rot)(struct backend *be, float *q /* [n_tok][n_head][head_dim] or NULL */,
                             int n_head, float *k /* [n_tok][n_head_kv][head_dim] */,
                             float *v /* [n_tok][n_head_kv][head_dim_v] */,
                             void *k_cache /* [n_ctx][n_head_kv][head_dim] */,
                             enum ggml_type type_k,
                             void *v_cache /* [n_ctx][n_head_kv][head_dim_v] */,
                             enum ggml_type type_v, const int32_t *pos /* [n_tok] */,
                             const int32_t *cells /* [n_tok] */, int n_tok, int n_head_kv,
                             int head_dim, int head_dim_v, const struct rope_params *rp, int rot_k,
                             int rot_v);

    int (*attention)(struct backend *be, const struct attn_args *a);

    // Walsh-Hadamard rotation in place: every contiguous run of `block`
    // values of x (n values a row, block dividing n) becomes H x, H the
    // orthonormal Sylvester Walsh-Hadamard matrix of that size,
    //   H[i][j] = (-1)^popcount(i & j) / sqrt(block),
    // symmetric with H H = I, so the op is its own inverse. block is a power
    // of two in [2, BACKEND_HADAMARD_MAX]. Computed as the fast transform:
    // butterflies (a, b) -> (a + b, a - b) over the pairs i, i + h for
    // h = 1, 2, ..., block/2, then each value times 1.0f / sqrtf(block), all
    // in float, so every backend gives the same bits. The forward rotates q,
    // K, V and the attention output with it when the KV cache is quantized
    // (llama.cpp's attention rotation): the quantization error of a rotated
    // row is spread over its block instead of sitting on its outliers.
    int (*hadamard)(struct backend *be, float *x /* [n_rows][n] */, int64_t n_rows, int n,
                    int block);
    // Fused: hadamard, and a q8_1 copy of x's rows for the mat-vec right
    // after it, on the terms of rms_norm_q8 (the next op must read x with
    // n_tok = n_rows; the CPU backend's is its hadamard). The forward rotates
    // the attention output back with it before the output projection.
    int (*hadamard_q8)(struct backend *be, float *x /* [n_rows][n] */, int64_t n_rows, int n,
                       int block);

    // The pending KV shift, one call over all layers: every cell c with
    // delta[c] != 0 has its K rows rotated by delta[c] positions with rp's
    // frequencies. A pure rotation: attn_factor / YaRN mscale are NOT applied
    // (K already carries them from when it was stored). A quantized K is
    // dequantized, rotated and quantized again, as llama.cpp's K shift does
    // (each shift adds one more rounding to the shifted cells). rot_block > 0:
    // K is stored Hadamard-rotated (the hadamard op with that block, after
    // RoPE); the dequantized row is rotated back, shifted and rotated again
    // before it is quantized, as llama.cpp's build_rope_shift. Only with a
    // quantized K (the forward rotates no other); 0: no rotation.
    int (*kv_shift)(struct backend *be, void *k_cache /* [n_layer][n_ctx][n_head_kv][head_dim] */,
                    enum ggml_type type_k, const int32_t *delta /* [n_ctx] */, int n_layer,
                    int n_ctx, int n_head_kv, int head_dim, const struct rope_params *rp,
                    int rot_block);

    // out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
    int (*swiglu)(struct backend *be, float *out /* [n] */, const float *gate /* [n] */,
                  const float *up /* [n] */, int64_t n);

    // out[i] = gelu(gate[i]) * up[i]; out may alias gate or up. gelu is the
    // tanh approximation as ggml's CPU backend computes it for llama.cpp
    // (GGML_GELU_FP16): gate <= -10 gives 0, gate >= 10 gives gate, else
    // gate is rounded to f16 and f16(0.5 g (1 + tanhf(sqrt(2/pi) g (1 +
    // 0.044715 g^2)))) of that g is the product's factor (ggml's table);
    // the CPU backend's gelu_f16 is the scalar definition.
    int (*geglu)(struct backend *be, float *out /* [n] */, const float *gate /* [n] */,
                 const float *up /* [n] */, int64_t n);

    // x[i] *= s
    int (*scale)(struct backend *be, float *x /* [n] */, float s, int64_t n);

    // x[i] += y[i]
    int (*add)(struct backend *be, float *x /* [n] */, const float *y /* [n] */, int64_t n);

    // out[r] = x[rows[r]]: gathers the rows that want logits.
    int (*get_rows)(struct backend *be, float *out /* [n_out_rows][n] */,
                    const float *x /* [*][n] */, const int32_t *rows /* [n_out_rows] */,
                    int n_out_rows, int n);

    // out[r] = index of the largest logit of row r (lowest index on ties).
    int (*argmax)(struct backend *be, int32_t *out /* [n_rows] */,
                  const float *logits /* [n_rows][n_vocab] */, int n_rows, int n_vocab);

    // out[r] = the token sampler_chain (host/backend/sampler.h) picks from row r with
    // sp[r]: greedy, or top_k -> top_p -> min_p -> temp -> dist with the draw
    // sp[r].u. No penalties: a caller that needs them samples on the host.
    // sp is host memory, read before the call returns; each u in [0, 1).
    int (*sample)(struct backend *be, int32_t *out /* [n_rows] */,
                  const float *logits /* [n_rows][n_vocab] */, int n_rows, int n_vocab,
                  const struct sample_params *sp /* [n_rows], host memory */);

    // --- mixture of experts (NULL on a backend without them: forward.c then
    // refuses a model with experts) ---------------------------------------

    // The router's choice for each token, llama.cpp's build_moe_ffn. With
    // MOE_GATING_SOFTMAX(_RENORM): p = softmax(logits[t]) over all n_expert
    // (max subtracted, sum in double, then multiplied by 1/sum); ids[t][0..k)
    // are the k largest p in descending order, the lower index first among
    // equal p, NaN after every number; weights[t][j] = p[ids[t][j]], and
    // with _RENORM each divided by max(sum_j weights[t][j], 2^-14) (summed
    // in float, j ascending). With
    // MOE_GATING_SOFTMAX_WEIGHT: ids[t] are the k largest logits in the same
    // order and weights[t] the softmax (as above) of those k logits.
    // 1 <= k <= n_expert.
    int (*moe_route)(struct backend *be, int32_t *ids /* [n_tok][k] */,
                     float *weights /* [n_tok][k] */, const float *logits /* [n_tok][n_expert] */,
                     int n_tok, int n_expert, int k, enum moe_gating gating);

    // The routed gated feed-forward, each token through its k experts:
    //   h_j = act(matmul(gate_e, x[t]) + gate_b[e], matmul(up_e, x[t]) + up_b[e]),
    //   e = ids[t][j], act = swiglu or swiglu_oai (moe_args.act), absent
    //   biases not added
    //   y_j = (matmul(down_e, h_j) + down_b[e]) * weights[t][j]
    //   out[t] = ((y_0 + y_1) + y_2) + ... + y_{k-1}
    // with each matmul as the matmul op computes it (act_q8 included). See
    // struct moe_args for the expert stacks.
    int (*moe_ffn)(struct backend *be, const struct moe_args *a);

    // A shared expert's gated add (qwen2moe), llama.cpp's
    // ggml_div(ggml_silu(g), g) then mul and add:
    //   y[t][i] += s[t][i] * sig(g[t]),  sig(g) = silu(g) / g,
    //   silu(g) = g / (1 + expf(-g)), sig(0) = 1/2 (where that is 0/0),
    // each step rounded to float as written. s must not alias y.
    int (*add_sigmoid_scaled)(struct backend *be, float *y /* [n_tok][n] */,
                              const float *s /* [n_tok][n] */, const float *g /* [n_tok] */,
                              int n_tok, int n);

    // --- optional (NULL where a backend has no use for them) -----------------

    // Whether rope_kv_store, attention and kv_shift take caches of type t
    // (backend_supports_cache_type). NULL: the float types only
    // (backend_cache_type_ok).
    bool (*cache_type_supported)(enum ggml_type t);

    // Free and total memory of the device the backend allocates from (the
    // CPU: the RAM the kernel reports available); SIZE_MAX when it cannot
    // say. NULL: unknown too.
    int (*mem_info)(struct backend *be, size_t *free_bytes, size_t *total_bytes);

    // Bulk uploads (model loading) through caller-owned page-locked staging.
    // alloc_host_pinned gives host memory the device can read by DMA;
    // upload_async enqueues a copy of `bytes` from such memory to dst and
    // returns without waiting for it; upload_wait(slot) returns once every
    // upload_async issued with `slot` (0 <= slot < BACKEND_UPLOAD_SLOTS) has
    // finished reading its source, so the caller may refill it. All four are
    // set or all NULL; without them a loader uses ops->upload, which returns
    // once its source is read.
    int (*alloc_host_pinned)(struct backend *be, size_t bytes, void **out);
    void (*free_host_pinned)(struct backend *be, void *ptr);
    int (*upload_async)(struct backend *be, void *dst, const void *src, size_t bytes, int slot);
    int (*upload_wait)(struct backend *be, int slot);

    // Graphs: record a sequence of ops once, replay it with one launch (CUDA
    // graphs). All five set or all NULL (the CPU backend).
    // - graph_begin: the ops this thread enqueues next are recorded, not run.
    //   While recording, an op that would allocate, synchronise, grow the
    //   scratch or read host memory at run time (upload, download, sync,
    //   sample) fails with VERR_UNSUPPORTED and spoils the recording.
    // - graph_end: stops recording (always call it after graph_begin, even
    //   after a failed op). exec == NULL discards the recording; otherwise
    //   *exec is the executable graph, or NULL with an error when the
    //   recording was spoiled: the caller then runs the same ops eagerly.
    // - graph_launch enqueues one replay. Every kernel argument (pointers,
    //   sizes, n_kv) is frozen in the graph: what changes between replays must
    //   be written to the same device addresses (ops->upload) before it.
    // - graph_current: false once memory the graph uses was replaced (the
    //   scratch grew after recording): destroy it and record again.
    int (*graph_begin)(struct backend *be);
    int (*graph_end)(struct backend *be, void **exec);
    int (*graph_launch)(struct backend *be, void *exec);
    bool (*graph_current)(struct backend *be, const void *exec);
    void (*graph_destroy)(struct backend *be, void *exec);

    void (*destroy)(struct backend *be);
};

#define BACKEND_UPLOAD_SLOTS 4

// Attention over n_kv cells, where cells past the last non-empty one are
// empty: on a backend with graph ops the result is bit-identical for every
// n_kv with the same round_up(n_kv, BACKEND_KV_BUCKET) (its split of the
// cells among blocks depends on that only). A recorded decode step attends
// over n_kv rounded up to this bucket, so one graph serves a whole bucket
// and gives the same logits as an eager step.
#define BACKEND_KV_BUCKET 256

struct backend {
    const struct backend_ops *ops;
    struct verr err; // last error of an op
    int n_threads;   // CPU backend
    int device;      // CUDA backend: device ordinal
    // 8-bit activations for decode mat-vecs (every backend, same rule): a
    // matmul (and the fused matmuls) of a batch of at most
    // BACKEND_ACT_Q8_MAX_TOK tokens with a weight type quant_q8_1_dot_supported
    // takes x rounded to q8_1 blocks and computes each output as
    // quant_dot_q8_1 (gguf/quant_q8.h) (+ bias), as llama.cpp's CUDA
    // mat-vec does; error about 3e-3 of sum|w x| (tests/test_quant_q8.c).
    // Off: f32 activations. backend_cuda_create turns it on, the CPU off
    // (backend_cpu_create is the f32 reference; backend_create_device turns
    // it on for the CPU too, where its SIMD kernels run). The CPU takes every
    // batch size, not only decode batches, so that a token's output does not
    // depend on its batch: its SIMD kernels (host/backend/cpu_q8.h: same
    // terms as quant_dot_q8_1, summed in another fixed order), else
    // quant_dot_q8_1 itself.
    bool act_q8;
    void *impl; // backend-private state
};

#define BACKEND_ACT_Q8_MAX_TOK 8

// Whether be stores, shifts and attends over K or V of type t (forward_init
// and kv_init check with it, and refuse the others by name).
static inline bool backend_supports_cache_type(const struct backend *be, enum ggml_type t) {
    if (be->ops->cache_type_supported)
        return be->ops->cache_type_supported(t);
    return backend_cache_type_ok(t);
}

// The argument checks of add_sigmoid_scaled that every backend makes (who
// names the backend in the message): 0, or VERR_RANGE with be->err set.
static inline int backend_check_add_sigmoid_scaled(struct backend *be, const char *who,
                                                   const float *y, const float *s, const float *g,
                                                   int n_tok, int n) {
    if (n_tok < 0 || n < 0)
        return verr_set(&be->err, VERR_RANGE, "%s add_sigmoid_scaled: shape %d x %d", who, n_tok,
                        n);
    if (n_tok == 0 || n == 0)
        return 0;
    if (!y || !s || !g)
        return verr_set(&be->err, VERR_RANGE, "%s add_sigmoid_scaled: NULL pointer", who);
    const size_t len = (size_t)n_tok * (size_t)n;
    if (s < y + len && y < s + len)
        return verr_set(&be->err, VERR_RANGE, "%s add_sigmoid_scaled: s overlaps y", who);
    return 0;
}

// Creates the CPU reference backend with n_threads worker threads (<= 0: one
// per physical core the process may use).
int backend_cpu_create(struct backend **out, int n_threads, struct verr *err);
// Creates the CUDA backend on `device`. Returns VERR_UNSUPPORTED when vela was
// built without CUDA and VERR_NOTFOUND when no such GPU is present.
int backend_cuda_create(struct backend **out, int device, struct verr *err);
// Number of CUDA devices usable now (0 without CUDA or without a GPU).
int backend_cuda_device_count(void);
void backend_destroy(struct backend *be);

// What a benchmark reports about a CUDA device. Peak bandwidth is the
// memory's double data rate: 2 x memory clock x bus width / 8.
struct backend_device_info {
    char name[256];         // "NVIDIA H200"
    int driver_version;     // CUDA driver API version (12040 = 12.4)
    int runtime_version;    // CUDA runtime vela was built with
    int cc_major, cc_minor; // compute capability
    int sm_count;
    size_t mem_bytes;  // device memory
    size_t l2_bytes;   // L2 cache
    int mem_clock_khz; // peak memory clock
    int bus_width_bits;
    double peak_bw_gbs; // 0 when the device does not say
};
// Fills *out for CUDA device `device`. VERR_UNSUPPORTED without CUDA,
// VERR_NOTFOUND when no such GPU is present.
int backend_cuda_device_info(int device, struct backend_device_info *out, struct verr *err);
// The cudaStream_t a CUDA backend enqueues its ops on (benchmarks time ops
// with CUDA events on it); NULL for any other backend.
void *backend_cuda_stream(struct backend *be);

enum backend_device_kind {
    BACKEND_DEVICE_CPU = 0,
    BACKEND_DEVICE_CUDA = 1,
};

struct backend_device {
    enum backend_device_kind kind;
    int ordinal; // CUDA ordinal; 0 for cpu
};

// "cpu" or "cuda:N" into buf.
void backend_device_name(const struct backend_device *d, char *buf, size_t cap);
// How a backend is tuned when it is created (every stage of a split gets the
// same settings).
enum backend_act {
    BACKEND_ACT_DEFAULT = 0, // CUDA: q8; CPU: q8 where its SIMD kernels run, else f32
    BACKEND_ACT_Q8 = 1,      // 8-bit activations, integer dots (backend.act_q8 on)
    BACKEND_ACT_F32 = 2,     // f32 activations (act_q8 off)
};
struct backend_settings {
    int n_threads;        // CPU worker threads; <= 0: the physical cores
    enum backend_act act; // decode mat-vec activations
};

// The one place a backend is made from a device description: the CPU
// backend with s->n_threads, or the CUDA backend on d->ordinal, then tuned
// by s (s NULL: defaults).
int backend_create_device(const struct backend_device *d, const struct backend_settings *s,
                          struct backend **out, struct verr *err);

#define BACKEND_MEM_UNLIMITED SIZE_MAX // a device whose free memory is not limited (tests)

// Free and total memory of a device: CUDA from cudaMemGetInfo, the CPU from
// the memory the kernel reports available (BACKEND_MEM_UNLIMITED when it
// cannot say). VERR_UNSUPPORTED / VERR_NOTFOUND for a CUDA device vela
// cannot reach.
int backend_device_memory(const struct backend_device *d, size_t *free_bytes, size_t *total_bytes,
                          struct verr *err);
// CPU side of backend_device_memory (host/backend/backend_cpu.c): MemAvailable
// and MemTotal of /proc/meminfo (the page cache the kernel would give back
// counts: the mmap'ed model lives there), else sysconf's pages, else
// BACKEND_MEM_UNLIMITED.
int backend_cpu_mem_info(size_t *free_bytes, size_t *total_bytes);
// CUDA side of backend_device_memory (cuda/, or the no-CUDA stub).
int backend_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes, struct verr *err);
// Whether the accelerator library linked in is CUDA's (real or emulated).
bool backend_cuda_built(void);

// The YaRN correction dims {lo, hi} (floor/ceil, clamped to [0, n_rot-1]).
void rope_yarn_corr_dims(int n_rot, int n_ctx_orig, float freq_base, float beta_fast,
                         float beta_slow, float dims[2]);

#endif
