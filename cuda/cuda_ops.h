// The boundary between the host (C11) and the CUDA kernels (CUDA C++): plain
// C functions taking device pointers, sizes, a stream and an error report.
//
// Contract for every entry point:
// - every pointer is device memory unless named otherwise; shapes are written
//   next to each pointer, the last index varying fastest;
// - work is enqueued on `stream` and the call returns without waiting;
// - returns 0, or a negative VERR_* code with err filled (VERR_BACKEND names
//   the failing CUDA/cuBLAS statement, its error string, file and line;
//   VERR_RANGE / VERR_UNSUPPORTED for arguments the kernels cannot take).
// Arguments are validated by cuda/backend_cuda.c before it calls in here;
// the entry points re-check only what would make a kernel read out of bounds.
#ifndef VELA_CUDA_OPS_H
#define VELA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "gguf/types.h"
#include "gguf/verr.h"

// Largest n_tok that matmul serves with the mat-vec kernels (weights read
// once, dequantized in registers, f32 activations). Larger batches go through
// a dense GEMM: F32 weights by an f32 cuBLAS GEMM, F16 weights by cuBLAS with
// activations rounded to f16, BF16 with activations rounded to bf16, and the
// quantized types by dequantizing slices of rows to f16 first.
#define CUDA_MATVEC_MAX_TOK 8

// Largest head_dim / head_dim_v the attention kernels take.
#define CUDA_ATTN_MAX_HEAD_DIM 256

// The split-K plan of attention depends on n_kv only through
// round_up(n_kv, CUDA_ATTN_PLAN_CELLS) (BACKEND_KV_BUCKET must divide it).
#define CUDA_ATTN_PLAN_CELLS 256

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

// --- norm.cu ---------------------------------------------------------------
// out[r] = x[r] / sqrtf(mean(x[r]^2) + eps) * w; out may alias x. With xq
// (n a multiple of 32), also xq[r] = quant_q8_1_row(out[r]) bit for bit.
int cuda_rms_norm_apply(float *out /* [n_rows][n] */, const float *x /* [n_rows][n] */,
                        const float *w /* [n] */, int n_rows, int n, float eps,
                        void *xq /* [n_rows][n / 32] q8_1 blocks or NULL */, cudaStream_t stream,
                        struct verr *err);

// --- rope.cu ---------------------------------------------------------------
// Rotates x in place (k_cache/v_cache NULL), or, the fused KV store: rotates
// x (= K) in place and writes token t's K and V into cache cell cells[t]
// (c->n_rot 0 with the store: no rotation, the unrotated cache mode),
// converted to the cache types (F32 or F16); with q (KV store only) the same
// launch also rotates the n_head_q query heads of q in place.
int cuda_rope_apply(float *x /* [n_tok][n_head][head_dim] */, const int32_t *pos /* [n_tok] */,
                    int n_tok, int n_head, int head_dim, const struct cuda_rope *c,
                    const float *v /* [n_tok][n_head][head_dim_v] or NULL */,
                    void *k_cache /* [n_ctx][n_head][head_dim] or NULL */, enum ggml_type type_k,
                    void *v_cache /* [n_ctx][n_head][head_dim_v] or NULL */, enum ggml_type type_v,
                    const int32_t *cells /* [n_tok] or NULL */, int head_dim_v,
                    float *q /* [n_tok][n_head_q][head_dim] or NULL */, int n_head_q,
                    cudaStream_t stream, struct verr *err);

// Rotates the K rows of every layer's cell c by delta[c] positions (cells with
// delta 0 untouched), one launch for all layers.
int cuda_rope_shift_kv(void *k_cache /* [n_layer][n_ctx][n_head_kv][head_dim] */,
                       enum ggml_type type_k, const int32_t *delta /* [n_ctx] */, int n_layer,
                       int n_ctx, int n_head_kv, int head_dim, const struct cuda_rope *c,
                       cudaStream_t stream, struct verr *err);

// --- attention.cu ----------------------------------------------------------
struct cuda_attn {
    float *out;     // [n_tok][n_head][head_dim_v]
    const float *q; // [n_tok][n_head][head_dim]
    const void *k;  // [n_ctx][n_head_kv][head_dim], F16 or F32
    const void *v;  // [n_ctx][n_head_kv][head_dim_v], F16 or F32
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
    // (a multiple of 32); 0: CUDA_ATTN_SPLIT_BLOCKS_PER_SM and
    // CUDA_ATTN_SPLIT_MIN_CELLS. Both calls of one attention step must
    // agree (cuda_attention_scratch_bytes, cuda_attention_apply).
    int split_blocks_per_sm, split_min_cells;
};
#define CUDA_ATTN_SPLIT_BLOCKS_PER_SM 2
#define CUDA_ATTN_SPLIT_MIN_CELLS 256

// Scratch bytes the attention call with these sizes needs for its split-K
// partial results (0 when it runs unsplit). sm_count: multiprocessors.
size_t cuda_attention_scratch_bytes(const struct cuda_attn *a, int sm_count);
// Flash attention with online softmax; splits the KV range across blocks when
// there are too few (token, head) blocks to fill the GPU, using `scratch`.
int cuda_attention_apply(const struct cuda_attn *a, int sm_count, void *scratch,
                         size_t scratch_bytes, cudaStream_t stream, struct verr *err);

// --- matvec.cu -------------------------------------------------------------
// out[t][o] = sum_i W[o][i] * x[t][i] (+ bias[o]) for n_tok <= CUDA_MATVEC_MAX_TOK
// (a plain matmul is one CUDA_MV_STORE segment), for several weight matrices
// sharing one input and one launch (Q/K/V, gate/up): every segment has the
// same type and n_in (a multiple of the type's block size). Epilogues:
//   CUDA_MV_STORE:  seg.out[t][o]  = W x (+ bias)         (any number of segs)
//   CUDA_MV_ADD:    seg.out[t][o] += W x (+ bias)         (residual folded in)
//   CUDA_MV_SWIGLU: segs[0].out[t][o] = silu(W0 x) * (W1 x); exactly 2 segs
//                   with equal n_out, segs[1].out unused, no bias.
//   CUDA_MV_GEGLU:  the same with gelu (vela_gelu_mul, cuda_geglu_apply's).
// Per output the arithmetic is the one of a single STORE segment followed by
// cuda_add_apply / cuda_swiglu_apply, so fused and unfused results are
// bit-identical.
#define CUDA_MV_MAX_SEGS 3
enum cuda_mv_epilogue { CUDA_MV_STORE = 0, CUDA_MV_ADD = 1, CUDA_MV_SWIGLU = 2, CUDA_MV_GEGLU = 3 };
// The gated epilogues (one gate and one up row per output).
#define CUDA_MV_GATED(epi) ((epi) == CUDA_MV_SWIGLU || (epi) == CUDA_MV_GEGLU)
struct cuda_mv_seg {
    float *out;         // [n_tok][n_out]
    const void *w;      // [n_out] rows of the type, 16-byte aligned
    const float *bias;  // [n_out] or NULL
    int64_t n_out;
};
int cuda_matvec_segs(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                     enum ggml_type type, int64_t n_in, const float *x /* [n_tok][n_in] */,
                     int n_tok, enum cuda_mv_epilogue epi, cudaStream_t stream, struct verr *err);

// --- matmul.cu -------------------------------------------------------------
// Scratch bytes cuda_matmul_apply needs for these sizes.
size_t cuda_matmul_scratch_bytes(enum ggml_type type, int64_t n_in, int64_t n_out, int n_tok);
// The GEMM path of matmul (any n_tok); cublas must be bound to `stream`.
// accumulate: out += W x (GEMM beta = 1; bias must then be NULL).
int cuda_matmul_apply(cublasHandle_t cublas, float *out /* [n_tok][n_out] */, const void *w,
                      enum ggml_type type, int64_t n_in, int64_t n_out,
                      const float *x /* [n_tok][n_in] */, const float *bias /* [n_out] or NULL */,
                      int n_tok, int accumulate, void *scratch, size_t scratch_bytes,
                      cudaStream_t stream, struct verr *err);

// --- elementwise.cu --------------------------------------------------------
// out[t][:] = dequantized row tokens[t] of the table (a token outside
// [0, n_rows) gives a row of zeros: tokens are checked on the host first).
int cuda_embed_rows(float *out /* [n_tok][n_in] */, const void *table, enum ggml_type type,
                    int64_t n_in, int64_t n_rows, const int32_t *tokens /* [n_tok] */, int n_tok,
                    cudaStream_t stream, struct verr *err);
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
int cuda_swiglu_apply(float *out, const float *gate, const float *up, int64_t n,
                      cudaStream_t stream, struct verr *err);
// out[i] = gelu(gate[i]) * up[i] (the geglu op: ggml's f16-table GELU);
// out may alias gate or up.
int cuda_geglu_apply(float *out, const float *gate, const float *up, int64_t n, cudaStream_t stream,
                     struct verr *err);
// x[i] *= s
int cuda_scale_apply(float *x, float s, int64_t n, cudaStream_t stream, struct verr *err);
// x[i] += y[i]
int cuda_add_apply(float *x, const float *y, int64_t n, cudaStream_t stream, struct verr *err);
// out[r] = x[rows[r]]
int cuda_get_rows(float *out /* [n_out_rows][n] */, const float *x /* [*][n] */,
                  const int32_t *rows /* [n_out_rows] */, int n_out_rows, int n,
                  cudaStream_t stream, struct verr *err);

// --- sample.cu -------------------------------------------------------------
// out[r] = index of the largest logit of row r, lowest index on ties (NaN
// never wins; a row of NaN gives 0).
int cuda_argmax_rows(int32_t *out /* [n_rows] */, const float *logits /* [n_rows][n_vocab] */,
                     int n_rows, int n_vocab, cudaStream_t stream, struct verr *err);

// Largest top_k served by one block per row (radix select of the k, then the
// chain in shared memory); rows with top_k off or larger are sorted whole.
#define CUDA_SAMPLE_MAX_K 1024

// One row of cuda_sample_rows: struct sample_params (host/backend.h) plus
// log_min_p = logf(min_p), taken on the host with the same logf as
// host/sampler.c (0 when min_p <= 0).
struct cuda_sample_row {
    float temp, top_p, min_p, log_min_p;
    int top_k;
    double u; // [0, 1)
};

// Scratch bytes cuda_sample_rows needs for these rows (host memory).
int cuda_sample_scratch_bytes(int n_rows, int n_vocab, const struct cuda_sample_row *rows,
                              size_t *bytes, struct verr *err);
// out[r] = the token host/sampler.c's sampler_chain picks from row r with
// rows[r] (host memory, copied before the call returns): greedy, or top_k ->
// top_p -> min_p -> temp -> dist(u). Uses `scratch` (device).
int cuda_sample_rows(int32_t *out /* [n_rows] */, const float *logits /* [n_rows][n_vocab] */,
                     int n_rows, int n_vocab, const struct cuda_sample_row *rows /* [n_rows] */,
                     void *scratch, size_t scratch_bytes, cudaStream_t stream, struct verr *err);

// --- dequant_host.cu ---------------------------------------------------------
// The device decoders (dequant.cuh) run on the host over one row of n
// elements: out must be bit-identical to gguf/quant.c's quant_dequantize_row.
// row: host memory, aligned as a row of a 16-byte aligned matrix. For tests.
int cuda_dequant_row_host(enum ggml_type type, const void *row, int64_t n, float *out,
                          struct verr *err);

// --- matvec_q8.cu -----------------------------------------------------------
// The integer (dp4a) mat-vec path: activations quantized to q8_1 blocks
// (gguf/quant_q8.h: 36 bytes per 32 elements, f16 d, f16 s = d * sum(q),
// int8 q), weights kept in their blocks. The CPU reference is
// gguf/quant_q8.c: quantization bit-identical, dot products equal term by
// term (only the order of the float additions differs).

// xq[t] = quant_q8_1_row(x[t]) for every token; x and xq 4-byte aligned,
// n_in a multiple of 32.
int cuda_quantize_q8_1(void *xq /* [n_tok][n_in/32] blocks */, const float *x /* [n_tok][n_in] */,
                       int n_tok, int64_t n_in, cudaStream_t stream, struct verr *err);

// cuda_matvec_segs with q8_1 activations: seg.out[t][o] = dot(W[o], xq[t])
// (+ bias, epilogues STORE / ADD / SWIGLU as documented for
// cuda_matvec_segs; silu is g / (1.0f + expf(-g)) as in cuda_swiglu_apply).
// Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS (else VERR_UNSUPPORTED). Weights 16-byte aligned, outputs/bias
// 4-byte aligned, xq 4-byte aligned (VERR_RANGE otherwise); n_tok in
// [1, CUDA_MATVEC_MAX_TOK]. plan: which kernel and how it spreads its work
// (NULL: the one-pass kernel); both kernels give the same result bit for bit
// (the same terms added in the same order).
struct cuda_mvq_plan {
    // 0: the one-pass kernel, one block per row pair. 1: the pipelined
    // kernel (cp.async, blocks of several row pairs, activations staged once
    // per block) where its shared memory fits in 96 KiB, roughly n_tok * n_in
    // <= 70k; else the one-pass kernel.
    int pipelined;
    int sm_count;        // the device's multiprocessors (the pipelined grid)
    int smem_per_sm;     // their shared memory in bytes (0: unknown)
    int blocks_per_sm;   // blocks aimed at per multiprocessor, at most as many as
                         // fit in smem_per_sm; 0: CUDA_MVQ_PIPE_BLOCKS_PER_SM
    int pairs_per_block; // > 0: row pairs per block, fixed (tests); 0: from the two above
};
#define CUDA_MVQ_PIPE_BLOCKS_PER_SM 4
int cuda_matvec_q8_segs(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                        enum ggml_type type, int64_t n_in,
                        const void *xq /* [n_tok][n_in/32] q8_1 blocks */, int n_tok,
                        enum cuda_mv_epilogue epi, const struct cuda_mvq_plan *plan /* or NULL */,
                        cudaStream_t stream, struct verr *err);
// 1 when cuda_matvec_q8_segs with these sizes and plan runs the pipelined
// kernel, else 0 (the one-pass kernel, or a call it would refuse).
int cuda_matvec_q8_pipelined(enum ggml_type type, int64_t n_in, int n_tok,
                             const struct cuda_mvq_plan *plan);

// --- matmul_tc.cu ----------------------------------------------------------
// The fused quantized GEMM of cuda_matmul_apply for batches of at most
// cuda_matmul_tc_max_tok() tokens: weights read once per launch (per 128
// tokens), decoded to f16 tile by tile in shared memory, multiplied on tensor
// cores (WMMA, f32 accumulation). Default threshold: up to 128 tokens the
// step is bound by weight traffic, which the fused kernel cuts from ~4.6 to
// ~0.6 bytes per Q4_0 weight; above it the dequant + cuBLAS path (whose f16
// copy of the weights is amortized over more tokens and whose GEMM reaches a
// higher math rate) is expected to win. The measured crossover belongs here
// (bench/kernels: the matmul_tc family).
#define CUDA_MATMUL_TC_MAX_TOK 128
// The threshold in force: cuda_matmul_tc_set_max_tok's value if set (n >= 0),
// else VELA_MATMUL_TC_MAX_TOK (read once; a non-negative integer, 0 disables
// the fused path), else CUDA_MATMUL_TC_MAX_TOK. The setter is for tests and
// benchmarks (n < 0 restores the environment's / default value).
int cuda_matmul_tc_max_tok(void);
void cuda_matmul_tc_set_max_tok(int n);
// 1 when cuda_matmul_apply serves (type, n_tok) with the fused kernel: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, 1 <= n_tok <= the
// threshold, a device with tensor cores (compute capability >= 7.0).
int cuda_matmul_tc_takes(enum ggml_type type, int n_tok);
// out[t][o] = sum_i W[o][i] * xh[t][i] (+ bias[o]), or out += W xh
// (accumulate; bias must then be NULL), any n_tok >= 1 and n_out >= 1, n_in a
// multiple of the type's block size. Weights decoded exactly as the host
// decoder then rounded to f16; xh: the activations already rounded to f16
// (f16 bits, as __float2half_rn gives them). w and xh 16-byte aligned.
int cuda_matmul_q_tc(float *out /* [n_tok][n_out] */, const void *w, enum ggml_type type,
                     int64_t n_in, int64_t n_out, const uint16_t *xh /* [n_tok][n_in] */,
                     const float *bias /* [n_out] or NULL */, int n_tok, int accumulate,
                     cudaStream_t stream, struct verr *err);

#ifdef __cplusplus
}
#endif

#endif
