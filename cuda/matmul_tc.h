// matmul_tc.cu: the fused quantized GEMM on tensor cores
// (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_MATMUL_TC_H
#define VELA_CUDA_MATMUL_TC_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

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
// The threshold in force: cuda_matmul_tc_set_max_tok's value if set (n >= 0;
// 0 disables the fused path), else CUDA_MATMUL_TC_MAX_TOK. The setter is for
// tests and benchmarks (n < 0 restores the default); it is process-wide.
int cuda_matmul_tc_max_tok(void);
void cuda_matmul_tc_set_max_tok(int n);
// 1 when cuda_matmul_apply serves (type, n_tok) with the fused kernel: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4, 1 <= n_tok <= the
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

// The grouped form (mixture of experts, cuda/moe.h): one launch multiplies
// every expert's group of rows by that expert's matrix. w is a stack of
// n_expert matrices of n_out rows; the pairs of expert e are
// order[offsets[e] .. offsets[e + 1]); tile i of the table (i < n_tiles,
// the grid's y) is {expert, first}: the up to tpb pairs order[first ..]
// of that expert (expert -1: no tile, the block exits). Pair p reads
// activation row p / x_div of xh and writes output row p of out
// ([n_pairs][n_out]). Per output the arithmetic is the plain kernel's (the
// same decode, f16 rounding and k order), whatever else is in the group.
struct cuda_tc_groups {
    const int32_t *tiles;   // [n_tiles][2], device memory
    const int32_t *offsets; // [n_expert + 1], device memory
    const int32_t *order;   // [n_pairs], device memory
    int n_tiles;            // at most 65535
    int tpb;                // tokens per tile: 16, 32, 64 or 128
    int x_div;
};
int cuda_matmul_q_tc_grouped(float *out /* [n_pairs][n_out] */, const void *w, enum ggml_type type,
                             int64_t n_in, int64_t n_out, const uint16_t *xh /* [*][n_in] */,
                             const struct cuda_tc_groups *g /* host memory */, cudaStream_t stream,
                             struct verr *err);
// The largest tile (tokens per block, a power of two in [16, want]) the
// grouped kernel fits in this device's shared memory for the type; 0 when
// the type or the device has no fused kernel.
int cuda_matmul_tc_group_tpb(enum ggml_type type, int want);

VELA_CUDA_END

#endif
