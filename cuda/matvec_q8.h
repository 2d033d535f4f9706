// matvec_q8.cu: the integer (dp4a) mat-vec path (cuda/cuda_boundary.h: the
// contract of every entry point). Activations quantized to q8_1 blocks
// (gguf/quant_q8.h: 36 bytes per 32 elements, f16 d, f16 s = d * sum(q),
// int8 q), weights kept in their blocks. The CPU reference is
// gguf/quant_q8.c: quantization bit-identical, dot products equal term by
// term (only the order of the float additions differs).
#ifndef VELA_CUDA_MATVEC_Q8_H
#define VELA_CUDA_MATVEC_Q8_H

#include "cuda/cuda_boundary.h"
#include "cuda/matvec.h"

VELA_CUDA_BEGIN

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
// The expert mode of cuda_matvec_q8_segs (struct cuda_mv_experts,
// cuda/matvec.h): xq holds the q8_1 rows the pairs read ([*][n_in/32]
// blocks, row p / x_div for pair p).
int cuda_matvec_q8_experts(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                           enum ggml_type type, int64_t n_in, const void *xq,
                           const struct cuda_mv_experts *ex /* host memory */,
                           enum cuda_mv_epilogue epi,
                           const struct cuda_mvq_plan *plan /* or NULL */, cudaStream_t stream,
                           struct verr *err);
// 1 when cuda_matvec_q8_segs with these sizes and plan runs the pipelined
// kernel, else 0 (the one-pass kernel, or a call it would refuse).
int cuda_matvec_q8_pipelined(enum ggml_type type, int64_t n_in, int n_tok,
                             const struct cuda_mvq_plan *plan);

VELA_CUDA_END

#endif
