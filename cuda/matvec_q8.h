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
                       int n_tok, int64_t n_in, bool pdl, cudaStream_t stream, struct verr *err);

// cuda_matvec_segs with q8_1 activations: seg.out[t][o] = dot(W[o], xq[t])
// (+ bias, epilogues STORE / ADD / SWIGLU as documented for
// cuda_matvec_segs; silu is g / (1.0f + expf(-g)) as in cuda_swiglu_apply).
// Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS, MXFP4 (else VERR_UNSUPPORTED). Weights 16-byte aligned, outputs/bias
// 4-byte aligned, xq 4-byte aligned (VERR_RANGE otherwise); n_tok in
// [1, CUDA_MATVEC_MAX_TOK]. plan: which kernel and how it spreads its work
// (NULL: the one-pass kernel). The one-pass and pipelined kernels give the
// same result bit for bit (the same terms added in the same order); the
// streaming kernel adds the same terms in another fixed order (one warp per
// row pair), so its results are its own, the same for every plan.
enum cuda_mvq_kernel {
    CUDA_MVQ_PASS = 0,   // the one-pass kernel, one block per row pair
    CUDA_MVQ_PIPE = 1,   // pipelined (cp.async, blocks of several row pairs,
                         // activations staged once per block) where its shared
                         // memory fits in 96 KiB, roughly n_tok * n_in <= 70k
    CUDA_MVQ_STREAM = 2, // streaming: a persistent grid, each warp whole row
                         // pairs (interleaved) through its own cp.async ring,
                         // activations staged once per block, no block barrier
                         // after that; where every token's activations fit
                         // in smem_per_block (else the pipelined kernel's rule)
};
struct cuda_mvq_plan {
    int kernel;          // enum cuda_mvq_kernel
    int sm_count;        // the device's multiprocessors (pipelined/streaming grid)
    int smem_per_sm;     // their shared memory in bytes (0: unknown)
    int smem_per_block;  // the most one block may opt in to (0: unknown, 96 KiB assumed)
    int blocks_per_sm;   // blocks aimed at per multiprocessor, at most as many as
                         // fit in smem_per_sm; 0: CUDA_MVQ_PIPE_BLOCKS_PER_SM
                         // (pipelined) or CUDA_MVQ_STREAM_BLOCKS_PER_SM
    int pairs_per_block; // pipelined: > 0: row pairs per block, fixed (tests);
                         // streaming: > 0: row pairs per warp at most (tests)
    bool pdl;            // programmatic dependent launch (cuda/launch.cuh; not
                         // in the expert mode)
};
#define CUDA_MVQ_PIPE_BLOCKS_PER_SM 4
#define CUDA_MVQ_STREAM_BLOCKS_PER_SM 4
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
// The kernel (enum cuda_mvq_kernel) cuda_matvec_q8_segs runs with these
// sizes and plan (CUDA_MVQ_PASS also for a call it would refuse).
int cuda_matvec_q8_kernel(enum ggml_type type, int64_t n_in, int n_tok,
                          const struct cuda_mvq_plan *plan);

VELA_CUDA_END

#endif
